//! Exactly once under partial failure: what a process tree, a half-applied batch, an
//! interrupted move or a deleted robot's last output could otherwise do twice or
//! leave behind. Each test runs real workers on the real dev server and ends with
//! the invariant checker where counters ran.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use common::{invariants, script, wait_for, TestDb};

/// A process that exists and is not a zombie waiting to be reaped.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|st| st != "Z" && st != "X")
        })
        .unwrap_or(false)
}

/// The pids an escaping robot wrote for one epoch: `{kind: pid}`.
fn pids(db: &TestDb, epoch: i64) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for kind in ["setsid", "double", "stubborn"] {
        let path = db.dir.join(format!("pid-{epoch}-{kind}"));
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            out.insert(kind.to_string(), pid);
        }
    }
    out
}

/// An exec robot whose work escapes its process group three ways: a `setsid` child,
/// a double fork (re-parented away from the robot), and a child in the group that
/// ignores SIGTERM. Each writes its pid, by epoch, and keeps running.
fn escaping_robot(db: &TestDb) -> String {
    let dir = db.dir.display();
    script(
        db,
        "escape.sh",
        &format!(
            r#"e=$SLOTPOOL_EPOCH
setsid bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-setsid.tmp; mv {dir}/pid-'$e'-setsid.tmp {dir}/pid-'$e'-setsid; while true; do sleep 0.05; done' </dev/null >/dev/null 2>&1 &
( bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-double.tmp; mv {dir}/pid-'$e'-double.tmp {dir}/pid-'$e'-double; while true; do sleep 0.05; done' </dev/null >/dev/null 2>&1 & ) &
bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-stubborn.tmp; mv {dir}/pid-'$e'-stubborn.tmp {dir}/pid-'$e'-stubborn; while true; do sleep 0.05; done' &
while true; do sleep 1; done
"#
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_robots_whole_process_tree_is_gone_before_the_lease_can_lapse() {
    let db = TestDb::new("tree").await;
    db.init(1).await;
    let cmd = escaping_robot(&db);
    let flags = ["--tick", "500ms", "--stop-grace", "100ms"];
    let mut first = db.exec_worker(&flags);
    wait_for(
        Duration::from_secs(20),
        "the first worker to hold the slot",
        || async {
            (common::owner(&db.slot("slot-001").await).as_deref() == Some(first.id.as_str()))
                .then_some(())
        },
    )
    .await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "esc",
        "--kind",
        "exec",
        "--command",
        &cmd,
    ]);
    let first_epoch = common::epoch(&db.slot("slot-001").await);
    let old = wait_for(
        Duration::from_secs(20),
        "the first copy's three escapees",
        || async {
            let p = pids(&db, first_epoch);
            (p.len() == 3).then_some(p)
        },
    )
    .await;
    assert!(old.values().all(|p| alive(*p)), "{old:?}");
    let robot = db.robot("esc").await;
    assert_eq!(
        robot.get_str("containment").ok(),
        Some("subreaper"),
        "{robot}"
    );

    // 1. The holder freezes: the shim's deadline passes, SIGTERM to the whole tree is
    // ignored by all three, SIGKILL follows inside the fence margin. A standby that
    // takes over must find none of them running when its own copy starts.
    let mut second = db.exec_worker(&flags);
    first.signal(libc::SIGSTOP);
    let new = wait_for(
        Duration::from_secs(30),
        "the standby's copy to start",
        || async {
            let epoch = common::epoch(&db.slot("slot-001").await);
            let p = pids(&db, epoch);
            (epoch > first_epoch && p.len() == 3).then_some((epoch, p))
        },
    )
    .await;
    let survivors: Vec<_> = old.iter().filter(|(_, p)| alive(**p)).collect();
    assert!(
        survivors.is_empty(),
        "the frozen holder's escapees still ran beside the new copy (epoch {}): {survivors:?}",
        new.0
    );

    // 2. kill -9 of the holder: its shim sees the pipe close and kills the whole tree
    // at once, well before the lease could lapse.
    let t0 = Instant::now();
    second.kill9();
    wait_for(
        Duration::from_secs(5),
        "the killed holder's escapees to die",
        || async { new.1.values().all(|p| !alive(*p)).then_some(()) },
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5));
    first.signal(libc::SIGCONT);
    let _ = first.child.kill();
}

/// The `seq` of a robot document.
fn seq(r: &Document) -> i64 {
    r.get_i64("seq").unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_poisoned_robot_document_doubles_no_neighbours_step() {
    let db = TestDb::new("poison").await;
    db.init(1).await;
    assert!(db.counters("c", 13, 20).status.success());
    // A `history` that is not an array (the validator refuses it now; written around
    // it, as a pool from before could hold one). The dev server applies the
    // statements of a batch before it and fails the whole command.
    db.store
        .robots()
        .update_one(doc! {"name": "c-7"}, doc! {"$set": {"history": "x"}})
        .bypass_document_validation(true)
        .await
        .unwrap();
    let refused = db
        .store
        .robots()
        .update_one(doc! {"name": "c-8"}, doc! {"$set": {"history": "x"}})
        .await;
    assert!(
        refused.is_err(),
        "the validator refuses a history that is not an array"
    );

    let _w = db.worker(&[]);
    wait_for(
        Duration::from_secs(60),
        "every healthy counter to take 40 steps",
        || async {
            let robots = db.robots().await;
            robots
                .iter()
                .filter(|r| r.get_str("name") != Ok("c-7"))
                .all(|r| seq(r) >= 40)
                .then_some(())
        },
    )
    .await;
    let poisoned = wait_for(
        Duration::from_secs(20),
        "the poisoned robot to be failed",
        || async {
            let r = db.robot("c-7").await;
            (r.get_str("status") == Ok("failed")).then_some(r)
        },
    )
    .await;
    let why = poisoned.get_str("error").unwrap_or_default();
    assert!(why.contains("refused"), "the reason is its status: {why}");
    assert_eq!(seq(&poisoned), 0, "none of its checkpoints landed");
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 12, "{report:?}");
}
