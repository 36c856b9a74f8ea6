//! A large pool against the real dev server: `init` past 999 slots. In a test
//! binary of its own because writing 10,000 slot documents keeps the dev server
//! busy for seconds, and the timing-bound takeover tests in `workers.rs` ran beside
//! it: leases there lapsed for want of an answer (stop 16's CI failure).

mod common;

use std::time::Duration;

use common::TestDb;

/// Past 999 slots: a new pool gets as many digits as its count, so names still sort
/// in numeric order, and a worker holds one of them; a `slot-001` pool refuses to
/// grow past 999 with what to do, and stays as it was.
#[tokio::test(flavor = "multi_thread")]
async fn init_past_999_slots_names_sort_and_a_narrow_pool_says_what_to_do() {
    let db = TestDb::new("wide").await;
    let out = db.cli(&["init", "--slots", "10000", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let slots = db.slots().await;
    assert_eq!(slots.len(), 10_000);
    let ids: Vec<&str> = slots.iter().map(|s| s.get_str("_id").unwrap()).collect();
    assert_eq!(
        (ids[0], ids[999], ids[9_999]),
        ("slot-00001", "slot-01000", "slot-10000")
    );
    let numbers: Vec<u32> = ids.iter().map(|i| i[5..].parse().unwrap()).collect();
    assert!(
        numbers.windows(2).all(|w| w[0] + 1 == w[1]),
        "_id order is numeric order"
    );
    // Rerun: idempotent, nothing added.
    let again = db.cli_ok(&["init", "--slots", "10000", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(report["added"].as_array().unwrap().len(), 0, "{again}");
    // A worker holds one of them, found by the survey's index range. Polled on the
    // worker's /metrics, not by reading all 10,000 slots again and again: that
    // kept the dev server too busy to answer the worker (a CI failure), then
    // checked once in the database.
    let w = db.worker(&["--max-slots", "1"]);
    common::wait_for(Duration::from_secs(30), "a slot held", || async {
        (w.metric("slotpool_slot_held")? == 1).then_some(())
    })
    .await;
    assert_eq!(db.held_per_worker().await.get(&w.id), Some(&1));

    let narrow = TestDb::new("narrow").await;
    narrow.init(5).await;
    let out = narrow.cli(&["init", "--slots", "1000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at most 999") && err.contains("new database"),
        "{err}"
    );
    assert_eq!(
        narrow.slots().await.len(),
        5,
        "the narrow pool is unchanged"
    );
    assert!(narrow.cli(&["init", "--slots", "999"]).status.success());
    assert_eq!(narrow.slots().await.len(), 999);
}
