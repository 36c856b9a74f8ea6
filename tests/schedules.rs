//! Scheduled robots on real worker processes and the dev server: each firing runs
//! once, through kill -9, SIGSTOP and takeovers, and every firing has a record
//! (the firing checker in `common/invariants.rs`).

mod common;

use std::time::Duration;

use bson::{Bson, Document};
use common::{invariants, wait_for, TestDb};

fn runs(r: &Document) -> Vec<Document> {
    r.get_array("runs")
        .map(|a| a.iter().filter_map(Bson::as_document).cloned().collect())
        .unwrap_or_default()
}

fn succeeded(r: &Document) -> usize {
    runs(r)
        .iter()
        .filter(|x| x.get_str("outcome") == Ok("succeeded"))
        .count()
}

/// A counter firing every second, with its whole record kept.
fn every_second(db: &TestDb, name: &str, extra: &str) {
    let spec =
        format!(r#"{{"schedule": {{"every": "1s", "keep_runs": 1000{extra}}}, "history": 1000}}"#);
    db.cli_ok(&[
        "robot", "create", "--name", name, "--kind", "counter", "--spec", &spec,
    ]);
}

async fn wait_succeeded(db: &TestDb, name: &str, at_least: usize) {
    wait_for(
        Duration::from_secs(60),
        &format!("{name} to succeed {at_least} firings"),
        || async {
            let r = db.robot(name).await;
            (succeeded(&r) >= at_least).then_some(())
        },
    )
    .await;
}

/// The holder's worker, read from the slot.
async fn holder(db: &TestDb) -> String {
    wait_for(Duration::from_secs(30), "a holder", || async {
        common::owner(&db.slot("slot-001").await)
    })
    .await
}

/// An every-second schedule on three workers: the holder killed with -9 mid-way,
/// then another stopped with SIGSTOP across several firings and let go. Each
/// firing runs once, none overlaps another, none goes without a record, and the
/// counter's steps match the firings that succeeded.
#[tokio::test(flavor = "multi_thread")]
async fn an_every_second_schedule_runs_each_firing_once_through_kill_9_and_sigstop() {
    let db = TestDb::new("sched_chaos").await;
    db.init(1).await;
    every_second(&db, "tick", "");
    let mut workers: Vec<common::WorkerProc> = (0..3).map(|_| db.worker(&[])).collect();
    wait_succeeded(&db, "tick", 3).await;

    // kill -9 of the holder.
    let h = holder(&db).await;
    let i = workers
        .iter()
        .position(|w| w.id == h)
        .expect("the holder is ours");
    workers[i].kill9();
    let killed = i;
    let before = succeeded(&db.robot("tick").await);
    wait_succeeded(&db, "tick", before + 4).await;

    // SIGSTOP of the new holder across several firings, then SIGCONT.
    let h = holder(&db).await;
    let i = workers
        .iter()
        .enumerate()
        .position(|(j, w)| w.id == h && j != killed)
        .expect("a live holder");
    workers[i].signal(libc::SIGSTOP);
    let before = succeeded(&db.robot("tick").await);
    wait_succeeded(&db, "tick", before + 4).await;
    workers[i].signal(libc::SIGCONT);
    let before = succeeded(&db.robot("tick").await);
    wait_succeeded(&db, "tick", before + 3).await;

    let report = invariants::check_firings(&db, false).await;
    assert_eq!(report.robots, 1);
    eprintln!("{report:?}");
    assert!(report.succeeded >= 10, "{report:?}");
    // The checkpoints' own record agrees: one live copy at a time.
    invariants::check(&db).await;
    let r = db.robot("tick").await;
    let lateness: Vec<i64> = runs(&r)
        .iter()
        .filter_map(|x| x.get_i64("lateness_ms").ok())
        .collect();
    assert!(!lateness.is_empty());
    // The takeovers' firings were retried as the next attempt, each recorded lost
    // first, or taken over unstarted: never run beside themselves.
    assert!(report.lost <= 2, "{report:?}");
}
