//! One robot's life on its holder: load, run, and restart with backoff under its
//! restart budget, until it is stopped, fenced or given up on.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::db::context::{ContextStore, Loaded};
use crate::db::event::EventKind;
use crate::db::field::{DETAIL, EPOCH, ROBOT, SLOT_ID, WORKER};
use crate::db::robot_doc::RobotStatus;
use crate::db::store::Store;
use crate::metrics::Metrics;
use crate::robot::restart::{Budget, Next, RestartOn, RestartPolicy};
use crate::robot::schedule::Schedule;
use crate::robot::{history_len, Registry, RobotError, RobotRun};

use super::firing_clock::Shared;
use crate::robot::meter::metered;

/// A scheduled run's firing: which one, which attempt, and where the run says how
/// it left its robot.
pub(super) struct FiringRun {
    pub(super) firing: i64,
    pub(super) attempt: i64,
    pub(super) left: Arc<std::sync::Mutex<crate::robot::Left>>,
}

/// One robot's life on this holder: start, watch, restart with backoff.
pub(super) struct Runner {
    pub(super) id: ObjectId,
    pub(super) gen: i64,
    /// The robot's `start_rev` when this instance started: a completion is written
    /// only over it, so a `robot restart` that came meanwhile is not undone.
    pub(super) start_rev: i64,
    pub(super) backstop: Duration,
    /// See [`crate::config::LeaseTiming::suspend_for`].
    pub(super) suspend_for: Duration,
    /// Whether the held slot's lease is suspended: every future of this instance
    /// (its runs' included) is polled only while it is not.
    pub(super) suspended: tokio::sync::watch::Receiver<bool>,
    pub(super) name: String,
    pub(super) ctx: ContextStore,
    pub(super) registry: Registry,
    pub(super) token: CancellationToken,
    pub(super) grace: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) store: Store,
    /// Measures a run's length and waits out the restart backoff.
    pub(super) clock: SharedClock,
    /// The slot's server clock and timer, for a robot on a schedule.
    pub(super) scheduling: Shared,
    /// Where each of its runs is listed for the worker's load sampler.
    pub(super) meters: crate::robot::meter::Meters,
}

impl Runner {
    /// Lists a run of this robot for the load sampler, until the guard is dropped:
    /// it weighs at least what its spec's `limits` declare.
    pub(super) fn listed(&self, spec: &bson::Document) -> crate::robot::meter::Listed {
        let limits = crate::robot::limits::Limits::from_spec(spec).unwrap_or_default();
        let declared = crate::load::Cost {
            robots: 1,
            millicores: limits.cpu_millis.unwrap_or(0),
            memory_bytes: limits.memory.unwrap_or(0),
        };
        self.meters.list(&self.name, self.ctx.slot_id(), declared)
    }

    /// The schedule this robot's instance runs by, when its spec has one this worker
    /// would run (any other spec is reported by [`Runner::run`], with its reason).
    pub(super) fn schedule_of(&self, loaded: &Loaded) -> Option<Schedule> {
        let now = self
            .scheduling
            .time
            .now_ms(&self.clock)
            .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        let runnable = self
            .registry
            .get(&loaded.kind)
            .is_some_and(|k| k.check_spec(&loaded.spec).is_ok())
            && RestartPolicy::from_spec(&loaded.spec).is_ok();
        runnable
            .then(|| Schedule::from_spec(&loaded.spec, now).ok().flatten())
            .flatten()
    }

    /// A daemon's (or a run to completion's) life: run, and restart as its policy
    /// says.
    pub(super) async fn run(self, mut first: Option<Loaded>) -> ObjectId {
        let mut restarts: i64 = 0;
        let mut budget = Budget::new(RestartPolicy::default());
        while !self.token.is_cancelled() {
            let began = self.clock.now();
            let outcome = self.run_once(first.take(), restarts > 0, &mut budget).await;
            let on = budget.policy().on;
            let ended_well = matches!(outcome, Ok(()) | Err(RobotError::Finished));
            if on != RestartOn::Always && ended_well && !self.token.is_cancelled() {
                self.complete(restarts).await;
                break;
            }
            let error = match outcome {
                Ok(()) if self.token.is_cancelled() => break,
                // Nothing of it ran: the lease ended first, and the stop follows.
                Err(RobotError::NotStarted(why)) if self.ctx.lease_given_up() => {
                    tracing::debug!(robot = %self.name, "{why}");
                    break;
                }
                // Nothing of it ran: the lease is suspended. Started again once a late
                // renewal resumes it, as no restart; stopped if it is given up.
                Err(RobotError::NotStarted(why)) if !self.ctx.lease_open() => {
                    tracing::debug!(robot = %self.name, "{why}; waiting for the lease");
                    if !self.ctx.lease_resumed().await {
                        break;
                    }
                    continue;
                }
                // Nothing of it ran, and the lease holds again (renewed just after
                // its deadline passed): started again, as no restart.
                Err(RobotError::NotStarted(why)) => {
                    tracing::debug!(robot = %self.name, "{why}; starting it again");
                    self.clock.sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Ok(()) => RobotError::Crashed("returned without being asked to stop".into()),
                Err(RobotError::Fenced(why)) if self.ctx.lease_given_up() => {
                    // The whole holder stopped writing (its lease lapsed): the worker
                    // reports that once, not once per robot.
                    tracing::debug!(robot = %self.name, "{why}");
                    break;
                }
                Err(RobotError::Fenced(why)) => {
                    tracing::warn!(robot = %self.name, "{why}; stopped on this worker");
                    self.store
                        .record_event(
                            EventKind::FencedWrite,
                            doc! {
                                WORKER: self.ctx.worker(), SLOT_ID: self.ctx.slot_id(),
                                EPOCH: self.ctx.epoch(), ROBOT: &self.name, DETAIL: why,
                            },
                        )
                        .await;
                    break;
                }
                Err(e) => e,
            };
            if self.token.is_cancelled() {
                break;
            }
            let invalid = matches!(error, RobotError::Invalid(_));
            if on == RestartOn::Never && !invalid {
                // Run once: a failure is final too, and says so as a give-up does.
                self.give_up_once(&error, restarts).await;
                break;
            }
            let backoff = match budget.ended(began, self.clock.now(), invalid) {
                Next::RestartAfter(backoff) => backoff,
                Next::GiveUp { ends, within } => {
                    self.give_up(&error, ends, within, restarts).await;
                    break;
                }
            };
            let status = if invalid {
                RobotStatus::Failed
            } else {
                RobotStatus::Restarting
            };
            restarts += 1;
            self.metrics.robot_restarts.inc();
            tracing::warn!(robot = %self.name, restarts, backoff_ms = backoff.as_millis() as u64, "robot {status}: {error}");
            let recorded = self
                .ctx
                .set_status(
                    &self.id,
                    self.gen,
                    status,
                    Some(&error.to_string()),
                    Some(restarts),
                )
                .await;
            if let Ok(false) = recorded {
                break; // fenced: no longer ours
            }
            // In `events` for the dashboard's timeline: the 1st, 2nd, 4th, 8th …
            // restart of this instance, so a crash loop of thousands of robots cannot
            // crowd the claims and losses out of the capped log.
            if (restarts as u64).is_power_of_two() {
                self.store
                    .record_event(
                        EventKind::RobotRestart,
                        doc! {
                            WORKER: self.ctx.worker(), SLOT_ID: self.ctx.slot_id(),
                            ROBOT: &self.name, DETAIL: format!("restart {restarts}: {error}"),
                        },
                    )
                    .await;
            }
            let restarting = crate::metrics::Held::new(&self.metrics.robots_restarting);
            tokio::select! {
                _ = self.token.cancelled() => {}
                _ = self.clock.sleep(backoff) => {}
            }
            drop(restarting);
        }
        self.id
    }

    /// Counts the ends an earlier instance recorded in the robot's document: a crash
    /// loop on a slot that changes hands (a takeover, a move) keeps its budget. Their
    /// ages come from one reading of the server's clock, which stamped them; without
    /// one the budget starts fresh, as it did before ends were kept.
    async fn restore_budget(&self, budget: &mut Budget, ends: &[i64]) {
        let server_now = match self.store.server_now().await {
            Ok(t) => t.timestamp_millis(),
            Err(e) => {
                tracing::debug!(robot = %self.name, "no server clock to age its earlier ends ({}); a fresh restart budget", crate::db::store::brief(&e));
                return;
            }
        };
        let now = self.clock.now();
        let ends = ends.iter().filter_map(|end| {
            let age = Duration::from_millis(server_now.saturating_sub(*end).max(0) as u64);
            now.checked_sub(age)
        });
        budget.restore(ends, now);
    }

    /// Stops restarting the robot: it ended `ends` times within `within`. It is held
    /// as a paused robot is (`paused: true`), so no holder starts it again, with the
    /// status `failed` and the last end's reason; `robot resume` gives it a fresh
    /// budget.
    async fn give_up(&self, error: &RobotError, ends: u32, within: Duration, restarts: i64) {
        let why = format!(
            "gave up after {ends} ends within {} (spec.restart); the last: {error}",
            humantime::format_duration(within)
        );
        self.mark_failed(why, "resume", restarts).await;
    }

    /// The robot ran to completion (`spec.restart.on` failure or never, and it ended
    /// well): held as a paused robot is, with the status `completed`, so no holder
    /// starts it again, a takeover included, until `robot restart`.
    async fn complete(&self, restarts: i64) {
        tracing::info!(robot = %self.name, "robot completed: it ran to its end (spec.restart.on); `slotpool robot restart {}` runs it again", self.name);
        let written = self
            .until_written("completed", || {
                self.ctx
                    .complete(&self.id, self.gen, self.start_rev, restarts)
            })
            .await;
        if written {
            self.metrics.robots_completed.inc();
            self.store
                .record_event(
                    EventKind::RobotCompleted,
                    doc! {
                        WORKER: self.ctx.worker(), SLOT_ID: self.ctx.slot_id(),
                        EPOCH: self.ctx.epoch(), ROBOT: &self.name,
                    },
                )
                .await;
        }
    }

    /// Sends a write that holds the robot (completed, failed) until it lands, is
    /// fenced, or the lease or this instance ends: until then this task stays, so
    /// the slot's next sync does not start the robot again. True when it landed.
    async fn until_written<F, Fut>(&self, what: &str, write: F) -> bool
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, crate::db::context::ContextError>>,
    {
        let mut wait = Duration::from_millis(200);
        loop {
            match write().await {
                Ok(landed) => return landed,
                Err(e) => {
                    tracing::warn!(robot = %self.name, "could not mark the robot {what} ({e}); trying again in {} ms", wait.as_millis());
                }
            }
            tokio::select! {
                _ = self.token.cancelled() => return false,
                _ = self.clock.sleep(wait) => {}
            }
            if !self.ctx.lease_open() {
                return false;
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// `spec.restart.on: never` and the run failed: marked failed and held, as a
    /// robot its restart budget gave up on is.
    async fn give_up_once(&self, error: &RobotError, restarts: i64) {
        let why = format!("its run failed and spec.restart.on is never: {error}");
        self.mark_failed(why, "restart", restarts).await;
    }

    /// Marks the robot failed and held, until that lands or another instance owns
    /// it (then that instance's own budget decides); `again` is the command that
    /// runs it again.
    async fn mark_failed(&self, why: String, again: &str, restarts: i64) {
        self.metrics.robot_failures.inc();
        tracing::error!(robot = %self.name, "robot failed: {why}; `slotpool robot {again} {}` runs it again, `slotpool robot logs {}` shows its last output", self.name, self.name);
        let written = self
            .until_written("failed", || {
                self.ctx.give_up(&self.id, self.gen, &why, restarts)
            })
            .await;
        if written {
            self.store
                .record_event(
                    EventKind::RobotFailed,
                    doc! {
                        WORKER: self.ctx.worker(), SLOT_ID: self.ctx.slot_id(),
                        EPOCH: self.ctx.epoch(), ROBOT: &self.name, DETAIL: &why,
                    },
                )
                .await;
        }
    }

    async fn run_once(
        &self,
        first: Option<Loaded>,
        restarted: bool,
        budget: &mut Budget,
    ) -> Result<(), RobotError> {
        let loaded = match first {
            Some(l) => l,
            None => self.ctx.load(&self.id, self.gen, &self.name).await?,
        };
        let kind = self.registry.get(&loaded.kind).ok_or_else(|| {
            RobotError::Invalid(format!(
                "unknown robot kind {:?} (this worker runs: {})",
                loaded.kind,
                self.registry.names().join(", ")
            ))
        })?;
        kind.check_spec(&loaded.spec)
            .map_err(|e| RobotError::Invalid(format!("bad spec: {e}")))?;
        let policy = RestartPolicy::from_spec(&loaded.spec)
            .map_err(|e| RobotError::Invalid(format!("bad spec: {e}")))?;
        crate::robot::check_schedule(&loaded.spec)
            .map_err(|e| RobotError::Invalid(format!("bad spec: {e}")))?;
        if loaded.spec.contains_key(crate::robot::schedule::SPEC_FIELD)
            && !matches!(
                loaded.spec.get(crate::robot::schedule::SPEC_FIELD),
                Some(bson::Bson::Null)
            )
        {
            // A schedule that checks out runs in its own loop; one read back here
            // changed between the loads. Start again through that loop.
            return Err(RobotError::Invalid(
                "the robot's schedule changed; starting it again".into(),
            ));
        }
        budget.set_policy(policy);
        if !restarted && !loaded.ends.is_empty() {
            self.restore_budget(budget, &loaded.ends).await;
        }
        if restarted
            && !self
                .ctx
                .set_status(&self.id, self.gen, RobotStatus::Running, None, None)
                .await
                .map_err(RobotError::from)?
        {
            return Err(RobotError::Fenced(format!(
                "robot {} is no longer bound to this holder",
                self.name
            )));
        }
        self.launch(kind, loaded, self.token.clone(), None).await
    }

    /// One run of the robot from what was `loaded`, stopped by `stop`, as a future
    /// to await or spawn: built once for plain and scheduled robots (`firing` says
    /// which firing a scheduled run is), wrapped for suspension (unless the kind
    /// suspends itself) and for metering. While it lives, the run is listed for the
    /// slot's cost and counts as a robot running; both are given back however it
    /// ends: returned, panicked or aborted.
    pub(super) fn launch(
        &self,
        kind: Arc<dyn crate::robot::RobotKind>,
        loaded: Loaded,
        stop: CancellationToken,
        firing: Option<FiringRun>,
    ) -> impl std::future::Future<Output = Result<(), RobotError>> + Send + 'static {
        let listed = self.listed(&loaded.spec);
        let meter = listed.meter.clone();
        let run = RobotRun {
            id: self.id,
            gen: self.gen,
            name: loaded.name,
            history: history_len(&loaded.spec),
            seq: Arc::new(std::sync::atomic::AtomicI64::new(loaded.seq)),
            spec: loaded.spec,
            context: loaded.context,
            store: self.ctx.clone(),
            stop,
            grace: self.grace,
            backstop: self.backstop,
            suspend_for: self.suspend_for,
            firing: firing.as_ref().map(|f| f.firing),
            attempt: firing.as_ref().map(|f| f.attempt),
            left: firing.map(|f| f.left),
            meter: Some(meter.clone()),
        };
        let running = crate::metrics::Held::new(&self.metrics.robots_running);
        let suspended = (!kind.suspends_itself()).then(|| self.suspended.clone());
        async move {
            let _given_back = (running, listed);
            match suspended {
                Some(s) => metered(super::suspension::suspendable(kind.run(run), s), meter).await,
                None => metered(kind.run(run), meter).await,
            }
        }
    }
}
