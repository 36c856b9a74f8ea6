//! The write guard: one held slot's lease deadline as every robot write sees it.
//!
//! Three states: *open* before the deadline; *suspended* once it passed without a
//! renewal, until the holder either renews late (the deadline moves on: open again)
//! or gives the lease up (*revoked*, for good). A write asked for while suspended
//! waits ([`WriteGuard::admit`]); none is sent until a renewal has proved the epoch.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::SharedClock;

/// The holder's lease deadline as robots see it. Checked before every write, so a
/// process that was paused past its deadline refuses to write even in the moment
/// before the new holder's adoption would fence it in the database. Robots that run
/// outside the worker's process follow it through [`WriteGuard::watch`] (see
/// [`crate::robot::shim`]).
#[derive(Debug, Clone)]
pub struct WriteGuard {
    deadline: Arc<watch::Sender<Instant>>,
    revoked: tokio_util::sync::CancellationToken,
    clock: SharedClock,
}

impl WriteGuard {
    pub fn new(deadline: Instant, clock: SharedClock) -> Self {
        WriteGuard {
            deadline: Arc::new(watch::channel(deadline).0),
            revoked: tokio_util::sync::CancellationToken::new(),
            clock,
        }
    }

    /// Moves the deadline after a successful renewal.
    pub(crate) fn extend(&self, deadline: Instant) {
        self.deadline.send_replace(deadline);
    }

    /// Ends writing at once (lease lost or self-fenced). A deadline already past
    /// stays where it was: how long ago it passed tells a robot's stop whether it
    /// still has a grace (see [`crate::robot::shim::late_slack`]).
    pub fn revoke(&self) {
        self.revoked.cancel();
        let now = self.clock.now();
        self.deadline.send_if_modified(|d| {
            if *d > now {
                *d = now;
                true
            } else {
                false
            }
        });
    }

    pub fn is_open(&self) -> bool {
        !self.revoked.is_cancelled() && self.clock.now() < *self.deadline.borrow()
    }

    /// True once the lease was given up: no write will ever be admitted.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// Whether a write may go now: true while open; while suspended, waits until the
    /// deadline moves on (true) or the guard is revoked (false).
    pub async fn admit(&self) -> bool {
        let mut deadline = self.deadline.subscribe();
        loop {
            if self.is_revoked() {
                return false;
            }
            if self.is_open() {
                return true;
            }
            tokio::select! {
                () = self.revoked.cancelled() => return false,
                changed = deadline.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    /// The deadline now and every change of it (extensions and the revocation).
    pub(crate) fn watch(&self) -> watch::Receiver<Instant> {
        self.deadline.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    fn guard() -> (WriteGuard, ManualClock) {
        let clock = ManualClock::new();
        let shared: SharedClock = Arc::new(clock.clone());
        let now = shared.now();
        (WriteGuard::new(now + Duration::from_secs(1), shared), clock)
    }

    #[tokio::test]
    async fn an_open_guard_admits_at_once() {
        let (g, _clock) = guard();
        assert!(g.is_open());
        assert!(g.admit().await);
    }

    #[tokio::test]
    async fn a_suspended_guard_holds_a_write_until_a_late_renewal() {
        let (g, clock) = guard();
        clock.advance(Duration::from_secs(2));
        assert!(!g.is_open() && !g.is_revoked(), "suspended");
        let waiting = tokio::spawn({
            let g = g.clone();
            async move { g.admit().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "held while suspended");
        g.extend(clock_now(&g) + Duration::from_secs(1));
        assert!(waiting.await.unwrap(), "admitted after the renewal");
    }

    #[tokio::test]
    async fn a_revoked_guard_refuses_the_held_write_for_good() {
        let (g, clock) = guard();
        clock.advance(Duration::from_secs(2));
        let waiting = tokio::spawn({
            let g = g.clone();
            async move { g.admit().await }
        });
        tokio::task::yield_now().await;
        g.revoke();
        assert!(!waiting.await.unwrap());
        // A later extension (it never comes from the holder) opens nothing.
        g.extend(clock_now(&g) + Duration::from_secs(10));
        assert!(!g.is_open());
        assert!(!g.admit().await);
    }

    fn clock_now(g: &WriteGuard) -> Instant {
        g.clock.now()
    }
}
