//! A forward step of the database server's clock, caught before it lets this worker
//! claim a slot whose holder may still run its robots.
//!
//! Expiry is judged on the server's clock but a holder fences on its own, so a forward
//! step can make a live lease look expired. Each server-clock reading bounds the offset
//! `server − local`; a new range wholly above the last by more than [`StepWatch`]'s
//! tolerance is a step. For one `L` after a step (and after the first reading), no
//! stamped slot is claimed: by then a live holder renewed and a dead one's robots
//! stopped. See docs/internals.md, "Steps of the server's clock".

use std::time::Duration;

use tokio::time::Instant;

/// How far the clocks may drift apart, at most, per second between two readings:
/// 1,000 parts per million, far above a quartz clock's or NTP's slewing rate.
const DRIFT_PER_S_MS: f64 = 1.0;

/// Watches the server's clock for forward steps: pure, with instants passed in.
#[derive(Debug)]
pub(crate) struct StepWatch {
    lease: Duration,
    tolerance_ms: i64,
    /// The local instant readings are measured from.
    anchor: Instant,
    /// What the readings so far say of the offset `server − local`: it lies in
    /// `(low, high)`, as of the local instant given. Each consistent reading narrows
    /// it, so one slow round trip does not blur the next comparison.
    known: Option<(i64, i64, Instant)>,
    /// Stamped slots are not claimed before this local instant.
    hold_until: Option<Instant>,
}

impl StepWatch {
    /// A watch for a lease `L` that flags steps over `tolerance`.
    pub(crate) fn new(lease: Duration, tolerance: Duration, anchor: Instant) -> Self {
        StepWatch {
            lease,
            tolerance_ms: tolerance.as_millis() as i64,
            anchor,
            known: None,
            hold_until: None,
        }
    }

    /// The tolerance for a worker's timing: a quarter of the room between the stop
    /// grace and the fence margin (a step of half that room is the smallest that
    /// could overlap two copies), and at least 5 ms, above a round trip's jitter.
    /// A step is caught when it exceeds this plus the round trip of the reading
    /// that shows it.
    pub(crate) fn tolerance(margin: Duration, grace: Duration) -> Duration {
        (margin.saturating_sub(grace) / 4).max(Duration::from_millis(5))
    }

    /// The server's clock read `server_ms` somewhere between the local instants
    /// `sent` and `received`. Some (how far, at least, in ms) when that shows a
    /// forward step.
    pub(crate) fn observe(
        &mut self,
        server_ms: i64,
        sent: Instant,
        received: Instant,
    ) -> Option<i64> {
        let local = |t: Instant| t.saturating_duration_since(self.anchor).as_millis() as i64;
        let (low, high) = (server_ms - local(received), server_ms - local(sent));
        let Some((known_low, known_high, at)) = self.known else {
            // The first reading: a step just before it cannot be seen.
            self.known = Some((low, high, received));
            self.hold(received + self.lease);
            return None;
        };
        let apart = received.saturating_duration_since(at).as_secs_f64();
        let drift = (apart * DRIFT_PER_S_MS).ceil() as i64;
        let (known_low, known_high) = (known_low - drift, known_high + drift);
        let ahead = low - known_high;
        if ahead > self.tolerance_ms {
            self.known = Some((low, high, received));
            self.hold(received + self.lease);
            return Some(ahead);
        }
        self.known = Some(if high < known_low {
            // A step back: it only delays takeovers; the new clock is the reference.
            (low, high, received)
        } else {
            (low.max(known_low), high.min(known_high), received)
        });
        None
    }

    fn hold(&mut self, until: Instant) {
        self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
    }

    /// How long stamped slots must still wait at `now` (None: they need not).
    pub(crate) fn holding(&self, now: Instant) -> Option<Duration> {
        self.hold_until
            .filter(|h| *h > now)
            .map(|h| h.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_reading_holds_stamped_slots_for_one_lease() {
        let t = Instant::now();
        let mut w = StepWatch::new(L, ms(30), t);
        assert_eq!(
            w.holding(t),
            None,
            "nothing read yet, nothing to claim either"
        );
        assert_eq!(w.observe(1_000_000, t, t + ms(2)), None);
        assert_eq!(w.holding(t + ms(2)), Some(L));
        assert_eq!(w.holding(t + ms(2) + L), None);
    }

    #[test]
    fn a_steady_clock_is_no_step_whatever_the_round_trips() {
        let t = Instant::now();
        let mut w = StepWatch::new(L, ms(30), t);
        w.observe(1_000_000, t, t + ms(1));
        // 10 s later, read through a 40 ms round trip, late in it.
        let at = t + ms(10_000);
        assert_eq!(w.observe(1_010_039, at, at + ms(40)), None);
        // An hour later, with the clocks 900 ppm apart.
        let at = at + ms(3_600_000);
        assert_eq!(
            w.observe(1_010_039 + 3_600_000 + 3_240, at, at + ms(1)),
            None
        );
        // A step back delays claims; it is no forward step.
        let at = at + ms(1_000);
        assert_eq!(w.observe(1_000_000, at, at + ms(1)), None);
    }

    #[test]
    fn a_forward_step_holds_stamped_slots_for_one_lease_from_its_reading() {
        let t = Instant::now();
        let mut w = StepWatch::new(L, ms(30), t);
        w.observe(1_000_000, t, t + ms(1));
        let at = t + L + ms(500);
        assert_eq!(w.holding(at), None);
        // 3 s ahead of where it should be.
        let step = w
            .observe(1_000_000 + 2_500 + 3_000, at, at + ms(1))
            .unwrap();
        assert!((2_990..=3_000).contains(&step), "{step}");
        assert_eq!(w.holding(at + ms(1)), Some(L));
        // The new clock is the reference from now on.
        let later = at + ms(1_000);
        assert_eq!(
            w.observe(1_000_000 + 3_500 + 3_000, later, later + ms(1)),
            None
        );
        // Just over the tolerance counts; just under does not.
        let again = later + ms(1_000);
        assert!(w
            .observe(1_000_000 + 4_500 + 3_000 + 34, again, again)
            .is_some());
        let once_more = again + ms(1_000);
        assert!(w
            .observe(1_000_000 + 5_500 + 3_034 + 28, once_more, once_more)
            .is_none());
    }

    #[test]
    fn a_slow_reading_does_not_blur_the_next_comparison() {
        let t = Instant::now();
        let mut w = StepWatch::new(L, ms(30), t);
        w.observe(1_000_000, t, t);
        // A reading through a 500 ms round trip, early in it: consistent, and wide.
        let slow = t + ms(1_000);
        assert_eq!(w.observe(1_001_000, slow, slow + ms(500)), None);
        // Next, a tight reading 40 ms ahead: caught against the tight one before.
        let next = t + ms(2_000);
        assert!(w.observe(1_002_000 + 40, next, next).is_some());
    }

    #[test]
    fn the_tolerance_is_a_quarter_of_the_room_between_grace_and_margin() {
        assert_eq!(
            StepWatch::tolerance(ms(450), ms(300)),
            ms(37) + Duration::from_micros(500)
        );
        assert_eq!(StepWatch::tolerance(ms(22), ms(15)), ms(5));
    }
}
