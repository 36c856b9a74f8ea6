//! Fencing that survives moves and dead processes, on real worker processes: a robot
//! moved X → Y → X inside one tick never has two writers, and an `exec` robot's
//! process never outlives its holder's lease (kill -9, SIGSTOP).

mod common;

use std::time::{Duration, Instant};

use bson::Document;
use common::{invariants, owner, TestDb};

fn seq(r: &Document) -> i64 {
    r.get_i64("seq").unwrap_or(0)
}

async fn all_held(db: &TestDb, slots: usize) -> Vec<String> {
    common::wait_for(Duration::from_secs(30), "every slot held", || async {
        let owners: Vec<String> = db.slots().await.iter().filter_map(owner).collect();
        (owners.len() == slots).then_some(owners)
    })
    .await
}

async fn seq_beyond(db: &TestDb, name: &str, at_least: i64) {
    common::wait_for(
        Duration::from_secs(20),
        &format!("{name} at seq > {at_least}"),
        || async { (seq(&db.robot(name).await) > at_least).then_some(()) },
    )
    .await
}

/// The last history entry's slot.
async fn last_slot(db: &TestDb, name: &str) -> Option<String> {
    let r = db.robot(name).await;
    invariants::entries(&r).last().map(|e| e.slot.clone())
}

async fn last_on(db: &TestDb, name: &str, slot: &str) {
    common::wait_for(
        Duration::from_secs(20),
        &format!("{name} to checkpoint on {slot}"),
        || async { (last_slot(db, name).await.as_deref() == Some(slot)).then_some(()) },
    )
    .await
}

/// `robot move NAME --to TO`, except that the old slot's `rev` is not bumped: its
/// holder does not notice the robot left, exactly as when the move and the move
/// back both fall between two of its renewals.
async fn move_unseen_by(db: &TestDb, name: &str, to: &str) {
    use bson::doc;
    let r = db.robot(name).await;
    let moved = db
        .store
        .robots()
        .update_one(
            doc! {"_id": r.get_object_id("_id").unwrap()},
            doc! {"$set": {"slot_id": to, "epoch": 0_i64, "status": "pending"}},
        )
        .await
        .unwrap();
    assert_eq!(moved.modified_count, 1);
    let from = r.get_str("slot_id").unwrap();
    for (slot, delta, rev) in [(from, -1_i64, 0_i64), (to, 1, 1)] {
        db.store
            .slots()
            .update_one(
                doc! {"_id": slot},
                doc! {"$inc": {"robot_count": delta, "rev": rev}},
            )
            .await
            .unwrap();
    }
}

/// The move of the issue: `robot move r --to Y` then `--to X` before X's holder
/// renews. X's holder used to re-adopt a robot it never stopped, under X's same
/// epoch, and its old instance overwrote what Y's copy had checkpointed (`n` fell
/// behind `seq`). The robot steps every 3 s and eagerly on each start, so X's old
/// instance stays quiet across both moves while Y's copy writes once: exactly the
/// window of the bug. Now the re-adoption raises the robot's generation: the old
/// instance is fenced and stopped, and a new one starts from Y's checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn moved_there_and_back_inside_a_tick_never_has_two_writers() {
    let db = TestDb::new("xyx").await;
    db.init(2).await;
    let _w = [db.worker(&[]), db.worker(&[])];
    all_held(&db, 2).await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "m",
        "--kind",
        "counter",
        "--spec",
        r#"{"interval_ms": 3000, "eager": true, "history": 1000}"#,
    ]);
    seq_beyond(&db, "m", 0).await;
    let rounds = 4;
    for round in 0..rounds {
        let x = db.robot("m").await.get_str("slot_id").unwrap().to_string();
        let y = if x == "slot-001" {
            "slot-002"
        } else {
            "slot-001"
        };
        // Right after X's instance stepped, so its next step is 3 s away.
        let before = seq(&db.robot("m").await);
        seq_beyond(&db, "m", before).await;
        let t0 = Instant::now();
        if round % 2 == 0 {
            db.cli_ok(&["robot", "move", "m", "--to", y]);
        } else {
            move_unseen_by(&db, "m", y).await;
        }
        last_on(&db, "m", y).await;
        db.cli_ok(&["robot", "move", "m", "--to", &x]);
        println!("round {round}: {x} -> {y} -> {x} in {:?}", t0.elapsed());
        last_on(&db, "m", &x).await;
        // Past the moment X's old instance would have stepped again.
        let back = seq(&db.robot("m").await);
        seq_beyond(&db, "m", back).await;
        invariants::check(&db).await;
    }
    let gen = db.robot("m").await.get_i64("gen").unwrap();
    assert!(
        gen > 2 * rounds,
        "every adoption raised the generation: {gen}"
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1);
    println!("{report:?}");
}
