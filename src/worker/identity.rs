//! Taking this worker's `ip:port` identity when another process's heartbeat is
//! still believed there.
//!
//! Two live processes must never share an identity, yet waiting out a dead
//! predecessor's heartbeat would delay every restart by a minute. So the worker
//! [`probe`]s its own address: if it answers itself, the predecessor is gone and the
//! identity is taken with a compare-and-set on the heartbeat as read (unless a slot
//! is still leased under it); else it waits or refuses. Loopback counts only within
//! one [`network_namespace`]. See docs/internals.md, "Taking over a worker's identity".

use crate::db::heartbeat::Predecessor;
use std::net::SocketAddr;
use std::time::Duration;

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
