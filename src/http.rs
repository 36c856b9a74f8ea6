//! Read-only HTTP on the worker's port: `GET /healthz`, `GET /metrics`, `GET /status`.
//!
//! A deliberately small HTTP/1.1 responder: one request per connection, GET and HEAD
//! only, bounded request size and read time. Nothing here can change the pool.
//!
//! The port is open to whoever can reach it, so it must not cost the worker what its
//! robots need: at most [`MAX_CONNECTIONS`] connections are open at once (about 1,500
//! idle ones would otherwise take every descriptor at the common limit of 1,024, and
//! robots could not start). A connection must send its request within
//! [`HEAD_TIMEOUT`] and is closed after [`CONNECTION_TIMEOUT`] in any case. When all
//! are taken, a new connection evicts the oldest one that has not sent its request
//! yet, so idle connections cannot lock out a health probe; when none is idle, the
//! newcomer is closed at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::worker::SharedStatus;

const MAX_REQUEST: usize = 8 * 1024;

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection may stay open at all.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub status: SharedStatus,
}

/// Which connections are open, and which of them are still waiting for a request:
/// the admission decision, without I/O.
#[derive(Debug, Default)]
pub struct Connections {
    max: usize,
    next: u64,
    open: usize,
    /// Open and not yet past their request head, oldest first.
    idle: VecDeque<u64>,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Serve it as `id`; first close `evict`, if any.
    Admit { id: u64, evict: Option<u64> },
    /// Every connection is busy answering: close this one.
    Refuse,
}

impl Connections {
    pub fn new(max: usize) -> Self {
        Connections {
            max,
            ..Default::default()
        }
    }

    pub fn admit(&mut self) -> Admission {
        let evict = if self.open >= self.max {
            match self.idle.pop_front() {
                Some(old) => {
                    self.open -= 1;
                    Some(old)
                }
                None => return Admission::Refuse,
            }
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        self.open += 1;
        self.idle.push_back(id);
        Admission::Admit { id, evict }
    }

    /// `id` sent its request: it is no longer idle.
    pub fn busy(&mut self, id: u64) {
        self.idle.retain(|&i| i != id);
    }

    /// `id` closed by itself (not evicted).
    pub fn closed(&mut self, id: u64) {
        self.idle.retain(|&i| i != id);
        self.open = self.open.saturating_sub(1);
    }

    pub fn open(&self) -> usize {
        self.open
    }
}

/// The open connections and how to close each.
struct Gate {
    book: Mutex<(Connections, HashMap<u64, CancellationToken>)>,
}

impl Gate {
    fn admit(&self) -> Option<(u64, CancellationToken)> {
        let mut book = self.book.lock().expect("http gate lock");
        let (conns, tokens) = &mut *book;
        match conns.admit() {
            Admission::Refuse => None,
            Admission::Admit { id, evict } => {
                if let Some(old) = evict.and_then(|old| tokens.remove(&old)) {
                    old.cancel();
                }
                let token = CancellationToken::new();
                tokens.insert(id, token.clone());
                Some((id, token))
            }
        }
    }

    fn busy(&self, id: u64) {
        self.book.lock().expect("http gate lock").0.busy(id);
    }

    /// Called as a connection's task ends, evicted or not.
    fn closed(&self, id: u64) {
        let mut book = self.book.lock().expect("http gate lock");
        // An evicted connection was already counted out when it was evicted.
        if book.1.remove(&id).is_some() {
            book.0.closed(id);
        }
    }
}

/// Serves until `stop` is cancelled. The listener is bound by the caller, so a port
/// already in use fails before the worker touches the database.
pub async fn serve(listener: TcpListener, state: HttpState, stop: CancellationToken) {
    let gate = Arc::new(Gate {
        book: Mutex::new((Connections::new(MAX_CONNECTIONS), HashMap::new())),
    });
    loop {
        let (conn, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    tracing::debug!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some((id, evicted)) = gate.admit() else {
            drop(conn);
            continue;
        };
        let state = state.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = evicted.cancelled() => {}
                _ = tokio::time::timeout(CONNECTION_TIMEOUT, handle(conn, state, || gate.busy(id))) => {}
            }
            gate.closed(id);
        });
    }
}

async fn handle(
    mut conn: TcpStream,
    state: HttpState,
    got_request: impl FnOnce(),
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read_head = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok(false);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_REQUEST {
                return Ok(true);
            }
        }
        Ok::<bool, std::io::Error>(true)
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read_head).await {
        Ok(Ok(true)) => got_request(),
        _ => return Ok(()),
    }
    if buf.len() > MAX_REQUEST {
        return respond(&mut conn, 431, "text/plain", "request too large\n", false).await;
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
            (200, crate::metrics::CONTENT_TYPE, state.metrics.render())
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
        .lease_age
        .set(last.map_or(0.0, |t| t.elapsed().as_secs_f64()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_cap_then_evicts_the_oldest_idle() {
        let mut c = Connections::new(2);
        assert_eq!(c.admit(), Admission::Admit { id: 0, evict: None });
        assert_eq!(c.admit(), Admission::Admit { id: 1, evict: None });
        assert_eq!(
            c.admit(),
            Admission::Admit {
                id: 2,
                evict: Some(0)
            }
        );
        assert_eq!(c.open(), 2);
        // Busy ones (answering) are never evicted.
        c.busy(1);
        c.busy(2);
        assert_eq!(c.admit(), Admission::Refuse);
        c.closed(1);
        assert_eq!(c.admit(), Admission::Admit { id: 3, evict: None });
        assert_eq!(c.open(), 2);
        assert_eq!(
            c.admit(),
            Admission::Admit {
                id: 4,
                evict: Some(3)
            }
        );
    }
}
