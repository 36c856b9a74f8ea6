//! A rolling upgrade from the previous release, as README's "Upgrading" tells it:
//! five workers of the old release over three slots, running counters, exec robots
//! and a robot scheduled every 2 s; each old worker in turn gets a new one started
//! beside it, then SIGTERM. Halfway through, the new CLI creates and updates
//! robots; at the end the new `init` runs. Every slot ends on a new worker, every
//! robot moves on, no two processes of a robot ever run at once, every old worker
//! exits 0, and no process panics.
//!
//! scripts/upgrade-check.sh builds the previous tagged release and runs this with
//! its binary in `SLOTPOOL_UPGRADE_FROM`: before each release (the CHANGELOG says it
//! passed). It is ignored in the suite, which has no old release built.
//!
//! The server runs without the mongod rules (`SLOTPOOL_DEV_RULES=off`): 0.2.0's
//! first heartbeat is an upsert mongod refuses, so a 0.2.0 pool only ever ran on the
//! dev server, and is upgraded there.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use common::{invariants, script, wait_for, PrivateServer, TestDb, WorkerProc};

/// The previous release's binary.
fn old_bin() -> String {
    std::env::var("SLOTPOOL_UPGRADE_FROM").expect(
        "SLOTPOOL_UPGRADE_FROM names the previous release's binary: run scripts/upgrade-check.sh",
    )
}

/// Runs `bin` (a CLI) against `db`, insisting it succeeded; its stdout.
fn cli(bin: &str, db: &TestDb, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env("MONGODB_URI", &db.uri)
        .env("SLOTPOOL_LOG", "warn")
        .output()
        .expect("run the CLI");
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An exec robot that ignores SIGTERM and records each step as `NAME PID NANOS` in
/// `steps` (its name is its one argument) before it checkpoints it.
fn stepping_robot(db: &TestDb) -> String {
    let dir = db.dir.display();
    script(
        db,
        "stepping.sh",
        &format!(
            r#"trap '' TERM
n=$(printf '%s' "$SLOTPOOL_CONTEXT" | sed -n 's/.*"n": *\([0-9]*\).*/\1/p')
n=${{n:-0}}
while true; do
  n=$((n+1))
  echo "$1 $$ $(date +%s%N)" >> {dir}/steps
  echo "{{\"checkpoint\": {{\"n\": $n}}}}"
  sleep 0.2
done
"#
        ),
    )
}

/// A scheduled run: records `NAME PID START END` in `runs`, taking half a second.
fn scheduled_run(db: &TestDb) -> String {
    let dir = db.dir.display();
    script(
        db,
        "scheduled.sh",
        &format!(
            r#"start=$(date +%s%N)
sleep 0.5
echo "$1 $$ $start $(date +%s%N)" >> {dir}/runs
"#
        ),
    )
}

/// Each process's span (first step, last step) per robot, from `steps`.
fn spans(db: &TestDb) -> BTreeMap<String, Vec<(i32, u128, u128)>> {
    let mut by: BTreeMap<(String, i32), (u128, u128)> = BTreeMap::new();
    for l in std::fs::read_to_string(db.dir.join("steps"))
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(name), Some(pid), Some(ns)) = (
            f.first(),
            f.get(1).and_then(|p| p.parse::<i32>().ok()),
            f.get(2).and_then(|n| n.parse::<u128>().ok()),
        ) else {
            continue;
        };
        let e = by.entry((name.to_string(), pid)).or_insert((ns, ns));
        e.0 = e.0.min(ns);
        e.1 = e.1.max(ns);
    }
    let mut out: BTreeMap<String, Vec<(i32, u128, u128)>> = BTreeMap::new();
    for ((name, pid), (a, b)) in by {
        out.entry(name).or_default().push((pid, a, b));
    }
    out
}

/// No two processes of one robot stepped at once: each process's steps end before
/// the next one's begin.
fn one_process_at_a_time(db: &TestDb) {
    for (name, mut procs) in spans(db) {
        procs.sort_by_key(|p| p.1);
        for w in procs.windows(2) {
            assert!(
                w[0].2 < w[1].1,
                "two processes of {name} stepped at once: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
}

/// No two scheduled runs of one robot overlapped, from `runs`.
fn one_run_at_a_time(db: &TestDb) -> usize {
    let mut by: BTreeMap<String, Vec<(u128, u128)>> = BTreeMap::new();
    for l in std::fs::read_to_string(db.dir.join("runs"))
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let (Some(name), Some(a), Some(b)) = (
            f.first(),
            f.get(2).and_then(|n| n.parse::<u128>().ok()),
            f.get(3).and_then(|n| n.parse::<u128>().ok()),
        ) {
            by.entry(name.to_string()).or_default().push((a, b));
        }
    }
    let mut n = 0;
    for (name, mut runs) in by {
        runs.sort();
        n += runs.len();
        for w in runs.windows(2) {
            assert!(w[0].1 <= w[1].0, "two runs of {name} overlapped: {w:?}");
        }
    }
    n
}

/// Every daemon robot's `seq`, by name (the scheduled one checkpoints nothing: its
/// runs are in `runs`).
async fn seqs(db: &TestDb) -> BTreeMap<String, i64> {
    db.seqs()
        .await
        .into_iter()
        .filter(|(name, _)| name != "tick")
        .collect()
}

/// Waits until every robot in `before` has checkpointed past it.
async fn all_move_on(db: &TestDb, before: &BTreeMap<String, i64>, what: &str) {
    wait_for(Duration::from_secs(90), what, || async {
        let now = seqs(db).await;
        before
            .iter()
            .all(|(name, seq)| now.get(name).is_some_and(|n| n > seq))
            .then_some(())
    })
    .await;
}

/// SIGTERM, then the exit: within a minute, with 0. Whether the log tells of a
/// panic.
fn stop(w: &mut WorkerProc) -> bool {
    w.signal(libc::SIGTERM);
    let status = w
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("worker {} did not exit within 60 s of SIGTERM", w.id));
    assert!(status.success(), "worker {} exited {status}", w.id);
    w.log_text().contains("panicked")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "scripts/upgrade-check.sh runs it, with the previous release built"]
async fn a_rolling_upgrade_from_the_previous_release_runs_every_robot_once() {
    let old = old_bin();
    let new = env!("CARGO_BIN_EXE_slotpool");
    let server = PrivateServer::launch(
        &[
            ("SLOTPOOL_DEV_RULES", "off"),
            ("SLOTPOOL_DEV_SHAPES", "off"),
        ],
        &[],
    );
    let db = TestDb::new_on(&server.uri, "upgrade").await;
    cli(&old, &db, &["init", "--slots", "3"]);
    let allow = db.exec_allow();
    let flags = ["--exec-allow", allow.as_str()];
    let mut olds: Vec<WorkerProc> = (0..5)
        .map(|_| WorkerProc::start_bin(&old, &db.uri, &db.dir, &flags))
        .collect();
    wait_for(Duration::from_secs(60), "the 3 slots held", || async {
        (db.slots().await.iter().filter_map(common::owner).count() == 3).then_some(())
    })
    .await;
    let stepping = stepping_robot(&db);
    let scheduled = scheduled_run(&db);
    cli(
        &old,
        &db,
        &[
            "robot",
            "create",
            "--name",
            "c",
            "--kind",
            "counter",
            "--interval-ms",
            "200",
            "--history",
            "1000",
            "--count",
            "6",
        ],
    );
    for name in ["x-1", "x-2"] {
        cli(
            &old,
            &db,
            &[
                "robot",
                "create",
                "--name",
                name,
                "--kind",
                "exec",
                "--command",
                &stepping,
                "--arg",
                name,
            ],
        );
    }
    let every = format!(
        r#"{{"command": "{scheduled}", "args": ["tick"], "schedule": {{"every": "2s", "keep_runs": 1000}}}}"#
    );
    cli(
        &old,
        &db,
        &[
            "robot", "create", "--name", "tick", "--kind", "exec", "--spec", &every,
        ],
    );
    all_move_on(
        &db,
        &seqs(&db).await,
        "every robot stepping on the old pool",
    )
    .await;

    // One old worker at a time: a new one beside it, then SIGTERM.
    let mut news: Vec<WorkerProc> = Vec::new();
    let olds_total = olds.len();
    for i in 0..olds_total {
        let fresh = WorkerProc::start(&db.uri, &db.dir, &flags);
        wait_for(
            Duration::from_secs(30),
            "the new worker's heartbeat",
            || async { fresh.http_get("/status").map(|_| ()) },
        )
        .await;
        news.push(fresh);
        let mut gone = olds.remove(0);
        if stop(&mut gone) {
            // The old release's own exit (the driver's shutdown race, which 0.3
            // closes): reported, not this check's failure.
            println!("[upgrade] old worker {} panicked at its exit", gone.id);
        }
        if i == olds_total / 2 {
            // Halfway: the new CLI creates and updates robots in the mixed pool.
            cli(
                new,
                &db,
                &[
                    "robot",
                    "create",
                    "--name",
                    "n",
                    "--kind",
                    "counter",
                    "--interval-ms",
                    "200",
                    "--history",
                    "1000",
                    "--count",
                    "2",
                    "--by",
                    "count",
                ],
            );
            cli(
                new,
                &db,
                &["robot", "update", "c-1", "--interval-ms", "300"],
            );
        }
        all_move_on(&db, &seqs(&db).await, "every robot stepping on").await;
    }
    cli(new, &db, &["init", "--slots", "3"]);
    let ids: BTreeSet<String> = news.iter().map(|w| w.id.clone()).collect();
    wait_for(
        Duration::from_secs(60),
        "every slot on a new worker",
        || async {
            let owners: Vec<String> = db.slots().await.iter().filter_map(common::owner).collect();
            (owners.len() == 3 && owners.iter().all(|o| ids.contains(o))).then_some(())
        },
    )
    .await;
    all_move_on(
        &db,
        &seqs(&db).await,
        "every robot stepping on the new pool",
    )
    .await;
    let c1 = db.robot("c-1").await;
    let interval = c1
        .get_document("spec")
        .ok()
        .and_then(|s| s.get("interval_ms"))
        .and_then(|v| v.as_i64().or_else(|| v.as_i32().map(i64::from)));
    assert_eq!(interval, Some(300), "the update applied: {c1}");
    // The scheduled robot runs on in the new pool.
    let ran = one_run_at_a_time(&db);
    wait_for(
        Duration::from_secs(60),
        "the scheduled robot to run 3 more times on the new pool",
        || async { (one_run_at_a_time(&db) >= ran + 3).then_some(()) },
    )
    .await;
    one_process_at_a_time(&db);
    one_run_at_a_time(&db);
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 8, "{report:?}");
    let firings = invariants::check_firings(&db, false).await;
    assert_eq!(firings.robots, 1, "{firings:?}");
    // The new release's own graceful exits: each exits 0, and none panics.
    for w in &mut news {
        assert!(
            !stop(w),
            "worker {} panicked; its log:\n{}",
            w.id,
            w.log_text()
        );
    }
}
