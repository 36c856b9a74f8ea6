//! A pool's cold start: many worker processes started at once claim every slot
//! once, and no new holder fences itself while the others are still starting.
//! Alone in its test binary, so that no other test's load is mixed into the start.

mod common;

use std::time::Duration;

use common::{owner, TestDb, WorkerProc};

/// Fifty workers started at once over ten slots: every slot is claimed once (epoch
/// 1), no holder fences itself, and each robot runs once. Only the front of the line
/// surveys at first; the rest are poked by the claimers.
#[tokio::test(flavor = "multi_thread")]
async fn a_cold_start_of_fifty_workers_claims_each_slot_once_without_a_self_fence() {
    const WORKERS: usize = 50;
    const SLOTS: usize = 10;
    let db = TestDb::new("cold_start").await;
    db.init(SLOTS as u32).await;
    db.create_counters(SLOTS as u32 * 2);
    let started = std::time::Instant::now();
    let workers: Vec<WorkerProc> = (0..WORKERS).map(|_| db.worker(&[])).collect();
    common::wait_for(Duration::from_secs(120), "every slot held", || async {
        db.slots()
            .await
            .iter()
            .all(|s| owner(s).is_some())
            .then_some(())
    })
    .await;
    println!(
        "every slot held {:?} after the first start",
        started.elapsed()
    );
    // Then every robot steps on a few times: a renewal that came too late in the
    // start's aftermath would have fenced its holder by then.
    common::runs_on_once(&db, SLOTS * 2).await;
    let fences: u64 = workers
        .iter()
        .map(|w| w.metric("slotpool_self_fences_total").unwrap_or(0))
        .sum();
    let slots = db.slots().await;
    let claimed_again = slots.iter().any(|s| s.get_i64("epoch").unwrap() != 1);
    if fences > 0 || claimed_again {
        for w in &workers {
            let log = std::fs::read_to_string(&w.log).unwrap_or_default();
            for line in log.lines().filter(|l| {
                ["fence", "claimed", "lost", "handing"]
                    .iter()
                    .any(|k| l.contains(k))
            }) {
                println!("{}: {line}", w.id);
            }
        }
    }
    assert_eq!(fences, 0, "holders fenced themselves at the cold start");
    assert!(
        !claimed_again,
        "a slot was claimed more than once: {slots:?}"
    );
}
