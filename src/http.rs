//! Read-only HTTP on the worker's port: `GET /healthz`, `GET /metrics`, `GET /status`.
//!
//! A deliberately small HTTP/1.1 responder: one request per connection, GET and HEAD
//! only, bounded request size and read time. Nothing here can change the pool.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::worker::SharedStatus;

const MAX_REQUEST: usize = 8 * 1024;

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub status: SharedStatus,
}

/// Serves until `stop` is cancelled. The listener is bound by the caller, so a port
/// already in use fails before the worker touches the database.
pub async fn serve(listener: TcpListener, state: HttpState, stop: CancellationToken) {
    loop {
        let (conn, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), handle(conn, state)).await;
        });
    }
}

async fn handle(mut conn: TcpStream, state: HttpState) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return respond(&mut conn, 431, "text/plain", "request too large\n", false).await;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return respond(
            &mut conn,
            405,
            "text/plain",
            "read-only: GET /healthz, /metrics, /status\n",
            false,
        )
        .await;
    }
    let (code, kind, body) = route(path, &state);
    respond(&mut conn, code, kind, &body, head_only).await
}

fn route(path: &str, state: &HttpState) -> (u16, &'static str, String) {
    match path {
        "/healthz" => {
            let ok = state.status.lock().expect("status lock").database_ok;
            if ok {
                (200, "text/plain", "ok\n".into())
            } else {
                (503, "text/plain", "database unreachable\n".into())
            }
        }
        "/metrics" => {
            refresh_lease_age(state);
            (200, "text/plain; version=0.0.4", state.metrics.render())
        }
        "/status" => {
            let mut s = state
                .status
                .lock()
                .expect("status lock")
                .clone()
                .with_ages();
            s.robots_running = state.metrics.robots_running.get();
            s.robots_restarting = state.metrics.robots_restarting.get();
            (
                200,
                "application/json",
                // Hidden as everywhere else: a status text may quote a driver error.
                crate::secrets::scrub(&serde_json::to_string_pretty(&s).unwrap_or_default())
                    .into_owned()
                    + "\n",
            )
        }
        _ => (
            404,
            "text/plain",
            "not found: try /healthz, /metrics or /status\n".into(),
        ),
    }
}

fn refresh_lease_age(state: &HttpState) {
    let last = state.status.lock().expect("status lock").oldest_renewal();
    state
        .metrics
        .lease_age_ms
        .set(last.map_or(0, |t| t.elapsed().as_millis() as i64));
}

async fn respond(
    conn: &mut TcpStream,
    code: u16,
    kind: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    conn.write_all(out.as_bytes()).await?;
    conn.shutdown().await
}
