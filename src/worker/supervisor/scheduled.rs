//! A scheduled robot's instance on its holder: it carries out the planner's steps
//! ([`super::firing_plan`]) one at a time, each write a compare-and-set on the
//! robot's firing state, sent through the slot's group commit.
//!
//! Time comes from the slot's firing clock ([`super::firing_clock`]): the server's
//! time, and one timer for all the slot's scheduled robots.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, oid::ObjectId};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::firing_clock::Shared;
use super::firing_plan::{ended, plan, Facts, Me, RunEnd, Step, CLAIM_AHEAD};
use super::runner::Runner;
use crate::clock::SharedClock;
use crate::db::context::{ContextError, Loaded};
use crate::db::firing::{FiringState, Outcome, RunEntry, RunRecord};
use crate::db::group_commit::Written;
use crate::robot::restart::{Budget, Next, RestartOn, RestartPolicy};
use crate::robot::schedule::Schedule;
use crate::robot::{history_len, Left, RobotError, RobotRun};

/// The robot as the instance's next run starts from, after run `s` ended: what its
/// checkpoints left, when known and no other run of the instance is in flight.
fn carry(s: &Started, alone: bool) -> Option<Loaded> {
    let left = s
        .left
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    match left {
        _ if !alone => None,
        Left::Unchanged => Some(s.from.clone()),
        Left::Context(context, seq) => Some(Loaded {
            context,
            seq,
            ..s.from.clone()
        }),
        Left::Unknown => None,
    }
}

/// How often an instance reads its robot again while it waits for another
/// instance's run to end (nothing tells it when that happens).
const POLL: Duration = Duration::from_secs(1);

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
    /// Paused, as last read.
    paused: bool,
    runs: JoinSet<(ObjectId, Result<(), RobotError>)>,
    started: HashMap<ObjectId, Started>,
    stopping: HashSet<ObjectId>,
    /// Other slots found gone, and since when.
    gone_since: HashMap<String, Instant>,
    /// Retries (restart.on failure) not to start before these server times.
    not_before: HashMap<ObjectId, i64>,
    /// The robot as the next run starts from: read at adoption, then carried from
    /// run to run (only the robot's own runs write its context), so that a firing
    /// costs no read. None when a run's last checkpoint may or may not have landed.
    carried: Option<Loaded>,
    /// Without `carried`, the robot as read right after a firing was claimed ahead,
    /// for that firing's start: the start then waits on the timer alone.
    preloaded: Option<(ObjectId, Loaded)>,
    budget: Budget,
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
            paused: loaded.paused,
            schedule,
            shared,
            runs: JoinSet::new(),
            started: HashMap::new(),
            stopping: HashSet::new(),
            gone_since: HashMap::new(),
            preloaded: None,
            carried: Some(loaded.clone()),
            not_before: HashMap::new(),
            budget: Budget::new(policy),
            r,
        }
    }

    fn clock(&self) -> &SharedClock {
        &self.r.clock
    }

    /// Runs until the instance is stopped or fenced.
    pub(super) async fn run(mut self) -> ObjectId {
        tracing::info!(robot = %self.r.name, schedule = %self.schedule.describe(), "scheduled robot adopted");
        self.publish_rev();
        loop {
            if self.r.token.is_cancelled() {
                self.stop_runs().await;
                return self.r.id;
            }
            let Some(now_ms) = self.shared.time.now_ms(self.clock()) else {
                if let Err(e) = self.shared.time.refresh(&self.r.store, self.clock()).await {
                    tracing::debug!(robot = %self.r.name, "no server clock yet ({e})");
                    self.pause_for(POLL).await;
                }
                continue;
            };
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
                        if let Some(s) = self.started.get(&id) {
                            tracing::info!(robot = %self.r.name, "overlap cancel_other: stopping the run in flight for a newer firing");
                            s.token.cancel();
                            self.stopping.insert(id);
                        }
                    }
                    true
                }
                Step::Wait { until_ms, poll } => self.wait(until_ms, poll).await,
            };
            if !go_on {
                self.stop_runs().await;
                return self.r.id;
            }
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
            paused: self.paused,
            started: self.started.keys().copied().collect(),
            stopping: self.stopping.clone(),
            not_before: self.not_before.clone(),
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
        let ids: Vec<&String> = others.iter().collect();
        let found = async {
            use futures::TryStreamExt;
            let mut c = self
                .r
                .store
                .slots()
                .find(doc! {"_id": {"$in": &ids}})
                .projection(doc! {crate::db::field::EPOCH: 1})
                .await?;
            let mut out = HashMap::new();
            while let Some(d) = c.try_next().await? {
                if let (Ok(id), Some(e)) = (
                    d.get_str("_id"),
                    crate::db::store::int(&d, crate::db::field::EPOCH),
                ) {
                    out.insert(id.to_string(), e);
                }
            }
            Ok::<_, mongodb::error::Error>(out)
        }
        .await;
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
        let mut next = next;
        next.note(&records);
        match self.compare_and_set(&next, &records, claiming).await {
            Ok(Written::Applied) => {
                tracing::debug!(robot = %self.r.name, why, "firing state written");
                self.count(&records, claiming);
                self.record_events(&records).await;
                self.written(next);
                self.publish_rev();
                self.preload(claiming).await;
                true
            }
            Ok(Written::Fenced) => self.reload().await,
            Ok(Written::Lapsed) => false,
            Ok(Written::Refused(why)) => {
                tracing::error!(robot = %self.r.name, "the database refused the robot's firing state ({}); fix its `firings` or `runs` by hand, e.g. db.robots.updateOne({{name: \"{}\"}}, {{$unset: {{firings: 1, runs: 1}}}})", crate::secrets::scrub(&why), self.r.name);
                self.pause_for(Duration::from_secs(10)).await;
                self.reload().await
            }
            Err(e) => self.after_error(e).await,
        }
    }

    /// Lost runs and missed firings go to `events` too (the dashboard's timeline
    /// marks them): they are rare, and each is news.
    async fn record_events(&self, records: &[RunRecord]) {
        use crate::db::event::EventKind;
        use crate::db::field::{DETAIL, EPOCH, ROBOT, SLOT_ID, WORKER};
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
            self.r
                .store
                .record_event(
                    kind,
                    doc! {
                        WORKER: self.r.ctx.worker(), SLOT_ID: self.r.ctx.slot_id(),
                        EPOCH: self.r.ctx.epoch(), ROBOT: &self.r.name, DETAIL: detail,
                    },
                )
                .await;
        }
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
                self.st = l.firings;
                self.paused = l.paused;
                self.publish_rev();
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
        if !self.started.is_empty() || t <= now {
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
            return;
        }
        // Two runs at once (`overlap: allow`) each read the robot.
        let carried = self.carried.take().filter(|_| self.started.is_empty());
        let preloaded = match (carried, self.preloaded.take()) {
            (Some(l), _) => Ok(l),
            (None, Some((id, l)))
                if id == e.id && self.started.is_empty() && l.firings.rev <= self.st.rev =>
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
            self.record_end(end).await;
            return;
        };
        let token = self.r.token.child_token();
        let left = Arc::new(Mutex::new(Left::Unchanged));
        let from = loaded.clone();
        let run = RobotRun {
            id: self.r.id,
            gen: self.r.gen,
            name: loaded.name,
            history: history_len(&loaded.spec),
            seq: Arc::new(AtomicI64::new(loaded.seq)),
            spec: loaded.spec,
            context: loaded.context,
            store: self.r.ctx.clone(),
            stop: token.clone(),
            grace: self.r.grace,
            backstop: self.r.backstop,
            firing: Some(e.firing),
            left: Some(left.clone()),
        };
        let started_ms = self.shared.time.now_ms(self.clock()).unwrap_or(now_ms);
        let lateness = (started_ms - e.firing).max(0);
        self.r
            .metrics
            .firing_lateness
            .observe(Duration::from_millis(lateness as u64));
        self.r.metrics.firings_started.inc();
        self.r.metrics.robots_running.inc_by(1);
        tracing::info!(robot = %self.r.name, firing = %crate::robot::schedule::rfc3339(e.firing), attempt = e.attempt, lateness_ms = lateness, "firing started");
        let id = e.id;
        self.not_before.remove(&id);
        let metrics = self.r.metrics.clone();
        self.runs.spawn(async move {
            let result = kind.run(run).await;
            metrics.robots_running.inc_by(-1);
            (id, result)
        });
        let began = self.r.clock.now();
        self.started.insert(
            id,
            Started {
                token,
                started_ms,
                began,
                from,
                left,
            },
        );
    }

    /// Waits for the next step's time, a run's end, or news of the document.
    async fn wait(&mut self, until_ms: Option<i64>, poll: bool) -> bool {
        let at = until_ms.and_then(|ms| self.shared.time.instant_at(ms, &self.r.clock));
        let alarm = self.shared.alarm.clone();
        let wake = self.shared.wake.clone();
        let clock = self.r.clock.clone();
        tokio::select! {
            _ = self.r.token.cancelled() => true,
            Some(done) = self.runs.join_next(), if !self.runs.is_empty() => match done {
                Ok((id, result)) => self.finish(id, result).await,
                Err(e) => {
                    tracing::error!(robot = %self.r.name, "a run's task failed: {e}");
                    true
                }
            },
            _ = async { alarm.until(at.expect("checked")).await }, if at.is_some() => true,
            _ = clock.sleep(POLL), if poll => self.reload().await,
            _ = wake.notified() => self.reload().await,
        }
    }

    /// A run ended: its record, and its retry when `restart.on` is `failure`.
    async fn finish(&mut self, id: ObjectId, result: Result<(), RobotError>) -> bool {
        let Some(s) = self.started.remove(&id) else {
            return true;
        };
        let cancelled = self.stopping.remove(&id);
        if self.r.token.is_cancelled() && !cancelled {
            // The instance is stopping: its runs' ends are written by stop_runs.
            self.started.insert(id, s);
            return true;
        }
        self.carried = carry(&s, self.started.is_empty());
        let (outcome, reason) = match &result {
            Ok(()) if cancelled => (
                Outcome::Cancelled,
                Some("overlap cancel_other: a newer firing".into()),
            ),
            Ok(()) | Err(RobotError::Finished) => (Outcome::Succeeded, None),
            Err(RobotError::Fenced(why)) => {
                if !self.reload().await {
                    return false;
                }
                (Outcome::Failed, Some(why.clone()))
            }
            Err(e) => (Outcome::Failed, Some(e.to_string())),
        };
        let ended_ms = self
            .shared
            .time
            .now_ms(self.clock())
            .unwrap_or(s.started_ms);
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
            reason,
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
        let go_on = self.record_end(end).await;
        if let Some(b) = backoff {
            let again = self
                .st
                .running
                .iter()
                .find(|e| e.firing == firing && e.attempt == attempt + 1)
                .map(|e| e.id);
            if let Some(again) = again {
                self.not_before
                    .insert(again, ended_ms + b.as_millis() as i64);
            }
        }
        go_on
    }

    /// Writes a run's end, again on a newer state when another writer raised `rev`.
    /// When the plan after it is to claim the next firing ahead, the claim goes in
    /// the same write: one write a firing in the steady state.
    async fn record_end(&mut self, end: RunEnd) -> bool {
        loop {
            let Some((next, record)) = ended(&self.st, &self.me, end.clone()) else {
                return true;
            };
            let (next, claiming) = match self.shared.time.now_ms(self.clock()) {
                Some(now_ms) if !self.r.token.is_cancelled() => {
                    let facts = self.facts(now_ms).await;
                    match plan(&self.schedule, &next, &self.me, &facts) {
                        Step::Write {
                            next: claimed,
                            records,
                            claiming: Some(t),
                            why: CLAIM_AHEAD,
                        } if records.is_empty() => (claimed, Some(t)),
                        _ => (next, None),
                    }
                }
                _ => (next, None),
            };
            let before = self.st.rev;
            if !self
                .write(next, vec![record], claiming, "a run's end")
                .await
            {
                return false;
            }
            if self.st.rev != before && !self.st.running.iter().any(|e| e.id == end.id) {
                return true;
            }
        }
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
        let written = self.compare_and_set(&next, &[], None).await;
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
    ) -> Result<Written, ContextError> {
        self.r
            .ctx
            .write_firings(
                &self.r.id,
                self.r.gen,
                &self.st,
                next,
                records,
                self.schedule.keep_runs,
                claiming,
            )
            .await
    }

    /// `next` landed: it is the state now, one `rev` on.
    fn written(&mut self, next: FiringState) {
        self.st = next;
        self.st.rev = Some(self.st.rev.unwrap_or(0) + 1);
    }

    /// The instance is stopping (moved, updated, paused, restarted, released): its
    /// runs stop with their grace, and while the lease holds, each run's end is
    /// recorded by its id and the run handed to the next instance as cut off, as is
    /// a claim that never started. With the lease gone, nothing is written: the next
    /// holder judges the runs by that lease.
    async fn stop_runs(&mut self) {
        while let Some(done) = self.runs.join_next().await {
            if let Ok((id, _)) = done {
                self.stopping.remove(&id);
            }
        }
        if !self.r.ctx.lease_open() {
            return;
        }
        let mine: Vec<RunEntry> = self
            .st
            .running
            .iter()
            .filter(|e| e.slot == self.me.slot && e.epoch == self.me.epoch && e.gen == self.me.gen)
            .cloned()
            .collect();
        let now_ms = self.shared.time.now_ms(self.clock());
        for e in mine {
            let started = self.started.remove(&e.id);
            if started.is_none() && self.give_back(&e).await {
                continue;
            }
            let record = started.as_ref().map(|s| RunRecord {
                firing: e.firing,
                attempt: e.attempt,
                outcome: Some(Outcome::Stopped),
                reason: Some(
                    "its instance was stopped (pause, update, move, restart or release)".into(),
                ),
                started: Some(s.started_ms),
                ended: now_ms,
                lateness_ms: Some((s.started_ms - e.firing).max(0)),
                worker: self.me.worker.clone(),
                slot: self.me.slot.clone(),
                epoch: self.me.epoch,
                by: e.by.clone(),
                count: None,
                last: None,
            });
            // Tried again while the lease holds: the next instance waits for it.
            let mut wait = Duration::from_millis(100);
            loop {
                let r = self
                    .r
                    .ctx
                    .end_run_by_id(&self.r.id, &e, record.as_ref(), self.schedule.keep_runs)
                    .await;
                match r {
                    Ok(_) => break,
                    Err(err) if self.r.ctx.lease_open() => {
                        tracing::warn!(robot = %self.r.name, "could not record the end of a stopped run ({err}); trying again");
                        self.r.clock.sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(2));
                    }
                    Err(err) => {
                        tracing::warn!(robot = %self.r.name, "could not record the end of a stopped run ({err}); the next holder judges it by this lease");
                        break;
                    }
                }
            }
        }
    }
}
