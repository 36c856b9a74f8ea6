//! Operating the pool: HTTP on the worker's port, schemas, mongosh inspection,
//! the exec allow-list, and the deployment files.

mod common;

use std::process::Command;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson};
use common::proxy::{Mode, Proxy};
use common::{owner, TestDb};

#[tokio::test(flavor = "multi_thread")]
async fn http_healthz_metrics_status_are_real_and_read_only() {
    let db = TestDb::new("http").await;
    db.init(1).await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let w = db.worker_via(&proxy, &[]);
    common::wait_for(Duration::from_secs(15), "the slot to be held", || async {
        (owner(&db.slot("slot-001").await)? == w.id).then_some(())
    })
    .await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "h",
        "--kind",
        "counter",
        "--interval-ms",
        "100",
    ]);
    common::wait_for(Duration::from_secs(10), "a checkpoint", || async {
        (db.robot("h").await.get_i64("seq").ok()? > 2).then_some(())
    })
    .await;

    let (code, body) = w.http_get("/healthz").unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, metrics) = w.http_get("/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "slotpool_slot_held 1",
        "slotpool_epoch 1",
        "slotpool_claims_total 1",
        "slotpool_robots_running 1",
        "slotpool_self_fences_total 0",
        "slotpool_fenced_writes_total 0",
        "# TYPE slotpool_renew_latency_seconds histogram",
        "slotpool_renew_latency_seconds_bucket{le=\"+Inf\"}",
        "slotpool_lease_age_seconds",
        "slotpool_losses_total 0",
        "slotpool_robots_restarting 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in:\n{metrics}");
    }
    let checkpoints: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("slotpool_checkpoints_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(checkpoints >= 2);
    let (code, status) = w.http_get("/status").unwrap();
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["role"], "holder");
    assert_eq!(v["slot_id"], "slot-001");
    assert_eq!(v["worker"], w.id.as_str());
    assert_eq!(v["robots_running"], 1);
    assert_eq!(w.http_get("/nope").unwrap().0, 404);
    // Read-only: anything but GET/HEAD is refused.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("allow: get, head"),
        "{reply}"
    );
    // Kept alive: a second request on the same connection is answered too.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut first = Vec::new();
    while !first.ends_with(b"\r\n\r\nok\n") {
        let mut chunk = [0u8; 512];
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "closed after one request: {:?}",
            String::from_utf8_lossy(&first)
        );
        first.extend_from_slice(&chunk[..n]);
    }
    assert!(first.starts_with(b"HTTP/1.1 200"));
    write!(
        s,
        "HEAD /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut second = String::new();
    s.read_to_string(&mut second).unwrap();
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(!second.contains("\"worker\""), "HEAD has no body: {second}");
    // A request head over 8 KiB is refused, and the worker serves on.
    // The worker may answer and close before the client has written the whole
    // head: then the write fails (EPIPE) or the answer is lost to the reset. Either
    // way it was refused; it must never be served.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    let big = "a".repeat(9000);
    let _ = write!(s, "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 431") || reply.is_empty(),
        "an oversized head is refused: {reply}"
    );
    assert_eq!(w.http_get("/healthz").unwrap().0, 200);

    // Cut the database off: /healthz says so, the worker fences itself, and it
    // recovers when the database is back.
    proxy.set(Mode::Blackhole);
    common::wait_for(Duration::from_secs(20), "healthz 503", || async {
        (w.http_get("/healthz")?.0 == 503).then_some(())
    })
    .await;
    common::wait_for(Duration::from_secs(10), "a self-fence", || async {
        let m = w.http_get("/metrics")?.1;
        m.contains("slotpool_self_fences_total 1").then_some(())
    })
    .await;
    proxy.set(Mode::Pass);
    common::wait_for(
        Duration::from_secs(30),
        "healthz 200 again and the slot back",
        || async {
            let healthy = w.http_get("/healthz")?.0 == 200;
            let held = owner(&db.slot("slot-001").await)? == w.id
                && db.slot("slot-001").await.get_i64("epoch").ok()? == 2;
            (healthy && held).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn every_collection_rejects_a_bad_document() {
    let db = TestDb::new("schemas").await;
    db.init(1).await;
    let code = |e: mongodb::error::Error| -> i32 {
        match *e.kind {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => w.code,
            other => panic!("expected a write error, got {other:?}"),
        }
    };
    let bad = [
        (
            "slots",
            doc! {"_id": "slot-x", "owner": Bson::Null, "time": Bson::Null, "epoch": "one", "rev": 0_i64, "draining": false},
        ),
        (
            "robots",
            doc! {"_id": ObjectId::new(), "name": "r", "kind": "counter", "spec": {}, "slot_id": "slot-001",
            "epoch": 0_i64, "context": "not a document", "seq": 0_i64, "paused": false, "status": "pending", "created_at": bson::DateTime::now()},
        ),
        (
            "workers",
            doc! {"_id": "127.0.0.1:1", "last_seen": "yesterday"},
        ),
        (
            "events",
            doc! {"at": bson::DateTime::now(), "kind": "party"},
        ),
    ];
    for (coll, d) in bad {
        let e = db
            .store
            .db()
            .collection::<bson::Document>(coll)
            .insert_one(d)
            .await
            .unwrap_err();
        assert_eq!(code(e), 121, "{coll} must reject it");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mongosh_inspect_script_shows_the_truth() {
    let db = TestDb::new("mongosh").await;
    db.init(2).await;
    let allow = ["--exec-allow", "/nonexistent/"];
    let w = [db.worker(&allow), db.worker(&allow), db.worker(&allow)];
    common::wait_for(Duration::from_secs(15), "both slots held", || async {
        (db.slots().await.iter().filter_map(owner).count() == 2).then_some(())
    })
    .await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "ok",
        "--kind",
        "counter",
        "--interval-ms",
        "200",
        "--count",
        "3",
    ]);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "bad",
        "--kind",
        "exec",
        "--command",
        "/nonexistent/x",
    ]);
    common::wait_for(
        Duration::from_secs(15),
        "the broken robot to restart",
        || async { (db.robot("bad").await.get_str("status").ok()? == "restarting").then_some(()) },
    )
    .await;
    let root = env!("CARGO_MANIFEST_DIR");
    let inspect = || {
        let out = Command::new(format!("{root}/scripts/mongosh.sh"))
            .args([
                &db.uri,
                "--quiet",
                "--file",
                &format!("{root}/scripts/inspect.js"),
            ])
            .output()
            .expect("run mongosh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "mongosh failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    // The broken robot is retried with backoff, so it is `running` for a moment now
    // and then: read until the script shows it in backoff.
    let text = common::wait_for(
        Duration::from_secs(20),
        "the script to show the broken robot restarting",
        || async {
            let text = inspect();
            let stale = text.split("== stale robots").nth(1)?.to_string();
            (stale.contains("bad") && stale.contains("restarting")).then_some(text)
        },
    )
    .await;
    let holder1 = owner(&db.slot("slot-001").await).unwrap();
    let line1 = text
        .lines()
        .find(|l| l.starts_with("slot-001"))
        .expect("slot-001 row");
    assert!(
        line1.contains("held") && line1.contains(&holder1),
        "{line1}"
    );
    let owners: Vec<String> = db.slots().await.iter().filter_map(owner).collect();
    let standby = w.iter().find(|x| !owners.contains(&x.id)).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with(&standby.id))
        .expect("the standby's row");
    assert!(row.contains("standby"), "{row}");
    let stale = text.split("== stale robots").nth(1).unwrap();
    assert!(
        stale.contains("bad") && stale.contains("restarting"),
        "{text}"
    );
    assert!(
        !stale.contains("ok-1"),
        "healthy robots are not stale: {text}"
    );
    let events = text.split("== recent events").nth(1).unwrap();
    assert!(events.contains("claim"), "{text}");
    // The README's one-liner works too.
    let out = Command::new(format!("{root}/scripts/mongosh.sh"))
        .args([
            &db.uri,
            "--quiet",
            "--eval",
            "db.slots.find({}, {owner: 1, epoch: 1}).toArray()",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&holder1));
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_allow_list_restricts_commands() {
    let db = TestDb::new("allow").await;
    db.init(1).await;
    let allowed_dir = db.dir.join("allowed");
    std::fs::create_dir_all(&allowed_dir).unwrap();
    let ok = allowed_dir.join("ok.sh");
    std::fs::write(
        &ok,
        "#!/bin/sh\necho '{\"checkpoint\": {\"hi\": 1}}'\nexec sleep 60\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o755)).unwrap();
    let allow = format!("{}/", allowed_dir.display());
    let _w = db.worker(&["--exec-allow", &allow]);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "inside",
        "--kind",
        "exec",
        "--command",
        ok.to_str().unwrap(),
    ]);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "outside",
        "--kind",
        "exec",
        "--command",
        "/bin/sh",
        "--arg",
        "-c",
        "--arg",
        "echo pwned",
    ]);
    common::wait_for(
        Duration::from_secs(15),
        "the allowed robot to checkpoint and the other to be refused",
        || async {
            let inside = db.robot("inside").await.get_i64("seq").ok()? >= 1;
            let outside = db.robot("outside").await;
            let refused = outside.get_str("status").ok()? == "failed"
                && outside
                    .get_str("error")
                    .ok()?
                    .contains("not allowed by this worker's --exec-allow");
            (inside && refused).then_some(())
        },
    )
    .await;
    assert_eq!(db.robot("outside").await.get_i64("seq").unwrap(), 0);
}

#[test]
fn compose_file_and_dockerfile_hold_together() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/compose.yaml")).unwrap();
    let y: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let svc = &y["services"];
    let mongo = &svc["mongo"];
    let cmd: Vec<&str> = mongo["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        cmd.contains(&"--replSet"),
        "mongo must run as a replica set, as in production"
    );
    assert!(mongo["healthcheck"]["test"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v.as_str().unwrap().contains("rs.initiate")));
    assert!(mongo["volumes"][0]
        .as_str()
        .unwrap()
        .starts_with("mongo-data:"));
    assert!(y["volumes"]["mongo-data"].is_null() || y["volumes"]["mongo-data"].is_mapping());
    let init = &svc["init"];
    assert_eq!(init["command"][0].as_str(), Some("init"));
    assert_eq!(
        init["depends_on"]["mongo"]["condition"].as_str(),
        Some("service_healthy")
    );
    let worker = &svc["worker"];
    assert_eq!(
        worker["depends_on"]["init"]["condition"].as_str(),
        Some("service_completed_successfully")
    );
    assert!(
        worker["ports"].is_null(),
        "scaled workers must not publish fixed host ports"
    );
    assert!(
        worker["container_name"].is_null(),
        "a container_name prevents --scale"
    );
    assert!(worker["environment"]["MONGODB_URI"]
        .as_str()
        .unwrap()
        .contains("replicaSet=rs0"));
    // The dashboard: read-only, published on the host's loopback only.
    let web = &svc["web"];
    assert_eq!(web["command"][0].as_str(), Some("web"));
    assert!(
        !text.contains("--allow-actions\""),
        "the dashboard is read-only in compose"
    );
    assert!(web["ports"][0].as_str().unwrap().starts_with("127.0.0.1:"));
    // The Dockerfile copies what the build needs and runs the binary under tini.
    let docker = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    for needed in ["Cargo.toml", "Cargo.lock", "src", "schemas"] {
        assert!(
            docker.contains(&format!("COPY {needed}")) || docker.contains(&format!(" {needed} ")),
            "Dockerfile must copy {needed}"
        );
        assert!(std::path::Path::new(&format!("{root}/{needed}")).exists());
    }
    assert!(docker.contains("cargo build --release --locked --bin slotpool"));
    assert!(docker.contains("ENTRYPOINT [\"/usr/bin/tini\""));
    // Validate with a compose client when one is installed (no engine is needed).
    let tries: [&[&str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    for t in tries {
        let works = Command::new(t[0])
            .args(&t[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            continue;
        }
        let out = Command::new(t[0])
            .args(&t[1..])
            .args(["-f", &format!("{root}/compose.yaml"), "config", "--quiet"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} config rejected compose.yaml: {}",
            t.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("validated compose.yaml with {}", t.join(" "));
        return;
    }
    println!("no compose client installed: compose.yaml checked structurally only");
}
