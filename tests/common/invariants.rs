//! The invariant checker: reads every robot's checkpoint history (and a counter's count) and the
//! `events` log, and fails on a double run, a stale-epoch checkpoint, a lost or
//! doubled step, or a counter going back.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use super::TestDb;

/// One accepted checkpoint, as the robot's `history` recorded it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub seq: i64,
    pub epoch: i64,
    /// The writing instance's generation (0 in histories from before generations).
    pub gen: i64,
    pub worker: String,
    pub slot: String,
    pub at: i64,
}

/// What the checker saw.
#[derive(Debug, Default)]
pub struct Report {
    pub robots: usize,
    pub checkpoints: usize,
    pub claims: usize,
    /// Old-epoch checkpoints applied after a newer claim but before that holder's
    /// adoption: writes in flight longer than the fence margin. Reported, not fatal:
    /// the adoption fence is what guarantees no stale write lands after it.
    pub in_flight_past_claim: usize,
}

pub fn entries(r: &Document) -> Vec<Entry> {
    r.get_array("history")
        .map(|a| {
            a.iter()
                .filter_map(Bson::as_document)
                .map(|h| Entry {
                    seq: h.get_i64("seq").unwrap(),
                    epoch: h.get_i64("epoch").unwrap(),
                    gen: h.get_i64("gen").unwrap_or(0),
                    worker: h.get_str("worker").unwrap().to_string(),
                    slot: h.get_str("slot").unwrap().to_string(),
                    at: h.get_datetime("at").unwrap().timestamp_millis(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// (slot, epoch) → (worker, at) for every `kind` event.
async fn by_epoch(db: &TestDb, kind: &str) -> BTreeMap<(String, i64), (String, i64)> {
    let events: Vec<Document> = db
        .store
        .events()
        .find(doc! {"kind": kind})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    events
        .iter()
        .map(|e| {
            (
                (
                    e.get_str("slot_id").unwrap().to_string(),
                    e.get_i64("epoch").unwrap(),
                ),
                (
                    e.get_str("worker").unwrap().to_string(),
                    e.get_datetime("at").unwrap().timestamp_millis(),
                ),
            )
        })
        .collect()
}

/// Checks every robot whose spec keeps a history. Panics with the evidence.
pub async fn check(db: &TestDb) -> Report {
    let claims = by_epoch(db, "claim").await;
    let adoptions = by_epoch(db, "adopt").await;
    let mut report = Report {
        claims: claims.len(),
        ..Default::default()
    };
    for r in db.robots().await {
        let Ok(name) = r.get_str("name") else {
            continue;
        };
        let h = entries(&r);
        if h.is_empty() {
            continue;
        }
        report.robots += 1;
        report.checkpoints += h.len();
        let seq = r.get_i64("seq").unwrap();
        // A counter's own count must match; other kinds (exec robots) keep their own
        // context, and are checked for the order of their checkpoints alone.
        if r.get_str("kind") == Ok("counter") {
            let n = r.get_document("context").unwrap().get_i64("n").unwrap();
            assert_eq!(
                n, seq,
                "{name}: context.n {n} != seq {seq}: a step was lost or done twice"
            );
        }
        assert_eq!(
            h[0].seq, 1,
            "{name}: history must be complete (raise spec.history)"
        );
        assert_eq!(
            h.last().unwrap().seq,
            seq,
            "{name}: the last history entry is the current seq"
        );
        let mut owner_of: BTreeMap<(&str, i64), &str> = BTreeMap::new();
        for w in h.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            assert_eq!(b.seq, a.seq + 1, "{name}: seq jumps {} -> {}", a.seq, b.seq);
            assert!(
                b.at >= a.at,
                "{name}: time went back between seq {} and {}",
                a.seq,
                b.seq
            );
            assert!(
                b.gen >= a.gen,
                "{name}: two live copies: seq {} by generation {} came after seq {} by generation {}",
                b.seq, b.gen, a.seq, a.gen
            );
            if a.slot == b.slot {
                assert!(
                    b.epoch >= a.epoch,
                    "{name}: two live copies: seq {} under epoch {} came after seq {} under epoch {} on {}",
                    b.seq, b.epoch, a.seq, a.epoch, a.slot
                );
            }
        }
        for e in &h {
            let first = owner_of.entry((&e.slot, e.epoch)).or_insert(&e.worker);
            assert_eq!(
                *first, e.worker,
                "{name}: two workers checkpointed under {} epoch {}",
                e.slot, e.epoch
            );
            let (claimant, claimed_at) =
                claims.get(&(e.slot.clone(), e.epoch)).unwrap_or_else(|| {
                    let known: Vec<_> = claims
                        .iter()
                        .filter(|((slot, _), _)| slot == &e.slot)
                        .map(|((_, epoch), (worker, at))| (epoch, worker, at))
                        .collect();
                    panic!(
                        "{name}: checkpoint under {} epoch {} with no claim of that epoch \
                         (seq {} by {} at {}; the slot's claims, as (epoch, worker, at): {known:?})",
                        e.slot, e.epoch, e.seq, e.worker, e.at
                    )
                });
            assert_eq!(
                claimant, &e.worker,
                "{name}: seq {} written by {} under an epoch claimed by {claimant}",
                e.seq, e.worker
            );
            assert!(
                e.at >= *claimed_at,
                "{name}: seq {} landed before its epoch was claimed",
                e.seq
            );
            if let Some((_, adopted_at)) = adoptions.get(&(e.slot.clone(), e.epoch + 1)) {
                assert!(
                    e.at <= *adopted_at,
                    "{name}: stale checkpoint: seq {} under {} epoch {} landed after epoch {} adopted the robots",
                    e.seq, e.slot, e.epoch, e.epoch + 1
                );
            }
            if let Some((_, next_claim)) = claims.get(&(e.slot.clone(), e.epoch + 1)) {
                if e.at > *next_claim {
                    report.in_flight_past_claim += 1;
                }
            }
        }
    }
    report
}

/// What the firing checker saw.
#[derive(Debug, Default)]
pub struct FiringReport {
    pub robots: usize,
    /// Runs that started (each attempt once).
    pub runs: usize,
    pub lost: usize,
    pub skipped: usize,
    pub missed: usize,
    /// Firings (by time) that ran to a success.
    pub succeeded: usize,
}

fn int(d: &Document, k: &str) -> Option<i64> {
    match d.get(k) {
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Int32(v)) => Some(*v as i64),
        _ => None,
    }
}

/// Checks every scheduled robot's run record (keep `keep_runs` above the number of
/// firings a test makes, so the record is whole):
/// - no firing's attempt is recorded twice, and a firing starts again only after
///   its earlier attempt was recorded lost, stopped or failed;
/// - no two runs of one robot overlap in time (unless `overlap_allowed`);
/// - every firing of an `every` schedule from the first one recorded (or the last
///   schedule change) up to `firings.claimed` has a record (ran, skipped or
///   missed): none vanished;
/// - a counter's `n` is the number of firings (and run-now requests) that
///   succeeded: each step once.
pub async fn check_firings(db: &TestDb, overlap_allowed: bool) -> FiringReport {
    let mut report = FiringReport::default();
    for r in db.robots().await {
        let Ok(runs) = r.get_array("runs") else {
            continue;
        };
        let name = r.get_str("name").unwrap_or("?").to_string();
        report.robots += 1;
        let runs: Vec<&Document> = runs.iter().filter_map(Bson::as_document).collect();
        let mut attempts: BTreeMap<(i64, bool), Vec<(i64, String)>> = BTreeMap::new();
        let mut intervals = Vec::new();
        let mut covered: std::collections::BTreeSet<i64> = Default::default();
        let mut ranges: Vec<(i64, i64)> = Vec::new();
        let mut succeeded: std::collections::BTreeSet<(i64, bool)> = Default::default();
        for run in &runs {
            let firing = int(run, "firing").expect("a run's firing");
            let outcome = run.get_str("outcome").unwrap_or("?").to_string();
            let triggered = !matches!(run.get("by"), None | Some(Bson::Null));
            match outcome.as_str() {
                "lost" => report.lost += 1,
                "skipped" => report.skipped += 1,
                "missed" => report.missed += 1,
                _ => {}
            }
            match int(run, "last") {
                Some(last) => ranges.push((firing, last)),
                None => {
                    covered.insert(firing);
                }
            }
            let ran = int(run, "started").is_some() || outcome == "lost";
            if ran {
                let attempt = int(run, "attempt").unwrap_or(1);
                attempts
                    .entry((firing, triggered))
                    .or_default()
                    .push((attempt, outcome.clone()));
            }
            if let (Some(s), Some(e)) = (int(run, "started"), int(run, "ended")) {
                report.runs += 1;
                intervals.push((s, e, firing));
            }
            if outcome == "succeeded" {
                succeeded.insert((firing, triggered));
            }
        }
        for ((firing, _), mut list) in attempts {
            list.sort();
            for w in list.windows(2) {
                assert!(
                    w[0].0 != w[1].0,
                    "{name}: firing {firing} attempt {} recorded twice: {list:?}",
                    w[0].0
                );
                assert!(
                    w[0].1 != "succeeded",
                    "{name}: firing {firing} ran again after it succeeded: {list:?}"
                );
            }
        }
        if !overlap_allowed {
            intervals.sort();
            for w in intervals.windows(2) {
                assert!(
                    w[1].0 >= w[0].1,
                    "{name}: runs of firings {} and {} overlapped ({}..{} and {}..{})",
                    w[0].2,
                    w[1].2,
                    w[0].0,
                    w[0].1,
                    w[1].0,
                    w[1].1
                );
            }
        }
        let every_ms = r
            .get_document("spec")
            .ok()
            .and_then(|s| s.get_document("schedule").ok())
            .and_then(|s| s.get_str("every").ok())
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|n| n.parse::<i64>().ok())
            .map(|s| s * 1000);
        let claimed = r
            .get_document("firings")
            .ok()
            .and_then(|f| int(f, "claimed"));
        if let (Some(p), Some(claimed), Some(first)) =
            (every_ms, claimed, covered.iter().next().copied())
        {
            // In flight, or handed on to the next instance (`lost`): accounted for,
            // and bounded in time by `check_in_flight`.
            let running: Vec<i64> = ["running", "lost"]
                .iter()
                .filter_map(|k| r.get_document("firings").ok()?.get_array(k).ok())
                .flatten()
                .filter_map(|e| int(e.as_document()?, "firing"))
                .collect();
            // Firings before `since` follow an earlier schedule (an update).
            let since = r.get_document("firings").ok().and_then(|f| int(f, "since"));
            let mut t = match since {
                Some(s) => (s.div_euclid(p) + 1) * p,
                None => first,
            }
            .max(first.div_euclid(p) * p);
            while t <= claimed {
                let recorded = covered.contains(&t)
                    || ranges.iter().any(|(a, b)| *a <= t && t <= *b)
                    || running.contains(&t);
                assert!(
                    recorded,
                    "{name}: firing {t} has no record (claimed up to {claimed})"
                );
                t += p;
            }
        }
        if r.get_str("kind") == Ok("counter") {
            // One step per firing that succeeded, and one more only for the firing
            // the context says it stepped last when that run is still open in this
            // same read (its step landed, its end not written yet, or cut off and
            // waiting for the retry that finds the step and takes no other).
            let context = r.get_document("context").unwrap();
            let n = int(context, "n").unwrap_or(0) as usize;
            let open: Vec<i64> = ["running", "lost"]
                .iter()
                .filter_map(|k| r.get_document("firings").ok()?.get_array(k).ok())
                .flatten()
                .filter_map(|e| int(e.as_document()?, "firing"))
                .collect();
            let stepped_open = int(context, "firing")
                .is_some_and(|f| open.contains(&f) && !succeeded.iter().any(|(s, _)| *s == f));
            assert_eq!(
                n,
                succeeded.len() + usize::from(stepped_open),
                "{name}: context.n {n} against {} firings that succeeded (last stepped {:?}, open {open:?})",
                succeeded.len(),
                int(context, "firing")
            );
        }
        report.succeeded += succeeded.len();
    }
    report
}

/// How long past its catch-up window a claimed firing may stay in flight without
/// starting, at most, as the planner bounds it (`firing_plan::too_late_to_start`):
/// a claim may land up to a minute past the window (a slow write) and its run may
/// start up to a minute after it landed; then it is recorded missed. Plus a few
/// ticks for the write that settles it.
pub const IN_FLIGHT_PAST_WINDOW: std::time::Duration = std::time::Duration::from_secs(125);

/// Every entry in a scheduled robot's `firings.running` or `firings.lost` (claimed,
/// or handed on, and not yet recorded) older than its catch-up window
/// (`spec.schedule.catchup`, 10 minutes by default) plus [`IN_FLIGHT_PAST_WINDOW`]
/// plus `longest_run` (a run that started stays in `running` until it ends), on the
/// server's clock, each said in a line; and how many entries were looked at.
pub async fn in_flight_too_long(
    db: &TestDb,
    longest_run: std::time::Duration,
) -> (usize, Vec<String>) {
    let hello = db
        .store
        .db()
        .run_command(doc! {"hello": 1})
        .await
        .expect("hello");
    let now = hello
        .get_datetime("localTime")
        .expect("the server's localTime")
        .timestamp_millis();
    let (mut seen, mut late) = (0, Vec::new());
    for r in db.robots().await {
        let name = r.get_str("name").unwrap_or("?").to_string();
        let Ok(firings) = r.get_document("firings") else {
            continue;
        };
        let catchup = r
            .get_document("spec")
            .ok()
            .and_then(|s| s.get_document("schedule").ok())
            .and_then(|s| s.get_str("catchup").ok())
            .map(|c| humantime::parse_duration(c).expect("a valid catchup"))
            .unwrap_or(std::time::Duration::from_secs(600));
        let bound = (catchup + IN_FLIGHT_PAST_WINDOW + longest_run).as_millis() as i64;
        for key in ["running", "lost"] {
            for e in firings
                .get_array(key)
                .map(|a| a.iter().filter_map(Bson::as_document).collect::<Vec<_>>())
                .unwrap_or_default()
            {
                let Some(firing) = int(e, "firing") else {
                    continue;
                };
                seen += 1;
                if now - firing > bound {
                    late.push(format!(
                        "{name} (epoch {:?}, gen {:?}): firing {firing} still in `firings.{key}` {} ms after its time, past its window and the planner's bound ({bound} ms): {e}",
                        int(&r, "epoch"),
                        int(&r, "gen"),
                        now - firing
                    ));
                }
            }
        }
    }
    (seen, late)
}

/// Checks that nothing stays in flight past the planner's bound
/// ([`in_flight_too_long`]); returns how many entries it looked at.
pub async fn check_in_flight(db: &TestDb, longest_run: std::time::Duration) -> usize {
    let (seen, late) = in_flight_too_long(db, longest_run).await;
    assert!(late.is_empty(), "{}", late.join("\n"));
    seen
}
