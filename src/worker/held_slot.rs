//! One held slot: everything that lives exactly as long as one lease.
//!
//! [`HeldSlot::spawn`] takes a freshly claimed [`Lease`] and starts, in one task, its
//! renewals, [`WriteGuard`], [`WritePacer`], [`ContextStore`] and [`Supervisor`]. On
//! loss or self-fence the task stops the robots at once; on hand-back, drain or
//! shutdown it stops them (each may checkpoint) and then releases the slot. Each held
//! slot renews on its own schedule and deadline over the lease's own connection pool,
//! so no robot work and no other slot delays its renewals.

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

/// How a held slot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Given back on request (hand-back or shutdown): robots stopped, slot released.
    Released,
    /// An operator drained it: robots stopped, slot released.
    Drained,
    /// Lost to another worker, removed, or self-fenced: robots stopped at once.
    Lost,
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

/// Holds one lease until it is lost, fenced, drained or given back.
async fn hold(
    mut lease: Lease,
    cx: HoldContext,
    release: CancellationToken,
    overflow: bool,
) -> Ended {
    let (recorded_tx, recorded) = tokio::sync::oneshot::channel();
    report(
        &cx,
        &lease,
        SlotEvent::Claimed {
            overflow,
            recorded: recorded_tx,
        },
    )
    .await;
    let guard = WriteGuard::new(lease.deadline(), cx.clock.clone());
    let robots = start_supervisor(&cx, &lease, guard.clone(), recorded);
    let tick = cx.timing.tick;
    let mut next = lease.last_renewed() + first_renewal_after(tick);
    let mut lost = None;
    // Whether the renewals go at the tick's edges (see RenewalTiming).
    let mut at_edges = false;
    // The slot's cost as last recorded: a renewal records it again only changed.
    let mut recorded_cost = None;
    let ended = loop {
        tokio::select! {
            _ = release.cancelled() => break Ended::Released,
            _ = cx.clock.sleep_until(next.min(lease.deadline())) => {}
        }
        let sent = cx.clock.now();
        // The round trip is a measurement of the database, on real time.
        let began = Instant::now();
        let cost = cx
            .load
            .slot(&lease.slot_id)
            .filter(|c| recorded_cost.as_ref() != Some(c));
        match cx.protocol.renew_reporting(&mut lease, cost.as_ref()).await {
            Ok(renewed) => {
                if cost.is_some() {
                    recorded_cost = cost;
                }
                let latency = began.elapsed();
                guard.extend(lease.deadline());
                report(
                    &cx,
                    &lease,
                    SlotEvent::Renewed {
                        latency,
                        rev: renewed.rev,
                    },
                )
                .await;
                if renewed.draining {
                    report(&cx, &lease, SlotEvent::Draining).await;
                    break Ended::Drained;
                }
                next = sent + tick;
                let advance = robots.renewals.advance(next, tick, &cx.clock);
                if advance.is_some() != at_edges {
                    at_edges = advance.is_some();
                    if at_edges {
                        tracing::info!(slot = %lease.slot_id, "renewals now go just after the edges of the tick, where firings fall (the slot runs scheduled robots)");
                    } else {
                        tracing::info!(slot = %lease.slot_id, "renewals keep their own phase again (no scheduled robot left)");
                    }
                }
                next -= advance.unwrap_or_default();
                robots.paced(latency, &cx.metrics);
                robots.beats.send_replace(Renewal {
                    rev: renewed.rev,
                    at: cx.clock.now(),
                    per_command: latency / renewed.commands.max(1),
                });
            }
            Err(LeaseError::Db(e)) => {
                let left = lease.deadline().saturating_duration_since(cx.clock.now());
                let why = cx.store.scrub(&crate::db::store::brief(&e));
                report(&cx, &lease, SlotEvent::RenewFailed { why, left }).await;
                next = cx.clock.now() + (tick / 4).min(left);
            }
            Err(LeaseError::SelfFenced { .. }) if !cx.timing.suspend_for.is_zero() => {
                let robots_now = robots.running.load(Ordering::Relaxed);
                let since = cx.clock.now();
                robots.suspension.suspend();
                report(&cx, &lease, SlotEvent::Suspended { robots: robots_now }).await;
                match ride_out(&cx, &mut lease, &release).await {
                    RideOut::Resumed { renewed, sent } => {
                        // New clients before the guard opens: the writes held back
                        // go out, or are read back, the moment it does.
                        cx.protocol.reopen_after(cx.health.outages());
                        reopen_robots(&cx);
                        guard.extend(lease.deadline());
                        robots.suspension.resume();
                        let after = cx.clock.since(since);
                        report(
                            &cx,
                            &lease,
                            SlotEvent::Resumed {
                                robots: robots_now,
                                after,
                            },
                        )
                        .await;
                        if renewed.draining {
                            report(&cx, &lease, SlotEvent::Draining).await;
                            break Ended::Drained;
                        }
                        next = sent + tick;
                        robots.beats.send_replace(Renewal {
                            rev: renewed.rev,
                            at: cx.clock.now(),
                            per_command: Duration::ZERO,
                        });
                    }
                    RideOut::Ended { outcome, detail } => {
                        // Killed, never thawed: the guard first, so nothing of theirs
                        // is written, then the robots (see `Supervisor::stop_all`).
                        guard.revoke();
                        report(
                            &cx,
                            &lease,
                            SlotEvent::SuspensionEnded {
                                outcome,
                                robots: robots_now,
                                detail: detail.clone(),
                            },
                        )
                        .await;
                        let kind = match outcome {
                            SuspensionOutcome::Lost => EventKind::Lost,
                            _ => EventKind::SelfFence,
                        };
                        lost = Some((kind, detail));
                        break Ended::Lost;
                    }
                }
            }
            Err(e) => {
                guard.revoke();
                let detail = e.to_string();
                let (kind, event) = if matches!(e, LeaseError::Lost { .. }) {
                    (
                        EventKind::Lost,
                        SlotEvent::Lost {
                            detail: detail.clone(),
                        },
                    )
                } else {
                    (
                        EventKind::SelfFence,
                        SlotEvent::SelfFenced {
                            detail: detail.clone(),
                        },
                    )
                };
                report(&cx, &lease, event).await;
                lost = Some((kind, detail));
                break Ended::Lost;
            }
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
            crate::worker::poke::poke_front(&cx.line, me, cx.watchers, &cx.metrics).await;
        }
    }
    report(&cx, &lease, SlotEvent::Left).await;
    ended
}

/// How a suspension ended.
enum RideOut {
    /// A late renewal matched, sent at `sent`.
    Resumed {
        renewed: crate::db::lease::Renewed,
        sent: Instant,
    },
    /// It did not, or could not, or the worker is going away.
    Ended {
        outcome: SuspensionOutcome,
        detail: String,
    },
}

/// While the slot's robots are suspended, renews late until a renewal matches
/// (resume), the slot proves taken (lost), `--suspend-for` passes (expired), or the
/// worker or the slot is going away (stopped).
///
/// One late renewal is in flight at a time, awaited for up to a tick: a link that
/// holds its bytes (a partition, a paused server) answers it the moment it heals,
/// while one stuck on a connection that will never answer (a server restarted under
/// it) is replaced in time to renew within the lease of contact the standbys give
/// this holder, on a new client: the one given up on keeps its place in the old
/// client's queue. One that failed is sent again a quarter tick after it was sent.
async fn ride_out(cx: &HoldContext, lease: &mut Lease, release: &CancellationToken) -> RideOut {
    let until = lease.deadline() + cx.timing.suspend_for;
    let ended = |outcome, detail: String| RideOut::Ended { outcome, detail };
    let stopped = || {
        ended(
            SuspensionOutcome::Stopped,
            "the slot was given up while suspended".into(),
        )
    };
    let mut failures = 0u32;
    loop {
        if cx.clock.now() >= until {
            return ended(
                SuspensionOutcome::Expired,
                format!(
                    "no renewal within --suspend-for {} past the deadline",
                    humantime::format_duration(cx.timing.suspend_for)
                ),
            );
        }
        let sent = cx.clock.now();
        let client = cx.protocol.client_generation();
        let give_up = (sent + cx.timing.tick).min(until);
        let reply = tokio::select! {
            _ = release.cancelled() => return stopped(),
            r = cx.protocol.late_renewal(lease) => Some(r),
            _ = cx.clock.sleep_until(give_up) => None,
        };
        let settled = match reply {
            Some(reply) => cx.protocol.settle_late(lease, sent, reply),
            None => {
                cx.protocol
                    .reopen_after_giving_up(client, cx.health.outages());
                Err(LeaseError::Db(mongodb::error::Error::custom(format!(
                    "no answer to a late renewal within {} ms",
                    give_up.saturating_duration_since(sent).as_millis()
                ))))
            }
        };
        match settled {
            Ok(renewed) => return RideOut::Resumed { renewed, sent },
            Err(LeaseError::Lost { .. }) => {
                return ended(
                    SuspensionOutcome::Lost,
                    format!(
                        "lost slot {} (epoch {}) while suspended: another worker claimed it",
                        lease.slot_id, lease.epoch
                    ),
                );
            }
            Err(e) => {
                failures += 1;
                // Once, then every twentieth: an outage of a minute says it a few times.
                let why = cx.store.scrub(&e.to_string());
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(slot = %lease.slot_id, epoch = lease.epoch, tries = failures, "late renewal failed: {why}");
                } else {
                    tracing::debug!(slot = %lease.slot_id, epoch = lease.epoch, tries = failures, "late renewal failed: {why}");
                }
            }
        }
        // At once after an answer that came too late (the link is back); otherwise
        // a quarter tick after the last sending.
        let again = (sent + cx.timing.tick / 4).min(until);
        tokio::select! {
            _ = release.cancelled() => return stopped(),
            _ = cx.clock.sleep_until(again) => {}
        }
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

/// A step in one held slot's life. [`hold`] emits each into [`report`], the one place
/// that turns it into log lines, metrics, the worker's status and `events`.
#[derive(Debug)]
enum SlotEvent {
    /// The claim landed; `overflow` when the worker already held a slot.
    /// `recorded` is told when the claim's event is written (or refused by the
    /// server): the supervisor lets no robot write before that, so each epoch's
    /// claim comes first in `events`, yet the event's write overlaps the slot's
    /// listing.
    Claimed {
        overflow: bool,
        recorded: tokio::sync::oneshot::Sender<()>,
    },
    /// A renewal landed after `latency`; `rev` is the slot's robot revision.
    Renewed { latency: Duration, rev: i64 },
    /// A renewal failed for a reason the next one may not have; `left` until the
    /// local deadline.
    RenewFailed { why: String, left: Duration },
    /// An operator drained the slot: it is being handed back.
    Draining,
    /// Taken by another worker or removed: robots are being stopped.
    Lost { detail: String },
    /// No renewal succeeded before the local deadline: robots are being stopped.
    SelfFenced { detail: String },
    /// No renewal succeeded before the local deadline: the `robots` are suspended
    /// while the holder renews late.
    Suspended { robots: usize },
    /// A late renewal matched `after` the suspension began: the robots go on.
    Resumed { robots: usize, after: Duration },
    /// The suspension ended without a renewal: the robots are being killed.
    SuspensionEnded {
        outcome: SuspensionOutcome,
        robots: usize,
        detail: String,
    },
    /// The robots of a lost (`kind` "lost") or self-fenced ("self_fence") slot are
    /// all stopped.
    RobotsStopped { kind: EventKind, detail: String },
    /// A hand-back, drain or shutdown: the `running` robots are being stopped
    /// (each may write a last checkpoint) before the slot is released.
    Releasing { running: usize },
    /// The slot was released: a standby may take it at once.
    Released,
    /// The release did not land; the slot expires by itself.
    ReleaseFailed { why: String },
    /// The held slot is over, however it ended.
    Left,
}

/// Reports one step of a held slot to every sink at once: the log, the metrics, the
/// worker's `/status` and database health, and the `events` collection.
async fn report(cx: &HoldContext, lease: &Lease, event: SlotEvent) {
    let (slot, epoch) = (&lease.slot_id, lease.epoch);
    let owner = cx.protocol.owner();
    let m = &cx.metrics;
    match event {
        SlotEvent::Claimed {
            overflow,
            mut recorded,
        } => {
            tracing::info!(slot = %slot, epoch, worker = %owner, overflow, "claimed slot");
            m.claims.inc();
            m.slot_held.inc_by(1);
            m.epoch.set(epoch);
            cx.status.lock().expect("status lock").held(lease, overflow);
            // Written beside the supervisor's first reads, not before them; the
            // supervisor waits for it before any robot writes, for as long as the
            // slot is held: the write is never given up for want of an answer, and
            // ends when the supervisor does (the hold ended first).
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
        SlotEvent::Renewed { latency, rev } => {
            m.renew_latency.observe(latency);
            tracing::debug!(slot = %slot, rev, latency_ms = latency.as_millis() as u64, "renewed");
            cx.health
                .write_landed(Instant::now(), latency, cx.timing.tick);
            cx.health.ok(m, &cx.status);
            cx.status.lock().expect("status lock").renewed(lease);
        }
        SlotEvent::RenewFailed { why, left } => {
            m.renew_failures.inc();
            tracing::warn!(slot = %slot, epoch, left_ms = left.as_millis() as u64, "renewal failed: {why}");
            cx.health.write_failed();
            cx.health.failed(m, &cx.status, &why);
        }
        SlotEvent::Draining => {
            tracing::info!(slot = %slot, "slot is draining: handing it back");
        }
        SlotEvent::Lost { detail } => {
            m.losses.inc();
            given_up(cx, slot, epoch, &detail);
            tracing::warn!(slot = %slot, epoch, "{detail}; stopping its robots");
        }
        SlotEvent::SelfFenced { detail } => {
            m.self_fences.inc();
            cx.health.failed(
                m,
                &cx.status,
                "no renewal succeeded before the local deadline",
            );
            given_up(cx, slot, epoch, &detail);
            tracing::warn!(slot = %slot, epoch, "{detail}; stopping its robots");
        }
        SlotEvent::Suspended { robots } => {
            m.robots_suspended.inc_by(robots as i64);
            m.self_fences.inc();
            cx.health.failed(
                m,
                &cx.status,
                "no renewal succeeded before the local deadline",
            );
            cx.status.lock().expect("status lock").suspended(slot, true);
            tracing::warn!(slot = %slot, epoch, robots, suspend_for_ms = cx.timing.suspend_for.as_millis() as u64, "self-fenced: no renewal before the local deadline; robots suspended, not stopped, while the holder renews late");
            // In the background: the database is most likely away, and the first
            // late renewal must not wait for this.
            let (store, fields) = (
                cx.store.clone(),
                doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, "robots": robots as i64},
            );
            tokio::spawn(async move { store.record_event(EventKind::Suspend, fields).await });
        }
        SlotEvent::Resumed { robots, after } => {
            m.robots_suspended.inc_by(-(robots as i64));
            m.suspension_ended(SuspensionOutcome::Resumed);
            // The late renewal is a write that landed.
            cx.health
                .write_landed(Instant::now(), Duration::ZERO, cx.timing.tick);
            cx.health.ok(m, &cx.status);
            cx.status
                .lock()
                .expect("status lock")
                .suspended(slot, false);
            cx.status.lock().expect("status lock").renewed(lease);
            tracing::info!(slot = %slot, epoch, robots, suspended_ms = after.as_millis() as u64, "a late renewal matched: robots resumed in place");
            // In the background: the hold must go straight back to renewing, since
            // the robots now run on a deadline about half a tick away, and this write
            // may wait on a connection left open across the outage.
            let (store, fields) = (
                cx.store.clone(),
                doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, "suspended_ms": after.as_millis() as i64},
            );
            tokio::spawn(async move { store.record_event(EventKind::LeaseResume, fields).await });
        }
        SlotEvent::SuspensionEnded {
            outcome,
            robots,
            detail,
        } => {
            m.robots_suspended.inc_by(-(robots as i64));
            m.suspension_ended(outcome);
            // The self-fence was counted at the suspension.
            if outcome == SuspensionOutcome::Lost {
                m.losses.inc();
            }
            given_up(cx, slot, epoch, &detail);
            tracing::warn!(slot = %slot, epoch, outcome = outcome.as_str(), "{detail}; stopping its robots: the suspended ones are killed, never thawed");
        }
        SlotEvent::RobotsStopped { kind, detail } => {
            cx.store
                .record_event(
                    kind,
                    doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch, DETAIL: detail},
                )
                .await;
        }
        SlotEvent::Releasing { running } => {
            tracing::info!(slot = %slot, robots = running, "releasing: stopping robots");
        }
        SlotEvent::Released => {
            m.releases.inc();
            tracing::info!(slot = %slot, epoch, "released slot");
            cx.store
                .record_event(
                    EventKind::Release,
                    doc! {WORKER: owner, SLOT_ID: slot, EPOCH: epoch},
                )
                .await;
        }
        SlotEvent::ReleaseFailed { why } => tracing::warn!(slot = %slot, "{why}"),
        SlotEvent::Left => {
            if cx.status.lock().expect("status lock").left(slot, epoch) {
                m.slot_held.inc_by(-1);
            }
            cx.ended.notify_one();
        }
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
