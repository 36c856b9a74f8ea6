//! Monotonic time, injectable.
//!
//! The lease protocol never trusts a wall clock: expiry is judged on the database
//! server, and the holder's self-fence deadline is measured on a *monotonic* clock.
//! Every decision about time in the worker (when to renew, survey, heartbeat, hand
//! back, restart a robot, and whether a deadline has passed) reads the one clock it
//! was given and waits on it. Tests swap in a [`ManualClock`] to step past a deadline
//! exactly, without sleeping.
//!
//! What stays on real time: bounds on an answer from another party (a database
//! reply, a robot process's exit within its stop grace). The database and the robots'
//! processes do not follow a test's clock, so a bound on them that did would wait
//! forever under a clock that stands still.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A wait on a [`Clock`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of monotonic instants, and waits measured on them.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Instant;

    /// Completes once [`Clock::now`] has reached `at`.
    fn sleep_until(&self, at: Instant) -> Sleep;

    /// Completes once `by` has passed on this clock.
    fn sleep(&self, by: Duration) -> Sleep {
        self.sleep_until(self.now() + by)
    }

    /// How long this clock has run since `earlier` (zero if `earlier` is later).
    fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }
}

/// The process's monotonic clock (`tokio::time::Instant`, which follows
/// `tokio::time::pause()` in tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, at: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that only moves when told to; every wait on it ends when an
/// [`ManualClock::advance`] carries it past the wait's instant.
#[derive(Debug, Clone)]
pub struct ManualClock {
    base: Instant,
    offset: Arc<watch::Sender<Duration>>,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            base: Instant::now(),
            offset: Arc::new(watch::Sender::new(Duration::ZERO)),
        }
    }

    /// Moves this clock (and every clone of it) forward, waking the waits it passes.
    pub fn advance(&self, by: Duration) {
        self.offset.send_modify(|offset| *offset += by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.borrow()
    }

    fn sleep_until(&self, at: Instant) -> Sleep {
        let mut offset = self.offset.subscribe();
        let base = self.base;
        Box::pin(async move {
            // The sender lives as long as any clone of the clock; a clock dropped
            // while waited on never moves again, so the wait never ends either.
            while base + *offset.borrow_and_update() < at {
                if offset.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// Shared handle to whichever clock a component was given.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_on_a_manual_clock_ends_when_an_advance_passes_it() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        let mut wait = tokio::spawn(clock.sleep(Duration::from_secs(5)));
        clock.advance(Duration::from_secs(4));
        // Still waiting: the clock is a second short. (A yield lets the task look.)
        tokio::task::yield_now().await;
        assert!(futures::poll!(&mut wait).is_pending());
        clock.advance(Duration::from_secs(1));
        wait.await.unwrap();
        assert_eq!(clock.since(t0), Duration::from_secs(5));
        // A wait for an instant already passed ends at once.
        clock.sleep_until(t0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_monotonic_clock_waits_on_tokio_time() {
        let clock = MonotonicClock;
        let t0 = clock.now();
        clock.sleep(Duration::from_secs(3)).await;
        assert_eq!(clock.since(t0), Duration::from_secs(3));
    }
}
