//! Read-only HTTP on the worker's port: `GET /healthz`, `GET /livez`, `GET /metrics`, `GET /status`,
//! served by axum on hyper within [`crate::serve`]'s bounds (a connection cap that
//! evicts the idle first, a head timeout, a size limit). Nothing here can change the
//! pool: those routes answer `GET` and `HEAD` only, anything else is `405`. The one
//! `POST`, `/v1/poke`, changes nothing either: it asks this worker to read the
//! slots once, at most once per 100 ms (see [`crate::worker::poke`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::worker::status::SharedStatus;

/// How long a connection may stay open at all.
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: SharedStatus,
    /// Takes `POST /v1/poke` (None: answered `404`, as by a program embedding
    /// the worker without it).
    pub(crate) poke: Option<Arc<crate::worker::poke::PokeGate>>,
}

/// The worker's routes.
pub(crate) fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz).fallback(read_only))
        .route("/livez", get(livez).fallback(read_only))
        .route("/metrics", get(metrics).fallback(read_only))
        .route("/status", get(status).fallback(read_only))
        .route(crate::worker::poke::PATH, post(poke).fallback(post_only))
        .fallback(unknown)
        .with_state(state)
}

/// Serves the worker's routes until `stop` is cancelled. The listener is bound by
/// the caller, so a port already in use fails before the worker touches the database.
pub(crate) async fn serve(listener: TcpListener, state: HttpState, stop: CancellationToken) {
    crate::serve::serve_bounded(listener, router(state), CONNECTION_TIMEOUT, stop).await
}

async fn healthz(State(state): State<HttpState>) -> Response {
    if state.status.lock().expect("status lock").database_ok {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n").into_response()
    }
}

/// Whether the worker's own loop goes on (see [`crate::worker::status::stuck_after`]):
/// a liveness probe's question. Unlike `/healthz` it does not depend on the database,
/// so an outage never has every worker restarted at once.
async fn livez(State(state): State<HttpState>) -> Response {
    let (since, tick) = {
        let s = state.status.lock().expect("status lock");
        (s.since_last_round(), Duration::from_millis(s.tick_ms))
    };
    if crate::worker::status::loop_alive(since, tick) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the worker's loop has not finished a round for {} s\n",
                since.as_secs()
            ),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<HttpState>) -> Response {
    let last = state.status.lock().expect("status lock").oldest_renewal();
    state
        .metrics
        .lease_age
        .set(last.map_or(0.0, |t| t.elapsed().as_secs_f64()));
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

async fn status(State(state): State<HttpState>) -> Response {
    let mut s = state
        .status
        .lock()
        .expect("status lock")
        .clone()
        .with_ages();
    s.robots_running = state.metrics.robots_running.get();
    s.robots_restarting = state.metrics.robots_restarting.get();
    // Hidden as everywhere else: a status text may quote a driver error.
    let body =
        crate::secrets::scrub(&serde_json::to_string_pretty(&s).unwrap_or_default()).into_owned();
    ([(header::CONTENT_TYPE, "application/json")], body + "\n").into_response()
}

/// Answers `202` either way: a poke is idempotent, and one within the tick already
/// asked for the survey this one would.
async fn poke(State(state): State<HttpState>) -> Response {
    let Some(gate) = &state.poke else {
        return (StatusCode::NOT_FOUND, "this worker takes no pokes\n").into_response();
    };
    let body = if gate.poke() {
        "surveying the slots\n"
    } else {
        "already surveying this tick\n"
    };
    (StatusCode::ACCEPTED, body).into_response()
}

async fn post_only() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "POST /v1/poke: asks this worker to survey the slots (at most once per 100 ms)\n",
    )
        .into_response()
}

async fn read_only() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "GET, HEAD")],
        "read-only: GET /healthz, /livez, /metrics, /status\n",
    )
        .into_response()
}

async fn unknown(method: Method) -> Result<Response, Infallible> {
    if method != Method::GET && method != Method::HEAD {
        return Ok(read_only().await);
    }
    Ok((
        StatusCode::NOT_FOUND,
        "not found: try /healthz, /livez, /metrics or /status\n",
    )
        .into_response())
}
