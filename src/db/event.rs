//! The `events` log: what kinds of event there are, and one event decoded once.
//!
//! Writers name an [`EventKind`]; readers (the dashboard's list, its timeline) decode
//! each document with [`Event::from_doc`]. The log is for inspection: a document
//! edited or written by hand is shown as it is, never dropped, and a kind this
//! version does not know is kept as its text.

use bson::{oid::ObjectId, Bson, Document};
use std::collections::BTreeMap;

use crate::db::field::{AT, KIND, OVERFLOW, ROBOT, SLOT_ID, WORKER};
use crate::db::words::words;

words! {
    /// What happened. The stored text is [`EventKind::as_str`]; `schemas/events.json`
    /// lists the same words (a unit test holds them equal).
    EventKind {
        /// A worker claimed a slot (`overflow` when it already held one).
        Claim => "claim",
        /// A new holder's first adoption of its slot's robots landed (`writes`).
        Adopt => "adopt",
        /// A holder gave its slot back (SIGTERM, hand-back, drain).
        Release => "release",
        /// A renewal found the slot taken: its robots were stopped.
        Lost => "lost",
        /// No renewal came back before the local deadline: its robots were stopped
        /// (with `--suspend-for 0`, or when a suspension ended without a renewal).
        SelfFence => "self_fence",
        /// No renewal came back before the local deadline: the slot's robots were
        /// suspended while the holder renews late.
        Suspend => "suspend",
        /// A late renewal matched the holder's epoch: the suspended robots went on in
        /// place (`suspended_ms`).
        LeaseResume => "lease_resume",
        /// A robot's write matched nothing: a newer instance owns it.
        FencedWrite => "fenced_write",
        Drain => "drain",
        Undrain => "undrain",
        Create => "create",
        Pause => "pause",
        Resume => "resume",
        Restart => "restart",
        /// A run-now request for a scheduled robot.
        Trigger => "trigger",
        Update => "update",
        Move => "move",
        Delete => "delete",
        Rebalance => "rebalance",
        /// A robot ended and was started again (the 1st, 2nd, 4th, 8th … of a run).
        RobotRestart => "robot_restart",
        /// A robot's restart policy gave up on it.
        RobotFailed => "robot_failed",
        /// A robot ran to completion (`spec.restart.on`).
        RobotCompleted => "robot_completed",
        /// A scheduled robot's run was found in flight under a lease that ended.
        FiringLost => "firing_lost",
        /// A scheduled robot's firings fell outside their catch-up window.
        FiringMissed => "firing_missed",
        /// A worker saw the server's clock step forward.
        ServerClockStep => "server_clock_step",
    }
}

/// One document of `events`, decoded leniently.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    pub(crate) id: Option<ObjectId>,
    /// When, on the server's clock (ms since the epoch); None when `at` is not a date.
    pub(crate) at_ms: Option<i64>,
    /// The kind as stored (empty when missing), shown as it is.
    pub(crate) kind_text: String,
    /// The kind, when this version knows the word.
    pub(crate) kind: Option<EventKind>,
    pub(crate) worker: Option<String>,
    pub(crate) slot: Option<String>,
    pub(crate) robot: Option<String>,
    /// A claim by a worker that already held a slot.
    pub(crate) overflow: bool,
    /// Every other field as text (`_id`, `at`, `kind` and nulls left out), for
    /// display: `worker`, `slot_id`, `epoch`, `detail`, `actor` ….
    pub(crate) fields: BTreeMap<String, String>,
}

impl Event {
    pub(crate) fn from_doc(d: &Document) -> Event {
        let kind_text = text(d, KIND).unwrap_or_default();
        Event {
            id: d.get_object_id("_id").ok(),
            at_ms: match d.get(AT) {
                Some(Bson::DateTime(t)) => Some(t.timestamp_millis()),
                _ => None,
            },
            kind: EventKind::parse(&kind_text),
            kind_text,
            worker: text(d, WORKER),
            slot: text(d, SLOT_ID),
            robot: text(d, ROBOT),
            overflow: d.get_bool(OVERFLOW).unwrap_or(false),
            fields: d
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "_id" | AT | KIND))
                .filter(|(_, v)| !matches!(v, Bson::Null))
                .map(|(k, v)| (k.clone(), as_text(v)))
                .collect(),
        }
    }

    /// `at` as RFC 3339, when it is a date.
    pub(crate) fn at_rfc3339(&self) -> Option<String> {
        bson::DateTime::from_millis(self.at_ms?)
            .try_to_rfc3339_string()
            .ok()
    }
}

/// A text field; a value of another type is shown as BSON text, null as none.
pub(crate) fn text(d: &Document, key: &str) -> Option<String> {
    match d.get(key) {
        Some(Bson::Null) | None => None,
        Some(v) => Some(as_text(v)),
    }
}

fn as_text(v: &Bson) -> String {
    match v {
        Bson::String(s) => s.clone(),
        // Code or a symbol is not text: shown as extended JSON (`{"$code": …}`), so
        // it never passes for the string it holds.
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) | Bson::Symbol(_) => {
            v.clone().into_relaxed_extjson().to_string()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn the_kinds_are_the_words_the_validator_admits() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../schemas/events.json")).unwrap();
        let admitted: Vec<&str> = schema["$jsonSchema"]["properties"]["kind"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ours: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(ours, admitted);
        for &k in EventKind::ALL {
            assert_eq!(EventKind::parse(&k.to_string()), Some(k));
        }
        assert_eq!(EventKind::parse("claimed"), None);
    }

    #[test]
    fn a_hand_written_event_is_shown_as_it_is() {
        let e = Event::from_doc(&doc! {
            "at": "yesterday", "kind": "coffee", "worker": 7_i32, "detail": Bson::Null,
        });
        assert_eq!((e.kind, e.kind_text.as_str()), (None, "coffee"));
        assert_eq!((e.at_ms, e.at_rfc3339()), (None, None));
        assert_eq!(e.worker.as_deref(), Some("7"));
        assert_eq!(
            e.fields.into_iter().collect::<Vec<_>>(),
            vec![("worker".to_string(), "7".to_string())]
        );
    }
}
