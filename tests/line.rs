//! Standbys in line: only the front of the line watches every tick, takeover still
//! lands at expiry, several expiries are claimed in parallel, and the next in line
//! moves up; on real worker processes and the real dev server, with the invariant
//! checker over each whole run.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use bson::doc;
use common::{owner, TestDb, WorkerProc};

/// The workers whose /metrics say they stand at the front of the line and have
/// surveyed since they started (a worker reads its place before its first survey:
/// a release before that survey would be found by the survey, not by what a test
/// watches).
fn front(workers: &[&WorkerProc]) -> BTreeSet<String> {
    workers
        .iter()
        .filter(|w| {
            w.metric("slotpool_line_front") == Some(1)
                && w.metric("slotpool_surveys_total").unwrap_or(0) >= 1
        })
        .map(|w| w.id.clone())
        .collect()
}

/// The `n` smallest ids: the front of a line of standbys.
fn first(workers: &[&WorkerProc], n: usize) -> BTreeSet<String> {
    let ids: BTreeSet<String> = workers.iter().map(|w| w.id.clone()).collect();
    ids.into_iter().take(n).collect()
}

/// A worker behind the front re-reads its place every beat (5 ticks), one at the
/// front every 6 beats (see `standby_line::place_due`): a deadline of a minute.
async fn wait_front(workers: &[&WorkerProc], want: &BTreeSet<String>, what: &str) {
    common::wait_for(Duration::from_secs(60), what, || async {
        (front(workers) == *want).then_some(())
    })
    .await
}

/// A new standby, once it stands at the front of the line.
async fn standby_at_front(db: &TestDb) -> WorkerProc {
    let standby = db.worker(&[]);
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    standby
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
    db.create_counters(4);
    common::wait_for(Duration::from_secs(30), "two holders", || async {
        let h = db.held_per_worker().await;
        (h.len() == 2 && h.values().all(|n| *n == 1)).then_some(())
    })
    .await;
    let standbys: Vec<WorkerProc> = (0..5).map(|_| db.worker(&[])).collect();
    let all: Vec<&WorkerProc> = standbys.iter().collect();
    let watchers = first(&all, 3);
    // Holders stand behind three standbys: once each has re-read its place (a holder
    // at the front every 6 beats), the front is exactly the three first standbys.
    let everyone: Vec<&WorkerProc> = standbys.iter().chain(holders.iter()).collect();
    wait_front(
        &everyone,
        &watchers,
        "the three first standbys at the front, the holders behind",
    )
    .await;

    // The front surveys at least once a lease (2 ticks: it reads every lease and
    // wakes at the earliest expiry); the rest not at all (a safety survey comes at a
    // random point of the second half of 5 minutes).
    let counts = surveys_over(&all, Duration::from_secs(20)).await;
    println!("surveys in 20 s: {counts:?}");
    for (id, n) in &counts {
        if watchers.contains(id) {
            assert!(*n >= 9, "{id} at the front surveyed {n} times in 20 s");
        } else {
            assert_eq!(*n, 0, "{id} behind surveyed {n} times in 20 s");
        }
    }

    // Both holders die at once: the standbys claim the two slots in parallel.
    let old: BTreeSet<String> = holders.iter().map(|w| w.id.clone()).collect();
    for h in &mut holders {
        h.kill9();
    }
    let new = common::wait_for(Duration::from_secs(15), "both slots taken over", || async {
        let owners: BTreeSet<String> = db.slots().await.iter().filter_map(owner).collect();
        (owners.len() == 2 && owners.is_disjoint(&old)).then_some(owners)
    })
    .await;
    // By watchers, or by the standbys the first claimer poked for the second slot.
    let ids: BTreeSet<String> = standbys.iter().map(|w| w.id.clone()).collect();
    assert!(
        new.is_subset(&ids),
        "claimed by standbys: {new:?} of {ids:?}"
    );

    // The three left are now the whole line of standbys: the rear one moves up.
    let left: Vec<&WorkerProc> = standbys.iter().filter(|w| !new.contains(&w.id)).collect();
    let everyone: BTreeSet<String> = left.iter().map(|w| w.id.clone()).collect();
    wait_front(&left, &everyone, "the one behind to move up").await;

    common::runs_on_once(&db, 4).await;
}

/// More slots expire at once than there are watchers: the watcher takes one at
/// once and pokes the standbys behind it for the rest, which they take long before
/// their own next look (a place read every 40 s, a safety survey every few
/// minutes); nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn more_expiries_at_once_than_watchers_are_all_taken() {
    let db = TestDb::new("line_many").await;
    db.init(3).await;
    let mut holders: Vec<WorkerProc> = (0..3).map(|_| db.worker(&["--watchers", "1"])).collect();
    db.create_counters(6);
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
    // L for the first, and a poke's round trip for the others.
    let ids: BTreeSet<String> = standbys.iter().map(|w| w.id.clone()).collect();
    common::wait_for(Duration::from_secs(15), "one slot per standby", || async {
        let owners: Vec<String> = db.slots().await.iter().filter_map(owner).collect();
        let distinct: BTreeSet<String> = owners.iter().cloned().collect();
        (owners.len() == 3 && distinct == ids && distinct.is_disjoint(&old)).then_some(())
    })
    .await;
    let watcher = first(&all, 1);
    for w in standbys.iter().filter(|w| !watcher.contains(&w.id)) {
        let poked = w.metric("slotpool_pokes_received_total").unwrap_or(0);
        assert!(poked >= 1, "{} claimed without a poke", w.id);
    }
    common::runs_on_once(&db, 6).await;
}

/// A holder and one standby at a 20 s tick: the standby's next survey is up to 20 s
/// away. `standby` advertises an address of its own, or (`unreachable`) one where
/// nothing listens, as behind a firewall that drops pokes.
async fn holder_and_standby(
    db: &TestDb,
    standby_args: &[&str],
    unreachable: bool,
) -> (WorkerProc, WorkerProc) {
    let slow = ["--tick", "20s"];
    let holder = db.worker(&slow);
    common::wait_for(Duration::from_secs(30), "the holder", || async {
        (owner(&db.slot("slot-001").await)? == holder.id).then_some(())
    })
    .await;
    db.create_counters(2);
    let mut args = slow.to_vec();
    args.extend_from_slice(standby_args);
    let standby = if unreachable {
        let nowhere = format!("127.0.0.1:{}", common::free_port());
        WorkerProc::start_as(&db.uri, &db.dir, &nowhere, &args)
    } else {
        db.worker(&args)
    };
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    // Its first survey follows its first read of its place; the next is a 20 s
    // tick away, so a release from now on is found by what each test means to show
    // (a poke or the release poll), not by a survey.
    common::wait_for(
        Duration::from_secs(30),
        "the standby's first survey",
        || async { (standby.metric("slotpool_surveys_total")? >= 1).then_some(()) },
    )
    .await;
    (holder, standby)
}

async fn claimed_by(db: &TestDb, standby: &WorkerProc, within: Duration) {
    common::wait_for(within, "the standby to claim the released slot", || async {
        (owner(&db.slot("slot-001").await)? == standby.id).then_some(())
    })
    .await;
}

/// A graceful release is claimed through a poke, long before the standby's next
/// survey: with a 20 s tick the survey is up to 20 s away, and the standby's poke
/// counter shows the poke, not a lucky survey, woke it. No release poll runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_released_slot_is_claimed_through_a_poke() {
    let db = TestDb::new("line_poke").await;
    db.init(1).await;
    let (holder, standby) = holder_and_standby(&db, &[], false).await;
    holder.signal(libc::SIGTERM);
    claimed_by(&db, &standby, Duration::from_secs(10)).await;
    let count = |name| standby.metric(name).unwrap_or(0);
    assert!(
        count("slotpool_pokes_received_total") >= 1,
        "claimed without a poke"
    );
    assert_eq!(
        count("slotpool_release_poll_hits_total"),
        0,
        "no release poll"
    );
    common::runs_on_once(&db, 2).await;
}

/// A poke that cannot reach the standby (its advertised port answers nothing)
/// costs latency only: with the release poll on, the poll finds the slot; the
/// holder says the poke was lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_poke_leaves_the_slot_to_the_release_poll() {
    let db = TestDb::new("line_release").await;
    db.init(1).await;
    let (holder, standby) = holder_and_standby(&db, &["--release-poll", "100ms"], true).await;
    holder.signal(libc::SIGTERM);
    claimed_by(&db, &standby, Duration::from_secs(10)).await;
    let hits = standby
        .metric("slotpool_release_poll_hits_total")
        .unwrap_or(0);
    assert!(hits >= 1, "claimed without a release-poll hit");
    assert_eq!(standby.metric("slotpool_pokes_received_total"), Some(0));
    holder
        .wait_log("poke not delivered", Duration::from_secs(10))
        .await;
    common::runs_on_once(&db, 2).await;
}

/// With neither a poke nor a poll (the standby unreachable, at a 1 s tick), the
/// released slot is still claimed: at the standby's next survey.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_poke_the_next_survey_claims_the_released_slot() {
    let db = TestDb::new("line_lost_poke").await;
    db.init(1).await;
    let holder = db.worker(&[]);
    common::wait_for(Duration::from_secs(30), "the holder", || async {
        (owner(&db.slot("slot-001").await)? == holder.id).then_some(())
    })
    .await;
    db.create_counters(2);
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    let standby = WorkerProc::start_as(&db.uri, &db.dir, &nowhere, &[]);
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    holder.signal(libc::SIGTERM);
    claimed_by(&db, &standby, Duration::from_secs(30)).await;
    holder
        .wait_log("poke not delivered", Duration::from_secs(10))
        .await;
    assert_eq!(standby.metric("slotpool_pokes_received_total"), Some(0));
    common::runs_on_once(&db, 2).await;
}

/// The first standby in line is stopped (SIGSTOP: its heartbeat is still believed,
/// its port accepts connections and never answers). The releasing holder pokes the
/// first standbys in line at once, so the second one claims the slot, long before its
/// next survey at a 20 s tick; the stopped one's poke times out without holding up
/// the holder's exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_poke_to_a_stopped_standby_does_not_hold_the_slot_back() {
    let db = TestDb::new("line_stopped").await;
    db.init(1).await;
    let (holder, a) = holder_and_standby(&db, &[], false).await;
    let b = db.worker(&["--tick", "20s"]);
    common::wait_for(Duration::from_secs(60), "two standbys in line", || async {
        (a.metric("slotpool_line_front") == Some(1) && b.metric("slotpool_line_front") == Some(1))
            .then_some(())
    })
    .await;
    // Stop the first in line (the smaller id) and release the slot.
    let (first_in_line, second) = if a.id < b.id { (&a, &b) } else { (&b, &a) };
    first_in_line.signal(libc::SIGSTOP);
    let t0 = std::time::Instant::now();
    holder.signal(libc::SIGTERM);
    claimed_by(&db, second, Duration::from_secs(10)).await;
    println!(
        "claimed by the second standby {:?} after SIGTERM",
        t0.elapsed()
    );
    assert!(second.metric("slotpool_pokes_received_total").unwrap_or(0) >= 1);
    holder
        .wait_log(
            "poke not delivered (no answer within 300 ms)",
            Duration::from_secs(10),
        )
        .await;
    first_in_line.signal(libc::SIGCONT);
    common::runs_on_once(&db, 2).await;
}

/// Two holders released a moment apart, at a 20 s tick, with two standbys watching:
/// the first release pokes both, and the second poke reached the standby left within
/// the same tick. Its gate took one poke a tick and dropped that one, so the second
/// slot waited for the next survey (4.7 s at a 3 s tick). A poke that reports a
/// vacancy leads to a survey within 100 ms, whatever the tick.
#[tokio::test(flavor = "multi_thread")]
async fn two_releases_within_a_tick_are_both_claimed_through_pokes() {
    let db = TestDb::new("line_two").await;
    db.init(2).await;
    let slow = ["--tick", "20s"];
    let (a, b) = db.one_slot_each(|_| db.worker(&slow)).await;
    let standbys = [db.worker(&slow), db.worker(&slow)];
    let both = [&standbys[0], &standbys[1]];
    wait_front(&both, &first(&both, 2), "both standbys at the front").await;
    let held_by_standbys = || async {
        let ids: BTreeSet<String> = standbys.iter().map(|w| w.id.clone()).collect();
        db.slots()
            .await
            .iter()
            .filter(|s| owner(s).is_some_and(|o| ids.contains(&o)))
            .count()
    };
    a.signal(libc::SIGTERM);
    common::wait_for(
        Duration::from_secs(10),
        "the first release claimed",
        || async { (held_by_standbys().await == 1).then_some(()) },
    )
    .await;
    let t0 = std::time::Instant::now();
    b.signal(libc::SIGTERM);
    common::wait_for(
        Duration::from_secs(10),
        "the second release claimed too, long before the next survey (20 s)",
        || async { (held_by_standbys().await == 2).then_some(()) },
    )
    .await;
    println!(
        "second slot claimed {:?} after its holder's SIGTERM",
        t0.elapsed()
    );
    let taken: u64 = standbys
        .iter()
        .map(|w| w.metric("slotpool_pokes_received_total").unwrap_or(0))
        .sum();
    assert!(
        taken >= 3,
        "three pokes taken (two for the first release, one for the second): {taken}"
    );
}

/// A hostile client floods a standby with pokes: it surveys at most once per 100 ms
/// more than it would anyway, and its slot's holder never notices.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_pokes_costs_at_most_one_survey_per_spacing() {
    use std::io::{Read, Write};
    let db = TestDb::new("line_flood").await;
    db.init(1).await;
    let holder = db.worker(&[]);
    common::wait_for(Duration::from_secs(30), "the holder", || async {
        (owner(&db.slot("slot-001").await)? == holder.id).then_some(())
    })
    .await;
    // Through a proxy of its own, which counts its requests by command.
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let standby = db.worker_via(&proxy, &[]);
    wait_front(
        &[&standby],
        &first(&[&standby], 1),
        "the standby at the front",
    )
    .await;
    let surveys = || standby.metric("slotpool_surveys_total").unwrap_or(0);
    let before = surveys();
    let asked_before = proxy.tally().snapshot();
    let t0 = std::time::Instant::now();
    let (mut answered, mut sent) = (0, 0);
    // For three ticks at least, so the gate reopens in between.
    while sent < 300 || t0.elapsed() < Duration::from_secs(3) {
        sent += 1;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", standby.port)) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "POST /v1/poke HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 202") {
            answered += 1;
        }
    }
    let ticks = t0.elapsed().as_secs_f64().ceil() as u64;
    // A poke-driven survey at most every 100 ms (the tick is longer).
    let spacings = t0.elapsed().as_millis() as u64 / 100 + 1;
    let surveyed = surveys() - before;
    let ignored = standby.metric("slotpool_pokes_ignored_total").unwrap_or(0);
    let asked = proxy.tally().since(&asked_before);
    let places = asked.get("aggregate workers").copied().unwrap_or(0);
    println!(
        "{answered} of {sent} pokes answered over {ticks} s: {surveyed} surveys, {ignored} ignored; asked {asked:?}"
    );
    // Its place, which a poke may have changed, at most once a tick (and one at
    // each edge): not once per poke-driven survey.
    assert!(
        places <= ticks + 2,
        "{places} place reads in {ticks} ticks under a flood of pokes: {asked:?}"
    );
    assert_eq!(answered, sent, "every poke is answered (202), taken or not");
    // One survey a tick of its own, one a spacing for pokes, and one each at the edges.
    assert!(
        surveyed <= ticks + spacings + 2,
        "{surveyed} surveys in {ticks} ticks ({spacings} spacings) under a flood of pokes"
    );
    assert!(
        ignored + spacings + 1 >= sent,
        "{ignored} of {sent} pokes ignored"
    );
    assert_eq!(
        owner(&db.slot("slot-001").await).as_deref(),
        Some(holder.id.as_str())
    );
}

/// One `POST /v1/poke`, as a claimer sends it; true when it was answered 202.
fn poke(w: &WorkerProc) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", w.port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "POST /v1/poke HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 202")
}

/// A pool starting: a worker poked right after its first claim (the others' claims
/// poke the same first standbys) surveys, and finds the pool's other slots still
/// vacant. It leaves them to the standbys for `--overflow-after` more, as the
/// overflow rule does for any slot: the standbys of a starting pool were held back
/// their first lease too. (The claim storm had a worker take two of five slots.)
/// Its second slot comes no sooner than `first_hold + overflow_after` (4 s at the
/// default tick) after its start, however fast the machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_holder_poked_at_once_leaves_the_other_vacant_slots_to_standbys() {
    let db = TestDb::new("line_new_holder_poked").await;
    db.init(2).await;
    let started = std::time::Instant::now();
    let w = db.worker(&[]);
    common::wait_for(Duration::from_secs(30), "its first slot", || async {
        (db.held_per_worker().await.get(&w.id) >= Some(&1)).then_some(())
    })
    .await;
    let first = started.elapsed();
    assert!(poke(&w), "the poke is answered");
    // Alone, it takes the second slot in the end, by the overflow rule.
    common::wait_for(Duration::from_secs(30), "its second slot", || async {
        (db.held_per_worker().await.get(&w.id) == Some(&2)).then_some(())
    })
    .await;
    let second = started.elapsed();
    println!("first slot {first:?}, poked, second slot {second:?} after its start");
    assert!(
        second >= Duration::from_secs(4),
        "a new holder took a second slot vacant since before it began {second:?} after its start"
    );
}

/// A pool whose workers start seconds apart: a holder may overflow onto the vacant
/// slot 4 s after its own start, but a standby started when the holder claimed its
/// first slot leaves that slot alone until its own first lease ends, later. The
/// holder waits for it (the standby's heartbeat says when its hold ends), so the slot
/// is claimed once, by the standby, and never handed back: epoch 1, no release.
#[tokio::test(flavor = "multi_thread")]
async fn a_holder_leaves_a_vacant_slot_to_a_standby_still_in_its_first_lease() {
    let db = TestDb::new("line_settling_standby").await;
    db.init(2).await;
    let holder = db.worker(&[]);
    common::wait_for(
        Duration::from_secs(30),
        "the holder's first slot",
        || async { (db.held_per_worker().await.get(&holder.id) >= Some(&1)).then_some(()) },
    )
    .await;
    let standby = db.worker(&[]);
    common::wait_for(Duration::from_secs(30), "both slots held", || async {
        (db.held_per_worker().await.values().sum::<usize>() == 2).then_some(())
    })
    .await;
    let held = db.held_per_worker().await;
    assert_eq!(
        (held.get(&holder.id), held.get(&standby.id)),
        (Some(&1), Some(&1)),
        "one slot each: {held:?}"
    );
    for s in db.slots().await {
        assert_eq!(common::epoch(&s), 1, "claimed once: {s:?}");
    }
    let releases = db
        .store
        .events()
        .count_documents(doc! {"kind": "release"})
        .await
        .unwrap();
    assert_eq!(releases, 0, "nothing was handed back");
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
    let standby = db.worker(&["--release-poll", "100ms"]);
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
    // Unmuted, a poll every 100 ms would survey over 50 times.
    assert!(surveys <= 20, "{surveys} surveys in about 6 s");
    assert_eq!(
        owner(&db.slot("slot-001").await).as_deref(),
        Some("10.9.9.9:7700")
    );
}

/// A standby at the front of a small pool reads every lease and sleeps until the
/// earliest expiry; in a pool of more slots than a wide survey may read, it goes
/// back to reading only the late ones, every tick. Twenty slots held by a holder the
/// test plays (renewed every 500 ms, a lease of 2 s, as a live holder at the default
/// tick would): after its first survey the standby reads next to nothing.
#[tokio::test(flavor = "multi_thread")]
async fn in_a_large_pool_a_standby_reads_only_the_late_leases() {
    let db = TestDb::new("line_narrow").await;
    db.init(20).await;
    let slots = db.store.slots();
    let renew = move || {
        let slots = slots.clone();
        async move {
            slots
                .update_many(
                    doc! {},
                    vec![doc! {"$set": {
                        "owner": "10.9.9.9:7700", "ip": "10.9.9.9", "port": 7700_i64,
                        "time": "$$NOW", "lease_ms": 2000_i64,
                        "expires_ms": {"$add": [{"$toLong": "$$NOW"}, 2000_i64]},
                    }}],
                )
                .await
                .unwrap();
        }
    };
    renew().await;
    let renewer = tokio::spawn({
        let renew = renew.clone();
        async move {
            loop {
                renew().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    let standby = standby_at_front(&db).await;
    let count = |name| standby.metric(name).unwrap_or(0);
    common::wait_for(Duration::from_secs(30), "a first survey", || async {
        (count("slotpool_surveys_total") >= 1).then_some(())
    })
    .await;
    let (surveys, docs) = (
        count("slotpool_surveys_total"),
        count("slotpool_survey_documents_total"),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let surveys = count("slotpool_surveys_total") - surveys;
    let docs = count("slotpool_survey_documents_total") - docs;
    renewer.abort();
    println!("in 10 s: {surveys} surveys read {docs} slot documents");
    // Narrow, a survey a tick; wide, each would read all twenty.
    assert!(surveys >= 5, "{surveys} surveys in 10 s");
    assert!(
        docs < 40,
        "{docs} documents in {surveys} surveys: still reading every lease"
    );
    assert_eq!(
        db.slots()
            .await
            .iter()
            .filter_map(owner)
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["10.9.9.9:7700".to_string()]),
        "the standby took nothing"
    );
}

/// A standby behind the watchers asks the database only for its heartbeat (and its
/// place, read with it) for a minute: counted request by request at a proxy of its
/// own, the driver's own monitoring included. Its connections are opened once, when
/// the driver fills its pools, and never again.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_behind_the_watchers_sends_only_its_heartbeat() {
    let db = TestDb::new("line_quiet").await;
    db.init(1).await;
    let holder = db.worker(&[]);
    db.create_counters(2);
    common::wait_for(Duration::from_secs(30), "a holder", || async {
        (db.held_per_worker().await.get(&holder.id) == Some(&1)).then_some(())
    })
    .await;
    let addr = common::uri_addr(&db.uri);
    let mut proxies = Vec::new();
    for _ in 0..5 {
        proxies.push(common::proxy::Proxy::start(addr).await);
    }
    let standbys: Vec<WorkerProc> = proxies.iter().map(|p| db.worker_via(p, &[])).collect();
    let all: Vec<&WorkerProc> = standbys.iter().collect();
    let watchers = first(&all, 3);
    wait_front(&all, &watchers, "the three first standbys at the front").await;
    let rear: Vec<usize> = (0..standbys.len())
        .filter(|i| !watchers.contains(&standbys[*i].id))
        .collect();
    // Never surveyed, a standby behind the watchers is still ready: its heartbeat
    // and place read are what it knows of the database (the Kubernetes readiness
    // probe asks this).
    for i in &rear {
        let surveyed = standbys[*i].metric("slotpool_surveys_total");
        if surveyed != Some(0) {
            println!("{} has surveyed: {surveyed:?}", standbys[*i].id);
        }
        assert_eq!(
            standbys[*i].http_get("/healthz").map(|(c, _)| c),
            Some(200),
            "{}: ready by its heartbeat",
            standbys[*i].id
        );
    }
    // From its first heartbeat at the rear's pace on: the next comes anywhere in that
    // pace's second half, and each one after 40 s on, so a minute holds at most two.
    let rear_ids: Vec<&str> = rear.iter().map(|i| standbys[*i].id.as_str()).collect();
    common::wait_for(
        Duration::from_secs(30),
        "heartbeats at the rear's pace",
        || async {
            use futures::TryStreamExt;
            let rear_paced = doc! {"_id": {"$in": &rear_ids}, "beat_ms": 40_000_i64};
            let found: Vec<bson::Document> = db
                .store
                .workers()
                .find(rear_paced)
                .await
                .ok()?
                .try_collect()
                .await
                .ok()?;
            (found.len() == rear_ids.len()).then_some(())
        },
    )
    .await;
    // And the place read that follows that heartbeat (a standby's second).
    common::wait_for(
        Duration::from_secs(10),
        "the place reads with them",
        || async {
            rear.iter()
                .all(|i| standbys[*i].metric("slotpool_place_reads_total") >= Some(2))
                .then_some(())
        },
    )
    .await;
    let before: Vec<_> = rear
        .iter()
        .map(|i| proxies[*i].tally().snapshot())
        .collect();
    let whole_reads = |i: usize| {
        standbys[i]
            .metric("slotpool_place_reads_whole_line_total")
            .expect("a standby's /metrics")
    };
    let reads = |i: usize| {
        standbys[i]
            .metric("slotpool_place_reads_total")
            .expect("a standby's /metrics")
    };
    let whole_before: Vec<u64> = rear.iter().map(|i| whole_reads(*i)).collect();
    let reads_before: Vec<u64> = rear.iter().map(|i| reads(*i)).collect();
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Its place reads start at the nearest standbys ahead of it: it read its place in
    // the minute (a beat comes every 20–40 s), and none of those reads was of the
    // whole line ahead.
    for ((i, b), r) in rear.iter().zip(&whole_before).zip(&reads_before) {
        assert!(
            reads(*i) > *r,
            "{} read no place in a minute",
            standbys[*i].id
        );
        assert_eq!(
            whole_reads(*i),
            *b,
            "{} read the whole line ahead again with every watcher alive",
            standbys[*i].id
        );
    }
    for (i, b) in rear.iter().zip(&before) {
        let asked = proxies[*i].tally().since(b);
        let id = &standbys[*i].id;
        println!("{id} asked in 60 s: {asked:?}");
        let requests = |what: &str| asked.get(what).copied().unwrap_or(0);
        for what in asked.keys() {
            let opening = what == "(connection)" || what.contains("(handshake");
            assert!(
                opening || ["update workers", "aggregate workers", "hello"].contains(&what.as_str()),
                "{id} asked {what:?}: a standby behind the watchers sends only its heartbeat, its place and the driver's monitoring"
            );
        }
        // A heartbeat and a place every 20–40 s, then 40 s; one `hello` a minute from the
        // lease client's monitor (a window may catch two) and one every 5 minutes from
        // the robots' client's.
        assert!(requests("update workers") <= 2, "{id}: {asked:?}");
        assert!(requests("aggregate workers") <= 2, "{id}: {asked:?}");
        assert!(requests("hello") <= 3, "{id}: {asked:?}");
        // The driver fills a pool's minimum one connection at a time; past that,
        // a standby opens none.
        let total = proxies[*i].tally().snapshot();
        assert!(
            total.get("(connection)").copied().unwrap_or(0) <= 12,
            "{id} kept opening connections: {total:?}"
        );
    }
    // Cut one off: its next heartbeat fails, and it says so.
    let cut = rear[0];
    proxies[cut].set(common::proxy::Mode::Cut);
    healthz_turns(&standbys[cut], 503, Duration::from_secs(90)).await;
    // Back: a failed heartbeat is tried again within a front-paced beat (5 s), not
    // at the rear's 40 s, and the first that lands makes it ready again.
    proxies[cut].set(common::proxy::Mode::Pass);
    healthz_turns(&standbys[cut], 200, Duration::from_secs(30)).await;
    common::runs_on_once(&db, 2).await;
}

/// The holder and every watcher are killed at once: the standbys behind them still
/// take the slot, once the watchers' heartbeats lapse (two front-paced beats and a
/// second) and they read their place at their next heartbeat, or at a safety survey,
/// whichever comes first; and nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn the_slot_is_taken_when_every_watcher_dies_with_the_holder() {
    let db = TestDb::new("line_all_watchers").await;
    db.init(1).await;
    let mut holder = db.worker(&[]);
    db.create_counters(3);
    common::wait_for(Duration::from_secs(30), "a holder", || async {
        (db.held_per_worker().await.get(&holder.id) == Some(&1)).then_some(())
    })
    .await;
    let mut standbys: Vec<WorkerProc> = (0..5).map(|_| db.worker(&[])).collect();
    let all: Vec<&WorkerProc> = standbys.iter().collect();
    let watchers = first(&all, 3);
    wait_front(&all, &watchers, "the three first standbys at the front").await;
    holder.kill9();
    for w in standbys.iter_mut().filter(|w| watchers.contains(&w.id)) {
        w.kill9();
    }
    let rear: BTreeSet<String> = standbys
        .iter()
        .filter(|w| !watchers.contains(&w.id))
        .map(|w| w.id.clone())
        .collect();
    // 11 s for the watchers' heartbeats, 40 s to the next place read, 2 s of lease.
    let taken = common::wait_for(Duration::from_secs(90), "a rear standby claims", || async {
        owner(&db.slot("slot-001").await).filter(|o| rear.contains(o))
    })
    .await;
    println!("taken by {taken}");
    common::runs_on_once(&db, 3).await;
}

/// A rear standby reads its place from the nearest standbys ahead of it on. When
/// those leave (stopped cleanly, their heartbeats removed), it reads the whole line
/// again and stays behind the watchers still alive further ahead, rather than take
/// the front because its usual read found too few.
#[tokio::test(flavor = "multi_thread")]
async fn a_rear_standby_whose_nearest_standbys_leave_stays_behind_the_live_front() {
    let db = TestDb::new("line_near").await;
    db.init(1).await;
    let holder = db.worker(&[]);
    common::wait_for(Duration::from_secs(30), "a holder", || async {
        (db.held_per_worker().await.get(&holder.id) == Some(&1)).then_some(())
    })
    .await;
    let mut standbys: Vec<WorkerProc> = (0..8).map(|_| db.worker(&[])).collect();
    standbys.sort_by(|a, b| a.id.cmp(&b.id));
    let watchers = {
        let all: Vec<&WorkerProc> = standbys.iter().collect();
        let watchers = first(&all, 3);
        wait_front(&all, &watchers, "the three first standbys at the front").await;
        watchers
    };
    let mut last = standbys.pop().expect("eight standbys");
    // Its place reads (all, and those of the whole line) and whether it stands at the
    // front, from one page of its /metrics.
    let place = |w: &WorkerProc| {
        let (_, page) = w.http_get("/metrics").expect("/metrics");
        let reads = common::metric(&page, "slotpool_place_reads_total");
        let whole = common::metric(&page, "slotpool_place_reads_whole_line_total");
        (
            reads.saturating_sub(whole),
            whole,
            common::metric(&page, "slotpool_line_front"),
        )
    };
    // A place read from the nearest on, now that the line is settled: it finds the
    // nearest live standbys ahead and starts the next read at the farthest of them.
    let (nearest_before, _, _) = place(&last);
    common::wait_for(
        Duration::from_secs(60),
        "a place read from the nearest on",
        || async { (place(&last).0 > nearest_before).then_some(()) },
    )
    .await;
    let (_, whole_before, _) = place(&last);
    // The four just ahead of it leave; the three watchers stay.
    for w in &mut standbys[3..] {
        w.signal(libc::SIGTERM);
        assert!(
            w.wait_exit(Duration::from_secs(30)).is_some(),
            "{} did not stop",
            w.id
        );
    }
    // Its next read from the nearest finds one alive: it must read the whole line,
    // and never stand at the front meanwhile.
    common::wait_for(
        Duration::from_secs(60),
        "a read of the whole line",
        || async {
            let (_, whole, front) = place(&last);
            assert_eq!(
                front, 0,
                "{} took the front with three watchers alive ahead of it",
                last.id
            );
            (whole > whole_before).then_some(())
        },
    )
    .await;
    assert_eq!(place(&last).2, 0, "{} at the front", last.id);
    let line: Vec<&WorkerProc> = standbys[..3].iter().chain([&last]).collect();
    assert_eq!(front(&line), watchers, "the watchers are still the front");
    last.kill9();
}

/// Waits until `worker`'s `/healthz` answers `status`.
async fn healthz_turns(worker: &WorkerProc, status: u16, within: Duration) {
    let what = format!("{}'s /healthz at {status}", worker.id);
    common::wait_for(within, &what, || async {
        (worker.http_get("/healthz")?.0 == status).then_some(())
    })
    .await;
}
