//! The typed answers of `/api/v1`: one struct each, their field names the API's
//! promise (docs/http.md's table), pinned by `answers_keep_their_field_names`
//! below; and the answers the pages share with the API (a robot as JSON, an error,
//! a refused credential).

use std::collections::BTreeMap;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::Bson;
use serde::Serialize;
use serde_json::Value;

use super::auth::Denied;
use super::snapshot::{EventInfo, RobotRow, SlotInfo, Snapshot, Summary, WorkerInfo};
use super::RobotDetail;
use crate::pool::actions;
use crate::pool::view::{RobotNow, RobotState, SlotView};

/// `{"error": message}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorAnswer {
    pub(crate) error: String,
}

/// The fields every reading answer starts with: the server's clock when the snapshot
/// was read, how old the snapshot is, and why the last read failed, if it did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Freshness<'a> {
    pub(crate) now_ms: i64,
    pub(crate) age_ms: Option<u64>,
    #[schema(value_type = Option<String>)]
    pub(crate) error: Option<&'a str>,
}

impl<'a> Freshness<'a> {
    pub(super) fn of(s: &'a Snapshot) -> Self {
        Freshness {
            now_ms: s.now_ms,
            age_ms: s.taken.map(|t| t.elapsed().as_millis() as u64),
            error: s.error.as_deref(),
        }
    }
}

/// `GET /api/v1/overview`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct OverviewAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    #[schema(value_type = Summary)]
    pub(crate) summary: &'a Summary,
    #[schema(value_type = Vec<SlotInfo>)]
    pub(crate) slots: &'a [SlotInfo],
    #[schema(value_type = Vec<WorkerInfo>)]
    pub(crate) workers: &'a [WorkerInfo],
    #[schema(value_type = Vec<EventInfo>)]
    pub(crate) events: &'a [EventInfo],
    pub(crate) robots_at_ms: Option<i64>,
}

/// `GET /api/v1/slots`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SlotsAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    #[schema(value_type = Vec<SlotInfo>)]
    pub(crate) slots: &'a [SlotInfo],
}

/// `GET /api/v1/workers`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct WorkersAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    #[schema(value_type = Vec<WorkerInfo>)]
    pub(crate) workers: &'a [WorkerInfo],
}

/// `GET /api/v1/events`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct EventsAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    #[schema(value_type = Vec<EventInfo>)]
    pub(crate) events: &'a [EventInfo],
}

/// `GET /api/v1/robots`: one page of the robots that match.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RobotsAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    pub(crate) robots_at_ms: Option<i64>,
    pub(crate) matching: usize,
    pub(crate) page: usize,
    pub(crate) pages: usize,
    pub(crate) per_page: usize,
    #[schema(value_type = Vec<RobotRow>)]
    pub(crate) robots: Vec<&'a RobotRow>,
}

/// One robot: its document (relaxed extended JSON, `_id` left out), its state as
/// derived from its slot's lease, and its kept output.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RobotAnswer {
    pub(crate) robot: Value,
    pub(crate) state: RobotState,
    pub(crate) holder: Option<String>,
    pub(crate) why: Option<String>,
    pub(crate) output: Value,
}

/// `GET /api/v1/robots/NAME`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RobotDetailAnswer<'a> {
    #[serde(flatten)]
    pub(crate) fresh: Freshness<'a>,
    #[serde(flatten)]
    pub(crate) robot: RobotAnswer,
}

/// `GET /api/v1/robots/NAME/output`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct OutputAnswer {
    pub(crate) output: Value,
}

/// What an action did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ActionAnswer {
    pub(crate) ok: bool,
    #[schema(value_type = String)]
    pub(crate) action: &'static str,
    pub(crate) target: String,
    pub(crate) slot: Option<String>,
    pub(crate) changed: bool,
}

/// What a create did: the robots created now with their slots, and how many of the
/// names existed already with the same kind and spec.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CreateAnswer {
    pub(crate) ok: bool,
    pub(crate) created: Vec<CreatedAnswer>,
    pub(crate) existing: usize,
}

/// One robot a create placed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CreatedAnswer {
    pub(crate) name: String,
    pub(crate) slot: String,
}

/// One move of a rebalance.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct MoveAnswer {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) robots: Vec<String>,
    pub(crate) moved: u64,
    pub(crate) refused: Option<String>,
}

/// `POST /api/v1/rebalance`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RebalanceAnswer {
    pub(crate) ok: bool,
    pub(crate) dry_run: bool,
    pub(crate) moved: u64,
    pub(crate) moves: Vec<MoveAnswer>,
    pub(crate) before: BTreeMap<String, i64>,
    pub(crate) after: BTreeMap<String, i64>,
}

/// An answer `{"error": message}`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let answer = ErrorAnswer {
        error: message.into(),
    };
    (status, Json(answer)).into_response()
}

/// A robot's document as JSON, with its state derived from the snapshot's slots.
pub(crate) fn robot_json(d: &RobotDetail, s: &Snapshot) -> RobotAnswer {
    let slots = s
        .slots
        .iter()
        .map(|x| {
            let view = SlotView {
                state: x.state,
                holder: x.holder.clone(),
            };
            (x.id.clone(), view)
        })
        .collect();
    let st = RobotNow::of(&d.robot, &slots);
    let mut doc = d.doc.clone();
    doc.remove("_id");
    RobotAnswer {
        robot: Bson::Document(doc).into_relaxed_extjson(),
        state: st.state,
        holder: st.holder,
        why: st.why,
        output: output_json(d),
    }
}

/// The kept output: `{gen, lines: [{n, at, stream, text}]}`, or null.
pub(crate) fn output_json(d: &RobotDetail) -> Value {
    d.output.as_ref().map_or(Value::Null, |o| {
        let mut o = o.clone();
        o.remove("_id");
        Bson::Document(o).into_relaxed_extjson()
    })
}

/// `{"ok", "dry_run", "moved", "moves": [{from, to, robots, moved, refused}],
/// "before": {slot: n}, "after": {slot: n}}`.
pub(crate) fn rebalance_json(r: &actions::Rebalance) -> RebalanceAnswer {
    let counts = |c: &[(String, i64)]| c.iter().cloned().collect::<BTreeMap<String, i64>>();
    RebalanceAnswer {
        ok: true,
        dry_run: r.dry_run,
        moved: r.moved(),
        moves: r
            .moves
            .iter()
            .map(|p| MoveAnswer {
                from: p.from.clone(),
                to: p.to.clone(),
                robots: p.robots.iter().map(|(_, n)| n.clone()).collect(),
                moved: p.moved,
                refused: p.refused.clone(),
            })
            .collect(),
        before: counts(&r.before),
        after: counts(&r.after()),
    }
}

/// The answer to a refused credential.
pub(crate) fn denied(d: Denied) -> Response {
    match d {
        Denied::Disabled => error(
            StatusCode::FORBIDDEN,
            "actions are disabled: this dashboard is read-only (start `slotpool web --allow-actions` with SLOTPOOL_WEB_TOKEN to allow them)",
        ),
        Denied::Unauthenticated => {
            let mut res = error(
                StatusCode::UNAUTHORIZED,
                "send the dashboard's token as `Authorization: Bearer TOKEN`",
            );
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"slotpool\""),
            );
            res
        }
        Denied::Forged => error(StatusCode::FORBIDDEN, "refused: not from this dashboard"),
        Denied::Throttled => {
            let mut res = error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many wrong tokens from this address: try again in {} s",
                    super::auth::FAILURE_WINDOW.as_secs()
                ),
            );
            res.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(super::auth::FAILURE_WINDOW.as_secs()),
            );
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::view::{SlotState, WorkerRole};

    /// The keys of `v`, a JSON object, sorted.
    fn keys(v: impl Serialize) -> Vec<String> {
        match serde_json::to_value(v).unwrap() {
            Value::Object(m) => sorted(&m.keys().map(String::as_str).collect::<Vec<_>>()),
            other => panic!("not an object: {other}"),
        }
    }

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    /// The field names of every `/api/v1` answer are its promise to clients (the
    /// table in docs/http.md): a rename must fail here first.
    #[test]
    fn answers_keep_their_field_names() {
        let snap = Snapshot {
            slots: vec![SlotInfo {
                id: "slot-001".into(),
                state: SlotState::Held,
                holder: Some("10.0.0.5:7700".into()),
                epoch: Some(3),
                lease_ms: Some(2000),
                lease_age_ms: Some(10),
                lease_left_ms: Some(1990),
                robots: 2,
                draining: false,
                cost: None,
            }],
            workers: vec![WorkerInfo {
                id: "10.0.0.5:7700".into(),
                role: WorkerRole::Holder,
                slot: Some("slot-001".into()),
                held: Some(1),
                last_seen_ms: Some(100),
                version: Some("0.1.0".into()),
                load: None,
            }],
            events: vec![EventInfo {
                at: None,
                kind: "claim".into(),
                fields: BTreeMap::new(),
            }],
            ..Snapshot::default()
        };
        let fresh = ["now_ms", "age_ms", "error"];
        let with = |more: &[&str]| sorted(&[&fresh[..], more].concat());
        let overview = OverviewAnswer {
            fresh: Freshness::of(&snap),
            summary: &snap.summary,
            slots: &snap.slots,
            workers: &snap.workers,
            events: &snap.events,
            robots_at_ms: None,
        };
        assert_eq!(
            keys(overview),
            with(&["summary", "slots", "workers", "events", "robots_at_ms"])
        );
        let slots = SlotsAnswer {
            fresh: Freshness::of(&snap),
            slots: &snap.slots,
        };
        assert_eq!(keys(slots), with(&["slots"]));
        let workers = WorkersAnswer {
            fresh: Freshness::of(&snap),
            workers: &snap.workers,
        };
        assert_eq!(keys(workers), with(&["workers"]));
        let events = EventsAnswer {
            fresh: Freshness::of(&snap),
            events: &snap.events,
        };
        assert_eq!(keys(events), with(&["events"]));
        let row = RobotRow::named("r");
        let robots = RobotsAnswer {
            fresh: Freshness::of(&snap),
            robots_at_ms: Some(1),
            matching: 1,
            page: 1,
            pages: 1,
            per_page: 50,
            robots: vec![&row],
        };
        assert_eq!(
            keys(robots),
            with(&[
                "robots_at_ms",
                "matching",
                "page",
                "pages",
                "per_page",
                "robots"
            ])
        );
        let robot = || RobotAnswer {
            robot: Value::Object(Default::default()),
            state: RobotState::Running,
            holder: None,
            why: None,
            output: Value::Null,
        };
        let detail = RobotDetailAnswer {
            fresh: Freshness::of(&snap),
            robot: robot(),
        };
        assert_eq!(
            keys(detail),
            with(&["robot", "state", "holder", "why", "output"])
        );
        assert_eq!(
            keys(OutputAnswer {
                output: Value::Null
            }),
            ["output"]
        );
        let created = CreateAnswer {
            ok: true,
            created: vec![CreatedAnswer {
                name: "r".into(),
                slot: "slot-001".into(),
            }],
            existing: 0,
        };
        assert_eq!(keys(created), sorted(&["ok", "created", "existing"]));
        let one = CreatedAnswer {
            name: "r".into(),
            slot: "slot-001".into(),
        };
        assert_eq!(keys(one), sorted(&["name", "slot"]));
        let action = ActionAnswer {
            ok: true,
            action: "pause",
            target: "r".into(),
            slot: None,
            changed: true,
        };
        assert_eq!(
            keys(action),
            sorted(&["ok", "action", "target", "slot", "changed"])
        );
        let rebalance = RebalanceAnswer {
            ok: true,
            dry_run: true,
            moved: 0,
            moves: vec![],
            before: BTreeMap::new(),
            after: BTreeMap::new(),
        };
        assert_eq!(
            keys(rebalance),
            sorted(&["ok", "dry_run", "moved", "moves", "before", "after"])
        );
        let one_move = MoveAnswer {
            from: "slot-001".into(),
            to: "slot-002".into(),
            robots: vec![],
            moved: 0,
            refused: None,
        };
        assert_eq!(
            keys(one_move),
            sorted(&["from", "to", "robots", "moved", "refused"])
        );
        assert_eq!(keys(ErrorAnswer { error: "x".into() }), ["error"]);
        // The rows inside the answers.
        assert_eq!(
            keys(&snap.slots[0]),
            sorted(&[
                "id",
                "state",
                "holder",
                "epoch",
                "lease_ms",
                "lease_age_ms",
                "lease_left_ms",
                "robots",
                "draining",
                "cost",
            ])
        );
        assert_eq!(
            keys(&snap.workers[0]),
            sorted(&[
                "id",
                "role",
                "slot",
                "held",
                "last_seen_ms",
                "version",
                "load"
            ])
        );
        assert_eq!(keys(&snap.events[0]), sorted(&["at", "kind", "fields"]));
        assert_eq!(
            keys(&row),
            sorted(&[
                "name",
                "kind",
                "slot",
                "state",
                "holder",
                "why",
                "status",
                "error",
                "paused",
                "seq",
                "epoch",
                "restarts",
                "checkpointed_at_ms",
                "schedule",
                "late",
            ])
        );
    }
}
