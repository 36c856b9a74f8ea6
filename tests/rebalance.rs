//! Placement and `slotpool rebalance` on real worker processes and the real dev
//! server: even spreads with and without live workers, fenced rebalance moves that
//! lose and double nothing, and clear errors for bad input.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::Document;
use common::{invariants, TestDb};

fn per_slot(robots: &[Document]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in robots {
        *out.entry(r.get_str("slot_id").unwrap().to_string())
            .or_default() += 1;
    }
    out
}

fn counts(db_robots: &[Document]) -> Vec<usize> {
    per_slot(db_robots).into_values().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn count_six_over_three_slots_is_two_each_with_and_without_workers() {
    let db = TestDb::new("spread").await;
    db.init(3).await;
    let out = db.counters("a", 6, 200);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no worker is alive"), "warned: {err}");
    assert_eq!(counts(&db.robots().await), [2, 2, 2]);
    // Workers just starting and still claiming (the demo's situation).
    let _w = [db.worker(&[]), db.worker(&[]), db.worker(&[])];
    let out = db.counters("b", 6, 200);
    assert!(out.status.success());
    assert_eq!(counts(&db.robots().await), [4, 4, 4]);
    common::wait_for(Duration::from_secs(20), "a live worker", || async {
        let out = db.counters(&format!("c{}", rand_suffix()), 3, 200);
        let quiet = !String::from_utf8_lossy(&out.stderr).contains("no worker is alive");
        quiet.then_some(())
    })
    .await;
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// 7/1/1 → 3/3/3: every moved robot checkpoints on its new slot, a paused robot
/// stays paused, and the invariant checker finds no double run and nothing lost.
#[tokio::test(flavor = "multi_thread")]
async fn rebalance_seven_one_one_to_three_each_with_fenced_moves() {
    let db = TestDb::new("rebalance").await;
    db.init(1).await;
    assert!(db.counters("r", 7, 200).status.success());
    db.init(3).await;
    assert!(db.counters("s", 2, 200).status.success());
    assert_eq!(counts(&db.robots().await), [7, 1, 1]);
    db.cli_ok(&["robot", "pause", "r-7"]);
    let _w = [db.worker(&[]), db.worker(&[]), db.worker(&[])];
    common::wait_for(
        Duration::from_secs(30),
        "every unpaused robot to run",
        || async {
            db.robots()
                .await
                .iter()
                .all(|r| r.get_bool("paused").unwrap() || r.get_i64("seq").unwrap() >= 2)
                .then_some(())
        },
    )
    .await;

    let plan = db.cli_ok(&["rebalance", "--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["after"]["slot-001"], 3, "{plan}");
    assert_eq!(
        counts(&db.robots().await),
        [7, 1, 1],
        "a dry run changes nothing"
    );

    let before: BTreeMap<String, (String, i64)> = db
        .robots()
        .await
        .iter()
        .map(|r| {
            let name = r.get_str("name").unwrap().to_string();
            let slot = r.get_str("slot_id").unwrap().to_string();
            (name, (slot, r.get_i64("seq").unwrap()))
        })
        .collect();
    let out = db.cli_ok(&["rebalance"]);
    println!("{out}");
    assert_eq!(counts(&db.robots().await), [3, 3, 3]);
    let moved: Vec<String> = db
        .robots()
        .await
        .iter()
        .filter(|r| r.get_str("slot_id").unwrap() != before[r.get_str("name").unwrap()].0)
        .map(|r| r.get_str("name").unwrap().to_string())
        .collect();
    assert_eq!(moved.len(), 4, "{out}");
    common::wait_for(
        Duration::from_secs(20),
        "every moved robot to checkpoint on its new slot",
        || async {
            let mut all = true;
            for name in &moved {
                let r = db.robot(name).await;
                if r.get_bool("paused").unwrap() {
                    continue;
                }
                let last = invariants::entries(&r).last().cloned();
                all &= last.is_some_and(|e| e.slot == r.get_str("slot_id").unwrap());
            }
            all.then_some(())
        },
    )
    .await;
    let paused = db.robot("r-7").await;
    assert!(
        paused.get_bool("paused").unwrap(),
        "a paused robot stays paused"
    );
    assert_eq!(paused.get_str("status").unwrap(), "paused");
    assert_eq!(
        paused.get_i64("seq").unwrap(),
        before["r-7"].1,
        "and does not run"
    );
    let again = db.cli_ok(&["rebalance"]);
    assert!(again.contains("already balanced"), "{again}");
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 8);
    println!("{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rebalance_fills_slots_that_init_added() {
    let db = TestDb::new("grow").await;
    db.init(2).await;
    assert!(db.counters("g", 8, 200).status.success());
    db.init(4).await;
    assert_eq!(counts(&db.robots().await), [4, 4]);
    let out = db.cli_ok(&["rebalance", "--max-moves", "1"]);
    assert!(out.contains("moved 1 robot"), "{out}");
    db.cli_ok(&["rebalance"]);
    assert_eq!(counts(&db.robots().await), [2, 2, 2, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_a_clear_error() {
    let db = TestDb::new("rebalance_bad").await;
    let out = db.cli(&["rebalance"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no slots to rebalance over"),
        "{out:?}"
    );
    db.init(3).await;
    let out = db.cli_ok(&["rebalance"]);
    assert!(
        out.contains("nothing to rebalance: there are no robots"),
        "{out}"
    );
    for bad in [
        ["--max-moves", "0"],
        ["--max-moves", "-3"],
        ["--max-moves", "x"],
    ] {
        let out = db.cli(&["rebalance", bad[0], bad[1]]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--max-moves"), "{bad:?}: {err}");
    }
    assert!(db.counters("d", 1, 200).status.success());
    let from = db.robot("d").await.get_str("slot_id").unwrap().to_string();
    let to = if from == "slot-003" {
        "slot-002"
    } else {
        "slot-003"
    };
    db.cli_ok(&["slots", "drain", to]);
    let out = db.cli(&["robot", "move", "d", "--to", to]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is draining") && err.contains("undrain"),
        "{err}"
    );
    assert_eq!(
        db.robot("d").await.get_str("slot_id").unwrap(),
        from,
        "not moved"
    );
    let out = db.cli(&["robot", "move", "d", "--to", "slot-404"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no slot \"slot-404\""));
    // A drained slot is left out of a rebalance.
    db.init(4).await;
    assert!(db.counters("e", 5, 200).status.success());
    db.cli_ok(&["rebalance"]);
    let spread = per_slot(&db.robots().await);
    assert!(
        !spread.contains_key(to),
        "nothing moved onto the drained slot: {spread:?}"
    );
    // Worker flags.
    for (flag, value, says) in [
        ("--max-slots", "0", "use 1 or more"),
        ("--max-slots", "-2", "use 1 or more"),
        ("--overflow-after", "-1s", "negative"),
    ] {
        let out = db.cli(&["worker", "--advertise", "127.0.0.1:1", flag, value]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}

/// A slot drained while a rebalance runs: whichever lands first, no robot is lost,
/// every slot's `robot_count` stays true, and a refused move says so clearly.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_drained_during_a_rebalance_loses_nothing() {
    let db = TestDb::new("drain_race").await;
    db.init(1).await;
    assert!(db.counters("x", 300, 200).status.success());
    db.init(3).await;
    let rebalance = std::process::Command::new(common::BIN)
        .args(["rebalance"])
        .env("MONGODB_URI", &db.uri)
        .env("SLOTPOOL_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    db.cli_ok(&["slots", "drain", "slot-003"]);
    let out = rebalance.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("rebalance exit {:?}: {err}", out.status.code());
    if !out.status.success() {
        assert!(
            err.contains("slot-003 is draining") && err.contains("run `slotpool rebalance` again"),
            "{err}"
        );
    }
    let robots = db.robots().await;
    assert_eq!(robots.len(), 300, "no robot lost");
    let truth = per_slot(&robots);
    for s in db.slots().await {
        let id = s.get_str("_id").unwrap();
        assert_eq!(
            s.get_i64("robot_count").unwrap(),
            truth.get(id).copied().unwrap_or(0) as i64,
            "{id}'s robot_count is true"
        );
    }
}
