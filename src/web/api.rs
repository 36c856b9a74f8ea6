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
    CreatedAnswer, ErrorAnswer, EventsAnswer, Freshness, OutputAnswer, OverviewAnswer,
    RebalanceAnswer, RobotDetailAnswer, RobotsAnswer, SlotsAnswer, WorkersAnswer,
};
use super::auth::Denied;
use super::query::{self, RobotQuery};
use super::{web_actor, App, RobotDetail};
use crate::pool::actions::{self, Actor};
use crate::pool::create::{self, CreateError, NewRobots};

/// The pool at a glance: counts, slots, workers and recent events.
#[utoipa::path(get, path = "/api/v1/overview", operation_id = "get_overview", tag = "pool",
    responses(
        (status = 200, description = "the latest snapshot", body = OverviewAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn overview(State(app): State<App>) -> Response {
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

/// Every slot, judged on the server's clock.
#[utoipa::path(get, path = "/api/v1/slots", operation_id = "list_slots", tag = "pool",
    responses(
        (status = 200, description = "the slots", body = SlotsAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn slots(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(SlotsAnswer {
        fresh,
        slots: &s.slots,
    })
    .into_response()
}

/// The live workers: holders, standbys and overdue ones.
#[utoipa::path(get, path = "/api/v1/workers", operation_id = "list_workers", tag = "pool",
    responses(
        (status = 200, description = "the workers", body = WorkersAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn workers(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(WorkersAnswer {
        fresh,
        workers: &s.workers,
    })
    .into_response()
}

/// The latest events: claims, losses, releases, actions.
#[utoipa::path(get, path = "/api/v1/events", operation_id = "list_events", tag = "pool",
    responses(
        (status = 200, description = "the events, newest first", body = EventsAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn events(State(app): State<App>) -> Response {
    let s = app.snapshot().await;
    let fresh = Freshness::of(&s);
    Json(EventsAnswer {
        fresh,
        events: &s.events,
    })
    .into_response()
}

/// One page of the robots that match; every parameter is optional, may be given
/// once, and counts as absent when empty.
#[utoipa::path(get, path = "/api/v1/robots", operation_id = "list_robots", tag = "robots",
    params(
        ("q" = Option<super::query::TextParam>, Query, description = "text in the name, kind, slot or holder"),
        ("state" = Option<super::query::StateParam>, Query, description = "only robots in this derived state"),
        ("slot" = Option<super::query::TextParam>, Query, description = "only this slot's robots"),
        ("kind" = Option<super::query::TextParam>, Query, description = "only this kind"),
        ("only" = Option<super::query::OnlyParam>, Query, description = "only scheduled, completed or late robots"),
        ("sort" = Option<super::query::SortParam>, Query, description = "the column to sort by (default name)"),
        ("order" = Option<super::query::OrderParam>, Query, description = "ascending (default) or descending"),
        ("page" = Option<super::query::PageParam>, Query, description = "the page, from 1"),
        ("per_page" = Option<super::query::PerPageParam>, Query, description = "rows a page (default 50)"),
    ),
    responses(
        (status = 200, description = "the page", body = RobotsAnswer),
        (status = 400, description = "a parameter unknown, repeated or out of range", body = ErrorAnswer),
        (status = 503, description = "the robot table is still being read (see Retry-After)", body = ErrorAnswer,
            headers(("Retry-After" = u32, description = "seconds"))),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn robots(State(app): State<App>, RawQuery(raw): RawQuery) -> Response {
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

/// One robot: its document, derived state and kept output.
#[utoipa::path(get, path = "/api/v1/robots/{name}", operation_id = "get_robot", tag = "robots",
    params(("name" = String, Path, description = "the robot's name")),
    responses(
        (status = 200, description = "the robot", body = RobotDetailAnswer),
        (status = 404, description = "no robot of that name", body = ErrorAnswer),
        (status = 503, description = "the database did not answer", body = ErrorAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn robot(State(app): State<App>, Path(name): Path<String>) -> Response {
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

/// A robot's kept output lines.
#[utoipa::path(get, path = "/api/v1/robots/{name}/output", operation_id = "get_robot_output", tag = "robots",
    params(("name" = String, Path, description = "the robot's name")),
    responses(
        (status = 200, description = "its output, null when none is kept", body = OutputAnswer),
        (status = 404, description = "no robot of that name", body = ErrorAnswer),
        (status = 503, description = "the database did not answer", body = ErrorAnswer),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn output(State(app): State<App>, Path(name): Path<String>) -> Response {
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
    let body = json_object(body)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("{usage}: {e}"))))?;
    Ok((actor, body))
}

/// An optional body that was not given: nothing, white space, or JSON `null`.
fn no_body(body: &[u8]) -> bool {
    let text = body.trim_ascii();
    text.is_empty() || text == b"null"
}

/// A request body: a JSON object of `T`'s fields. (serde would also take an array
/// of the fields' values, in order, which no client means to send.)
fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("the body must be a JSON object".into());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
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
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateBody {
    /// Another kind, where the robot's context carries over.
    #[serde(default)]
    kind: Option<String>,
    /// The whole new spec (see docs/robots.md).
    #[schema(value_type = Object)]
    spec: serde_json::Map<String, serde_json::Value>,
    /// Check and report the changes, change nothing.
    #[serde(default)]
    dry_run: bool,
    /// How long to wait for the holder's answer, in milliseconds (default 10 s, at
    /// most 30 s).
    #[serde(default)]
    #[schema(maximum = 30_000)]
    wait_ms: Option<u64>,
}

/// What an update did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct UpdateAnswerBody {
    pub(crate) ok: bool,
    pub(crate) robot: String,
    pub(crate) changes: Vec<String>,
    /// True: applied by `worker`; null: a dry run, nothing to change, or no holder
    /// answered in time (the update waits in the robot's document).
    pub(crate) applied: Option<bool>,
    pub(crate) worker: Option<String>,
}

/// `PUT /api/v1/robots/NAME`: changes a robot in place as `robot update` does. `200`
/// with `applied: true` once its holder applied it; `409` with the holder's reason
/// when it refused (nothing changed); `400` for a spec `create` would refuse; `202`
/// when no holder answered within `wait_ms` (the update waits for one).
#[utoipa::path(put, path = "/api/v1/robots/{name}", operation_id = "update_robot", tag = "actions",
    params(("name" = String, Path, description = "the robot's name")),
    request_body = UpdateBody,
    security(("token" = [])),
    responses(
        (status = 200, description = "applied by its holder, a dry run, or nothing to change", body = UpdateAnswerBody),
        (status = 202, description = "no holder answered within wait_ms: the update waits for one", body = UpdateAnswerBody),
        (status = 400, description = "a body or spec that create would refuse", body = ErrorAnswer),
        (status = 404, description = "no robot of that name", body = ErrorAnswer),
        (status = 409, description = "its holder refused it (nothing changed), or the document changed meanwhile", body = ErrorAnswer),
    ))]
pub(crate) async fn update_robot(
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
    if body.wait_ms.is_some_and(|w| w > 30_000) {
        return error(
            StatusCode::BAD_REQUEST,
            "wait_ms must be at most 30000 (30 s)",
        );
    }
    let wait = std::time::Duration::from_millis(body.wait_ms.unwrap_or(10_000));
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
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    /// The robot's name; with count > 1, NAME-1 … NAME-count.
    name: String,
    /// `counter`, `exec`, or a kind registered by your worker build (with unchecked).
    kind: String,
    /// Its spec (see docs/robots.md).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    spec: Option<serde_json::Map<String, serde_json::Value>>,
    /// How many (default 1).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100_000)]
    count: Option<u32>,
    /// Accept a kind this dashboard does not know.
    #[serde(default)]
    unchecked: bool,
}

/// `POST /api/v1/robots`: creates robots as `robot create` does (the same checks and
/// placement), idempotent with the names given: the same request again keeps what
/// exists and creates the rest. `201` when it created any, `200` when all existed.
#[utoipa::path(post, path = "/api/v1/robots", operation_id = "create_robots", tag = "actions",
    request_body = CreateBody,
    security(("token" = [])),
    responses(
        (status = 201, description = "created (some or all)", body = CreateAnswer),
        (status = 200, description = "every name existed already, with this kind and spec", body = CreateAnswer),
        (status = 400, description = "a body, name, kind or spec that is refused", body = ErrorAnswer),
        (status = 409, description = "a name exists with another kind or spec, or no slot can take them", body = ErrorAnswer),
    ))]
pub(crate) async fn create_robots(
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
        by: Default::default(),
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

/// `POST /api/v1/robots/NAME/move`: the destination. Other actions take no body
/// (or `{}`).
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveBody {
    /// The destination slot's id, e.g. slot-002.
    to: Option<String>,
}

/// The actions `POST /api/v1/robots/{name}/{action}` takes.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum RobotAction {
    Pause,
    Resume,
    Restart,
    Trigger,
    Move,
}

/// The actions `POST /api/v1/slots/{id}/{action}` takes.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum SlotAction {
    Drain,
    Undrain,
}

/// An action on one robot (delete is `DELETE /api/v1/robots/{name}`).
#[utoipa::path(post, path = "/api/v1/robots/{name}/{action}", operation_id = "robot_action", tag = "actions",
    params(
        ("name" = String, Path, description = "the robot's name"),
        ("action" = RobotAction, Path, description = "what to do"),
    ),
    request_body(content = Option<MoveBody>, description = "for move only: the destination slot"),
    security(("token" = [])),
    responses(
        (status = 200, description = "done (changed: false when it already was so)", body = ActionAnswer),
        (status = 400, description = "a body that is refused: move without a destination, a destination for another action, unknown fields", body = ErrorAnswer),
        (status = 404, description = "no such robot, destination slot or action", body = ErrorAnswer),
        (status = 405, description = "delete goes through DELETE", body = ErrorAnswer),
        (status = 409, description = "the robot refuses (e.g. a trigger of a robot with no schedule, a move onto a draining slot)", body = ErrorAnswer),
    ))]
pub(crate) async fn robot_action(
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
    // The action's word first (404 for one that does not exist), then the body: none
    // (or `{}`) for every action but move, `{"to": SLOT}` for move.
    if !matches!(
        action.as_str(),
        "pause" | "resume" | "restart" | "trigger" | "move" | "delete"
    ) {
        let e = Action::for_robot(&action, None).expect_err("not an action");
        return error(StatusCode::NOT_FOUND, e);
    }
    if action == "delete" {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "delete a robot with DELETE /api/v1/robots/NAME",
        );
    }
    let given = if no_body(&body) {
        None
    } else {
        match json_object::<MoveBody>(&body) {
            Ok(b) => b.to,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "{action} takes no body, move a JSON body {{\"to\": \"slot-002\"}}: {e}"
                    ),
                )
            }
        }
    };
    if action != "move" && given.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{action} takes no destination (\"to\" is for move)"),
        );
    }
    match Action::for_robot(&action, given) {
        Ok(a) => answer(&app, &name, a, actor).await,
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Deletes a robot; its holder stops it within a tick (a few more while the database is busy).
#[utoipa::path(delete, path = "/api/v1/robots/{name}", operation_id = "delete_robot", tag = "actions",
    params(("name" = String, Path, description = "the robot's name")),
    security(("token" = [])),
    responses(
        (status = 200, description = "deleted", body = ActionAnswer),
        (status = 404, description = "no robot of that name", body = ErrorAnswer),
        (status = 409, description = "the document changed meanwhile", body = ErrorAnswer),
    ))]
pub(crate) async fn delete_robot(
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

/// Drains a slot (its holder stops its robots and hands it back; nobody claims it),
/// or undrains it.
#[utoipa::path(post, path = "/api/v1/slots/{id}/{action}", operation_id = "slot_action", tag = "actions",
    params(
        ("id" = String, Path, description = "the slot's id, e.g. slot-002"),
        ("action" = SlotAction, Path, description = "what to do"),
    ),
    security(("token" = [])),
    responses(
        (status = 200, description = "done", body = ActionAnswer),
        (status = 404, description = "no such slot or action", body = ErrorAnswer),
        (status = 409, description = "the slot refuses", body = ErrorAnswer),
    ))]
pub(crate) async fn slot_action(
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

/// `POST /api/v1/rebalance`: optional.
#[derive(Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RebalanceBody {
    /// Move at most this many robots (run again to continue).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 4_294_967_295_u64)]
    max_moves: Option<u32>,
    /// Print the plan and change nothing.
    dry_run: Option<bool>,
}

/// Evens robots out over the non-draining slots with fenced moves.
#[utoipa::path(post, path = "/api/v1/rebalance", operation_id = "rebalance", tag = "actions",
    request_body(content = Option<RebalanceBody>, description = "optional"),
    security(("token" = [])),
    responses(
        (status = 200, description = "the plan, and the moves made", body = RebalanceAnswer),
        (status = 400, description = "a body that is refused", body = ErrorAnswer),
        (status = 409, description = "a move was refused", body = ErrorAnswer),
    ))]
pub(crate) async fn rebalance(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let actor = match api_actor(&app, &headers, peer) {
        Ok(a) => a,
        Err(d) => return denied(d),
    };
    let body: RebalanceBody = if no_body(&body) {
        RebalanceBody::default()
    } else {
        match json_object(&body) {
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
            actions::Evening::Count,
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
