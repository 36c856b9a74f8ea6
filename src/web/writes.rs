//! Writes (every method but `GET` and `HEAD`) before their handlers, so slow bodies
//! cannot take the connections that reads and probes need: the serving layer never
//! evicts a connection with a request in flight ([`crate::serve`]).
//!
//! A write the head alone can refuse is refused before its body is read
//! ([`super::auth::Auth::before_body`]); at most [`MAX_BODIES`] authenticated bodies
//! and [`MAX_LOGIN_BODIES`] login bodies are received at once (beyond that, `503`), so
//! clients without a token can hold up logins but never operators' writes or reads;
//! and a body must arrive whole within [`BODY_TIMEOUT`], else `408`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;

/// Bodies of authenticated writes received at once, at most. With
/// [`MAX_LOGIN_BODIES`], a quarter of the connections, so three quarters stay for
/// reads and probes whatever writers do.
pub(crate) const MAX_BODIES: usize = 12;

/// Bodies of `/login` and `/logout` received at once, at most: those heads carry
/// no credentials, so anyone may hold these.
pub(crate) const MAX_LOGIN_BODIES: usize = crate::serve::MAX_CONNECTIONS / 4 - MAX_BODIES;

/// How long a write's body may take to arrive whole: far more than 16 KiB needs
/// on any link a browser or script uses.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// The middleware: see the module's doc.
pub(crate) async fn before_handlers(State(app): State<App>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let path = req.uri().path().to_string();
    if let Err(d) = app.auth.before_body(&path, req.headers(), peer) {
        return if path.starts_with("/api/") {
            super::answers::denied(d)
        } else {
            super::forms::refused(&app, None, d)
        };
    }
    let (pool, most) = if matches!(path.as_str(), "/login" | "/logout") {
        (&app.login_bodies, MAX_LOGIN_BODIES)
    } else {
        (&app.bodies, MAX_BODIES)
    };
    let api = path.starts_with("/api/");
    let Ok(permit) = pool.clone().try_acquire_owned() else {
        let mut res = refusal(
            api,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{most} writes are already sending their bodies; try again in a moment"),
        );
        res.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(1),
        );
        return res;
    };
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, super::MAX_BODY);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return refusal(
                api,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a request body may hold at most {} bytes", super::MAX_BODY),
            )
        }
        Err(_) => {
            return refusal(
                api,
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        }
    };
    // The body is in; the handler's own wait (an update waiting for its holder)
    // holds no body slot.
    drop(permit);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A refusal before the handler: `{"error": …}` on the API (as its document says),
/// a line of text to a form.
fn refusal(api: bool, status: StatusCode, message: String) -> Response {
    if api {
        super::answers::error(status, message)
    } else {
        (status, format!("{message}\n")).into_response()
    }
}
