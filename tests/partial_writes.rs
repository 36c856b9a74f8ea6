//! Writes cut short or raced: `init` shrinking the pool while robots are created
//! and moved, and a `robot create` interrupted by a database restart. No robot may
//! end up bound to a slot that does not exist, every slot's `robot_count` stays
//! true, and a rerun finishes what was interrupted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestDb, BIN};

/// Robots per slot id, from the robots, and `robot_count` per slot, from the slots.
async fn counts(db: &TestDb) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let mut truth = BTreeMap::new();
    for r in db.robots().await {
        *truth
            .entry(r.get_str("slot_id").unwrap().to_string())
            .or_default() += 1;
    }
    let mut kept = BTreeMap::new();
    for s in db.slots().await {
        let n = s
            .get_i64("robot_count")
            .or_else(|_| s.get_i32("robot_count").map(i64::from))
            .unwrap_or(0);
        if n != 0 {
            kept.insert(s.get_str("_id").unwrap().to_string(), n);
        }
    }
    (truth, kept)
}

/// Every robot on an existing slot, and every count true.
async fn assert_consistent(db: &TestDb, when: &str) {
    let slots: BTreeSet<String> = db
        .slots()
        .await
        .iter()
        .map(|s| s.get_str("_id").unwrap().to_string())
        .collect();
    let (truth, kept) = counts(db).await;
    let stranded: Vec<_> = truth.iter().filter(|(s, _)| !slots.contains(*s)).collect();
    assert!(
        stranded.is_empty(),
        "{when}: robots on missing slots: {stranded:?}"
    );
    assert_eq!(truth, kept, "{when}: robot_count differs from the robots");
}

fn cli(db: &TestDb, args: &[&str]) -> std::process::Child {
    Command::new(BIN)
        .args(args)
        .env("MONGODB_URI", &db.uri)
        .env("SLOTPOOL_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: std::process::Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn shrinking_while_robots_are_created_and_moved_strands_none() {
    let db = TestDb::new("shrinkrace").await;
    let mut shrunk = 0;
    for round in 0..6 {
        db.init(3).await;
        let n = 100;
        let name = format!("r{round}");
        let count = n.to_string();
        // Start the create and the shrink together, in both orders.
        let (create, shrink) = if round % 2 == 0 {
            let c = cli(
                &db,
                &[
                    "robot", "create", "--name", &name, "--kind", "counter", "--count", &count,
                ],
            );
            (c, cli(&db, &["init", "--slots", "1"]))
        } else {
            let s = cli(&db, &["init", "--slots", "1"]);
            (
                cli(
                    &db,
                    &[
                        "robot", "create", "--name", &name, "--kind", "counter", "--count", &count,
                    ],
                ),
                s,
            )
        };
        let (created, create_out) = finish(create);
        let (ok, shrink_out) = finish(shrink);
        assert!(created, "round {round}: create failed: {create_out}");
        if ok {
            shrunk += 1;
        } else {
            assert!(
                shrink_out.contains("refusing to shrink"),
                "round {round}: {shrink_out}"
            );
        }
        assert_consistent(&db, &format!("round {round} (create vs shrink)")).await;

        // A move racing a shrink: onto slot-003 while it is removed.
        db.init(3).await;
        let robot = format!("{name}-1");
        let mv = cli(&db, &["robot", "move", &robot, "--to", "slot-003"]);
        let shrink = cli(&db, &["init", "--slots", "2"]);
        let (_, mv_out) = finish(mv);
        let (_, shrink_out) = finish(shrink);
        assert_consistent(
            &db,
            &format!("round {round} (move vs shrink: {mv_out} / {shrink_out})"),
        )
        .await;
        // Clear the robots for the next round.
        db.store.robots().delete_many(bson::doc! {}).await.unwrap();
        db.store
            .slots()
            .update_many(bson::doc! {}, bson::doc! {"$set": {"robot_count": 0_i64}})
            .await
            .unwrap();
        db.cli_ok(&["init", "--slots", "3"]);
    }
    assert!(shrunk > 0, "no round shrank; the race was never run");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_create_keeps_counts_true_and_a_rerun_finishes_it() {
    let server = common::PrivateServer::start("create_restart");
    let db = TestDb::on(&server.uri, "t_create_restart").await;
    db.init(3).await;
    let args = [
        "robot", "create", "--name", "bulk", "--kind", "counter", "--count", "5000",
    ];
    // Output to a file, so the test can see the CLI waiting for the database.
    let log = db.dir.join("create.log");
    let create = Command::new(BIN)
        .args(args)
        .env("MONGODB_URI", &db.uri)
        .env("SLOTPOOL_LOG", "warn")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    // Take the database away while the robots go in, for longer than the driver
    // waits (5 s), and bring it back while the CLI is still settling its counts.
    common::wait_for(Duration::from_secs(60), "the first robots", || async {
        let n = db
            .store
            .robots()
            .count_documents(bson::doc! {})
            .await
            .ok()?;
        (n > 0).then_some(())
    })
    .await;
    server.kill9();
    common::wait_for(
        Duration::from_secs(60),
        "the CLI to wait for the database",
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("the database is unreachable").then_some(())
        },
    )
    .await;
    server.restart();
    let started = Instant::now();
    let ok = create.wait_with_output().unwrap().status.success();
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(started.elapsed() < Duration::from_secs(90));
    let n = db.robots().await.len();
    println!("the interrupted create (success: {ok}, {n} robots):\n{out}");
    assert!(!ok && n < 5000, "the create was not interrupted: {out}");
    assert!(
        out.contains(&format!("created {n} of 5000 robots"))
            && out.contains("Rerun the same command"),
        "with {n} robots in the database: {out}"
    );
    assert_consistent(&db, "after the interrupted create").await;

    // The same command again creates the rest, and only the rest.
    let (ok, out) = finish(cli(&db, &args));
    assert!(ok, "{out}");
    if n < 5000 {
        assert!(
            out.contains(&format!("{n} of 5000 robot(s) exist already")),
            "{out}"
        );
    }
    assert_eq!(db.robots().await.len(), 5000);
    assert_consistent(&db, "after the rerun").await;
    // A third time: nothing to do. Another spec under the same names: refused.
    assert!(db.cli_ok(&args).contains("nothing to do"));
    let out = db.cli(&[
        "robot",
        "create",
        "--name",
        "bulk",
        "--kind",
        "counter",
        "--count",
        "5000",
        "--interval-ms",
        "700",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("already exists with another kind or spec"),
        "{err}"
    );
}
