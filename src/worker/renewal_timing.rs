//! When a held slot's renewals go: at the tick's edges on the server's clock while
//! the slot runs scheduled robots, where firings fall (see [`RenewalTiming`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{ServerTime, SharedClock};

/// How wide the window just after a tick's edge is, on the server's clock, that a
/// renewal of a slot with scheduled robots aims at (its middle), at most: a tenth
/// of the tick below a tick of 100 ms.
pub(crate) const EDGE_WINDOW: Duration = Duration::from_millis(10);

/// How far past the edge a slot's window may begin, at most (a twentieth of the
/// tick below a tick of 1 s): each slot's by a hash of its id, so that the holders
/// of many slots do not all renew, and then look at their robots, at one instant.
pub(crate) const EDGE_SPREAD: Duration = Duration::from_millis(50);

/// When a held slot's renewals go. A slot that runs scheduled robots renews just
/// after each edge of the tick on the server's clock, where firings fall, within
/// [`EDGE_SPREAD`] of it by slot. Then a successor claims one tick after a firing its
/// dead holder missed, not up to `L` after it. Renewals only ever move earlier, which
/// is always safe since the self-fence counts from each renewal's sending. Other
/// slots keep their phase, so holders do not all renew at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct RenewalTiming {
    time: ServerTime,
    scheduled: Arc<AtomicUsize>,
    /// This slot's place in [`EDGE_SPREAD`], from its id.
    spread_key: u64,
}

/// A scheduled instance, counted by [`RenewalTiming`] while it lives.
#[derive(Debug)]
pub(crate) struct ScheduledMark(Arc<AtomicUsize>);

impl Drop for ScheduledMark {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RenewalTiming {
    pub(crate) fn new(time: ServerTime, slot: &str) -> RenewalTiming {
        RenewalTiming {
            time,
            scheduled: Arc::default(),
            spread_key: crate::db::lease::stable_hash(slot),
        }
    }

    /// Counts a scheduled instance until the mark is dropped.
    pub(crate) fn mark(&self) -> ScheduledMark {
        self.scheduled.fetch_add(1, Ordering::Relaxed);
        ScheduledMark(self.scheduled.clone())
    }

    /// How much earlier than `next` (a tick after the last renewal was sent) the
    /// next renewal goes; None when the renewals keep their own phase (no scheduled
    /// robots, or no reading of the server's clock yet).
    pub(crate) fn advance(
        &self,
        next: Instant,
        tick: Duration,
        clock: &SharedClock,
    ) -> Option<Duration> {
        if self.scheduled.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now_ms = self.time.now_ms(clock)?;
        let ahead = next.saturating_duration_since(clock.now()).as_millis() as i64;
        let window = EDGE_WINDOW.min(tick / 10).as_millis() as i64;
        let spread = EDGE_SPREAD.min(tick / 20).as_millis().max(1) as u64;
        let offset = (self.spread_key % spread) as i64;
        let ms = edge_advance(now_ms + ahead - offset, tick.as_millis() as i64, window);
        Some(Duration::from_millis(ms as u64))
    }
}

/// How many milliseconds earlier than server time `at_ms` a renewal goes so that it
/// is sent in the middle of the `window` after an edge of the tick (a multiple of
/// `tick_ms`). Zero when `at_ms` is already in that window: a renewal a millisecond
/// off is left alone, not moved a whole tick.
pub(crate) fn edge_advance(at_ms: i64, tick_ms: i64, window_ms: i64) -> i64 {
    if tick_ms <= 0 {
        return 0;
    }
    let past_edge = at_ms.rem_euclid(tick_ms);
    if past_edge <= window_ms {
        return 0;
    }
    past_edge - window_ms / 2
}

#[cfg(test)]
mod tests {
    use super::edge_advance;

    #[test]
    fn a_renewal_moves_earlier_to_just_after_the_last_edge() {
        // Due 400 ms past a whole second: sent 395 ms earlier, 5 ms past it.
        assert_eq!(edge_advance(12_400, 1000, 10), 395);
        // Due just before an edge: to just after the edge before, not after it.
        assert_eq!(edge_advance(12_999, 1000, 10), 994);
        assert_eq!(edge_advance(-1, 1000, 10), 994);
    }

    #[test]
    fn a_renewal_already_in_the_window_stays() {
        for at in [12_000, 12_005, 12_010] {
            assert_eq!(edge_advance(at, 1000, 10), 0, "{at}");
        }
        // Drifting a millisecond a tick, it is pulled back a few milliseconds, once.
        assert_eq!(edge_advance(12_011, 1000, 10), 6);
    }

    #[test]
    fn the_edges_are_the_ticks_multiples() {
        assert_eq!(edge_advance(1_270, 250, 10), 15);
        assert_eq!(edge_advance(1_255, 250, 10), 0);
        assert_eq!(edge_advance(5_000, 0, 10), 0);
    }
}
