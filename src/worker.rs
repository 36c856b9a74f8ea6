//! The worker: standby ⇄ holder loop, heartbeats, shutdown and release.
//!
//! As a standby it surveys the slots, claims one if any is expired, and otherwise
//! sleeps until the earliest lease expires (at most one tick), or until the `slots`
//! change stream reports a release. As a holder it renews every tick, hands the slot's
//! `rev` to the [`Supervisor`], and on loss, self-fence or shutdown stops every robot
//! before anything else.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{MonotonicClock, SharedClock};
use crate::config::{Identity, LeaseTiming};
use crate::context::{ContextStore, WriteGuard};
use crate::lease::{Lease, LeaseError, LeaseProtocol};
use crate::metrics::Metrics;
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
    pub robots: usize,
    pub database_ok: bool,
    pub tick_ms: u64,
    pub version: &'static str,
}

pub type SharedStatus = Arc<Mutex<WorkerStatus>>;

pub struct Worker {
    settings: WorkerSettings,
    store: Store,
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
        let mut protocol = LeaseProtocol::new(
            store.slots(),
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
        tokio::spawn(watch_releases(
            self.store.clone(),
            wake.clone(),
            self.shutdown.child_token(),
        ));
        tracing::info!(worker = %self.owner(), tick_ms = self.tick().as_millis() as u64, "worker started as standby");
        while !self.shutdown.is_cancelled() {
            let wait = match self.stand_by().await {
                Some(lease) => match self.hold(lease).await {
                    Ended::Shutdown => break,
                    Ended::Drained | Ended::Lost => continue,
                },
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

    /// One standby round: heartbeat, survey, claim. Remembers when to look again.
    async fn stand_by(&mut self) -> Option<Lease> {
        self.set_standby();
        let (survey, ()) = tokio::join!(self.protocol.survey(), self.heartbeat(None));
        let survey = match survey {
            Ok(s) => s,
            Err(e) => {
                self.db_failed(&e.to_string());
                self.next_wait = self.tick();
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
        match self.protocol.claim(&survey).await {
            Ok(outcome) => {
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
            Err(e) => {
                self.db_failed(&e.to_string());
                None
            }
        }
    }

    fn standby_wait(&self) -> Duration {
        self.next_wait
    }

    /// Holds a freshly claimed lease until it is lost, fenced or shut down.
    async fn hold(&mut self, mut lease: Lease) -> Ended {
        let owner = self.owner();
        tracing::info!(slot = %lease.slot_id, epoch = lease.epoch, worker = %owner, "claimed slot");
        self.metrics.claims.inc();
        self.metrics.slot_held.set(1);
        self.metrics.epoch.set(lease.epoch);
        self.store
            .record_event(
                "claim",
                doc! {"worker": &owner, "slot_id": &lease.slot_id, "epoch": lease.epoch},
            )
            .await;
        let guard = WriteGuard::new(lease.deadline(), self.clock.clone());
        let ctx = ContextStore::new(
            self.store.robots(),
            &lease.slot_id,
            lease.epoch,
            &owner,
            self.metrics.clone(),
            guard.clone(),
        );
        let mut supervisor = Supervisor::new(
            self.store.clone(),
            ctx,
            self.registry.clone(),
            self.settings.timing,
            self.metrics.clone(),
        );
        self.set_holder(&lease, supervisor.running());
        let (synced, _) = tokio::join!(supervisor.sync(lease.rev), self.heartbeat(Some(&lease)));
        if let Err(e) = synced {
            tracing::warn!(slot = %lease.slot_id, "could not start robots yet: {}; retrying next tick", crate::store::brief(&e));
        }
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
                    guard.extend(lease.deadline());
                    self.db_ok();
                    if renewed.draining {
                        tracing::info!(slot = %lease.slot_id, "slot is draining: handing it back");
                        break Ended::Drained;
                    }
                    next = sent + self.tick();
                    let (synced, _) =
                        tokio::join!(supervisor.sync(renewed.rev), self.heartbeat(Some(&lease)));
                    if let Err(e) = synced {
                        tracing::warn!(slot = %lease.slot_id, "could not update robots: {}; retrying next tick", crate::store::brief(&e));
                    }
                    self.set_holder(&lease, supervisor.running());
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
                        "self_fence"
                    };
                    tracing::warn!(slot = %lease.slot_id, epoch = lease.epoch, "{e}; stopping its robots");
                    supervisor.stop_all().await;
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
        tracing::info!(slot = %lease.slot_id, robots = supervisor.running(), "releasing: stopping robots");
        supervisor.stop_all().await;
        guard.revoke();
        match self.protocol.release(&mut lease).await {
            Ok(true) => {
                self.metrics.releases.inc();
                tracing::info!(slot = %lease.slot_id, epoch = lease.epoch, "released slot");
                self.store
                    .record_event(
                        "release",
                        doc! {"worker": &owner, "slot_id": &lease.slot_id, "epoch": lease.epoch},
                    )
                    .await;
            }
            Ok(false) => {
                tracing::warn!(slot = %lease.slot_id, "slot was no longer ours at release")
            }
            Err(e) => {
                tracing::warn!(slot = %lease.slot_id, "could not release slot (it expires by itself in {} ms): {}", self.settings.timing.lease_ms(), self.scrub(&e.to_string()))
            }
        }
        self.left_slot();
        ended
    }

    fn set_holder(&self, lease: &Lease, robots: usize) {
        let mut s = self.status.lock().expect("status lock");
        s.role = "holder";
        s.slot_id = Some(lease.slot_id.clone());
        s.epoch = Some(lease.epoch);
        s.last_renewed = Some(lease.last_renewed());
        s.robots = robots;
    }

    fn set_standby(&self) {
        let mut s = self.status.lock().expect("status lock");
        s.role = "standby";
        s.slot_id = None;
        s.epoch = None;
        s.last_renewed = None;
        s.robots = 0;
    }

    fn left_slot(&self) {
        self.metrics.slot_held.set(0);
        self.metrics.epoch.set(0);
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
            .store
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
