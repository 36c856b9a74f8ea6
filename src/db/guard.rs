//! The write guard: one held slot's lease deadline as every robot write sees it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::SharedClock;

/// The holder's lease deadline as robots see it. Checked before every write, so a
/// process that was paused past its deadline refuses to write even in the moment
/// before the new holder's adoption would fence it in the database. Robots that run
/// outside the worker's process follow it through [`WriteGuard::watch`] (see
/// [`crate::robot::shim`]).
///
/// It also keeps the lease's end **on the server's clock** when the holder knows it
/// (see [`WriteGuard::stamped`]): every fenced write then carries
/// `$$NOW <= bound`, so the server itself refuses a write that arrives after the lease
/// could have been claimed by another worker, however long the network held it.
#[derive(Debug, Clone)]
pub struct WriteGuard {
    deadline: Arc<watch::Sender<Instant>>,
    clock: SharedClock,
    /// Server-clock ms past which this holder's writes must not apply; `NO_BOUND`
    /// until a claim or renewal stamp is known.
    bound_ms: Arc<AtomicI64>,
    /// What a stamp adds to give the bound: `L − δ` in ms (see [`bound_window`]); 0
    /// for a guard that never bounds its writes on the server.
    window_ms: i64,
}

const NO_BOUND: i64 = i64::MIN;

/// How long after a lease stamp (the server's `$$NOW` when a claim or renewal
/// applied) this holder's writes may still apply: the lease `L` less a quarter of the
/// fence margin. The quarter is `δ`, room for the local monotonic clock to drift
/// against the server's between observations of it (466 ppm over a minute at a
/// 250 ms tick), and for the server's clock to step back that far.
pub fn bound_window(lease: std::time::Duration, margin: std::time::Duration) -> i64 {
    lease.as_millis() as i64 - (margin / 4).as_millis() as i64
}

impl WriteGuard {
    pub fn new(deadline: Instant, clock: SharedClock) -> Self {
        WriteGuard {
            deadline: Arc::new(watch::channel(deadline).0),
            clock,
            bound_ms: Arc::new(AtomicI64::new(NO_BOUND)),
            window_ms: 0,
        }
    }

    /// A guard whose writes are also bounded on the server's clock, `window_ms`
    /// ([`bound_window`]) past each stamp [`WriteGuard::stamped`] reports.
    pub fn bounded(mut self, window_ms: i64) -> Self {
        self.window_ms = window_ms.max(1);
        self
    }

    /// A lease stamp of this holder, or a lower bound of one (server-clock ms): the
    /// bound moves to `stamp + window` if that is later. A stamp is `$$NOW` of a claim
    /// or renewal that applied, so the slot cannot be claimed by anyone else before
    /// `stamp + L` on the server's clock, and no write of this holder applies after
    /// `stamp + L − δ`.
    pub fn stamped(&self, stamp_ms: i64) {
        if self.window_ms > 0 {
            self.bound_ms
                .fetch_max(stamp_ms.saturating_add(self.window_ms), Ordering::AcqRel);
        }
    }

    /// The server-clock ms past which this holder's writes must not apply, once a
    /// stamp is known.
    pub fn server_bound_ms(&self) -> Option<i64> {
        let b = self.bound_ms.load(Ordering::Acquire);
        (b != NO_BOUND).then_some(b)
    }

    /// Whether this guard bounds its writes on the server's clock (from the claim on).
    pub fn is_bounded(&self) -> bool {
        self.window_ms > 0
    }

    /// Moves the deadline after a successful renewal.
    pub fn extend(&self, deadline: Instant) {
        self.deadline.send_replace(deadline);
    }

    /// Ends writing at once (lease lost or self-fenced).
    pub fn revoke(&self) {
        self.deadline.send_replace(self.clock.now());
    }

    pub fn is_open(&self) -> bool {
        self.clock.now() < *self.deadline.borrow()
    }

    /// The lease deadline as of now (the local monotonic instant past which
    /// nothing may be written).
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// The deadline now and every change of it (extensions and the revocation).
    pub fn watch(&self) -> watch::Receiver<Instant> {
        self.deadline.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MonotonicClock;
    use std::time::Duration;

    #[test]
    fn the_server_bound_only_moves_forward() {
        let g = WriteGuard::new(Instant::now(), Arc::new(MonotonicClock));
        g.stamped(1_000);
        assert_eq!(
            g.server_bound_ms(),
            None,
            "an unbounded guard keeps no bound"
        );
        let g = g.bounded(bound_window(
            Duration::from_millis(500),
            Duration::from_millis(112),
        ));
        assert!(g.is_bounded());
        g.stamped(1_000);
        assert_eq!(g.server_bound_ms(), Some(1_000 + 500 - 28));
        g.stamped(900);
        assert_eq!(
            g.server_bound_ms(),
            Some(1_472),
            "an older stamp never lowers it"
        );
        g.stamped(1_250);
        assert_eq!(g.server_bound_ms(), Some(1_722));
    }
}
