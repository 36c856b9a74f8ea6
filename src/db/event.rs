//! The `events` log: what kinds of event there are, and one event decoded once.
//!
//! Writers name an [`EventKind`]; readers (the dashboard's list, its timeline) decode
//! each document with [`Event::from_doc`]. The log is for inspection: a document
//! edited or written by hand is shown as it is, never dropped, and a kind this
//! version does not know is kept as its text.

use std::collections::BTreeMap;
use std::fmt;

use bson::{oid::ObjectId, Bson, Document};

use crate::db::field::{AT, KIND, OVERFLOW, ROBOT, SLOT_ID, WORKER};

/// What happened. The stored text is [`EventKind::as_str`]; `schemas/events.json`
/// lists the same words (a unit test holds them equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// A worker claimed a slot (`overflow` when it already held one).
    Claim,
    /// A new holder's first adoption of its slot's robots landed (`writes`).
    Adopt,
    /// A holder gave its slot back (SIGTERM, hand-back, drain).
    Release,
    /// A renewal found the slot taken: its robots were stopped.
    Lost,
    /// No renewal came back before the local deadline: its robots were stopped.
    SelfFence,
    /// A robot's write matched nothing: a newer instance owns it.
    FencedWrite,
    Drain,
    Undrain,
    Create,
    Pause,
    Resume,
    Restart,
    Update,
    Move,
    Delete,
    Rebalance,
    /// A robot ended and was started again (the 1st, 2nd, 4th, 8th … of a run).
    RobotRestart,
    /// A robot's restart policy gave up on it.
    RobotFailed,
    /// A worker saw the server's clock step forward.
    ServerClockStep,
}

impl EventKind {
    /// Every kind, in the order `schemas/events.json` lists them.
    pub const ALL: [EventKind; 19] = [
        EventKind::Claim,
        EventKind::Adopt,
        EventKind::Release,
        EventKind::Lost,
        EventKind::SelfFence,
        EventKind::FencedWrite,
        EventKind::Drain,
        EventKind::Undrain,
        EventKind::Create,
        EventKind::Pause,
        EventKind::Resume,
        EventKind::Restart,
        EventKind::Update,
        EventKind::Move,
        EventKind::Delete,
        EventKind::Rebalance,
        EventKind::RobotRestart,
        EventKind::RobotFailed,
        EventKind::ServerClockStep,
    ];

    /// The stored word.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Claim => "claim",
            EventKind::Adopt => "adopt",
            EventKind::Release => "release",
            EventKind::Lost => "lost",
            EventKind::SelfFence => "self_fence",
            EventKind::FencedWrite => "fenced_write",
            EventKind::Drain => "drain",
            EventKind::Undrain => "undrain",
            EventKind::Create => "create",
            EventKind::Pause => "pause",
            EventKind::Resume => "resume",
            EventKind::Restart => "restart",
            EventKind::Update => "update",
            EventKind::Move => "move",
            EventKind::Delete => "delete",
            EventKind::Rebalance => "rebalance",
            EventKind::RobotRestart => "robot_restart",
            EventKind::RobotFailed => "robot_failed",
            EventKind::ServerClockStep => "server_clock_step",
        }
    }

    /// The kind a stored word names, if this version knows it.
    pub fn parse(word: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == word)
    }
}

impl From<EventKind> for Bson {
    fn from(k: EventKind) -> Bson {
        Bson::String(k.as_str().to_string())
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One document of `events`, decoded leniently.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: Option<ObjectId>,
    /// When, on the server's clock (ms since the epoch); None when `at` is not a date.
    pub at_ms: Option<i64>,
    /// The kind as stored (empty when missing), shown as it is.
    pub kind_text: String,
    /// The kind, when this version knows the word.
    pub kind: Option<EventKind>,
    pub worker: Option<String>,
    pub slot: Option<String>,
    pub robot: Option<String>,
    /// A claim by a worker that already held a slot.
    pub overflow: bool,
    /// Every other field as text (`_id`, `at`, `kind` and nulls left out), for
    /// display: `worker`, `slot_id`, `epoch`, `detail`, `actor` ….
    pub fields: BTreeMap<String, String>,
}

impl Event {
    pub fn from_doc(d: &Document) -> Event {
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
    pub fn at_rfc3339(&self) -> Option<String> {
        bson::DateTime::from_millis(self.at_ms?)
            .try_to_rfc3339_string()
            .ok()
    }
}

/// A text field; a value of another type is shown as BSON text, null as none.
pub fn text(d: &Document, key: &str) -> Option<String> {
    match d.get(key) {
        Some(Bson::Null) | None => None,
        Some(v) => Some(as_text(v)),
    }
}

fn as_text(v: &Bson) -> String {
    match v {
        Bson::String(s) => s.clone(),
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
        for k in EventKind::ALL {
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
