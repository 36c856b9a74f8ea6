//! `slotpool web`: the pool in a browser, and the same data as JSON under `/api/v1`.
//!
//! A separate process, read-only unless started with `--allow-actions` and
//! `SLOTPOOL_WEB_TOKEN` ([`auth`]). Every page and API call reads one shared
//! [`snapshot`], refreshed only while someone looks, so viewers add no database
//! queries; a robot's own page reads that robot, cached for one refresh interval.
//! Modules: [`snapshot`], [`query`] (search, sort, pages), [`pages`] (HTML, no inline
//! scripts or styles), [`app`], [`api`] with [`answers`], [`action`] with [`forms`],
//! [`auth`] (token, sessions, CSRF), [`writes`] (write bodies bounded).

pub(crate) mod action;
pub(crate) mod answers;
pub(crate) mod api;
pub(crate) mod app;
pub mod auth;
pub(crate) mod forms;
pub mod openapi;
pub(crate) mod pages;
pub(crate) mod query;
pub(crate) mod snapshot;
pub(crate) mod timeline;
pub(crate) mod writes;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::db::store::Store;
use app::web_actor;
pub(crate) use app::{to_the_end, App, RobotDetail};
use auth::Auth;
use snapshot::Snapshotter;

/// The largest request body accepted (a form or an API action's JSON).
pub(crate) const MAX_BODY: usize = 16 * 1024;

/// A robot's context is shown up to this size; the rest is cut with a note.
pub(crate) const MAX_CONTEXT_SHOWN: usize = 256 * 1024;

#[derive(Debug, Args)]
pub(crate) struct WebArgs {
    /// Address to serve on. The default is reachable from this machine only; any
    /// other address shows the pool (robot names, contexts, output) to everyone who
    /// can reach it: put it behind a proxy with TLS and authentication.
    #[arg(long, default_value = "127.0.0.1:8080", env = "SLOTPOOL_WEB_LISTEN")]
    pub(crate) listen: SocketAddr,
    /// How often the slots, workers and events are read while someone is looking
    /// (the overview updates at this rate). 200ms to 2s.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) refresh: Duration,
    /// How often the robot table is read again while someone is looking: one query
    /// per slot, with rests between. 2s to 1h.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) robots_refresh: Duration,
    /// Allow pause, resume, move, delete, drain, undrain and rebalance, for holders of the token
    /// in SLOTPOOL_WEB_TOKEN (at least 32 characters): `Authorization: Bearer` on the
    /// API, a login in the browser. Without this flag every write is refused.
    #[arg(long)]
    pub(crate) allow_actions: bool,
    /// A host name this dashboard is reached by (repeat for more), e.g. the name a
    /// proxy in front of it serves. Requests whose `Host` names anything else are
    /// refused (421), so a web page cannot rebind its own name to this address and
    /// read the pool through the operator's browser. IP addresses and `localhost`
    /// are always accepted.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub(crate) allowed_hosts: Vec<String>,
}

impl WebArgs {
    /// Checks the settings; returns the token when actions are allowed.
    fn validate(&self, token: Option<String>) -> anyhow::Result<Option<String>> {
        let ms = |d: Duration| d.as_millis();
        if !(200..=2000).contains(&ms(self.refresh)) {
            anyhow::bail!("--refresh must be from 200ms to 2s (the overview promises at most 2s)");
        }
        if !(2_000..=3_600_000).contains(&ms(self.robots_refresh)) {
            anyhow::bail!("--robots-refresh must be from 2s to 1h");
        }
        match (self.allow_actions, token) {
            (false, _) => Ok(None),
            (true, None) => anyhow::bail!(
                "--allow-actions needs a token in SLOTPOOL_WEB_TOKEN (at least {} characters, e.g. `openssl rand -hex 32`)",
                auth::MIN_TOKEN
            ),
            (true, Some(t)) => {
                auth::check_token(&t).map_err(anyhow::Error::msg)?;
                Ok(Some(t.trim().to_string()))
            }
        }
    }
}

/// Every route of the dashboard.
pub(crate) fn router(app: App) -> Router {
    // Writes go through [`writes`] before their handlers; only where the method
    // matches, so a write to a read route is still a 405.
    let w = middleware::from_fn_with_state(app.clone(), writes::before_handlers);
    Router::new()
        .route("/", get(pages::overview))
        .route("/robots", get(pages::robots))
        .route("/robots/{name}", get(pages::robot))
        .route(
            "/robots/{name}/{action}",
            post(forms::robot_action).route_layer(w.clone()),
        )
        .route(
            "/slots/{id}/{action}",
            post(forms::slot_action).route_layer(w.clone()),
        )
        .route("/rebalance", post(forms::rebalance).route_layer(w.clone()))
        .route(
            "/login",
            get(forms::login_form)
                .post(forms::login)
                .route_layer(w.clone()),
        )
        .route("/logout", post(forms::logout).route_layer(w.clone()))
        .route("/static/app.js", get(pages::script))
        .route("/static/app.css", get(pages::style))
        .route("/api/v1/overview", get(api::overview))
        .route("/api/v1/slots", get(api::slots))
        .route("/api/v1/workers", get(api::workers))
        .route("/api/v1/events", get(api::events))
        .route(
            "/api/v1/robots",
            get(api::robots)
                .post(api::create_robots)
                .route_layer(w.clone()),
        )
        .route(
            "/api/v1/robots/{name}",
            get(api::robot)
                .put(api::update_robot)
                .delete(api::delete_robot)
                .route_layer(w.clone()),
        )
        .route("/api/v1/robots/{name}/output", get(api::output))
        .route(
            "/api/v1/robots/{name}/{action}",
            post(api::robot_action).route_layer(w.clone()),
        )
        .route(
            "/api/v1/slots/{id}/{action}",
            post(api::slot_action).route_layer(w.clone()),
        )
        .route("/api/v1/rebalance", post(api::rebalance).route_layer(w))
        .route(openapi::PATH, get(openapi::served))
        .fallback(pages::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(app.clone(), this_host_only))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

/// Refuses a request whose `Host` is not this dashboard (see
/// [`auth::host_allowed`]) before anything reads the pool for it.
async fn this_host_only(
    axum::extract::State(app): axum::extract::State<App>,
    req: Request,
    next: Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if auth::host_allowed(host, &app.hosts) {
        return next.run(req).await;
    }
    let why = "this dashboard answers only to its IP addresses, localhost and --allowed-host names";
    if req.uri().path().starts_with("/api/") {
        // As every error of the API: `{"error": …}` (its OpenAPI document says so).
        return answers::error(axum::http::StatusCode::MISDIRECTED_REQUEST, why);
    }
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::MISDIRECTED_REQUEST,
        format!("{why}\n"),
    )
        .into_response()
}

/// Headers on every answer: no inline script or style may run, no other site may
/// frame the pages, and nothing is sniffed or cached.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h: &mut HeaderMap = res.headers_mut();
    let set = |h: &mut HeaderMap, k: header::HeaderName, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    // same-origin, not no-referrer: with no-referrer a browser sends `Origin: null`
    // on form posts, and the CSRF check needs the real origin.
    set(h, header::REFERRER_POLICY, "same-origin");
    set(h, header::CACHE_CONTROL, "no-store");
    res
}

/// Runs the dashboard until SIGINT or SIGTERM.
pub(crate) async fn run(
    uri: &str,
    policy: crate::db::store::WriteConcernPolicy,
    args: WebArgs,
) -> anyhow::Result<()> {
    let token = std::env::var("SLOTPOOL_WEB_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let token = args.validate(token)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let store = Store::connect_with(uri, policy)
        .await
        .context("connecting to MongoDB (set --mongodb-uri or MONGODB_URI)")?;
    // Two connections at most: the dashboard can never take the server's attention
    // from the workers by opening many.
    let store = store.dedicated(2, 2, "web")?;
    let stop = CancellationToken::new();
    let views = Snapshotter::spawn(
        store.clone(),
        args.refresh,
        args.robots_refresh,
        stop.clone(),
    );
    let actions = token.is_some();
    let app = App::new(
        store,
        views,
        Auth::new(token),
        args.refresh,
        args.allowed_hosts.clone(),
    );
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "slotpool web listens on {addr}: everyone who can reach it can read the pool \
             (robot names, specs, contexts, output){}; put it behind a proxy with TLS and \
             authentication",
            if actions {
                ", and the token travels in clear text without TLS"
            } else {
                ""
            }
        );
    }
    tracing::info!(
        "slotpool web: serving http://{addr}/ ({})",
        if actions {
            "actions allowed with the token"
        } else {
            "read-only"
        }
    );
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let server = crate::serve::serve_bounded(
        listener,
        router(app),
        Duration::from_secs(30),
        stop.child_token(),
    );
    tokio::select! {
        _ = server => {}
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    // No new requests from here (the listener is gone); the actions already writing
    // run to their end, so that no move is cut between its writes.
    stop.cancel();
    let actions = app::in_flight();
    actions.close();
    if !actions.is_empty() {
        tracing::info!(
            actions = actions.len(),
            "slotpool web: stopping once the actions in flight finish (at most {} s)",
            ACTIONS_GRACE.as_secs()
        );
    }
    if tokio::time::timeout(ACTIONS_GRACE, actions.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            actions = actions.len(),
            "slotpool web: stopping with actions still in flight; run them again to finish them"
        );
    }
    Ok(())
}

/// How long a stopping dashboard waits for the actions in flight: under the 30 s a
/// container gets by default to stop (Kubernetes' grace, `docker stop`'s is 10 s).
pub(crate) const ACTIONS_GRACE: Duration = Duration::from_secs(25);

#[cfg(test)]
mod tests {
    use super::*;

    fn args(refresh: &str, robots: &str, allow: bool) -> WebArgs {
        WebArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            refresh: humantime::parse_duration(refresh).unwrap(),
            robots_refresh: humantime::parse_duration(robots).unwrap(),
            allow_actions: allow,
            allowed_hosts: Vec::new(),
        }
    }

    #[test]
    fn settings_are_checked_with_reasons() {
        let token = "x".repeat(40);
        assert_eq!(
            args("1s", "10s", false)
                .validate(Some(token.clone()))
                .unwrap(),
            None
        );
        assert_eq!(
            args("1s", "10s", true)
                .validate(Some(token.clone()))
                .unwrap(),
            Some(token.clone())
        );
        let e = args("1s", "10s", true)
            .validate(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLOTPOOL_WEB_TOKEN"), "{e}");
        let e = args("1s", "10s", true)
            .validate(Some("short".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 32"), "{e}");
        assert!(args("5s", "10s", false).validate(None).is_err());
        assert!(args("1s", "1s", false).validate(None).is_err());
    }
}
