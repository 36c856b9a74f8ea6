//! `/api/v1`: the dashboard's data as JSON, with stable field names (documented in
//! the README), and its actions for holders of the token.
//!
//! Every answer that reads the pool carries `now_ms` (the server's clock when the
//! snapshot was read), `age_ms` (how old the snapshot is) and `error` (the last
//! refresh's failure, else null). Errors are `{"error": "..."}` with a status that
//! says what to do: 400 bad parameters, 401 no or wrong token, 403 actions disabled,
//! 404 no such robot, slot or action, 409 the document changed or refuses, 413 too
//! large, 503 the database did not answer or the robot table is still being read.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::Bson;
use serde_json::{json, Value};

use super::auth::Denied;
use super::query::{self, RobotQuery};
use super::snapshot::Snapshot;
use super::{web_actor, App, RobotDetail};
use crate::pool::actions::{self, ActionError, Actor, Done};
use crate::pool::view::{self, SlotView};

/// An answer `{"error": message}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// The fields every reading answer starts with.
fn base(s: &Snapshot) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("now_ms".into(), json!(s.now_ms));
    m.insert(
        "age_ms".into(),
        json!(s.taken.map(|t| t.elapsed().as_millis() as u64)),
    );
    m.insert("error".into(), json!(s.error));
    m
}

fn with(s: &Snapshot, key: &str, v: Value) -> Response {
    let mut m = base(s);
    m.insert(key.into(), v);
    Json(Value::Object(m)).into_response()
}

pub async fn overview(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let mut m = base(&s);
    m.insert("summary".into(), json!(s.summary));
    m.insert("slots".into(), json!(s.slots));
    m.insert("workers".into(), json!(s.workers));
    m.insert("events".into(), json!(s.events));
    m.insert("robots_at_ms".into(), json!(s.robots_at_ms));
    Json(Value::Object(m)).into_response()
}

pub async fn slots(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    with(&s, "slots", json!(s.slots))
}

pub async fn workers(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    with(&s, "workers", json!(s.workers))
}

pub async fn events(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    with(&s, "events", json!(s.events))
}

/// Parses a raw query string into pairs, or says why it cannot.
pub fn pairs(raw: Option<&str>) -> Result<Vec<(String, String)>, String> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(raw.unwrap_or(""))
        .map_err(|e| format!("malformed query string: {e}"))
}

pub async fn robots(State(app): State<App>, RawQuery(raw): RawQuery) -> Response {
    let q = match pairs(raw.as_deref()).and_then(|p| RobotQuery::parse(&p)) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let s = app.snapshot().await;
    let Some(rows) = &s.robots else {
        let mut res = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the robot table is still being read; retry in a few seconds",
        );
        res.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("2"));
        return res;
    };
    let page = query::apply(rows, &q);
    let mut m = base(&s);
    m.insert("robots_at_ms".into(), json!(s.robots_at_ms));
    m.insert("matching".into(), json!(page.matching));
    m.insert("page".into(), json!(page.page));
    m.insert("pages".into(), json!(page.pages));
    m.insert("per_page".into(), json!(q.per_page));
    m.insert("robots".into(), json!(page.rows));
    Json(Value::Object(m)).into_response()
}

/// A robot's document as JSON, with its state derived from the snapshot's slots.
pub fn robot_json(d: &RobotDetail, s: &Snapshot) -> Value {
    let slot_id = view::text(&d.doc, "slot_id").unwrap_or_default();
    let slot = s.slots.iter().find(|x| x.id == slot_id).map(|x| SlotView {
        state: x.state,
        holder: x.holder.clone(),
    });
    let st = view::derive(
        &slot_id,
        d.doc.get_str("status").ok(),
        d.doc.get_bool("paused").unwrap_or(false),
        d.doc.get_str("worker").ok(),
        slot.as_ref(),
    );
    let mut doc = d.doc.clone();
    doc.remove("_id");
    json!({
        "robot": Bson::Document(doc).into_relaxed_extjson(),
        "state": st.state, "holder": st.holder, "why": st.why,
        "output": output_json(d),
    })
}

/// The kept output: `{gen, lines: [{n, at, stream, text}]}`, or null.
pub fn output_json(d: &RobotDetail) -> Value {
    d.output.as_ref().map_or(Value::Null, |o| {
        let mut o = o.clone();
        o.remove("_id");
        Bson::Document(o).into_relaxed_extjson()
    })
}

async fn detail(app: &App, name: &str) -> Result<std::sync::Arc<RobotDetail>, Response> {
    match app.robot(name).await {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(error(
            StatusCode::NOT_FOUND,
            format!("no robot named {name:?}"),
        )),
        Err(e) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::secrets::scrub(&format!("{e:#}")).into_owned(),
        )),
    }
}

pub async fn robot(State(app): State<App>, Path(name): Path<String>) -> Response {
    let s = app.snapshot().await;
    match detail(&app, &name).await {
        Ok(d) => {
            let mut m = base(&s);
            if let Value::Object(r) = robot_json(&d, &s) {
                m.extend(r);
            }
            Json(Value::Object(m)).into_response()
        }
        Err(res) => res,
    }
}

pub async fn output(State(app): State<App>, Path(name): Path<String>) -> Response {
    match detail(&app, &name).await {
        Ok(d) => Json(json!({"output": output_json(&d)})).into_response(),
        Err(res) => res,
    }
}

/// An action by name, on a robot or a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    Move { to: String },
    Delete,
    Drain,
    Undrain,
}

impl Action {
    /// A robot's action from its path segment (`move` needs a destination).
    pub fn for_robot(name: &str, to: Option<String>) -> Result<Action, String> {
        match (name, to) {
            ("pause", _) => Ok(Action::Pause),
            ("resume", _) => Ok(Action::Resume),
            ("delete", _) => Ok(Action::Delete),
            ("move", Some(to)) if !to.is_empty() => Ok(Action::Move { to }),
            ("move", _) => Err("move needs a destination slot: {\"to\": \"slot-002\"}".into()),
            _ => Err(format!(
                "no robot action {name:?}: use pause, resume, move or delete"
            )),
        }
    }

    pub fn for_slot(name: &str) -> Result<Action, String> {
        match name {
            "drain" => Ok(Action::Drain),
            "undrain" => Ok(Action::Undrain),
            _ => Err(format!("no slot action {name:?}: use drain or undrain")),
        }
    }

    pub fn word(&self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Move { .. } => "move",
            Action::Delete => "delete",
            Action::Drain => "drain",
            Action::Undrain => "undrain",
        }
    }
}

/// Runs `action` on `target` (a robot's name or a slot's id).
pub async fn perform(
    app: &App,
    target: &str,
    action: &Action,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let (app, target, action, actor) = (
        app.clone(),
        target.to_string(),
        action.clone(),
        actor.clone(),
    );
    super::to_the_end(async move {
        let store = &app.store;
        let done = match &action {
            Action::Pause => actions::set_paused(store, &target, true, &actor).await,
            Action::Resume => actions::set_paused(store, &target, false, &actor).await,
            Action::Move { to } => actions::move_to(store, &target, to, &actor).await,
            Action::Delete => actions::delete(store, &target, &actor).await,
            Action::Drain => actions::set_draining(store, &target, true, &actor).await,
            Action::Undrain => actions::set_draining(store, &target, false, &actor).await,
        };
        app.forget(&target);
        done
    })
    .await
}

/// The status an action's failure answers with.
pub fn failure_status(e: &ActionError) -> StatusCode {
    match e {
        ActionError::NoRobot(_) | ActionError::NoSlot(_) => StatusCode::NOT_FOUND,
        ActionError::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::CONFLICT,
    }
}

/// The answer to a refused credential.
pub fn denied(d: Denied) -> Response {
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

/// Checks the bearer token; the actor is `X-Slotpool-Actor`, else `api`.
fn api_actor(app: &App, headers: &HeaderMap, peer: SocketAddr) -> Result<Actor, Denied> {
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    app.auth
        .bearer(header(header::AUTHORIZATION.as_str()), peer.ip())?;
    Ok(web_actor(header("x-slotpool-actor").unwrap_or("api"), peer))
}

async fn answer(app: &App, target: &str, action: Action, actor: Actor) -> Response {
    match perform(app, target, &action, &actor).await {
        Ok(done) => Json(json!({
            "ok": true, "action": action.word(), "target": done.name,
            "slot": done.slot, "changed": done.changed,
        }))
        .into_response(),
        Err(e) => error(
            failure_status(&e),
            crate::secrets::scrub(&e.to_string()).into_owned(),
        ),
    }
}

#[derive(serde::Deserialize)]
struct MoveBody {
    to: Option<String>,
}

pub async fn robot_action(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let actor = match api_actor(&app, &headers, peer) {
        Ok(a) => a,
        Err(d) => return denied(d),
    };
    let to = if action == "move" {
        match serde_json::from_slice::<MoveBody>(&body) {
            Ok(b) => b.to,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("move takes a JSON body {{\"to\": \"slot-002\"}}: {e}"),
                )
            }
        }
    } else {
        None
    };
    match Action::for_robot(&action, to) {
        Ok(a) if a != Action::Delete => answer(&app, &name, a, actor).await,
        Ok(_) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "delete a robot with DELETE /api/v1/robots/NAME",
        ),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

pub async fn delete_robot(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    match api_actor(&app, &headers, peer) {
        Ok(actor) => answer(&app, &name, Action::Delete, actor).await,
        Err(d) => denied(d),
    }
}

pub async fn slot_action(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let actor = match api_actor(&app, &headers, peer) {
        Ok(a) => a,
        Err(d) => return denied(d),
    };
    match Action::for_slot(&action) {
        Ok(a) => answer(&app, &id, a, actor).await,
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_by_name() {
        assert_eq!(Action::for_robot("pause", None), Ok(Action::Pause));
        assert_eq!(
            Action::for_robot("move", Some("slot-2".into())),
            Ok(Action::Move {
                to: "slot-2".into()
            })
        );
        assert!(Action::for_robot("move", None)
            .unwrap_err()
            .contains("destination"));
        assert!(Action::for_robot("move", Some(String::new())).is_err());
        assert!(Action::for_robot("drain", None).is_err());
        assert_eq!(Action::for_slot("undrain"), Ok(Action::Undrain));
        assert!(Action::for_slot("pause")
            .unwrap_err()
            .contains("drain or undrain"));
    }

    #[test]
    fn query_strings_that_cannot_be_read_are_errors() {
        assert_eq!(
            pairs(Some("q=a%20b&page=2")).unwrap(),
            vec![("q".into(), "a b".into()), ("page".into(), "2".into())]
        );
        assert!(pairs(None).unwrap().is_empty());
    }
}

#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RebalanceBody {
    max_moves: Option<u32>,
    dry_run: Option<bool>,
}

/// `{"ok", "dry_run", "moved", "moves": [{from, to, robots, moved, refused}],
/// "before": {slot: n}, "after": {slot: n}}`.
pub fn rebalance_json(r: &actions::Rebalance) -> Value {
    let counts = |c: &[(String, i64)]| -> serde_json::Map<String, Value> {
        c.iter().map(|(s, n)| (s.clone(), json!(n))).collect()
    };
    json!({
        "ok": true, "dry_run": r.dry_run, "moved": r.moved(),
        "moves": r.moves.iter().map(|p| json!({
            "from": p.from, "to": p.to,
            "robots": p.robots.iter().map(|(_, n)| n).collect::<Vec<_>>(),
            "moved": p.moved, "refused": p.refused,
        })).collect::<Vec<_>>(),
        "before": counts(&r.before), "after": counts(&r.after()),
    })
}

pub async fn rebalance(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let actor = match api_actor(&app, &headers, peer) {
        Ok(a) => a,
        Err(d) => return denied(d),
    };
    let body: RebalanceBody = if body.iter().all(u8::is_ascii_whitespace) {
        RebalanceBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("rebalance takes an optional JSON body {{\"max_moves\": N, \"dry_run\": true}}: {e}"),
                )
            }
        }
    };
    if body.max_moves == Some(0) {
        return error(StatusCode::BAD_REQUEST, "max_moves must be at least 1");
    }
    let store = app.store.clone();
    let planned = super::to_the_end(async move {
        actions::rebalance(
            &store,
            body.max_moves,
            body.dry_run.unwrap_or(false),
            &actor,
        )
        .await
    });
    match planned.await {
        Ok(r) => Json(rebalance_json(&r)).into_response(),
        Err(e) => error(
            failure_status(&e),
            crate::secrets::scrub(&e.to_string()).into_owned(),
        ),
    }
}
