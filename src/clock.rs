//! Monotonic time, injectable.
//!
//! The lease protocol never trusts a wall clock: expiry is judged on the database
//! server, and the holder's self-fence deadline is measured on a *monotonic* clock.
//! Tests swap in a [`ManualClock`] to step past a deadline exactly, without sleeping.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A source of monotonic instants.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Instant;
}

/// The process's monotonic clock (`tokio::time::Instant`, which follows
/// `tokio::time::pause()` in tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {
    base: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            base: Instant::now(),
            offset: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    /// Moves this clock (and every clone of it) forward.
    pub fn advance(&self, by: Duration) {
        *self.offset.lock().expect("clock lock") += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock().expect("clock lock")
    }
}

/// Shared handle to whichever clock a component was given.
pub type SharedClock = Arc<dyn Clock>;
