//! `/api/v1`: the dashboard's data as JSON, with stable field names (documented in
//! docs/http.md), and its actions for holders of the token.
//!
//! Every answer that reads the pool carries `now_ms` (the server's clock when the
//! snapshot was read), `age_ms` (how old the snapshot is) and `error` (the last
//! refresh's failure, else null). Errors are `{"error": "..."}` with a status that
//! says what to do: 400 bad parameters, 401 no or wrong token, 403 actions disabled,
//! 404 no such robot, slot or action, 409 the document changed or refuses, 413 too
//! large, 503 the database did not answer or the robot table is still being read.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bson::Bson;
use serde::Serialize;
use serde_json::Value;

use super::auth::Denied;
use super::query::{self, RobotQuery};
use super::snapshot::{EventInfo, RobotRow, SlotInfo, Snapshot, Summary, WorkerInfo};
use super::{web_actor, App, RobotDetail};
use crate::pool::actions::{self, ActionError, Actor, Done};
use crate::pool::create::{self, CreateError, NewRobots};
use crate::pool::view::{RobotNow, RobotState, SlotView};

// The answers of `/api/v1`, one struct each: their field names are the API's promise
// (docs/http.md's table), pinned by `answers_keep_their_field_names` below.

/// `{"error": message}`.
#[derive(Debug, Serialize)]
pub struct ErrorAnswer {
    pub error: String,
}

/// The fields every reading answer starts with: the server's clock when the snapshot
/// was read, how old the snapshot is, and why the last read failed, if it did.
#[derive(Debug, Serialize)]
pub struct Freshness<'a> {
    pub now_ms: i64,
    pub age_ms: Option<u64>,
    pub error: Option<&'a str>,
}

impl<'a> Freshness<'a> {
    fn of(s: &'a Snapshot) -> Self {
        Freshness {
            now_ms: s.now_ms,
            age_ms: s.taken.map(|t| t.elapsed().as_millis() as u64),
            error: s.error.as_deref(),
        }
    }
}

/// `GET /api/v1/overview`.
#[derive(Debug, Serialize)]
pub struct OverviewAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    pub summary: &'a Summary,
    pub slots: &'a [SlotInfo],
    pub workers: &'a [WorkerInfo],
    pub events: &'a [EventInfo],
    pub robots_at_ms: Option<i64>,
}

/// `GET /api/v1/slots`.
#[derive(Debug, Serialize)]
pub struct SlotsAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    pub slots: &'a [SlotInfo],
}

/// `GET /api/v1/workers`.
#[derive(Debug, Serialize)]
pub struct WorkersAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    pub workers: &'a [WorkerInfo],
}

/// `GET /api/v1/events`.
#[derive(Debug, Serialize)]
pub struct EventsAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    pub events: &'a [EventInfo],
}

/// `GET /api/v1/robots`: one page of the robots that match.
#[derive(Debug, Serialize)]
pub struct RobotsAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    pub robots_at_ms: Option<i64>,
    pub matching: usize,
    pub page: usize,
    pub pages: usize,
    pub per_page: usize,
    pub robots: Vec<&'a RobotRow>,
}

/// One robot: its document (relaxed extended JSON, `_id` left out), its state as
/// derived from its slot's lease, and its kept output.
#[derive(Debug, Serialize)]
pub struct RobotAnswer {
    pub robot: Value,
    pub state: RobotState,
    pub holder: Option<String>,
    pub why: Option<String>,
    pub output: Value,
}

/// `GET /api/v1/robots/NAME`.
#[derive(Debug, Serialize)]
pub struct RobotDetailAnswer<'a> {
    #[serde(flatten)]
    pub fresh: Freshness<'a>,
    #[serde(flatten)]
    pub robot: RobotAnswer,
}

/// `GET /api/v1/robots/NAME/output`.
#[derive(Debug, Serialize)]
pub struct OutputAnswer {
    pub output: Value,
}

/// What an action did.
#[derive(Debug, Serialize)]
pub struct ActionAnswer {
    pub ok: bool,
    pub action: &'static str,
    pub target: String,
    pub slot: Option<String>,
    pub changed: bool,
}

/// What a create did: the robots created now with their slots, and how many of the
/// names existed already with the same kind and spec.
#[derive(Debug, Serialize)]
pub struct CreateAnswer {
    pub ok: bool,
    pub created: Vec<CreatedAnswer>,
    pub existing: usize,
}

/// One robot a create placed.
#[derive(Debug, Serialize)]
pub struct CreatedAnswer {
    pub name: String,
    pub slot: String,
}

/// One move of a rebalance.
#[derive(Debug, Serialize)]
pub struct MoveAnswer {
    pub from: String,
    pub to: String,
    pub robots: Vec<String>,
    pub moved: u64,
    pub refused: Option<String>,
}

/// `POST /api/v1/rebalance`.
#[derive(Debug, Serialize)]
pub struct RebalanceAnswer {
    pub ok: bool,
    pub dry_run: bool,
    pub moved: u64,
    pub moves: Vec<MoveAnswer>,
    pub before: BTreeMap<String, i64>,
    pub after: BTreeMap<String, i64>,
}

/// An answer `{"error": message}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let answer = ErrorAnswer {
        error: message.into(),
    };
    (status, Json(answer)).into_response()
}

pub async fn overview(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    Json(OverviewAnswer {
        fresh: Freshness::of(&s),
        summary: &s.summary,
        slots: &s.slots,
        workers: &s.workers,
        events: &s.events,
        robots_at_ms: s.robots_at_ms,
    })
    .into_response()
}

pub async fn slots(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(SlotsAnswer {
        fresh,
        slots: &s.slots,
    })
    .into_response()
}

pub async fn workers(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(WorkersAnswer {
        fresh,
        workers: &s.workers,
    })
    .into_response()
}

pub async fn events(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(EventsAnswer {
        fresh,
        events: &s.events,
    })
    .into_response()
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
    Json(RobotsAnswer {
        fresh: Freshness::of(&s),
        robots_at_ms: s.robots_at_ms,
        matching: page.matching,
        page: page.page,
        pages: page.pages,
        per_page: q.per_page,
        robots: page.rows,
    })
    .into_response()
}

/// A robot's document as JSON, with its state derived from the snapshot's slots.
pub fn robot_json(d: &RobotDetail, s: &Snapshot) -> RobotAnswer {
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
        Ok(d) => Json(RobotDetailAnswer {
            fresh: Freshness::of(&s),
            robot: robot_json(&d, &s),
        })
        .into_response(),
        Err(res) => res,
    }
}

pub async fn output(State(app): State<App>, Path(name): Path<String>) -> Response {
    match detail(&app, &name).await {
        Ok(d) => Json(OutputAnswer {
            output: output_json(&d),
        })
        .into_response(),
        Err(res) => res,
    }
}

/// An action by name, on a robot or a slot.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Pause,
    Resume,
    Restart,
    /// A new spec (and kind), judged by the robot's holder (see
    /// [`actions::update`]).
    Update {
        kind: Option<String>,
        spec: bson::Document,
    },
    Move {
        to: String,
    },
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
            ("restart", _) => Ok(Action::Restart),
            ("delete", _) => Ok(Action::Delete),
            ("move", Some(to)) if !to.is_empty() => Ok(Action::Move { to }),
            ("move", _) => Err("move needs a destination slot: {\"to\": \"slot-002\"}".into()),
            _ => Err(format!(
                "no robot action {name:?}: use pause, resume, restart, move or delete"
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
            Action::Restart => "restart",
            Action::Update { .. } => "update",
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
            Action::Restart => actions::restart(store, &target, &actor).await,
            Action::Update { kind, spec } => {
                actions::update(store, &target, kind.as_deref(), spec.clone(), false, &actor)
                    .await
                    .map(|asked| Done {
                        name: target.clone(),
                        changed: !asked.changes.is_empty(),
                        slot: Some(asked.slot),
                        repaired: false,
                    })
            }
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
        ActionError::Invalid(_) => StatusCode::BAD_REQUEST,
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
        Ok(done) => Json(ActionAnswer {
            ok: true,
            action: action.word(),
            target: done.name,
            slot: done.slot,
            changed: done.changed,
        })
        .into_response(),
        Err(e) => error(
            failure_status(&e),
            crate::secrets::scrub(&e.to_string()).into_owned(),
        ),
    }
}

/// The actor of a request that carries the token, and its JSON body; otherwise the
/// answer to give: the refusal, or `400` with `usage` and the parser's reason.
fn authorized<T: serde::de::DeserializeOwned>(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    body: &[u8],
    usage: &str,
) -> Result<(Actor, T), Box<Response>> {
    let actor = api_actor(app, headers, peer).map_err(|d| Box::new(denied(d)))?;
    let body = serde_json::from_slice(body)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("{usage}: {e}"))))?;
    Ok((actor, body))
}

/// A spec from a JSON body, as it will be stored; `400` when it cannot be.
fn stored_spec(
    spec: &serde_json::Map<String, serde_json::Value>,
) -> Result<bson::Document, Box<Response>> {
    bson::to_document(spec).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("spec cannot be stored: {e}"),
        ))
    })
}

/// `PUT /api/v1/robots/NAME`: the new spec (whole) and, optionally, kind.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    kind: Option<String>,
    spec: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    dry_run: bool,
    /// How long to wait for the holder's answer (default 10 s, at most 30 s).
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// What an update did.
#[derive(Debug, Serialize)]
pub struct UpdateAnswerBody {
    pub ok: bool,
    pub robot: String,
    pub changes: Vec<String>,
    /// True: applied by `worker`; null: a dry run, nothing to change, or no holder
    /// answered in time (the update waits in the robot's document).
    pub applied: Option<bool>,
    pub worker: Option<String>,
}

/// `PUT /api/v1/robots/NAME`: changes a robot in place as `robot update` does. `200`
/// with `applied: true` once its holder applied it; `409` with the holder's reason
/// when it refused (nothing changed); `400` for a spec `create` would refuse; `202`
/// when no holder answered within `wait_ms` (the update waits for one).
pub async fn update_robot(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let usage = r#"update takes a JSON body {"spec": {…}, "kind": "exec"} (kind optional)"#;
    let (actor, body) = match authorized::<UpdateBody>(&app, &headers, peer, &body, usage) {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    let spec = match stored_spec(&body.spec) {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let wait = std::time::Duration::from_millis(body.wait_ms.unwrap_or(10_000).min(30_000));
    let store = app.store.clone();
    let robot = name.clone();
    let asked = super::to_the_end(async move {
        actions::update(
            &store,
            &robot,
            body.kind.as_deref(),
            spec,
            body.dry_run,
            &actor,
        )
        .await
    })
    .await;
    app.forget(&name);
    let asked = match asked {
        Ok(a) => a,
        Err(e) => {
            return error(
                failure_status(&e),
                crate::secrets::scrub(&e.to_string()).into_owned(),
            )
        }
    };
    let answer = |applied: Option<bool>, worker: Option<String>| UpdateAnswerBody {
        ok: true,
        robot: name.clone(),
        changes: asked.changes.clone(),
        applied,
        worker,
    };
    let Some(id) = asked.id else {
        return Json(answer(None, None)).into_response();
    };
    let until = std::time::Instant::now() + wait;
    loop {
        match actions::update_answer(&app.store, &name, id).await {
            Ok(Some(a)) if a.applied => return Json(answer(Some(true), a.worker)).into_response(),
            Ok(Some(a)) => {
                return error(
                    StatusCode::CONFLICT,
                    format!(
                        "update refused by {}: {}; nothing changed",
                        a.worker.as_deref().unwrap_or("its holder"),
                        crate::secrets::scrub(a.why.as_deref().unwrap_or("no reason given"))
                    ),
                )
            }
            Ok(None) if std::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await
            }
            Ok(None) => return (StatusCode::ACCEPTED, Json(answer(None, None))).into_response(),
            Err(e) => {
                return error(
                    failure_status(&e),
                    crate::secrets::scrub(&e.to_string()).into_owned(),
                )
            }
        }
    }
}

/// `POST /api/v1/robots`: what `robot create` takes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    kind: String,
    #[serde(default)]
    spec: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    unchecked: bool,
}

/// `POST /api/v1/robots`: creates robots as `robot create` does (the same checks and
/// placement), idempotent with the names given: the same request again keeps what
/// exists and creates the rest. `201` when it created any, `200` when all existed.
pub async fn create_robots(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let usage =
        r#"create takes a JSON body {"name": "bot", "kind": "counter", "spec": {…}, "count": 1}"#;
    let (actor, body) = match authorized::<CreateBody>(&app, &headers, peer, &body, usage) {
        Ok(found) => found,
        Err(refused) => return *refused,
    };
    let count = body.count.unwrap_or(1);
    if count == 0 || count > create::MAX_COUNT {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "count must be between 1 and {}, got {count}",
                create::MAX_COUNT
            ),
        );
    }
    let spec = match stored_spec(&body.spec.unwrap_or_default()) {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let req = NewRobots {
        names: NewRobots::names(&body.name, count),
        kind: body.kind,
        spec,
        unchecked: body.unchecked,
    };
    let store = app.store.clone();
    let made = super::to_the_end(async move { create::create(&store, &req, &actor).await }).await;
    match made {
        Ok(done) => {
            let status = if done.created.is_empty() {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            let answer = CreateAnswer {
                ok: true,
                existing: done.existing,
                created: done
                    .created
                    .into_iter()
                    .map(|(name, slot)| CreatedAnswer { name, slot })
                    .collect(),
            };
            (status, Json(answer)).into_response()
        }
        Err(e) => {
            let status = match &e {
                CreateError::Invalid(_) => StatusCode::BAD_REQUEST,
                CreateError::Conflict(_) | CreateError::Placement(_) => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut text = e.to_string();
            if e.again() {
                text.push_str(". Send the same request again (once the database is back): robots that exist are kept and the rest are created.");
            }
            error(status, crate::secrets::scrub(&text).into_owned())
        }
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
    use crate::pool::view::{SlotState, WorkerRole};

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
            }],
            workers: vec![WorkerInfo {
                id: "10.0.0.5:7700".into(),
                role: WorkerRole::Holder,
                slot: Some("slot-001".into()),
                held: Some(1),
                last_seen_ms: Some(100),
                version: Some("0.1.0".into()),
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
            ])
        );
        assert_eq!(
            keys(&snap.workers[0]),
            sorted(&["id", "role", "slot", "held", "last_seen_ms", "version"])
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
            ])
        );
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
pub fn rebalance_json(r: &actions::Rebalance) -> RebalanceAnswer {
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
