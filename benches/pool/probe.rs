//! What the phases read and wait for: checkpoints, holders and claims, heartbeats,
//! the dev server, and a worker's own footprint.

use std::collections::BTreeSet;

use super::*;

/// Waits until `n` robots have checkpointed at or after `since` (server ms); returns
/// the latest such checkpoint time. Counted slot by slot: see [`checkpointed_on`].
pub(super) async fn checkpointed_since(db: &TestDb, since: i64, n: u64) -> i64 {
    let robots = robots_per_slot(db).await;
    assert_eq!(
        robots.values().sum::<u64>(),
        n,
        "the robots awaited are every robot, counted by its slot"
    );
    checkpointed_on(db, &robots, since).await
}

/// Waits until every robot of each slot in `robots` (slot → how many it has) has
/// checkpointed at or after `since` (server ms); returns the latest such checkpoint
/// time, the server's own `checkpointed_at`, so how often the counts are read
/// changes only when it is noticed.
///
/// Why slot by slot: the dev server answers one command at a time, and a count reads
/// every robot it matches. One count over 20,000 robots took 0.5–0.75 s while a pool
/// restored them, and every holder's renewal waited behind it: the watching itself
/// fenced holders, about every 15 s, each fence throwing a slot's restore away. One
/// slot's count (1,000 robots) holds the server for tens of milliseconds. Each count
/// is followed by a pause 20 times as long as it took (at least 20 ms, at most 5 s),
/// so the watching takes about a 20th of the server; a slot found complete is not
/// read again. Given up after 300 s, or a 50th of a second a robot when that is
/// longer, saying how far it got.
pub(super) async fn checkpointed_on(
    db: &TestDb,
    robots: &BTreeMap<String, u64>,
    since: i64,
) -> i64 {
    let n: u64 = robots.values().sum();
    assert!(n > 0, "no robot to wait for");
    let at_or_after = bson::DateTime::from_millis(since);
    let limit = Duration::from_secs(300).max(Duration::from_millis(20) * n as u32);
    let started = Instant::now();
    let mut seen: BTreeMap<&String, u64> = BTreeMap::new();
    loop {
        for (slot, want) in robots {
            if seen.get(slot) >= Some(want) {
                continue;
            }
            let read = Instant::now();
            let counted = db
                .store
                .robots()
                .count_documents(doc! {"slot_id": slot, "checkpointed_at": {"$gte": at_or_after}})
                .await;
            if let Ok(count) = counted {
                seen.insert(slot, count);
            }
            gently(read.elapsed()).await;
            assert!(
                started.elapsed() < limit,
                "timed out after {:?} waiting for every robot's first checkpoint ({n}) on its new holder: {} of {n} had checkpointed",
                started.elapsed(),
                seen.values().sum::<u64>()
            );
        }
        let done: u64 = robots
            .iter()
            .map(|(slot, want)| seen.get(slot).copied().unwrap_or(0).min(*want))
            .sum();
        if done >= n {
            break;
        }
    }
    let mut last = 0;
    for slot in robots.keys() {
        let read = Instant::now();
        last = last.max(last_checkpoint(db, slot).await);
        gently(read.elapsed()).await;
    }
    last
}

/// The pause after a read of one slot's robots that took `took`: 20 times as long
/// (at least 20 ms, at most 5 s), so that reading slot after slot takes about a
/// 20th of the server.
async fn gently(took: Duration) {
    tokio::time::sleep((took * 20).clamp(Duration::from_millis(20), Duration::from_secs(5))).await;
}

/// The latest checkpoint of `slot`'s robots (server ms; 0 when none has one).
pub(super) async fn last_checkpoint(db: &TestDb, slot: &str) -> i64 {
    db.store
        .robots()
        .find_one(doc! {"slot_id": slot})
        .sort(doc! {"checkpointed_at": -1})
        .await
        .unwrap()
        .and_then(|r| r.get_datetime("checkpointed_at").ok().copied())
        .map_or(0, |t| t.timestamp_millis())
}

pub(super) async fn holder_of(db: &TestDb, slot: &str, not: Option<&str>) -> String {
    common::wait_for(Duration::from_secs(30), "a holder", || async {
        let o = owner(&db.slot(slot).await)?;
        (Some(o.as_str()) != not).then_some(o)
    })
    .await
}

/// Waits for `slot` to be claimed by someone other than `old`; returns when the claim
/// landed (server ms, from its `claim` event at or after `since`).
pub(super) async fn claimed_after(db: &TestDb, slot: &str, old: &str, since: i64) -> i64 {
    let new = holder_of(db, slot, Some(old)).await;
    let since = bson::DateTime::from_millis(since);
    let claim = common::wait_for(Duration::from_secs(10), "the claim event", || async {
        db.store
            .events()
            .find_one(
                doc! {"kind": "claim", "worker": &new, "slot_id": slot, "at": {"$gte": since}},
            )
            .await
            .ok()?
    })
    .await;
    claim.get_datetime("at").unwrap().timestamp_millis()
}

/// The `time` a new holder's claim wrote (server clock), read as soon as `slot` has
/// an owner other than `old` (before the new holder's first renewal, half a tick on).
pub(super) async fn claim_time(db: &TestDb, slot: &str, old: &str) -> i64 {
    common::wait_for(Duration::from_secs(30), "a new holder", || async {
        let s = db.slot(slot).await;
        (owner(&s)? != old).then_some(s.get_datetime("time").ok()?.timestamp_millis())
    })
    .await
}

/// Where one slot's takeover spent its time, in ms after `t0`: its events (claim,
/// adopt) and the spread of its robots' last checkpoints.
pub(super) async fn restore_detail(db: &TestDb, slot: &str, t0: i64) -> String {
    use futures::TryStreamExt;
    let since = bson::DateTime::from_millis(t0);
    let events: Vec<bson::Document> = db
        .store
        .events()
        .find(doc! {"slot_id": slot, "at": {"$gte": since}})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let events: Vec<String> = events
        .iter()
        .filter_map(|e| {
            let at = e.get_datetime("at").ok()?.timestamp_millis() - t0;
            Some(format!("{} +{at}", e.get_str("kind").ok()?))
        })
        .collect();
    let robots: Vec<bson::Document> = db
        .store
        .robots()
        .find(doc! {"slot_id": slot})
        .projection(doc! {"checkpointed_at": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut at: Vec<f64> = robots
        .iter()
        .filter_map(|d| {
            Some((d.get_datetime("checkpointed_at").ok()?.timestamp_millis() - t0) as f64)
        })
        .collect();
    at.sort_by(f64::total_cmp);
    format!(
        "{}; robots checkpointed: first +{:.0}, median +{:.0}, p90 +{:.0}, last +{:.0} ms",
        events.join(", "),
        at.first().copied().unwrap_or(f64::NAN),
        pct(&at, 0.5),
        pct(&at, 0.9),
        at.last().copied().unwrap_or(f64::NAN)
    )
}

/// The dev server's operations per second over 10 s (its opcounters).
pub(super) async fn ops_per_s(db: &TestDb) -> f64 {
    let (a, t) = (opcounters(db).await, Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    (opcounters(db).await - a) as f64 / t.elapsed().as_secs_f64()
}

/// Eager counters (one checkpoint per start) named `NAME-i`, on the least-loaded slots.
pub(super) fn eager_counters(db: &TestDb, name: &str, n: u32) {
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        name,
        "--kind",
        "counter",
        "--count",
        &n.to_string(),
        "--spec",
        r#"{"interval_ms": 600000, "eager": true}"#,
    ]);
}

pub(super) async fn one_slot_each(db: &TestDb, workers: usize) {
    common::wait_for(Duration::from_secs(60), "one slot per worker", || async {
        let h = db.held_per_worker().await;
        (h.len() == workers && h.values().all(|n| *n == 1)).then_some(())
    })
    .await
}

pub(super) async fn opcounters(db: &TestDb) -> i64 {
    let s = db
        .store
        .db()
        .run_command(doc! {"serverStatus": 1})
        .await
        .unwrap();
    let o = s.get_document("opcounters").unwrap();
    ["insert", "query", "update", "delete", "getmore", "command"]
        .iter()
        .map(|k| match o.get(*k) {
            Some(Bson::Int32(v)) => *v as i64,
            Some(Bson::Int64(v)) => *v,
            Some(Bson::Double(v)) => *v as i64,
            _ => 0,
        })
        .sum()
}

/// The bench's own dev server process, when it runs one (see `dev_server`).
pub(super) fn server_pid() -> Option<i32> {
    if std::env::var("SLOTPOOL_BENCH_OWN_SERVER").as_deref() != Ok("1") {
        return None;
    }
    let port = std::env::var("SLOTPOOL_DEV_PORT").ok()?;
    let root = env!("CARGO_MANIFEST_DIR");
    std::fs::read_to_string(format!("{root}/.state/mongo-{port}.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The dev server's CPU use, in cores, over `window`.
pub(super) async fn server_cores(pid: i32, window: Duration) -> f64 {
    let a = cpu_s(pid);
    tokio::time::sleep(window).await;
    (cpu_s(pid) - a) / window.as_secs_f64()
}

/// Waits until worker `id` has written its first heartbeat.
pub(super) async fn wait_heartbeat(db: &TestDb, id: &str) {
    common::wait_for(
        Duration::from_secs(10),
        "the standby's heartbeat",
        || async {
            db.store
                .workers()
                .find_one(doc! {"_id": id})
                .await
                .ok()?
                .map(|_| ())
        },
    )
    .await
}

/// Runs `scripts/dev-mongo.sh ACTION` on the bench's own dev server. Does nothing
/// (and returns false) when the bench runs against a server of the user's
/// (`MONGODB_URI` given to scripts/bench.sh).
pub(super) fn dev_server(action: &str) -> bool {
    if std::env::var("SLOTPOOL_BENCH_OWN_SERVER").as_deref() != Ok("1") {
        return false;
    }
    common::dev_mongo(action);
    true
}

/// Every phase starts on a fresh dev server: its cost per operation grows over its
/// process life, and one phase's load must not slow the next.
pub(super) fn fresh_server() {
    dev_server("fresh");
}

/// Polls `w`'s /metrics (no database load) until it has made `n` checkpoints or
/// `limit` passed. Returns its checkpoint and self-fence counts then.
pub(super) async fn until_checkpointed(w: &WorkerProc, n: u32, limit: Duration) -> (u64, u64) {
    let deadline = Instant::now() + limit;
    let done = || w.metric("slotpool_checkpoints_total").unwrap_or(0);
    while done() < n as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fences = w.metric("slotpool_self_fences_total").unwrap_or(0);
    (done(), fences)
}

/// A number from `/proc/PID/status` (e.g. `VmHWM`, the peak RSS), in KiB.
pub(super) fn status_kb(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds a process has used (user + system).
pub(super) fn cpu_s(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15, counted from 1; f[0] is field 3.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

/// Polls the worker's log for `needle` until `limit`; returns how long it took.
pub(super) async fn logged(w: &WorkerProc, needle: &str, limit: Duration) -> Duration {
    let t = Instant::now();
    while t.elapsed() < limit {
        if w.log_text().contains(needle) {
            return t.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{needle:?} not logged within {limit:?}");
}

/// When a slot's robots were back on its new holder, in ms after `t0` (this
/// machine's clock): `running` when that holder's `slotpool_robots_running` first
/// reached the robots of every slot it holds (each started on it, past its
/// adoption), `checkpointed` when its `slotpool_checkpoints_total` did (each robot's
/// first write landed). Infinite when not seen within [`BACK_WITHIN`].
#[derive(Debug, Clone, Copy)]
pub(super) struct SlotBack {
    pub(super) running: f64,
    pub(super) checkpointed: f64,
}

/// How many robots each slot has, read before a kill: [`slots_back`] sums them
/// for each new holder instead of counting on the server it is measuring.
pub(super) async fn robots_per_slot(db: &TestDb) -> BTreeMap<String, u64> {
    // Slot by slot, each count on the `slot_id` index: one `$group` over every robot
    // holds the dev server (one command at a time) for as long as it reads them all,
    // and holders' renewals wait behind it (see [`checkpointed_on`]).
    let mut per = BTreeMap::new();
    for slot in db.slots().await {
        let Ok(id) = slot.get_str("_id") else {
            continue;
        };
        let read = Instant::now();
        let n = db
            .store
            .robots()
            .count_documents(doc! {"slot_id": id})
            .await
            .unwrap();
        gently(read.elapsed()).await;
        if n > 0 {
            per.insert(id.to_string(), n);
        }
    }
    per
}

/// How long [`slots_back`] watches before it gives up on a slot.
const BACK_WITHIN: Duration = Duration::from_secs(120);

/// Watches `slots`' new holders side by side, each one's `/metrics` every 50 ms
/// (their own pages: the server being measured is not loaded by the watching),
/// until every slot's holder has run and checkpointed as many robots as it holds:
/// see [`SlotBack`]. It may start at the kill: a slot still owned by one of `dead`
/// counts as unheld. Who holds what is read again every 100 ms while a slot is
/// unheld, then every second and before it ends, so each new holder is watched from
/// within 100 ms of its claim, and a slot handed back meanwhile (an overflow
/// holder's) is timed on the holder it ends on. `robots` is [`robots_per_slot`]
/// before the kill: what a holder should run is summed from it, not counted on the
/// server while it restores.
pub(super) async fn slots_back(
    db: &TestDb,
    slots: &[String],
    dead: &BTreeSet<String>,
    robots: &BTreeMap<String, u64>,
    t0: i64,
) -> BTreeMap<String, SlotBack> {
    // (holder, robots it should run) → when it first ran them, first checkpointed them.
    let mut seen: BTreeMap<(String, u64), (Option<f64>, Option<f64>)> = BTreeMap::new();
    // The pages asked for and not answered yet.
    let mut pages = tokio::task::JoinSet::new();
    let mut asking: BTreeSet<(String, u64)> = BTreeSet::new();
    let mut holding = holding_now(db, slots, dead, robots).await;
    let mut read_at = Instant::now();
    let deadline = Instant::now() + BACK_WITHIN;
    while Instant::now() < deadline {
        let every = if holding.len() < slots.len() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        };
        if read_at.elapsed() >= every {
            holding = holding_now(db, slots, dead, robots).await;
            read_at = Instant::now();
        }
        let done = |seen: &BTreeMap<_, (Option<f64>, Option<f64>)>,
                    holding: &BTreeMap<String, (String, u64)>| {
            holding.len() == slots.len()
                && holding
                    .values()
                    .all(|h| seen.get(h).is_some_and(|s| s.1.is_some()))
        };
        if done(&seen, &holding) {
            holding = holding_now(db, slots, dead, robots).await;
            read_at = Instant::now();
            if done(&seen, &holding) {
                break;
            }
        }
        // Each holder on its own, off the runtime's threads (the bench's proxy
        // runs on them): a page is asked for every 50 ms unless the last one is
        // still on its way, so one slow page delays neither the others' reads nor
        // the traffic of the workers being measured. Each is timed by when it
        // came back.
        for h in holding.values() {
            if seen.get(h).is_some_and(|s| s.1.is_some()) || !asking.insert(h.clone()) {
                continue;
            }
            let (id, want) = h.clone();
            pages.spawn_blocking(move || {
                let page = common::containers::metrics_at(&id);
                (id, want, page, (wall_ms() - t0) as f64)
            });
        }
        while let Some(answered) = pages.try_join_next() {
            let Ok((id, want, page, at)) = answered else {
                continue;
            };
            asking.remove(&(id.clone(), want));
            let Some(page) = page else {
                continue;
            };
            let s = seen.entry((id, want)).or_default();
            if metric(&page, "slotpool_robots_running") >= want {
                s.0.get_or_insert(at);
            }
            if metric(&page, "slotpool_checkpoints_total") >= want {
                s.0.get_or_insert(at);
                s.1.get_or_insert(at);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    slots
        .iter()
        .map(|slot| {
            let s = holding
                .get(slot)
                .and_then(|h| seen.get(h))
                .copied()
                .unwrap_or_default();
            (
                slot.clone(),
                SlotBack {
                    running: s.0.unwrap_or(f64::INFINITY),
                    checkpointed: s.1.unwrap_or(f64::INFINITY),
                },
            )
        })
        .collect()
}

/// Each of `slots` that has a holder now, not one of `dead`: that holder, and the
/// robots of every slot it holds.
async fn holding_now(
    db: &TestDb,
    slots: &[String],
    dead: &BTreeSet<String>,
    robots: &BTreeMap<String, u64>,
) -> BTreeMap<String, (String, u64)> {
    let all = db.slots().await;
    let mut robots_of_holder: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for s in &all {
        let (Ok(id), Some(o)) = (s.get_str("_id"), owner(s)) else {
            continue;
        };
        if !slots.iter().any(|x| x == id) || dead.contains(&o) {
            continue;
        }
        if !robots_of_holder.contains_key(&o) {
            let n = all
                .iter()
                .filter(|t| owner(t).as_deref() == Some(o.as_str()))
                .filter_map(|t| t.get_str("_id").ok())
                .map(|t| robots.get(t).copied().unwrap_or(0))
                .sum();
            robots_of_holder.insert(o.clone(), n);
        }
        let n = robots_of_holder[&o];
        out.insert(id.to_string(), (o, n));
    }
    out
}

/// Each of `slots`' first claim since `t0`, in ms after it (its `claim` event, the
/// server's clock): read once the round is over, so the figure does not depend on
/// how soon a busy server answered the watching.
pub(super) async fn first_claims(db: &TestDb, slots: &[String], t0: i64) -> Vec<i64> {
    let since = bson::DateTime::from_millis(t0);
    let mut out = Vec::new();
    for slot in slots {
        let first = db
            .store
            .events()
            .find_one(doc! {"kind": "claim", "slot_id": slot, "at": {"$gte": since}})
            .sort(doc! {"at": 1})
            .await
            .ok()
            .flatten()
            .and_then(|e| e.get_datetime("at").ok().copied());
        out.push(first.map_or(i64::MAX, |t| t.timestamp_millis() - t0));
    }
    out
}
