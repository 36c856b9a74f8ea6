//! Standbys in line: only the front of the line watches every tick, takeover still
//! lands at expiry, several expiries are claimed in parallel, and the next in line
//! moves up; on real worker processes and the real dev server, with the invariant
//! checker over each whole run.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use bson::doc;
use common::{invariants, owner, TestDb, WorkerProc};

/// Counters `c-1`… stepping every 200 ms with their whole history.
fn create_counters(db: &TestDb, count: u32) {
    let out = db.counters("c", count, 200);
    assert!(out.status.success(), "{out:?}");
}

/// The workers whose /metrics say they stand at the front of the line.
fn front(workers: &[&WorkerProc]) -> BTreeSet<String> {
    workers
        .iter()
        .filter(|w| w.metric("slotpool_line_front") == Some(1))
        .map(|w| w.id.clone())
        .collect()
}

/// The `n` smallest ids: the front of a line of standbys.
fn first(workers: &[&WorkerProc], n: usize) -> BTreeSet<String> {
    let ids: BTreeSet<String> = workers.iter().map(|w| w.id.clone()).collect();
    ids.into_iter().take(n).collect()
}

async fn wait_front(workers: &[&WorkerProc], want: &BTreeSet<String>, what: &str) {
    common::wait_for(Duration::from_secs(30), what, || async {
        (front(workers) == *want).then_some(())
    })
    .await
}

/// Every robot steps on, and the invariant checker finds each of the `robots` ran
/// once throughout.
async fn runs_on_once(db: &TestDb, robots: usize) {
    let before = db.robots().await;
    common::wait_for(
        Duration::from_secs(20),
        "every robot to step on",
        || async {
            let now = db.robots().await;
            now.iter()
                .zip(&before)
                .all(|(a, b)| a.get_i64("seq").unwrap() > b.get_i64("seq").unwrap() + 1)
                .then_some(())
        },
    )
    .await;
    let report = invariants::check(db).await;
    assert_eq!(report.robots, robots);
    println!("{report:?}");
}

/// How many surveys each worker makes over `window`.
async fn surveys_over(workers: &[&WorkerProc], window: Duration) -> Vec<(String, u64)> {
    let count = |w: &WorkerProc| w.metric("slotpool_surveys_total").unwrap_or(0);
    let before: Vec<u64> = workers.iter().map(|w| count(w)).collect();
    tokio::time::sleep(window).await;
    workers
        .iter()
        .zip(before)
        .map(|(w, b)| (w.id.clone(), count(w) - b))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_front_watches_the_rest_waits_and_moves_up_when_one_ahead_claims() {
    let db = TestDb::new("line").await;
    db.init(2).await;
    let mut holders = vec![db.worker(&[]), db.worker(&[])];
    create_counters(&db, 4);
    common::wait_for(Duration::from_secs(30), "two holders", || async {
        let h = db.held_per_worker().await;
        (h.len() == 2 && h.values().all(|n| *n == 1)).then_some(())
    })
    .await;
    let standbys: Vec<WorkerProc> = (0..5).map(|_| db.worker(&[])).collect();
    let all: Vec<&WorkerProc> = standbys.iter().collect();
    let watchers = first(&all, 3);
    // Holders stand behind three standbys: once each has re-read its place (every 5
    // ticks), the front is exactly the three first standbys.
    let everyone: Vec<&WorkerProc> = standbys.iter().chain(holders.iter()).collect();
    wait_front(
        &everyone,
        &watchers,
        "the three first standbys at the front, the holders behind",
    )
    .await;

    // The front surveys every tick; the rest about every five.
    let counts = surveys_over(&all, Duration::from_secs(10)).await;
    println!("surveys in 10 s: {counts:?}");
    for (id, n) in &counts {
        if watchers.contains(id) {
            assert!(*n >= 6, "{id} at the front surveyed {n} times in 10 s");
        } else {
            assert!(*n <= 4, "{id} behind surveyed {n} times in 10 s");
        }
    }

    // Both holders die at once: two front standbys claim the two slots in parallel.
    let old: BTreeSet<String> = holders.iter().map(|w| w.id.clone()).collect();
    for h in &mut holders {
        h.kill9();
    }
    let new = common::wait_for(Duration::from_secs(15), "both slots taken over", || async {
        let owners: BTreeSet<String> = db.slots().await.iter().filter_map(owner).collect();
        (owners.len() == 2 && owners.is_disjoint(&old)).then_some(owners)
    })
    .await;
    assert!(
        new.is_subset(&watchers),
        "claimed by watchers: {new:?} of {watchers:?}"
    );

    // The three left are now the whole line of standbys: the rear one moves up.
    let left: Vec<&WorkerProc> = standbys.iter().filter(|w| !new.contains(&w.id)).collect();
    let everyone: BTreeSet<String> = left.iter().map(|w| w.id.clone()).collect();
    wait_front(&left, &everyone, "the one behind to move up").await;

    runs_on_once(&db, 4).await;
}

/// More slots expire at once than there are watchers: the watchers take theirs at
/// once, the rest are taken within the rear's pace, and nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn more_expiries_at_once_than_watchers_are_all_taken() {
    let db = TestDb::new("line_many").await;
    db.init(3).await;
    let mut holders: Vec<WorkerProc> = (0..3).map(|_| db.worker(&["--watchers", "1"])).collect();
    create_counters(&db, 6);
    common::wait_for(Duration::from_secs(30), "three holders", || async {
        let h = db.held_per_worker().await;
        (h.len() == 3 && h.values().all(|n| *n == 1)).then_some(())
    })
    .await;
    let standbys: Vec<WorkerProc> = (0..3).map(|_| db.worker(&["--watchers", "1"])).collect();
    let all: Vec<&WorkerProc> = standbys.iter().collect();
    wait_front(&all, &first(&all, 1), "one watcher").await;
    let old: BTreeSet<String> = holders.iter().map(|w| w.id.clone()).collect();
    for h in &mut holders {
        h.kill9();
    }
    // L for the first, then within the rear's 5 ticks (and a beat) for the others;
    // a holder may overflow meanwhile and hand the slot back.
    let ids: BTreeSet<String> = standbys.iter().map(|w| w.id.clone()).collect();
    common::wait_for(Duration::from_secs(40), "one slot per standby", || async {
        let owners: Vec<String> = db.slots().await.iter().filter_map(owner).collect();
        let distinct: BTreeSet<String> = owners.iter().cloned().collect();
        (owners.len() == 3 && distinct == ids && distinct.is_disjoint(&old)).then_some(())
    })
    .await;
    runs_on_once(&db, 6).await;
}

/// A graceful release is claimed through the first standby's release poll, long
/// before its next survey: with a 20 s tick the survey is up to 20 s away, and the
/// hit counter shows the poll, not a lucky survey, found it.
#[tokio::test(flavor = "multi_thread")]
async fn a_released_slot_is_claimed_through_the_release_poll() {
    let db = TestDb::new("line_release").await;
    db.init(1).await;
    let slow = ["--tick", "20s"];
    let holder = db.worker(&slow);
    common::wait_for(Duration::from_secs(30), "the holder", || async {
        (owner(&db.slot("slot-001").await)? == holder.id).then_some(())
    })
    .await;
    create_counters(&db, 2);
    let standby = db.worker(&slow);
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    holder.signal(libc::SIGTERM);
    common::wait_for(
        Duration::from_secs(10),
        "the standby to claim the released slot",
        || async { (owner(&db.slot("slot-001").await)? == standby.id).then_some(()) },
    )
    .await;
    let hits = standby
        .metric("slotpool_release_poll_hits_total")
        .unwrap_or(0);
    assert!(hits >= 1, "claimed without a release-poll hit");
    runs_on_once(&db, 2).await;
}

/// A slot the poll finds but nobody may take (an older holder renews `time` only,
/// so its `expires_ms` stays 0) costs one extra survey per tick, not one per poll.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_the_poll_cannot_take_does_not_start_a_survey_loop() {
    let db = TestDb::new("line_mute").await;
    db.init(1).await;
    let renew = || async {
        db.store
            .slots()
            .update_one(
                doc! {"_id": "slot-001"},
                vec![doc! {"$set": {
                    "owner": "10.9.9.9:7700", "ip": "10.9.9.9", "port": 7700_i64,
                    "time": "$$NOW", "expires_ms": 0_i64,
                }}],
            )
            .await
            .unwrap();
    };
    renew().await;
    let standby = db.worker(&[]);
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    let count = |name| standby.metric(name).unwrap_or(0);
    let (surveys, hits) = (
        count("slotpool_surveys_total"),
        count("slotpool_release_poll_hits_total"),
    );
    // The old holder renews every 300 ms for 6 s (3 leases).
    for _ in 0..20 {
        renew().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let surveys = count("slotpool_surveys_total") - surveys;
    let hits = count("slotpool_release_poll_hits_total") - hits;
    println!("in about 6 s: {surveys} surveys, {hits} poll hits");
    assert!(hits >= 1, "the poll saw the slot");
    // Unmuted, a poll every 50 ms would survey over 100 times.
    assert!(surveys <= 20, "{surveys} surveys in about 6 s");
    assert_eq!(
        owner(&db.slot("slot-001").await).as_deref(),
        Some("10.9.9.9:7700")
    );
}
