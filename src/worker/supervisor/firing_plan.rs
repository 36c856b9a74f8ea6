//! A scheduled robot's next step: pure, on its stored firing state, its schedule and
//! what its instance knows (the server's time, which of its runs have started, whose
//! leases are over). No I/O: the runner carries each step out, one write at a time.
//!
//! The rules, in the order they are applied:
//! 1. **A run of another instance** (an earlier holder's, or one a move or an update
//!    replaced). If its lease is over, its process was stopped with it: a firing
//!    that could not have started before that lease ended is taken over as claimed;
//!    any other run was *lost*, and is retried as the next attempt or recorded
//!    skipped, as `on_lost` says. If its lease may still hold, nothing starts until
//!    that instance records its run's end (no firing twice at once).
//! 2. **Runs a stop cut off** (`lost`): retried or skipped, the same way.
//! 3. **A pause**: the firings that fell while the robot was paused are recorded
//!    skipped, in one record.
//! 4. **Missed**: firings older than the catch-up window are recorded missed, in
//!    one record with their count.
//! 5. **A claimed firing whose time came** starts, unless a run is still in flight:
//!    then the overlap policy decides (skip it, keep it waiting, stop the run, or
//!    start beside it).
//! 6. **Run-now requests**, then **firings due** (late: after a takeover, a pause or
//!    a catch-up), under the overlap policy.
//! 7. **The next firing is claimed ahead**, up to [`LEAD_MS`] before it, when no run is
//!    in flight: its start then waits only on a local timer, and the claim goes
//!    out with other robots' writes in a group commit rather than at the edge.

use std::collections::{HashMap, HashSet};

use bson::oid::ObjectId;

use crate::db::firing::{FiringState, Outcome, RunEntry, RunRecord, Trigger};
use crate::robot::schedule::{OnLost, Overlap, Schedule};

/// How far ahead of its time a firing is claimed: a minute, so that even 10,000
/// robots firing at one minute's edge are claimed over the minute before it.
pub const LEAD_MS: i64 = 60_000;
/// How far the server's clock, as a holder estimates it, may run ahead of the
/// server's own: a run starts when the estimate reaches its firing, so one that a
/// lease ending at `t` could have started has a firing before `t + DRIFT_MS`. An
/// estimate is ahead by at most half its reading's round trip (readings slower
/// than a second are not taken) and the local clock's drift since (milliseconds);
/// a second covers that, and a backward step of the server's clock of up to half a
/// second. A larger backward step can make a firing that ran just before
/// a takeover run once more after it, never beside itself: the earlier holder
/// stopped it with its lease.
pub const DRIFT_MS: i64 = 1000;
/// Why a write claims the next firing ahead of its time (the runner merges it with
/// a run's end).
pub const CLAIM_AHEAD: &str = "the next firing, claimed ahead";

/// Due firings looked at in one step.
const DUE_LIMIT: usize = 1000;

/// The instance planning.
#[derive(Debug, Clone)]
pub struct Me {
    pub slot: String,
    pub epoch: i64,
    pub gen: i64,
    pub worker: String,
}

/// What the instance knows beside the stored state.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The server's time, estimated.
    pub now_ms: i64,
    /// The server's time at this holder's claim of the slot, read no earlier than
    /// the claim landed: every earlier holder's lease was over by then. None when
    /// not known (every run of theirs then counts as possibly started).
    pub lease_began_ms: Option<i64>,
    /// The epoch each other slot named by a run in flight holds now (absent: the
    /// slot is gone, or was not read).
    pub slot_epochs: HashMap<String, i64>,
    /// Slots seen gone for longer than a lease: whatever ran under them stopped.
    /// A slot only just deleted may still have a holder finishing its stop.
    pub gone: HashSet<String>,
    /// When the robot was created (server milliseconds): no firing before it is
    /// owed, when its state says nothing of where firings start.
    pub created_ms: Option<i64>,
    /// When an update was last applied to the robot (server milliseconds): a robot
    /// that gets its first schedule from an update owes firings from then on.
    pub updated_ms: Option<i64>,
    /// The robot was paused: its holder is about to stop this instance, which
    /// starts and settles nothing meanwhile (the next instance, after the resume,
    /// records the pause's firings).
    pub paused: bool,
    /// This instance's runs whose process started.
    pub started: HashSet<ObjectId>,
    /// This instance's runs it already asked to stop.
    pub stopping: HashSet<ObjectId>,
    /// Runs that wait out a restart backoff: not started before these times.
    pub not_before: HashMap<ObjectId, i64>,
}

/// What to do next.
// One step lives at a time, and is carried out at once: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
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
}

fn judge(e: &RunEntry, me: &Me, f: &Facts) -> Theirs {
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

/// The next step for `me`, with `st` as stored.
pub fn plan(s: &Schedule, st: &FiringState, me: &Me, f: &Facts) -> Step {
    let now = f.now_ms;
    if f.paused {
        return Step::Wait {
            until_ms: None,
            poll: false,
        };
    }
    let mut next = st.clone();

    // 1. Runs of other instances.
    if let Some((i, e)) = st.running.iter().enumerate().find(|(_, e)| !me.owns(e)) {
        match judge(e, me, f) {
            Theirs::Live => {
                return Step::Wait {
                    until_ms: None,
                    poll: true,
                }
            }
            Theirs::NeverStarted => {
                next.running[i] = me.entry(e.firing, e.attempt, None);
                next.running[i].trigger = e.trigger;
                next.running[i].by = e.by.clone();
                return Step::Write {
                    next,
                    records: vec![],
                    claiming: None,
                    why: "took over a firing an earlier holder claimed and never started",
                };
            }
            Theirs::Lost => {
                next.running.remove(i);
                let mut lost = me.record(
                    e.firing,
                    Outcome::Lost,
                    &format!(
                        "in flight on {} (slot {}, epoch {}) when that lease ended",
                        e.worker, e.slot, e.epoch
                    ),
                );
                lost.attempt = e.attempt;
                lost.worker = e.worker.clone();
                lost.slot = e.slot.clone();
                lost.epoch = e.epoch;
                lost.by = e.by.clone();
                let mut records = vec![lost];
                if let Some(r) = not_retried(s, e, me, f, "its run was lost and on_lost is skip") {
                    next.missed += i64::from(r.outcome == Some(Outcome::Missed));
                    records.push(r);
                } else {
                    next.running.push(retry_of(e, me));
                }
                return Step::Write {
                    next,
                    records,
                    claiming: None,
                    why: "a run lost with its lease",
                };
            }
        }
    }

    // 1b. The schedule this state follows: a new one owes firings from now on.
    let words = s.describe();
    // Where a first schedule's firings start: the robot's creation, or the update
    // that gave it this schedule.
    let origin = match (f.created_ms, f.updated_ms) {
        (Some(c), Some(u)) => Some(c.max(u)),
        (c, u) => c.or(u),
    };
    if st.schedule.is_none() {
        if let Some(since) = st.since.or(origin) {
            // A robot's first schedule owes firings from its creation, which does
            // not move: it is written with the first step that writes anything (the
            // first claim, as a rule), not in a write of its own. That halves what
            // adopting many new scheduled robots costs the database.
            let mut first = st.clone();
            first.since = Some(since);
            first.schedule = Some(words);
            first.schedule_spec = Some(s.source.clone());
            return plan(s, &first, me, f);
        }
    }
    if st.schedule.as_deref() != Some(words.as_str()) {
        let mut records = vec![];
        next.since = match &st.schedule {
            None => st.since.or(origin).or(Some(now)),
            Some(old) => {
                // The old schedule's firings that were due and had not run (the
                // robot behind, or waiting on a run) are recorded, not dropped.
                let from = st.settled_until().unwrap_or(now);
                let old_schedule = st.schedule_spec.as_ref().and_then(|spec| {
                    Schedule::from_spec(&bson::doc! {"schedule": spec.clone()}, now)
                        .ok()
                        .flatten()
                });
                if let Some(m) = old_schedule.and_then(|o| o.span(from, now)) {
                    let mut r = me.record(
                        m.first,
                        Outcome::Skipped,
                        &format!("the schedule changed from {old} before it ran"),
                    );
                    if m.count > 1 {
                        r.count = Some(m.count as i64);
                        r.last = Some(m.last);
                    }
                    records.push(r);
                }
                Some(now)
            }
        };
        next.schedule = Some(words);
        next.schedule_spec = Some(s.source.clone());
        return Step::Write {
            next,
            records,
            claiming: None,
            why: "the schedule these firings follow",
        };
    }

    let mine_started: Vec<&RunEntry> = st
        .running
        .iter()
        .filter(|e| f.started.contains(&e.id))
        .collect();
    let busy = !mine_started.is_empty();
    let cancel = |runs: &[&RunEntry]| {
        let ids: Vec<ObjectId> = runs
            .iter()
            .map(|e| e.id)
            .filter(|id| !f.stopping.contains(id))
            .collect();
        if ids.is_empty() {
            Step::Wait {
                until_ms: None,
                poll: false,
            }
        } else {
            Step::Cancel(ids)
        }
    };

    // 2. Runs a stop cut off (a pause's are skipped with it, below).
    if let Some(e) = st.lost.first().filter(|_| st.paused_at.is_none()) {
        if busy && s.overlap != Overlap::Allow {
            // Retried or skipped once the run in flight ends.
        } else {
            next.lost.remove(0);
            let mut records = vec![];
            if let Some(r) = not_retried(
                s,
                e,
                me,
                f,
                "its run was cut off by a stop and on_lost is skip",
            ) {
                records.push(r);
            } else {
                next.running.push(retry_of(e, me));
            }
            return Step::Write {
                next,
                records,
                claiming: None,
                why: "a run a stop cut off",
            };
        }
    }

    let from = st.settled_until().or(f.created_ms).unwrap_or(now);

    // 3. A pause: the firings that fell during it, or still waited when it came,
    // and the runs it cut off, are skipped.
    if st.paused_at.is_some() {
        next.paused_at = None;
        let mut records = vec![];
        for e in std::mem::take(&mut next.lost) {
            let mut r = me.record(e.firing, Outcome::Skipped, "paused while it ran");
            r.attempt = e.attempt;
            r.by = e.by.clone();
            records.push(r);
        }
        if let Some(m) = s.span(from, now) {
            next.claimed = Some(m.last);
            let mut r = me.record(m.first, Outcome::Skipped, "paused");
            if m.count > 1 {
                r.count = Some(m.count as i64);
                r.last = Some(m.last);
            }
            records.push(r);
        }
        return Step::Write {
            next,
            records,
            claiming: None,
            why: "the firings of a pause",
        };
    }

    // 4. Missed.
    let owed = s.owed(from, now, DUE_LIMIT);
    if let Some(m) = owed.missed {
        next.claimed = Some(m.last);
        next.missed += m.count as i64;
        let mut r = me.record(
            m.first,
            Outcome::Missed,
            &format!(
                "due outside the catch-up window ({}){}",
                humantime::format_duration(s.catchup),
                if m.at_least {
                    "; at least this many"
                } else {
                    ""
                }
            ),
        );
        if m.count > 1 {
            r.count = Some(m.count as i64);
            r.last = Some(m.last);
        }
        return Step::Write {
            next,
            records: vec![r],
            claiming: None,
            why: "firings missed",
        };
    }

    // 5. Claimed runs whose time came.
    let due_at = |e: &RunEntry| {
        e.firing
            .max(f.not_before.get(&e.id).copied().unwrap_or(i64::MIN))
    };
    let ready: Vec<RunEntry> = st
        .running
        .iter()
        .filter(|e| !f.started.contains(&e.id) && due_at(e) <= now)
        .cloned()
        .collect();
    if !ready.is_empty() {
        if s.overlap == Overlap::Allow {
            return Step::Start(ready);
        }
        if !busy {
            // One at a time: the next one meets this one's overlap policy.
            return Step::Start(vec![ready[0].clone()]);
        }
        match s.overlap {
            Overlap::Skip => {
                let e = &ready[0];
                next.running.retain(|r| r.id != e.id);
                let mut r = me.record(
                    e.firing,
                    Outcome::Skipped,
                    "overlap: a run was still in flight",
                );
                r.attempt = e.attempt;
                r.by = e.by.clone();
                return Step::Write {
                    next,
                    records: vec![r],
                    claiming: None,
                    why: "a firing that overlapped",
                };
            }
            Overlap::CancelOther => return cancel(&mine_started),
            // Waits for the run in flight to end.
            Overlap::BufferOne | Overlap::BufferAll | Overlap::Allow => {}
        }
    }
    let pending = st.running.iter().any(|e| !f.started.contains(&e.id));

    // 6. Run-now requests, then late firings.
    if let Some(t) = st.triggers.first() {
        // A firing claimed ahead and not due yet is no run in flight.
        if !busy || s.overlap == Overlap::Allow {
            next.triggers.remove(0);
            next.running.push(me.entry(now, 1, Some(t)));
            return Step::Write {
                next,
                records: vec![],
                claiming: None,
                why: "a run-now request",
            };
        }
        match s.overlap {
            Overlap::Skip => {
                next.triggers.remove(0);
                let mut r = me.record(now, Outcome::Skipped, "overlap: a run was still in flight");
                r.by = Some(t.by.clone());
                return Step::Write {
                    next,
                    records: vec![r],
                    claiming: None,
                    why: "a run-now request that overlapped",
                };
            }
            Overlap::CancelOther if busy => return cancel(&mine_started),
            _ => {}
        }
    }
    if !owed.due.is_empty() {
        let due = &owed.due;
        let last = *due.last().expect("not empty");
        let in_flight = busy || pending;
        match (in_flight, s.overlap) {
            (_, Overlap::Allow) => {
                for &t in due {
                    next.running.push(me.entry(t, 1, None));
                }
                next.claimed = Some(last);
                return Step::Write {
                    next,
                    records: vec![],
                    claiming: Some(due[0]),
                    why: "firings due",
                };
            }
            (false, Overlap::Skip) | (false, Overlap::BufferAll) | (false, Overlap::BufferOne) => {
                next.running.push(me.entry(due[0], 1, None));
                next.claimed = Some(due[0]);
                let mut records = vec![];
                let skipped: &[i64] = match s.overlap {
                    Overlap::Skip => &due[1..],
                    // The newest waits; those between it and the first are skipped.
                    Overlap::BufferOne if due.len() > 2 => &due[1..due.len() - 1],
                    _ => &[],
                };
                if !skipped.is_empty() {
                    next.claimed = skipped.last().copied();
                    records.push(me.records_many(
                        skipped,
                        Outcome::Skipped,
                        "overlap: caught up after another firing",
                    ));
                }
                return Step::Write {
                    next,
                    records,
                    claiming: Some(due[0]),
                    why: "a firing due",
                };
            }
            (false, Overlap::CancelOther) => {
                next.running.push(me.entry(last, 1, None));
                next.claimed = Some(last);
                let mut records = vec![];
                if due.len() > 1 {
                    records.push(me.records_many(
                        &due[..due.len() - 1],
                        Outcome::Skipped,
                        "overlap: a newer firing was due too",
                    ));
                }
                return Step::Write {
                    next,
                    records,
                    claiming: Some(due[0]),
                    why: "a firing due",
                };
            }
            (true, Overlap::Skip) => {
                next.claimed = Some(last);
                return Step::Write {
                    next,
                    records: vec![me.records_many(
                        due,
                        Outcome::Skipped,
                        "overlap: a run was still in flight",
                    )],
                    claiming: Some(due[0]),
                    why: "firings that overlapped",
                };
            }
            (true, Overlap::BufferOne) if due.len() > 1 => {
                let skipped = &due[..due.len() - 1];
                next.claimed = skipped.last().copied();
                return Step::Write {
                    next,
                    records: vec![me.records_many(
                        skipped,
                        Outcome::Skipped,
                        "overlap: a newer firing waits in its place",
                    )],
                    claiming: Some(due[0]),
                    why: "firings that overlapped",
                };
            }
            (true, Overlap::CancelOther) if busy => return cancel(&mine_started),
            // Waiting for the run in flight to end.
            (true, _) => {}
        }
    }

    // 7. Claim the next firing ahead of its time.
    let first_pending = st
        .running
        .iter()
        .filter(|e| !f.started.contains(&e.id))
        .map(due_at)
        .min();
    if let Some(n) = owed.next {
        let free = (!busy && !pending) || s.overlap == Overlap::Allow;
        let claimed_already = st.claimed.is_some_and(|c| c >= n);
        if free && !claimed_already && owed.due.is_empty() {
            if n - now <= LEAD_MS {
                next.running.push(me.entry(n, 1, None));
                next.claimed = Some(n);
                next.next = s.next_after(n);
                return Step::Write {
                    next,
                    records: vec![],
                    claiming: Some(n),
                    why: CLAIM_AHEAD,
                };
            }
            return Step::Wait {
                until_ms: Some(n - LEAD_MS),
                poll: false,
            };
        }
        let until = match first_pending {
            Some(p) => p.min(n),
            None => n,
        };
        return Step::Wait {
            until_ms: Some(until),
            poll: false,
        };
    }
    Step::Wait {
        until_ms: first_pending,
        poll: false,
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
    let late = e.trigger.is_none() && e.firing < f.now_ms - s.catchup.as_millis() as i64;
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
pub struct RunEnd {
    pub id: ObjectId,
    pub outcome: Outcome,
    pub reason: Option<String>,
    /// When its process started, on the server's clock as estimated.
    pub started_ms: Option<i64>,
    pub ended_ms: i64,
    /// The run stays in flight as the next attempt (restart on failure).
    pub retry: bool,
}

/// The state after a run of this instance ended, and its record; None when the run
/// is not in flight.
pub fn ended(st: &FiringState, me: &Me, end: RunEnd) -> Option<(FiringState, RunRecord)> {
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
        // The same holder's older generation (an update, a move back) too.
        let mut mine_before = me();
        mine_before.gen = 8;
        let mut st2 = state(T0);
        st2.running.push(mine_before.entry(T0, 1, None));
        assert_eq!(planned(&s, &st2, &me(), &facts(T0 + 2 * MIN)), wait);
        // Once that slot changed hands, the run was lost.
        f.slot_epochs.insert("slot-002".into(), 3);
        let (_, records, _) = written(planned(&s, &st, &me(), &f));
        assert_eq!(records[0].outcome, Some(Outcome::Lost));
    }

    #[test]
    fn firings_outside_the_window_are_missed_and_a_pause_is_skipped() {
        let s = Schedule::from_spec(&doc! {"schedule": {"every": "1m", "catchup": "5m"}}, T0)
            .unwrap()
            .unwrap();
        let (next, records, _) = written(planned(&s, &state(T0), &me(), &facts(T0 + 60 * MIN + 1)));
        assert_eq!(records[0].outcome, Some(Outcome::Missed));
        assert_eq!(records[0].count, Some(55));
        assert_eq!(next.missed, 55);
        assert_eq!(next.claimed, Some(T0 + 55 * MIN));
        // Then the five within the window: the first runs, the rest overlap it.
        let (next, records, claiming) =
            written(planned(&s, &next, &me(), &facts(T0 + 60 * MIN + 1)));
        assert_eq!(claiming, Some(T0 + 56 * MIN));
        assert_eq!(records[0].count, Some(4));
        assert_eq!(next.claimed, Some(T0 + 60 * MIN));
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
}
