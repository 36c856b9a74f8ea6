//! Group commit against the real dev server: concurrent checkpoints go out as
//! multi-statement updates, each statement keeps its own fence, and a short matched
//! count is resolved by reading the fences back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson};
use common::TestDb;
use slotpool::clock::MonotonicClock;
use slotpool::db::context::{ContextError, ContextStore};
use slotpool::db::group_commit::IN_DOUBT_AFTER;
use slotpool::db::guard::WriteGuard;
use slotpool::db::pacing::WritePacer;
use slotpool::db::robot_doc::gen_after_adoption;
use slotpool::db::robot_doc::RobotStatus;
use slotpool::metrics::Metrics;
use tokio::time::Instant;

const N: usize = 300;

/// Every robot with the generation adopting it as it is now would give it.
async fn as_read(db: &TestDb) -> Vec<(ObjectId, i64)> {
    db.robots()
        .await
        .iter()
        .map(|r| (r.get_object_id("_id").unwrap(), gen_after_adoption(r)))
        .collect()
}

/// The context store of a holder of slot-001 at epoch 1 whose lease lasts an hour,
/// with its write guard and metrics.
fn holder(db: &TestDb) -> (ContextStore, WriteGuard, Arc<Metrics>) {
    let guard = WriteGuard::new(
        Instant::now() + Duration::from_secs(3600),
        Arc::new(MonotonicClock),
    );
    let metrics = Arc::new(Metrics::default());
    let store = ContextStore::new(
        &db.store,
        "slot-001",
        1,
        "10.0.0.1:7700",
        metrics.clone(),
        guard.clone(),
        Arc::new(WritePacer::new(Duration::from_millis(400))),
    );
    (store, guard, metrics)
}

/// `N` robots on slot-001 adopted by a holder at epoch 1; returns the store, the
/// adopted (id, gen) pairs, the guard and the metrics.
async fn adopted(db: &TestDb) -> (ContextStore, Vec<(ObjectId, i64)>, WriteGuard, Arc<Metrics>) {
    db.init(1).await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "g",
        "--kind",
        "counter",
        "--count",
        &N.to_string(),
    ]);
    let ids = as_read(db).await;
    let (store, guard, metrics) = holder(db);
    let mut ours = Vec::new();
    for chunk in ids.chunks(100) {
        let a = store.adopt(chunk).await.unwrap();
        assert!(a.refused.is_empty());
        ours.extend(a.ours);
    }
    assert_eq!(
        ours.len(),
        N,
        "every robot adopted through multi-statement writes"
    );
    (store, ours, guard, metrics)
}

/// Every robot checkpoints at once; returns each one's result.
async fn all_at_once(
    store: &ContextStore,
    robots: &[(ObjectId, i64)],
    n: i64,
) -> Vec<Result<(), ContextError>> {
    let writes = robots.iter().map(|(id, gen)| {
        let store = store.clone();
        let (id, gen) = (*id, *gen);
        async move {
            store
                .checkpoint(&id, gen, &id.to_hex(), doc! {"n": n}, 5, n - 1)
                .await
        }
    });
    futures::future::join_all(writes).await
}

#[tokio::test]
async fn concurrent_checkpoints_go_out_together_and_each_keeps_its_fence() {
    let db = TestDb::new("group").await;
    let (store, robots, _guard, metrics) = adopted(&db).await;

    // 1. All at once: every write lands, in far fewer commands than writes.
    let results = all_at_once(&store, &robots, 1).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let batches = metrics.write_batches.get();
    assert!(
        (1..N as u64 / 5).contains(&batches),
        "{N} concurrent checkpoints in {batches} commands"
    );
    assert_eq!(metrics.batched_writes.get(), N as u64);
    for r in db.robots().await {
        assert_eq!(r.get_i64("seq").unwrap(), 1, "{r}");
        assert_eq!(r.get_document("context").unwrap().get_i64("n").unwrap(), 1);
    }

    // 2. A third of them fenced behind the holder's back (a newer generation, as a
    // re-adoption elsewhere would write; another slot; another epoch), one made
    // unwritable by hand. Those are told exactly; the others land.
    let coll = db.store.robots();
    let mut fenced = Vec::new();
    for (i, (id, _)) in robots.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let change = match i % 9 {
            0 => doc! {"$inc": {"gen": 1_i64}},
            3 => doc! {"$set": {"slot_id": "slot-002"}},
            _ => doc! {"$set": {"epoch": 2_i64}},
        };
        coll.update_one(doc! {"_id": id}, change).await.unwrap();
        fenced.push(*id);
    }
    // A `history` that is not an array (the validator refuses it now; written
    // around it, as an old pool's document could be): the dev server applies the
    // statements before it and fails the whole command, and the resend must not
    // apply those twice.
    let broken = robots[N / 2 + 1].0;
    coll.update_one(doc! {"_id": broken}, doc! {"$set": {"history": "seven"}})
        .bypass_document_validation(true)
        .await
        .unwrap();
    let results = all_at_once(&store, &robots, 2).await;
    for ((id, _), r) in robots.iter().zip(&results) {
        if fenced.contains(id) {
            assert!(matches!(r, Err(ContextError::Fenced { .. })), "{id}: {r:?}");
        } else if *id == broken {
            assert!(matches!(r, Err(ContextError::Refused { .. })), "{r:?}");
        } else {
            assert!(r.is_ok(), "{id}: {r:?}");
        }
    }
    for r in db.robots().await {
        let id = r.get_object_id("_id").unwrap();
        let n = r.get_document("context").unwrap().get_i64("n").unwrap();
        if fenced.contains(&id) || id == broken {
            assert_eq!(n, 1, "a fenced or refused write changed nothing: {r}");
        } else {
            assert_eq!((n, r.get_i64("seq").unwrap()), (2, 2), "{r}");
        }
    }
    assert_eq!(metrics.fenced_writes.get(), fenced.len() as u64);
}

#[tokio::test]
async fn nothing_is_sent_once_the_lease_lapsed() {
    let db = TestDb::new("group_lapsed").await;
    let (store, robots, guard, _metrics) = adopted(&db).await;
    guard.revoke();
    let results = all_at_once(&store, &robots[..50], 9).await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(ContextError::Lapsed { .. }))));
    let untouched = db
        .store
        .robots()
        .count_documents(doc! {"context.n": 9_i64})
        .await
        .unwrap();
    assert_eq!(untouched, 0);
    assert!(db
        .robots()
        .await
        .iter()
        .all(|r| r.get("seq") == Some(&Bson::Int64(0))));
}

/// Robot output is fenced by generation: once a newer instance kept lines, an older
/// one's never land (its upsert collides); and nothing lands after the lease's
/// write guard closed.
#[tokio::test(flavor = "multi_thread")]
async fn output_of_a_stale_instance_or_after_the_deadline_never_lands() {
    use slotpool::db::output_log::{OutputLog, Stream};
    let db = TestDb::new("gc_output").await;
    let outputs = db.store.outputs();
    let open = || {
        WriteGuard::new(
            Instant::now() + Duration::from_secs(3600),
            Arc::new(MonotonicClock),
        )
    };
    let pacer = || Arc::new(WritePacer::new(Duration::from_millis(400)));
    let older = OutputLog::spawn(db.store.clone(), pacer(), open());
    let newer = OutputLog::spawn(db.store.clone(), pacer(), open());
    let (robot, other) = (ObjectId::new(), ObjectId::new());
    let texts = |id: ObjectId| {
        let outputs = outputs.clone();
        async move {
            let d = outputs.find_one(doc! {"_id": id}).await.unwrap()?;
            let lines = d.get_array("lines").ok()?.clone();
            Some(
                lines
                    .iter()
                    .map(|l| {
                        l.as_document()
                            .unwrap()
                            .get_str("text")
                            .unwrap()
                            .to_string()
                    })
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert!(newer.keep(robot, 2, Stream::Stdout, "from the current instance"));
    common::wait_for(Duration::from_secs(10), "the current line", || async {
        texts(robot).await.filter(|t| t.len() == 1).map(|_| ())
    })
    .await;
    // The stale instance writes for `robot` and, in the same command, for `other`:
    // once `other`'s line is there, the stale write was answered.
    assert!(older.keep(robot, 1, Stream::Stdout, "stale"));
    assert!(older.keep(other, 1, Stream::Stderr, "witness"));
    common::wait_for(Duration::from_secs(10), "the witness line", || async {
        texts(other).await.map(|_| ())
    })
    .await;
    assert_eq!(
        texts(robot).await.unwrap(),
        ["from the current instance"],
        "a stale instance's line landed"
    );
    // Past the deadline nothing is written.
    let lapsed = OutputLog::spawn(
        db.store.clone(),
        pacer(),
        WriteGuard::new(Instant::now(), Arc::new(MonotonicClock)),
    );
    let late = ObjectId::new();
    lapsed.keep(late, 9, Stream::Stdout, "after the deadline");
    assert!(newer.keep(robot, 2, Stream::Stdout, "later"));
    common::wait_for(Duration::from_secs(10), "the later line", || async {
        texts(robot).await.filter(|t| t.len() == 2).map(|_| ())
    })
    .await;
    // The lapsed writer had its flush by now (both wait one flush period).
    tokio::time::sleep(slotpool::db::output_log::FLUSH_EVERY).await;
    assert!(
        texts(late).await.is_none(),
        "a line landed after the deadline"
    );
}

/// An adoption that matched every robot returns the generations it gave without
/// reading them back, by the pipeline's own rule, whatever a hand edit left in `gen`.
/// A robot adopted elsewhere between the holder's read and its adoption (moved away
/// and back) gets a generation the holder did not guess: its first write is fenced,
/// so the wrong guess can only stop that instance, never let two write.
#[tokio::test]
async fn adoption_knows_the_generations_it_gave_and_a_wrong_guess_fails_closed() {
    let db = TestDb::new("adopt_gen").await;
    db.init(1).await;
    db.cli_ok(&[
        "robot", "create", "--name", "a", "--kind", "counter", "--count", "6",
    ]);
    let coll = db.store.robots();
    let docs = db.robots().await;
    let id = |i: usize| docs[i].get_object_id("_id").unwrap();
    let edits = [
        doc! {"$unset": {"gen": ""}},
        doc! {"$set": {"gen": 5_i32}},
        doc! {"$set": {"gen": 7_i64}},
        doc! {"$set": {"gen": 3.0_f64}},
        doc! {"$set": {"gen": "x"}},
    ];
    // Past the validator, as on a pool whose validators predate `gen`.
    for (i, e) in edits.into_iter().enumerate() {
        coll.update_one(doc! {"_id": id(i)}, e)
            .bypass_document_validation(true)
            .await
            .unwrap();
    }
    let read = as_read(&db).await;
    // After the read: the last robot adopted elsewhere (its generation raised).
    coll.update_one(doc! {"_id": id(5)}, doc! {"$inc": {"gen": 1_i64}})
        .await
        .unwrap();
    let (store, _guard, _metrics) = holder(&db);
    let adopted = store.adopt(&read).await.unwrap();
    assert_eq!(adopted.ours.len(), 6, "{adopted:?}");
    for (id, gen) in &adopted.ours {
        let stored = coll
            .find_one(doc! {"_id": id})
            .await
            .unwrap()
            .unwrap()
            .get_i64("gen")
            .unwrap();
        let written = store
            .checkpoint(id, *gen, &id.to_hex(), doc! {"n": 1_i64}, 0, 0)
            .await;
        if *id == read[5].0 {
            assert_ne!(stored, *gen, "the guess for the robot adopted elsewhere");
            assert!(
                matches!(written, Err(ContextError::Fenced { .. })),
                "{written:?}"
            );
        } else {
            assert_eq!(stored, *gen, "robot {id}");
            assert!(written.is_ok(), "{written:?}");
        }
    }
}

/// A holder of slot-001 at `epoch` as `worker`, whose lease lasts an hour.
fn holder_at(db: &TestDb, worker: &str, epoch: i64) -> ContextStore {
    ContextStore::new(
        &db.store,
        "slot-001",
        epoch,
        worker,
        Arc::new(Metrics::default()),
        WriteGuard::new(
            Instant::now() + Duration::from_secs(3600),
            Arc::new(MonotonicClock),
        ),
        Arc::new(WritePacer::new(Duration::from_millis(400))),
    )
}

/// One robot on slot-001 adopted by a holder at epoch 1; its id and gen.
async fn one_adopted(db: &TestDb) -> (ObjectId, i64) {
    db.init(1).await;
    db.cli_ok(&["robot", "create", "--name", "b", "--kind", "counter"]);
    let (store, _guard, _metrics) = holder(db);
    let adopted = store.adopt(&as_read(db).await).await.unwrap();
    adopted.ours[0]
}

/// One robot adopted at epoch 1 (`one_adopted`), and the holders on either side of
/// a takeover: the last one (epoch 1) and the new one (epoch 2). Returns the robot,
/// its generation under the last holder, and the two holders.
async fn taken_over(db: &TestDb) -> (ObjectId, i64, ContextStore, ContextStore) {
    let (id, old_gen) = one_adopted(db).await;
    let old = holder_at(db, "10.0.0.1:7700", 1);
    let new = holder_at(db, "10.0.0.2:7700", 2);
    (id, old_gen, old, new)
}

async fn robot(db: &TestDb, id: &ObjectId) -> bson::Document {
    db.store
        .robots()
        .find_one(doc! {"_id": id})
        .await
        .unwrap()
        .unwrap()
}

fn is_fenced<T: std::fmt::Debug>(r: &Result<T, ContextError>) -> bool {
    matches!(r, Err(ContextError::Fenced { .. }))
}

/// A new holder (epoch 2) starts the robot before its adoption write: the instance
/// writes under the state it was listed with until the adoption lands, and under
/// the adopted state alone after. A write of the last holder still in flight is
/// ordered by `seq`: sent after the instance's first checkpoint, it matches
/// nothing; after the adoption its generation alone refuses it.
#[tokio::test]
async fn an_instance_started_before_its_adoption_writes_until_then_under_the_listed_state() {
    let db = TestDb::new("early_listed").await;
    let (id, old_gen, old, new) = taken_over(&db).await;
    let new_gen = old_gen + 1;
    // Without an early start, the instance of the coming generation cannot write.
    let refused = new
        .checkpoint(&id, new_gen, "b", doc! {"n": 1_i64}, 0, 0)
        .await;
    assert!(is_fenced(&refused), "{refused:?}");
    new.start_early(id, Some(old_gen), 1);
    assert!(new
        .set_status(&id, new_gen, RobotStatus::Running, None, None)
        .await
        .unwrap());
    new.checkpoint(&id, new_gen, "b", doc! {"n": 1_i64}, 0, 0)
        .await
        .unwrap();
    // The last holder's checkpoint that followed seq 0 arrives now: it matches
    // nothing, although the robot still carries that holder's epoch and generation.
    let late = old
        .checkpoint(&id, old_gen, "b", doc! {"n": 99_i64}, 0, 0)
        .await;
    assert!(is_fenced(&late), "{late:?}");
    let d = robot(&db, &id).await;
    assert_eq!(
        (d.get_i64("epoch").unwrap(), d.get_i64("gen").unwrap()),
        (1, old_gen),
        "not adopted yet"
    );
    // The adoption lands; from then on only the adopted state matches.
    let adopted = new.adopt(&[(id, new_gen)]).await.unwrap();
    assert_eq!(adopted.ours, vec![(id, new_gen)]);
    new.adopted(&id);
    new.checkpoint(&id, new_gen, "b", doc! {"n": 2_i64}, 0, 1)
        .await
        .unwrap();
    let late = old
        .checkpoint(&id, old_gen, "b", doc! {"n": 99_i64}, 0, 2)
        .await;
    assert!(is_fenced(&late), "{late:?}");
    assert!(!old
        .set_status(&id, old_gen, RobotStatus::Failed, Some("late"), None)
        .await
        .unwrap());
    let d = robot(&db, &id).await;
    assert_eq!(d.get_i64("seq").unwrap(), 2);
    assert_eq!(d.get_document("context").unwrap().get_i64("n").unwrap(), 2);
    assert_eq!(d.get_str("status").unwrap(), "running");
    assert_eq!(d.get_i64("epoch").unwrap(), 2);
    assert_eq!(d.get_i64("gen").unwrap(), new_gen);
}

/// The other order: the last holder's write in flight lands first (after the claim,
/// before the adoption write). The early instance, started from the context listed
/// before it, is then refused at its first checkpoint, as an instance started after
/// its adoption from that same listing would be: the landed step is kept, not
/// overwritten, and `seq` never goes back.
#[tokio::test]
async fn a_write_in_flight_that_lands_first_fences_the_early_instance() {
    let db = TestDb::new("early_loses").await;
    let (id, old_gen, old, new) = taken_over(&db).await;
    let new_gen = old_gen + 1;
    new.start_early(id, Some(old_gen), 1);
    old.checkpoint(&id, old_gen, "b", doc! {"n": 1_i64}, 0, 0)
        .await
        .unwrap();
    let first = new
        .checkpoint(&id, new_gen, "b", doc! {"n": 1_i64}, 0, 0)
        .await;
    assert!(is_fenced(&first), "{first:?}");
    let d = robot(&db, &id).await;
    assert_eq!(d.get_i64("seq").unwrap(), 1);
    assert_eq!(
        d.get_document("context").unwrap().get_i64("n").unwrap(),
        1,
        "the step that landed first is kept"
    );
}

/// An early start whose listed state is not the robot's (adopted again, or moved
/// and back, between the list and the first write) writes nothing; a robot never
/// written (`gen` missing) is matched as listed.
#[tokio::test]
async fn an_early_start_matches_only_the_state_it_listed() {
    let db = TestDb::new("early_state").await;
    let (id, old_gen) = one_adopted(&db).await;
    let new = holder_at(&db, "10.0.0.2:7700", 2);
    // Listed with a generation the robot does not have.
    new.start_early(id, Some(old_gen + 5), 1);
    let r = new
        .checkpoint(&id, old_gen + 6, "b", doc! {"n": 1_i64}, 0, 0)
        .await;
    assert!(is_fenced(&r), "{r:?}");
    // Listed under another epoch.
    new.start_early(id, Some(old_gen), 3);
    let r = new
        .checkpoint(&id, old_gen + 1, "b", doc! {"n": 1_i64}, 0, 0)
        .await;
    assert!(is_fenced(&r), "{r:?}");
    // A robot whose `gen` was never written, listed as such.
    db.store
        .robots()
        .update_one(doc! {"_id": id}, doc! {"$unset": {"gen": ""}})
        .await
        .unwrap();
    new.start_early(id, None, 1);
    new.checkpoint(&id, 1, "b", doc! {"n": 1_i64}, 0, 0)
        .await
        .unwrap();
    assert_eq!(robot(&db, &id).await.get_i64("seq").unwrap(), 1);
}

/// One adoption statement over the slot (the O(1) form) takes every unpaused robot
/// of the slot whose epoch is older than the holder's, and no other: not a paused
/// one, not one a newer holder adopted, not one this holder already runs, not one
/// of another slot. Each robot it takes gets a generation one up, as a chunk would
/// give it, and that generation's instance writes. A robot moved in after the
/// listing is taken too (the move's `rev` bump makes the next sync start it), and
/// the generations are then read back, not guessed. A hand-edited document the
/// validator refuses stops the statement part-way; the robots it did not reach are
/// adopted one by one, and only the broken one is left.
#[tokio::test]
async fn one_statement_over_the_slot_adopts_exactly_its_older_unpaused_robots() {
    let db = TestDb::new("adopt_slot").await;
    db.init(2).await;
    let coll = db.store.robots();
    for (name, count) in [("older", "6"), ("other", "2"), ("late", "1")] {
        db.cli_ok(&[
            "robot", "create", "--name", name, "--kind", "counter", "--count", count,
        ]);
    }
    coll.update_many(doc! {}, doc! {"$set": {"slot_id": "slot-002"}})
        .await
        .unwrap();
    coll.update_many(
        doc! {"name": {"$regex": "^older"}},
        doc! {"$set": {"slot_id": "slot-001"}},
    )
    .await
    .unwrap();
    let all = || async {
        let mut all = db.robots().await;
        all.sort_by_key(|d| d.get_object_id("_id").unwrap());
        all
    };
    let older = || async {
        let mut older: Vec<bson::Document> = db
            .robots()
            .await
            .into_iter()
            .filter(|d| d.get_str("name").is_ok_and(|n| n.starts_with("older")))
            .collect();
        older.sort_by_key(|d| d.get_str("name").unwrap().to_string());
        older
    };
    let gens = |docs: &[bson::Document]| -> Vec<(ObjectId, i64)> {
        docs.iter()
            .map(|d| (d.get_object_id("_id").unwrap(), gen_after_adoption(d)))
            .collect()
    };
    let listed = older().await;
    let ids: Vec<ObjectId> = gens(&listed).into_iter().map(|(id, _)| id).collect();
    // Adopted at epoch 1, then one paused, one taken by a newer holder (epoch 9),
    // one already this holder's (epoch 3).
    let (first, _guard, _metrics) = holder(&db);
    first.adopt(&gens(&listed)).await.unwrap();
    for (i, set) in [
        (3, doc! {"paused": true}),
        (4, doc! {"epoch": 9_i64}),
        (5, doc! {"epoch": 3_i64}),
    ] {
        coll.update_one(doc! {"_id": ids[i]}, doc! {"$set": set})
            .await
            .unwrap();
    }
    let before = all().await;
    let holder = holder_at(&db, "10.0.0.3:7700", 3);
    let wanted = gens(&older().await[..3]);
    let adopted = holder.adopt_slot(&wanted).await.unwrap();
    assert_eq!(adopted.ours, wanted, "the three older, unpaused robots");
    for (d, was) in all().await.iter().zip(&before) {
        let id = d.get_object_id("_id").unwrap();
        match wanted.iter().find(|(w, _)| *w == id) {
            Some((_, gen)) => {
                assert_eq!(d.get_i64("epoch").unwrap(), 3);
                assert_eq!(d.get_i64("gen").unwrap(), *gen);
                assert_eq!(d.get_str("worker").unwrap(), "10.0.0.3:7700");
                let wrote = holder
                    .checkpoint(&id, *gen, "older", doc! {"n": 1_i64}, 0, 0)
                    .await;
                assert!(wrote.is_ok(), "{wrote:?}");
            }
            None => assert_eq!(d, was, "left as it was"),
        }
    }

    // A robot moved in after the listing is taken too; the answer, read back, names
    // only the robots asked for, with the generations they have now.
    coll.update_many(
        doc! {"slot_id": "slot-001", "paused": false},
        doc! {"$set": {"epoch": 2_i64}},
    )
    .await
    .unwrap();
    let listed = older().await;
    let wanted: Vec<(ObjectId, i64)> = gens(&listed)
        .into_iter()
        .filter(|(id, _)| *id != ids[3])
        .collect();
    coll.update_one(
        doc! {"name": "late"},
        doc! {"$set": {"slot_id": "slot-001", "epoch": 0_i64}},
    )
    .await
    .unwrap();
    let mut adopted = holder_at(&db, "10.0.0.4:7700", 4)
        .adopt_slot(&wanted)
        .await
        .unwrap();
    adopted.ours.sort();
    let mut expected = wanted.clone();
    expected.sort();
    assert_eq!(adopted.ours, expected);
    let late = coll.find_one(doc! {"name": "late"}).await.unwrap().unwrap();
    assert_eq!(
        late.get_i64("epoch").unwrap(),
        4,
        "the late robot is taken too"
    );

    // A robot whose adoption the validator refuses (its `gen` at the schema's
    // maximum): every other robot is adopted, it is not.
    coll.update_one(
        doc! {"_id": ids[0]},
        doc! {"$set": {"gen": 9_007_199_254_740_991_i64}},
    )
    .await
    .unwrap();
    let broken = coll.find_one(doc! {"_id": ids[0]}).await.unwrap().unwrap();
    let holder = holder_at(&db, "10.0.0.5:7700", 5);
    let mut adopted = holder.adopt_slot(&wanted).await.unwrap();
    assert_eq!(adopted.refused.len(), 1, "{adopted:?}");
    assert_eq!(adopted.refused[0].id, ids[0]);
    adopted.ours.sort();
    for (id, gen) in &adopted.ours {
        let d = coll.find_one(doc! {"_id": id}).await.unwrap().unwrap();
        assert_eq!(d.get_i64("epoch").unwrap(), 5);
        assert_eq!(d.get_i64("gen").unwrap(), *gen);
    }
    let others: Vec<ObjectId> = wanted
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != ids[0])
        .collect();
    assert_eq!(
        adopted.ours.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        {
            let mut o = others;
            o.sort();
            o
        }
    );
    let after = coll.find_one(doc! {"_id": ids[0]}).await.unwrap().unwrap();
    assert_eq!(after, broken, "the refused robot is left as it was");
}

/// An adoption the database never answers is given up on after
/// [`IN_DOUBT_AFTER`], the lease open all along, in either form: a database error
/// that the slot's sync reports and retries, instead of holding that sync (and every
/// move, pause and delete of the slot's robots) for good. The dev server once left a
/// takeover's adoption chunk unanswered while it answered the holder's renewals.
#[tokio::test]
async fn an_adoption_never_answered_is_given_up_on_while_the_lease_holds() {
    let db = TestDb::new("adopt_unanswered").await;
    db.init(1).await;
    db.cli_ok(&[
        "robot", "create", "--name", "u", "--kind", "counter", "--count", "4",
    ]);
    let read = as_read(&db).await;
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let via = slotpool::db::store::Store::connect(&proxy.uri(&db.uri))
        .await
        .unwrap();
    // Connected before the link goes silent.
    via.robots().count_documents(doc! {}).await.unwrap();
    let guard = WriteGuard::new(
        Instant::now() + Duration::from_secs(3600),
        Arc::new(MonotonicClock),
    );
    let store = ContextStore::new(
        &via,
        "slot-001",
        1,
        "10.0.0.1:7700",
        Arc::new(Metrics::default()),
        guard.clone(),
        Arc::new(WritePacer::new(Duration::from_millis(400))),
    );
    proxy.set(common::proxy::Mode::Blackhole);
    let began = Instant::now();
    let (by_id, by_slot) = tokio::join!(store.adopt(&read[..2]), store.adopt_slot(&read));
    let took = began.elapsed();
    for r in [by_id.map(|_| ()), by_slot.map(|_| ())] {
        match r {
            Err(ContextError::Db(e)) => assert!(
                e.to_string().contains(&format!(
                    "no answer to an adoption write within {} s",
                    IN_DOUBT_AFTER.as_secs()
                )),
                "{e}"
            ),
            other => panic!("expected the adoption given up on: {other:?}"),
        }
    }
    assert!(guard.is_open(), "the lease held all along");
    assert!(
        took >= IN_DOUBT_AFTER && took < IN_DOUBT_AFTER * 3,
        "given up on after {took:?}"
    );
}

/// A robot paused, or marked failed, between the holder's listing and its adoption
/// write keeps its state: the adoption neither takes it (so nothing starts it) nor
/// clears its status and reason. Before, it was adopted as `running`, its error
/// wiped, and run for up to a tick.
#[tokio::test]
async fn a_robot_paused_or_failed_after_the_listing_is_not_adopted() {
    let db = TestDb::new("adopt_paused").await;
    db.init(1).await;
    db.cli_ok(&[
        "robot", "create", "--name", "p", "--kind", "counter", "--count", "3",
    ]);
    let listed = as_read(&db).await;
    let coll = db.store.robots();
    coll.update_one(
        doc! {"_id": listed[0].0},
        doc! {"$set": {"paused": true, "status": "paused"}},
    )
    .await
    .unwrap();
    coll.update_one(
        doc! {"_id": listed[1].0},
        doc! {"$set": {"paused": true, "status": "failed", "error": "crashed 5 times in 60s"}},
    )
    .await
    .unwrap();
    let (store, _guard, _metrics) = holder(&db);
    let adopted = store.adopt(&listed).await.unwrap();
    let ours: Vec<ObjectId> = adopted.ours.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ours,
        vec![listed[2].0],
        "only the unpaused robot: {adopted:?}"
    );
    let paused = robot(&db, &listed[0].0).await;
    assert_eq!(paused.get_str("status").ok(), Some("paused"), "{paused}");
    let failed = robot(&db, &listed[1].0).await;
    assert_eq!(failed.get_str("status").ok(), Some("failed"), "{failed}");
    assert_eq!(
        failed.get_str("error").ok(),
        Some("crashed 5 times in 60s"),
        "the reason stays: {failed}"
    );
    // Adopted under this holder before, then paused: a second adoption (after a
    // restart of the robot) does not take it either.
    let again = store.adopt(&as_read(&db).await).await.unwrap();
    assert!(
        again.ours.iter().all(|(id, _)| *id == listed[2].0),
        "{again:?}"
    );
}
