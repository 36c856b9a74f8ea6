//! `/api/v1`: the dashboard's data as JSON, with stable field names (documented in
//! docs/http.md), and its actions for holders of the token.
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
use serde::Serialize;

use super::action::{failure_status, perform, Action};
use super::answers::{
    denied, error, output_json, rebalance_json, robot_json, ActionAnswer, CreateAnswer,
    CreatedAnswer, EventsAnswer, Freshness, OutputAnswer, OverviewAnswer, RobotDetailAnswer,
    RobotsAnswer, SlotsAnswer, WorkersAnswer,
};
use super::auth::Denied;
use super::query::{self, RobotQuery};
use super::{web_actor, App, RobotDetail};
use crate::pool::actions::{self, Actor};
use crate::pool::create::{self, CreateError, NewRobots};

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

pub async fn robots(State(app): State<App>, RawQuery(raw): RawQuery) -> Response {
    let q = match query::pairs(raw.as_deref()).and_then(|p| RobotQuery::parse(&p)) {
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

#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RebalanceBody {
    max_moves: Option<u32>,
    dry_run: Option<bool>,
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
