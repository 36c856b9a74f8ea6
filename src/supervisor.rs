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
use crate::context::{long_or_zero, ContextError, ContextStore, Loaded, ADOPT_CHUNK, BATCH};
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

/// One robot of the slot as a sync reads it.
struct Listed {
    id: ObjectId,
    name: String,
    /// Its fencing epoch; a missing or odd one counts as 0 (adoptable).
    epoch: i64,
    paused: bool,
    /// Already marked running by this holder.
    marked: bool,
    /// What a first start needs, or None to load it (and report the problem) later.
    loaded: Option<Loaded>,
}

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

    /// Whether a sync at `rev` would read the slot's robots, rather than only tidy up.
    pub fn will_read(&self, rev: i64) -> bool {
        self.synced_rev != Some(rev) || self.last_full.elapsed() >= FULL_RESYNC
    }

    /// Brings the running set in line with the slot's robots when `rev` changed (or a
    /// previous sync is unfinished). Returns how many robots were started.
    ///
    /// One read of the slot's robots serves adoption and start alike: on a server
    /// that answers such a query by scanning the whole collection, every extra read
    /// is a stall that this holder's renewals must wait out.
    pub async fn sync(&mut self, rev: i64) -> Result<usize, mongodb::error::Error> {
        self.reap();
        if !self.will_read(rev) {
            return Ok(0);
        }
        self.last_full = Instant::now();
        let mut robots = self.list().await?;
        self.adopt(&mut robots).await?;
        let mut complete = true;
        let wanted: HashSet<ObjectId> = robots.iter().filter(|r| !r.paused).map(|r| r.id).collect();
        for (id, r) in self.running.iter_mut() {
            if !wanted.contains(id) && !r.stopping {
                tracing::info!(robot = %r.name, slot = %self.ctx.slot_id(), "stopping robot (deleted, moved or paused)");
                r.token.cancel();
                r.stopping = true;
            }
        }
        let mut to_start = Vec::new();
        let mut to_mark = Vec::new();
        for r in robots {
            if r.paused {
                continue;
            }
            match self.running.get(&r.id) {
                Some(running) if running.stopping => complete = false,
                Some(_) => {}
                None => {
                    if !r.marked {
                        to_mark.push(r.id);
                    }
                    to_start.push(r);
                }
            }
        }
        // Status first: a robot that fails at once then overwrites it, not the
        // other way round.
        if !to_mark.is_empty() {
            self.mark_running(&to_mark).await?;
        }
        let started = to_start.len();
        for r in to_start {
            self.start(r.id, r.name, r.loaded);
        }
        self.synced_rev = complete.then_some(rev);
        Ok(started)
    }

    /// Raises the listed robots of an older epoch to ours, in chunks, marking the
    /// unpaused ones running in the same write. Afterwards `robots` holds exactly
    /// the robots at our epoch. A chunk the database refuses (a hand-edited document
    /// failing the validator) is retried one robot at a time, so one broken robot
    /// holds back no other.
    async fn adopt(&mut self, robots: &mut Vec<Listed>) -> Result<(), mongodb::error::Error> {
        let mine = self.ctx.epoch();
        let stale = |paused: bool| -> Vec<ObjectId> {
            robots
                .iter()
                .filter(|r| r.epoch < mine && r.paused == paused)
                .map(|r| r.id)
                .collect()
        };
        let mut adopted: HashSet<ObjectId> = HashSet::new();
        // Unpaused robots are marked running in the same write; paused ones are not.
        for (ids, mark) in [(stale(false), true), (stale(true), false)] {
            for chunk in ids.chunks(ADOPT_CHUNK) {
                match self.ctx.adopt(chunk, mark).await {
                    Ok(ours) => adopted.extend(ours),
                    Err(ContextError::Db(e)) if is_network(&e) => return Err(e),
                    Err(e) => {
                        tracing::warn!(slot = %self.ctx.slot_id(), "adopting {} robot(s) at once failed ({e}); adopting them one by one", chunk.len());
                        self.adopt_one_by_one(chunk, mark, &mut adopted).await?;
                    }
                }
            }
        }
        let raised = adopted.len();
        robots.retain_mut(|r| {
            if r.epoch < mine && adopted.contains(&r.id) {
                r.epoch = mine;
                r.marked = !r.paused;
            }
            r.epoch == mine
        });
        self.record_adoption(format!("{raised} robot(s) raised to this epoch"))
            .await;
        Ok(())
    }

    /// Adoption for a chunk the database refused as a whole: the robots that still
    /// fail are skipped (reported once each), the others adopted.
    async fn adopt_one_by_one(
        &mut self,
        chunk: &[ObjectId],
        mark: bool,
        adopted: &mut HashSet<ObjectId>,
    ) -> Result<(), mongodb::error::Error> {
        for id in chunk {
            match self.ctx.adopt(std::slice::from_ref(id), mark).await {
                Ok(ours) => adopted.extend(ours),
                Err(ContextError::Db(e)) if is_network(&e) => return Err(e),
                Err(e) => {
                    if self.warned.insert(format!("adopt:{id}")) {
                        tracing::error!(robot = %id, slot = %self.ctx.slot_id(), "cannot adopt robot, skipping it: {e}");
                    }
                }
            }
        }
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

    /// Every robot bound to the slot, of any epoch, in one query (batches of
    /// [`BATCH`]).
    async fn list(&mut self) -> Result<Vec<Listed>, mongodb::error::Error> {
        let mut cursor = self
            .store
            .robots()
            .find(doc! {"slot_id": self.ctx.slot_id()})
            .projection(doc! {"history": 0})
            .batch_size(BATCH)
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
            let epoch = long_or_zero(&d, "epoch");
            let marked = epoch == self.ctx.epoch()
                && d.get_str("status") == Ok("running")
                && d.get_str("worker") == Ok(self.ctx.worker());
            out.push(Listed {
                id,
                paused: matches!(d.get("paused"), Some(Bson::Boolean(true))),
                epoch,
                marked,
                loaded: preload(&d, &name),
                name,
            });
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
        seq: long_or_zero(d, "seq"),
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
                Err(RobotError::Fenced(why)) if !self.ctx.lease_open() => {
                    // The whole holder stopped writing (its lease lapsed): the worker
                    // reports that once, not once per robot.
                    tracing::debug!(robot = %self.name, "{why}");
                    break;
                }
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
