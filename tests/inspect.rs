//! What people see in the database: `scripts/inspect.js` through the real mongosh,
//! and the validators that refuse a bad document in every collection.

mod common;

use std::process::Command;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson};
use common::{owner, TestDb};

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
    // Up to the events, which name robots too (a create, a restart).
    let stale = stale.split("== recent events").next().unwrap();
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
    // An update no holder has judged yet: its robot's slot has no holder (here, no
    // such slot), so nothing answers it while the script reads.
    db.store
        .robots()
        .insert_one(bson::doc! {
            "_id": bson::oid::ObjectId::new(), "name": "orphan", "kind": "counter", "spec": {},
            "slot_id": "slot-009", "epoch": 0_i64, "context": {}, "seq": 0_i64, "paused": false,
            "status": "pending", "created_at": bson::DateTime::now(),
            "update": {"id": bson::oid::ObjectId::new(), "kind": "exec", "spec": {}},
        })
        .await
        .unwrap();
    let text = inspect();
    let waiting = text
        .split("== updates waiting")
        .nth(1)
        .unwrap()
        .split("== recent events")
        .next()
        .unwrap();
    assert!(
        waiting.contains("orphan") && waiting.contains("exec"),
        "{text}"
    );
    // docs/mongosh.md's one-liner works too.
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
