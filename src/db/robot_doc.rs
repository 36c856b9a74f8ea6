//! A robot document, decoded once.
//!
//! The worker's supervisor, the CLI (`robot list`, `robot show`, `status`) and the
//! dashboard all read robots through [`RobotDoc::from_doc`]. It is lenient: the
//! `robots` collection is open to anyone with write access and to the mongo shell,
//! so a document edited by hand is shown as it is (a number where text belongs is
//! shown as its text), never dropped, and what a holder cannot run from it is
//! reported where it would start.

use bson::{oid::ObjectId, Bson, Document};

use crate::db::event::text;
use crate::db::field::UPDATE_RESULT;
use crate::db::field::{
    CHECKPOINTED_AT, CONTEXT, CREATED_AT, EPOCH, ERROR, GEN, KIND, NAME, PAUSED, RECENT_ENDS,
    RESTARTS, SEQ, SLOT_ID, SPEC, SPEC_SCHEDULE, START_REV, STATUS, UPDATE, WORKER,
};
use crate::db::store::int;
use crate::db::words::words;

words! {
    /// What a robot's holder (or the operator's action) last wrote as its status.
    RobotStatus {
        /// Created, resumed or moved: no holder has started it yet.
        Pending => "pending",
        /// Adopted and started by the worker named in `worker`.
        Running => "running",
        /// It ended or crashed; its holder starts it again after a backoff.
        Restarting => "restarting",
        /// Its spec or context cannot work, or (with `paused`) its restart policy gave
        /// up.
        Failed => "failed",
        /// Paused by an operator.
        Paused => "paused",
        /// It ran to completion (`spec.restart.on` failure or never, and an exit 0):
        /// held as a paused robot is, until `robot restart` runs it again.
        Completed => "completed",
    }
}

/// An update asked for and not yet judged by the robot's holder (see
/// [`crate::pool::actions::update`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingUpdate {
    pub(crate) id: ObjectId,
    pub(crate) kind: String,
    pub(crate) spec: Document,
}

/// A robot's `update` field.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum UpdateField {
    #[default]
    None,
    Pending(PendingUpdate),
    /// Something that cannot be an update (a hand edit): left for whoever wrote it.
    Malformed,
}

/// How many of a robot's last ends its document keeps (`recent_ends`): the window of
/// a restart policy with more `attempts` carries over a takeover or a move only this
/// far.
pub(crate) const ENDS_KEPT: usize = 100;

/// One robot document, decoded leniently.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RobotDoc {
    /// `_id` when it is an ObjectId (a worker runs no other).
    pub(crate) id: Option<ObjectId>,
    /// `_id` as text, whatever it is.
    pub(crate) id_text: String,
    pub(crate) name: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) slot_id: Option<String>,
    /// `spec`, when it is a document.
    pub(crate) spec: Option<Document>,
    /// Its context: the stored document, an empty one when missing or null, or the
    /// type of what else is there (reported by the holder that would start it).
    pub(crate) context: Result<Document, &'static str>,
    /// Whole numbers (an int, a long or a whole double); None otherwise.
    pub(crate) epoch: Option<i64>,
    pub(crate) gen: Option<i64>,
    pub(crate) seq: Option<i64>,
    pub(crate) start_rev: Option<i64>,
    pub(crate) restarts: Option<i64>,
    /// `(gen, epoch)` exactly as stored, when both are ints or longs (`gen` None when
    /// never written): what an instance started before its adoption write must
    /// match (see [`crate::db::context::ContextStore::start_early`]).
    pub(crate) fence_as_stored: Option<(Option<i64>, i64)>,
    /// The generation adopting it gives it ([`gen_after_adoption`]).
    pub(crate) next_gen: i64,
    /// True only when `paused` is `true`.
    pub(crate) paused: bool,
    /// The status as stored, shown as it is ([`RobotDoc::status`] reads it).
    pub(crate) status_text: Option<String>,
    pub(crate) error: Option<String>,
    /// The worker that last adopted it.
    pub(crate) worker: Option<String>,
    pub(crate) update: UpdateField,
    /// Its recent ends ([`recent_ends`]).
    pub(crate) recent_ends: Vec<i64>,
    /// Server-clock milliseconds of its last checkpoint.
    pub(crate) checkpointed_at_ms: Option<i64>,
    /// Server-clock milliseconds of its creation.
    pub(crate) created_ms: Option<i64>,
    /// Server-clock milliseconds of the last update its holder applied.
    pub(crate) updated_ms: Option<i64>,
    /// A scheduled robot's firing state (empty for any other).
    pub(crate) firings: crate::db::firing::FiringState,
}

impl RobotDoc {
    pub(crate) fn from_doc(d: &Document) -> RobotDoc {
        let status_text = text(d, STATUS);
        let update = match d.get(UPDATE) {
            Some(Bson::Document(_)) => {
                PendingUpdate::read(d).map_or(UpdateField::Malformed, UpdateField::Pending)
            }
            // Anything else is no update a holder would judge, as before.
            _ => UpdateField::None,
        };
        RobotDoc {
            id: d.get_object_id("_id").ok(),
            id_text: d.get("_id").map(as_id_text).unwrap_or_default(),
            name: text(d, NAME),
            kind: text(d, KIND),
            slot_id: text(d, SLOT_ID),
            spec: d.get_document(SPEC).ok().cloned(),
            context: match d.get(CONTEXT) {
                Some(Bson::Document(c)) => Ok(c.clone()),
                Some(Bson::Null) | None => Ok(Document::new()),
                Some(other) => Err(type_name(other)),
            },
            epoch: int(d, EPOCH),
            gen: int(d, GEN),
            seq: int(d, SEQ),
            start_rev: int(d, START_REV),
            restarts: int(d, RESTARTS),
            fence_as_stored: fence_as_stored(d),
            next_gen: gen_after_adoption(d),
            paused: matches!(d.get(PAUSED), Some(Bson::Boolean(true))),
            status_text,
            error: text(d, ERROR),
            worker: text(d, WORKER),
            update,
            recent_ends: recent_ends(d),
            checkpointed_at_ms: match d.get(CHECKPOINTED_AT) {
                Some(Bson::DateTime(t)) => Some(t.timestamp_millis()),
                _ => None,
            },
            created_ms: match d.get(CREATED_AT) {
                Some(Bson::DateTime(t)) => Some(t.timestamp_millis()),
                _ => None,
            },
            updated_ms: d
                .get_document(UPDATE_RESULT)
                .ok()
                .filter(|u| u.get_bool("applied") == Ok(true))
                .and_then(|u| u.get_datetime("at").ok())
                .map(|t| t.timestamp_millis()),
            firings: crate::db::firing::FiringState::from_robot(d),
        }
    }

    /// The status, when the stored word is one.
    pub(crate) fn status(&self) -> Option<RobotStatus> {
        self.status_text.as_deref().and_then(RobotStatus::parse)
    }

    /// Held after its restart policy gave up: paused, with the status `failed`.
    pub(crate) fn given_up(&self) -> bool {
        self.paused && self.status() == Some(RobotStatus::Failed)
    }

    /// Its name, or its `_id` for a document without one.
    pub(crate) fn name_or_id(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.id_text.clone())
    }
}

impl PendingUpdate {
    /// None when the robot's `update` cannot be one.
    fn read(d: &Document) -> Option<PendingUpdate> {
        let u = d.get_document(UPDATE).ok()?;
        Some(PendingUpdate {
            id: u.get_object_id("id").ok()?,
            kind: u.get_str(KIND).ok()?.to_string(),
            spec: u.get_document(SPEC).ok()?.clone(),
        })
    }
}

fn as_id_text(b: &Bson) -> String {
    match b {
        Bson::ObjectId(id) => id.to_hex(),
        Bson::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `(gen, epoch)` exactly as stored: ints or longs (`gen` may be missing or null,
/// never written); None for anything else.
fn fence_as_stored(d: &Document) -> Option<(Option<i64>, i64)> {
    let whole = |b: &Bson| match b {
        Bson::Int64(v) => Some(*v),
        Bson::Int32(v) => Some(i64::from(*v)),
        _ => None,
    };
    let epoch = whole(d.get(EPOCH)?)?;
    let gen = match d.get(GEN) {
        None | Some(Bson::Null) => None,
        Some(b) => Some(whole(b)?),
    };
    Some((gen, epoch))
}

/// What the dashboard's robot list reads of each robot: what a row shows
/// ([`RobotDoc`] decodes it), and no more (not its context or history).
pub(crate) fn list_row_projection() -> Document {
    let mut p = Document::new();
    for f in [
        NAME,
        KIND,
        SLOT_ID,
        STATUS,
        ERROR,
        PAUSED,
        WORKER,
        SEQ,
        EPOCH,
        RESTARTS,
        CHECKPOINTED_AT,
        crate::db::firing::FIRINGS,
    ] {
        p.insert(f, 1);
    }
    // Only whether it has a schedule, and which: the rest of the spec may be large.
    p.insert(SPEC_SCHEDULE, 1);
    p
}

/// The generation an adoption gives a robot read as `d` (the rule of
/// [`crate::db::context::ContextStore::adopt`]'s pipeline: its `gen` plus one when that is an int or a
/// long, else 1).
pub fn gen_after_adoption(d: &Document) -> i64 {
    match d.get(GEN) {
        Some(Bson::Int64(g)) => g.saturating_add(1),
        Some(Bson::Int32(g)) => i64::from(*g) + 1,
        _ => 1,
    }
}

/// The robot's recorded ends ([`RECENT_ENDS`]): whole numbers only, at most
/// [`ENDS_KEPT`] of them.
pub(crate) fn recent_ends(d: &Document) -> Vec<i64> {
    let Ok(a) = d.get_array(RECENT_ENDS) else {
        return Vec::new();
    };
    let mut ends: Vec<i64> = a
        .iter()
        .filter_map(|b| match b {
            Bson::Int64(n) => Some(*n),
            Bson::Int32(n) => Some(i64::from(*n)),
            _ => None,
        })
        .collect();
    let keep = ENDS_KEPT;
    if ends.len() > keep {
        ends.drain(..ends.len() - keep);
    }
    ends
}

/// The name of a BSON value's type, as `$type` says it.
pub(crate) fn type_name(b: &Bson) -> &'static str {
    match b {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Array(_) => "array",
        Bson::Document(_) => "document",
        Bson::Boolean(_) => "bool",
        Bson::Null => "null",
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        Bson::DateTime(_) => "date",
        Bson::ObjectId(_) => "objectId",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn each_status_reads_back_as_itself() {
        for &s in RobotStatus::ALL {
            assert_eq!(RobotStatus::parse(&s.to_string()), Some(s));
        }
        assert_eq!(RobotStatus::parse("Running"), None);
    }

    #[test]
    fn a_robot_as_slotpool_writes_it() {
        let id = ObjectId::new();
        let u = ObjectId::new();
        let r = RobotDoc::from_doc(&doc! {
            "_id": id, "name": "r1", "kind": "counter", "spec": {"interval_ms": 10},
            "slot_id": "slot-001", "epoch": 4_i64, "gen": 7_i64, "seq": 12_i64,
            "context": {"n": 12}, "paused": false, "status": "running", "worker": "w:1",
            "update": {"id": u, "kind": "counter", "spec": {}},
            "recent_ends": [1_i64, 2_i64], "checkpointed_at": bson::DateTime::from_millis(5),
        });
        assert_eq!(r.id, Some(id));
        assert_eq!(r.name_or_id(), "r1");
        assert_eq!((r.epoch, r.gen, r.seq), (Some(4), Some(7), Some(12)));
        assert_eq!((r.fence_as_stored, r.next_gen), (Some((Some(7), 4)), 8));
        assert_eq!(r.status(), Some(RobotStatus::Running));
        assert_eq!(r.context, Ok(doc! {"n": 12}));
        assert!(matches!(r.update, UpdateField::Pending(ref p) if p.id == u));
        assert!(!r.given_up());
        assert_eq!((r.recent_ends, r.checkpointed_at_ms), (vec![1, 2], Some(5)));
    }

    #[test]
    fn a_hand_edited_robot_is_shown_not_dropped() {
        let r = RobotDoc::from_doc(&doc! {
            "_id": "by-hand", "name": 42_i32, "slot_id": "slot-001", "epoch": "seven",
            "gen": 2.0, "context": [1, 2], "paused": "yes", "status": "sleeping",
            "update": {"kind": "exec"},
        });
        assert_eq!((r.id, r.id_text.as_str()), (None, "by-hand"));
        assert_eq!(r.name.as_deref(), Some("42"));
        // A whole double is shown as the number it is, but fences nothing.
        assert_eq!((r.epoch, r.gen, r.fence_as_stored), (None, Some(2), None));
        assert_eq!(r.next_gen, 1);
        assert_eq!(r.context, Err("array"));
        assert!(!r.paused);
        assert_eq!(
            (r.status(), r.status_text.as_deref()),
            (None, Some("sleeping"))
        );
        assert_eq!(r.update, UpdateField::Malformed);
        let missing = RobotDoc::from_doc(&doc! {"_id": ObjectId::new(), "epoch": 3_i32});
        assert_eq!(missing.context, Ok(Document::new()));
        assert_eq!(missing.fence_as_stored, Some((None, 3)));
        assert_eq!(missing.update, UpdateField::None);
    }
}
