//! A scheduled robot's next step: pure, on its stored firing state, its schedule and
//! what its instance knows (the server's time, which of its runs have started, whose
//! leases are over). No I/O: the runner carries each step out, one write at a time.
//!
//! The rules apply in a fixed order, each a function below. Nothing starts while
//! another instance's run may still hold its lease (no firing twice at once), and
//! claimed runs start before missed firings are recorded, so a slow holder still
//! starts runs. See docs/internals.md, "A scheduled robot's next step".

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use bson::oid::ObjectId;

use crate::db::firing::{FiringState, Outcome, RunEntry, RunRecord, Trigger};
use crate::robot::schedule::{Missed, OnLost, Overlap, Owed, Schedule};

/// How far ahead of its time a firing is claimed: a minute, so that even 10,000
/// robots firing at one minute's edge are claimed over the minute before it.
pub(crate) const LEAD_MS: i64 = 60_000;
/// How far the server's clock, as a holder estimates it, may run ahead of the
/// server's own: a run starts when the estimate reaches its firing, so one that a
/// lease ending at `t` could have started has a firing before `t + DRIFT_MS`. An
/// estimate is ahead by at most half its reading's round trip (readings slower
/// than a second are not taken) and the local clock's drift since (milliseconds);
/// a second covers that, and a backward step of the server's clock of up to half a
/// second. A larger backward step can make a firing that ran just before
/// a takeover run once more after it, never beside itself: the earlier holder
/// stopped it with its lease.
pub(crate) const DRIFT_MS: i64 = 1000;
/// Why a write claims the next firing ahead of its time (a run's end merges it, see
/// [`end_write`]).
const CLAIM_AHEAD: &str = "the next firing, claimed ahead";

/// How long after its claim landed a run claimed within its window may still
/// start (see [`too_late_to_start`]): longer than a write may stay in doubt (30 s).
const START_SLACK_MS: i64 = 60_000;

/// Due firings looked at in one step.
const DUE_LIMIT: usize = 1000;

/// The instance planning.
#[derive(Debug, Clone)]
pub(crate) struct Me {
    pub(crate) slot: String,
    pub(crate) epoch: i64,
    pub(crate) gen: i64,
    pub(crate) worker: String,
}

/// What the instance knows beside the stored state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Facts {
    /// The server's time, estimated.
    pub(crate) now_ms: i64,
    /// The server's time at this holder's claim of the slot, read no earlier than
    /// the claim landed: every earlier holder's lease was over by then. None when
    /// not known (every run of theirs then counts as possibly started).
    pub(crate) lease_began_ms: Option<i64>,
    /// The epoch each other slot named by a run in flight holds now (absent: the
    /// slot is gone, or was not read).
    pub(crate) slot_epochs: HashMap<String, i64>,
    /// Slots seen gone for longer than a lease: whatever ran under them stopped.
    /// A slot only just deleted may still have a holder finishing its stop.
    pub(crate) gone: HashSet<String>,
    /// When the robot was created (server milliseconds): no firing before it is
    /// owed, when its state says nothing of where firings start.
    pub(crate) created_ms: Option<i64>,
    /// When an update was last applied to the robot (server milliseconds): a robot
    /// that gets its first schedule from an update owes firings from then on.
    pub(crate) updated_ms: Option<i64>,
    /// The robot was paused: its holder is about to stop this instance, which
    /// starts and settles nothing meanwhile (the next instance, after the resume,
    /// records the pause's firings).
    pub(crate) paused: bool,
    /// This instance's runs whose process started.
    pub(crate) started: HashSet<ObjectId>,
    /// This instance's runs it already asked to stop.
    pub(crate) stopping: HashSet<ObjectId>,
    /// Runs that wait out a restart backoff: not started before these times.
    pub(crate) not_before: HashMap<ObjectId, i64>,
    /// Runs whose start did not happen (their lease was not open), tried again no
    /// sooner than these times. Not a backoff: the run stays held to its window.
    pub(crate) start_again_at: HashMap<ObjectId, i64>,
    /// When this instance's write that put each run in flight landed (the server's
    /// time, estimated): a run claimed within its window may start a little past it
    /// (see [`too_late_to_start`]).
    pub(crate) claimed_at: HashMap<ObjectId, i64>,
}

/// What to do next.
// One step lives at a time, and is carried out at once: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Write the state (a compare-and-set on `rev`), appending `records`;
    /// `claiming` is the scheduled firing this write claims.
    Write {
        next: FiringState,
        records: Vec<RunRecord>,
        claiming: Option<i64>,
        why: &'static str,
    },
    /// Start these runs of this instance now.
    Start(Vec<RunEntry>),
    /// Stop these runs of this instance (`cancel_other`).
    Cancel(Vec<ObjectId>),
    /// Nothing to do until this server time (None: until a run ends or the robot's
    /// document changes); `poll`: read the document again meanwhile, since another
    /// instance's run must end first and nothing tells this one when it does.
    Wait { until_ms: Option<i64>, poll: bool },
}

impl Me {
    fn owns(&self, e: &RunEntry) -> bool {
        e.slot == self.slot && e.epoch == self.epoch && e.gen == self.gen
    }

    fn entry(&self, firing: i64, attempt: i64, trigger: Option<&Trigger>) -> RunEntry {
        RunEntry {
            id: ObjectId::new(),
            firing,
            attempt,
            trigger: trigger.map(|t| t.id),
            by: trigger.map(|t| t.by.clone()),
            worker: self.worker.clone(),
            slot: self.slot.clone(),
            epoch: self.epoch,
            gen: self.gen,
            not_started: false,
        }
    }

    fn record(&self, firing: i64, outcome: Outcome, reason: &str) -> RunRecord {
        RunRecord {
            firing,
            attempt: 1,
            outcome: Some(outcome),
            reason: Some(reason.to_string()),
            worker: self.worker.clone(),
            slot: self.slot.clone(),
            epoch: self.epoch,
            ..RunRecord::default()
        }
    }

    /// One record for a span of firings.
    fn record_span(&self, m: &Missed, outcome: Outcome, reason: &str) -> RunRecord {
        let mut r = self.record(m.first, outcome, reason);
        if m.count > 1 {
            r.count = Some(m.count as i64);
            r.last = Some(m.last);
        }
        r
    }

    /// One record for firings `first ..= last` (`count` of them).
    fn records_many(&self, firings: &[i64], outcome: Outcome, reason: &str) -> RunRecord {
        let mut r = self.record(firings[0], outcome, reason);
        if firings.len() > 1 {
            r.count = Some(firings.len() as i64);
            r.last = firings.last().copied();
        }
        r
    }
}

/// Whether another instance's run may still be going.
#[derive(Debug, PartialEq, Eq)]
enum Theirs {
    /// Its lease may still hold: wait for it to record the end.
    Live,
    /// Its lease is over and it could not have started.
    NeverStarted,
    /// Its lease is over; it may have started, and was stopped with it.
    Lost,
    /// An earlier instance of this robot under this very lease (an earlier
    /// generation: an update, a restart, an early start undone) left it: that
    /// instance has exited, since a slot starts a robot's next instance only once
    /// the last one is gone (`plan_sync`). It may have started. Left so when the
    /// instance stopped while the lease was suspended, and nobody else would ever
    /// settle it: a later holder would, but the lease resumed.
    Exited,
}

fn judge(e: &RunEntry, me: &Me, f: &Facts) -> Theirs {
    if e.slot == me.slot && e.epoch == me.epoch && e.gen < me.gen {
        return Theirs::Exited;
    }
    let over = if e.slot == me.slot {
        e.epoch < me.epoch
    } else {
        match f.slot_epochs.get(&e.slot) {
            Some(now) => *now > e.epoch,
            None => f.gone.contains(&e.slot),
        }
    };
    if !over {
        return Theirs::Live;
    }
    // Only a takeover of this slot tells when the earlier lease ended; a run of
    // another slot's ended lease counts as possibly started.
    let began = (e.slot == me.slot).then_some(f.lease_began_ms).flatten();
    match began {
        Some(b) if e.firing > b + DRIFT_MS => Theirs::NeverStarted,
        _ => Theirs::Lost,
    }
}

/// The next step for `me`, with `st` as stored: the first rule, in the order the
/// module's documentation gives, that has something to do.
pub(crate) fn plan(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Step {
    match next_step(s, st, me, f) {
        Planned::Step(step) => step,
        Planned::Ahead { next, firing } => Step::Write {
            next,
            records: vec![],
            claiming: Some(firing),
            why: CLAIM_AHEAD,
        },
    }
}

/// The plan's step, with rule 10's claim ahead told apart from every other write
/// (a run's end merges it, see [`end_write`]).
enum Planned {
    Step(Step),
    /// Claim the next firing, `firing`, ahead of its time.
    Ahead {
        next: FiringState,
        firing: i64,
    },
}

fn next_step(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Planned {
    if f.paused {
        return Planned::Step(idle());
    }
    if let Some(step) = others_run(s, st, me, f) {
        return Planned::Step(step);
    }
    let st = with_first_schedule(s, st, f);
    if let Some(step) = schedule_changed(s, &st, me, f) {
        return Planned::Step(step);
    }
    let p = Plan::new(s, &st, me, f);
    let rules: [fn(&Plan) -> Option<Step>; 6] = [
        |p| p.cut_off_run(),
        |p| p.pause(),
        |p| p.stale_claims(),
        |p| p.claimed_due(),
        |p| p.run_now(),
        |p| p.catch_up(),
    ];
    match rules.iter().find_map(|rule| rule(&p)) {
        Some(step) => Planned::Step(step),
        None => p.ahead_or_wait(),
    }
}

/// Nothing to do until a run ends or the robot's document changes.
fn idle() -> Step {
    Step::Wait {
        until_ms: None,
        poll: false,
    }
}

/// A write that claims no scheduled firing.
fn write(next: FiringState, records: Vec<RunRecord>, why: &'static str) -> Step {
    Step::Write {
        next,
        records,
        claiming: None,
        why,
    }
}

/// Rule 1: a run of another instance is waited for, taken over, or settled lost.
fn others_run(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Option<Step> {
    let (i, e) = st.running.iter().enumerate().find(|(_, e)| !me.owns(e))?;
    let mut next = st.clone();
    match judge(e, me, f) {
        Theirs::Live => Some(Step::Wait {
            until_ms: None,
            poll: true,
        }),
        Theirs::NeverStarted => {
            next.running[i] = me.entry(e.firing, e.attempt, None);
            next.running[i].trigger = e.trigger;
            next.running[i].by = e.by.clone();
            Some(write(
                next,
                vec![],
                "took over a firing an earlier holder claimed and never started",
            ))
        }
        theirs @ (Theirs::Lost | Theirs::Exited) => {
            next.running.remove(i);
            let why = if theirs == Theirs::Exited {
                format!(
                    "in flight on {} (slot {}, epoch {}) when that instance (generation {}) stopped",
                    e.worker, e.slot, e.epoch, e.gen
                )
            } else {
                format!(
                    "in flight on {} (slot {}, epoch {}) when that lease ended",
                    e.worker, e.slot, e.epoch
                )
            };
            let mut lost = me.record(e.firing, Outcome::Lost, &why);
            lost.attempt = e.attempt;
            lost.worker = e.worker.clone();
            lost.slot = e.slot.clone();
            lost.epoch = e.epoch;
            lost.by = e.by.clone();
            let mut records = vec![lost];
            retry_or_settle(
                s,
                e,
                me,
                f,
                "its run was lost and on_lost is skip",
                &mut next,
                &mut records,
            );
            Some(write(next, records, "a run lost with its lease"))
        }
    }
}

/// Rule 2a: a robot's first schedule owes firings from its creation (or the update
/// that gave it one). That does not move, so it is written with the first step that
/// writes anything (the first claim, as a rule) rather than in a write of its own:
/// adopting many new scheduled robots then costs half the writes.
fn with_first_schedule<'a>(s: &Schedule, st: &'a FiringState, f: &Facts) -> Cow<'a, FiringState> {
    let Some(since) = st.since.or(origin(f)).filter(|_| st.schedule.is_none()) else {
        return Cow::Borrowed(st);
    };
    let mut first = st.clone();
    first.since = Some(since);
    first.schedule = Some(s.describe());
    first.schedule_spec = Some(s.source.clone());
    Cow::Owned(first)
}

/// Where a first schedule's firings start: the robot's creation, or the update that
/// gave it this schedule, whichever came last.
fn origin(f: &Facts) -> Option<i64> {
    match (f.created_ms, f.updated_ms) {
        (Some(c), Some(u)) => Some(c.max(u)),
        (c, u) => c.or(u),
    }
}

/// Rule 2b: a schedule that changed owes firings from the change on; the old one's
/// firings that were due and had not run are recorded, not dropped.
fn schedule_changed(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Option<Step> {
    let words = s.describe();
    if st.schedule.as_deref() == Some(words.as_str()) {
        return None;
    }
    let now = f.now_ms;
    let mut next = st.clone();
    let mut records = vec![];
    next.since = match &st.schedule {
        None => st.since.or(origin(f)).or(Some(now)),
        Some(old) => {
            let from = st.settled_until().unwrap_or(now);
            let old_schedule = st.schedule_spec.as_ref().and_then(|spec| {
                Schedule::from_spec(&bson::doc! {"schedule": spec.clone()}, now)
                    .ok()
                    .flatten()
            });
            if let Some(m) = old_schedule.and_then(|o| o.span(from, now)) {
                let why = format!("the schedule changed from {old} before it ran");
                records.push(me.record_span(&m, Outcome::Skipped, &why));
            }
            Some(now)
        }
    };
    next.schedule = Some(words);
    next.schedule_spec = Some(s.source.clone());
    Some(write(next, records, "the schedule these firings follow"))
}

/// What every later rule looks at: the state, and what follows from it at `now`.
struct Plan<'a> {
    s: &'a Schedule,
    st: &'a FiringState,
    me: &'a Me,
    f: &'a Facts,
    now: i64,
    /// This instance's runs whose process started.
    started: Vec<&'a RunEntry>,
    /// Runs claimed and not started yet (every run is this instance's by now).
    pending: Vec<&'a RunEntry>,
    /// Where firings owed start.
    from: i64,
    owed: Owed,
}

impl<'a> Plan<'a> {
    fn new(s: &'a Schedule, st: &'a FiringState, me: &'a Me, f: &'a Facts) -> Plan<'a> {
        let now = f.now_ms;
        let (started, pending) = st.running.iter().partition(|e| f.started.contains(&e.id));
        let from = st.settled_until().or(f.created_ms).unwrap_or(now);
        Plan {
            owed: s.owed(from, now, DUE_LIMIT),
            s,
            st,
            me,
            f,
            now,
            started,
            pending,
            from,
        }
    }

    fn busy(&self) -> bool {
        !self.started.is_empty()
    }

    /// When a claimed run may start: its firing, or the end of its restart backoff,
    /// or the next try of a start that did not happen.
    fn due_at(&self, e: &RunEntry) -> i64 {
        let after = |m: &HashMap<ObjectId, i64>| m.get(&e.id).copied().unwrap_or(i64::MIN);
        e.firing
            .max(after(&self.f.not_before))
            .max(after(&self.f.start_again_at))
    }

    /// Stop this instance's runs in flight (`cancel_other`), those not asked already.
    fn cancel_started(&self) -> Step {
        let ids: Vec<ObjectId> = self
            .started
            .iter()
            .map(|e| e.id)
            .filter(|id| !self.f.stopping.contains(id))
            .collect();
        if ids.is_empty() {
            idle()
        } else {
            Step::Cancel(ids)
        }
    }

    /// Rule 3: a run a stop cut off is retried or skipped, once no run is in flight
    /// (a pause's are skipped with it, by rule 4). A run whose instance stopped
    /// before it started is claimed again as the same attempt, whatever `on_lost`
    /// says: it never ran.
    fn cut_off_run(&self) -> Option<Step> {
        let e = self
            .st
            .lost
            .first()
            .filter(|_| self.st.paused_at.is_none())?;
        if self.busy() && self.s.overlap != Overlap::Allow {
            return None;
        }
        let mut next = self.st.clone();
        next.lost.remove(0);
        let mut records = vec![];
        if e.not_started {
            if outside_window(self.s, e, self.f.now_ms) {
                next.missed += 1;
                records.push(never_started_too_late(self.s, e, self.me));
            } else {
                let mut again = self.me.entry(e.firing, e.attempt, None);
                again.trigger = e.trigger;
                again.by = e.by.clone();
                next.running.push(again);
            }
            return Some(write(next, records, "a claim handed on before it started"));
        }
        let why = "its run was cut off by a stop and on_lost is skip";
        retry_or_settle(self.s, e, self.me, self.f, why, &mut next, &mut records);
        Some(write(next, records, "a run a stop cut off"))
    }

    /// Rule 4: the firings that fell during a pause, or still waited when it came,
    /// and the runs it cut off, are skipped.
    fn pause(&self) -> Option<Step> {
        self.st.paused_at?;
        let mut next = self.st.clone();
        next.paused_at = None;
        let mut records = vec![];
        for e in std::mem::take(&mut next.lost) {
            let why = if e.not_started {
                "paused before it started"
            } else {
                "paused while it ran"
            };
            let mut r = self.me.record(e.firing, Outcome::Skipped, why);
            r.attempt = e.attempt;
            r.by = e.by.clone();
            records.push(r);
        }
        if let Some(m) = self.s.span(self.from, self.now) {
            next.claimed = Some(m.last);
            records.push(self.me.record_span(&m, Outcome::Skipped, "paused"));
        }
        Some(write(next, records, "the firings of a pause"))
    }

    /// Rule 5: a claimed run too late to start (see [`too_late_to_start`]: it
    /// waited, or the server's clock stepped forward) is recorded missed, never
    /// started late.
    fn stale_claims(&self) -> Option<Step> {
        let stale: Vec<&RunEntry> = self
            .pending
            .iter()
            .copied()
            .filter(|e| too_late_to_start(self.s, e, self.f))
            .collect();
        if stale.is_empty() {
            return None;
        }
        let mut next = self.st.clone();
        next.running.retain(|r| !stale.iter().any(|e| e.id == r.id));
        next.missed += stale.len() as i64;
        let records = stale
            .iter()
            .map(|e| never_started_too_late(self.s, e, self.me))
            .collect();
        Some(write(next, records, "claimed firings past their window"))
    }

    /// Rule 6: a claimed run whose time came starts, unless a run is in flight:
    /// then the overlap policy decides. It goes before the missed firings are
    /// recorded, so that firings falling out of the window one after another never
    /// keep a claimed run from starting.
    fn claimed_due(&self) -> Option<Step> {
        let ready: Vec<RunEntry> = self
            .pending
            .iter()
            .filter(|e| self.due_at(e) <= self.now)
            .map(|e| (*e).clone())
            .collect();
        let first = ready.first()?;
        if self.s.overlap == Overlap::Allow {
            return Some(Step::Start(ready));
        }
        if !self.busy() {
            // One at a time: the next one meets this one's overlap policy.
            return Some(Step::Start(vec![first.clone()]));
        }
        match self.s.overlap {
            Overlap::Skip => {
                let mut next = self.st.clone();
                next.running.retain(|r| r.id != first.id);
                let mut r = self.me.record(
                    first.firing,
                    Outcome::Skipped,
                    "overlap: a run was still in flight",
                );
                r.attempt = first.attempt;
                r.by = first.by.clone();
                Some(write(next, vec![r], "a firing that overlapped"))
            }
            Overlap::CancelOther => Some(self.cancel_started()),
            // Waits for the run in flight to end.
            Overlap::BufferOne | Overlap::BufferAll | Overlap::Allow => None,
        }
    }

    /// Rule 7: a run-now request, under the overlap policy (a firing claimed ahead
    /// and not due yet is no run in flight).
    fn run_now(&self) -> Option<Step> {
        let t = self.st.triggers.first()?;
        let mut next = self.st.clone();
        if !self.busy() || self.s.overlap == Overlap::Allow {
            next.triggers.remove(0);
            next.running.push(self.me.entry(self.now, 1, Some(t)));
            return Some(write(next, vec![], "a run-now request"));
        }
        match self.s.overlap {
            Overlap::Skip => {
                next.triggers.remove(0);
                let mut r = self.me.record(
                    self.now,
                    Outcome::Skipped,
                    "overlap: a run was still in flight",
                );
                r.by = Some(t.by.clone());
                Some(write(next, vec![r], "a run-now request that overlapped"))
            }
            Overlap::CancelOther => Some(self.cancel_started()),
            _ => None,
        }
    }

    /// Rule 8: firings older than the catch-up window are recorded missed, in one
    /// record with their count, in the same write as the late firings' claim
    /// (rule 9). Written apart, a step slower than the schedule's period would find
    /// another firing missed every time, and never claim one.
    fn catch_up(&self) -> Option<Step> {
        let late = self.late_firings();
        let Some(m) = self.owed.missed else {
            return late;
        };
        let why = format!(
            "due outside the catch-up window ({}){}",
            humantime::format_duration(self.s.catchup),
            if m.at_least {
                "; at least this many"
            } else {
                ""
            }
        );
        let record = self.me.record_span(&m, Outcome::Missed, &why);
        match late {
            Some(Step::Write {
                mut next,
                mut records,
                claiming,
                why,
            }) => {
                next.missed += m.count as i64;
                records.insert(0, record);
                Some(Step::Write {
                    next,
                    records,
                    claiming,
                    why,
                })
            }
            // A cancel first: the run it stops ends, and the claim then goes with
            // the record.
            Some(other) => Some(other),
            None => {
                let mut next = self.st.clone();
                next.claimed = Some(m.last);
                next.missed += m.count as i64;
                Some(write(next, vec![record], "firings missed"))
            }
        }
    }

    /// Rule 9: firings due now, late (after a takeover, a pause or a catch-up), run
    /// as if each overlapped the one before. Called by rule 8.
    fn late_firings(&self) -> Option<Step> {
        let due = self.owed.due.as_slice();
        if due.is_empty() {
            return None;
        }
        let in_flight = self.busy() || !self.pending.is_empty();
        match (in_flight, self.s.overlap) {
            (_, Overlap::Allow) => Some(self.claim_late(due, due, &[], "")),
            (false, Overlap::CancelOther) => {
                let (older, newest) = due.split_at(due.len() - 1);
                let why = "overlap: a newer firing was due too";
                Some(self.claim_late(due, newest, older, why))
            }
            (false, overlap) => {
                // The oldest runs; under `buffer_one` the newest waits, and those
                // between are skipped; under `skip`, every other one is.
                let skipped: &[i64] = match overlap {
                    Overlap::Skip => &due[1..],
                    Overlap::BufferOne if due.len() > 2 => &due[1..due.len() - 1],
                    _ => &[],
                };
                let why = "overlap: caught up after another firing";
                Some(self.claim_late(due, &due[..1], skipped, why))
            }
            (true, Overlap::Skip) => {
                let why = "overlap: a run was still in flight";
                Some(self.claim_late(due, &[], due, why))
            }
            (true, Overlap::BufferOne) if due.len() > 1 => {
                let why = "overlap: a newer firing waits in its place";
                Some(self.claim_late(due, &[], &due[..due.len() - 1], why))
            }
            (true, Overlap::CancelOther) if self.busy() => Some(self.cancel_started()),
            // Waiting for the run in flight to end.
            (true, _) => None,
        }
    }

    /// The write for late firings: `runs` are claimed to run, `skipped` are recorded
    /// skipped for `why`, and `claimed` moves past the last firing settled.
    fn claim_late(&self, due: &[i64], runs: &[i64], skipped: &[i64], why: &str) -> Step {
        let mut next = self.st.clone();
        for &t in runs {
            next.running.push(self.me.entry(t, 1, None));
        }
        let settled = runs.iter().chain(skipped).copied().max();
        next.claimed = settled.or(next.claimed);
        let mut records = vec![];
        if !skipped.is_empty() {
            records.push(self.me.records_many(skipped, Outcome::Skipped, why));
        }
        let why = match (runs.len(), skipped.is_empty()) {
            (0, _) => "firings that overlapped",
            (1, _) => "a firing due",
            _ => "firings due",
        };
        Step::Write {
            next,
            records,
            claiming: Some(due[0]),
            why,
        }
    }

    /// Rule 10: the next firing is claimed ahead of its time when no run is in
    /// flight; otherwise, wait for the first thing that can change the plan.
    fn ahead_or_wait(&self) -> Planned {
        let first_pending = self.pending.iter().map(|e| self.due_at(e)).min();
        let Some(n) = self.owed.next else {
            return Planned::Step(Step::Wait {
                until_ms: first_pending,
                poll: false,
            });
        };
        let free = (!self.busy() && self.pending.is_empty()) || self.s.overlap == Overlap::Allow;
        let claimed_already = self.st.claimed.is_some_and(|c| c >= n);
        if !free || claimed_already || !self.owed.due.is_empty() {
            return Planned::Step(Step::Wait {
                until_ms: Some(first_pending.map_or(n, |p| p.min(n))),
                poll: false,
            });
        }
        if n - self.now > LEAD_MS {
            return Planned::Step(Step::Wait {
                until_ms: Some(n - LEAD_MS),
                poll: false,
            });
        }
        let mut next = self.st.clone();
        next.running.push(self.me.entry(n, 1, None));
        next.claimed = Some(n);
        next.next = self.s.next_after(n);
        Planned::Ahead { next, firing: n }
    }
}

/// Whether a run's firing is older than the catch-up window (a run-now request has
/// no window).
fn outside_window(s: &Schedule, e: &RunEntry, now: i64) -> bool {
    e.trigger.is_none() && e.firing < now - s.catchup.as_millis() as i64
}

/// Whether a claimed run is too late to start. A firing's window is judged when it
/// is claimed: a run this instance claimed within its window (or a restart after a
/// failure) may still start for [`START_SLACK_MS`] after its claim landed (or its
/// backoff ended), so that a slow write never makes the run it claimed miss,
/// whatever the window. Any other run (one that waited for a run in flight, one
/// taken over, one claimed ahead before a forward step of the server's clock) is
/// held to its window.
fn too_late_to_start(s: &Schedule, e: &RunEntry, f: &Facts) -> bool {
    if !outside_window(s, e, f.now_ms) {
        return false;
    }
    let window = s.catchup.as_millis() as i64;
    let backoff = f.not_before.get(&e.id).copied();
    let Some(claimed) = f.claimed_at.get(&e.id).copied() else {
        return true;
    };
    // Its write may have landed up to the slack after the claim was made.
    let claimed_in_time = e.firing >= claimed - window - START_SLACK_MS || backoff.is_some();
    let since = f.now_ms - claimed.max(backoff.unwrap_or(i64::MIN));
    !(claimed_in_time && since <= START_SLACK_MS)
}

/// The record of claimed run `e`, never started and now too late for its window.
fn never_started_too_late(s: &Schedule, e: &RunEntry, me: &Me) -> RunRecord {
    let why = format!(
        "claimed, but never started: too late for the catch-up window ({})",
        humantime::format_duration(s.catchup)
    );
    let mut r = me.record(e.firing, Outcome::Missed, &why);
    r.attempt = e.attempt;
    r.by = e.by.clone();
    r
}

/// A run that did not finish: its retry goes into `next`, or its record (skipped,
/// or missed past the window) into `records`.
fn retry_or_settle(
    s: &Schedule,
    e: &RunEntry,
    me: &Me,
    f: &Facts,
    skip_why: &str,
    next: &mut FiringState,
    records: &mut Vec<RunRecord>,
) {
    match not_retried(s, e, me, f, skip_why) {
        Some(r) => {
            next.missed += i64::from(r.outcome == Some(Outcome::Missed));
            records.push(r);
        }
        None => next.running.push(retry_of(e, me)),
    }
}

/// The next attempt of a run that did not finish.
fn retry_of(e: &RunEntry, me: &Me) -> RunEntry {
    let mut retry = me.entry(e.firing, e.attempt + 1, None);
    retry.trigger = e.trigger;
    retry.by = e.by.clone();
    retry
}

/// Why a run that did not finish is not tried again, as its record: `on_lost` is
/// `skip`, or its firing is older than the catch-up window (a run-now request has
/// no window). None: retry it.
fn not_retried(
    s: &Schedule,
    e: &RunEntry,
    me: &Me,
    f: &Facts,
    skip_why: &str,
) -> Option<RunRecord> {
    let late = outside_window(s, e, f.now_ms);
    let (outcome, why) = match (s.on_lost, late) {
        (OnLost::Skip, _) => (Outcome::Skipped, skip_why.to_string()),
        (OnLost::Retry, true) => (
            Outcome::Missed,
            format!(
                "its run did not finish, and a retry now would be outside the catch-up window ({})",
                humantime::format_duration(s.catchup)
            ),
        ),
        (OnLost::Retry, false) => return None,
    };
    let mut r = me.record(e.firing, outcome, &why);
    r.attempt = e.attempt;
    r.by = e.by.clone();
    Some(r)
}

/// How one run of this instance ended.
#[derive(Debug, Clone)]
pub(crate) struct RunEnd {
    pub(crate) id: ObjectId,
    pub(crate) outcome: Outcome,
    pub(crate) reason: Option<String>,
    /// When its process started, on the server's clock as estimated.
    pub(crate) started_ms: Option<i64>,
    pub(crate) ended_ms: i64,
    /// The run stays in flight as the next attempt (restart on failure).
    pub(crate) retry: bool,
}

/// The state after a run of this instance ended, and its record; None when the run
/// is not in flight.
pub(crate) fn ended(st: &FiringState, me: &Me, end: RunEnd) -> Option<(FiringState, RunRecord)> {
    let RunEnd {
        id,
        outcome,
        reason,
        started_ms,
        ended_ms,
        retry,
    } = end;
    let e = st.running.iter().find(|e| e.id == id)?.clone();
    let mut next = st.clone();
    next.running.retain(|r| r.id != id);
    if retry {
        let mut again = me.entry(e.firing, e.attempt + 1, None);
        again.trigger = e.trigger;
        again.by = e.by.clone();
        next.running.push(again);
    }
    let record = RunRecord {
        firing: e.firing,
        attempt: e.attempt,
        outcome: Some(outcome),
        reason,
        started: started_ms,
        ended: Some(ended_ms),
        lateness_ms: started_ms.map(|s| (s - e.firing).max(0)),
        worker: me.worker.clone(),
        slot: me.slot.clone(),
        epoch: me.epoch,
        by: e.by.clone(),
        count: None,
        last: None,
    };
    Some((next, record))
}

/// The one write that records a run's end: its record, the firing's next attempt
/// when the end asks for a retry, and the next firing's claim too when that is what
/// the plan after the end would do (rule 10), so that one write does both, at a
/// minute's edge for every robot at once. `facts` None (the server's time not
/// known, or the instance stopping): the end alone.
#[derive(Debug, Clone)]
pub(crate) struct EndWrite {
    pub(crate) next: FiringState,
    pub(crate) records: Vec<RunRecord>,
    pub(crate) claiming: Option<i64>,
}

/// See [`EndWrite`]; None when the run is not in flight (already recorded).
pub(crate) fn end_write(
    s: &Schedule,
    st: &FiringState,
    me: &Me,
    end: RunEnd,
    facts: Option<&Facts>,
) -> Option<EndWrite> {
    let (next, record) = ended(st, me, end)?;
    let ahead = facts.map(|f| next_step(s, &next, me, f));
    Some(match ahead {
        Some(Planned::Ahead { next, firing }) => EndWrite {
            next,
            records: vec![record],
            claiming: Some(firing),
        },
        _ => EndWrite {
            next,
            records: vec![record],
            claiming: None,
        },
    })
}

/// How often a run's end with its last step may match nothing while the robot reads
/// unchanged before the step is dropped (see [`step_missed`]).
const UNEXPLAINED_MISSES: u32 = 3;

/// What to do about a run's end written with its last step (a checkpoint after
/// `after_seq`) that matched nothing, once the robot was read again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StepMissed {
    /// Write the same again.
    Again,
    /// The step can never land: write the end without it, as `outcome` for `why`,
    /// with the firing's next attempt in flight when `retry`.
    Drop {
        outcome: Outcome,
        why: String,
        retry: bool,
    },
}

/// The rule for a run's last step that matched nothing: `stored_seq` is the
/// robot's `seq` as read again, `unchanged` whether the robot read unchanged since
/// the write was tried, `unexplained` how many such misses came before. Returns
/// what to do, and the misses counted so far.
///
/// - The seq moved: another run of the robot checkpointed first (`overlap:
///   allow`), or a hand edit. This step can never land; the firing is handed on as
///   a run cut off, to be retried or skipped as `on_lost` says.
/// - It matched nothing, yet the robot reads unchanged (an unreadable `seq` reads
///   as 0): tried again, but not for ever.
pub(crate) fn step_missed(
    s: &Schedule,
    after_seq: i64,
    stored_seq: Option<i64>,
    unchanged: bool,
    unexplained: u32,
) -> (StepMissed, u32) {
    if stored_seq != Some(after_seq) {
        let why = format!(
            "its last step did not land: the robot's seq moved from {after_seq} to {} (another run of it checkpointed first?)",
            stored_seq.map_or("something unreadable".to_string(), |q| q.to_string()),
        );
        let retry = s.on_lost == OnLost::Retry;
        return (
            StepMissed::Drop {
                outcome: Outcome::Stopped,
                why,
                retry,
            },
            unexplained,
        );
    }
    if !unchanged {
        return (StepMissed::Again, unexplained);
    }
    let unexplained = unexplained + 1;
    if unexplained < UNEXPLAINED_MISSES {
        return (StepMissed::Again, unexplained);
    }
    let why = "its last step matched nothing three times although the robot read unchanged (is its seq a whole number?)".to_string();
    (
        StepMissed::Drop {
            outcome: Outcome::Failed,
            why,
            retry: false,
        },
        unexplained,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    const MIN: i64 = 60_000;
    /// 2026-01-01T00:00:00Z.
    const T0: i64 = 1_767_225_600_000;

    fn me() -> Me {
        Me {
            slot: "slot-001".into(),
            epoch: 5,
            gen: 9,
            worker: "10.0.0.2:7000".into(),
        }
    }

    fn every(period: &str, overlap: &str) -> Schedule {
        Schedule::from_spec(
            &doc! {"schedule": {"every": period, "overlap": overlap}},
            T0,
        )
        .unwrap()
        .unwrap()
    }

    /// The plan for a state that already follows `s` (see the schedule-change test).
    fn planned(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Step {
        let mut st = st.clone();
        st.schedule = Some(s.describe());
        plan(s, &st, me, f)
    }

    fn facts(now: i64) -> Facts {
        Facts {
            now_ms: now,
            ..Facts::default()
        }
    }

    fn state(claimed: i64) -> FiringState {
        FiringState {
            rev: Some(1),
            since: Some(T0 - 10 * MIN),
            claimed: Some(claimed),
            ..FiringState::default()
        }
    }

    fn written(step: Step) -> (FiringState, Vec<RunRecord>, Option<i64>) {
        match step {
            Step::Write {
                next,
                records,
                claiming,
                ..
            } => (next, records, claiming),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn the_next_firing_is_claimed_ahead_then_started_at_its_time() {
        let s = every("1m", "skip");
        let st = state(T0);
        // Long before: wait until a minute before.
        let far = every("1h", "skip");
        assert_eq!(
            planned(&far, &state(T0), &me(), &facts(T0 + 1)),
            Step::Wait {
                until_ms: Some(T0 + 60 * MIN - LEAD_MS),
                poll: false
            }
        );
        let (next, records, claiming) = written(planned(&s, &st, &me(), &facts(T0 + 30_000)));
        assert_eq!(claiming, Some(T0 + MIN));
        assert!(records.is_empty());
        assert_eq!(next.claimed, Some(T0 + MIN));
        assert_eq!(next.running.len(), 1);
        assert!(me().owns(&next.running[0]));
        // Claimed, not yet due: wait for it.
        assert_eq!(
            planned(&s, &next, &me(), &facts(T0 + 30_001)),
            Step::Wait {
                until_ms: Some(T0 + MIN),
                poll: false
            }
        );
        // Its time came: start it.
        assert_eq!(
            planned(&s, &next, &me(), &facts(T0 + MIN)),
            Step::Start(next.running.clone())
        );
        // Started: nothing more until the next firing (a run is in flight).
        let mut f = facts(T0 + MIN + 5);
        f.started.insert(next.running[0].id);
        assert_eq!(
            planned(&s, &next, &me(), &f),
            Step::Wait {
                until_ms: Some(T0 + 2 * MIN),
                poll: false
            }
        );
    }

    #[test]
    fn a_firing_that_overlaps_a_run_follows_the_policy() {
        let running = |overlap: &str| {
            let s = every("1m", overlap);
            let mut st = state(T0);
            st.running.push(me().entry(T0, 1, None));
            let mut f = facts(T0 + MIN + 10);
            f.started.insert(st.running[0].id);
            (s, st, f)
        };
        // skip: recorded, and settled.
        let (s, st, f) = running("skip");
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(next.claimed, Some(T0 + MIN));
        assert_eq!(records[0].outcome, Some(Outcome::Skipped));
        assert_eq!(next.running, st.running);
        // buffer_one and buffer_all: wait for the run's end.
        for p in ["buffer_one", "buffer_all"] {
            let (s, st, f) = running(p);
            assert!(
                matches!(planned(&s, &st, &me(), &f), Step::Wait { .. }),
                "{p}"
            );
        }
        // cancel_other: stop the run first, once.
        let (s, st, mut f) = running("cancel_other");
        assert_eq!(
            planned(&s, &st, &me(), &f),
            Step::Cancel(vec![st.running[0].id])
        );
        f.stopping.insert(st.running[0].id);
        assert!(matches!(planned(&s, &st, &me(), &f), Step::Wait { .. }));
        // allow: start beside it.
        let (s, st, f) = running("allow");
        let (next, _, claiming) = written(planned(&s, &st, &me(), &f));
        assert_eq!(claiming, Some(T0 + MIN));
        assert_eq!(next.running.len(), 2);
    }

    #[test]
    fn buffer_one_keeps_only_the_newest_waiting() {
        let s = every("1m", "buffer_one");
        let mut st = state(T0);
        st.running.push(me().entry(T0, 1, None));
        let mut f = facts(T0 + 3 * MIN + 10);
        f.started.insert(st.running[0].id);
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].count, Some(2));
        assert_eq!(next.claimed, Some(T0 + 2 * MIN));
        // The run ends: the newest starts.
        let end = RunEnd {
            id: st.running[0].id,
            outcome: Outcome::Succeeded,
            reason: None,
            started_ms: Some(T0 + 5),
            ended_ms: T0 + 3 * MIN + 20,
            retry: false,
        };
        let (after, record) = ended(&next, &me(), end).unwrap();
        assert_eq!(record.lateness_ms, Some(5));
        let (claimed, _, claiming) = written(planned(&s, &after, &me(), &facts(T0 + 3 * MIN + 21)));
        assert_eq!(claiming, Some(T0 + 3 * MIN));
        assert_eq!(claimed.running[0].firing, T0 + 3 * MIN);
    }

    #[test]
    fn buffer_all_runs_every_due_firing_in_order() {
        let s = every("1m", "buffer_all");
        let st = state(T0);
        let (next, records, claiming) = written(planned(&s, &st, &me(), &facts(T0 + 3 * MIN + 10)));
        assert!(records.is_empty());
        assert_eq!(claiming, Some(T0 + MIN));
        assert_eq!(next.claimed, Some(T0 + MIN));
    }

    #[test]
    fn a_takeover_reruns_what_was_lost_and_takes_over_what_never_started() {
        let s = every("1m", "skip");
        let mut old = me();
        old.epoch = 4;
        old.gen = 8;
        old.worker = "10.0.0.1:7000".into();
        let mut st = state(T0 + MIN);
        st.running.push(old.entry(T0 + MIN, 1, None));
        // The firing was due before this lease began: possibly started, lost.
        let mut f = facts(T0 + MIN + 3_000);
        f.lease_began_ms = Some(T0 + MIN + 2_000);
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
        assert_eq!(records[0].worker, "10.0.0.1:7000");
        assert_eq!(next.running.len(), 1);
        assert_eq!(next.running[0].attempt, 2);
        assert!(me().owns(&next.running[0]));
        // on_lost: skip records it skipped instead.
        let skip = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "on_lost": "skip"}}, T0)
            .unwrap()
            .unwrap();
        let (next, records, _) = written(planned(&skip, &st, &me(), &f));
        assert!(next.running.is_empty());
        assert_eq!(records[1].outcome, Some(Outcome::Skipped));
        // Claimed ahead and due after this lease began: never started, taken over.
        f.lease_began_ms = Some(T0 + MIN - 30_000);
        f.now_ms = T0 + MIN - 29_000;
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert!(records.is_empty());
        assert_eq!(next.running[0].firing, T0 + MIN);
        assert_eq!(next.running[0].attempt, 1);
        assert!(me().owns(&next.running[0]));
        // Without the lease's start, every run counts as possibly started.
        f.lease_began_ms = None;
        let (_, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
    }

    #[test]
    fn a_run_whose_lease_may_hold_is_waited_for() {
        let s = every("1m", "allow");
        let mut other = me();
        other.slot = "slot-002".into();
        other.epoch = 2;
        let mut st = state(T0);
        st.running.push(other.entry(T0, 1, None));
        let mut f = facts(T0 + 2 * MIN);
        f.slot_epochs.insert("slot-002".into(), 2);
        let wait = Step::Wait {
            until_ms: None,
            poll: true,
        };
        assert_eq!(planned(&s, &st, &me(), &f), wait);
        // Once that slot changed hands, the run was lost.
        f.slot_epochs.insert("slot-002".into(), 3);
        let (_, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
    }

    /// A run this lease's own earlier instance of the robot left in flight (it
    /// stopped while the lease was suspended, and the lease resumed): that instance
    /// has exited, so the run is settled as lost, and retried within the window or
    /// missed past it. First seen under a catch-up flood: early starts undone at a
    /// takeover left claims waited for as live until the slot changed hands.
    #[test]
    fn a_run_an_exited_instance_of_this_lease_left_is_lost_not_waited_for() {
        let s = every("1m", "allow");
        let mut mine_before = me();
        mine_before.gen = me().gen - 1;
        let mut st = state(T0);
        st.running.push(mine_before.entry(T0, 1, None));
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 2 * MIN)));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
        assert!(records[0]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("instance"));
        let retry = next
            .running
            .iter()
            .find(|e| e.firing == T0)
            .expect("retried");
        assert_eq!((retry.attempt, retry.gen), (2, me().gen));
        // Past the catch-up window (10 minutes by default): missed, not retried.
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 20 * MIN)));
        assert_eq!(records[1].outcome, Some(Outcome::Missed));
        assert!(next.running.iter().all(|e| e.firing != T0));
        // A newer generation's run is not this instance's to judge: waited for.
        let mut newer = me();
        newer.gen = me().gen + 1;
        let mut st = state(T0);
        st.running.push(newer.entry(T0, 1, None));
        let wait = Step::Wait {
            until_ms: None,
            poll: true,
        };
        assert_eq!(planned(&s, &st, &me(), &facts(T0 + 2 * MIN)), wait);
    }

    #[test]
    fn firings_outside_the_window_are_missed_and_a_pause_is_skipped() {
        let s = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "catchup": "5m"}}, T0)
            .unwrap()
            .unwrap();
        // One write: the 55 older than the window are missed, and of the five
        // within it the first runs and the rest overlap it.
        let (next, records, claiming) =
            written(planned(&s, &state(T0), &me(), &facts(T0 + 60 * MIN + 1)));
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
        assert_eq!(records[0].count, Some(55));
        assert_eq!(next.missed, 55);
        assert_eq!(claiming, Some(T0 + 56 * MIN));
        assert_eq!(records[1].outcome, Some(Outcome::Skipped));
        assert_eq!(records[1].count, Some(4));
        assert_eq!(next.claimed, Some(T0 + 60 * MIN));
        assert_eq!(next.running[0].firing, T0 + 56 * MIN);
        // Missed with nothing to claim: written alone.
        let mut busy = state(T0);
        let run = me().entry(T0, 1, None);
        busy.running.push(run.clone());
        let mut f = facts(T0 + 60 * MIN + 1);
        f.started.insert(run.id);
        let buffered = Schedule::from_spec(
            &doc! {"schedule": {"every": "1m", "catchup": "5m", "overlap": "buffer_all"}},
            T0,
        )
        .unwrap()
        .unwrap();
        let (next, records, claiming) = written(planned(&buffered, &busy, &me(), &f));
        assert_eq!(claiming, None);
        assert_eq!(records.len(), 1);
        assert_eq!(next.claimed, Some(T0 + 55 * MIN));
        // A pause from T0 + 30s to now: those firings were skipped as paused.
        let mut paused = state(T0);
        paused.paused_at = Some(T0 + 30_000);
        let (next, records, _) = written(planned(&s, &paused, &me(), &facts(T0 + 10 * MIN + 1)));
        assert_eq!(records[0].outcome, Some(Outcome::Skipped));
        assert_eq!(records[0].reason.as_deref(), Some("paused"));
        assert_eq!(records[0].count, Some(10));
        assert_eq!(next.paused_at, None);
        assert_eq!(next.claimed, Some(T0 + 10 * MIN));
    }

    #[test]
    fn a_run_now_request_runs_when_idle_and_follows_the_policy_when_not() {
        let s = every("1h", "skip");
        let mut st = state(T0);
        let by = Trigger {
            id: ObjectId::new(),
            by: "cli".into(),
        };
        st.triggers.push(by.clone());
        let (next, _, claiming) = written(planned(&s, &st, &me(), &facts(T0 + 10)));
        assert_eq!(claiming, None);
        assert!(next.triggers.is_empty());
        assert_eq!(next.running[0].trigger, Some(by.id));
        assert_eq!(next.running[0].by.as_deref(), Some("cli"));
        // Busy, skip: recorded skipped, by whom.
        let mut busy = st.clone();
        busy.running.push(me().entry(T0, 1, None));
        let mut f = facts(T0 + 10);
        f.started.insert(busy.running[0].id);
        let (next, records, _) = written(planned(&s, &busy, &me(), &f));
        assert!(next.triggers.is_empty());
        assert_eq!(records[0].by.as_deref(), Some("cli"));
    }

    #[test]
    fn a_failed_run_retried_stays_in_flight_as_the_next_attempt() {
        let mut st = state(T0);
        let e = me().entry(T0, 1, None);
        st.running.push(e.clone());
        let end = RunEnd {
            id: e.id,
            outcome: Outcome::Failed,
            reason: Some("exit 3".into()),
            started_ms: Some(T0 + 2),
            ended_ms: T0 + 50,
            retry: true,
        };
        let (next, record) = ended(&st, &me(), end.clone()).unwrap();
        assert_eq!(record.outcome, Some(Outcome::Failed));
        assert_eq!(next.running[0].attempt, 2);
        assert_eq!(next.running[0].firing, T0);
        let stranger = RunEnd {
            id: ObjectId::new(),
            ..end
        };
        assert!(ended(&st, &me(), stranger).is_none());
    }

    #[test]
    fn a_slot_just_deleted_is_waited_on_and_one_gone_a_lease_is_over() {
        let s = every("1m", "skip");
        let mut other = me();
        other.slot = "slot-009".into();
        let mut st = state(T0);
        st.running.push(other.entry(T0, 1, None));
        let mut f = facts(T0 + 10);
        assert!(matches!(
            planned(&s, &st, &me(), &f),
            Step::Wait { poll: true, .. }
        ));
        f.gone.insert("slot-009".into());
        let (_, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
    }

    #[test]
    fn two_runs_ready_at_once_start_one_at_a_time() {
        let s = every("1m", "buffer_all");
        let mut st = state(T0 + MIN);
        st.running.push(me().entry(T0, 2, None));
        st.running.push(me().entry(T0 + MIN, 1, None));
        let f = facts(T0 + MIN + 5);
        assert_eq!(
            planned(&s, &st, &me(), &f),
            Step::Start(vec![st.running[0].clone()])
        );
    }

    #[test]
    fn a_run_now_request_is_not_held_back_by_a_firing_claimed_ahead() {
        let s = every("1m", "skip");
        let mut st = state(T0 + MIN);
        st.running.push(me().entry(T0 + MIN, 1, None));
        st.triggers.push(Trigger {
            id: ObjectId::new(),
            by: "web".into(),
        });
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 30_000)));
        assert!(records.is_empty());
        assert_eq!(next.running.len(), 2);
        assert_eq!(next.running[1].by.as_deref(), Some("web"));
    }

    #[test]
    fn a_pause_skips_the_runs_it_cut_off_and_a_late_retry_is_missed() {
        let s = every("1m", "skip");
        let mut st = state(T0);
        st.lost.push(me().entry(T0, 1, None));
        st.paused_at = Some(T0 + 1);
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 2 * MIN + 1)));
        assert!(next.lost.is_empty());
        assert_eq!(records[0].reason.as_deref(), Some("paused while it ran"));
        assert_eq!(records[1].count, Some(2));
        // Cut off and found after the catch-up window: missed, not retried.
        let mut st = state(T0);
        st.lost.push(me().entry(T0, 1, None));
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 11 * MIN)));
        assert!(next.running.is_empty());
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
    }

    #[test]
    fn a_claim_handed_on_before_it_started_starts_as_the_same_attempt_whatever_on_lost() {
        let s = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "on_lost": "skip"}}, T0)
            .unwrap()
            .unwrap();
        let mut st = state(T0 + MIN);
        let mut handed = me().entry(T0 + MIN, 2, None);
        handed.not_started = true;
        handed.by = Some("cli:ops".into());
        st.lost.push(handed.clone());
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + MIN + 5)));
        assert!(records.is_empty(), "{records:?}");
        assert!(next.lost.is_empty());
        let again = &next.running[0];
        assert_eq!((again.firing, again.attempt), (T0 + MIN, 2));
        assert_eq!(again.by.as_deref(), Some("cli:ops"));
        assert!(!again.not_started && again.id != handed.id);
        // A run the stop cut off is still skipped, as on_lost says.
        let mut cut = st.clone();
        cut.lost[0].not_started = false;
        let (next, records, _) = written(planned(&s, &cut, &me(), &facts(T0 + MIN + 5)));
        assert!(next.running.is_empty());
        assert_eq!(records[0].outcome, Some(Outcome::Skipped));
        // Found after its window: missed, never started late.
        let (next, records, _) = written(planned(&s, &st, &me(), &facts(T0 + 12 * MIN)));
        assert!(next.running.is_empty());
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
        assert_eq!(next.missed, 1);
        // Paused meanwhile: skipped, as paused before it started.
        st.paused_at = Some(T0 + MIN + 1);
        let (_, records, _) = written(planned(&s, &st, &me(), &facts(T0 + MIN + 2)));
        assert_eq!(
            records[0].reason.as_deref(),
            Some("paused before it started")
        );
    }

    #[test]
    fn a_robot_without_firing_state_owes_firings_from_its_creation() {
        let s = every("1m", "buffer_all");
        let mut f = facts(T0 + 3 * MIN + 1);
        f.created_ms = Some(T0 + 1);
        let (next, _, claiming) = written(planned(&s, &FiringState::default(), &me(), &f));
        assert_eq!(claiming, Some(T0 + MIN));
        assert_eq!(next.claimed, Some(T0 + MIN));
    }

    #[test]
    fn a_new_robot_writes_its_schedule_with_its_first_claim() {
        let s = every("1m", "skip");
        let mut f = facts(T0 + 30_000);
        f.created_ms = Some(T0 + 1);
        // One write: the claim, and the schedule it follows.
        let (next, records, claiming) = written(plan(&s, &FiringState::default(), &me(), &f));
        assert_eq!(claiming, Some(T0 + MIN));
        assert!(records.is_empty());
        assert_eq!(next.since, Some(T0 + 1));
        assert_eq!(next.schedule.as_deref(), Some("every 1m"));
        assert_eq!(next.schedule_spec, Some(s.source.clone()));
        // Nothing to claim yet: nothing is written at all.
        let hourly = every("1h", "skip");
        assert_eq!(
            plan(&hourly, &FiringState::default(), &me(), &f),
            Step::Wait {
                until_ms: Some(T0 + 60 * MIN - LEAD_MS),
                poll: false
            }
        );
        // Its creation unknown: where firings start would move with the clock, so
        // the schedule is written alone first, from now.
        f.created_ms = None;
        let (next, _, claiming) = written(plan(&s, &FiringState::default(), &me(), &f));
        assert_eq!(claiming, None);
        assert_eq!(next.since, Some(T0 + 30_000));
        assert_eq!(next.schedule.as_deref(), Some("every 1m"));
    }

    #[test]
    fn a_new_schedule_owes_firings_from_the_change_on() {
        let s = every("1m", "skip");
        // First written: from the robot's creation.
        let mut f = facts(T0 + 5 * MIN);
        f.created_ms = Some(T0 + 1);
        let (next, _, _) = written(plan(&s, &FiringState::default(), &me(), &f));
        assert_eq!(next.since, Some(T0 + 1));
        assert_eq!(next.schedule.as_deref(), Some("every 1m"));
        // A first schedule from an update (before anything was written, or to a
        // daemon): from that update, not from the creation.
        let mut updated = f.clone();
        updated.updated_ms = Some(T0 + 4 * MIN + 30_000);
        let (next, records, claiming) = written(plan(&s, &FiringState::default(), &me(), &updated));
        assert_eq!(next.since, Some(T0 + 4 * MIN + 30_000));
        assert_eq!(claiming, Some(T0 + 5 * MIN));
        assert!(
            records.is_empty(),
            "nothing owed before the update: {records:?}"
        );
        // Changed: from now; the old schedule's firings due and not run are
        // recorded skipped.
        let mut st = state(T0);
        st.schedule = Some("every 1h".into());
        st.schedule_spec = Some(bson::doc! {"every": "1m"});
        let (next, records, _) = written(plan(&s, &st, &me(), &f));
        assert_eq!(records[0].count, Some(5));
        assert!(records[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("schedule changed"));
        assert_eq!(next.since, Some(T0 + 5 * MIN));
        assert_eq!(next.schedule.as_deref(), Some("every 1m"));
        // Then nothing is owed before the change.
        assert!(matches!(
            plan(&s, &next, &me(), &f),
            Step::Wait { .. }
                | Step::Write {
                    claiming: Some(_),
                    ..
                }
        ));
    }

    #[test]
    fn a_retry_waits_out_its_backoff() {
        let s = every("1m", "skip");
        let mut st = state(T0);
        let retry = me().entry(T0, 2, None);
        st.running.push(retry.clone());
        let mut f = facts(T0 + 1_000);
        f.not_before.insert(retry.id, T0 + 5_000);
        assert_eq!(
            planned(&s, &st, &me(), &f),
            Step::Wait {
                until_ms: Some(T0 + 5_000),
                poll: false
            }
        );
        f.now_ms = T0 + 5_000;
        assert_eq!(planned(&s, &st, &me(), &f), Step::Start(vec![retry]));
    }
    trait TapPush {
        fn tap_push(self, e: RunEntry) -> Self;
    }

    impl TapPush for FiringState {
        fn tap_push(mut self, e: RunEntry) -> Self {
            self.running.push(e);
            self
        }
    }

    /// Carries out the planner's steps as a runner would (a write is applied, a
    /// run starts and ends at once) while the server's clock moves `step_ms` a step:
    /// the firings started, in order.
    fn drive(s: &Schedule, st: FiringState, mut f: Facts, step_ms: i64, steps: usize) -> Vec<i64> {
        let mut st = st;
        st.schedule = Some(s.describe());
        let mut started = vec![];
        for _ in 0..steps {
            match plan(s, &st, &me(), &f) {
                Step::Write { next, .. } => {
                    for e in &next.running {
                        if !st.running.iter().any(|r| r.id == e.id) {
                            f.claimed_at.insert(e.id, f.now_ms);
                        }
                    }
                    st = next;
                }
                Step::Start(runs) => {
                    // Each run ends at once, and its end is written.
                    for e in runs {
                        started.push(e.firing);
                        let end = RunEnd {
                            id: e.id,
                            outcome: Outcome::Succeeded,
                            reason: None,
                            started_ms: Some(f.now_ms),
                            ended_ms: f.now_ms,
                            retry: false,
                        };
                        st = ended(&st, &me(), end).expect("in flight").0;
                    }
                }
                Step::Cancel(_) | Step::Wait { .. } => {}
            }
            f.now_ms += step_ms;
        }
        started
    }

    #[test]
    fn a_short_window_behind_slow_writes_still_starts_its_runs() {
        // Every step takes 3 s, longer than the 2 s window: each claim lands outside
        // the window it was made in, and its run must still start.
        let s = Schedule::from_spec(
            &doc! {"schedule": {"every": "1s", "catchup": "2s", "overlap": "buffer_all"}},
            T0,
        )
        .unwrap()
        .unwrap();
        let started = drive(&s, state(T0 - 60_000), facts(T0), 3_000, 12);
        assert!(started.len() >= 3, "runs started: {started:?}");
    }

    #[test]
    fn a_restart_after_failure_starts_however_old_its_firing_and_a_late_takeover_does_not() {
        let s = every("1h", "skip");
        // A 15-minute run failed; its restart waits out a backoff, then starts.
        let mut st = state(T0);
        let retry = me().entry(T0, 2, None);
        st.running.push(retry.clone());
        let mut f = facts(T0 + 15 * MIN + 5_000);
        f.not_before.insert(retry.id, T0 + 15 * MIN + 5_000);
        f.claimed_at.insert(retry.id, T0 + 15 * MIN);
        assert_eq!(
            planned(&s, &st, &me(), &f),
            Step::Start(vec![retry.clone()])
        );
        // A claim taken over from a holder long gone, its firing far past the
        // window: written just now, but not claimed within its window.
        let mut f = facts(T0 + 15 * MIN);
        f.claimed_at.insert(retry.id, T0 + 15 * MIN - 10);
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert!(next.running.is_empty());
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
    }

    /// A claimed run whose start keeps not happening (its lease not open at each
    /// try) waits for its next try, yet stays held to its window: the tries do not
    /// extend it, as a restart backoff does, so it is recorded missed in the end.
    #[test]
    fn a_start_tried_again_and_again_is_still_missed_past_its_window() {
        let s = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "catchup": "1m"}}, T0)
            .unwrap()
            .unwrap();
        let mut st = state(T0);
        let claim = me().entry(T0, 1, None);
        st.running.push(claim.clone());
        // Claimed in time; its start just failed: the next try is a second on.
        let mut f = facts(T0 + 5_000);
        f.claimed_at.insert(claim.id, T0 + 100);
        f.start_again_at.insert(claim.id, T0 + 6_000);
        assert_eq!(
            planned(&s, &st, &me(), &f),
            Step::Wait {
                until_ms: Some(T0 + 6_000),
                poll: false
            }
        );
        // Every try failed, each setting the next a second on: past the window and
        // the slack after its claim, it is missed, not tried again.
        let late = T0 + MIN + START_SLACK_MS + 1_000;
        let mut f = facts(late);
        f.claimed_at.insert(claim.id, T0 + 100);
        f.start_again_at.insert(claim.id, late + 1_000);
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert!(next.running.iter().all(|e| e.id != claim.id));
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
    }

    #[test]
    fn a_flood_of_firings_falling_out_of_the_window_never_starves_the_runs() {
        // A holder back from a flood: a firing it claimed never started and is now
        // too late to, and each of the holder's steps is slow enough (1.2 s) that
        // another firing falls out of the catch-up window before the next one. Runs
        // must still start, each claimed within its window.
        let s = Schedule::from_spec(
            &doc! {"schedule": {"every": "1s", "catchup": "1m", "overlap": "buffer_all"}},
            T0,
        )
        .unwrap()
        .unwrap();
        let mut st = state(T0 - 150_000);
        st.running.push(me().entry(T0 - 150_000, 1, None));
        let started = drive(&s, st, facts(T0), 1_200, 20);
        assert!(!started.is_empty(), "no run started");
        assert!(
            started.iter().all(|t| *t >= T0 - 60_000),
            "a firing started past its window: {started:?}"
        );
    }

    #[test]
    fn a_claimed_run_is_missed_not_started_once_its_window_has_passed() {
        // Claimed ahead, then the server's clock stepped ten minutes forward: the
        // claim is older than the one-minute window, so it is recorded missed.
        let s = Schedule::from_spec(&doc! {"schedule": {"every": "2s", "catchup": "1m"}}, T0)
            .unwrap()
            .unwrap();
        let mut st = state(T0);
        st.running.push(me().entry(T0, 1, None));
        let f = facts(T0 + 10 * MIN);
        let (next, records, _) = written(planned(&s, &st, &me(), &f));
        assert!(next.running.is_empty(), "{next:?}");
        assert_eq!(records[0].firing, T0);
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
        assert!(records[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("never started"));
        // A claim its own slow write took a little past the window still starts.
        let mut f_late = facts(T0 + MIN + 5_000);
        f_late.claimed_at.insert(st.running[0].id, T0 + MIN + 1_000);
        assert_eq!(
            planned(&s, &st, &me(), &f_late),
            Step::Start(vec![st.running[0].clone()])
        );
        // Then it goes on with firings inside the window, and never starts the old one.
        let started = drive(&s, state(T0).tap_push(me().entry(T0, 1, None)), f, 500, 40);
        assert!(!started.is_empty(), "nothing started after the step");
        assert!(
            started.iter().all(|t| *t >= T0 + 9 * MIN),
            "a firing started past its window: {started:?}"
        );
    }

    // === A run's end: the one write, and a last step that missed ===

    fn run_end(id: ObjectId, ended_ms: i64) -> RunEnd {
        RunEnd {
            id,
            outcome: Outcome::Succeeded,
            reason: None,
            started_ms: Some(T0 + MIN),
            ended_ms,
            retry: false,
        }
    }

    #[test]
    fn a_runs_end_carries_the_next_claim_when_the_plan_after_it_claims_ahead() {
        let s = every("1m", "skip");
        let mut st = state(T0 + MIN);
        st.schedule = Some(s.describe());
        let e = me().entry(T0 + MIN, 1, None);
        st.running.push(e.clone());
        let end = run_end(e.id, T0 + MIN + 20_000);
        let mut f = facts(T0 + MIN + 20_000);
        f.started.insert(e.id);
        let merged = end_write(&s, &st, &me(), end.clone(), Some(&f)).unwrap();
        assert_eq!(
            merged.claiming,
            Some(T0 + 2 * MIN),
            "the next firing, ahead"
        );
        assert_eq!(merged.records.len(), 1);
        assert_eq!(merged.records[0].firing, T0 + MIN);
        assert_eq!(merged.records[0].outcome, Some(Outcome::Succeeded));
        assert_eq!(merged.next.claimed, Some(T0 + 2 * MIN));
        assert_eq!(merged.next.running.len(), 1);
        assert_eq!(merged.next.running[0].firing, T0 + 2 * MIN);
        // The same end, planned on its own, then claimed by the plan: the same.
        let (alone, record) = ended(&st, &me(), end.clone()).unwrap();
        let (then, records, claiming) = written(planned(&s, &alone, &me(), &f));
        assert!(records.is_empty());
        assert_eq!(claiming, merged.claiming);
        assert_eq!(then.claimed, merged.next.claimed);
        assert_eq!(record.firing, merged.records[0].firing);
        // The server's time not known: the end alone.
        let plain = end_write(&s, &st, &me(), end.clone(), None).unwrap();
        assert_eq!(plain.claiming, None);
        assert!(plain.next.running.is_empty());
        assert_eq!(plain.next.claimed, Some(T0 + MIN));
        // Not in flight: recorded already, nothing to write.
        let stranger = run_end(ObjectId::new(), T0 + MIN + 20_000);
        assert!(end_write(&s, &st, &me(), stranger, Some(&f)).is_none());
    }

    #[test]
    fn a_runs_end_claims_nothing_when_the_next_firing_is_far_or_something_else_comes_first() {
        let hourly = every("1h", "skip");
        let mut st = state(T0);
        st.schedule = Some(hourly.describe());
        let e = me().entry(T0, 1, None);
        st.running.push(e.clone());
        let mut f = facts(T0 + 20_000);
        f.started.insert(e.id);
        let w = end_write(&hourly, &st, &me(), run_end(e.id, T0 + 20_000), Some(&f)).unwrap();
        assert_eq!(w.claiming, None, "an hour away: claimed a minute before it");
        assert!(w.next.running.is_empty());
        // A retry puts the next attempt in flight: that is what comes next.
        let minutely = every("1m", "skip");
        st.schedule = Some(minutely.describe());
        let end = RunEnd {
            outcome: Outcome::Failed,
            retry: true,
            ..run_end(e.id, T0 + 20_000)
        };
        let w = end_write(&minutely, &st, &me(), end, Some(&f)).unwrap();
        assert_eq!(w.claiming, None, "the retry first");
        assert_eq!(w.next.running.len(), 1);
        assert_eq!(
            (w.next.running[0].firing, w.next.running[0].attempt),
            (T0, 2)
        );
    }

    #[test]
    fn a_last_step_whose_seq_moved_is_dropped_and_the_firing_handed_on_as_on_lost_says() {
        let retry = every("1m", "skip");
        let (missed, count) = step_missed(&retry, 7, Some(8), true, 0);
        assert_eq!(count, 0);
        let StepMissed::Drop {
            outcome,
            why,
            retry: again,
        } = missed
        else {
            panic!("{missed:?}")
        };
        assert_eq!(outcome, Outcome::Stopped);
        assert!(again, "on_lost: retry (the default)");
        assert!(why.contains("from 7 to 8"), "{why}");
        let skip = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "on_lost": "skip"}}, T0)
            .unwrap()
            .unwrap();
        let (missed, _) = step_missed(&skip, 7, None, false, 2);
        assert!(
            matches!(&missed, StepMissed::Drop { retry: false, why, .. } if why.contains("something unreadable")),
            "{missed:?}"
        );
    }

    #[test]
    fn a_last_step_that_misses_while_nothing_changed_is_dropped_the_third_time() {
        let s = every("1m", "skip");
        let (missed, count) = step_missed(&s, 7, Some(7), true, 0);
        assert_eq!((missed, count), (StepMissed::Again, 1));
        let (missed, count) = step_missed(&s, 7, Some(7), false, count);
        assert_eq!(
            (missed, count),
            (StepMissed::Again, 1),
            "the robot changed: explained, not counted"
        );
        let (missed, count) = step_missed(&s, 7, Some(7), true, count);
        assert_eq!((missed, count), (StepMissed::Again, 2));
        let (missed, count) = step_missed(&s, 7, Some(7), true, count);
        assert_eq!(count, 3);
        assert!(
            matches!(
                missed,
                StepMissed::Drop {
                    outcome: Outcome::Failed,
                    retry: false,
                    ..
                }
            ),
            "{missed:?}"
        );
    }
}
