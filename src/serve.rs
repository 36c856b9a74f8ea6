//! Serving HTTP with bounded cost, for the worker's port and the dashboard alike:
//! axum routes on hyper connections that this module admits and closes.
//!
//! Whoever can reach a port must not take what the robots need (descriptors, above
//! all). So at most [`MAX_CONNECTIONS`] are open; a newcomer evicts the longest-idle
//! one, and only a request in flight protects a connection, so idle ones cannot lock
//! out a health probe ([`Connections`]). A request head must arrive within
//! [`HEAD_TIMEOUT`] and fit in [`MAX_REQUEST`] bytes, and every connection is closed
//! after the connection timeout.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// The largest request head accepted (hyper's smallest allowed read buffer).
pub(crate) const MAX_REQUEST: usize = 8 * 1024;

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Which connections are open, and which of them are still waiting for a request:
/// the admission decision, without I/O.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    max: usize,
    next: u64,
    open: usize,
    /// Open with no request in flight, longest idle first.
    idle: VecDeque<u64>,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq)]
pub(crate) enum Admission {
    /// Serve it as `id`; first close `evict`, if any.
    Admit { id: u64, evict: Option<u64> },
    /// Every connection is busy answering: close this one.
    Refuse,
}

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Connections {
            max,
            ..Default::default()
        }
    }

    pub(crate) fn admit(&mut self) -> Admission {
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

    /// `id` sent a request: it is no longer idle.
    pub(crate) fn busy(&mut self, id: u64) {
        self.idle.retain(|&i| i != id);
    }

    /// `id`'s request was answered: idle again, and the last to be evicted.
    pub(crate) fn answered(&mut self, id: u64) {
        self.idle.retain(|&i| i != id);
        self.idle.push_back(id);
    }

    /// `id` closed by itself (not evicted).
    pub(crate) fn closed(&mut self, id: u64) {
        self.idle.retain(|&i| i != id);
        self.open = self.open.saturating_sub(1);
    }

    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
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

    fn answered(&self, id: u64) {
        let mut book = self.book.lock().expect("http gate lock");
        // Not if it was evicted meanwhile (it is no longer counted).
        if book.1.contains_key(&id) {
            book.0.answered(id);
        }
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

/// Serves `app` with this module's bounds (at most [`MAX_CONNECTIONS`], idle ones
/// evicted first, [`HEAD_TIMEOUT`], [`MAX_REQUEST`]), closing each connection after
/// `connection_timeout`. Handlers can read the peer's address with axum's
/// `ConnectInfo<SocketAddr>`.
pub(crate) async fn serve_bounded(
    listener: TcpListener,
    app: Router,
    connection_timeout: Duration,
    stop: CancellationToken,
) {
    let gate = Arc::new(Gate {
        book: Mutex::new((Connections::new(MAX_CONNECTIONS), HashMap::new())),
    });
    loop {
        let (conn, peer) = tokio::select! {
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
        let (app, gate) = (app.clone(), gate.clone());
        tokio::spawn(async move {
            let requests = {
                let gate = gate.clone();
                hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    gate.busy(id);
                    req.extensions_mut().insert(ConnectInfo(peer));
                    let (app, gate) = (app.clone(), gate.clone());
                    async move {
                        let answer = app.oneshot(req).await;
                        gate.answered(id);
                        answer
                    }
                })
            };
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_REQUEST)
                .serve_connection(TokioIo::new(conn), requests);
            tokio::select! {
                _ = evicted.cancelled() => {}
                _ = tokio::time::timeout(connection_timeout, served) => {}
            }
            gate.closed(id);
        });
    }
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

    #[test]
    fn a_kept_alive_connection_is_protected_only_while_its_request_is_in_flight() {
        let mut c = Connections::new(2);
        for id in 0..2 {
            c.admit();
            c.busy(id);
        }
        assert_eq!(c.admit(), Admission::Refuse, "both answering");
        // 0 was answered and keeps its connection open for the next request; 1
        // was answered after it. The probe evicts the one idle longest.
        c.answered(0);
        c.answered(1);
        assert_eq!(
            c.admit(),
            Admission::Admit {
                id: 2,
                evict: Some(0)
            }
        );
        c.busy(1);
        assert_eq!(
            c.admit(),
            Admission::Admit {
                id: 3,
                evict: Some(2)
            },
            "a newcomer that has not sent its request yet is idle too"
        );
    }
}
