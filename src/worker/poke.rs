//! Waking the first standbys when a slot is released: a poke over HTTP instead of a
//! poll of the database.
//!
//! A released slot is free at once, but a standby learns of it only at its next
//! survey (a tick away at the front of the line). Polling for releases found them
//! within 100 ms, at the price of ten reads a second from the first standby,
//! whatever the pool did: most of what an idle pool asked of its database. The
//! releasing holder knows better: the standbys' heartbeats carry their `ip:port`,
//! so once its release has landed it sends the first standbys in line (up to
//! `--watchers`) `POST /v1/poke` on their worker ports ([`poke_front`]).
//!
//! A poke can do one thing only: make the worker survey the slots at once, and at
//! most once a tick however many arrive ([`PokeGate`]). The database stays the only
//! truth (the survey reads it; the claim is the usual compare-and-set), so a poke
//! needs no secret and a forged one costs one survey a tick at most. A poke that is
//! lost (the standby's port filtered, the standby dead or stopped) costs latency
//! only: the standby finds the slot at its next survey, as before pokes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::worker::standby_line::Line;

/// Where a worker takes pokes.
pub const PATH: &str = "/v1/poke";

/// How long a releasing holder waits for the standbys to answer, all together: a
/// standby on the same network answers in about a millisecond, and a shutdown must
/// not wait on one that is gone.
pub const ANSWER_WITHIN: Duration = Duration::from_millis(300);

/// Whether a poke arriving at `now` is due a survey: the first one, or the first
/// `every` after the last one admitted.
pub fn due(last: Option<Instant>, now: Instant, every: Duration) -> bool {
    last.is_none_or(|l| now.saturating_duration_since(l) >= every)
}

/// The worker's side: admits at most one poke a tick, and wakes the worker's loop
/// for it (the loop then surveys at once).
#[derive(Debug)]
pub struct PokeGate {
    every: Duration,
    last: Mutex<Option<Instant>>,
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl PokeGate {
    pub fn new(every: Duration, wake: Arc<Notify>, metrics: Arc<Metrics>) -> Self {
        PokeGate {
            every,
            last: Mutex::new(None),
            wake,
            metrics,
        }
    }

    /// Takes one poke; true when it asked for a survey, false when one was asked
    /// for within the last tick already.
    pub fn poke(&self) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().expect("poke lock");
        if !due(*last, now, self.every) {
            self.metrics.pokes_ignored.inc();
            return false;
        }
        *last = Some(now);
        drop(last);
        self.metrics.pokes_received.inc();
        // A permit is kept when the loop is busy: it surveys as soon as it waits.
        self.wake.notify_one();
        true
    }
}

/// Pokes the first standbys in line at once, and waits up to [`ANSWER_WITHIN`] for
/// their answers. Returns how many answered; what failed is logged and counted,
/// never an error: a lost poke costs latency only.
pub async fn poke_front(line: &Line, me: &str, n: u64, metrics: &Metrics) -> usize {
    let standbys = match tokio::time::timeout(ANSWER_WITHIN, line.front_standbys(me, n)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!("no standbys to poke: {}", crate::db::store::brief(&e));
            return 0;
        }
        Err(_) => return 0,
    };
    let sends = standbys.iter().map(|to| async move {
        let sent = tokio::time::timeout(ANSWER_WITHIN, send(to)).await;
        let result = sent
            .unwrap_or_else(|_| Err(format!("no answer within {} ms", ANSWER_WITHIN.as_millis())));
        (to, result)
    });
    let mut answered = 0;
    for (to, result) in futures::future::join_all(sends).await {
        match result {
            Ok(()) => {
                answered += 1;
                metrics.pokes_sent.inc();
            }
            Err(why) => {
                metrics.pokes_lost.inc();
                tracing::info!(standby = %crate::printable::escape(to), "poke not delivered ({why}); the standby finds the released slot at its next survey");
            }
        }
    }
    answered
}

/// One `POST /v1/poke`. Only an `ip:port` is poked (a heartbeat's `_id` is written
/// by whoever can write to the database: no name is resolved, nothing but this one
/// empty request is ever sent).
async fn send(to: &str) -> Result<(), String> {
    let addr: SocketAddr = to
        .parse()
        .map_err(|_| "not an ip:port address".to_string())?;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::post(PATH)
        .header(hyper::header::HOST, to)
        .body(String::new())
        .map_err(|e| e.to_string())?;
    let answer = sender.send_request(request).await;
    driver.abort();
    let status = answer.map_err(|e| format!("HTTP: {e}"))?.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_poke_a_tick_is_due() {
        let t = Instant::now();
        let tick = Duration::from_secs(1);
        assert!(due(None, t, tick));
        assert!(!due(Some(t), t, tick));
        assert!(!due(Some(t), t + Duration::from_millis(999), tick));
        assert!(due(Some(t), t + tick, tick));
    }

    #[tokio::test]
    async fn a_flood_of_pokes_wakes_the_loop_once_a_tick() {
        let wake = Arc::new(Notify::new());
        let metrics = Arc::new(Metrics::default());
        let gate = PokeGate::new(Duration::from_secs(3600), wake.clone(), metrics.clone());
        let admitted = (0..1000).filter(|_| gate.poke()).count();
        assert_eq!(admitted, 1);
        assert_eq!(metrics.pokes_received.get(), 1);
        assert_eq!(metrics.pokes_ignored.get(), 999);
        // One permit waits for the loop; none more.
        tokio::time::timeout(Duration::from_secs(1), wake.notified())
            .await
            .expect("woken once");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), wake.notified())
                .await
                .is_err(),
            "woken only once"
        );
    }

    #[tokio::test]
    async fn only_an_ip_and_port_is_poked() {
        assert_eq!(
            send("example.com:7700").await,
            Err("not an ip:port address".to_string())
        );
    }
}
