//! Taking this worker's `ip:port` identity when another process's heartbeat is
//! still believed there.
//!
//! Two live processes must never share an identity, yet waiting out a dead
//! predecessor's heartbeat would delay every restart by a minute. So the worker
//! [`probe`]s its own address: if it answers itself, the predecessor is gone and the
//! identity is taken with a compare-and-set on the heartbeat as read (unless a slot
//! is still leased under it); else it waits or refuses. Loopback counts only within
//! one [`network_namespace`]. See docs/internals.md, "Taking over a worker's identity".

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::db::heartbeat::{BeatError, Predecessor};
use crate::worker::line_keeper::{Beaten, Holdings, LineKeeper};
use crate::worker::standby_line::beat_pace;

use http_body_util::BodyExt;

/// How long the worker waits for its own address to answer.
pub(crate) const PROBE_WITHIN: Duration = Duration::from_millis(1000);

/// The most of `/status` read from the address: a worker's answer is well under it.
const STATUS_LIMIT: usize = 64 * 1024;

/// Who answered at this worker's own advertised address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AtAddress {
    /// This process: the address leads here.
    Me,
    /// The process whose heartbeat holds the identity: it lives at this address.
    Predecessor,
    /// Nobody, or a process that is neither (an address that does not lead here).
    Elsewhere,
}

/// What to do about a heartbeat under this identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Replace it (compare-and-set on it as first read).
    TakeOver,
    /// Wait for it to lapse.
    Wait,
    /// A live second process: refuse to run, for this reason.
    Refuse(&'static str),
}

/// Decides about the heartbeat under this identity: `first` as first read, `now` as
/// read this time, `at` who answers at the address, `conclusive` whether this
/// process answering there proves the predecessor gone from it (see
/// [`answer_is_conclusive`]), `leased` whether a slot is still leased under the
/// identity, `past_deadline` whether the wait is over (the first read's time left,
/// and a tick).
pub(crate) fn verdict(
    first: &Predecessor,
    now: &Predecessor,
    at: &AtAddress,
    conclusive: bool,
    leased: bool,
    past_deadline: bool,
) -> Verdict {
    // Any beat rewrites `alive_until_ms`, a slower pace's too (it is believed for
    // longer) and a faster one's (for less): whichever, the process lives.
    if now.instance != first.instance || now.alive_until_ms != first.alive_until_ms {
        return Verdict::Refuse("its heartbeat was renewed while this one waited");
    }
    match at {
        AtAddress::Predecessor => Verdict::Refuse("it answers at this worker's address"),
        AtAddress::Me if conclusive && !leased => Verdict::TakeOver,
        _ if past_deadline => Verdict::Refuse("its heartbeat is still believed"),
        _ => Verdict::Wait,
    }
}

/// Whether this process answering at its own advertised address proves that no
/// other process is there: for a routable address, yes (one address, one host on a
/// network); for a loopback one, only when the predecessor beat from this very
/// network namespace (`mine` and `theirs` as [`network_namespace`] gives them).
pub(crate) fn answer_is_conclusive(
    loopback: bool,
    mine: Option<&str>,
    theirs: Option<&str>,
) -> bool {
    !loopback || matches!((mine, theirs), (Some(a), Some(b)) if a == b)
}

/// This process's network namespace, told apart across hosts and containers: the
/// kernel's boot id and the namespace's inode (`/proc/self/ns/net`). None where
/// either cannot be read.
pub(crate) fn network_namespace() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/net").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.to_string_lossy()))
}

/// Asks `addr` (this worker's advertised address) for its `/status` and compares the
/// instance it gives with `mine` and the predecessor's. Anything but a clear answer
/// within [`PROBE_WITHIN`] is [`AtAddress::Elsewhere`].
pub(crate) async fn probe(addr: SocketAddr, mine: &str, predecessor: &str) -> AtAddress {
    let answered = tokio::time::timeout(PROBE_WITHIN, instance_at(addr))
        .await
        .ok()
        .flatten();
    match answered {
        Some(i) if i == mine => AtAddress::Me,
        Some(i) if i == predecessor => AtAddress::Predecessor,
        Some(_) | None => AtAddress::Elsewhere,
    }
}

/// The `instance` of the worker answering `GET /status` at `addr`.
async fn instance_at(addr: SocketAddr) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    // Aborted however this ends: a probe given up on (a frozen process that took
    // the connection but never answers) must not leave it open.
    let _driver = AbortOnDrop(tokio::spawn(connection));
    let request = hyper::Request::get("/status")
        .header(hyper::header::HOST, addr.to_string())
        .body(String::new())
        .ok()?;
    let answer = sender.send_request(request).await.ok();
    let body = match answer {
        Some(a) if a.status().is_success() => {
            http_body_util::Limited::new(a.into_body(), STATUS_LIMIT)
                .collect()
                .await
                .ok()
                .map(|b| b.to_bytes())
        }
        _ => None,
    };
    let status: serde_json::Value = serde_json::from_slice(&body?).ok()?;
    status.get("instance")?.as_str().map(str::to_string)
}

/// A task aborted when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// === Taking the identity ===

/// Why a worker stopped by itself rather than on request.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Another live process advertises the same `ip:port`. Both would count as
    /// one worker in the line, in hand-backs and on the dashboard, so the one that
    /// finds the other refuses to run (at start, before it claims anything; or
    /// later, when its own heartbeat lapsed and the other took the identity over).
    #[error(transparent)]
    IdentityInUse(BeatError),
    /// The server refused the first heartbeat outright (not "not now"): sent again,
    /// it would be refused again, so the worker stops rather than retry for ever.
    #[error("the database server refused this worker's first heartbeat: {0}")]
    Refused(crate::db::store::Refusal),
}

/// The other process's heartbeat under this identity, as this worker first found
/// it, and when waiting for it is over.
struct FirstSeen {
    predecessor: Option<Predecessor>,
    deadline: Instant,
    /// Whether the wait was logged.
    warned: bool,
}

/// Beats once before anything else, so a second process with this worker's
/// `ip:port` is found before it claims a slot. Another process's heartbeat there is
/// judged as [`verdict`] says: a predecessor gone from this worker's own address,
/// holding no lease, is replaced at once; one that answers there, or beats again
/// meanwhile, is a live second worker, and this one refuses to run; otherwise it is
/// waited out, as long as it was still believed when first seen.
pub(crate) async fn take_identity(line: &mut LineKeeper) -> Result<(), WorkerError> {
    let mut first: Option<FirstSeen> = None;
    let tick = line.tick();
    while !line.shutdown().is_cancelled() {
        let pace = beat_pace(line.place(), tick);
        let pause = match line.beat(Holdings::NONE, pace).await {
            Beaten::Written => {
                line.beaten(Vec::new(), pace);
                return Ok(());
            }
            Beaten::Failed(why) => {
                line.db_failed(&format!("the first heartbeat was not written: {why}"));
                tick
            }
            Beaten::Refused(r) => return Err(WorkerError::Refused(r)),
            Beaten::InUse(e) => match judge_predecessor(line, e, &mut first, pace).await? {
                Some(pause) => pause,
                None => return Ok(()),
            },
        };
        line.round_done();
        let (shutdown, clock) = (line.shutdown().clone(), line.clock().clone());
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = clock.sleep(pause) => {}
        }
    }
    Ok(())
}

/// One look at the other process's heartbeat under this identity (`e`, as this
/// beat found it): `None` once this worker took the identity over, else how long to
/// wait before the next look; an error when it must not run.
async fn judge_predecessor(
    line: &mut LineKeeper,
    e: BeatError,
    first: &mut Option<FirstSeen>,
    pace: Duration,
) -> Result<Option<Duration>, WorkerError> {
    let tick = line.tick();
    let (left, now_seen) = match &e {
        BeatError::IdentityInUse {
            left_ms,
            predecessor,
            ..
        } => (
            Duration::from_millis((*left_ms).max(0) as u64),
            predecessor.clone(),
        ),
        BeatError::Db(_) => return Ok(Some(tick)),
    };
    let (identity, instance, netns) = line.who();
    let (me, addr) = (identity.to_string(), identity.socket_addr());
    let (instance, netns) = (instance.to_string(), netns.map(str::to_string));
    let now = line.clock().now();
    let seen = first.get_or_insert_with(|| FirstSeen {
        predecessor: now_seen.clone(),
        deadline: now + left + tick,
        warned: false,
    });
    let past_deadline = now >= seen.deadline;
    let until_deadline = seen.deadline.saturating_duration_since(now);
    let (Some(was), Some(is)) = (seen.predecessor.clone(), now_seen) else {
        // A heartbeat that names no process: only waiting it out is left.
        if past_deadline {
            tracing::error!(worker = %me, "{e}");
            return Err(WorkerError::IdentityInUse(e));
        }
        if !std::mem::replace(&mut seen.warned, true) {
            tracing::warn!(worker = %me, "{e}; waiting {} ms for it to lapse", left.as_millis());
        }
        let next = (left + Duration::from_millis(50)).min(until_deadline);
        return Ok(Some(next.max(Duration::from_millis(50))));
    };
    let at = probe(addr, &instance, &is.instance).await;
    let conclusive = answer_is_conclusive(
        addr.ip().is_loopback(),
        netns.as_deref(),
        is.netns.as_deref(),
    );
    let leased = at == AtAddress::Me
        && conclusive
        && !matches!(
            tokio::time::timeout(
                line.bookkeeping_timeout(false),
                line.protocol().leased_under_identity()
            )
            .await,
            Ok(Ok(false))
        );
    match verdict(&was, &is, &at, conclusive, leased, past_deadline) {
        Verdict::TakeOver => {
            if line.take_over(&is, pace).await {
                tracing::info!(worker = %me, predecessor = %is.instance, "took over this address's identity from a predecessor gone from it: this process answers at the address, and no slot is leased under it");
                line.beaten(Vec::new(), pace);
                return Ok(None);
            }
            // It beat meanwhile (the next look refuses), or the write failed or was
            // refused: look again a tick on, not at once.
            Ok(Some(tick))
        }
        Verdict::Refuse(why) => {
            tracing::error!(worker = %me, "{e}: {why}");
            Err(WorkerError::IdentityInUse(e))
        }
        Verdict::Wait => {
            if !seen.warned {
                seen.warned = true;
                let about = if at == AtAddress::Me && conclusive {
                    "a slot is still leased under it: waiting for that lease to run out or the heartbeat to lapse"
                } else {
                    "its address does not lead back to this process, so it may be alive: waiting for it to lapse, in case it was this worker's predecessor"
                };
                tracing::warn!(worker = %me, "{e}; {about} (at most {} ms)", until_deadline.as_millis());
            }
            // A lease runs out within one: look again each tick. Otherwise only the
            // heartbeat's own lapse can change the answer.
            let next = if at == AtAddress::Me && conclusive {
                tick
            } else {
                left + Duration::from_millis(50)
            };
            Ok(Some(
                next.min(until_deadline).max(Duration::from_millis(50)),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(instance: &str, until: i64) -> Predecessor {
        Predecessor {
            instance: instance.into(),
            alive_until_ms: until,
            netns: None,
        }
    }

    #[test]
    fn a_predecessor_gone_from_the_address_is_taken_over_at_once() {
        let p = seen("a1", 80_000);
        assert_eq!(
            verdict(&p, &p, &AtAddress::Me, true, false, false),
            Verdict::TakeOver
        );
    }

    #[test]
    fn a_lease_still_under_the_identity_keeps_the_wait() {
        let p = seen("a1", 80_000);
        assert_eq!(
            verdict(&p, &p, &AtAddress::Me, true, true, false),
            Verdict::Wait
        );
        assert!(matches!(
            verdict(&p, &p, &AtAddress::Me, true, true, true),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn a_predecessor_answering_at_the_address_is_a_live_second_process() {
        let p = seen("a1", 80_000);
        assert!(matches!(
            verdict(&p, &p, &AtAddress::Predecessor, true, false, false),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn a_renewed_or_replaced_heartbeat_is_a_live_second_process() {
        let first = seen("a1", 80_000);
        for now in [seen("a1", 85_000), seen("a1", 20_000), seen("b2", 80_000)] {
            assert!(matches!(
                verdict(&first, &now, &AtAddress::Me, true, false, false),
                Verdict::Refuse(_)
            ));
        }
    }

    #[test]
    fn on_loopback_only_the_same_network_namespace_is_conclusive() {
        assert!(answer_is_conclusive(false, None, None));
        assert!(answer_is_conclusive(
            true,
            Some("b/net:[1]"),
            Some("b/net:[1]")
        ));
        assert!(!answer_is_conclusive(
            true,
            Some("b/net:[1]"),
            Some("b/net:[2]")
        ));
        assert!(!answer_is_conclusive(true, Some("b/net:[1]"), None));
        assert!(!answer_is_conclusive(true, None, None));
        let p = seen("a1", 80_000);
        assert_eq!(
            verdict(&p, &p, &AtAddress::Me, false, false, false),
            Verdict::Wait
        );
    }

    #[test]
    fn an_address_that_does_not_lead_here_is_waited_out() {
        let p = seen("a1", 80_000);
        assert_eq!(
            verdict(&p, &p, &AtAddress::Elsewhere, true, false, false),
            Verdict::Wait
        );
        assert!(matches!(
            verdict(&p, &p, &AtAddress::Elsewhere, true, false, true),
            Verdict::Refuse(_)
        ));
    }
}
