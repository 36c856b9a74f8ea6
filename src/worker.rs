//! The worker: standby ⇄ holder loop, heartbeats, shutdown and release.
//!
//! As a standby it surveys the slots, claims one if any is expired, and otherwise
//! sleeps until the earliest lease expires (at most one tick), or until the `slots`
//! change stream reports a release. As a holder it renews every tick, hands the slot's
//! `rev` to the [`Supervisor`], and on loss, self-fence or shutdown stops every robot
//! before anything else.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson};
use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{MonotonicClock, SharedClock};
use crate::config::{Identity, LeaseTiming};
use crate::context::{ContextStore, WriteGuard};
use crate::lease::{Lease, LeaseError, LeaseProtocol};
use crate::metrics::Metrics;
use crate::pacing::WritePacer;
use crate::robot::Registry;
use crate::store::Store;
use crate::supervisor::Supervisor;

/// Everything a worker is configured with.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub identity: Identity,
    /// Where `/healthz`, `/metrics` and `/status` are served (the advertised port).
    pub listen: SocketAddr,
    pub timing: LeaseTiming,
    /// Start claims at the identity's hash position (off only for benchmarks).
    pub hashing: bool,
    /// Wake standbys through a change stream on `slots` when a slot is released.
    pub change_stream: bool,
}

/// What `/status` shows, kept current by the loop.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WorkerStatus {
    pub worker: String,
    pub role: &'static str,
    pub slot_id: Option<String>,
    pub epoch: Option<i64>,
    #[serde(skip)]
    pub last_renewed: Option<Instant>,
    pub lease_age_ms: Option<u64>,
    /// Filled in from the metrics when served.
    pub robots_running: i64,
    pub robots_restarting: i64,
    pub database_ok: bool,
    pub tick_ms: u64,
    pub version: &'static str,
}

pub type SharedStatus = Arc<Mutex<WorkerStatus>>;

pub struct Worker {
    settings: WorkerSettings,
    store: Store,
    /// Same database, separate connection pool, for the lease and heartbeats.
    lease_store: Store,
    registry: Registry,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    status: SharedStatus,
    shutdown: CancellationToken,
    protocol: LeaseProtocol,
    reported: HashSet<String>,
    next_wait: Duration,
    db_down_since: Option<Instant>,
}

/// How a held lease ended.
enum Ended {
    Shutdown,
    Drained,
    Lost,
}

impl Worker {
    pub fn new(settings: WorkerSettings, store: Store, registry: Registry) -> Self {
        let clock: SharedClock = Arc::new(MonotonicClock);
        // Lease traffic (survey, claim, renew, release, heartbeat) has a pool of its
        // own: robots' checkpoints must never delay a renewal.
        let lease_store = store.dedicated(2, "lease").unwrap_or_else(|e| {
            tracing::warn!("no dedicated lease connection pool ({e}); sharing the robots' pool");
            store.clone()
        });
        let mut protocol = LeaseProtocol::new(
            lease_store.slots(),
            settings.identity,
            settings.timing,
            clock.clone(),
        );
        if !settings.hashing {
            protocol = protocol.without_hashing();
        }
        let status = WorkerStatus {
            worker: settings.identity.to_string(),
            role: "standby",
            tick_ms: settings.timing.tick.as_millis() as u64,
            version: env!("CARGO_PKG_VERSION"),
            ..Default::default()
        };
        Worker {
            settings,
            store,
            lease_store,
            registry,
            clock,
            metrics: Arc::new(Metrics::default()),
            status: Arc::new(Mutex::new(status)),
            shutdown: CancellationToken::new(),
            protocol,
            reported: HashSet::new(),
            next_wait: Duration::ZERO,
            db_down_since: None,
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    pub fn status(&self) -> SharedStatus {
        self.status.clone()
    }

    /// Cancel it to stop the worker gracefully (robots stopped, slot released).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    fn owner(&self) -> String {
        self.settings.identity.to_string()
    }

    fn tick(&self) -> Duration {
        self.settings.timing.tick
    }

    /// Runs until the shutdown token is cancelled.
    pub async fn run(mut self) {
        let wake = Arc::new(Notify::new());
        tracing::info!(worker = %self.owner(), tick_ms = self.tick().as_millis() as u64, "worker started as standby");
        // The change stream only serves standbys: closed while holding a slot.
        let mut watcher = self.watch(&wake);
        while !self.shutdown.is_cancelled() {
            let wait = match self.stand_by().await {
                Some(lease) => {
                    if let Some(w) = watcher.take() {
                        w.cancel();
                    }
                    let ended = self.hold(lease).await;
                    if matches!(ended, Ended::Shutdown) {
                        break;
                    }
                    watcher = self.watch(&wake);
                    continue;
                }
                None => self.standby_wait(),
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        self.leave().await;
    }

    /// Opens the release-watching change stream (if enabled); cancel the returned
    /// token to close it.
    fn watch(&self, wake: &Arc<Notify>) -> Option<CancellationToken> {
        if !self.settings.change_stream {
            return None;
        }
        let stop = self.shutdown.child_token();
        tokio::spawn(watch_releases(
            self.store.clone(),
            wake.clone(),
            stop.clone(),
        ));
        Some(stop)
    }

    /// One standby round: heartbeat, survey, claim. Remembers when to look again.
    async fn stand_by(&mut self) -> Option<Lease> {
        self.set_standby();
        let limit = self.op_timeout();
        let (survey, ()) = tokio::join!(
            tokio::time::timeout(limit, self.protocol.survey()),
            self.bounded_heartbeat(None)
        );
        let survey = match survey {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.db_failed(&e.to_string());
                self.next_wait = self.tick();
                return None;
            }
            Err(_) => {
                self.db_failed(&format!("no answer within {} ms", limit.as_millis()));
                self.next_wait = Duration::ZERO;
                return None;
            }
        };
        self.db_ok();
        for bad in &survey.invalid {
            if self.reported.insert(format!("{}:{}", bad.id, bad.why)) {
                tracing::error!(slot = %bad.id, "skipping broken slot document: {}", bad.why);
            }
        }
        self.next_wait = survey.next_expiry.unwrap_or(self.tick()).min(self.tick());
        match tokio::time::timeout(limit, self.protocol.claim(&survey)).await {
            Err(_) => {
                // A claim may have landed without its answer: that slot then expires
                // unrenewed after L and is claimed again, with a new epoch.
                self.db_failed(&format!(
                    "no answer to a claim within {} ms",
                    limit.as_millis()
                ));
                None
            }
            Ok(Ok(outcome)) => {
                self.metrics.claim_attempts.add(outcome.attempts as u64);
                self.metrics.claim_conflicts.add(outcome.conflicts as u64);
                if outcome.conflicts > 0 && outcome.lease.is_none() {
                    tracing::debug!(
                        conflicts = outcome.conflicts,
                        "every expired slot was taken first by another worker"
                    );
                }
                outcome.lease
            }
            Ok(Err(e)) => {
                self.db_failed(&e.to_string());
                None
            }
        }
    }

    fn standby_wait(&self) -> Duration {
        self.next_wait
    }

    /// Holds a freshly claimed lease until it is lost, fenced, drained or shut down.
    ///
    /// Renewals run here; robots run in a separate supervisor task that hears of each
    /// renewal (with the slot's `rev`), so no robot work can delay a renewal, and each
    /// renewal's round trip paces the robots' writes.
    async fn hold(&mut self, mut lease: Lease) -> Ended {
        let owner = self.owner();
        tracing::info!(slot = %lease.slot_id, epoch = lease.epoch, worker = %owner, "claimed slot");
        self.metrics.claims.inc();
        self.metrics.slot_held.set(1);
        self.metrics.epoch.set(lease.epoch);
        let guard = WriteGuard::new(lease.deadline(), self.clock.clone());
        let robots = self.start_supervisor(&lease, guard.clone());
        self.set_holder(&lease);
        self.store
            .record_event(
                "claim",
                doc! {"worker": &owner, "slot_id": &lease.slot_id, "epoch": lease.epoch},
            )
            .await;
        self.bounded_heartbeat(Some(&lease)).await;
        let mut next = lease.last_renewed() + self.tick();
        let ended = loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break Ended::Shutdown,
                _ = tokio::time::sleep_until(next.min(lease.deadline())) => {}
            }
            let sent = self.clock.now();
            match self.protocol.renew(&mut lease).await {
                Ok(renewed) => {
                    self.metrics.renew_latency.observe(sent.elapsed());
                    tracing::debug!(slot = %lease.slot_id, rev = renewed.rev, latency_ms = sent.elapsed().as_millis() as u64, "renewed");
                    guard.extend(lease.deadline());
                    self.db_ok();
                    if renewed.draining {
                        tracing::info!(slot = %lease.slot_id, "slot is draining: handing it back");
                        break Ended::Drained;
                    }
                    next = sent + self.tick();
                    let limit = robots.pacer.observe(sent.elapsed());
                    self.metrics.robot_write_limit.set(limit as i64);
                    robots.beats.send_replace(Beat {
                        rev: renewed.rev,
                        at: Instant::now(),
                    });
                    self.bounded_heartbeat(Some(&lease)).await;
                    self.set_holder(&lease);
                }
                Err(LeaseError::Db(e)) => {
                    self.metrics.renew_failures.inc();
                    let left = lease.deadline().saturating_duration_since(self.clock.now());
                    tracing::warn!(slot = %lease.slot_id, epoch = lease.epoch, left_ms = left.as_millis() as u64, "renewal failed: {}", self.scrub(&crate::store::brief(&e)));
                    self.db_failed(&crate::store::brief(&e));
                    next = self.clock.now() + (self.tick() / 4).min(left);
                }
                Err(e) => {
                    guard.revoke();
                    let kind = if matches!(e, LeaseError::Lost { .. }) {
                        self.metrics.losses.inc();
                        "lost"
                    } else {
                        self.metrics.self_fences.inc();
                        self.db_failed("no renewal succeeded before the local deadline");
                        "self_fence"
                    };
                    tracing::warn!(slot = %lease.slot_id, epoch = lease.epoch, "{e}; stopping its robots");
                    robots.stop().await;
                    self.store
                        .record_event(kind, doc! {"worker": &owner, "slot_id": &lease.slot_id, "epoch": lease.epoch, "detail": e.to_string()})
                        .await;
                    self.left_slot();
                    return Ended::Lost;
                }
            }
        };
        // Shutdown or drain: robots first (each may write a last checkpoint), then the
        // slot.
        tracing::info!(slot = %lease.slot_id, robots = robots.running.load(Ordering::Relaxed), "releasing: stopping robots");
        robots.stop().await;
        guard.revoke();
        let released =
            tokio::time::timeout(self.op_timeout(), self.protocol.release(&mut lease)).await;
        match released {
            Ok(Ok(true)) => {
                self.metrics.releases.inc();
                tracing::info!(slot = %lease.slot_id, epoch = lease.epoch, "released slot");
                self.store
                    .record_event(
                        "release",
                        doc! {"worker": &owner, "slot_id": &lease.slot_id, "epoch": lease.epoch},
                    )
                    .await;
            }
            Ok(Ok(false)) => {
                tracing::warn!(slot = %lease.slot_id, "slot was no longer ours at release")
            }
            Ok(Err(e)) => {
                tracing::warn!(slot = %lease.slot_id, "could not release slot (it expires by itself within {} ms): {}", self.settings.timing.lease_ms(), self.scrub(&e.to_string()))
            }
            Err(_) => {
                tracing::warn!(slot = %lease.slot_id, "no answer to the release (the slot expires by itself within {} ms)", self.settings.timing.lease_ms())
            }
        }
        self.left_slot();
        ended
    }

    /// Starts the robots of a new lease in their own task.
    fn start_supervisor(&self, lease: &Lease, guard: WriteGuard) -> SupervisorHandle {
        let pacer = Arc::new(WritePacer::new(self.settings.timing.margin));
        self.metrics.robot_write_limit.set(pacer.limit() as i64);
        let ctx = ContextStore::new(
            self.store.robots(),
            &lease.slot_id,
            lease.epoch,
            &self.owner(),
            self.metrics.clone(),
            guard,
            pacer.clone(),
        );
        let supervisor = Supervisor::new(
            self.store.clone(),
            ctx,
            self.registry.clone(),
            self.settings.timing,
            self.metrics.clone(),
        );
        let (beats, rx) = watch::channel(Beat {
            rev: lease.rev,
            at: Instant::now(),
        });
        let stop = CancellationToken::new();
        let running = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(supervise(
            supervisor,
            rx,
            stop.clone(),
            self.tick(),
            running.clone(),
        ));
        SupervisorHandle {
            beats,
            pacer,
            stop,
            running,
            task,
        }
    }

    /// How long a standby or bookkeeping operation may take before it counts as a
    /// database failure (the driver has no socket timeout).
    fn op_timeout(&self) -> Duration {
        (self.tick() * 2).max(Duration::from_secs(2))
    }

    async fn bounded_heartbeat(&self, lease: Option<&Lease>) {
        let limit = (self.tick() / 2).max(Duration::from_millis(100));
        if tokio::time::timeout(limit, self.heartbeat(lease))
            .await
            .is_err()
        {
            tracing::debug!("heartbeat got no answer within {} ms", limit.as_millis());
        }
    }

    fn set_holder(&self, lease: &Lease) {
        let mut s = self.status.lock().expect("status lock");
        s.role = "holder";
        s.slot_id = Some(lease.slot_id.clone());
        s.epoch = Some(lease.epoch);
        s.last_renewed = Some(lease.last_renewed());
    }

    fn set_standby(&self) {
        let mut s = self.status.lock().expect("status lock");
        s.role = "standby";
        s.slot_id = None;
        s.epoch = None;
        s.last_renewed = None;
    }

    fn left_slot(&self) {
        self.metrics.slot_held.set(0);
        self.metrics.epoch.set(0);
        self.metrics.robot_write_limit.set(0);
        self.set_standby();
    }

    fn db_ok(&mut self) {
        if let Some(since) = self.db_down_since.take() {
            tracing::info!(
                down_ms = since.elapsed().as_millis() as u64,
                "database reachable again"
            );
        }
        self.metrics.db_healthy.set(1);
        self.status.lock().expect("status lock").database_ok = true;
    }

    fn db_failed(&mut self, why: &str) {
        self.metrics.db_healthy.set(0);
        self.status.lock().expect("status lock").database_ok = false;
        if self.db_down_since.is_none() {
            self.db_down_since = Some(Instant::now());
            tracing::error!("database unreachable: {}", self.scrub(why));
        }
    }

    /// Driver errors can quote the connection string; never log its password.
    fn scrub(&self, s: &str) -> String {
        crate::store::scrub(s, self.store.uri())
    }

    /// `workers` upsert: who is alive, standby or holding what. Best effort.
    async fn heartbeat(&self, lease: Option<&Lease>) {
        let (slot, epoch) = match lease {
            Some(l) => (Bson::String(l.slot_id.clone()), Bson::Int64(l.epoch)),
            None => (Bson::Null, Bson::Null),
        };
        let r = self
            .lease_store
            .workers()
            .update_one(
                doc! {"_id": self.owner()},
                vec![doc! {"$set": {
                    "slot_id": slot, "epoch": epoch, "last_seen": "$$NOW",
                    "tick_ms": self.tick().as_millis() as i64,
                    "version": env!("CARGO_PKG_VERSION"),
                }}],
            )
            .upsert(true)
            .await;
        if let Err(e) = r {
            tracing::debug!("heartbeat failed: {}", self.scrub(&crate::store::brief(&e)));
        }
    }

    /// On a clean exit the worker leaves the `workers` list, so standbys are counted
    /// honestly.
    async fn leave(&self) {
        let _ = self
            .store
            .workers()
            .delete_one(doc! {"_id": self.owner()})
            .await;
        tracing::info!(worker = %self.owner(), "worker stopped");
    }
}

/// What the worker tells its supervisor after each renewal (and the claim).
#[derive(Debug, Clone, Copy)]
struct Beat {
    /// The slot's `rev`: it moves whenever the slot's robots change.
    rev: i64,
    /// When the renewal came back: the next one is about a tick later.
    at: Instant,
}

/// The worker's side of a running supervisor task.
struct SupervisorHandle {
    beats: watch::Sender<Beat>,
    pacer: Arc<WritePacer>,
    stop: CancellationToken,
    running: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SupervisorHandle {
    /// Stops every robot and waits for that (bounded by the stop grace).
    async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::error!("robot supervisor failed: {e}");
        }
    }
}

/// The supervisor task: sync after every renewal until told to stop; then stop
/// every robot.
///
/// Syncing right after a renewal matters on a slow server: a sync may begin with a
/// read of all the slot's robots, which some servers answer by scanning the whole
/// collection while other requests wait. Started just after a renewal came back, that
/// stall has most of a tick to finish before the next renewal is even sent. A beat
/// that is already stale (the previous sync ran long) is not used for such a read;
/// the next fresh one is.
async fn supervise(
    mut supervisor: Supervisor,
    mut beats: watch::Receiver<Beat>,
    stop: CancellationToken,
    tick: Duration,
    running: Arc<AtomicUsize>,
) {
    let mut failing = false;
    loop {
        let beat = *beats.borrow_and_update();
        if beat.at.elapsed() <= tick / 4 || !supervisor.will_read(beat.rev) {
            let synced = tokio::select! {
                _ = stop.cancelled() => break,
                r = supervisor.sync(beat.rev) => r,
            };
            match synced {
                Ok(_) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(
                        "could not update robots: {}; retrying after each renewal",
                        crate::store::brief(&e)
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

/// Wakes standbys the moment a slot is released or added, instead of at their next
/// poll. Needs a replica set (change streams); without one, polling alone still works.
async fn watch_releases(store: Store, wake: Arc<Notify>, stop: CancellationToken) {
    let pipeline = vec![doc! {"$match": {"$or": [
        {"operationType": {"$in": ["insert", "replace"]}},
        {"updateDescription.updatedFields.owner": {"$type": "null"}},
        {"updateDescription.updatedFields.draining": false},
    ]}}];
    let mut warned = false;
    while !stop.is_cancelled() {
        match store.slots().watch().pipeline(pipeline.clone()).await {
            Ok(mut stream) => loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = stream.next() => match ev {
                        Some(Ok(_)) => wake.notify_one(),
                        Some(Err(_)) | None => break,
                    }
                }
            },
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::info!("no change stream on slots ({e}); standbys rely on polling");
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}
