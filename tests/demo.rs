//! The README's first command, `scripts/demo.sh`, as a user runs it: its dev
//! database killed with -9 and started again costs no robot a restart and leaves
//! the live view watching (it says the database is unreachable, then shows the
//! pool again); a terminal's Ctrl-C (SIGINT to the whole foreground process group)
//! stops every worker gracefully and leaves the dev database it started running, as
//! the demo says.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Five consecutive free ports for the demo's workers.
fn free_run(n: u16) -> u16 {
    for _ in 0..200 {
        let base = common::free_port();
        if base > 65535 - n {
            continue;
        }
        let all_free =
            (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no run of {n} free ports");
}

fn dev_mongo(port: u16, action: &str) -> std::process::Output {
    Command::new("bash")
        .arg(format!(
            "{}/scripts/dev-mongo.sh",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(action)
        .env("SLOTPOOL_DEV_PORT", port.to_string())
        .env_remove("MONGODB_URI")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_the_workers_and_leaves_the_dev_database_running() {
    let db_port = common::free_port();
    let base = free_run(5);
    let web_port = common::free_port();
    let root = env!("CARGO_MANIFEST_DIR");
    let log =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("demo-{db_port}.log"));
    let _server = StopServer(db_port);
    let demo = Command::new("bash")
        .arg(format!("{root}/scripts/demo.sh"))
        .current_dir(root)
        .env_remove("MONGODB_URI")
        .env("SLOTPOOL_DEV_PORT", db_port.to_string())
        .env("DEMO_BASE_PORT", base.to_string())
        .env("DEMO_WEB", format!("127.0.0.1:{web_port}"))
        // The binary this test run built: a `cargo build` from inside `cargo test` can
        // rebuild the dependencies under other features (80 s in CI, not what this tests).
        .env("DEMO_BIN", env!("CARGO_BIN_EXE_slotpool"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        // A terminal's foreground process group of its own, as a shell gives it.
        .process_group(0)
        .spawn()
        .unwrap();
    let group = demo.id() as i32;
    let mut demo = scopeguard(demo);
    let uri = format!(
        "mongodb://127.0.0.1:{db_port}/slotpool_demo?directConnection=true&retryWrites=false"
    );
    common::wait_for(
        Duration::from_secs(180),
        "the demo's 3 slots held",
        || async {
            let store = slotpool::Store::connect(&uri).await.ok()?;
            let held = store
                .slots()
                .count_documents(bson::doc! {"owner": {"$type": "string"}})
                .await
                .ok()?;
            (held == 3).then_some(())
        },
    )
    .await;
    // As a user does: while the demo shows its live status.
    common::wait_for(
        Duration::from_secs(60),
        "the demo's live status",
        || async {
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            (out.contains("== live status") && out.contains("robots:")).then_some(())
        },
    )
    .await;
    // Its dashboard shows the same pool.
    common::wait_for(Duration::from_secs(30), "the demo's dashboard", || async {
        let r = common::web::request(web_port, "GET", "/api/v1/slots", &[], b"")?;
        let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
        (v["slots"].as_array()?.len() == 3).then_some(())
    })
    .await;
    // The database blinks, as a user tries it: kill -9, and started again on its
    // data once the view has said so.
    let held = |uri: String| async move {
        let store = slotpool::Store::connect(&uri).await.ok()?;
        let mut out = std::collections::BTreeMap::new();
        let mut slots = store.slots().find(bson::doc! {}).await.ok()?;
        use futures::TryStreamExt;
        while let Some(s) = slots.try_next().await.ok()? {
            let owner = s.get_str("owner").ok()?.to_string();
            out.insert(
                s.get_str("_id").ok()?.to_string(),
                (owner, s.get_i64("epoch").ok()?),
            );
        }
        Some(out)
    };
    let before = held(uri.clone()).await.expect("the slots read");
    let shown_before = std::fs::read_to_string(&log).unwrap().len();
    let pid_file = format!("{root}/.state/mongo-{db_port}.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on the dev server this test's demo started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    common::wait_for(
        Duration::from_secs(60),
        "the live view to say the database is unreachable",
        || async {
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            out[shown_before..]
                .contains("database unreachable since")
                .then_some(())
        },
    )
    .await;
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(
        !out.contains("Kind:") && !out.contains("labels:"),
        "the view names what failed in words, not the driver's debug form:\n{out}"
    );
    // Away until every holder has passed its deadline and suspended its robots.
    let fences = || -> u64 {
        (base..base + 5)
            .filter_map(|port| common::web::request(port, "GET", "/metrics", &[], b""))
            .map(|r| common::metric(&r.body, "slotpool_self_fences_total"))
            .sum()
    };
    common::wait_for(
        Duration::from_secs(30),
        "the 3 holders to suspend their robots",
        || async { (fences() >= 3).then_some(()) },
    )
    .await;
    let started = dev_mongo(db_port, "start");
    assert!(
        started.status.success(),
        "dev-mongo.sh start: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let failed_at = std::fs::read_to_string(&log).unwrap().len();
    common::wait_for(
        Duration::from_secs(60),
        "the live view to show the pool again",
        || async {
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            out[failed_at..].contains("robots:").then_some(())
        },
    )
    .await;
    assert!(
        demo.0.try_wait().unwrap().is_none(),
        "the demo still runs after the outage"
    );
    // Each of the 3 holders suspended its robots, and resumes them in place once
    // its late renewal lands.
    let metrics = || -> Vec<(u16, String)> {
        (base..base + 5)
            .map(|port| {
                let r = common::web::request(port, "GET", "/metrics", &[], b"")
                    .unwrap_or_else(|| panic!("worker {port} answers after the outage"));
                (port, r.body)
            })
            .collect()
    };
    let resumed = r#"slotpool_suspensions_total{outcome="resumed"}"#;
    let bodies = common::wait_for(
        Duration::from_secs(60),
        "the 3 holders to resume their robots",
        || async {
            let all = metrics();
            let n: u64 = all.iter().map(|(_, b)| common::metric(b, resumed)).sum();
            (n >= 3).then_some(all)
        },
    )
    .await;
    for (port, body) in &bodies {
        assert!(body.contains("slotpool_robot_restarts_total"), "{body}");
        assert_eq!(
            common::metric(body, "slotpool_robot_restarts_total"),
            0,
            "no robot restarted on worker {port}"
        );
        for outcome in ["lost", "expired", "stopped"] {
            let name = format!(r#"slotpool_suspensions_total{{outcome="{outcome}"}}"#);
            assert_eq!(common::metric(body, &name), 0, "{name} on worker {port}");
        }
    }
    assert_eq!(
        held(uri.clone()).await,
        Some(before),
        "every slot kept its holder and epoch: the outage moved nothing"
    );
    // Ctrl-C: SIGINT to the whole group.
    // SAFETY: kill(2) on the process group this test created.
    unsafe {
        libc::kill(-group, libc::SIGINT);
    }
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while demo.0.try_wait().unwrap().is_none() && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = std::fs::read_to_string(&log).unwrap();
    let tail: String = out.lines().rev().take(15).collect::<Vec<_>>().join("\n");
    assert!(
        demo.0.try_wait().unwrap().is_some(),
        "the demo did not end within 30 s of Ctrl-C; its last lines, newest first:\n{tail}"
    );
    assert!(out.contains("all workers stopped"), "{out}");
    let leftover = Command::new("pgrep")
        .args(["-f", &format!("advertise 127.0.0.1:{base}")])
        .output()
        .unwrap();
    assert!(leftover.stdout.is_empty(), "no worker left running");
    let leftover = Command::new("pgrep")
        .args(["-f", &format!("web --listen 127.0.0.1:{web_port}")])
        .output()
        .unwrap();
    assert!(leftover.stdout.is_empty(), "no dashboard left running");
    let status = dev_mongo(db_port, "status");
    let said = String::from_utf8_lossy(&status.stderr).to_string();
    assert!(
        status.status.success(),
        "the dev database must keep running after Ctrl-C, but: {said}"
    );
}

/// Stops the dev server the demo started on this port, whatever the test's outcome.
struct StopServer(u16);

impl Drop for StopServer {
    fn drop(&mut self) {
        dev_mongo(self.0, "stop");
        let root = env!("CARGO_MANIFEST_DIR");
        let _ = std::fs::remove_dir_all(format!("{root}/.state/mongo-data-{}", self.0));
    }
}

/// Kills the demo's group if the test fails half-way.
struct Guard(std::process::Child);

fn scopeguard(c: std::process::Child) -> Guard {
    Guard(c)
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the demo's own process group.
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}
