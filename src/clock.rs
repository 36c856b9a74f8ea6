//! Monotonic time, injectable.
//!
//! The lease protocol never trusts a wall clock. Every time decision in the worker
//! reads the one clock it was given, so tests can swap in a [`ManualClock`] and step
//! past a deadline without sleeping. Bounds on another party's answer (a database
//! reply, a robot's exit) stay on real time, since those parties do not follow a
//! test's clock. The server's clock is known only by readings: a [`ServerClock`] is
//! one carried forward on the monotonic clock, and a [`ServerTime`] the latest a held
//! slot shares with its scheduled robots.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A wait on a [`Clock`].
pub(crate) type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

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
pub(crate) type SharedClock = Arc<dyn Clock>;

// === The server's clock ===

/// One reading of the server's clock, carried forward on the local monotonic clock:
/// the server read `server_ms` somewhere between the local instants `sent` and
/// `received`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerClock {
    server_ms: i64,
    at: Instant,
    /// The request's round trip: the server read its clock somewhere within it.
    spread_ms: i64,
}

impl ServerClock {
    /// `server_ms` was read by the server between the local instants `sent` and
    /// `received`.
    pub(crate) fn observed(server_ms: i64, sent: Instant, received: Instant) -> Self {
        let spread_ms = received.saturating_duration_since(sent).as_millis() as i64;
        ServerClock {
            server_ms,
            at: sent,
            spread_ms,
        }
    }

    /// The latest the server's now can be: what a survey must read up to so a
    /// lease expiring before the next survey is not missed, however slow the
    /// observing round trip was.
    pub(crate) fn latest_ms(&self) -> i64 {
        self.now_ms() + self.spread_ms
    }

    /// The reading itself: the server's clock, and the local instants between which
    /// the server read it.
    pub(crate) fn reading(&self) -> (i64, Instant, Instant) {
        (self.server_ms, self.at, self.received())
    }

    fn received(&self) -> Instant {
        self.at + Duration::from_millis(self.spread_ms.max(0) as u64)
    }

    /// The middle of the reading's round trip.
    fn mid(&self) -> Instant {
        self.at + Duration::from_millis(self.spread_ms.max(0) as u64 / 2)
    }

    /// How long ago the observation was made.
    pub(crate) fn age(&self) -> Duration {
        self.at.elapsed()
    }

    /// The server's now, estimated: never ahead of it by more than the local
    /// clock's drift since the observation, behind it by up to the reply's way back.
    pub(crate) fn now_ms(&self) -> i64 {
        self.at_ms(Instant::now())
    }

    /// The server's clock at local instant `t` (not before the observation), from
    /// the send: never ahead of the server.
    pub(crate) fn at_ms(&self, t: Instant) -> i64 {
        self.server_ms + t.saturating_duration_since(self.at).as_millis() as i64
    }

    /// The server's clock at local instant `t`, taken from the middle of the round
    /// trip: off by half of it at most, either way.
    pub(crate) fn mid_at_ms(&self, t: Instant) -> i64 {
        self.server_ms + t.saturating_duration_since(self.mid()).as_millis() as i64
    }
}

/// The slowest answer a [`ServerTime`] reading is taken from. The server read its
/// clock somewhere within the round trip, so a reading is off by up to half of it:
/// at most half a second, within the firing planner's
/// [`crate::worker::supervisor::firing_plan::DRIFT_MS`].
pub(crate) const MAX_READING_ROUND_TRIP: Duration = Duration::from_secs(1);

/// The server's clock as a held slot last read it, shared with its scheduled
/// robots, and the first reading after the claim.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerTime {
    reading: Arc<Mutex<Option<ServerClock>>>,
    began: Arc<OnceLock<i64>>,
}

impl ServerTime {
    /// Takes a reading (see [`ServerClock::observed`]): refused when its round trip
    /// was slower than [`MAX_READING_ROUND_TRIP`]. The first reading of a lease
    /// also fixes [`ServerTime::lease_began`].
    pub(crate) fn observe(
        &self,
        server_ms: i64,
        sent: Instant,
        received: Instant,
    ) -> Result<(), String> {
        let round_trip = received.saturating_duration_since(sent);
        if round_trip > MAX_READING_ROUND_TRIP {
            return Err(format!(
                "the server's clock answered after {} ms, too slow to be read within half a second; read again later",
                round_trip.as_millis()
            ));
        }
        let reading = ServerClock::observed(server_ms, sent, received);
        *self.reading.lock().expect("server time lock") = Some(reading);
        self.began.get_or_init(|| server_ms);
        Ok(())
    }

    fn last(&self) -> Option<ServerClock> {
        *self.reading.lock().expect("server time lock")
    }

    /// How long ago the last reading was taken (None: never).
    pub(crate) fn age(&self, clock: &SharedClock) -> Option<Duration> {
        self.last().map(|r| clock.since(r.mid()))
    }

    /// The server's now, estimated from the middle of the last reading's round
    /// trip; None before the first reading.
    pub(crate) fn now_ms(&self, clock: &SharedClock) -> Option<i64> {
        Some(self.last()?.mid_at_ms(clock.now()))
    }

    /// The local instant at which the server's clock reads `ms`, estimated.
    pub(crate) fn instant_at(&self, ms: i64, clock: &SharedClock) -> Option<Instant> {
        let now_ms = self.now_ms(clock)?;
        let ahead = Duration::from_millis(ms.saturating_sub(now_ms).max(0) as u64);
        Some(clock.now() + ahead)
    }

    /// The server's clock at the first reading after this slot was claimed: no
    /// earlier than the claim, by which time every earlier holder's lease was over.
    pub(crate) fn lease_began(&self) -> Option<i64> {
        self.began.get().copied()
    }
}

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

    #[test]
    fn the_server_clock_is_carried_forward() {
        let t = Instant::now();
        let c = ServerClock::observed(1_000, t, t + Duration::from_millis(40));
        // Carried forward from the send: never ahead of the server...
        assert_eq!(c.at_ms(t + Duration::from_millis(250)), 1_250);
        assert_eq!(c.at_ms(t), 1_000);
        // ...and its latest possible value covers the whole round trip.
        assert!(c.latest_ms() >= c.now_ms() + 40);
    }

    #[test]
    fn a_slots_server_time_is_taken_from_the_middle_of_its_reading() {
        let clock: SharedClock = Arc::new(ManualClock::new());
        let t = clock.now();
        let time = ServerTime::default();
        assert_eq!(time.now_ms(&clock), None);
        time.observe(10_000, t, t + Duration::from_millis(40))
            .unwrap();
        assert_eq!(time.lease_began(), Some(10_000));
        assert_eq!(
            time.now_ms(&clock),
            Some(10_000),
            "the middle of the round trip"
        );
        // Too slow a reading is refused, and the last one stands.
        let err = time
            .observe(20_000, t, t + Duration::from_millis(1_500))
            .unwrap_err();
        assert!(err.contains("too slow"), "{err}");
        assert_eq!(time.now_ms(&clock), Some(10_000));
        time.observe(30_000, t, t).unwrap();
        assert_eq!(time.lease_began(), Some(10_000), "the first reading only");
    }
}
