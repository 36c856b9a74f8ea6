//! One held slot: everything that lives exactly as long as one lease.
//!
//! [`HeldSlot::spawn`] takes a freshly claimed [`Lease`] and starts, in one task, its
//! renewals, [`WriteGuard`], [`WritePacer`], [`ContextStore`] and [`Supervisor`]. On
//! loss or self-fence the task stops the robots at once; on hand-back, drain or
//! shutdown it stops them (each may checkpoint) and then releases the slot. Each held
//! slot renews on its own schedule and deadline over the lease's own connection pool,
//! so no robot work and no other slot delays its renewals.
//!
//! Where the slot is in its life, and what each renewal's answer leads to, is
//! [`Holding`]'s (pure, with its tests); this task only waits, sends, and carries
//! out what each step says, and [`report`] writes each [`SlotEvent`] where it goes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::LeaseTiming;
use crate::db::context::ContextStore;
use crate::db::event::EventKind;
use crate::db::field::{DETAIL, EPOCH, OVERFLOW, SLOT_ID, WORKER};
use crate::db::guard::WriteGuard;
use crate::db::lease::{Lease, LeaseError, LeaseProtocol};
use crate::db::pacing::{busy_renewal, read_admitted, WritePacer, READ_WAITS_MOST};
use crate::db::store::Store;
use crate::metrics::{Metrics, SuspensionOutcome};
use crate::robot::Registry;
pub(crate) use crate::worker::holding::Ended;
use crate::worker::holding::{Answer, Do, Facts, Holding, RideOut, Seen, SlotEvent};
use crate::worker::status::{Health, SharedStatus};
use crate::worker::supervisor::Supervisor;

/// What every held slot of one worker shares.
#[derive(Clone)]
pub(crate) struct HoldContext {
    /// The lease protocol, on the lease's own connection pool.
    pub(crate) protocol: LeaseProtocol,
    /// The robots' connection pool.
    pub(crate) store: Store,
    pub(crate) registry: Registry,
    pub(crate) timing: LeaseTiming,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: SharedClock,
    pub(crate) status: SharedStatus,
    pub(crate) health: Arc<Health>,
    /// Notified when a held slot ends, so the worker looks at the pool at once.
    pub(crate) ended: Arc<Notify>,
    /// The standby line, on the lease's pool: who to poke after a release.
    pub(crate) line: crate::db::heartbeat::Roster,
    /// How many of the first standbys in line to poke (`--watchers`).
    pub(crate) watchers: u64,
    /// How many forward steps of the server's clock the worker has seen.
    pub(crate) clock_steps: Arc<std::sync::atomic::AtomicU64>,
    /// Every robot run of the worker, measured for the load and the slots' costs.
    pub(crate) meters: crate::robot::meter::Meters,
    /// The latest measured costs: each renewal records its slot's when it changed.
    pub(crate) load: crate::worker::load_sampler::LoadReading,
}

/// The worker's handle on one held slot.
pub(crate) struct HeldSlot {
    pub(crate) slot_id: String,
    pub(crate) epoch: i64,
    pub(crate) claimed_at: Instant,
    release: CancellationToken,
    task: tokio::task::JoinHandle<Ended>,
}

impl HeldSlot {
    /// Starts holding a freshly claimed lease: renewals, robots, everything.
    pub(crate) fn spawn(lease: Lease, cx: HoldContext, overflow: bool) -> HeldSlot {
        let release = CancellationToken::new();
        HeldSlot {
            slot_id: lease.slot_id.clone(),
            epoch: lease.epoch,
            claimed_at: cx.clock.now(),
            release: release.clone(),
            task: tokio::spawn(hold(lease, cx, release, overflow)),
        }
    }

    /// Asks for the slot to be handed back gracefully (robots stop and checkpoint,
    /// then the slot is released). Returns at once; see [`HeldSlot::join`].
    pub(crate) fn give_back(&self) {
        self.release.cancel();
    }

    /// True once a hand-back was asked for.
    pub(crate) fn giving_back(&self) -> bool {
        self.release.is_cancelled()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the slot's end.
    pub(crate) async fn join(self) -> Ended {
        match self.task.await {
            Ok(ended) => ended,
            Err(e) => {
                tracing::error!(slot = %self.slot_id, "slot task failed: {e}");
                Ended::Lost
            }
        }
    }
}

/// How long after its claim a new holder sends its first renewal: half a tick,
/// where every later one follows the last by a tick.
///
/// A claim comes when the database is busiest, and renewing half a tick in gives
/// the first renewal 1.05 T to come back instead of 0.55 T, at the price of one more
/// renewal per claim (see docs/bench/2026-11-26-a-pool-of-200-workers.md).
pub(crate) fn first_renewal_after(tick: Duration) -> Duration {
    tick / 2
}

/// Holds one lease until it is lost, fenced, drained or given back: waits for what
/// the slot's state waits for, steps the state with what came, and carries out
/// what the step says; then stops the robots and, unless the slot was lost,
/// releases it.
async fn hold(
    mut lease: Lease,
    cx: HoldContext,
    release: CancellationToken,
    overflow: bool,
) -> Ended {
    let (recorded_tx, recorded) = tokio::sync::oneshot::channel();
    claimed(&cx, &lease, overflow, recorded_tx);
    let guard = WriteGuard::new(lease.deadline(), cx.clock.clone());
    let robots = start_supervisor(&cx, &lease, guard.clone(), recorded);
    let mut state = Holding::claimed(lease.last_renewed() + first_renewal_after(cx.timing.tick));
    // The slot's cost as last recorded: a renewal records it again only changed.
    let mut recorded_cost = None;
    let (ended, lost) = loop {
        let seen = match &state {
            Holding::Renewing { next, .. } => tokio::select! {
                _ = release.cancelled() => Seen::ReleaseAsked,
                _ = cx.clock.sleep_until((*next).min(lease.deadline())) => {
                    renew(&cx, &mut lease, &robots, &mut recorded_cost).await
                }
            },
            Holding::Suspended(s) => late_renewal(&cx, &mut lease, s, &release).await,
            Holding::Releasing(ended) => break (*ended, None),
            Holding::Lost { kind, detail } => break (Ended::Lost, Some((*kind, detail.clone()))),
        };
        let facts = Facts {
            now: cx.clock.now(),
            slot: &lease.slot_id,
            epoch: lease.epoch,
            deadline: lease.deadline(),
            tick: cx.timing.tick,
            suspend_for: cx.timing.suspend_for,
            robots: robots.running.load(Ordering::Relaxed),
        };
        let (next, doing) = state.step(seen, &facts);
        state = next;
        for d in doing {
            carry_out(&cx, &lease, &guard, &robots, d).await;
        }
    };
    if let Some((kind, detail)) = lost {
        // The guard is revoked: the robots can no longer write; stop them now.
        robots.stop(&cx.metrics).await;
        report(&cx, &lease, SlotEvent::RobotsStopped { kind, detail }).await;
    } else {
        // Hand-back, drain or shutdown: robots first (each may write a last
        // checkpoint), then the slot.
        let running = robots.running.load(Ordering::Relaxed);
        report(&cx, &lease, SlotEvent::Releasing { running }).await;
        robots.stop(&cx.metrics).await;
        guard.revoke();
        let released = release_slot(&cx, &mut lease).await;
        // A drained slot is for nobody; a released one, for the first standby.
        if released && ended == Ended::Released {
            let me = cx.protocol.owner();
            let standbys = crate::worker::poke::Poked::Standbys;
            crate::worker::poke::poke_front(&cx.line, me, cx.watchers, standbys, &cx.metrics).await;
        }
    }
    report(&cx, &lease, SlotEvent::Left).await;
    ended
}

/// One renewal on time, and what it did.
async fn renew(
    cx: &HoldContext,
    lease: &mut Lease,
    robots: &SupervisorHandle,
    recorded_cost: &mut Option<crate::load::SlotCost>,
) -> Seen {
    let sent = cx.clock.now();
    // The round trip is a measurement of the database, on real time.
    let began = Instant::now();
    let cost = cx
        .load
        .slot(&lease.slot_id)
        .filter(|c| recorded_cost.as_ref() != Some(c));
    let answer = match cx.protocol.renew_reporting(lease, cost.as_ref()).await {
        Ok(renewed) => {
            if cost.is_some() {
                *recorded_cost = cost;
            }
            let latency = began.elapsed();
            let tick = cx.timing.tick;
            let advance = robots.renewals.advance(sent + tick, tick, &cx.clock);
            Answer::Renewed {
                renewed,
                latency,
                advance,
            }
        }
        Err(LeaseError::Db(e)) => Answer::Failed {
            why: cx.store.scrub(&crate::db::store::brief(&e)),
        },
        Err(e @ LeaseError::Lost { .. }) => Answer::Lost {
            detail: e.to_string(),
        },
        Err(e @ LeaseError::SelfFenced { .. }) => Answer::DeadlinePassed {
            detail: e.to_string(),
        },
    };
    Seen::Renewal { sent, answer }
}

/// One late renewal of a suspended slot, when its turn comes, raced against the
/// slot being given up. It is awaited for up to a tick ([`RideOut::give_up_at`]);
/// one given up on is replaced on a new client, since it keeps its place in the old
/// client's queue.
async fn late_renewal(
    cx: &HoldContext,
    lease: &mut Lease,
    s: &RideOut,
    release: &CancellationToken,
) -> Seen {
    // The first goes at once, as the suspension begins.
    if s.next > cx.clock.now() {
        tokio::select! {
            _ = release.cancelled() => return Seen::ReleaseAsked,
            _ = cx.clock.sleep_until(s.next) => {}
        }
    }
    let sent = cx.clock.now();
    if s.out_of_time(sent) {
        return Seen::OutOfTime;
    }
    let client = cx.protocol.client_generation();
    let give_up = s.give_up_at(sent, cx.timing.tick);
    let reply = tokio::select! {
        _ = release.cancelled() => return Seen::ReleaseAsked,
        r = cx.protocol.late_renewal(lease) => Some(r),
        _ = cx.clock.sleep_until(give_up) => None,
    };
    let answer = match reply.map(|reply| cx.protocol.settle_late(lease, sent, reply)) {
        Some(Ok(renewed)) => Answer::Renewed {
            renewed,
            // Not a measurement: the link just came back, or the answer waited.
            latency: Duration::ZERO,
            advance: None,
        },
        Some(Err(e @ LeaseError::Lost { .. })) => Answer::Lost {
            detail: e.to_string(),
        },
        Some(Err(e)) => Answer::Failed {
            why: cx.store.scrub(&e.to_string()),
        },
        None => {
            cx.protocol
                .reopen_after_giving_up(client, cx.health.outages());
            Answer::Failed {
                why: format!(
                    "no answer to a late renewal within {} ms",
                    give_up.saturating_duration_since(sent).as_millis()
                ),
            }
        }
    };
    Seen::LateRenewal { sent, answer }
}

/// Carries out one thing a step of the slot's state asked for.
async fn carry_out(
    cx: &HoldContext,
    lease: &Lease,
    guard: &WriteGuard,
    robots: &SupervisorHandle,
    d: Do,
) {
    match d {
        Do::ExtendGuard => guard.extend(lease.deadline()),
        Do::RevokeGuard => guard.revoke(),
        Do::SuspendRobots => {
            robots.suspension.suspend();
        }
        Do::ResumeRobots => {
            // New clients before the guard opens: the writes held back go out, or
            // are read back, the moment it does.
            cx.protocol.reopen_after(cx.health.outages());
            reopen_robots(cx);
            guard.extend(lease.deadline());
            robots.suspension.resume();
        }
        Do::Pace(latency) => robots.paced(latency, &cx.metrics),
        Do::Beat { rev, per_command } => {
            robots.beats.send_replace(Renewal {
                rev,
                at: cx.clock.now(),
                per_command,
            });
        }
        Do::Report(event) => report(cx, lease, event).await,
    }
}

/// Replaces the robots' client at a resume, as the lease's (see
/// [`crate::db::store::Store::reopen_after`]): their first writes after it must not
/// go out on a connection that stayed open across the outage, where each would wait
/// out its bound (30 s) in doubt.
fn reopen_robots(cx: &HoldContext) {
    match cx.store.reopen_after(cx.health.outages()) {
        Ok(true) => tracing::info!(
            "the database was out of reach since the robots' connections were opened: opening new ones"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!("could not open a new client for the robots: {e}"),
    }
}

/// Releases the slot; true when the release landed.
async fn release_slot(cx: &HoldContext, lease: &mut Lease) -> bool {
    let limit = (cx.timing.tick * 2).max(Duration::from_secs(2));
    let event = match tokio::time::timeout(limit, cx.protocol.release(lease)).await {
        Ok(Ok(true)) => SlotEvent::Released,
        Ok(Ok(false)) => SlotEvent::ReleaseFailed {
            why: "slot was no longer ours at release".into(),
        },
        Ok(Err(e)) => SlotEvent::ReleaseFailed {
            why: format!(
                "could not release slot (it expires by itself within {} ms): {}",
                cx.timing.lease_ms(),
                cx.store.scrub(&e.to_string())
            ),
        },
        Err(_) => SlotEvent::ReleaseFailed {
            why: format!(
                "no answer to the release (the slot expires by itself within {} ms)",
                cx.timing.lease_ms()
            ),
        },
    };
    let released = matches!(event, SlotEvent::Released);
    report(cx, lease, event).await;
    released
}

/// The claim landed; `overflow` when the worker already held a slot. `recorded` is
/// told when the claim's event is written (or refused by the server): the
/// supervisor lets no robot write before that, so each epoch's claim comes first in
/// `events`, yet the event's write overlaps the slot's listing.
fn claimed(
    cx: &HoldContext,
    lease: &Lease,
    overflow: bool,
    mut recorded: tokio::sync::oneshot::Sender<()>,
) {
    let (slot, epoch, owner) = (&lease.slot_id, lease.epoch, cx.protocol.owner());
    tracing::info!(slot = %slot, epoch, worker = %owner, overflow, "claimed slot");
    cx.metrics.claims.inc();
    cx.metrics.slot_held.inc_by(1);
    cx.metrics.epoch.set(epoch);
    cx.status.lock().expect("status lock").held(lease, overflow);
    // Written beside the supervisor's first reads, not before them; the supervisor
    // waits for it before any robot writes, for as long as the slot is held: the
    // write is never given up for want of an answer, and ends when the supervisor
    // does (the hold ended first).
    let store = cx.store.clone();
    let fields = doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, OVERFLOW: overflow};
    tokio::spawn(async move {
        let written = tokio::select! {
            _ = store.record_event_patiently(EventKind::Claim, fields) => true,
            _ = recorded.closed() => false,
        };
        if written {
            let _ = recorded.send(());
        }
    });
}

/// Reports one step of a held slot to every sink at once: the worker's `/status`
/// and database health, the log and the metrics, and the `events` collection.
async fn report(cx: &HoldContext, lease: &Lease, event: SlotEvent) {
    // `/status` first: a slot learnt lost must stop counting as held at once.
    show(cx, lease, &event);
    log_and_count(cx, lease, &event);
    record(cx, lease, event).await;
}

/// The log line and the metrics of one step.
fn log_and_count(cx: &HoldContext, lease: &Lease, event: &SlotEvent) {
    let (slot, epoch, m) = (&lease.slot_id, lease.epoch, &cx.metrics);
    match event {
        SlotEvent::Renewed { latency, rev } => {
            m.renew_latency.observe(*latency);
            tracing::debug!(slot = %slot, rev, latency_ms = latency.as_millis() as u64, "renewed");
        }
        SlotEvent::Phase { at_edges: true } => {
            tracing::info!(slot = %slot, "renewals now go just after the edges of the tick, where firings fall (the slot runs scheduled robots)");
        }
        SlotEvent::Phase { at_edges: false } => {
            tracing::info!(slot = %slot, "renewals keep their own phase again (no scheduled robot left)");
        }
        SlotEvent::RenewFailed { why, left } => {
            m.renew_failures.inc();
            tracing::warn!(slot = %slot, epoch, left_ms = left.as_millis() as u64, "renewal failed: {why}");
        }
        SlotEvent::Draining => tracing::info!(slot = %slot, "slot is draining: handing it back"),
        SlotEvent::Lost { detail } => {
            m.losses.inc();
            tracing::warn!(slot = %slot, epoch, "{detail}; stopping its robots");
        }
        SlotEvent::SelfFenced { detail } => {
            m.self_fences.inc();
            tracing::warn!(slot = %slot, epoch, "{detail}; stopping its robots");
        }
        SlotEvent::Suspended { robots } => {
            m.robots_suspended.inc_by(*robots as i64);
            m.self_fences.inc();
            tracing::warn!(slot = %slot, epoch, robots, suspend_for_ms = cx.timing.suspend_for.as_millis() as u64, "self-fenced: no renewal before the local deadline; robots suspended, not stopped, while the holder renews late");
        }
        // Once, then every twentieth: an outage of a minute says it a few times.
        SlotEvent::LateRenewalFailed { why, tries } if *tries == 1 || tries.is_multiple_of(20) => {
            tracing::warn!(slot = %slot, epoch, tries, "late renewal failed: {why}");
        }
        SlotEvent::LateRenewalFailed { why, tries } => {
            tracing::debug!(slot = %slot, epoch, tries, "late renewal failed: {why}");
        }
        SlotEvent::Resumed { robots, after } => {
            m.robots_suspended.inc_by(-(*robots as i64));
            m.suspension_ended(SuspensionOutcome::Resumed);
            tracing::info!(slot = %slot, epoch, robots, suspended_ms = after.as_millis() as u64, "a late renewal matched: robots resumed in place");
        }
        SlotEvent::SuspensionEnded {
            outcome,
            robots,
            detail,
        } => {
            m.robots_suspended.inc_by(-(*robots as i64));
            m.suspension_ended(*outcome);
            // The self-fence was counted at the suspension.
            if *outcome == SuspensionOutcome::Lost {
                m.losses.inc();
            }
            tracing::warn!(slot = %slot, epoch, outcome = outcome.as_str(), "{detail}; stopping its robots: the suspended ones are killed, never thawed");
        }
        SlotEvent::Releasing { running } => {
            tracing::info!(slot = %slot, robots = running, "releasing: stopping robots");
        }
        SlotEvent::Released => {
            m.releases.inc();
            tracing::info!(slot = %slot, epoch, "released slot");
        }
        SlotEvent::ReleaseFailed { why } => tracing::warn!(slot = %slot, "{why}"),
        SlotEvent::RobotsStopped { .. } | SlotEvent::Left => {}
    }
}

/// What `/status`, the worker's database health and `slotpool_slot_held` say after
/// one step.
fn show(cx: &HoldContext, lease: &Lease, event: &SlotEvent) {
    let (slot, epoch, m) = (&lease.slot_id, lease.epoch, &cx.metrics);
    let status = || cx.status.lock().expect("status lock");
    let fenced = "no renewal succeeded before the local deadline";
    match event {
        SlotEvent::Renewed { latency, .. } => {
            cx.health
                .write_landed(Instant::now(), *latency, cx.timing.tick);
            cx.health.ok(m, &cx.status);
            status().renewed(lease);
        }
        SlotEvent::RenewFailed { why, .. } => {
            cx.health.write_failed();
            cx.health.failed(m, &cx.status, why);
        }
        SlotEvent::Lost { detail } | SlotEvent::SuspensionEnded { detail, .. } => {
            given_up(cx, slot, epoch, detail);
        }
        SlotEvent::SelfFenced { detail } => {
            cx.health.failed(m, &cx.status, fenced);
            given_up(cx, slot, epoch, detail);
        }
        SlotEvent::Suspended { .. } => {
            cx.health.failed(m, &cx.status, fenced);
            status().suspended(slot, true);
        }
        SlotEvent::Resumed { .. } => {
            // The late renewal is a write that landed.
            cx.health
                .write_landed(Instant::now(), Duration::ZERO, cx.timing.tick);
            cx.health.ok(m, &cx.status);
            status().suspended(slot, false);
            status().renewed(lease);
        }
        SlotEvent::Left => {
            if status().left(slot, epoch) {
                m.slot_held.inc_by(-1);
            }
            cx.ended.notify_one();
        }
        _ => {}
    }
}

/// The slot learnt lost or given up: from now on neither `/status` nor
/// `slotpool_slot_held` counts it as held, though its robots are still stopping
/// (see [`SlotEvent::Left`]).
fn given_up(cx: &HoldContext, slot: &str, epoch: i64, why: &str) {
    if cx
        .status
        .lock()
        .expect("status lock")
        .given_up(slot, epoch, why)
    {
        cx.metrics.slot_held.inc_by(-1);
    }
}

/// What one step writes to `events`.
async fn record(cx: &HoldContext, lease: &Lease, event: SlotEvent) {
    let (slot, epoch, owner) = (&lease.slot_id, lease.epoch, cx.protocol.owner());
    match event {
        SlotEvent::Suspended { robots } => {
            // In the background: the database is most likely away, and the first
            // late renewal must not wait for this.
            let (store, fields) = (
                cx.store.clone(),
                doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, "robots": robots as i64},
            );
            tokio::spawn(async move { store.record_event(EventKind::Suspend, fields).await });
        }
        SlotEvent::Resumed { after, .. } => {
            // In the background: the hold must go straight back to renewing, since
            // the robots now run on a deadline about half a tick away, and this write
            // may wait on a connection left open across the outage.
            let (store, fields) = (
                cx.store.clone(),
                doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, "suspended_ms": after.as_millis() as i64},
            );
            tokio::spawn(async move { store.record_event(EventKind::LeaseResume, fields).await });
        }
        SlotEvent::RobotsStopped { kind, detail } => {
            let fields = doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, DETAIL: detail};
            cx.store.record_event(kind, fields).await;
        }
        SlotEvent::Released => {
            let fields = doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch};
            cx.store.record_event(EventKind::Release, fields).await;
        }
        _ => {}
    }
}

/// Starts the robots of a new lease in their own task.
fn start_supervisor(
    cx: &HoldContext,
    lease: &Lease,
    guard: WriteGuard,
    claim_recorded: tokio::sync::oneshot::Receiver<()>,
) -> SupervisorHandle {
    let pacer = Arc::new(WritePacer::new(cx.timing.margin));
    let limit = pacer.limit();
    cx.metrics.robot_write_limit.inc_by(limit as i64);
    let ctx = ContextStore::new(
        &cx.store,
        &lease.slot_id,
        lease.epoch,
        cx.protocol.owner(),
        cx.metrics.clone(),
        guard,
        pacer.clone(),
    );
    let mut supervisor = Supervisor::new(
        cx.store.clone(),
        ctx,
        cx.registry.clone(),
        cx.timing,
        cx.metrics.clone(),
        cx.clock.clone(),
    );
    supervisor.after_claim_recorded(claim_recorded);
    supervisor.follow_clock_steps(cx.clock_steps.clone());
    supervisor.measure_into(cx.meters.clone());
    let renewals = supervisor.renewal_timing();
    let suspension = supervisor.suspension();
    let (beats, rx) = watch::channel(Renewal {
        rev: lease.rev,
        at: cx.clock.now(),
        per_command: Duration::ZERO,
    });
    let stop = CancellationToken::new();
    let running = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(supervise(
        supervisor,
        rx,
        stop.clone(),
        cx.timing,
        cx.clock.clone(),
        running.clone(),
    ));
    SupervisorHandle {
        beats,
        renewals,
        pacer,
        limit: AtomicUsize::new(limit),
        stop,
        running,
        suspension,
        task,
    }
}

/// What the slot tells its supervisor after each renewal (and the claim).
#[derive(Debug, Clone, Copy)]
struct Renewal {
    /// The slot's `rev`: it moves whenever the slot's robots change.
    rev: i64,
    /// When the renewal came back: the next one is about a tick later.
    at: Instant,
    /// Its round trip per command (zero for the claim): a slow one holds a changed
    /// slot's read back ([`read_admitted`]). A renewal that finds the slot changed
    /// takes two commands.
    per_command: Duration,
}

/// The slot's side of its running supervisor task.
struct SupervisorHandle {
    beats: watch::Sender<Renewal>,
    /// Moves the renewals to just after the tick's edges while the slot runs
    /// scheduled robots.
    renewals: crate::worker::renewal_timing::RenewalTiming,
    pacer: Arc<WritePacer>,
    /// The pacer's limit as last added to the worker-wide gauge.
    limit: AtomicUsize,
    stop: CancellationToken,
    running: Arc<AtomicUsize>,
    /// Suspends and resumes the robots while the lease is suspended.
    suspension: Arc<crate::worker::supervisor::suspension::Suspension>,
    task: tokio::task::JoinHandle<()>,
}

impl SupervisorHandle {
    /// Feeds a renewal's round trip to the pacer; the worker's gauge is the sum of
    /// its held slots' limits.
    fn paced(&self, latency: Duration, metrics: &Metrics) {
        let now = self.pacer.observe(latency);
        let before = self.limit.swap(now, Ordering::Relaxed);
        metrics.robot_write_limit.inc_by(now as i64 - before as i64);
    }

    /// Stops every robot and waits for that (bounded by the stop grace).
    async fn stop(self, metrics: &Metrics) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::error!("robot supervisor failed: {e}");
        }
        metrics
            .robot_write_limit
            .inc_by(-(self.limit.load(Ordering::Relaxed) as i64));
    }
}

/// The supervisor task: sync after every renewal until told to stop; then stop
/// every robot.
///
/// Syncing right after a renewal gives a sync's read of the slot's robots (possibly a
/// collection scan on some servers) most of a tick before the next renewal is sent.
/// So a stale beat is not used for such a read, nor one whose renewal came back slow
/// unless the read has waited long enough ([`read_admitted`]); a read still due after
/// a sync goes at the next fresh beat.
async fn supervise(
    mut supervisor: Supervisor,
    mut beats: watch::Receiver<Renewal>,
    stop: CancellationToken,
    timing: LeaseTiming,
    clock: SharedClock,
    running: Arc<AtomicUsize>,
) {
    let mut failing = false;
    // Fresh renewals let go by, in a row, for a read that was due; READ_WAITS_MOST
    // once a read had its turn and is still due.
    let mut waited = 0;
    // The fastest renewal of this lease, per command: what this link does when the
    // database is idle.
    let mut floor: Option<Duration> = None;
    loop {
        let beat = *beats.borrow_and_update();
        if !beat.per_command.is_zero() {
            floor = Some(floor.map_or(beat.per_command, |f| f.min(beat.per_command)));
        }
        let reads = supervisor.will_read(beat.rev);
        let fresh = clock.since(beat.at) <= timing.tick / 4;
        let slow = busy_renewal(timing.margin, floor);
        let admitted = fresh
            && read_admitted(
                beat.per_command,
                slow,
                supervisor.first_read_pending(),
                waited,
            );
        if reads && fresh && !admitted {
            if waited == 0 {
                tracing::debug!(
                    slot = %supervisor.slot_id(),
                    renewal_ms = beat.per_command.as_millis() as u64,
                    slow_ms = slow.as_millis() as u64,
                    "the slot's robots changed; the renewal came back slow, so their read waits for a faster one"
                );
            }
            waited += 1;
        }
        if !reads || admitted {
            let synced = tokio::select! {
                _ = stop.cancelled() => break,
                r = supervisor.sync(beat.rev, admitted) => r,
            };
            if !supervisor.will_read(beat.rev) {
                waited = 0;
            } else if admitted {
                waited = READ_WAITS_MOST;
            }
            match synced {
                Ok(_) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        "could not update robots: {}; retrying after each renewal",
                        crate::db::store::brief(&e)
                    );
                }
                Err(_) => {}
            }
            running.store(supervisor.running(), Ordering::Relaxed);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = beats.changed() => if changed.is_err() { break },
        }
    }
    supervisor.stop_all().await;
    running.store(0, Ordering::Relaxed);
}
