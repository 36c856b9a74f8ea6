//! Robot kinds: the [`RobotKind`] trait, the [`Registry`] of kinds a worker can run,
//! and the built-in kinds `counter` and `exec`.
//!
//! A kind turns a robot's `spec` and persisted `context` into running work. It writes
//! new context only through [`RobotRun::checkpoint`], which is fenced: once it returns
//! [`RobotError::Fenced`] the robot must return at once.
//!
//! Registering a kind of your own, from another crate:
//!
//! ```no_run
//! use async_trait::async_trait;
//! use slotpool::{Registry, RobotError, RobotKind, RobotRun};
//!
//! struct Greeter;
//!
//! #[async_trait]
//! impl RobotKind for Greeter {
//!     fn name(&self) -> &str { "greeter" }
//!
//!     fn check_spec(&self, spec: &bson::Document) -> Result<(), String> {
//!         spec.get_str("greeting").map(|_| ()).map_err(|_| "spec.greeting must be a string".into())
//!     }
//!
//!     async fn run(&self, run: RobotRun) -> Result<(), RobotError> {
//!         let mut n = run.context().get_i64("greeted").unwrap_or(0);
//!         while !run.stop().is_cancelled() {
//!             n += 1;
//!             run.checkpoint(bson::doc! {"greeted": n}).await?;
//!             tokio::select! {
//!                 _ = run.stop().cancelled() => break,
//!                 _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//!
//! // First thing in main: this binary also serves as the shim of `exec` robots.
//! slotpool::run_if_requested();
//! let mut registry = Registry::builtin();
//! registry.register(Greeter);
//! // then: slotpool::Worker::new(settings, store.clone(), registry).run().await,
//! // and store.close().await last: the worker closes only the clients it made.
//! ```

pub(crate) mod cgroup;
pub(crate) mod counter;
pub(crate) mod exec;
pub(crate) mod limits;
pub(crate) mod line;
pub(crate) mod meter;
pub(crate) mod output;
pub(crate) mod policy;
pub(crate) mod restart;
pub(crate) mod run_as;
pub mod schedule;
pub mod shim;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::{oid::ObjectId, Bson, Document};
use tokio_util::sync::CancellationToken;

use crate::db::context::{ContextError, ContextStore};

/// Why a robot run ended other than by being asked to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RobotError {
    /// A checkpoint was refused by the epoch fence: stop, never write again.
    #[error("{0}")]
    Fenced(String),
    /// The robot's spec or context cannot work; retried slowly in case it is fixed.
    #[error("{0}")]
    Invalid(String),
    /// It crashed or exited; restarted with backoff.
    #[error("{0}")]
    Crashed(String),
    /// Its command exited with status 0, or a run says it did its work to the end:
    /// a run to completion ended well (a daemon is restarted as after any other
    /// end). A scheduled run that returns it succeeded even when a stop came first;
    /// one that returns `Ok` after a stop may have been cut short.
    #[error("command exited: exit status: 0")]
    Finished,
    #[error("database error: {0}")]
    Db(String),
    /// Nothing of the run started: the lease ended before its process could start
    /// (the shim is given a live deadline first, and waits for one). Not a run
    /// that failed: a scheduled firing stays claimed, to start again. A kind of
    /// your own returns it only when nothing of its run happened.
    #[error("not started: {0}")]
    NotStarted(String),
}

impl From<ContextError> for RobotError {
    fn from(e: ContextError) -> Self {
        match e {
            ContextError::Fenced { .. } | ContextError::Lapsed { .. } => {
                RobotError::Fenced(e.to_string())
            }
            // A refused write is this robot's own document (a hand edit the
            // validator let through): it fails alone, with the reason as its status.
            ContextError::NotADocument { .. }
            | ContextError::TooLarge { .. }
            | ContextError::Refused { .. } => RobotError::Invalid(e.to_string()),
            ContextError::Db(_) => RobotError::Db(e.to_string()),
        }
    }
}

/// A kind of robot a worker knows how to run.
#[async_trait]
pub trait RobotKind: Send + Sync + 'static {
    /// The `kind` string stored in robot documents.
    fn name(&self) -> &str;

    /// Checks a spec when a robot is created, and again before each start.
    fn check_spec(&self, spec: &Document) -> Result<(), String>;

    /// Whether this worker would run `spec`: [`RobotKind::check_spec`] and whatever
    /// this worker's own configuration adds (the exec allow-lists). An update is
    /// applied only when the holder admits it, so one it would refuse changes nothing.
    fn admits(&self, spec: &Document) -> Result<(), String> {
        self.check_spec(spec)
    }

    /// Whether a robot of this kind and `spec` can start from `context`, a context
    /// another kind (or another spec) wrote: an update that changes the kind is
    /// refused unless the context carries over.
    fn check_context(&self, _spec: &Document, _context: &Document) -> Result<(), String> {
        Ok(())
    }

    /// Runs the robot until `run.stop()` is cancelled (return `Ok`), or fails. Must
    /// return within the stop grace after cancellation.
    async fn run(&self, run: RobotRun) -> Result<(), RobotError>;

    /// Whether the kind freezes its own work while its holder's lease is suspended
    /// (exec: the shim freezes the robot's tree at the deadline, and thaws it when a
    /// late renewal moves the deadline on). A kind that does not is simply not
    /// polled while suspended, and dropped unpolled if the lease is given up.
    fn suspends_itself(&self) -> bool {
        false
    }
}

/// What a running robot gets: who it is, its spec, its restored context, a fenced
/// checkpoint, and its stop signal.
#[derive(Debug, Clone)]
pub struct RobotRun {
    pub id: ObjectId,
    /// The generation this instance was adopted under: its writes require it.
    pub gen: i64,
    pub name: String,
    pub spec: Document,
    pub context: Document,
    pub history: i64,
    /// The `seq` of the checkpoint this instance's next one follows (shared by the
    /// clones a kind makes of its run).
    pub seq: Arc<std::sync::atomic::AtomicI64>,
    pub store: ContextStore,
    pub stop: CancellationToken,
    pub grace: Duration,
    /// When something outside the worker must kill the robot after a stop request,
    /// if the worker itself has not: the grace plus half the room left before the
    /// fence margin (see [`shim`]).
    pub backstop: Duration,
    /// How long past the lease deadline the robot stays frozen, waiting for a late
    /// renewal to thaw it, before it is killed (exec robots: the shim's
    /// suspension); zero: stopped at the deadline.
    pub suspend_for: Duration,
    /// For a scheduled robot, the firing this run answers (server milliseconds).
    pub firing: Option<i64>,
    /// For a scheduled robot, this run's attempt at its firing (1, then 2, … for a
    /// retry).
    pub attempt: Option<i64>,
    /// For a scheduled robot, what this run's checkpoints leave for the next run.
    pub(crate) left: Option<Arc<std::sync::Mutex<Left>>>,
    /// Where the run's cost is measured (see [`meter`]): an exec run names its shim.
    pub(crate) meter: Option<Arc<meter::RobotMeter>>,
}

/// What a scheduled run's checkpoints left behind, as its instance sees it. Only a
/// robot's own runs write its context, so the instance's next run starts from this
/// without reading the robot again.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Left {
    /// No checkpoint: the context the run started from.
    #[default]
    Unchanged,
    /// The context of the run's last checkpoint, and the `seq` it was written at.
    Context(Document, i64),
    /// A checkpoint failed, and may or may not have landed: the instance reads the
    /// robot before its next run.
    Unknown,
    /// The run's last context ([`RobotRun::end_with`]), not written yet: it goes in
    /// the write of the run's end, over checkpoint `seq`, with a history record
    /// when the robot keeps `history` (the third). If that write does not land, the
    /// run did not do its work: its end is recorded as cut off.
    Final(Document, i64, i64),
}

impl RobotRun {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn id(&self) -> ObjectId {
        self.id
    }
    pub fn spec(&self) -> &Document {
        &self.spec
    }
    /// The context as last checkpointed (empty for a new robot).
    pub fn context(&self) -> &Document {
        &self.context
    }
    /// The fencing epoch this run writes under.
    pub fn epoch(&self) -> i64 {
        self.store.epoch()
    }
    /// This instance's generation: raised on every adoption, so a stale instance
    /// (after a move or a takeover) can never write.
    pub fn generation(&self) -> i64 {
        self.gen
    }
    /// Cancelled when the robot must stop (lease lost, release, pause, move, delete).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }
    /// How long the robot has after `stop` is cancelled before it is abandoned.
    pub fn grace(&self) -> Duration {
        self.grace
    }
    /// The holder's lease deadline (a monotonic instant) and its every change: past
    /// it the robot must not run. See [`shim`].
    pub fn lease_deadline(&self) -> tokio::sync::watch::Receiver<tokio::time::Instant> {
        self.store.lease_deadline()
    }
    /// For a robot on a schedule (`spec.schedule`), the firing this run answers, in
    /// milliseconds since the epoch on the server's clock: the run does its work for
    /// that firing and returns. None for a daemon.
    pub fn firing(&self) -> Option<i64> {
        self.firing
    }
    /// For a robot on a schedule, which attempt at its firing this run is: 1, then
    /// 2, 3, … when a run cut off by its holder's loss or a stop is retried, or a
    /// failed one restarted. A run that may repeat work an earlier attempt already
    /// did uses it (with the firing) to do that work effectively once. None for a
    /// daemon.
    pub fn attempt(&self) -> Option<i64> {
        self.attempt
    }

    /// The worker (`ip:port`) running this robot.
    pub fn worker(&self) -> &str {
        self.store.worker()
    }

    /// Keeps one output line with the robot's last lines (`robot logs`); never waits.
    pub fn keep_output(&self, stream: crate::db::output_log::Stream, text: &str) {
        self.store.output().keep(self.id, self.gen, stream, text);
    }

    /// The worker's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        self.store.metrics()
    }

    /// Persists a new context, proving slot, epoch, generation and the checkpoint it
    /// follows. `Err(Fenced)` means: return now. Checkpoints of one run go one after
    /// another (each waits for its answer), as every built-in kind does.
    pub async fn checkpoint(&self, context: Document) -> Result<(), RobotError> {
        use std::sync::atomic::Ordering;
        let after = self.seq.load(Ordering::Acquire);
        let kept = self.left.as_ref().map(|_| context.clone());
        let written = self
            .store
            .checkpoint(&self.id, self.gen, &self.name, context, self.history, after)
            .await;
        if let Some(left) = &self.left {
            let mut left = left
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *left = match (&written, kept) {
                (Ok(()), Some(c)) => Left::Context(c, after + 1),
                _ => Left::Unknown,
            };
        }
        written.map_err(RobotError::from)?;
        self.seq.store(after + 1, Ordering::Release);
        Ok(())
    }
}

impl RobotRun {
    /// Ends a scheduled run that did its work: `context` is its last checkpoint,
    /// written in the same statement as the run's end, so a firing costs one write.
    /// Return what this gives (`Finished` when all is well).
    ///
    /// The write is fenced like [`RobotRun::checkpoint`]. An end that does not land
    /// is a run cut off, handled as `on_lost` says, so a step and its run's end land
    /// together or not at all. A daemon's run, or a context too large to store, gets
    /// an ordinary checkpoint instead.
    pub async fn end_with(&self, context: Document) -> RobotError {
        use std::sync::atomic::Ordering;
        let bytes = bson::to_vec(&context).map_or(usize::MAX, |v| v.len());
        let merged = self.firing.is_some() && bytes <= crate::db::context::MAX_CONTEXT_BYTES;
        match &self.left {
            Some(left) if merged => {
                let after = self.seq.load(Ordering::Acquire);
                *left
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Left::Final(context, after, self.history);
                RobotError::Finished
            }
            _ => match self.checkpoint(context).await {
                Ok(()) => RobotError::Finished,
                Err(e) => e,
            },
        }
    }
}

/// The kinds a worker can run, by name.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<String, Arc<dyn RobotKind>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// `counter` and `exec`, with `exec` disabled until given a policy (see
    /// [`Registry::builtin_with`]).
    pub fn builtin() -> Self {
        Self::builtin_with(exec::ExecPolicy::disabled())
    }

    /// `counter` and `exec`, with `exec` restricted by `policy`.
    pub fn builtin_with(policy: exec::ExecPolicy) -> Self {
        let mut r = Self::new();
        r.register(counter::Counter);
        r.register(exec::Exec::new(policy));
        r
    }

    /// Adds a kind, replacing any kind of the same name.
    pub fn register(&mut self, kind: impl RobotKind) {
        self.kinds.insert(kind.name().to_string(), Arc::new(kind));
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn RobotKind>> {
        self.kinds.get(name).cloned()
    }

    pub fn names(&self) -> Vec<&str> {
        self.kinds.keys().map(String::as_str).collect()
    }

    /// Checks `kind` and `spec` as `robot create` does.
    pub fn check(&self, kind: &str, spec: &Document) -> Result<(), String> {
        let k = self.get(kind).ok_or_else(|| {
            format!(
                "unknown robot kind {kind:?}; known kinds: {}",
                self.names().join(", ")
            )
        })?;
        k.check_spec(spec)?;
        restart::RestartPolicy::from_spec(spec)?;
        check_schedule(spec)
    }

    /// Whether this worker would run a robot changed to `kind` and `spec`, starting
    /// from the `context` it has: the checks of [`Registry::check`], the worker's own
    /// rules ([`RobotKind::admits`]) and whether the context carries over.
    pub fn admits(&self, kind: &str, spec: &Document, context: &Document) -> Result<(), String> {
        self.check(kind, spec)?;
        let k = self.get(kind).expect("checked above");
        k.admits(spec)?;
        k.check_context(spec, context)
    }
}

/// Checks `spec.schedule` (with this machine's clock, only to see that a cron
/// pattern fires at all).
pub(crate) fn check_schedule(spec: &Document) -> Result<(), String> {
    schedule::Schedule::from_spec(spec, chrono::Utc::now().timestamp_millis()).map(|_| ())
}

/// A duration in a spec, `spec.FIELD`: text such as `"90s"` or `"10m"`, within
/// `min..=max`. Specs are written by whoever may write robot documents, so the
/// errors say what was found and what is wanted.
pub(crate) fn spec_duration(
    field: &str,
    v: &Bson,
    min: Duration,
    max: Duration,
) -> Result<Duration, String> {
    let Bson::String(text) = v else {
        return Err(format!(
            "spec.{field} must be a duration such as \"30s\" or \"10m\", found {v}"
        ));
    };
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "spec.{field}: {e} in {:?} (write e.g. \"30s\" or \"10m\")",
            crate::printable::escape(text)
        )
    })?;
    if d < min || d > max {
        return Err(format!(
            "spec.{field} must be between {} and {}, got {}",
            humantime::format_duration(min),
            humantime::format_duration(max),
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

/// The spec fields every kind honours: `history` (checkpoint records kept, see
/// [`history_len`]) and `restart` (the restart policy, see [`restart`]).
pub(crate) const COMMON_SPEC_FIELDS: &[&str] =
    &["history", restart::SPEC_FIELD, schedule::SPEC_FIELD];

/// Reads the optional `"history": N` spec field every kind honours.
pub(crate) fn history_len(spec: &Document) -> i64 {
    crate::db::store::int(spec, "history").unwrap_or(0).max(0)
}
