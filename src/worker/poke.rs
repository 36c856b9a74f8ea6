//! Waking the first standbys when a slot is released: a poke over HTTP instead of a
//! poll of the database.
//!
//! A releasing holder sends the first standbys in line `POST /v1/poke` once its
//! release has landed ([`poke_front`]); polling for releases cost most of an idle
//! pool's requests. A poke only makes the worker survey, at most once per [`spacing`]
//! ([`PokeGate`] merges early ones, never drops them). The database stays the only
//! truth, so a poke needs no secret: a forged flood costs a survey per spacing, and a
//! lost poke costs latency only.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::db::heartbeat::Roster;
use crate::metrics::Metrics;

/// Where a worker takes pokes.
pub(crate) const PATH: &str = "/v1/poke";

/// How long a releasing holder waits for the standbys to answer, all together: a
/// standby on the same network answers in about a millisecond, and a shutdown must
/// not wait on one that is gone.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_millis(300);

/// How far apart poke-driven surveys are at least: 100 ms, or the tick when that is
/// shorter. Short enough that a vacancy right after another is claimed within tens
/// of milliseconds; long enough that a flood of pokes costs the database at most
/// ten surveys a second from each worker.
pub(crate) fn spacing(tick: Duration) -> Duration {
    tick.min(Duration::from_millis(100))
}

/// When a poke arriving at `now` gets its survey: at once if none was started
/// within `every` before, else `every` after the last one.
pub(crate) fn survey_at(last: Option<Instant>, now: Instant, every: Duration) -> Instant {
    match last {
        Some(l) if now.saturating_duration_since(l) < every => l + every,
        _ => now,
    }
}

/// The worker's side: turns pokes into surveys of its loop, at most one per
/// [`spacing`], and never loses one.
#[derive(Debug)]
pub(crate) struct PokeGate {
    every: Duration,
    state: Arc<Mutex<GateState>>,
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct GateState {
    /// When the last poke-driven survey was asked for.
    last: Option<Instant>,
    /// A survey is already set for later: pokes until then are merged into it.
    deferred: bool,
}

impl PokeGate {
    pub(crate) fn new(every: Duration, wake: Arc<Notify>, metrics: Arc<Metrics>) -> Self {
        PokeGate {
            every,
            state: Arc::new(Mutex::new(GateState::default())),
            wake,
            metrics,
        }
    }

    /// Takes one poke; true when it asked for a survey of its own (now, or at the
    /// end of the spacing), false when it was merged into one already due.
    pub(crate) fn poke(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().expect("poke lock");
        if state.deferred {
            self.metrics.pokes_ignored.inc();
            return false;
        }
        let at = survey_at(state.last, now, self.every);
        state.last = Some(at);
        self.metrics.pokes_received.inc();
        if at <= now {
            drop(state);
            // A permit is kept when the loop is busy: it surveys as soon as it waits.
            self.wake.notify_one();
            return true;
        }
        state.deferred = true;
        drop(state);
        let (gate, wake) = (self.state.clone(), self.wake.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            gate.lock().expect("poke lock").deferred = false;
            wake.notify_one();
        });
        true
    }
}

/// Who a poke is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poked {
    /// The first standbys: a slot was released, and a standby takes it.
    Standbys,
    /// The first in line, holders with room behind the standbys: a standby claimed,
    /// and those behind it may have moved up. A holder's place counts the workers
    /// holding fewer slots, so a holder stands behind the standbys until they have
    /// claimed; poked, it re-reads its place at once rather than at the rear's pace,
    /// and surveys at the front's pace in time for its overflow turn.
    Line,
}

/// Pokes the first `n` in line (as `whom` says) at once, and waits up to
/// [`ANSWER_WITHIN`] for their answers. Returns how many answered; what failed is
/// logged and counted, never an error: a lost poke costs latency only.
pub(crate) async fn poke_front(
    line: &Roster,
    me: &str,
    n: u64,
    whom: Poked,
    metrics: &Metrics,
) -> usize {
    let found = line.first_in_line(me, n, whom == Poked::Standbys);
    let standbys = match tokio::time::timeout(ANSWER_WITHIN, found).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!("no one in line to poke: {}", crate::db::store::brief(&e));
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
                tracing::info!(worker = %crate::printable::escape(to), "poke not delivered ({why}); that worker finds the change at its next look");
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
    fn a_poke_is_surveyed_at_once_or_at_the_end_of_the_spacing() {
        let t = Instant::now();
        let every = Duration::from_millis(100);
        assert_eq!(survey_at(None, t, every), t);
        assert_eq!(survey_at(Some(t), t, every), t + every);
        let soon = t + Duration::from_millis(40);
        assert_eq!(survey_at(Some(t), soon, every), t + every);
        assert_eq!(survey_at(Some(t), t + every, every), t + every);
        let later = t + Duration::from_millis(500);
        assert_eq!(survey_at(Some(t), later, every), later);
        assert_eq!(spacing(Duration::from_secs(3)), Duration::from_millis(100));
        assert_eq!(
            spacing(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_pokes_costs_one_survey_a_spacing_and_loses_none() {
        let wake = Arc::new(Notify::new());
        let metrics = Arc::new(Metrics::default());
        let every = Duration::from_millis(100);
        let gate = PokeGate::new(every, wake.clone(), metrics.clone());
        let admitted = (0..1000).filter(|_| gate.poke()).count();
        // One survey now, one at the end of the spacing for all the rest.
        assert_eq!(admitted, 2);
        assert_eq!(metrics.pokes_received.get(), 2);
        assert_eq!(metrics.pokes_ignored.get(), 998);
        let t0 = Instant::now();
        wake.notified().await;
        assert_eq!(Instant::now(), t0, "the first at once");
        wake.notified().await;
        assert_eq!(Instant::now(), t0 + every, "the merged ones at the spacing");
        assert!(
            tokio::time::timeout(Duration::from_secs(10), wake.notified())
                .await
                .is_err(),
            "no more"
        );
        // A vacancy reported later is surveyed at once again.
        assert!(gate.poke());
        tokio::time::timeout(Duration::from_millis(1), wake.notified())
            .await
            .expect("at once");
    }

    #[tokio::test]
    async fn only_an_ip_and_port_is_poked() {
        assert_eq!(
            send("example.com:7700").await,
            Err("not an ip:port address".to_string())
        );
    }
}
