//! A pool of hundreds of workers: a cold start of every process at once, what an
//! idle pool asks of its database by command as it grows, each worker's footprint,
//! and mass failures of many holders at once, every request counted at one proxy in
//! front of the server.
//!
//! `SLOTPOOL_BENCH_SCALE_REST=0` leaves out the idle pool's counts (eight minutes of
//! a quick run), for working on the cold start or the mass failures;
//! `SLOTPOOL_BENCH_SCALE_ROBOTS=0` leaves out the robots and the mass failures, and
//! `SLOTPOOL_BENCH_SCALE_ROBOTS=N` runs them with `N` robots instead. Each
//! row is printed as it is measured, so a phase cut short keeps what it had.

use std::collections::BTreeSet;

use common::proxy::{Proxy, Tally};

use super::*;

/// The pool's sizes: workers, slots, robots, holders killed per round, rounds, and
/// the pool sizes at which the idle pool's requests are counted.
struct Sizes {
    workers: usize,
    slots: u32,
    robots: u32,
    kill: usize,
    rounds: usize,
    at_rest: [usize; 3],
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let mut z = Sizes::default_for(quick);
        if let Some(n) = std::env::var("SLOTPOOL_BENCH_SCALE_ROBOTS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            z.robots = n;
        }
        z
    }

    fn default_for(quick: bool) -> Sizes {
        if quick {
            Sizes {
                workers: 50,
                slots: 10,
                robots: 2_000,
                kill: 5,
                rounds: 3,
                at_rest: [50, 25, 15],
            }
        } else {
            Sizes {
                workers: 200,
                slots: 20,
                robots: 20_000,
                kill: 10,
                rounds: 10,
                at_rest: [200, 100, 25],
            }
        }
    }
}

/// How long an idle pool is left to settle before it is counted: a worker that
/// believed itself at the front as the pool started re-reads its place within 6
/// front-paced beats (30 s), and one behind within a rear beat (40 s).
const SETTLE: Duration = Duration::from_secs(45);

/// How long the idle pool's requests are counted: two minutes, a whole number of
/// each period in it (40 s heartbeats, the driver's monitors once a minute). The
/// workers started together and keep in phase: over 90 s, each monitor was counted
/// twice, and a standby looked half as costly again as it is.
const WINDOW: Duration = Duration::from_secs(120);

/// `n` worker processes started at once (from four threads, so that the starts
/// fall within a second), their database traffic through `proxy`.
fn start_all(db: &TestDb, proxy: &Proxy, n: usize) -> Vec<WorkerProc> {
    let uri = proxy.uri(&db.uri);
    let per = n.div_ceil(4);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (uri, dir) = (&uri, &db.dir);
                let count = per.min(n.saturating_sub(t * per));
                s.spawn(move || {
                    (0..count)
                        .map(|_| WorkerProc::start(uri, dir, &[]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// Requests a second by command over `window`, and their sum.
async fn rates(tally: &Tally, window: Duration) -> (f64, BTreeMap<String, f64>) {
    let before = tally.snapshot();
    tokio::time::sleep(window).await;
    let per: BTreeMap<String, f64> = tally
        .since(&before)
        .into_iter()
        .filter(|(k, _)| k != "(connection)")
        .map(|(k, n)| (k, n as f64 / window.as_secs_f64()))
        .collect();
    (per.values().sum(), per)
}

/// `per` as `command rate` pairs, the largest first.
fn by_command(per: &BTreeMap<String, f64>) -> String {
    let mut sorted: Vec<(&String, &f64)> = per.iter().filter(|(_, r)| **r >= 0.005).collect();
    sorted.sort_by(|a, b| b.1.total_cmp(a.1));
    sorted
        .iter()
        .map(|(k, r)| format!("{k} {r:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The holders' ids, from the slots.
async fn holders(db: &TestDb) -> BTreeSet<String> {
    db.slots().await.iter().filter_map(owner).collect()
}

/// Every worker's self-fences, summed from their /metrics.
fn self_fences(workers: &[WorkerProc]) -> u64 {
    workers
        .iter()
        .map(|w| w.metric("slotpool_self_fences_total").unwrap_or(0))
        .sum()
}

/// Claims beyond one per slot: every epoch past the first.
async fn extra_epochs(db: &TestDb) -> i64 {
    db.slots()
        .await
        .iter()
        .map(|s| (common::epoch(s) - 1).max(0))
        .sum()
}

/// The mean and the largest of `values`, as `mean (max)`.
fn mean_max(values: &[f64], unit: &str) -> String {
    if values.is_empty() {
        return "none".into();
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    format!("{mean:.2} {unit} (max {max:.2})")
}

/// Stops every worker in `gone` with SIGTERM (it releases what it holds and leaves
/// the line) and waits for each to exit.
fn stop_gracefully(gone: Vec<WorkerProc>) {
    for w in &gone {
        w.signal(libc::SIGTERM);
    }
    for mut w in gone {
        let _ = w.wait_exit(Duration::from_secs(30));
    }
}

/// The idle pool at one size: requests by command, and each worker's footprint.
struct AtRest {
    workers: usize,
    total: f64,
    per: BTreeMap<String, f64>,
    footprint: String,
}

async fn at_rest(db: &TestDb, tally: &Tally, pool: &[WorkerProc]) -> AtRest {
    tokio::time::sleep(SETTLE).await;
    let held = holders(db).await;
    let cpu0: Vec<f64> = pool.iter().map(|w| cpu_s(w.pid())).collect();
    let (total, per) = rates(tally, WINDOW).await;
    let (mut standby_cpu, mut holder_cpu, mut standby_rss, mut holder_rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (w, c0) in pool.iter().zip(cpu0) {
        let cores = 100.0 * (cpu_s(w.pid()) - c0) / WINDOW.as_secs_f64();
        let rss = status_kb(w.pid(), "VmRSS") as f64 / 1024.0;
        if held.contains(&w.id) {
            holder_cpu.push(cores);
            holder_rss.push(rss);
        } else {
            standby_cpu.push(cores);
            standby_rss.push(rss);
        }
    }
    let footprint = format!(
        "standbys: RSS {}, CPU {}; holders: RSS {}, CPU {}",
        mean_max(&standby_rss, "MiB"),
        mean_max(&standby_cpu, "% of a core"),
        mean_max(&holder_rss, "MiB"),
        mean_max(&holder_cpu, "% of a core"),
    );
    AtRest {
        workers: pool.len(),
        total,
        per,
        footprint,
    }
}

/// One kill round's figures for one slot, in ms after the kill.
struct SlotTimes {
    claim: f64,
    adopted: f64,
    /// Its new holder running every robot it holds (see [`SlotBack`]).
    running: f64,
    last: f64,
}

/// When the `adopt` event of `slot` at or after `t0` landed (server ms), waiting for
/// it.
async fn adopted_at(db: &TestDb, slot: &str, t0: i64) -> i64 {
    let since = bson::DateTime::from_millis(t0);
    let event = common::wait_for(Duration::from_secs(120), "the adoption", || async {
        db.store
            .events()
            .find_one(doc! {"kind": "adopt", "slot_id": slot, "at": {"$gte": since}})
            .await
            .ok()?
    })
    .await;
    event.get_datetime("at").unwrap().timestamp_millis()
}

/// The robots of `slots` that ran again later than `after_ms` past `t0`: what their
/// documents say of their restarts and errors, for the round's printout (at most
/// `n` of them, the latest first). Read slot by slot (see `checkpointed_on`).
async fn laggards(db: &TestDb, slots: &[&String], t0: i64, after_ms: i64, n: i64) -> Vec<String> {
    use futures::TryStreamExt;
    let late = bson::DateTime::from_millis(t0 + after_ms);
    let mut found: Vec<bson::Document> = Vec::new();
    for slot in slots {
        let cursor = db
            .store
            .robots()
            .find(doc! {"slot_id": slot, "checkpointed_at": {"$gt": late}})
            .projection(doc! {"name": 1, "slot_id": 1, "restarts": 1, "status": 1, "error": 1, "checkpointed_at": 1, "seq": 1})
            .sort(doc! {"checkpointed_at": -1})
            .limit(n)
            .await
            .unwrap();
        found.extend(cursor.try_collect::<Vec<_>>().await.unwrap());
    }
    let at = |r: &bson::Document| {
        r.get_datetime("checkpointed_at")
            .map_or(0, |t| t.timestamp_millis())
    };
    found.sort_by_key(|r| std::cmp::Reverse(at(r)));
    found.truncate(n as usize);
    found
        .iter()
        .map(|r| {
            format!(
                "{} on {} +{} ms: seq {}, restarts {}, status {}, error {}",
                r.get_str("name").unwrap_or("?"),
                r.get_str("slot_id").unwrap_or("?"),
                at(r) - t0,
                r.get_i64("seq").unwrap_or(-1),
                r.get_i64("restarts").unwrap_or(0),
                r.get_str("status").unwrap_or("?"),
                r.get("error").map_or("none".to_string(), |e| e.to_string()),
            )
        })
        .collect()
}

/// One round: `kill` holders killed at once (kill -9); returns each of their slots'
/// claim, adoption, robots running and last robot's first checkpoint after the kill,
/// and the times until every robot of theirs ran again and until each had
/// checkpointed. The dead are replaced by new standbys.
async fn kill_round(
    db: &TestDb,
    proxy: &Proxy,
    pool: &mut Vec<WorkerProc>,
    kill: usize,
    round: usize,
    fenced_then_killed: &mut u64,
) -> (Vec<SlotTimes>, f64, f64) {
    let held: Vec<(String, String)> = db
        .slots()
        .await
        .iter()
        .filter_map(|s| Some((s.get_str("_id").ok()?.to_string(), owner(s)?)))
        .collect();
    // A different set of holders each round.
    let start = (round * kill) % held.len().max(1);
    let mut victims: Vec<String> = Vec::new();
    for (_, o) in held.iter().cycle().skip(start).take(held.len()) {
        if victims.len() < kill && !victims.contains(o) {
            victims.push(o.clone());
        }
    }
    let hit: Vec<(String, String)> = held
        .iter()
        .filter(|(_, o)| victims.contains(o))
        .cloned()
        .collect();
    let slots_hit: Vec<&String> = hit.iter().map(|(s, _)| s).collect();
    // Read slot by slot, like every count here (see `checkpointed_on`): one count over
    // every robot would hold the dev server, and the survivors' renewals, just
    // before the kill.
    let per_slot = robots_per_slot(db).await;
    assert_eq!(
        per_slot.values().sum::<u64>(),
        db.store.robots().estimated_document_count().await.unwrap(),
        "every robot counted by its slot"
    );
    let on_hit: BTreeMap<String, u64> = per_slot
        .iter()
        .filter(|(slot, _)| slots_hit.contains(slot))
        .map(|(slot, n)| (slot.clone(), *n))
        .collect();
    // A victim's own self-fences (as a survivor of an earlier round) leave the
    // pool with it: counted now, before its metrics go.
    for w in pool.iter().filter(|w| victims.contains(&w.id)) {
        let fences = w.metric("slotpool_self_fences_total");
        if fences.is_none() {
            eprintln!(
                "  could not read {}'s self-fences before the kill: not counted",
                w.id
            );
        }
        *fenced_then_killed += fences.unwrap_or(0);
    }
    let asked_before = proxy.tally().snapshot();
    let server_cpu = server_pid().map(|pid| (pid, cpu_s(pid)));
    let t = Instant::now();
    let t0 = wall_ms();
    for w in pool.iter_mut().filter(|w| victims.contains(&w.id)) {
        w.kill9();
    }
    // Watched from the kill on, side by side, loading the server being measured
    // little: one indexed read of the slots every 30 ms until each has a new holder
    // (its `time` is the claim's until the first renewal, half a tick on); and the
    // new holders' own /metrics, each from within 100 ms of its claim, until each
    // has run and checkpointed as many robots as it holds (eager counters
    // checkpoint once per start). The checkpoint figures are the server's
    // timestamps, read once at the end.
    let hit_ids: Vec<String> = slots_hit.iter().map(|s| (*s).clone()).collect();
    let dead: BTreeSet<String> = victims.iter().cloned().collect();
    let claims_seen = async {
        let mut claims: BTreeMap<String, (String, i64)> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while claims.len() < hit.len() {
            assert!(
                Instant::now() < deadline,
                "a slot was not claimed again within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
            let found: Vec<bson::Document> = {
                use futures::TryStreamExt;
                let Ok(cursor) = db
                    .store
                    .slots()
                    .find(doc! {"_id": {"$in": &slots_hit}})
                    .await
                else {
                    continue;
                };
                cursor.try_collect().await.unwrap_or_default()
            };
            for s in &found {
                let (Ok(id), Some(o)) = (s.get_str("_id"), owner(s)) else {
                    continue;
                };
                let old = hit.iter().find(|(slot, _)| slot == id).map(|(_, o)| o);
                if Some(&o) != old && !claims.contains_key(id) {
                    let at = s.get_datetime("time").map_or(0, |t| t.timestamp_millis());
                    claims.insert(id.to_string(), (o, at));
                }
            }
        }
        claims
    };
    let (claims, back_on) =
        tokio::join!(claims_seen, slots_back(db, &hit_ids, &dead, &per_slot, t0));
    let last_all = checkpointed_on(db, &on_hit, t0).await;
    let took = t.elapsed().as_secs_f64();
    let asked = proxy.tally().since(&asked_before);
    let busy = server_cpu.map_or(String::new(), |(pid, c0)| {
        format!(
            "; the dev server busy {:.0} % of those {took:.1} s",
            100.0 * (cpu_s(pid) - c0) / took
        )
    });
    eprintln!("  asked of the server from the kill to every robot back: {asked:?}{busy}");
    let mut back = Vec::new();
    for (slot, (_, claim)) in &claims {
        back.push(SlotTimes {
            claim: (claim - t0) as f64,
            adopted: (adopted_at(db, slot, t0).await - t0) as f64,
            running: back_on[slot].running,
            last: (last_checkpoint(db, slot).await - t0) as f64,
        });
    }
    let late = laggards(db, &slots_hit, t0, 3000, 10).await;
    if !late.is_empty() {
        let restarts = db
            .store
            .events()
            .count_documents(
                doc! {"kind": "robot_restart", "at": {"$gte": bson::DateTime::from_millis(t0)}},
            )
            .await
            .unwrap_or(0);
        eprintln!(
            "  robots back later than 3 s ({restarts} robot_restart events since the kill):\n    {}",
            late.join("\n    ")
        );
    }
    pool.retain(|w| !victims.contains(&w.id));
    let fresh = start_all(db, proxy, victims.len());
    for w in &fresh {
        wait_heartbeat(db, &w.id).await;
    }
    pool.extend(fresh);
    let all_running = back_on.values().map(|b| b.running).fold(0.0, f64::max);
    (back, all_running, (last_all - t0) as f64)
}

/// Prints a row as soon as it is measured, and keeps it.
fn measured(rows: &mut Vec<Row>, row: Row) {
    println!("{} | {} | {}", row.name, row.figures, row.goal);
    rows.push(row);
}

pub(super) async fn scale_rows(quick: bool) -> Vec<Row> {
    let z = Sizes::new(quick);
    fresh_server();
    let db = TestDb::new("b_scale").await;
    db.init(z.slots).await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let tally = proxy.tally();
    let mut rows = Vec::new();

    // 1. The cold start: every process at once over slots never held.
    let before = tally.snapshot();
    let t = Instant::now();
    let mut pool = start_all(&db, &proxy, z.workers);
    let spawned = t.elapsed();
    let slots = z.slots as usize;
    common::wait_for(Duration::from_secs(300), "every slot held", || async {
        (holders(&db).await.len() == slots).then_some(())
    })
    .await;
    let all_held = t.elapsed();
    let first_10s = Duration::from_secs(10).saturating_sub(t.elapsed());
    tokio::time::sleep(first_10s).await;
    let start_traffic = tally.since(&before);
    let connections = start_traffic.get("(connection)").copied().unwrap_or(0);
    let requests: u64 = start_traffic
        .iter()
        .filter(|(k, _)| *k != "(connection)")
        .map(|(_, n)| n)
        .sum();
    let counts: BTreeMap<String, f64> = start_traffic
        .iter()
        .filter(|(k, _)| *k != "(connection)")
        .map(|(k, n)| (k.clone(), *n as f64))
        .collect();
    let (fences, extra) = (self_fences(&pool), extra_epochs(&db).await);
    measured(&mut rows, Row {
        name: format!(
            "Cold start: {} worker processes started at once over {} slots never held (tick 1 s, every request through one counting proxy)",
            z.workers, z.slots
        ),
        figures: format!(
            "all started within {:.2} s; every slot held {:.2} s after the first start; self-fences: {fences}; extra epochs: {extra}; in the first 10 s: {connections} connections opened and {requests} requests ({})",
            spawned.as_secs_f64(),
            all_held.as_secs_f64(),
            by_command(&counts).replace(".00", ""),
        ),
        goal: judged(
            "every slot held, 0 self-fences, 0 extra epochs",
            fences == 0 && extra == 0,
            format!("{fences} self-fences, {extra} extra epochs"),
        ),
    });

    // 2. The idle pool as it shrinks: every size counted the same way.
    let mut rest: Vec<AtRest> = Vec::new();
    let counted = std::env::var("SLOTPOOL_BENCH_SCALE_REST").as_deref() != Ok("0");
    for size in z.at_rest.into_iter().filter(|_| counted) {
        let held = holders(&db).await;
        let standbys: Vec<usize> = (0..pool.len())
            .filter(|i| !held.contains(&pool[*i].id))
            .collect();
        let surplus = pool.len().saturating_sub(size);
        let gone_ids: BTreeSet<String> = standbys
            .iter()
            .rev()
            .take(surplus)
            .map(|i| pool[*i].id.clone())
            .collect();
        let (gone, kept): (Vec<WorkerProc>, Vec<WorkerProc>) =
            pool.into_iter().partition(|w| gone_ids.contains(&w.id));
        pool = kept;
        stop_gracefully(gone);
        rest.push(at_rest(&db, &tally, &pool).await);
    }
    for r in &rest {
        let (largest, smallest) = (&rest[0], &rest[rest.len() - 1]);
        let per_standby =
            (largest.total - smallest.total) / (largest.workers - smallest.workers).max(1) as f64;
        let budget = z.slots as f64 + 3.0 + 0.1 * largest.workers as f64;
        measured(&mut rows, Row {
            name: format!(
                "Idle pool: {} workers over {} slots, no robots (tick 1 s, --watchers 3): requests/s by command at a proxy, {} s",
                r.workers,
                z.slots,
                WINDOW.as_secs()
            ),
            figures: format!(
                "{:.2}/s in all: {}; {}",
                r.total,
                by_command(&r.per),
                r.footprint
            ),
            goal: if r.workers == largest.workers {
                format!(
                    "{}; {}",
                    judged(
                        &format!("≤ {budget:.0}/s ({} renewals + 3 watchers + 0.1 per worker)", z.slots),
                        r.total <= budget,
                        format!("{:.2}/s", r.total)
                    ),
                    judged(
                        "≤ 0.1/s for each standby beyond the watchers",
                        per_standby <= 0.1,
                        format!(
                            "{per_standby:.3}/s each: {:.2}/s at {} workers, {:.2}/s at {}",
                            largest.total, largest.workers, smallest.total, smallest.workers
                        )
                    )
                )
            } else {
                "-".into()
            },
        });
    }
    if std::env::var("SLOTPOOL_BENCH_SCALE_ROBOTS").as_deref() == Ok("0") {
        return rows;
    }

    // 3. Robots: the pool grows back, then every robot is created and started.
    let fresh = start_all(&db, &proxy, z.workers - pool.len());
    pool.extend(fresh);
    tokio::time::sleep(SETTLE).await;
    let t0 = wall_ms();
    let t = Instant::now();
    eager_counters(&db, "s", z.robots);
    let created = t.elapsed();
    let last = checkpointed_since(&db, t0, z.robots as u64).await;
    let fences_before = self_fences(&pool);
    measured(&mut rows, Row {
        name: format!(
            "{} eager counters created with `robot create --count` beside {} running workers, {} slots",
            z.robots, z.workers, z.slots
        ),
        figures: format!(
            "created in {:.1} s; every one running (its first checkpoint) {:.1} s after the create began; self-fences meanwhile: {fences_before}",
            created.as_secs_f64(),
            (last - t0) as f64 / 1000.0
        ),
        goal: "-".into(),
    });

    // 4. Mass failures: many holders killed at once, round after round.
    let mut all_back = Vec::new();
    let (mut claim, mut adopted, mut running, mut last_robot) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut all_running = Vec::new();
    let mut fenced_then_killed = 0;
    for round in 0..z.rounds {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (back, ran, all) = kill_round(
            &db,
            &proxy,
            &mut pool,
            z.kill,
            round,
            &mut fenced_then_killed,
        )
        .await;
        eprintln!(
            "scale round {}: all running +{ran:.0} ms, all checkpointed +{all:.0} ms; per slot (claim, adopted, running, last checkpoint): {:?}",
            round + 1,
            back.iter()
                .map(|b| (b.claim, b.adopted, b.running, b.last))
                .collect::<Vec<_>>()
        );
        all_running.push(ran);
        all_back.push(all);
        for b in back {
            claim.push(b.claim);
            adopted.push(b.adopted);
            running.push(b.running);
            last_robot.push(b.last);
        }
    }
    let fences_after = self_fences(&pool) + fenced_then_killed;
    let robots_per_slot = z.robots / z.slots;
    measured(&mut rows, Row {
        name: format!(
            "Mass failure at scale: {} workers, {} slots, {} robots ({robots_per_slot} a slot); {} holders killed at once (kill -9), {} rounds",
            z.workers, z.slots, z.robots, z.kill, z.rounds
        ),
        figures: format!(
            "every robot of theirs running again (its new holder's robots_running gauge, polled every 50 ms) after: {}; and each one's first checkpoint landed: {}; per slot: claim {}; adoption recorded {}; all its robots running {}; its last robot's checkpoint {}; self-fences among the survivors: {}",
            dist(&mut all_running.clone()),
            dist(&mut all_back.clone()),
            dist(&mut claim),
            dist(&mut adopted),
            dist(&mut running),
            dist(&mut last_robot),
            fences_after.saturating_sub(fences_before),
        ),
        goal: format!(
            "{}; {}",
            judged(
                "every robot running again within L + 1 s = 3000 ms, p99",
                p99(&all_running) <= 3000.0,
                format!("p99 {:.0} ms", p99(&all_running)),
            ),
            judged(
                "and its first checkpoint landed within L + 1 s",
                p99(&all_back) <= 3000.0,
                format!("p99 {:.0} ms", p99(&all_back)),
            )
        ),
    });
    rows
}
