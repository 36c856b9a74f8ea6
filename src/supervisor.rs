//! The robots of the held slot: adopt, start, restart with backoff, stop, fence.
//!
//! One `Supervisor` lives exactly as long as one lease (slot + epoch). The worker calls
//! [`Supervisor::sync`] after every renewal with the slot's `rev`; only when `rev`
//! moved (a robot was created, deleted, moved, paused or resumed) does it read the
//! slot's robots again, so a quiet slot costs no robot queries per tick.
//!
//! Each robot runs in its own task under a child [`CancellationToken`]. A crash or
//! exit restarts it with exponential backoff (recorded in its `status`); a fenced
//! checkpoint ends it for good on this holder.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use futures::TryStreamExt;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::LeaseTiming;
use crate::context::{ContextStore, Loaded};
use crate::metrics::Metrics;
use crate::robot::{history_len, Registry, RobotError, RobotRun};
use crate::store::Store;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const INVALID_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run this long resets the backoff: it was healthy, the next crash is news.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// Even without a `rev` change, re-read the slot's robots this often: a safety net
/// for documents edited by hand without bumping `rev`.
const FULL_RESYNC: Duration = Duration::from_secs(60);

type Listed = (ObjectId, String, bool, bool, Option<Loaded>);

struct Running {
    name: String,
    token: CancellationToken,
    stopping: bool,
}

pub struct Supervisor {
    store: Store,
    ctx: ContextStore,
    registry: Registry,
    timing: LeaseTiming,
    metrics: Arc<Metrics>,
    root: CancellationToken,
    running: HashMap<ObjectId, Running>,
    tasks: JoinSet<ObjectId>,
    synced_rev: Option<i64>,
    warned: HashSet<String>,
    adopted: bool,
    last_full: Instant,
}

impl Supervisor {
    pub fn new(
        store: Store,
        ctx: ContextStore,
        registry: Registry,
        timing: LeaseTiming,
        metrics: Arc<Metrics>,
    ) -> Self {
        Supervisor {
            store,
            ctx,
            registry,
            timing,
            metrics,
            root: CancellationToken::new(),
            running: HashMap::new(),
            tasks: JoinSet::new(),
            synced_rev: None,
            warned: Default::default(),
            adopted: false,
            last_full: Instant::now(),
        }
    }

    /// How many robots have a live task (including those stopping).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Brings the running set in line with the slot's robots when `rev` changed (or a
    /// previous sync is unfinished). Returns how many robots were started.
    pub async fn sync(&mut self, rev: i64) -> Result<usize, mongodb::error::Error> {
        self.reap();
        if self.synced_rev == Some(rev) && self.last_full.elapsed() < FULL_RESYNC {
            return Ok(0);
        }
        self.last_full = Instant::now();
        self.adopt().await?;
        let robots = self.list().await?;
        let mut complete = true;
        let mut wanted: HashSet<ObjectId> = HashSet::new();
        for (id, _, paused, _, _) in &robots {
            if !paused {
                wanted.insert(*id);
            }
        }
        for (id, r) in self.running.iter_mut() {
            if !wanted.contains(id) && !r.stopping {
                tracing::info!(robot = %r.name, slot = %self.ctx.slot_id(), "stopping robot (deleted, moved or paused)");
                r.token.cancel();
                r.stopping = true;
            }
        }
        let mut to_start = Vec::new();
        let mut to_mark = Vec::new();
        for (id, name, paused, marked, loaded) in robots {
            if paused {
                continue;
            }
            match self.running.get(&id) {
                Some(r) if r.stopping => complete = false,
                Some(_) => {}
                None => {
                    if !marked {
                        to_mark.push(id);
                    }
                    to_start.push((id, name, loaded));
                }
            }
        }
        // Status first: a robot that fails at once then overwrites it, not the
        // other way round.
        if !to_mark.is_empty() {
            self.mark_running(&to_mark).await?;
        }
        let started = to_start.len();
        for (id, name, loaded) in to_start {
            self.start(id, name, loaded);
        }
        self.synced_rev = complete.then_some(rev);
        Ok(started)
    }

    /// Raises every robot of the slot to our epoch: one update for all, or, when a
    /// document refuses the update, one by one so the others are not held back.
    async fn adopt(&mut self) -> Result<(), mongodb::error::Error> {
        match self.ctx.adopt_all().await {
            Ok(n) => {
                self.record_adoption(format!("{n} robot(s) raised to this epoch"))
                    .await;
                return Ok(());
            }
            Err(crate::context::ContextError::Db(e)) if is_network(&e) => return Err(e),
            Err(e) => {
                tracing::warn!(slot = %self.ctx.slot_id(), "adopting robots at once failed ({e}); adopting one by one")
            }
        }
        let mut cursor = self
            .store
            .robots()
            .find(doc! {"slot_id": self.ctx.slot_id(), "epoch": {"$lt": self.ctx.epoch()}})
            .projection(doc! {"_id": 1, "name": 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            let r = self
                .store
                .robots()
                .update_one(
                    doc! {"_id": d.get("_id"), "slot_id": self.ctx.slot_id(), "epoch": {"$lt": self.ctx.epoch()}},
                    doc! {"$set": {"epoch": self.ctx.epoch()}},
                )
                .await;
            if let Err(e) = r {
                let key = format!("adopt:{:?}", d.get("_id"));
                if self.warned.insert(key) {
                    tracing::error!(robot = ?d.get("name"), "cannot adopt robot, skipping it: {}", crate::store::brief(&e));
                }
            }
        }
        self.record_adoption("adopted one by one".into()).await;
        Ok(())
    }

    /// The first adoption under this epoch goes into `events`: from then on no
    /// checkpoint of an older epoch can land on this slot's robots.
    async fn record_adoption(&mut self, detail: String) {
        if self.adopted {
            return;
        }
        self.adopted = true;
        self.store
            .record_event(
                "adopt",
                doc! {
                    "worker": self.ctx.worker(), "slot_id": self.ctx.slot_id(),
                    "epoch": self.ctx.epoch(), "detail": detail,
                },
            )
            .await;
    }

    /// The slot's robots: (id, name, paused, already marked running here,
    /// loaded-or-None when the doc is broken).
    async fn list(&mut self) -> Result<Vec<Listed>, mongodb::error::Error> {
        let mut cursor = self
            .store
            .robots()
            .find(doc! {"slot_id": self.ctx.slot_id(), "epoch": self.ctx.epoch()})
            .projection(doc! {"history": 0})
            .batch_size(crate::context::BATCH)
            .await?;
        let mut out = Vec::new();
        while let Some(d) = cursor.try_next().await? {
            let Some(Bson::ObjectId(id)) = d.get("_id").cloned() else {
                let key = format!("{:?}", d.get("_id"));
                if self.warned.insert(key.clone()) {
                    tracing::warn!(id = %key, "skipping robot document whose _id is not an ObjectId");
                }
                continue;
            };
            let name = d
                .get_str("name")
                .map(str::to_string)
                .unwrap_or_else(|_| id.to_hex());
            let paused = matches!(d.get("paused"), Some(Bson::Boolean(true)));
            let marked = d.get_str("status") == Ok("running")
                && d.get_str("worker") == Ok(self.ctx.worker());
            out.push((id, name.clone(), paused, marked, preload(&d, &name)));
        }
        Ok(out)
    }

    async fn mark_running(&self, ids: &[ObjectId]) -> Result<(), mongodb::error::Error> {
        for chunk in ids.chunks(500) {
            self.mark_chunk(chunk).await?;
        }
        Ok(())
    }

    async fn mark_chunk(&self, ids: &[ObjectId]) -> Result<(), mongodb::error::Error> {
        self.store
            .robots()
            .update_many(
                doc! {"_id": {"$in": ids}, "slot_id": self.ctx.slot_id(), "epoch": self.ctx.epoch()},
                vec![doc! {"$set": {
                    "status": "running", "error": Bson::Null,
                    "worker": self.ctx.worker(), "status_at": "$$NOW",
                }}],
            )
            .await?;
        Ok(())
    }

    fn start(&mut self, id: ObjectId, name: String, loaded: Option<Loaded>) {
        let token = self.root.child_token();
        let runner = Runner {
            id,
            name: name.clone(),
            ctx: self.ctx.clone(),
            registry: self.registry.clone(),
            token: token.clone(),
            grace: self.timing.stop_grace,
            metrics: self.metrics.clone(),
            store: self.store.clone(),
        };
        self.tasks.spawn(runner.run(loaded));
        self.running.insert(
            id,
            Running {
                name,
                token,
                stopping: false,
            },
        );
    }

    /// Forgets robots whose task ended (stopped or fenced).
    fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Ok(id) = done {
                if let Some(r) = self.running.remove(&id) {
                    if !r.stopping {
                        // Ended by itself (fenced): look at the slot again next sync.
                        self.synced_rev = None;
                    }
                }
            }
        }
    }

    /// Stops every robot: cancel, wait up to the stop grace (plus a little for the
    /// tasks to return), then abort whatever is left.
    pub async fn stop_all(mut self) {
        self.root.cancel();
        let limit = Instant::now() + self.timing.stop_grace + self.timing.abort_slack();
        while !self.tasks.is_empty() {
            match tokio::time::timeout_at(limit, self.tasks.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        left = self.tasks.len(),
                        "robots still running after the stop grace; aborting them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                }
            }
        }
        self.running.clear();
    }
}

fn is_network(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    ) || e.contains_label("RetryableWriteError")
}

/// Turns a listed document into what a first start needs, or None to load it fresh
/// (and report the problem) in the runner.
fn preload(d: &Document, name: &str) -> Option<Loaded> {
    let context = match d.get("context") {
        Some(Bson::Document(c)) => c.clone(),
        Some(Bson::Null) | None => Document::new(),
        Some(_) => return None,
    };
    Some(Loaded {
        name: name.to_string(),
        kind: d.get_str("kind").ok()?.to_string(),
        spec: d.get_document("spec").ok()?.clone(),
        context,
        seq: d.get_i64("seq").unwrap_or(0),
    })
}

/// One robot's life on this holder: start, watch, restart with backoff.
struct Runner {
    id: ObjectId,
    name: String,
    ctx: ContextStore,
    registry: Registry,
    token: CancellationToken,
    grace: Duration,
    metrics: Arc<Metrics>,
    store: Store,
}

impl Runner {
    async fn run(self, mut first: Option<Loaded>) -> ObjectId {
        let mut restarts: i64 = 0;
        let mut backoff = FIRST_BACKOFF;
        while !self.token.is_cancelled() {
            let began = Instant::now();
            let outcome = self.run_once(first.take(), restarts > 0).await;
            let error = match outcome {
                Ok(()) if self.token.is_cancelled() => break,
                Ok(()) => RobotError::Crashed("returned without being asked to stop".into()),
                Err(RobotError::Fenced(why)) => {
                    tracing::warn!(robot = %self.name, "{why}; stopped on this worker");
                    self.store
                        .record_event(
                            "fenced_write",
                            doc! {
                                "worker": self.ctx.worker(), "slot_id": self.ctx.slot_id(),
                                "epoch": self.ctx.epoch(), "robot": &self.name, "detail": why,
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
            if began.elapsed() >= HEALTHY_RUN {
                backoff = FIRST_BACKOFF;
            }
            let (status, floor) = match error {
                RobotError::Invalid(_) => ("failed", INVALID_BACKOFF),
                _ => ("restarting", FIRST_BACKOFF),
            };
            backoff = backoff.max(floor);
            restarts += 1;
            self.metrics.robot_restarts.inc();
            tracing::warn!(robot = %self.name, restarts, backoff_ms = backoff.as_millis() as u64, "robot {status}: {error}");
            let recorded = self
                .ctx
                .set_status(&self.id, status, Some(&error.to_string()), Some(restarts))
                .await;
            if let Ok(false) = recorded {
                break; // fenced: no longer ours
            }
            self.metrics.robots_restarting.add(1);
            tokio::select! {
                _ = self.token.cancelled() => {}
                _ = tokio::time::sleep(backoff) => {}
            }
            self.metrics.robots_restarting.add(-1);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        self.id
    }

    async fn run_once(&self, first: Option<Loaded>, restarted: bool) -> Result<(), RobotError> {
        let loaded = match first {
            Some(l) => l,
            None => self.ctx.load(&self.id, &self.name).await?,
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
        if restarted
            && !self
                .ctx
                .set_status(&self.id, "running", None, None)
                .await
                .map_err(RobotError::from)?
        {
            return Err(RobotError::Fenced(format!(
                "robot {} is no longer bound to this holder",
                self.name
            )));
        }
        let run = RobotRun {
            id: self.id,
            name: loaded.name.clone(),
            history: history_len(&loaded.spec),
            spec: loaded.spec,
            context: loaded.context,
            store: self.ctx.clone(),
            stop: self.token.clone(),
            grace: self.grace,
        };
        self.metrics.robots_running.add(1);
        let result = kind.run(run).await;
        self.metrics.robots_running.add(-1);
        result
    }
}
