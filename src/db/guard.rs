//! The write guard: one held slot's lease deadline as every robot write sees it.

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
    clock: SharedClock,
}

impl WriteGuard {
    pub fn new(deadline: Instant, clock: SharedClock) -> Self {
        WriteGuard {
            deadline: Arc::new(watch::channel(deadline).0),
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
        self.clock.now() < *self.deadline.borrow()
    }

    /// The deadline now and every change of it (extensions and the revocation).
    pub(crate) fn watch(&self) -> watch::Receiver<Instant> {
        self.deadline.subscribe()
    }
}
