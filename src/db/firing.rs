//! A scheduled robot's firings as stored in its document:
//!
//! ```text
//! firings: {rev, since, claimed, missed, next, paused_at,
//!           running: [{id, firing, attempt, trigger, by, worker, slot, epoch, gen}],
//!           lost:    [the same, for runs a stop cut off],
//!           triggers: [{id, by, at}]}
//! runs: [{firing, attempt, outcome, reason, started, ended, lateness_ms, worker, slot,
//!         epoch, by, count, last}]        (the last `keep_runs`)
//! ```
//!
//! Every writer raises `firings.rev` in a compare-and-set, so two writers never act
//! on the same state. See docs/internals.md, "Who writes a scheduled robot's firings".

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::db::field::{CHECKPOINTED_AT, CONTEXT, EPOCH, GEN, HISTORY, SEQ, SLOT, WORKER};
use crate::db::group_commit::Update;
use crate::db::store::int;
use crate::db::words::words;

/// The robot document's field of firing state.
pub(crate) const FIRINGS: &str = "firings";
/// The robot document's record of its last runs.
pub(crate) const RUNS: &str = "runs";

pub(crate) const REV: &str = "rev";
pub(crate) const SINCE: &str = "since";
pub(crate) const CLAIMED: &str = "claimed";
pub(crate) const MISSED: &str = "missed";
pub(crate) const NEXT: &str = "next";
pub(crate) const PAUSED_AT: &str = "paused_at";
pub(crate) const RUNNING: &str = "running";
pub(crate) const LOST: &str = "lost";
pub(crate) const TRIGGERS: &str = "triggers";
pub(crate) const SCHEDULE: &str = "schedule";
pub(crate) const SCHEDULE_SPEC: &str = "schedule_spec";
pub(crate) const LAST_OUTCOME: &str = "last_outcome";
pub(crate) const LAST_FIRING: &str = "last_firing";
pub(crate) const LAST_LATENESS_MS: &str = "last_lateness_ms";
/// A run that started this long after its firing, or later, counts as late.
pub(crate) const LATE_MS: i64 = 1000;
pub(crate) const ID: &str = "id";
pub(crate) const FIRING: &str = "firing";
pub(crate) const ATTEMPT: &str = "attempt";
pub(crate) const TRIGGER: &str = "trigger";
pub(crate) const BY: &str = "by";
pub(crate) const OUTCOME: &str = "outcome";
pub(crate) const REASON: &str = "reason";
pub(crate) const STARTED: &str = "started";
pub(crate) const ENDED: &str = "ended";
pub(crate) const LATENESS_MS: &str = "lateness_ms";
pub(crate) const COUNT: &str = "count";
pub(crate) const LAST: &str = "last";
/// On an entry of `lost`: its instance stopped before the run started.
pub(crate) const NOT_STARTED: &str = "not_started";

words! {
    /// What became of a firing, or of one run of it.
    Outcome {
        /// It ran, and ended well (exit 0).
        Succeeded => "succeeded",
        /// It ran, and failed (an exit other than 0, a crash).
        Failed => "failed",
        /// It was in flight when its holder's lease ended, which stopped it.
        Lost => "lost",
        /// It was stopped part-way (pause, update, move, restart, shutdown).
        Stopped => "stopped",
        /// `cancel_other`: a newer firing stopped it.
        Cancelled => "cancelled",
        /// It never ran: it overlapped a run, the robot was paused, or its run was
        /// lost and `on_lost` is `skip`.
        Skipped => "skipped",
        /// It never ran: it was due outside the catch-up window.
        Missed => "missed",
    }
}

/// One run in flight (or cut off): which firing, which attempt, who runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunEntry {
    pub(crate) id: ObjectId,
    pub(crate) firing: i64,
    pub(crate) attempt: i64,
    /// The run-now request it answers, if any.
    pub(crate) trigger: Option<ObjectId>,
    pub(crate) by: Option<String>,
    pub(crate) worker: String,
    pub(crate) slot: String,
    pub(crate) epoch: i64,
    pub(crate) gen: i64,
    /// Handed on (in `lost`) by an instance that stopped before the run started:
    /// the next instance starts it as the same attempt, whatever `on_lost` says.
    pub(crate) not_started: bool,
}

impl RunEntry {
    pub(crate) fn to_doc(&self) -> Document {
        let mut d = doc! {
            ID: self.id, FIRING: self.firing, ATTEMPT: self.attempt,
            TRIGGER: self.trigger.map_or(Bson::Null, Bson::ObjectId),
            BY: self.by.clone().map_or(Bson::Null, Bson::String),
            WORKER: &self.worker, SLOT: &self.slot, EPOCH: self.epoch, GEN: self.gen,
        };
        if self.not_started {
            d.insert(NOT_STARTED, true);
        }
        d
    }

    /// None for an entry that cannot be one (a hand edit).
    pub(crate) fn from_doc(d: &Document) -> Option<RunEntry> {
        Some(RunEntry {
            id: d.get_object_id(ID).ok()?,
            firing: int(d, FIRING)?,
            attempt: int(d, ATTEMPT).unwrap_or(1),
            trigger: d.get_object_id(TRIGGER).ok(),
            by: d.get_str(BY).ok().map(str::to_string),
            worker: d.get_str(WORKER).unwrap_or_default().to_string(),
            slot: d.get_str(SLOT).ok()?.to_string(),
            epoch: int(d, EPOCH)?,
            gen: int(d, GEN)?,
            not_started: d.get_bool(NOT_STARTED) == Ok(true),
        })
    }
}

/// A run-now request (`robot trigger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trigger {
    pub(crate) id: ObjectId,
    pub(crate) by: String,
}

/// A robot's `firings`, decoded leniently: what cannot be read is left out and
/// counted in `odd`, so the holder can say so.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FiringState {
    /// None: never written (the compare-and-set then expects no `rev`).
    pub(crate) rev: Option<i64>,
    pub(crate) since: Option<i64>,
    pub(crate) claimed: Option<i64>,
    pub(crate) missed: i64,
    pub(crate) next: Option<i64>,
    pub(crate) paused_at: Option<i64>,
    pub(crate) running: Vec<RunEntry>,
    pub(crate) lost: Vec<RunEntry>,
    pub(crate) triggers: Vec<Trigger>,
    /// The schedule these firings follow, in words: when it changes, firings are
    /// owed from the change on.
    pub(crate) schedule: Option<String>,
    /// The same schedule as written (`spec.schedule`).
    pub(crate) schedule_spec: Option<Document>,
    /// The last record's outcome, and the last started run's lateness: what the
    /// dashboard's list shows without reading `runs`.
    pub(crate) last_outcome: Option<Outcome>,
    pub(crate) last_lateness_ms: Option<i64>,
    /// The last record's firing.
    pub(crate) last_firing: Option<i64>,
    /// Entries or requests that could not be read.
    pub(crate) odd: usize,
}

impl FiringState {
    /// Reads `robot.firings` (absent or not a document: the empty state).
    pub(crate) fn from_robot(robot: &Document) -> FiringState {
        match robot.get(FIRINGS) {
            Some(Bson::Document(d)) => FiringState::from_doc(d),
            _ => FiringState::default(),
        }
    }

    pub(crate) fn from_doc(d: &Document) -> FiringState {
        let mut odd = 0;
        let mut entries = |key: &str| -> Vec<RunEntry> {
            let Ok(a) = d.get_array(key) else {
                return Vec::new();
            };
            a.iter()
                .filter_map(|e| {
                    let r = e.as_document().and_then(RunEntry::from_doc);
                    odd += usize::from(r.is_none());
                    r
                })
                .collect()
        };
        let running = entries(RUNNING);
        let lost = entries(LOST);
        let triggers = d
            .get_array(TRIGGERS)
            .map(|a| {
                a.iter()
                    .filter_map(|t| {
                        let t = t.as_document()?;
                        Some(Trigger {
                            id: t.get_object_id(ID).ok()?,
                            by: t.get_str(BY).unwrap_or("someone").to_string(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let paused_at = match d.get(PAUSED_AT) {
            Some(Bson::DateTime(t)) => Some(t.timestamp_millis()),
            _ => int(d, PAUSED_AT),
        };
        FiringState {
            rev: int(d, REV),
            since: int(d, SINCE),
            claimed: int(d, CLAIMED),
            missed: int(d, MISSED).unwrap_or(0),
            next: int(d, NEXT),
            paused_at,
            running,
            lost,
            triggers,
            schedule: d.get_str(SCHEDULE).ok().map(str::to_string),
            schedule_spec: d
                .get_document(SCHEDULE_SPEC)
                .ok()
                .filter(|spec| storable(spec))
                .cloned(),
            last_outcome: d.get_str(LAST_OUTCOME).ok().and_then(Outcome::parse),
            last_lateness_ms: int(d, LAST_LATENESS_MS),
            last_firing: int(d, LAST_FIRING),
            odd,
        }
    }

    /// The state as written by its instance: `rev` raised by one, `paused_at`
    /// dropped once handled (`keep_paused`), triggers as given.
    pub(crate) fn to_doc(&self) -> Document {
        let opt = |v: Option<i64>| v.map_or(Bson::Null, Bson::Int64);
        doc! {
            REV: self.rev.unwrap_or(0),
            SINCE: opt(self.since),
            CLAIMED: opt(self.claimed),
            MISSED: self.missed,
            NEXT: opt(self.next),
            PAUSED_AT: opt(self.paused_at),
            RUNNING: self.running.iter().map(|e| Bson::Document(e.to_doc())).collect::<Vec<_>>(),
            LOST: self.lost.iter().map(|e| Bson::Document(e.to_doc())).collect::<Vec<_>>(),
            TRIGGERS: self.triggers.iter().map(|t| Bson::Document(doc! {ID: t.id, BY: &t.by})).collect::<Vec<_>>(),
            SCHEDULE: self.schedule.clone().map_or(Bson::Null, Bson::String),
            SCHEDULE_SPEC: self.schedule_spec.clone().map_or(Bson::Null, Bson::Document),
            LAST_OUTCOME: self.last_outcome.map_or(Bson::Null, Bson::from),
            LAST_LATENESS_MS: opt(self.last_lateness_ms),
            LAST_FIRING: opt(self.last_firing),
        }
    }

    /// Late: the last run started [`LATE_MS`] or more after its firing, or the last
    /// record is a firing missed or lost.
    pub(crate) fn late(&self) -> bool {
        self.last_lateness_ms.is_some_and(|l| l >= LATE_MS)
            || matches!(self.last_outcome, Some(Outcome::Missed | Outcome::Lost))
    }

    /// Notes `records` (about to be appended) in the summary fields.
    pub(crate) fn note(&mut self, records: &[RunRecord]) {
        if let Some(r) = records.last() {
            self.last_outcome = r.outcome;
            self.last_firing = Some(r.last.unwrap_or(r.firing));
        }
        if let Some(l) = records.iter().rev().find_map(|r| r.lateness_ms) {
            self.last_lateness_ms = Some(l);
        }
    }

    /// The firings in `running` whose time came by `now_ms` (in flight, or about to
    /// start), and those claimed ahead of their time, which cannot have started.
    pub(crate) fn due_and_claimed(&self, now_ms: i64) -> (Vec<i64>, Vec<i64>) {
        self.running
            .iter()
            .map(|e| e.firing)
            .partition(|firing| *firing <= now_ms)
    }

    /// Where firings owed start: after the last settled one, and never before the
    /// robot (or its schedule) was made.
    pub(crate) fn settled_until(&self) -> Option<i64> {
        match (self.claimed, self.since) {
            (Some(c), Some(s)) => Some(c.max(s)),
            (c, s) => c.or(s),
        }
    }
}

/// One line of a robot's run record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RunRecord {
    pub(crate) firing: i64,
    pub(crate) attempt: i64,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) reason: Option<String>,
    pub(crate) started: Option<i64>,
    pub(crate) ended: Option<i64>,
    pub(crate) lateness_ms: Option<i64>,
    pub(crate) worker: String,
    pub(crate) slot: String,
    pub(crate) epoch: i64,
    /// Who asked for it, for a run-now.
    pub(crate) by: Option<String>,
    /// For a record of many firings (skipped or missed together): how many, and the
    /// last one.
    pub(crate) count: Option<i64>,
    pub(crate) last: Option<i64>,
}

impl RunRecord {
    pub(crate) fn to_doc(&self) -> Document {
        let opt = |v: Option<i64>| v.map_or(Bson::Null, Bson::Int64);
        doc! {
            FIRING: self.firing, ATTEMPT: self.attempt,
            OUTCOME: self.outcome.map_or(Bson::Null, Bson::from),
            REASON: self.reason.as_ref().map_or(Bson::Null, |r| Bson::String(crate::secrets::scrub(r).into_owned())),
            STARTED: opt(self.started), ENDED: opt(self.ended), LATENESS_MS: opt(self.lateness_ms),
            WORKER: &self.worker, SLOT: &self.slot, EPOCH: self.epoch,
            BY: self.by.clone().map_or(Bson::Null, Bson::String),
            COUNT: opt(self.count), LAST: opt(self.last),
        }
    }

    /// Leniently, as the CLI and the dashboard show it.
    pub(crate) fn from_doc(d: &Document) -> RunRecord {
        RunRecord {
            firing: int(d, FIRING).unwrap_or(0),
            attempt: int(d, ATTEMPT).unwrap_or(1),
            outcome: d.get_str(OUTCOME).ok().and_then(Outcome::parse),
            reason: d.get_str(REASON).ok().map(str::to_string),
            started: int(d, STARTED),
            ended: int(d, ENDED),
            lateness_ms: int(d, LATENESS_MS),
            worker: d.get_str(WORKER).unwrap_or_default().to_string(),
            slot: d.get_str(SLOT).unwrap_or_default().to_string(),
            epoch: int(d, EPOCH).unwrap_or(0),
            by: d.get_str(BY).ok().map(str::to_string),
            count: int(d, COUNT),
            last: int(d, LAST),
        }
    }
}

/// The runs recorded in a robot document, oldest first.
pub(crate) fn runs_of(robot: &Document) -> Vec<RunRecord> {
    robot
        .get_array(RUNS)
        .map(|a| {
            a.iter()
                .filter_map(Bson::as_document)
                .map(RunRecord::from_doc)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether update operators can write `d` back as a value: no field name, at any
/// depth, starts with `$` or holds a `.` (MongoDB refuses those inside `$set`). A
/// schedule's own settings never do (`spec.schedule` takes known names only), so a
/// stored copy that does was edited by hand, and is dropped when read: the next
/// write stores the schedule's own.
fn storable(d: &Document) -> bool {
    d.iter().all(|(k, v)| {
        !k.starts_with('$')
            && !k.contains('.')
            && match v {
                Bson::Document(inner) => storable(inner),
                Bson::Array(items) => items.iter().all(|i| match i {
                    Bson::Document(inner) => storable(inner),
                    _ => true,
                }),
                _ => true,
            }
    })
}

/// One compare-and-set write of an instance's firing state: `firings` becomes
/// `next` (with `rev` one past `prev`'s), `records` are appended to `runs` (the
/// last `keep` kept); `claiming` is the firing this write claims, if any (then it
/// also requires `claimed` to be before it), and `last_step` a run's last context,
/// written with its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FiringWrite<'a> {
    /// The state as the instance knows it: the compare-and-set's expectation.
    pub(crate) prev: &'a FiringState,
    pub(crate) next: &'a FiringState,
    pub(crate) records: &'a [RunRecord],
    pub(crate) keep: u32,
    pub(crate) claiming: Option<i64>,
    pub(crate) last_step: Option<&'a LastStep>,
}

impl FiringWrite<'_> {
    /// The statement, under `fence` (the instance's checkpoint fence). Its form is
    /// chosen here: update operators, unless a last step needs a pipeline
    /// ([`LastStep::operators_suffice`]), which also appends `history_record` (the
    /// checkpoint's record, with the server's time) to `history`.
    ///
    /// Operators are preferred: they take every value literally and are cheaper for the
    /// server (see [`Update`]). A `runs` that is not an array makes the server refuse
    /// the write ([`crate::db::context::ContextStore::heal_runs`] then replaces it).
    pub(crate) fn statement(
        &self,
        fence: Document,
        history_record: Document,
    ) -> (Document, Update) {
        match self.last_step {
            Some(step) if !step.operators_suffice() => {
                let (filter, pipeline) = self.as_pipeline(fence, step, history_record);
                (filter, Update::Pipeline(pipeline))
            }
            _ => {
                let (filter, update) = self.as_operators(fence);
                (filter, Update::Operators(update))
            }
        }
    }

    /// The filter: the fence, `rev` as the instance knows it, the claim's firing
    /// not claimed yet, and a last step's `seq`.
    fn filter(&self, mut fence: Document) -> Document {
        let rev_key = format!("{FIRINGS}.{REV}");
        fence.insert(rev_key, self.prev.rev.map_or(Bson::Null, Bson::Int64));
        if let Some(t) = self.claiming {
            fence.insert(format!("{FIRINGS}.{CLAIMED}"), doc! {"$not": {"$gte": t}});
        }
        if let Some(step) = self.last_step {
            // A checkpoint in the same statement, fenced as one: over `after_seq`.
            fence.insert(SEQ, step.after_seq);
        }
        fence
    }

    /// `next` as written: `rev` one past `prev`'s.
    fn written(&self) -> FiringState {
        let mut written = self.next.clone();
        written.rev = Some(self.prev.rev.unwrap_or(0) + 1);
        written
    }

    fn records(&self) -> Vec<Bson> {
        self.records
            .iter()
            .map(|r| Bson::Document(r.to_doc()))
            .collect()
    }

    /// The write as update operators.
    fn as_operators(&self, fence: Document) -> (Document, Document) {
        let mut update = doc! {"$set": {FIRINGS: self.written().to_doc()}};
        if let Some(step) = self.last_step {
            if let Ok(set) = update.get_document_mut("$set") {
                set.insert(CONTEXT, step.context.clone());
            }
            update.insert("$inc", doc! {SEQ: 1_i64});
            update.insert("$currentDate", doc! {CHECKPOINTED_AT: true});
        }
        if !self.records.is_empty() {
            update.insert(
                "$push",
                doc! {RUNS: {"$each": self.records(), "$slice": -(self.keep.max(1) as i64)}},
            );
        }
        (self.filter(fence), update)
    }

    /// The write with `step` as an update pipeline: the same filter and changes,
    /// every value taken as it is (`$literal`), and `history_record` appended to
    /// `history`, the last `step.history` kept. Costlier for the server.
    fn as_pipeline(
        &self,
        fence: Document,
        step: &LastStep,
        history_record: Document,
    ) -> (Document, Vec<Document>) {
        let mut set = doc! {
            FIRINGS: {"$literal": self.written().to_doc()},
            CONTEXT: {"$literal": &step.context},
            SEQ: {"$add": ["$seq", 1_i64]},
            CHECKPOINTED_AT: "$$NOW",
        };
        if !self.records.is_empty() {
            // `runs` that is not an array makes the server refuse this, as `$push` does.
            set.insert(
                RUNS,
                doc! {"$slice": [
                    {"$concatArrays": [{"$ifNull": ["$runs", []]}, {"$literal": self.records()}]},
                    -(self.keep.max(1) as i64),
                ]},
            );
        }
        if step.history > 0 {
            set.insert(
                HISTORY,
                doc! {"$slice": [
                    {"$concatArrays": [{"$ifNull": ["$history", []]}, [history_record]]},
                    -step.history,
                ]},
            );
        }
        (self.filter(fence), vec![doc! {"$set": set}])
    }
}

/// Asks the holder of robot `id`, bound to `slot`, for a run now (a run-now
/// request `by` someone): it waits in `firings.triggers` until the holder takes it,
/// and `rev` goes up so the holder's instance sees it at once. False when the robot
/// is no longer there or on that slot.
pub(crate) async fn request_run_now(
    store: &crate::db::store::Store,
    id: &Bson,
    slot: &str,
    by: &str,
) -> Result<bool, mongodb::error::Error> {
    let r = store
        .robots()
        .update_one(
            doc! {"_id": id, crate::db::field::SLOT_ID: slot},
            doc! {
                "$push": {format!("{FIRINGS}.{TRIGGERS}"): {ID: ObjectId::new(), BY: by}},
                "$inc": {format!("{FIRINGS}.{REV}"): 1_i64},
            },
        )
        .await?;
    Ok(r.matched_count == 1)
}

/// What a pause adds to a scheduled robot's update: `firings.paused_at` (the
/// server's time) and a new `rev`, so the instance that runs it after the resume
/// records the firings of the pause as skipped.
pub(crate) fn mark_paused(update: &mut Document) {
    let mut current = update
        .get_document("$currentDate")
        .cloned()
        .unwrap_or_default();
    current.insert(format!("{FIRINGS}.{PAUSED_AT}"), true);
    update.insert("$currentDate", current);
    let mut inc = update.get_document("$inc").cloned().unwrap_or_default();
    inc.insert(format!("{FIRINGS}.{REV}"), 1_i64);
    update.insert("$inc", inc);
}

/// A scheduled run's last context ([`crate::robot::RobotRun::end_with`]), written
/// with its end: the robot's `context`, `seq` one past `after_seq` (which the write
/// requires) and `checkpointed_at` the server's time, as a checkpoint writes them.
/// The context is stored as it is by update operators (the caller checked: no `$`
/// or `.` in its field names).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LastStep {
    pub(crate) context: Document,
    pub(crate) after_seq: i64,
    /// The robot's `spec.history`: above 0, a checkpoint record goes to its
    /// `history` too, stamped with the server's time, which only an update
    /// pipeline can write ([`FiringWrite::statement`]).
    pub(crate) history: i64,
}

impl LastStep {
    /// Whether update operators can write it: no history record, and a context
    /// they store as it is (no field name with `$` or `.`, at any depth).
    pub(crate) fn operators_suffice(&self) -> bool {
        fn doc_ok(d: &Document) -> bool {
            d.iter()
                .all(|(k, v)| !k.starts_with('$') && !k.contains('.') && value_ok(v))
        }
        fn value_ok(v: &Bson) -> bool {
            match v {
                Bson::Document(d) => doc_ok(d),
                Bson::Array(a) => a.iter().all(value_ok),
                _ => true,
            }
        }
        self.history == 0 && doc_ok(&self.context)
    }
}

/// The write of an instance that is no longer the robot's current one (moved,
/// updated, restarted) and whose run `entry` ended: the run leaves `running`, its
/// record is appended, and, when a stop cut it off (or came before it started,
/// `entry.not_started`), it goes to `lost` for the current instance to retry, skip
/// or start. Matched by the run's id alone: it changes no context, only says what
/// became of this run.
pub(crate) fn end_by_id(
    robot: ObjectId,
    entry: &RunEntry,
    record: Option<&RunRecord>,
    cut_off: bool,
    keep: u32,
) -> (Document, Document) {
    let filter = doc! {"_id": robot, format!("{FIRINGS}.{RUNNING}.{ID}"): entry.id};
    let mut push = Document::new();
    if let Some(record) = record {
        push.insert(
            RUNS,
            doc! {"$each": [record.to_doc()], "$slice": -(keep.max(1) as i64)},
        );
    }
    if cut_off {
        push.insert(format!("{FIRINGS}.{LOST}"), entry.to_doc());
    }
    let mut update = doc! {
        "$pull": {format!("{FIRINGS}.{RUNNING}"): {ID: entry.id}},
        "$inc": {format!("{FIRINGS}.{REV}"): 1_i64},
    };
    if !push.is_empty() {
        update.insert("$push", push);
    }
    (filter, update)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of `next` over `prev`, keeping 50 records.
    fn write<'a>(
        prev: &'a FiringState,
        next: &'a FiringState,
        records: &'a [RunRecord],
        claiming: Option<i64>,
        last_step: Option<&'a LastStep>,
    ) -> FiringWrite<'a> {
        FiringWrite {
            prev,
            next,
            records,
            keep: 50,
            claiming,
            last_step,
        }
    }

    fn entry(firing: i64) -> RunEntry {
        RunEntry {
            id: ObjectId::new(),
            firing,
            attempt: 1,
            trigger: None,
            by: None,
            worker: "10.0.0.1:7000".into(),
            slot: "slot-001".into(),
            epoch: 3,
            gen: 4,
            not_started: false,
        }
    }

    #[test]
    fn a_claim_handed_on_before_it_started_says_so_and_reads_back() {
        let mut e = entry(1_000);
        assert!(
            !e.to_doc().contains_key(NOT_STARTED),
            "unmarked entries as before"
        );
        e.not_started = true;
        assert_eq!(RunEntry::from_doc(&e.to_doc()), Some(e.clone()));
        let (_, update) = end_by_id(ObjectId::new(), &e, None, true, 10);
        let lost = update
            .get_document("$push")
            .unwrap()
            .get_document(format!("{FIRINGS}.{LOST}"))
            .unwrap();
        assert_eq!(lost.get_bool(NOT_STARTED), Ok(true));
    }

    #[test]
    fn the_state_reads_back_what_it_writes() {
        let s = FiringState {
            rev: Some(7),
            since: Some(1_000),
            claimed: Some(2_000),
            missed: 3,
            next: Some(4_000),
            paused_at: None,
            running: vec![entry(2_000)],
            lost: vec![entry(1_500)],
            triggers: vec![Trigger {
                id: ObjectId::new(),
                by: "cli".into(),
            }],
            schedule: Some("every 1m".into()),
            schedule_spec: Some(doc! {"every": "1m"}),
            last_outcome: Some(Outcome::Succeeded),
            last_lateness_ms: Some(3),
            last_firing: Some(1_900),
            odd: 0,
        };
        let back = FiringState::from_robot(&doc! {FIRINGS: s.to_doc()});
        assert_eq!(back, s);
        assert_eq!(back.settled_until(), Some(2_000));
    }

    #[test]
    fn hand_broken_entries_are_left_out_and_counted() {
        let d = doc! {FIRINGS: {RUNNING: [5, {ID: "x"}, entry(9).to_doc()], CLAIMED: "soon"}};
        let s = FiringState::from_robot(&d);
        assert_eq!(s.running.len(), 1);
        assert_eq!(s.odd, 2);
        assert_eq!(s.claimed, None);
        assert_eq!(
            FiringState::from_robot(&doc! {FIRINGS: 5}),
            FiringState::default()
        );
    }

    #[test]
    fn a_pause_marks_the_firing_state_beside_what_the_update_sets() {
        let mut update = doc! {"$set": {"paused": true}};
        mark_paused(&mut update);
        assert_eq!(
            update,
            doc! {
                "$set": {"paused": true},
                "$currentDate": {"firings.paused_at": true},
                "$inc": {"firings.rev": 1_i64},
            }
        );
    }

    #[test]
    fn a_claim_is_a_compare_and_set_on_rev_and_the_last_claimed_firing() {
        let fence =
            doc! {"_id": ObjectId::new(), "slot_id": "slot-001", "epoch": 3_i64, "gen": 4_i64};
        let prev = FiringState::default();
        let mut next = prev.clone();
        next.claimed = Some(60_000);
        next.running.push(entry(60_000));
        let (filter, update) = write(&prev, &next, &[], Some(60_000), None).as_operators(fence);
        assert_eq!(filter.get("firings.rev"), Some(&Bson::Null));
        assert_eq!(
            filter.get_document("firings.claimed").unwrap(),
            &doc! {"$not": {"$gte": 60_000_i64}}
        );
        let set = update.get_document("$set").unwrap();
        let written = set.get_document(FIRINGS).unwrap();
        assert_eq!(int(written, REV), Some(1));
        assert!(!update.contains_key("$push"), "no record, no push");
    }

    #[test]
    fn a_last_step_goes_in_the_end_fenced_by_the_seq_it_follows() {
        let fence =
            doc! {"_id": ObjectId::new(), "slot_id": "slot-001", "epoch": 3_i64, "gen": 4_i64};
        let prev = FiringState {
            rev: Some(7),
            running: vec![entry(60_000)],
            ..FiringState::default()
        };
        let next = FiringState {
            running: vec![],
            ..prev.clone()
        };
        let step = LastStep {
            context: doc! {"n": 5_i64, "firing": 60_000_i64},
            after_seq: 11,
            history: 0,
        };
        assert!(step.operators_suffice());
        let (filter, update) =
            write(&prev, &next, &[], None, Some(&step)).as_operators(fence.clone());
        assert_eq!(filter.get("seq"), Some(&Bson::Int64(11)), "{filter}");
        assert_eq!(filter.get("firings.rev"), Some(&Bson::Int64(7)));
        let set = update.get_document("$set").unwrap();
        assert_eq!(set.get_document(CONTEXT).unwrap(), &step.context);
        assert_eq!(update.get_document("$inc").unwrap(), &doc! {"seq": 1_i64});
        assert_eq!(
            update.get_document("$currentDate").unwrap(),
            &doc! {CHECKPOINTED_AT: true}
        );
        // With a history, or a context operators would read as operators: a pipeline,
        // with the same filter, every value literal.
        for step in [
            LastStep {
                history: 3,
                ..step.clone()
            },
            LastStep {
                context: doc! {"deep": [{"$x": 1}]},
                ..step.clone()
            },
            LastStep {
                context: doc! {"a.b": 1},
                ..step.clone()
            },
        ] {
            assert!(!step.operators_suffice(), "{step:?}");
            let record = doc! {"seq": {"$add": ["$seq", 1_i64]}, "at": "$$NOW"};
            let (f, pipeline) = write(&prev, &next, &[], None, Some(&step)).as_pipeline(
                fence.clone(),
                &step,
                record,
            );
            assert_eq!(f, filter);
            let set = pipeline[0].get_document("$set").unwrap();
            assert_eq!(
                set.get_document(CONTEXT).unwrap(),
                &doc! {"$literal": &step.context}
            );
            assert_eq!(set.contains_key(HISTORY), step.history > 0);
        }
        // Without one, the context is not touched.
        let (filter, update) = write(&prev, &next, &[], None, None).as_operators(fence);
        assert!(!filter.contains_key("seq"));
        assert!(!update.get_document("$set").unwrap().contains_key(CONTEXT));
        assert!(!update.contains_key("$inc"));
    }

    #[test]
    fn a_hand_edited_schedule_copy_that_operators_cannot_write_back_is_dropped() {
        let read = |spec: Document| {
            FiringState::from_doc(&doc! {REV: 1_i64, SCHEDULE_SPEC: spec}).schedule_spec
        };
        let fine = doc! {"every": "1m", "keep_runs": 5};
        assert_eq!(read(fine.clone()), Some(fine));
        assert_eq!(read(doc! {"every": "1m", "$where": "x"}), None);
        assert_eq!(read(doc! {"every": {"a.b": 1}}), None);
        assert_eq!(read(doc! {"cron": [{"$x": 1}]}), None);
    }

    #[test]
    fn a_runs_end_appends_its_record_and_keeps_the_last_n() {
        let fence = doc! {"_id": ObjectId::new()};
        let prev = FiringState {
            rev: Some(7),
            running: vec![entry(60_000)],
            ..Default::default()
        };
        let mut next = prev.clone();
        next.running.clear();
        let record = RunRecord {
            firing: 60_000,
            attempt: 1,
            outcome: Some(Outcome::Succeeded),
            reason: None,
            started: Some(60_001),
            ended: Some(60_100),
            lateness_ms: Some(1),
            worker: "127.0.0.1:7700".into(),
            slot: "slot-001".into(),
            epoch: 3,
            by: Some("$where: a hostile name".into()),
            count: None,
            last: None,
        };
        let (filter, update) = write(&prev, &next, &[record], None, None).as_operators(fence);
        assert_eq!(filter.get("firings.rev"), Some(&Bson::Int64(7)));
        assert!(!filter.contains_key("firings.claimed"), "claims nothing");
        let written = update
            .get_document("$set")
            .unwrap()
            .get_document(FIRINGS)
            .unwrap();
        assert_eq!(int(written, REV), Some(8));
        let push = update
            .get_document("$push")
            .unwrap()
            .get_document(RUNS)
            .unwrap();
        assert_eq!(push.get_i64("$slice"), Ok(-50));
        let each = push.get_array("$each").unwrap();
        assert_eq!(each.len(), 1);
        // Operators take values as they are: text starting with `$` stays text.
        let by = each[0].as_document().unwrap().get_str("by").unwrap();
        assert_eq!(by, "$where: a hostile name");
    }
}
