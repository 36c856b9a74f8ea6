//! The lease protocol against the real dev server, with the local clock under the
//! test's control (ManualClock): claim, renew, lost race, expiry at L, self-fence;
//! and the whole worker loop on that clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use common::{epoch, invariants, metric, owner, wait_for, TestDb};
use slotpool::clock::ManualClock;
use slotpool::metrics::Metrics;
use slotpool::{
    Identity, LeaseError, LeaseProtocol, LeaseTiming, Registry, Worker, WorkerSettings,
};

fn timing() -> LeaseTiming {
    LeaseTiming::from_tick(Duration::from_secs(1))
}

fn protocol(db: &TestDb, id: &str, clock: &ManualClock) -> LeaseProtocol {
    protocol_with(db, id, clock, timing())
}

fn protocol_with(db: &TestDb, id: &str, clock: &ManualClock, t: LeaseTiming) -> LeaseProtocol {
    let identity: Identity = id.parse().unwrap();
    LeaseProtocol::new(&db.store, identity, t, Arc::new(clock.clone()))
}

/// Puts a slot's `time` at `offset_ms` relative to the server's clock now.
/// Sets the slot's `time` to the server's clock plus `offset_ms`, and returns the
/// time written (ms).
async fn set_time_relative(db: &TestDb, slot: &str, offset_ms: i64) -> i64 {
    let now = db.store.server_now().await.unwrap();
    let t = bson::DateTime::from_millis(now.timestamp_millis() + offset_ms);
    db.store
        .slots()
        .update_one(doc! {"_id": slot}, doc! {"$set": {"time": t}})
        .await
        .unwrap();
    t.timestamp_millis()
}

#[tokio::test]
async fn claim_then_renew_on_the_server_clock() {
    let db = TestDb::new("claim").await;
    db.init(1).await;
    let clock = ManualClock::new();
    let p = protocol(&db, "10.0.0.1:7700", &clock);

    let survey = p.survey(None).await.unwrap();
    assert_eq!(survey.expired.len(), 1, "a new slot is free");
    let outcome = p.claim(&survey).await.unwrap();
    let mut lease = outcome.lease.expect("claimed");
    assert_eq!((lease.slot_id.as_str(), lease.epoch), ("slot-001", 1));
    let slot = db.slot("slot-001").await;
    assert_eq!(owner(&slot).as_deref(), Some("10.0.0.1:7700"));
    assert_eq!(epoch(&slot), 1);
    let claimed_at = slot.get_datetime("time").unwrap().timestamp_millis();

    clock.advance(Duration::from_millis(500));
    let deadline_before = lease.deadline();
    let renewed = p.renew(&mut lease).await.unwrap();
    assert_eq!(renewed.rev, 0);
    assert!(!renewed.draining);
    assert!(
        lease.deadline() > deadline_before,
        "a renewal extends the local deadline"
    );
    let renewed_at = db
        .slot("slot-001")
        .await
        .get_datetime("time")
        .unwrap()
        .timestamp_millis();
    assert!(renewed_at >= claimed_at, "time only moves forward");
    assert_eq!(
        epoch(&db.slot("slot-001").await),
        1,
        "renewal keeps the epoch"
    );

    // A held slot is not offered to anyone else; its expiry is reported instead.
    let other = protocol(&db, "10.0.0.2:7700", &clock);
    let survey = other.survey(None).await.unwrap();
    assert!(survey.expired.is_empty());
    let wait = survey
        .next_expiry
        .expect("the held lease expires at some point");
    assert!(wait <= Duration::from_millis(2001), "{wait:?}");
}

#[tokio::test]
async fn lost_race_falls_through_to_the_next_candidate_then_stands_by() {
    let db = TestDb::new("race").await;
    db.init(2).await;
    let clock = ManualClock::new();
    let a = protocol(&db, "10.0.0.1:7700", &clock);
    let b = protocol(&db, "10.0.0.2:7700", &clock);
    let c = protocol(&db, "10.0.0.3:7700", &clock);
    // All three look at the same picture, then race.
    let (sa, sb, sc) = (
        a.survey(None).await.unwrap(),
        b.survey(None).await.unwrap(),
        c.survey(None).await.unwrap(),
    );
    let la = a.claim(&sa).await.unwrap();
    let lb = b.claim(&sb).await.unwrap();
    let lc = c.claim(&sc).await.unwrap();
    let won: Vec<_> = [&la, &lb, &lc]
        .iter()
        .filter_map(|o| o.lease.as_ref())
        .map(|l| l.slot_id.clone())
        .collect();
    assert_eq!(won.len(), 2, "two slots, two winners");
    assert_ne!(won[0], won[1], "no slot claimed twice");
    assert!(lc.lease.is_none(), "the last one finds both taken");
    assert_eq!(lc.attempts, 2, "it tried every candidate once");
    assert_eq!(lc.conflicts, 2);
    // Each slot's epoch went up exactly once.
    for s in db.slots().await {
        assert_eq!(epoch(&s), 1);
    }
}

#[tokio::test]
async fn expiry_is_judged_at_exactly_l_on_the_server() {
    let db = TestDb::new("expiry").await;
    db.init(1).await;
    let clock = ManualClock::new();
    let holder = protocol(&db, "10.0.0.1:7700", &clock);
    let s = holder.survey(None).await.unwrap();
    holder.claim(&s).await.unwrap().lease.unwrap();
    let standby = protocol(&db, "10.0.0.2:7700", &clock);
    let l = timing().lease_ms();

    // Renewed just now: still held, and it expires L after that renewal, by the
    // server's clock as the survey read it (whatever the round trips took).
    let renewed = set_time_relative(&db, "slot-001", 0).await;
    let survey = standby.survey(None).await.unwrap();
    assert!(survey.expired.is_empty(), "younger than L is held");
    let wait = survey.next_expiry.unwrap();
    let at = survey
        .server_ms
        .expect("the survey read the server's clock");
    assert_eq!(
        wait,
        Duration::from_millis((renewed + l - at + 1) as u64),
        "expires L after the renewal (survey at {at}, renewed {renewed})"
    );

    // Renewed L + 1 ms before our read of the server clock: the server's now at the
    // survey can only be later, so the age is over L: expired.
    set_time_relative(&db, "slot-001", -(l + 1)).await;
    let survey = standby.survey(None).await.unwrap();
    assert_eq!(survey.expired.len(), 1, "older than L is expired");
    let lease = standby
        .claim(&survey)
        .await
        .unwrap()
        .lease
        .expect("the standby takes it");
    assert_eq!(lease.epoch, 2, "a takeover bumps the epoch");
}

#[tokio::test]
async fn self_fence_when_renewals_cannot_happen_and_no_renew_after_the_deadline() {
    let db = TestDb::new("fence").await;
    db.init(1).await;
    let clock = ManualClock::new();
    let p = protocol(&db, "10.0.0.1:7700", &clock);
    let s = p.survey(None).await.unwrap();
    let mut lease = p.claim(&s).await.unwrap().lease.unwrap();
    let time_before = db
        .slot("slot-001")
        .await
        .get_datetime("time")
        .unwrap()
        .timestamp_millis();

    // The local deadline is L - margin after the claim was sent.
    let t = timing();
    clock.advance(t.lease() - t.margin);
    let err = p.renew(&mut lease).await.unwrap_err();
    assert!(matches!(err, LeaseError::SelfFenced { .. }), "{err}");
    assert!(lease.is_fenced());
    // Nothing was written: the database still shows the claim's time.
    let time_after = db
        .slot("slot-001")
        .await
        .get_datetime("time")
        .unwrap()
        .timestamp_millis();
    assert_eq!(time_before, time_after, "a fenced lease never renews");
    // Even if the clock could go back, the fenced lease stays dead.
    let again = p.renew(&mut lease).await.unwrap_err();
    assert!(matches!(again, LeaseError::SelfFenced { .. }));

    // Coming back takes a fresh claim, which needs the slot to expire: new epoch.
    set_time_relative(&db, "slot-001", -(t.lease_ms() + 1)).await;
    let s = p.survey(None).await.unwrap();
    let fresh = p.claim(&s).await.unwrap().lease.expect("a fresh claim");
    assert_eq!(fresh.epoch, lease.epoch + 1);
}

#[tokio::test]
async fn renew_after_takeover_is_lost_and_release_only_releases_our_own() {
    let db = TestDb::new("lost").await;
    db.init(1).await;
    let clock = ManualClock::new();
    let a = protocol(&db, "10.0.0.1:7700", &clock);
    let b = protocol(&db, "10.0.0.2:7700", &clock);
    let mut la = a
        .claim(&a.survey(None).await.unwrap())
        .await
        .unwrap()
        .lease
        .unwrap();
    set_time_relative(&db, "slot-001", -(timing().lease_ms() + 1)).await;
    let mut lb = b
        .claim(&b.survey(None).await.unwrap())
        .await
        .unwrap()
        .lease
        .unwrap();
    assert_eq!(lb.epoch, 2);

    let err = a.renew(&mut la).await.unwrap_err();
    assert!(matches!(err, LeaseError::Lost { .. }), "{err}");
    assert!(
        !a.release(&mut la).await.unwrap(),
        "the old holder cannot release it"
    );
    assert_eq!(
        owner(&db.slot("slot-001").await).as_deref(),
        Some("10.0.0.2:7700")
    );

    assert!(b.release(&mut lb).await.unwrap());
    let slot = db.slot("slot-001").await;
    assert_eq!(slot.get("owner"), Some(&Bson::Null));
    assert_eq!(slot.get("time"), Some(&Bson::Null));
    // A released slot is immediately claimable.
    assert_eq!(a.survey(None).await.unwrap().expired.len(), 1);
}

#[tokio::test]
async fn broken_slot_documents_are_reported_and_skipped() {
    let db = TestDb::new("broken").await;
    db.init(3).await;
    let bad = [
        ("slot-001", doc! {"$set": {"epoch": "seven"}}),
        ("slot-002", doc! {"$set": {"time": "yesterday"}}),
    ];
    for (id, update) in bad {
        db.store
            .slots()
            .update_one(doc! {"_id": id}, update)
            .bypass_document_validation(true)
            .await
            .unwrap();
    }
    let clock = ManualClock::new();
    let p = protocol(&db, "10.0.0.1:7700", &clock);
    let survey = p.survey(None).await.unwrap();
    let ids: Vec<_> = survey.invalid.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["slot-001", "slot-002"]);
    assert!(survey.invalid[0].why.contains("epoch"));
    assert!(survey.invalid[1].why.contains("time"));
    let lease = p.claim(&survey).await.unwrap().lease.unwrap();
    assert_eq!(lease.slot_id, "slot-003");
}

#[tokio::test]
async fn validators_reject_bad_documents() {
    let db = TestDb::new("schema").await;
    db.init(1).await;
    let err = db
        .store
        .slots()
        .insert_one(doc! {"_id": "slot-x", "epoch": "nope"})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("121") || err.to_string().to_lowercase().contains("validation"),
        "{err}"
    );
}

#[tokio::test]
async fn a_claim_the_server_refuses_skips_that_slot_and_takes_the_next() {
    let db = TestDb::new("refused").await;
    db.init(2).await;
    // Valid as it stands, but its claim would raise the epoch past the validator's
    // maximum: the server refuses that one update (121), not the database.
    db.store
        .slots()
        .update_one(
            doc! {"_id": "slot-001"},
            doc! {"$set": {"epoch": slotpool::db::lease::MAX_EPOCH}},
        )
        .await
        .unwrap();
    let clock = ManualClock::new();
    // Without the hash start, slot-001 is tried first.
    let p = protocol(&db, "10.0.0.1:7700", &clock).without_hashing();
    let survey = p.survey(None).await.unwrap();
    assert_eq!(survey.expired.len(), 2);
    let outcome = p.claim_among(&survey.expired).await.unwrap();
    assert_eq!(outcome.lease.unwrap().slot_id, "slot-002");
    assert_eq!(outcome.refused.len(), 1, "{:?}", outcome.refused);
    assert_eq!(outcome.refused[0].id, "slot-001");
    assert!(outcome.refused[0].why.contains("refused"));
}

/// The survey with a bound reads only what expires before it (plus slots with no
/// `expires_ms`: free, never held, or renewed by an older version), and still judges
/// each on the server's clock.
#[tokio::test]
async fn a_bounded_survey_reads_only_the_expired_and_judges_on_the_server() {
    let db = TestDb::new("bounded").await;
    db.init(4).await;
    let clock = ManualClock::new();
    // Leases of two minutes: the holder on a manual clock never renews, and its
    // leases must not lapse on the server while the test reads them, however slow
    // the machine.
    let t = LeaseTiming::from_tick(Duration::from_secs(60));
    let holder = protocol_with(&db, "10.0.0.1:7700", &clock, t);
    // The holder claims three of the four: claims write `expires_ms`.
    for _ in 0..3 {
        let s = holder.survey(None).await.unwrap();
        holder.claim(&s).await.unwrap().lease.unwrap();
    }
    let held = db.slots().await;
    let claimed: Vec<&bson::Document> = held.iter().filter(|s| owner(s).is_some()).collect();
    assert_eq!(claimed.len(), 3);
    for s in &claimed {
        let time = s.get_datetime("time").unwrap().timestamp_millis();
        assert_eq!(
            s.get_i64("expires_ms").unwrap(),
            time + t.lease_ms(),
            "expires_ms = time + L"
        );
    }
    let now = db.store.server_now().await.unwrap().timestamp_millis();
    let standby = protocol_with(&db, "10.0.0.2:7700", &clock, t);
    // Bound at now: the three held leases are not even read; the free slot is.
    let s = standby.survey(Some(now)).await.unwrap();
    assert_eq!(s.read, 1, "only the free slot is read");
    assert_eq!(s.expired.len(), 1);
    assert!(s.next_expiry.is_none(), "no held lease within the bound");
    // Bound a lease ahead: the held ones are read too and tell when they expire,
    // but none is offered.
    let s = standby
        .survey(Some(now + t.lease_ms() + 1000))
        .await
        .unwrap();
    assert_eq!((s.read, s.expired.len()), (4, 1));
    assert!(s.next_expiry.unwrap() <= Duration::from_millis(t.lease_ms() as u64 + 1));

    // A lapsed lease (its expires_ms in the past) is read and offered.
    let lapsed = claimed[0].get_str("_id").unwrap();
    let past = now - t.lease_ms() - 5000;
    db.store
        .slots()
        .update_one(
            doc! {"_id": lapsed},
            doc! {"$set": {"time": bson::DateTime::from_millis(past), "expires_ms": past + t.lease_ms()}},
        )
        .await
        .unwrap();
    let s = standby.survey(Some(now)).await.unwrap();
    let ids: Vec<&str> = s.expired.iter().map(|c| c.id.as_str()).collect();
    assert!(ids.contains(&lapsed), "{ids:?}");

    // A slot from an older version (a fresh `time`, no `expires_ms`) is outside the
    // index range until marked "unknown" (0); then it is read, and judged live by its
    // time: a rolling upgrade never steals a live slot.
    let legacy = claimed[1].get_str("_id").unwrap();
    db.store
        .slots()
        .update_one(
            doc! {"_id": legacy},
            vec![
                doc! {"$set": {"time": "$$NOW"}},
                doc! {"$unset": "expires_ms"},
            ],
        )
        .await
        .unwrap();
    let s = standby.survey(Some(now)).await.unwrap();
    assert_eq!(s.read, 2, "the free and the lapsed slot");
    assert_eq!(standby.mark_unknown().await.unwrap(), 1);
    let s = standby.survey(Some(now)).await.unwrap();
    assert_eq!(s.read, 3, "the marked slot too");
    assert!(
        s.expired.iter().all(|c| c.id != legacy),
        "a live legacy slot is not offered"
    );
    assert!(s.next_expiry.is_some(), "its expiry is known from its time");

    // A bound later than the server's now (a fast estimate) costs reads, not
    // correctness: live leases are still judged live.
    let s = standby
        .survey(Some(now + t.lease_ms() + 60_000))
        .await
        .unwrap();
    assert_eq!(s.read, 4);
    let offered: Vec<&str> = s.expired.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        offered.len(),
        2,
        "the free and the lapsed slot only: {offered:?}"
    );

    // A release clears expires_ms, so the slot is read again at once.
    let mut lease = {
        let s = standby.survey(Some(now)).await.unwrap();
        standby.claim(&s).await.unwrap().lease.unwrap()
    };
    assert!(standby.release(&mut lease).await.unwrap());
    let released = db.slot(&lease.slot_id).await;
    assert_eq!(released.get("expires_ms"), Some(&Bson::Int64(0)));
}

/// A renewal is one update while nothing changed, and still learns of a robot
/// change (`rev`) and a drain request, and of losing the slot.
#[tokio::test]
async fn renewal_notices_rev_changes_and_drains_and_loss() {
    let db = TestDb::new("renew_paths").await;
    db.init(1).await;
    let clock = ManualClock::new();
    let p = protocol(&db, "10.0.0.1:7700", &clock);
    let s = p.survey(None).await.unwrap();
    let mut lease = p.claim(&s).await.unwrap().lease.unwrap();
    let expires = |d: &bson::Document| d.get_i64("expires_ms").unwrap();
    let before = expires(&db.slot("slot-001").await);
    let r = p.renew(&mut lease).await.unwrap();
    assert_eq!((r.rev, r.draining), (0, false));
    assert!(
        expires(&db.slot("slot-001").await) >= before,
        "the renewal moved expires_ms"
    );
    let bump = |update: bson::Document| {
        let slots = db.store.slots();
        async move {
            slots
                .update_one(doc! {"_id": "slot-001"}, update)
                .await
                .unwrap()
        }
    };
    bump(doc! {"$inc": {"rev": 1_i64}}).await;
    let r = p.renew(&mut lease).await.unwrap();
    assert_eq!((r.rev, r.draining), (1, false), "a robot change is seen");
    assert_eq!(lease.rev, 1);
    let r = p.renew(&mut lease).await.unwrap();
    assert_eq!(r.rev, 1, "and stays seen");
    bump(doc! {"$set": {"draining": true}}).await;
    let r = p.renew(&mut lease).await.unwrap();
    assert!(r.draining, "a drain request is seen");
    bump(doc! {"$set": {"owner": "10.0.0.9:7700"}}).await;
    assert!(matches!(
        p.renew(&mut lease).await,
        Err(LeaseError::Lost { .. })
    ));
}

/// Advances `clock` one tick and waits for the worker's next renewal, the `n`th.
async fn renew_once_more(clock: &ManualClock, metrics: &Metrics, n: u64) {
    clock.advance(timing().tick);
    wait_for(Duration::from_secs(10), &format!("renewal {n}"), || async {
        (renewals(metrics) >= n).then_some(())
    })
    .await;
    assert_eq!(renewals(metrics), n, "one renewal per tick advanced");
}

fn renewals(metrics: &Metrics) -> u64 {
    metric(&metrics.render(), "slotpool_renew_latency_seconds_count")
}

/// The whole worker loop (claim, renewals, robots, self-fence, a fresh claim) on a
/// manual clock, against the real server. Renewals follow the clock, not the wall:
/// exactly one per tick advanced. A jump past the fence deadline, as a paused process
/// sees on waking, stops the robots before any further write, and the worker comes
/// back only through a fresh claim under a new epoch.
#[tokio::test]
async fn the_worker_loop_keeps_time_by_its_clock() {
    let db = TestDb::new("worker_clock").await;
    db.init(1).await;
    assert!(db.counters("tick", 2, 100).status.success());
    let started = std::time::Instant::now();
    let clock = ManualClock::new();
    let me = "10.0.0.9:7709";
    let settings = WorkerSettings {
        identity: me.parse().unwrap(),
        listen: "127.0.0.1:0".parse().unwrap(),
        // Stopped at the deadline, as with `--suspend-for 0`: a suspended holder
        // would renew late and resume in place (tests/outage.rs).
        timing: LeaseTiming {
            suspend_for: Duration::ZERO,
            ..timing()
        },
        hashing: true,
        release_poll: None,
        max_slots: None,
        overflow_after: timing().lease(),
        watchers: 2,
        load: Default::default(),
    };
    let worker = Worker::with_clock(
        settings,
        db.store.clone(),
        Registry::builtin(),
        Arc::new(clock.clone()),
    );
    let metrics = worker.metrics();
    let shutdown = worker.shutdown_token();
    let running = tokio::spawn(worker.run());

    // A new worker takes a slot vacant since before it began only once its first
    // lease is out on its clock (`standby_line::may_claim`): nothing is claimed
    // until the clock says so.
    let surveyed =
        || async { (metric(&metrics.render(), "slotpool_surveys_total") >= 1).then_some(()) };
    wait_for(Duration::from_secs(20), "the first survey", surveyed).await;
    assert_eq!(owner(&db.slot("slot-001").await), None, "held back");
    clock.advance(timing().lease());
    wait_for(Duration::from_secs(20), "the claim", || async {
        let slot = db.slot("slot-001").await;
        (owner(&slot).as_deref() == Some(me)).then_some(())
    })
    .await;
    // Real time runs past the first renewal's due time (one tick after the claim) but
    // not past the lease on the server (two ticks): a worker on the wall clock would
    // have renewed by now. Waiting out real time is what this checks, not a stand-in.
    tokio::time::sleep_until((started + timing().tick * 3 / 2).into()).await;
    assert_eq!(renewals(&metrics), 0, "no tick has passed on its clock");
    assert_eq!(metric(&metrics.render(), "slotpool_self_fences_total"), 0);
    // Renewals keep the lease (on the server too) while the robots start on real time.
    let mut n = 0;
    loop {
        n += 1;
        renew_once_more(&clock, &metrics, n).await;
        let robots = db.robots().await;
        if robots.iter().all(|r| r.get_i64("seq").unwrap_or(0) >= 2) {
            break;
        }
        assert!(n < 200, "the robots never checkpointed: {robots:?}");
    }

    // A jump past the deadline, as a process paused for a whole lease sees on waking.
    clock.advance(timing().lease());
    wait_for(Duration::from_secs(20), "the self-fence", || async {
        let fenced = db
            .store
            .events()
            .count_documents(doc! {"kind": "self_fence", "epoch": 1})
            .await
            .unwrap();
        (fenced == 1).then_some(())
    })
    .await;
    assert_eq!(
        metric(&metrics.render(), "slotpool_self_fences_total"),
        1,
        "the renewal refused itself: no renewal went out past the deadline"
    );
    assert_eq!(renewals(&metrics), n, "no renewal after the deadline");
    // Stopped before any further write: the robots' last steps, now.
    let fenced_at: Vec<(String, i64)> = db.seqs().await;

    // Back only through a fresh claim, once the server sees the lease expired. The
    // worker looks each time its clock moves.
    wait_for(Duration::from_secs(30), "the fresh claim", || async {
        let slot = db.slot("slot-001").await;
        if owner(&slot).as_deref() == Some(me) && epoch(&slot) == 2 {
            return Some(());
        }
        clock.advance(Duration::from_millis(100));
        None
    })
    .await;
    for (name, seq) in &fenced_at {
        wait_for(
            Duration::from_secs(30),
            &format!("{name} again"),
            || async { (db.robot(name).await.get_i64("seq").unwrap() > *seq).then_some(()) },
        )
        .await;
        let robot = db.robot(name).await;
        for e in invariants::entries(&robot) {
            assert_eq!(
                e.epoch,
                if e.seq <= *seq { 1 } else { 2 },
                "{name}: step {} written under the wrong lease: {e:?}",
                e.seq
            );
        }
    }
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 2);

    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(
        owner(&db.slot("slot-001").await),
        None,
        "released on shutdown"
    );
}
