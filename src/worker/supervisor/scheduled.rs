//! A scheduled robot's instance on its holder: it carries out the planner's steps
//! ([`super::firing_plan`]) one at a time, each write a compare-and-set on the
//! robot's firing state, sent through the slot's group commit.
//!
//! Time comes from the slot's firing clock ([`super::firing_clock`]): the server's
//! time, and one timer for all the slot's scheduled robots.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, oid::ObjectId};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::firing_clock::Shared;
use super::firing_plan::{end_write, plan, step_missed, Facts, Me, RunEnd, Step, StepMissed};
use super::runner::{FiringRun, Runner};
use crate::clock::SharedClock;
use crate::db::context::{ContextError, Loaded};
use crate::db::firing::{FiringState, FiringWrite, LastStep, Outcome, RunEntry, RunRecord};
use crate::db::group_commit::Written;
use crate::robot::restart::{Budget, Next, RestartOn, RestartPolicy};
use crate::robot::schedule::Schedule;
use crate::robot::{Left, RobotError};

/// The robot as the instance's next run starts from, after run `s` ended: what its
/// checkpoints left, when known. Only for a run that no other run of the instance
/// overlapped (the caller checks): another's checkpoints would have moved `seq`.
/// A last step counts only for a run that ended as `Succeeded` (see [`last_step`]).
fn carry(s: &Started, outcome: Outcome) -> Option<Loaded> {
    let left = s
        .left
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut next = match left {
        Left::Unknown => return None,
        Left::Final(..) if outcome != Outcome::Succeeded => return None,
        Left::Unchanged | Left::Context(..) | Left::Final(..) => s.from.clone(),
    };
    match left {
        Left::Context(context, seq) => (next.context, next.seq) = (context, seq),
        // A last step goes with the run's end: what it will be once that lands
        // (`finish` drops it when the end does not).
        Left::Final(context, after_seq, _) => (next.context, next.seq) = (context, after_seq + 1),
        Left::Unchanged | Left::Unknown => {}
    }
    Some(next)
}

/// The last step (`RobotRun::end_with`) of run `s`, which ended as `outcome`: it
/// goes with the end of a run that succeeded; without it, the run did not do its
/// work.
fn last_step(s: &Started, outcome: Outcome) -> Option<LastStep> {
    match &*s
        .left
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        Left::Final(context, after_seq, history) if outcome == Outcome::Succeeded => {
            Some(LastStep {
                context: context.clone(),
                after_seq: *after_seq,
                history: *history,
            })
        }
        _ => None,
    }
}

/// What became of a write of the firing state that the instance goes on after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// It landed.
    Landed,
    /// It matched nothing, and the robot was read again.
    Reread,
    /// The server refused it.
    Refused,
    /// No answer that says whether it landed.
    Unanswered,
}

/// Why a run whose last step was to be written with its end is handed on as cut
/// off: the end was not written by this instance, so neither was the step.
const STEP_NOT_WRITTEN: &str =
    "stopped before its end, which carried its last step, was written; the step did not land";

/// How often an instance reads its robot again while it waits for another
/// instance's run to end (nothing tells it when that happens).
const POLL: Duration = Duration::from_secs(1);

/// What became of a run, from what it returned and whether it was asked to stop
/// before it did (`asked`; `by_overlap`: by `cancel_other`, not by a stop of the
/// instance). `Finished` is a run that says it ran to its end: it succeeded, asked
/// or not. `Ok` is a run that returned: it succeeded unless it was asked to stop
/// first, when its work may be cut short.
fn outcome_of(
    result: &Result<(), RobotError>,
    asked: bool,
    by_overlap: bool,
) -> (Outcome, Option<String>) {
    let stopped = || {
        if by_overlap {
            (
                Outcome::Cancelled,
                Some("overlap cancel_other: a newer firing".to_string()),
            )
        } else {
            (Outcome::Stopped, Some(STOPPED.to_string()))
        }
    };
    match (result, asked) {
        (Err(RobotError::Finished), _) | (Ok(()), false) => (Outcome::Succeeded, None),
        (_, true) => stopped(),
        (Err(e), false) => (Outcome::Failed, Some(e.to_string())),
    }
}

/// Why a run its instance's stop cut off was recorded `stopped`.
const STOPPED: &str = "its instance was stopped (pause, update, move, restart or release)";

/// What a run's task returns: its id, its result, and whether it was asked to stop
/// before it returned.
type RunDone = (ObjectId, Result<(), RobotError>, bool);

// === impl Scheduled ===

/// A run of this instance, once started.
struct Started {
    token: CancellationToken,
    started_ms: i64,
    /// When it started, on this worker's clock (the restart budget's measure).
    began: Instant,
    /// The robot as the run started from, and what its checkpoints left.
    from: Loaded,
    left: Arc<Mutex<Left>>,
    /// The instance's count of starts when this one began, and whether no other
    /// run was in flight then: a run that began alone and ends with the count
    /// unchanged was not overlapped by another.
    start_no: u64,
    alone: bool,
}

/// What an instance knows of one run of its robot's firing state, beside the
/// stored entry. An entry with nothing left to know is dropped.
#[derive(Default)]
struct Run {
    /// Started here and not yet ended.
    started: Option<Started>,
    /// Started by this instance, ever: a claim among them is never given back.
    ran: bool,
    /// Its task, for a task that fails to return (a kind that panics).
    task: Option<tokio::task::Id>,
    /// Its end, not yet written (the instance stopped first, or the write failed):
    /// `stop_runs` writes it by the run's id, with whether the run was cut off.
    unwritten: Option<(RunRecord, bool)>,
    /// Asked to stop for a newer firing (overlap `cancel_other`).
    stopping: bool,
    /// A retry (restart.on failure) starts no sooner than this server time.
    not_before: Option<i64>,
    /// A start that did not happen (its lease was not open) is tried again no
    /// sooner than this server time. Unlike a backoff, it never extends how long
    /// the claim may wait to start (see `firing_plan::too_late_to_start`).
    start_again_at: Option<i64>,
    /// When this instance's write that put it in flight landed (server ms,
    /// estimated).
    claimed_at: Option<i64>,
}

impl Run {
    fn idle(&self) -> bool {
        self.started.is_none() && self.task.is_none() && self.unwritten.is_none()
    }
}

/// One scheduled robot's instance.
pub(super) struct Scheduled {
    r: Runner,
    shared: Shared,
    schedule: Schedule,
    me: Me,
    st: FiringState,
    kind_name: String,
    created_ms: Option<i64>,
    updated_ms: Option<i64>,
    /// Paused, as last read.
    paused: bool,
    /// The tasks of the runs in flight.
    tasks: JoinSet<RunDone>,
    /// What this instance knows of each run of the firing state, by the run's id.
    runs: HashMap<ObjectId, Run>,
    starts: u64,
    /// Other slots found gone, and since when.
    gone_since: HashMap<String, Instant>,
    /// The robot as the next run starts from: read at adoption, then carried from
    /// run to run (only the robot's own runs write its context), so that a firing
    /// costs no read. None when a run's last checkpoint may or may not have landed.
    carried: Option<Loaded>,
    /// Without `carried`, the robot as read right after a firing was claimed ahead,
    /// for that firing's start: the start then waits on the timer alone.
    preloaded: Option<(ObjectId, Loaded)>,
    /// The robot's `seq` as last read: a run's last step, written with its end, is
    /// fenced by the `seq` it followed.
    stored_seq: Option<i64>,
    budget: Budget,
    /// A write of the firing state went unanswered since the state was last read:
    /// it may have landed, putting in flight a run `st` does not list.
    unsure: bool,
}

impl Scheduled {
    pub(super) fn new(r: Runner, shared: Shared, loaded: &Loaded, schedule: Schedule) -> Scheduled {
        let me = Me {
            slot: r.ctx.slot_id().to_string(),
            epoch: r.ctx.epoch(),
            gen: r.gen,
            worker: r.ctx.worker().to_string(),
        };
        let policy = RestartPolicy::from_spec(&loaded.spec).unwrap_or_default();
        Scheduled {
            me,
            st: loaded.firings.clone(),
            kind_name: loaded.kind.clone(),
            created_ms: loaded.created_ms,
            updated_ms: loaded.updated_ms,
            paused: loaded.paused,
            schedule,
            shared,
            tasks: JoinSet::new(),
            runs: HashMap::new(),
            starts: 0,
            gone_since: HashMap::new(),
            preloaded: None,
            carried: Some(loaded.clone()),
            stored_seq: Some(loaded.seq),
            budget: Budget::new(policy),
            unsure: false,
            r,
        }
    }

    fn clock(&self) -> &SharedClock {
        &self.r.clock
    }

    /// Run `id` as this instance knows it (known from now on).
    fn run_mut(&mut self, id: ObjectId) -> &mut Run {
        self.runs.entry(id).or_default()
    }

    /// Whether a run of this instance is in flight.
    fn any_started(&self) -> bool {
        self.runs.values().any(|r| r.started.is_some())
    }

    /// Run `id`'s start, as it ends, and whether it was asked to stop for a newer
    /// firing.
    fn take_started(&mut self, id: ObjectId) -> Option<(Started, bool)> {
        let run = self.runs.get_mut(&id)?;
        let s = run.started.take()?;
        Some((s, std::mem::take(&mut run.stopping)))
    }

    /// The runs for which `pick` holds.
    fn ids_where(&self, pick: impl Fn(&Run) -> bool) -> HashSet<ObjectId> {
        self.runs
            .iter()
            .filter(|(_, r)| pick(r))
            .map(|(id, _)| *id)
            .collect()
    }

    /// What `value` says of each run, where it says something.
    fn by_id(&self, value: impl Fn(&Run) -> Option<i64>) -> HashMap<ObjectId, i64> {
        self.runs
            .iter()
            .filter_map(|(id, r)| Some((*id, value(r)?)))
            .collect()
    }

    /// The run whose task this was (its task is done).
    fn run_of_task(&mut self, task: tokio::task::Id) -> Option<ObjectId> {
        let (id, run) = self.runs.iter_mut().find(|(_, r)| r.task == Some(task))?;
        run.task = None;
        Some(*id)
    }

    /// Runs until the instance is stopped or fenced.
    ///
    /// `first_step`, for an instance a takeover started before its adoption write,
    /// is dropped once its first step is taken (the adoption waits on it).
    pub(super) async fn run(
        mut self,
        mut first_step: Option<super::firing_clock::FirstStep>,
    ) -> ObjectId {
        tracing::info!(robot = %self.r.name, schedule = %self.schedule.describe(), "scheduled robot adopted");
        let _renewals = self.shared.renewals.mark();
        self.say_if_odd();
        self.publish_rev();
        loop {
            if self.r.token.is_cancelled() {
                self.stop_runs().await;
                return self.r.id;
            }
            let Some(now_ms) = self.shared.time.now_ms(self.clock()) else {
                // The slot's supervisor reads the server's clock at each sync until
                // it has a reading: a thousand robots asking for themselves would
                // add a thousand commands to a server already too slow to answer.
                tracing::debug!(robot = %self.r.name, "no reading of the server's clock yet; waiting for the slot's");
                first_step.take();
                self.pause_for(POLL).await;
                continue;
            };
            // A run that ended is recorded before anything else is planned: behind
            // a backlog, the planner has a write to make at every step (the firings
            // that fall out of their window meanwhile, one a period), and a run's
            // end seen only while waiting was never seen, its run in flight for good
            // (first seen under a catch-up flood of 300 robots every second).
            if let Some(done) = self.tasks.try_join_next() {
                if !self.run_task_ended(done).await {
                    self.stop_runs().await;
                    return self.r.id;
                }
                continue;
            }
            let facts = self.facts(now_ms).await;
            let step = plan(&self.schedule, &self.st, &self.me, &facts);
            let go_on = match step {
                Step::Write {
                    next,
                    records,
                    claiming,
                    why,
                } => self.write(next, records, claiming, why).await,
                Step::Start(entries) => {
                    for e in entries {
                        self.start(e, now_ms).await;
                    }
                    true
                }
                Step::Cancel(ids) => {
                    for id in ids {
                        let Some(run) = self.runs.get_mut(&id) else {
                            continue;
                        };
                        if let Some(s) = &run.started {
                            tracing::info!(robot = %self.r.name, "overlap cancel_other: stopping the run in flight for a newer firing");
                            s.token.cancel();
                            run.stopping = true;
                        }
                    }
                    true
                }
                Step::Wait { until_ms, poll } => {
                    first_step.take();
                    self.wait(until_ms, poll).await
                }
            };
            first_step.take();
            if !go_on {
                self.stop_runs().await;
                return self.r.id;
            }
        }
    }

    /// Entries of `firings` that are not what a holder writes (a hand edit) are
    /// dropped by the next write: said here, before they go.
    fn say_if_odd(&self) {
        if self.st.odd > 0 {
            tracing::warn!(robot = %self.r.name, entries = self.st.odd, "the robot's `firings` holds entries that are not runs or requests (a hand edit?); the next write of its firing state drops them");
        }
    }

    fn publish_rev(&self) {
        self.shared
            .known_rev
            .store(self.st.rev.unwrap_or(0), Ordering::Release);
    }

    async fn pause_for(&self, d: Duration) {
        tokio::select! {
            _ = self.r.token.cancelled() => {}
            _ = self.clock().sleep(d) => {}
        }
    }

    /// What the planner needs beside the stored state: for runs of other slots, the
    /// epoch each of those slots holds now (one read, only then).
    async fn facts(&mut self, now_ms: i64) -> Facts {
        let mut f = Facts {
            now_ms,
            lease_began_ms: self.shared.time.lease_began(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            paused: self.paused,
            started: self.ids_where(|r| r.started.is_some()),
            stopping: self.ids_where(|r| r.stopping),
            not_before: self.by_id(|r| r.not_before),
            start_again_at: self.by_id(|r| r.start_again_at),
            claimed_at: self.by_id(|r| r.claimed_at),
            ..Facts::default()
        };
        let others: HashSet<String> = self
            .st
            .running
            .iter()
            .filter(|e| e.slot != self.me.slot)
            .map(|e| e.slot.clone())
            .collect();
        if others.is_empty() {
            return f;
        }
        let ids: Vec<String> = others.iter().cloned().collect();
        let found = crate::db::lease::epochs(&self.r.store, &ids).await;
        match found {
            Ok(epochs) => {
                let lease = self.shared.lease;
                for slot in &others {
                    if epochs.contains_key(slot) {
                        self.gone_since.remove(slot);
                    } else {
                        let since = *self
                            .gone_since
                            .entry(slot.clone())
                            .or_insert_with(|| self.r.clock.now());
                        if self.r.clock.since(since) > lease {
                            f.gone.insert(slot.clone());
                        }
                    }
                }
                f.slot_epochs = epochs;
            }
            Err(e) => {
                tracing::debug!(robot = %self.r.name, "could not read the slots of runs in flight elsewhere ({}); waiting", crate::db::store::brief(&e))
            }
        }
        f
    }

    /// One compare-and-set write of the firing state. False when this instance is
    /// no longer the robot's current one (it stops).
    async fn write(
        &mut self,
        next: FiringState,
        records: Vec<RunRecord>,
        claiming: Option<i64>,
        why: &'static str,
    ) -> bool {
        self.try_write(next, records, claiming, None, why)
            .await
            .is_some()
    }

    /// [`Scheduled::write`], with a run's last step in the same statement, and what
    /// became of it; `None` when the instance stops.
    async fn try_write(
        &mut self,
        next: FiringState,
        records: Vec<RunRecord>,
        claiming: Option<i64>,
        last_step: Option<&LastStep>,
        why: &'static str,
    ) -> Option<Tried> {
        let mut next = next;
        next.note(&records);
        let go_on = |b: bool, tried: Tried| b.then_some(tried);
        match self
            .compare_and_set(&next, &records, claiming, last_step)
            .await
        {
            Ok(Written::Applied) => {
                if let Some(step) = last_step {
                    self.r.metrics.checkpoints.inc();
                    self.stored_seq = Some(step.after_seq + 1);
                }
                tracing::debug!(robot = %self.r.name, why, "firing state written");
                self.count(&records, claiming);
                self.record_events(&records);
                self.written(next);
                self.publish_rev();
                self.preload(claiming).await;
                Some(Tried::Landed)
            }
            Ok(Written::Fenced) => {
                let before = self.st.rev;
                let reloaded = self.reload().await;
                // A last step over a `seq` that moved: the caller drops it.
                let seq_moved = last_step.is_some_and(|l| self.stored_seq != Some(l.after_seq));
                if reloaded && self.st.rev == before && !seq_moved {
                    // Matched nothing, yet nothing changed that a read shows: a
                    // hand-edited `firings` (a `rev` that is no integer?). Not a
                    // busy loop on the slot's shared write queue.
                    tracing::warn!(robot = %self.r.name, "the robot's firing state matched no write although it reads unchanged (a hand edit of `firings`?); trying again in {} s. Fix it by hand, e.g. db.robots.updateOne({{name: \"{}\"}}, {{$unset: {{firings: 1}}}})", POLL.as_secs(), self.r.name);
                    self.pause_for(POLL).await;
                }
                go_on(reloaded, Tried::Reread)
            }
            Ok(Written::Lapsed) => None,
            Ok(Written::Refused(why)) => {
                if matches!(self.r.ctx.heal_runs(&self.r.id, self.r.gen).await, Ok(true)) {
                    tracing::warn!(robot = %self.r.name, "the robot's `runs` was not a list (a hand edit?), so no run could be recorded; it is now an empty one");
                    return go_on(self.reload().await, Tried::Reread);
                }
                if last_step.is_some() {
                    // Perhaps the step's part (a hand-broken `history`): the end goes
                    // again without it, at once.
                    tracing::warn!(robot = %self.r.name, "the database refused the end of a run with its last step ({})", crate::secrets::scrub(&why));
                    return go_on(self.reload().await, Tried::Refused);
                }
                tracing::error!(robot = %self.r.name, "the database refused the robot's firing state ({}); fix its `runs` by hand, e.g. db.robots.updateOne({{name: \"{}\"}}, {{$set: {{runs: []}}}})", crate::secrets::scrub(&why), self.r.name);
                self.pause_for(Duration::from_secs(10)).await;
                go_on(self.reload().await, Tried::Reread)
            }
            Err(e) => go_on(self.after_error(e).await, Tried::Unanswered),
        }
    }

    /// Lost runs and missed firings go to `events` too (the dashboard's timeline
    /// marks them): they are rare, and each is news. Written in a task of their
    /// own, so the retry of a lost run does not wait on them.
    fn record_events(&self, records: &[RunRecord]) {
        use crate::db::event::EventKind;
        use crate::db::field::{DETAIL, EPOCH, ROBOT, SLOT_ID, WORKER};
        let mut events = Vec::new();
        for r in records {
            let kind = match r.outcome {
                Some(Outcome::Lost) => EventKind::FiringLost,
                Some(Outcome::Missed) => EventKind::FiringMissed,
                _ => continue,
            };
            let detail = format!(
                "firing {}{}: {}",
                crate::robot::schedule::rfc3339(r.firing),
                r.count
                    .map(|n| format!(" and {} more", n - 1))
                    .unwrap_or_default(),
                r.reason.as_deref().unwrap_or("")
            );
            events.push((
                kind,
                doc! {
                    WORKER: self.r.ctx.worker(), SLOT_ID: self.r.ctx.slot_id(),
                    EPOCH: self.r.ctx.epoch(), ROBOT: &self.r.name, DETAIL: detail,
                },
            ));
        }
        if events.is_empty() {
            return;
        }
        let store = self.r.store.clone();
        tokio::spawn(async move {
            for (kind, fields) in events {
                store.record_event(kind, fields).await;
            }
        });
    }

    fn count(&self, records: &[RunRecord], claiming: Option<i64>) {
        let m = self.r.metrics.as_ref();
        if claiming.is_some() {
            m.firings_claimed.inc();
        }
        for r in records {
            let n = r.count.unwrap_or(1).max(1) as u64;
            match r.outcome {
                Some(Outcome::Missed) => {
                    m.firings_missed.inc_by(n);
                }
                Some(Outcome::Skipped) => {
                    m.firings_skipped.inc_by(n);
                }
                Some(Outcome::Lost) => {
                    m.firings_lost.inc_by(n);
                }
                _ => {}
            }
        }
    }

    /// Reads the robot again after a write matched nothing: another writer raised
    /// `rev` (a run-now request, a pause, a replaced instance's end), or this
    /// instance is fenced. False when fenced.
    async fn reload(&mut self) -> bool {
        match self
            .r
            .ctx
            .load_paced(&self.r.id, self.r.gen, &self.r.name)
            .await
        {
            Ok(l) => {
                self.stored_seq = Some(l.seq);
                self.st = l.firings;
                self.unsure = false;
                self.paused = l.paused;
                self.publish_rev();
                self.say_if_odd();
                true
            }
            Err(e) => self.after_error(e).await,
        }
    }

    async fn after_error(&mut self, e: ContextError) -> bool {
        match e {
            ContextError::Fenced { .. } | ContextError::Lapsed { .. } => {
                tracing::debug!(robot = %self.r.name, "{e}");
                false
            }
            other => {
                tracing::warn!(robot = %self.r.name, "firing state: {other}; trying again");
                self.unsure = true;
                self.pause_for(POLL).await;
                !self.r.token.is_cancelled()
            }
        }
    }

    /// After a firing was claimed ahead with no run in flight, reads the robot for
    /// its start: nothing but this instance's runs changes its context, and none
    /// will run before that firing.
    async fn preload(&mut self, claiming: Option<i64>) {
        self.preloaded = None;
        let Some(t) = claiming else { return };
        if self.carried.is_some() {
            return;
        }
        let Some(e) = self
            .st
            .running
            .iter()
            .find(|e| e.firing == t && e.trigger.is_none())
        else {
            return;
        };
        let now = self.shared.time.now_ms(self.clock()).unwrap_or(i64::MAX);
        if self.any_started() || t <= now {
            return;
        }
        let id = e.id;
        if let Ok(l) = self
            .r
            .ctx
            .load_paced(&self.r.id, self.r.gen, &self.r.name)
            .await
        {
            self.preloaded = Some((id, l));
        }
    }

    /// Starts a claimed run: only while the lease holds (a holder thawed after its
    /// deadline starts nothing), from the context as it stands now.
    async fn start(&mut self, e: RunEntry, now_ms: i64) {
        if !self.r.ctx.lease_open() {
            // Stopped with the lease any moment now; meanwhile, not a busy loop.
            self.pause_for(POLL).await;
            return;
        }
        // Two runs at once (`overlap: allow`) each read the robot.
        let carried = self.carried.take().filter(|_| !self.any_started());
        let preloaded = match (carried, self.preloaded.take()) {
            (Some(l), _) => Ok(l),
            (None, Some((id, l)))
                if id == e.id && !self.any_started() && l.firings.rev <= self.st.rev =>
            {
                Ok(l)
            }
            _ => {
                self.r
                    .ctx
                    .load_paced(&self.r.id, self.r.gen, &self.r.name)
                    .await
            }
        };
        let loaded = match preloaded {
            Ok(l) => l,
            Err(err) => {
                tracing::warn!(robot = %self.r.name, "cannot load the robot to start its run ({err})");
                self.pause_for(POLL).await;
                return;
            }
        };
        if loaded.firings.rev > self.st.rev {
            // Someone raised rev meanwhile: plan again from what is stored.
            self.st = loaded.firings;
            self.publish_rev();
            return;
        }
        let Some(kind) = self.r.registry.get(&self.kind_name) else {
            let end = RunEnd {
                id: e.id,
                outcome: Outcome::Failed,
                reason: Some(format!(
                    "unknown robot kind {:?} on this worker",
                    self.kind_name
                )),
                started_ms: None,
                ended_ms: now_ms,
                retry: false,
            };
            self.record_end(end, None).await;
            return;
        };
        let token = self.r.token.child_token();
        let left = Arc::new(Mutex::new(Left::Unchanged));
        let from = loaded.clone();
        let run = self.r.launch(
            kind,
            loaded,
            token.clone(),
            Some(FiringRun {
                firing: e.firing,
                attempt: e.attempt,
                left: left.clone(),
            }),
        );
        let started_ms = self.shared.time.now_ms(self.clock()).unwrap_or(now_ms);
        let lateness = (started_ms - e.firing).max(0);
        self.r
            .metrics
            .firing_lateness
            .observe(Duration::from_millis(lateness as u64));
        self.r.metrics.firings_started.inc();
        tracing::info!(robot = %self.r.name, firing = %crate::robot::schedule::rfc3339(e.firing), attempt = e.attempt, lateness_ms = lateness, "firing started");
        let id = e.id;
        let asked = token.clone();
        let task = self.tasks.spawn(async move {
            let result = run.await;
            (id, result, asked.is_cancelled())
        });
        self.starts += 1;
        let began = self.r.clock.now();
        let alone = !self.any_started();
        let start_no = self.starts;
        // Its backoff, if any, is kept: a start that does not happen is still held
        // to the slack after the backoff (see `firing_plan::too_late_to_start`).
        let run = self.run_mut(id);
        run.start_again_at = None;
        run.task = Some(task.id());
        run.ran = true;
        run.started = Some(Started {
            token,
            started_ms,
            began,
            from,
            left,
            start_no,
            alone,
        });
    }

    /// Waits for the next step's time, a run's end, or news of the document.
    async fn wait(&mut self, until_ms: Option<i64>, poll: bool) -> bool {
        let at = until_ms.and_then(|ms| self.shared.time.instant_at(ms, &self.r.clock));
        let alarm = self.shared.alarm.clone();
        let wake = self.shared.wake.clone();
        let clock = self.r.clock.clone();
        tokio::select! {
            _ = self.r.token.cancelled() => true,
            Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => self.run_task_ended(done).await,
            _ = async { alarm.until(at.expect("checked")).await }, if at.is_some() => true,
            _ = clock.sleep(POLL), if poll => self.reload().await,
            _ = wake.notified() => self.reload().await,
        }
    }

    /// A run's task ended, by itself or failing: see [`Scheduled::finish`].
    async fn run_task_ended(&mut self, done: Result<RunDone, tokio::task::JoinError>) -> bool {
        match done {
            Ok((id, result, asked)) => {
                if let Some(run) = self.runs.get_mut(&id) {
                    run.task = None;
                }
                self.finish(id, result, asked).await
            }
            Err(e) => {
                tracing::error!(robot = %self.r.name, "a run's task failed: {e}");
                match self.run_of_task(e.id()) {
                    Some(id) => {
                        let failed = Err(RobotError::Crashed(format!("its task failed: {e}")));
                        self.finish(id, failed, false).await
                    }
                    None => true,
                }
            }
        }
    }

    /// A run ended: its record, and its retry when `restart.on` is `failure`.
    async fn finish(&mut self, id: ObjectId, result: Result<(), RobotError>, asked: bool) -> bool {
        let Some((s, by_overlap)) = self.take_started(id) else {
            return true;
        };
        if let Err(RobotError::NotStarted(why)) = &result {
            self.not_started(id, s, why);
            return true;
        }
        let (mut outcome, mut reason, ended_ms) = self.ended_as(&s, &result, asked, by_overlap);
        self.carried = (s.alone && self.starts == s.start_no && !self.any_started())
            .then(|| carry(&s, outcome))
            .flatten();
        // A last step (`RobotRun::end_with`) goes with the end of a run that
        // succeeded; without it, its run did not do its work.
        let last_step = last_step(&s, outcome);
        if last_step.is_some() && self.r.token.is_cancelled() {
            // Its step cannot go with an end written by the run's id: the run is
            // handed on as cut off, to be retried or skipped as `on_lost` says.
            (outcome, reason) = (Outcome::Stopped, Some(STEP_NOT_WRITTEN.to_string()));
        }
        if self.r.token.is_cancelled() {
            // The instance is stopping: `stop_runs` writes this end by the run's id.
            self.keep_unwritten(id, &s, outcome, reason, ended_ms);
            return true;
        }
        if matches!(result, Err(RobotError::Fenced(_))) && !self.reload().await {
            // No longer the robot's current instance: the run was cut off by that,
            // and is handed on as such.
            self.keep_unwritten(id, &s, Outcome::Stopped, reason, ended_ms);
            return false;
        }
        // restart.on failure: the firing's next attempt is written at once, and
        // starts after the backoff (the instance goes on meanwhile).
        let mut backoff = None;
        if outcome == Outcome::Failed && self.budget.policy().on == RestartOn::Failure {
            if let Next::RestartAfter(b) = self.budget.ended(s.began, self.clock().now(), false) {
                self.r.metrics.robot_restarts.inc();
                backoff = Some(b);
            }
        }
        if outcome == Outcome::Failed {
            self.r.metrics.firings_failed.inc();
        }
        let end = RunEnd {
            id,
            outcome,
            reason: reason.clone(),
            started_ms: Some(s.started_ms),
            ended_ms,
            retry: backoff.is_some(),
        };
        let (firing, attempt) = self
            .st
            .running
            .iter()
            .find(|e| e.id == id)
            .map_or((0, 0), |e| (e.firing, e.attempt));
        // `carried` already holds the step (see `carry`), so that the next firing's
        // claim in the end's write is not followed by a read.
        let had_step = last_step.is_some();
        let (go_on, step_landed) = self.record_end(end, last_step.clone()).await;
        if had_step && !step_landed {
            self.carried = None;
        }
        if !go_on {
            // Not written (the instance stops): written by the run's id instead, as
            // cut off when its step was to go with it.
            if had_step {
                (outcome, reason) = (Outcome::Stopped, Some(STEP_NOT_WRITTEN.to_string()));
            }
            self.keep_unwritten(id, &s, outcome, reason, ended_ms);
            return false;
        }
        if let Some(b) = backoff {
            let again = self
                .st
                .running
                .iter()
                .find(|e| e.firing == firing && e.attempt == attempt + 1)
                .map(|e| e.id);
            if let Some(again) = again {
                self.run_mut(again).not_before = Some(ended_ms + b.as_millis() as i64);
            }
        }
        go_on
    }

    /// Run `id` never started (its lease ended before its process could): it is no
    /// run that ended. It stays claimed, to start again after a pause (or be
    /// recorded missed once too late), or to be handed on if the instance stops.
    fn not_started(&mut self, id: ObjectId, s: Started, why: &str) {
        tracing::warn!(robot = %self.r.name, "a firing's run did not start ({why}); it stays claimed");
        let run = self.run_mut(id);
        run.stopping = false;
        run.ran = false;
        if s.alone && self.starts == s.start_no && !self.any_started() {
            // Nothing ran, and no other run of this instance overlapped it: the robot
            // is as the run was to start from.
            self.carried = Some(s.from);
        }
        let now_ms = self
            .shared
            .time
            .now_ms(self.clock())
            .unwrap_or(s.started_ms);
        self.run_mut(id).start_again_at = Some(now_ms + POLL.as_millis() as i64);
    }

    /// What became of run `s` ([`outcome_of`]), and when it ended on the server's
    /// clock.
    fn ended_as(
        &self,
        s: &Started,
        result: &Result<(), RobotError>,
        asked: bool,
        by_overlap: bool,
    ) -> (Outcome, Option<String>, i64) {
        let (outcome, reason) = outcome_of(result, asked, by_overlap);
        let ended_ms = self
            .shared
            .time
            .now_ms(self.clock())
            .unwrap_or(s.started_ms);
        (outcome, reason, ended_ms)
    }

    /// Keeps the end of run `id` for `stop_runs`, when its entry is still in flight
    /// as this instance knows it. A run cut off by the stop is handed on as such.
    fn keep_unwritten(
        &mut self,
        id: ObjectId,
        s: &Started,
        outcome: Outcome,
        reason: Option<String>,
        ended_ms: i64,
    ) {
        let Some(e) = self.st.running.iter().find(|e| e.id == id) else {
            return;
        };
        let record = self.record_of(e, s.started_ms, outcome, reason, Some(ended_ms));
        // Handed on: a run cut short, and a failed one that `restart.on: failure`
        // would have run again (the next instance retries it, as `on_lost` says).
        let retry = outcome == Outcome::Failed && self.budget.policy().on == RestartOn::Failure;
        self.run_mut(id).unwritten = Some((record, outcome == Outcome::Stopped || retry));
    }

    /// The record of this instance's run `e`, started at `started_ms`.
    fn record_of(
        &self,
        e: &RunEntry,
        started_ms: i64,
        outcome: Outcome,
        reason: Option<String>,
        ended_ms: Option<i64>,
    ) -> RunRecord {
        RunRecord {
            firing: e.firing,
            attempt: e.attempt,
            outcome: Some(outcome),
            reason,
            started: Some(started_ms),
            ended: ended_ms,
            lateness_ms: Some((started_ms - e.firing).max(0)),
            worker: self.me.worker.clone(),
            slot: self.me.slot.clone(),
            epoch: self.me.epoch,
            by: e.by.clone(),
            count: None,
            last: None,
        }
    }

    /// Writes a run's end, again on a newer state when another writer raised `rev`.
    /// When the plan after it is to claim the next firing ahead, the claim goes in
    /// the same write: one write a firing in the steady state. The run's last step,
    /// if it has one, goes in it too. Answers whether the instance goes on, and
    /// whether the step landed.
    async fn record_end(
        &mut self,
        mut end: RunEnd,
        mut last_step: Option<LastStep>,
    ) -> (bool, bool) {
        let mut unexplained = 0;
        loop {
            if self.r.token.is_cancelled() {
                return (false, false);
            }
            if !self.st.running.iter().any(|e| e.id == end.id) {
                // Its end is on record already: nothing to plan around it.
                return (true, false);
            }
            let facts = match self.shared.time.now_ms(self.clock()) {
                Some(now_ms) if !self.r.token.is_cancelled() => Some(self.facts(now_ms).await),
                _ => None,
            };
            let Some(write) = end_write(
                &self.schedule,
                &self.st,
                &self.me,
                end.clone(),
                facts.as_ref(),
            ) else {
                return (true, false);
            };
            let rev = self.st.rev;
            let tried = self
                .try_write(
                    write.next,
                    write.records,
                    write.claiming,
                    last_step.as_ref(),
                    "a run's end",
                )
                .await;
            let reread = match tried {
                None => return (false, false),
                Some(Tried::Landed) => return (true, last_step.is_some()),
                Some(Tried::Refused) if last_step.is_some() => {
                    let why = "the database refused its last step".to_string();
                    self.drop_step(&mut end, &mut last_step, Outcome::Failed, why, false);
                    continue;
                }
                // Read again: what is stored now says whether the step can land.
                Some(Tried::Reread | Tried::Refused) => true,
                Some(Tried::Unanswered) => false,
            };
            let in_flight = self.st.running.iter().any(|e| e.id == end.id);
            let Some(step) = last_step.as_ref().filter(|_| in_flight && reread) else {
                continue;
            };
            let (missed, count) = step_missed(
                &self.schedule,
                step.after_seq,
                self.stored_seq,
                self.st.rev == rev,
                unexplained,
            );
            unexplained = count;
            if let StepMissed::Drop {
                outcome,
                why,
                retry,
            } = missed
            {
                self.drop_step(&mut end, &mut last_step, outcome, why, retry);
            }
        }
    }

    /// A run's last step that cannot land is dropped, and its end recorded as
    /// `outcome` with `why` (and, with `retry`, the firing's next attempt in flight).
    fn drop_step(
        &self,
        end: &mut RunEnd,
        last_step: &mut Option<LastStep>,
        outcome: Outcome,
        why: String,
        retry: bool,
    ) {
        tracing::warn!(robot = %self.r.name, "a run's end is written without its last step: {why}");
        if outcome == Outcome::Failed {
            self.r.metrics.firings_failed.inc();
        }
        end.outcome = outcome;
        end.reason = Some(why);
        end.retry = retry;
        *last_step = None;
    }

    /// Gives a claim that never started back, while this instance is still the
    /// robot's current one: the firing is owed again, to whoever runs the robot
    /// next (a pause then records it skipped). Only the latest claim can go back
    /// (`claimed` moves back to just before it); true when it did.
    async fn give_back(&mut self, e: &RunEntry) -> bool {
        if self.st.claimed != Some(e.firing) || e.trigger.is_some() || e.attempt > 1 {
            return false;
        }
        let mut next = self.st.clone();
        next.running.retain(|r| r.id != e.id);
        next.claimed = Some(e.firing - 1);
        let written = self.compare_and_set(&next, &[], None, None).await;
        if matches!(written, Ok(Written::Applied)) {
            self.written(next);
            return true;
        }
        false
    }

    /// The stored state becomes `next`, over the state as this instance knows it.
    async fn compare_and_set(
        &self,
        next: &FiringState,
        records: &[RunRecord],
        claiming: Option<i64>,
        last_step: Option<&LastStep>,
    ) -> Result<Written, ContextError> {
        self.r
            .ctx
            .write_firings(
                &self.r.id,
                self.r.gen,
                FiringWrite {
                    prev: &self.st,
                    next,
                    records,
                    keep: self.schedule.keep_runs,
                    claiming,
                    last_step,
                },
            )
            .await
    }

    /// `next` landed: it is the state now, one `rev` on; the runs it put in flight
    /// were claimed now.
    fn written(&mut self, next: FiringState) {
        // It was written over `st`: no unanswered write before it landed.
        self.unsure = false;
        if let Some(now_ms) = self.shared.time.now_ms(self.clock()) {
            for e in &next.running {
                if !self.st.running.iter().any(|r| r.id == e.id) {
                    self.run_mut(e.id).claimed_at = Some(now_ms);
                }
            }
        }
        // What is known of a run that left the state and has nothing in flight goes.
        self.runs
            .retain(|id, run| !run.idle() || next.running.iter().any(|e| &e.id == id));
        self.st = next;
        self.st.rev = Some(self.st.rev.unwrap_or(0) + 1);
    }

    /// The instance is stopping (moved, updated, paused, restarted, released): its
    /// runs stop with their grace, and while the lease holds, each run's end is
    /// recorded by its id: what it returned when it ended by itself, or `stopped`,
    /// handed to the next instance as cut off. A claim that never started goes back
    /// (or on, as not started) first ([`Scheduled::hand_on_unstarted`]). With the
    /// lease gone, nothing is written: the next holder judges the runs by that lease.
    async fn stop_runs(&mut self) {
        let handed = self.hand_on_unstarted().await;
        while let Some(done) = self.tasks.join_next().await {
            let (id, result, asked) = match done {
                Ok(done) => {
                    if let Some(run) = self.runs.get_mut(&done.0) {
                        run.task = None;
                    }
                    done
                }
                Err(e) => match self.run_of_task(e.id()) {
                    Some(id) => {
                        let failed = Err(RobotError::Crashed(format!("its task failed: {e}")));
                        (id, failed, false)
                    }
                    None => continue,
                },
            };
            if let Some((s, by_overlap)) = self.take_started(id) {
                if let Err(RobotError::NotStarted(why)) = &result {
                    // Given back or handed on below, as a claim that never started.
                    self.not_started(id, s, why);
                    continue;
                }
                let (mut outcome, mut reason, ended_ms) =
                    self.ended_as(&s, &result, asked, by_overlap);
                if last_step(&s, outcome).is_some() {
                    // An end written by the run's id carries no step: cut off.
                    (outcome, reason) = (Outcome::Stopped, Some(STEP_NOT_WRITTEN.to_string()));
                }
                self.keep_unwritten(id, &s, outcome, reason, ended_ms);
            }
        }
        if !self.r.ctx.lease_open() {
            return;
        }
        let mine = self.mine().await;
        let now_ms = self.shared.time.now_ms(self.clock());
        for e in mine.into_iter().filter(|e| !handed.contains(&e.id)) {
            let run = self.runs.remove(&e.id).unwrap_or_default();
            let end = run.unwritten;
            // A run whose task failed to return (a panic) is still listed started.
            let lingering = run.started;
            let never_started = end.is_none() && lingering.is_none() && !run.ran;
            if never_started && self.give_back(&e).await {
                continue;
            }
            let (record, cut_off) = match (end, lingering) {
                (Some((record, cut_off)), _) => (Some(record), cut_off),
                (None, Some(s)) => (
                    Some(self.record_of(
                        &e,
                        s.started_ms,
                        Outcome::Stopped,
                        Some(STOPPED.into()),
                        now_ms,
                    )),
                    true,
                ),
                // Never started: handed on as such, to be started by the next
                // instance as the same attempt.
                (None, None) => (None, true),
            };
            let mut e = e;
            e.not_started = record.is_none() && !run.ran;
            self.end_by_id(&e, record.as_ref(), cut_off).await;
        }
    }

    /// At a stop, first gives back or hands on the claims that never started: they
    /// wait for no run, and the runs may take the whole stop grace, after which the
    /// instance is aborted. Returns the runs it handled.
    async fn hand_on_unstarted(&mut self) -> HashSet<ObjectId> {
        let mut handed = HashSet::new();
        if !self.r.ctx.lease_open() {
            return handed;
        }
        for e in self.mine().await {
            let unstarted = self.runs.get(&e.id).is_none_or(|r| {
                r.task.is_none() && r.started.is_none() && !r.ran && r.unwritten.is_none()
            });
            if !unstarted {
                continue;
            }
            self.runs.remove(&e.id);
            handed.insert(e.id);
            if self.give_back(&e).await {
                continue;
            }
            let mut e = e;
            e.not_started = true;
            self.end_by_id(&e, None, true).await;
        }
        handed
    }

    /// This instance's runs in flight, as stored: read again first when a write
    /// went unanswered, since it may have put one in flight that `st` does not list
    /// (a run nobody would end, holding the robot's next firings back).
    async fn mine(&mut self) -> Vec<RunEntry> {
        if self.unsure {
            if let Ok(l) = self
                .r
                .ctx
                .load_paced(&self.r.id, self.r.gen, &self.r.name)
                .await
            {
                self.st = l.firings;
                self.unsure = false;
            }
        }
        self.st
            .running
            .iter()
            .filter(|e| e.slot == self.me.slot && e.epoch == self.me.epoch && e.gen == self.me.gen)
            .cloned()
            .collect()
    }

    /// Records run `e`'s end by its id, tried again while the lease holds and the
    /// database may answer; a refusal (a hand-edited document) is said and left.
    async fn end_by_id(&self, e: &RunEntry, record: Option<&RunRecord>, cut_off: bool) {
        let mut wait = Duration::from_millis(100);
        loop {
            let r = self
                .r
                .ctx
                .end_run_by_id(&self.r.id, e, record, cut_off, self.schedule.keep_runs)
                .await;
            match r {
                Ok(_) => return,
                Err(ContextError::Db(err)) if !crate::db::store::is_transient(&err) => {
                    tracing::error!(robot = %self.r.name, "the database refused the end of a stopped run ({}); fix the robot's `runs` by hand, e.g. db.robots.updateOne({{name: \"{}\"}}, {{$set: {{runs: []}}}})", crate::db::store::brief(&err), self.r.name);
                    return;
                }
                Err(err) if self.r.ctx.lease_open() => {
                    tracing::warn!(robot = %self.r.name, "could not record the end of a stopped run ({err}); trying again");
                    self.r.clock.sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(err) => {
                    tracing::warn!(robot = %self.r.name, "could not record the end of a stopped run ({err}); the next holder judges it by this lease");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_says_it_ran_to_its_end_succeeded_even_after_a_stop() {
        let crashed = || Err(RobotError::Crashed("exit status: 3".into()));
        let of = |r: &Result<(), RobotError>, asked, overlap| outcome_of(r, asked, overlap).0;
        // Ended by itself.
        assert_eq!(of(&Ok(()), false, false), Outcome::Succeeded);
        assert_eq!(
            of(&Err(RobotError::Finished), false, false),
            Outcome::Succeeded
        );
        assert_eq!(of(&crashed(), false, false), Outcome::Failed);
        // Asked to stop first: it may have been cut short, unless it says it ran to
        // its end (a counter's step is whole).
        assert_eq!(
            of(&Err(RobotError::Finished), true, false),
            Outcome::Succeeded
        );
        assert_eq!(
            of(&Err(RobotError::Finished), true, true),
            Outcome::Succeeded
        );
        assert_eq!(of(&Ok(()), true, false), Outcome::Stopped);
        assert_eq!(of(&crashed(), true, false), Outcome::Stopped);
        assert_eq!(of(&Ok(()), true, true), Outcome::Cancelled);
        assert_eq!(
            outcome_of(&Ok(()), true, true).1.as_deref(),
            Some("overlap cancel_other: a newer firing")
        );
    }
}
