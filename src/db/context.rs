//! Fenced context reads and checkpoints.
//!
//! Every write is filtered on the robot's slot, the holder's epoch and the instance's
//! generation (raised by every adoption, since epochs of different slots are not
//! comparable), so only the newest instance can write. Zero matched means *fenced*:
//! the caller must stop that instance and never write again. An instance started
//! before its adoption lands ([`ContextStore::start_early`]) opens no gap, because
//! every checkpoint is also a compare-and-set on `seq`. See docs/internals.md,
//! "Fencing: epoch and generation".

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::db::field::{
    APPLIED_LIMITS, AT, CHECKPOINTED_AT, CONTAINMENT, CONTEXT, CREATED_AT, EPOCH, ERROR, GEN,
    HISTORY, KIND, NAME, PAUSED, RECENT_ENDS, RESTARTS, SEQ, SLOT, SLOT_ID, SPEC, START_REV,
    STATUS, STATUS_AT, UPDATE, UPDATE_RESULT, WORKER,
};
use crate::db::group_commit::{
    while_open, Answer, GroupCommit, Statement, Update, Written, IN_DOUBT_AFTER,
};
use crate::db::guard::WriteGuard;
use crate::db::output_log::OutputLog;
use crate::db::pacing::WritePacer;
use crate::db::robot_doc::{RobotDoc, RobotStatus};
use crate::db::store::Store;
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// How many checkpoint records a robot keeps in its `history` array when its spec
/// asks for one (`"history": N`).
pub(crate) const MAX_HISTORY: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("fenced: robot {robot} is no longer bound to {slot} at epoch {epoch} (adopted by a newer holder, moved or deleted)")]
    Fenced {
        robot: String,
        slot: String,
        epoch: i64,
    },
    #[error("robot {robot}: write refused: this worker's lease on {slot} (epoch {epoch}) lapsed before it could be renewed")]
    Lapsed {
        robot: String,
        slot: String,
        epoch: i64,
    },
    #[error("robot {robot}: its context is not a document (found {found}); fix it by hand, e.g. db.robots.updateOne({{name: \"{robot}\"}}, {{$set: {{context: {{}}}}}})")]
    NotADocument { robot: String, found: String },
    #[error("robot {robot}: checkpoint refused: its context is {bytes} bytes as BSON, more than the {MAX_CONTEXT_BYTES} a context may have; keep bulk data elsewhere and its key in the context")]
    TooLarge { robot: String, bytes: usize },
    #[error("robot {robot}: the database refused the write: {}", crate::secrets::scrub(.why))]
    Refused { robot: String, why: String },
    #[error("database error: {}", crate::db::store::brief(.0))]
    Db(#[from] mongodb::error::Error),
}

/// The largest context a checkpoint may store, as BSON: 1 MiB. A context is a
/// robot's state, restored at every start and shipped on every checkpoint; bulk data
/// belongs elsewhere, with its key in the context. (MongoDB's own limit is 16 MiB
/// for the whole robot document.)
pub(crate) const MAX_CONTEXT_BYTES: usize = 1024 * 1024;

/// Documents per cursor batch when reading a slot's robots: a server building one
/// batch of thousands of documents can stall this holder's renewals meanwhile.
pub(crate) const BATCH: u32 = 500;

/// Where one holder (slot + epoch) reads and writes its robots' contexts.
#[derive(Debug, Clone)]
pub struct ContextStore {
    /// The robots' client: each command takes the collection from it, so that a
    /// client replaced after an outage (see [`Store::reopen_after`]) serves the next.
    pub(super) store: Store,
    pub(super) slot_id: String,
    pub(super) epoch: i64,
    pub(super) worker: String,
    metrics: Arc<Metrics>,
    pub(super) guard: WriteGuard,
    /// Paces robot writes by the lease's renewal latency (see [`crate::db::pacing`]).
    pacer: Arc<WritePacer>,
    /// Checkpoints go out in group commits (see [`crate::db::group_commit`]).
    commit: GroupCommit,
    /// The robots' output lines, kept per robot (see [`crate::db::output_log`]).
    output: OutputLog,
    /// Robots started before their adoption write landed, with the `(gen, epoch)`
    /// they were listed with (see [`ContextStore::start_early`]).
    early: Arc<Mutex<HashMap<ObjectId, ListedState>>>,
}

/// A robot's `(gen, epoch)` as listed, for an instance started before its adoption
/// (`gen` None when never written).
type ListedState = (Option<i64>, i64);

/// A robot as its holder loads it to start.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) spec: Document,
    pub(crate) context: Document,
    pub(crate) seq: i64,
    /// When its recent runs ended by themselves, in server milliseconds (see
    /// [`RECENT_ENDS`]); hand-broken entries left out.
    pub(crate) ends: Vec<i64>,
    /// A scheduled robot's firing state.
    pub(crate) firings: crate::db::firing::FiringState,
    /// When it was created, in server milliseconds.
    pub(crate) created_ms: Option<i64>,
    /// Held (`paused: true`): its holder is about to stop it.
    pub(crate) paused: bool,
    /// When an update was last applied to it (server milliseconds).
    pub(crate) updated_ms: Option<i64>,
}

impl Loaded {
    /// What a start needs of `robot` (`name` when it has none), taken from it
    /// without a copy; the type of what stands for its context when that is not a
    /// document.
    pub(crate) fn from_robot(robot: RobotDoc, name: &str) -> Result<Loaded, &'static str> {
        Ok(Loaded {
            context: robot.context?,
            name: robot.name.unwrap_or_else(|| name.to_string()),
            kind: robot.kind.unwrap_or_default(),
            spec: robot.spec.unwrap_or_default(),
            seq: robot.seq.unwrap_or(0),
            ends: robot.recent_ends,
            firings: robot.firings,
            created_ms: robot.created_ms,
            paused: robot.paused,
            updated_ms: robot.updated_ms,
        })
    }
}

impl ContextStore {
    pub fn new(
        store: &Store,
        slot_id: &str,
        epoch: i64,
        worker: &str,
        metrics: Arc<Metrics>,
        guard: WriteGuard,
        pacer: Arc<WritePacer>,
    ) -> Self {
        let commit =
            GroupCommit::spawn(store.clone(), pacer.clone(), guard.clone(), metrics.clone());
        let output = OutputLog::spawn(store.clone(), pacer.clone(), guard.clone());
        ContextStore {
            store: store.clone(),
            output,
            slot_id: slot_id.to_string(),
            epoch,
            worker: worker.to_string(),
            metrics,
            guard,
            pacer,
            commit,
            early: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Lets the instance about to start under generation `gen` write before its
    /// adoption write lands: its writes also match the robot as it was listed,
    /// `(listed_gen, listed_epoch)`. Only on the first sync after a claim, for robots
    /// the slot's earlier holders adopted: their instances stopped before the claim,
    /// and the module's notes say why a write of theirs still in flight is no more
    /// harm than it is to an instance started after its adoption. Once the adoption
    /// lands ([`ContextStore::adopted`]) only `gen` matches.
    pub fn start_early(&self, id: ObjectId, listed_gen: Option<i64>, listed_epoch: i64) {
        self.early
            .lock()
            .expect("early lock")
            .insert(id, (listed_gen, listed_epoch));
    }

    /// The robot's adoption landed, or its early start was undone: its writes
    /// match its adopted state alone.
    pub fn adopted(&self, id: &ObjectId) {
        self.early.lock().expect("early lock").remove(id);
    }

    pub(crate) fn slot_id(&self) -> &str {
        &self.slot_id
    }

    /// Where robots' output lines are kept.
    pub(crate) fn output(&self) -> &OutputLog {
        &self.output
    }

    pub(crate) fn epoch(&self) -> i64 {
        self.epoch
    }

    pub(crate) fn worker(&self) -> &str {
        &self.worker
    }

    /// False once this holder's lease lapsed locally (self-fence, loss, release):
    /// every write is refused from then on.
    pub(crate) fn lease_open(&self) -> bool {
        self.guard.is_open()
    }

    /// True once the holder gave the lease up (lost, expired, released): unlike a
    /// suspended lease, it never opens again.
    pub(crate) fn lease_given_up(&self) -> bool {
        self.guard.is_revoked()
    }

    /// Waits while the lease is suspended: true once it is open again, false once
    /// it was given up.
    pub(crate) async fn lease_resumed(&self) -> bool {
        self.guard.admit().await
    }

    /// The lease deadline and its every change, for robots that must be stopped by
    /// something outside this process when the deadline passes.
    pub(crate) fn lease_deadline(&self) -> watch::Receiver<Instant> {
        self.guard.watch()
    }

    /// Awaits one command of an adoption (or a read of the slot's robots) while the
    /// lease holds, for at most [`IN_DOUBT_AFTER`]; the command's own result inside.
    /// Without a bound, an unanswered adoption would hold the slot's sync (and every
    /// move, pause and delete of its robots) for good. Given up on, the adoption is cut
    /// off part-way: the robots it missed start at the next sync, and a late write only
    /// raised a generation that the next adoption raises again.
    pub(crate) async fn answered<T>(
        &self,
        what: &str,
        command: impl std::future::Future<Output = Result<T, mongodb::error::Error>>,
    ) -> Result<Result<T, mongodb::error::Error>, ContextError> {
        match while_open(&self.guard, IN_DOUBT_AFTER, command).await {
            Answer::Sent(r) => Ok(r),
            Answer::Lapsed => Err(self.lapsed(&format!("({what})"))),
            Answer::InDoubt => Err(ContextError::Db(mongodb::error::Error::custom(format!(
                "no answer to {what} within {} s; it may or may not have landed",
                IN_DOUBT_AFTER.as_secs()
            )))),
        }
    }

    /// What the robot's document must still say for instance `gen` to own it.
    fn fence_match(&self, id: &ObjectId, gen: i64) -> Document {
        let listed = self.early.lock().expect("early lock").get(id).copied();
        match listed {
            None => doc! {"_id": id, SLOT_ID: &self.slot_id, EPOCH: self.epoch, GEN: gen},
            // Two `$in`s rather than an `$or` of the two states: the dev server reads
            // the whole collection for an `$or` (10 ms a write at 1,000 robots, against
            // 1 ms). The two cross states they also admit are no one's: this holder
            // alone writes `epoch` = its own, and a `(gen, epoch)` of `(g0 + 1, e0)`
            // needs the last holder to adopt the robot again after the claim, with its
            // lease over. The `seq` condition orders any writes that do match.
            Some((listed_gen, listed_epoch)) => doc! {
                "_id": id, SLOT_ID: &self.slot_id,
                EPOCH: {"$in": [listed_epoch, self.epoch]},
                GEN: {"$in": [listed_gen.map_or(Bson::Null, Bson::Int64), Bson::Int64(gen)]},
            },
        }
    }

    pub(super) fn lapsed(&self, name: &str) -> ContextError {
        ContextError::Lapsed {
            robot: name.to_string(),
            slot: self.slot_id.clone(),
            epoch: self.epoch,
        }
    }

    fn fenced(&self, name: &str) -> ContextError {
        ContextError::Fenced {
            robot: name.to_string(),
            slot: self.slot_id.clone(),
            epoch: self.epoch,
        }
    }

    /// Reads a robot for (re)starting it, only if this instance is still current.
    pub(crate) async fn load(
        &self,
        id: &ObjectId,
        gen: i64,
        name: &str,
    ) -> Result<Loaded, ContextError> {
        let d = self
            .store
            .robots()
            .find_one(self.fence_match(id, gen))
            .projection(doc! {
                NAME: 1, KIND: 1, SPEC: 1, CONTEXT: 1, SEQ: 1, RECENT_ENDS: 1,
                crate::db::firing::FIRINGS: 1, CREATED_AT: 1, PAUSED: 1, UPDATE_RESULT: 1,
            })
            .await?
            .ok_or_else(|| self.fenced(name))?;
        Loaded::from_robot(RobotDoc::from_doc(&d), name).map_err(|found| {
            ContextError::NotADocument {
                robot: name.to_string(),
                found: found.to_string(),
            }
        })
    }

    /// [`ContextStore::load`], paced like a robot write: a holder's scheduled robots
    /// read themselves at a firing's edge, and a thousand reads at once would hold
    /// this holder's renewal behind them on a server that answers one at a time.
    pub(crate) async fn load_paced(
        &self,
        id: &ObjectId,
        gen: i64,
        name: &str,
    ) -> Result<Loaded, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Err(self.lapsed(name));
        }
        self.load(id, gen, name).await
    }

    /// The worker's metrics, for what a robot kind counts itself.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Persists a new context: `seq + 1`, `checkpointed_at = $$NOW`, and when
    /// `history > 0` a `{seq, epoch, gen, worker, slot, at}` record appended
    /// atomically. Only the instance of generation `gen` can write, and only over
    /// the checkpoint `after_seq` it follows: a statement resent after it landed
    /// (a half-applied batch, an answer lost on the network) matches nothing the
    /// second time, so no step is ever applied twice. Zero matched is reported
    /// fenced; the robot stops and reloads from what the database holds.
    pub async fn checkpoint(
        &self,
        id: &ObjectId,
        gen: i64,
        name: &str,
        context: Document,
        history: i64,
        after_seq: i64,
    ) -> Result<(), ContextError> {
        let bytes = bson::to_vec(&context).map_or(usize::MAX, |v| v.len());
        if bytes > MAX_CONTEXT_BYTES {
            self.metrics.checkpoints_refused.inc();
            return Err(ContextError::TooLarge {
                robot: name.to_string(),
                bytes,
            });
        }
        if !self.guard.admit().await {
            self.metrics.fenced_writes.inc();
            return Err(self.lapsed(name));
        }
        let mut set = doc! {
            CONTEXT: {"$literal": context},
            SEQ: {"$add": ["$seq", 1_i64]},
            CHECKPOINTED_AT: "$$NOW",
        };
        if history > 0 {
            let entry = self.history_record(gen);
            set.insert(
                HISTORY,
                doc! {"$slice": [
                    {"$concatArrays": [{"$ifNull": ["$history", []]}, [entry]]},
                    -history.min(MAX_HISTORY),
                ]},
            );
        }
        let mut filter = self.fence_match(id, gen);
        filter.insert(SEQ, after_seq);
        let written = self
            .commit
            .write(Statement {
                id: *id,
                filter,
                update: Update::Pipeline(vec![doc! {"$set": set}]),
            })
            .await?;
        match written {
            Written::Applied => {
                self.metrics.checkpoints.inc();
                Ok(())
            }
            Written::Fenced => {
                self.metrics.fenced_writes.inc();
                Err(self.fenced(name))
            }
            Written::Lapsed => {
                self.metrics.fenced_writes.inc();
                Err(self.lapsed(name))
            }
            Written::Refused(why) => Err(ContextError::Refused {
                robot: name.to_string(),
                why,
            }),
        }
    }

    /// The record a checkpoint of instance `gen` appends to `history`, in an update
    /// pipeline: the `seq` it writes, who wrote it, and the server's time.
    fn history_record(&self, gen: i64) -> Document {
        doc! {
            SEQ: {"$add": ["$seq", 1_i64]},
            EPOCH: self.epoch,
            GEN: gen,
            WORKER: {"$literal": &self.worker},
            SLOT: &self.slot_id,
            AT: "$$NOW",
        }
    }

    /// Records the robot's lifecycle status, fenced like a checkpoint.
    pub async fn set_status(
        &self,
        id: &ObjectId,
        gen: i64,
        status: RobotStatus,
        error: Option<&str>,
        restarts: Option<i64>,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let mut set = doc! {
            STATUS: status,
            // $literal: an error text starting with `$` is not a field path.
            // Scrubbed: a driver error may echo part of the connection string.
            ERROR: {"$literal": error.map_or(Bson::Null, |e| Bson::String(crate::secrets::scrub(e).into_owned()))},
            WORKER: {"$literal": &self.worker},
            STATUS_AT: "$$NOW",
        };
        if let Some(n) = restarts {
            // An end: counted in the robot's own record, on the server's clock, so
            // whichever holder runs it next keeps its restart budget's window.
            set.insert(RESTARTS, n);
            let kept = crate::db::robot_doc::ENDS_KEPT as i64;
            set.insert(
                RECENT_ENDS,
                doc! {"$slice": [
                    {"$concatArrays": [
                        {"$cond": [{"$isArray": "$recent_ends"}, "$recent_ends", {"$literal": []}]},
                        [{"$toLong": "$$NOW"}],
                    ]},
                    -kept,
                ]},
            );
        }
        self.update_fenced(id, gen, vec![doc! {"$set": set}].into())
            .await
    }

    /// One fenced `updateOne` of instance `gen`'s robot. True when it matched.
    async fn update_fenced(
        &self,
        id: &ObjectId,
        gen: i64,
        update: mongodb::options::UpdateModifications,
    ) -> Result<bool, ContextError> {
        let r = self
            .store
            .robots()
            .update_one(self.fence_match(id, gen), update)
            .await?;
        Ok(r.matched_count == 1)
    }
}

impl ContextStore {
    /// Applies update `update_id` to a robot bound to this slot (its `kind` and `spec`
    /// become the update's, its `start_rev` goes up so a running instance stops after
    /// a last checkpoint and starts again), or refuses it (`why`), leaving the robot as
    /// it was. Either way the answer lands in `update_result` for whoever asked, in one
    /// write that matches only while the update is still the one judged and the robot
    /// is on this slot under no newer holder. False when it matched nothing (moved,
    /// deleted, taken over, or another update replaced this one).
    pub(crate) async fn answer_update(
        &self,
        id: &ObjectId,
        update_id: &ObjectId,
        applied: Result<(&str, &Document), &str>,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let filter = doc! {
            "_id": id, SLOT_ID: &self.slot_id,
            EPOCH: {"$not": {"$gt": self.epoch}},
            "update.id": update_id,
        };
        // A pipeline, for the server's clock; `$literal` around everything written by
        // a document writer, so a `$`-name in a spec stays data.
        let mut result = doc! {
            "id": update_id, "applied": applied.is_ok(),
            WORKER: {"$literal": &self.worker}, AT: "$$NOW",
        };
        let mut set = Document::new();
        match applied {
            Ok((kind, spec)) => {
                set.insert(KIND, doc! {"$literal": kind});
                set.insert(SPEC, doc! {"$literal": spec.clone()});
                set.insert(
                    START_REV,
                    doc! {"$add": [
                        {"$cond": [{"$in": [{"$type": "$start_rev"}, ["int", "long"]]}, {"$toLong": "$start_rev"}, 0_i64]},
                        1_i64,
                    ]},
                );
                // A robot its restart policy gave up on runs again with the change (a
                // fresh budget); one an operator paused stays paused.
                let failed = doc! {"$and": [{"$eq": ["$paused", true]}, {"$eq": ["$status", RobotStatus::Failed]}]};
                set.insert(PAUSED, doc! {"$cond": [failed.clone(), false, "$paused"]});
                set.insert(
                    RECENT_ENDS,
                    doc! {"$cond": [failed.clone(), {"$literal": []}, {"$ifNull": ["$recent_ends", {"$literal": []}]}]},
                );
                set.insert(
                    STATUS,
                    doc! {"$cond": [failed, RobotStatus::Pending, "$status"]},
                );
            }
            Err(why) => {
                let why = crate::secrets::scrub(why).into_owned();
                result.insert("why", doc! {"$literal": why});
            }
        }
        set.insert(UPDATE_RESULT, result);
        let update = vec![doc! {"$set": set}, doc! {"$unset": UPDATE}];
        let r = self.store.robots().update_one(filter, update).await?;
        Ok(r.matched_count == 1)
    }

    /// The `$set` (a pipeline stage) of a robot held as a paused one is, with `status`.
    fn held_as(&self, status: RobotStatus, error: Bson, restarts: i64) -> Document {
        doc! {
            STATUS: status,
            PAUSED: true,
            ERROR: error,
            WORKER: {"$literal": &self.worker},
            RESTARTS: restarts,
            STATUS_AT: "$$NOW",
        }
    }

    /// Marks the robot `failed` and holds it as a paused robot is held, fenced like a
    /// checkpoint: no holder starts it again until `robot resume`. False when fenced or
    /// the lease lapsed (then nothing was written).
    pub(crate) async fn give_up(
        &self,
        id: &ObjectId,
        gen: i64,
        why: &str,
        restarts: i64,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let error = doc! {"$literal": crate::secrets::scrub(why).into_owned()};
        let set = self.held_as(RobotStatus::Failed, error.into(), restarts);
        self.update_fenced(id, gen, vec![doc! {"$set": set}].into())
            .await
    }

    /// Marks the robot `completed` and holds it as a paused robot is held, fenced like
    /// a checkpoint: no holder starts it again until `robot restart`. False when
    /// fenced or the lease lapsed (then nothing was written).
    /// Only over `start_rev`, the one the instance started under: a `robot restart`
    /// that came after the run ended stands.
    pub(crate) async fn complete(
        &self,
        id: &ObjectId,
        gen: i64,
        start_rev: i64,
        restarts: i64,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let set = self.held_as(RobotStatus::Completed, Bson::Null, restarts);
        let mut filter = self.fence_match(id, gen);
        // A robot never restarted has no `start_rev`: null matches a missing field.
        let rev = if start_rev == 0 {
            doc! {"$in": [Bson::Null, 0_i64, 0_i32]}
        } else {
            doc! {"$eq": start_rev}
        };
        filter.insert(START_REV, rev);
        let r = self
            .store
            .robots()
            .update_one(filter, vec![doc! {"$set": set}])
            .await?;
        Ok(r.matched_count == 1)
    }

    /// A scheduled robot's firing state becomes `next`, with `records` appended to
    /// its runs: one compare-and-set on `firings.rev`, fenced like a checkpoint and
    /// sent in the slot's group commit (see [`crate::db::firing::FiringWrite`]).
    /// `Fenced` when it matched nothing: another writer raised `rev`, or this
    /// instance is no longer current; a read tells which.
    pub(crate) async fn write_firings(
        &self,
        id: &ObjectId,
        gen: i64,
        write: crate::db::firing::FiringWrite<'_>,
    ) -> Result<Written, ContextError> {
        if !self.guard.admit().await {
            return Ok(Written::Lapsed);
        }
        // The history kept is bounded however the spec was edited.
        let bounded;
        let write = match write.last_step {
            Some(step) if step.history > MAX_HISTORY => {
                bounded = crate::db::firing::LastStep {
                    history: MAX_HISTORY,
                    ..step.clone()
                };
                crate::db::firing::FiringWrite {
                    last_step: Some(&bounded),
                    ..write
                }
            }
            _ => write,
        };
        let (filter, update) = write.statement(self.fence_match(id, gen), self.history_record(gen));
        Ok(self
            .commit
            .write(Statement {
                id: *id,
                filter,
                update,
            })
            .await?)
    }

    /// Replaces a scheduled robot's `runs` that is not an array (written around the
    /// validator) with an empty one, fenced like a checkpoint: every firing-state
    /// write appends to `runs`, and the server refuses to append to anything else,
    /// so the robot would never fire again. True when it replaced one.
    pub(crate) async fn heal_runs(&self, id: &ObjectId, gen: i64) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let runs = crate::db::firing::RUNS;
        let mut filter = self.fence_match(id, gen);
        filter.insert(runs, doc! {"$exists": true, "$not": {"$type": "array"}});
        let r = self
            .store
            .robots()
            .update_one(filter, doc! {"$set": {runs: []}})
            .await?;
        Ok(r.modified_count == 1)
    }

    /// Records the end of run `entry` of an instance that is no longer running it
    /// (stopped: moved, updated, paused, restarted, released), matched by the run's
    /// id: the run leaves `running` (for `lost` when the stop `cut_off` it), and
    /// `record` (None for a claim that never started) is appended. False when the
    /// run was not in flight.
    pub(crate) async fn end_run_by_id(
        &self,
        id: &ObjectId,
        entry: &crate::db::firing::RunEntry,
        record: Option<&crate::db::firing::RunRecord>,
        cut_off: bool,
        keep: u32,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let (filter, update) = crate::db::firing::end_by_id(*id, entry, record, cut_off, keep);
        let r = self.store.robots().update_one(filter, update).await?;
        Ok(r.matched_count == 1)
    }

    /// Records what contains a running robot's processes (see
    /// [`crate::robot::shim::CONTAINMENT`]) and the resource limits its shim applied
    /// (`applied_limits`, removed when none), fenced like a checkpoint; false when
    /// fenced or the lease lapsed.
    pub(crate) async fn set_containment(
        &self,
        id: &ObjectId,
        gen: i64,
        containment: &str,
        applied_limits: Option<Document>,
    ) -> Result<bool, ContextError> {
        let _permit = self.pacer.acquire().await;
        if !self.guard.admit().await {
            return Ok(false);
        }
        let update = match applied_limits {
            Some(applied) => doc! {"$set": {
                CONTAINMENT: containment, APPLIED_LIMITS: applied,
            }},
            None => doc! {
                "$set": {CONTAINMENT: containment},
                "$unset": {APPLIED_LIMITS: ""},
            },
        };
        self.update_fenced(id, gen, update.into()).await
    }
}

/// A whole-number field of a robot document ([`crate::db::store::int`]); 0 when it
/// is missing or not a whole number (a hand-edited document).
pub(crate) fn long_or_zero(d: &Document, key: &str) -> i64 {
    crate::db::store::int(d, key).unwrap_or(0)
}
