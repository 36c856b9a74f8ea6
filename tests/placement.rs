//! Placement by load on real workers and the dev server: each holder measures its
//! load and its slot's robots, and new robots and `rebalance --by load` go to the
//! idlest holder. The hogs are real processes that burn CPU.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{invariants, script, TestDb};

/// A robot that burns a whole core.
fn hog(db: &TestDb) -> String {
    script(db, "hog.sh", "while :; do :; done")
}

/// A robot that burns about a quarter of a core: a busy stretch, then a rest.
fn quarter_hog(db: &TestDb) -> String {
    script(
        db,
        "quarter-hog.sh",
        "while :; do for ((i = 0; i < 20000; i++)); do :; done; sleep 0.1; done",
    )
}

/// `slots list --json`, parsed.
fn slots_list(db: &TestDb) -> serde_json::Value {
    serde_json::from_str(&db.cli_ok(&["slots", "list", "--json"])).unwrap()
}

/// Each slot's holder's load score, from `slots list --json`.
fn holder_loads(db: &TestDb) -> BTreeMap<String, Option<f64>> {
    slots_list(db)["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["holder_load"].as_f64(),
            )
        })
        .collect()
}

/// The cores a worker's CPU share is measured against (the host's, here: the test
/// workers have no quota of their own), from `status --json`.
fn cores(db: &TestDb) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(&db.cli_ok(&["status", "--json"])).ok()?;
    v["loads"]
        .as_object()?
        .values()
        .find_map(|l| l["cores"].as_f64())
}

/// How many score points `cores` of CPU are on this machine (CPU weighs 64 of 100).
fn points(db: &TestDb, used: f64) -> Option<f64> {
    Some(used / cores(db)? * 64.0)
}

/// Each robot's slot, by name.
async fn slot_of(db: &TestDb) -> BTreeMap<String, String> {
    db.robots()
        .await
        .iter()
        .map(|r| {
            (
                r.get_str("name").unwrap().to_string(),
                r.get_str("slot_id").unwrap().to_string(),
            )
        })
        .collect()
}

fn create(db: &TestDb, name: &str, extra: &[&str]) {
    let mut args = vec!["robot", "create", "--name", name];
    args.extend_from_slice(extra);
    db.cli_ok(&args);
}

/// Two holders with one robot each; one robot burns a core. The hog's holder
/// measures it, records it as its slot's cost, and its score rises: ten new
/// robots go to the other slot, though the counts were equal.
#[tokio::test(flavor = "multi_thread")]
async fn ten_new_robots_go_to_the_holder_without_the_hog() {
    let db = TestDb::new("placement_hog").await;
    db.init(2).await;
    let hog = hog(&db);
    create(
        &db,
        "hog",
        &["--kind", "exec", "--command", &hog, "--by", "count"],
    );
    create(&db, "quiet", &["--kind", "counter", "--by", "count"]);
    assert_eq!(
        slot_of(&db).await,
        BTreeMap::from([
            ("hog".to_string(), "slot-001".to_string()),
            ("quiet".to_string(), "slot-002".to_string()),
        ])
    );
    let _w = [db.exec_worker(&[]), db.exec_worker(&[])];
    common::wait_for(
        Duration::from_secs(60),
        "the hog's holder to measure it and score well above the other",
        || async {
            // The hog measured at 0.3 core at least, on whatever cores this is.
            let margin = points(&db, 0.3)?;
            let loads = holder_loads(&db);
            let listed = slots_list(&db);
            let cost = listed["slots"][0]["cost"]["total"]["millicores"].as_u64();
            match (loads["slot-001"], loads["slot-002"], cost) {
                (Some(busy), Some(idle), Some(c)) if busy > idle + margin && c >= 300 => Some(()),
                _ => None,
            }
        },
    )
    .await;
    let listed = slots_list(&db);
    let hog_slot = &listed["slots"][0];
    assert_eq!(
        hog_slot["cost"]["top"][0]["name"], "hog",
        "and names it first: {hog_slot}"
    );
    let out = db.cli_ok(&[
        "robot", "create", "--name", "new", "--kind", "counter", "--count", "10",
    ]);
    let placed = slot_of(&db).await;
    let on_quiet = placed
        .iter()
        .filter(|(n, s)| n.starts_with("new-") && s.as_str() == "slot-002")
        .count();
    assert_eq!(on_quiet, 10, "{out}\n{placed:?}");
    // `status` shows the score of each holder and the slots' CPU.
    let status = db.cli_ok(&["status"]);
    assert!(
        status.contains("LOAD") && status.contains("CPU"),
        "{status}"
    );
    assert!(status.contains("load:"), "{status}");
}

/// Two robots that each burn a quarter of a core on one holder, two idle
/// holders: `rebalance --by load` moves one of them to an idle holder (one each
/// on two holders is as even as two robots on three get), every moved robot runs
/// on its new slot, and the invariant checker finds nothing run twice or lost.
#[tokio::test(flavor = "multi_thread")]
async fn rebalance_by_load_moves_the_hogs_apart() {
    let db = TestDb::new("placement_rebalance").await;
    db.init(1).await;
    let hog = quarter_hog(&db);
    for name in ["hog-a", "hog-b"] {
        create(&db, name, &["--kind", "exec", "--command", &hog]);
    }
    db.init(3).await;
    assert!(db.counters("c", 6, 200).status.success());
    let _w = [
        db.exec_worker(&[]),
        db.exec_worker(&[]),
        db.exec_worker(&[]),
    ];
    common::wait_for(
        Duration::from_secs(90),
        "both hogs measured on slot-001, its holder well above the others",
        || async {
            let listed = slots_list(&db);
            let slot = &listed["slots"][0];
            let named = slot["cost"]["top"]
                .as_array()
                .map(|top| {
                    top.iter()
                        .filter(|r| {
                            r["name"].as_str().unwrap_or("").starts_with("hog")
                                && r["millicores"].as_u64().unwrap_or(0) >= 100
                        })
                        .count()
                })
                .unwrap_or(0);
            // Both measured, at a fifth of a core together at least.
            let margin = points(&db, 0.2)?;
            let loads = holder_loads(&db);
            let busy = loads["slot-001"]?;
            let idlest = loads.values().filter_map(|l| *l).fold(f64::MAX, f64::min);
            (named == 2 && busy > idlest + margin).then_some(())
        },
    )
    .await;
    let plan = db.cli_ok(&["rebalance", "--by", "load", "--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(v["moves"].as_array().unwrap().len(), 1, "{plan}");
    assert!(
        v["scores"].as_object().is_some_and(|s| s.len() == 3),
        "{plan}"
    );
    assert_eq!(
        slot_of(&db).await["hog-a"],
        "slot-001",
        "a dry run moves nothing"
    );
    let out = db.cli_ok(&["rebalance", "--by", "load"]);
    let event = db
        .store
        .events()
        .find_one(bson::doc! {"kind": "rebalance"})
        .await
        .unwrap()
        .expect("the rebalance is in events");
    assert_eq!(event.get_str("detail").unwrap(), "1 robot(s) moved by load");
    let placed = slot_of(&db).await;
    assert_ne!(placed["hog-a"], placed["hog-b"], "{out}\n{placed:?}");
    let moved = if placed["hog-a"] == "slot-001" {
        "hog-b"
    } else {
        "hog-a"
    };
    common::wait_for(
        Duration::from_secs(30),
        "the moved hog to run on its new slot",
        || async {
            let r = db.robot(moved).await;
            (r.get_str("status") == Ok("running")
                && r.get_str("slot_id") == Ok(placed[moved].as_str())
                && r.get_i64("epoch").unwrap_or(0) > 0)
                .then_some(())
        },
    )
    .await;
    // The counters kept stepping through the move, none of them twice.
    let before: i64 = db
        .robots()
        .await
        .iter()
        .filter_map(|r| r.get_i64("seq").ok())
        .sum();
    common::wait_for(
        Duration::from_secs(20),
        "the counters to step on",
        || async {
            let now: i64 = db
                .robots()
                .await
                .iter()
                .filter_map(|r| r.get_i64("seq").ok())
                .sum();
            (now >= before + 12).then_some(())
        },
    )
    .await;
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 6, "{report:?}");
}

/// A rebalance by load refuses, with the way out, while a slot has no holder
/// whose heartbeat measures its load; by count it goes on.
#[tokio::test(flavor = "multi_thread")]
async fn rebalance_by_load_without_holders_says_what_to_do() {
    let db = TestDb::new("placement_unknown").await;
    db.init(2).await;
    assert!(db.counters("c", 2, 200).status.success());
    let out = db.cli(&["rebalance", "--by", "load"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("slot-001 has no live holder") && err.contains("--by count"),
        "{err}"
    );
    let bad = db.cli(&["rebalance", "--by", "load", "--band", "120"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--band takes load score points"));
    db.cli_ok(&["rebalance", "--by", "count"]);
}
