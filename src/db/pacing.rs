//! How hard a holder's robots may press on the database, paced by its own lease.
//!
//! A renewal later than the fence margin stops every robot, and a restore of
//! thousands of robots can starve it. So robot writes pass through a [`WritePacer`]
//! fed by every renewal's round trip, as in TCP congestion control: a renewal slower
//! than a quarter of the margin halves the writes allowed in flight (never below
//! one), and one faster than a tenth allows one more (up to [`MAX_INFLIGHT_WRITES`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The most robot writes one holder keeps in flight at once.
pub(crate) const MAX_INFLIGHT_WRITES: usize = 8;

#[derive(Debug)]
struct State {
    limit: usize,
    inflight: usize,
}

/// A counting limit on robot writes whose size follows the lease's renewal latency.
#[derive(Debug)]
pub struct WritePacer {
    state: Mutex<State>,
    freed: Notify,
    /// A renewal at least this slow halves the limit.
    slow: Duration,
    /// A renewal at most this fast raises it by one.
    fast: Duration,
}

/// One robot write in flight; dropping it lets the next one go.
#[derive(Debug)]
pub(crate) struct WritePermit<'a> {
    pacer: &'a WritePacer,
}

impl Drop for WritePermit<'_> {
    fn drop(&mut self) {
        self.pacer.state.lock().expect("pacer lock").inflight -= 1;
        self.pacer.freed.notify_one();
    }
}

/// A [`WritePermit`] that owns its pacer, for a write sent from another task.
#[derive(Debug)]
pub(crate) struct OwnedWritePermit {
    pacer: Arc<WritePacer>,
}

impl Drop for OwnedWritePermit {
    fn drop(&mut self) {
        self.pacer.state.lock().expect("pacer lock").inflight -= 1;
        self.pacer.freed.notify_one();
    }
}

impl WritePacer {
    /// [`WritePacer::acquire`], for a permit that moves into another task.
    pub(crate) async fn acquire_owned(self: &Arc<Self>) -> OwnedWritePermit {
        // The borrowed permit's count passes to the owned one, which gives it back.
        std::mem::forget(self.acquire().await);
        OwnedWritePermit {
            pacer: self.clone(),
        }
    }

    /// A pacer for a lease whose holder fences itself `margin` before expiry. It
    /// starts at the full limit: a quiet database costs robots nothing.
    pub fn new(margin: Duration) -> Self {
        WritePacer {
            state: Mutex::new(State {
                limit: MAX_INFLIGHT_WRITES,
                inflight: 0,
            }),
            freed: Notify::new(),
            slow: slow_renewal(margin),
            fast: margin / 10,
        }
    }

    /// Waits until one more robot write may be sent.
    pub(crate) async fn acquire(&self) -> WritePermit<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut s = self.state.lock().expect("pacer lock");
                if s.inflight < s.limit {
                    s.inflight += 1;
                    return WritePermit { pacer: self };
                }
            }
            freed.await;
        }
    }

    /// Feeds one successful renewal's round trip back. Returns the new limit.
    pub(crate) fn observe(&self, renewal: Duration) -> usize {
        let mut s = self.state.lock().expect("pacer lock");
        if renewal >= self.slow {
            let lower = (s.limit / 2).max(1);
            if lower < s.limit {
                tracing::debug!(
                    renewal_ms = renewal.as_millis() as u64,
                    limit = lower,
                    "renewal slowed: fewer robot writes in flight"
                );
            }
            s.limit = lower;
        } else if renewal <= self.fast && s.limit < MAX_INFLIGHT_WRITES {
            s.limit += 1;
            self.freed.notify_one();
        }
        s.limit
    }

    /// How long one robot write command may keep the database busy: half the fence
    /// margin, so that a renewal that had to wait behind all of it (on a server that
    /// answers one command at a time) would still come back well inside the margin
    /// at any tick.
    pub(crate) fn command_budget(&self) -> Duration {
        self.slow * 2
    }

    /// How many robot writes may be in flight now.
    pub(crate) fn limit(&self) -> usize {
        self.state.lock().expect("pacer lock").limit
    }

    /// How many are.
    #[cfg(test)]
    pub(crate) fn inflight(&self) -> usize {
        self.state.lock().expect("pacer lock").inflight
    }
}

/// How many renewals in a row a changed slot's read waits out, at most, while they
/// come back slow (see [`read_admitted`]): five ticks, so that a robot created, moved,
/// paused or deleted is acted on a few seconds late at worst, never starved.
pub(crate) const READ_WAITS_MOST: u32 = 5;

/// A renewal at least this slow says the database is busy: it halves the robot
/// writes in flight ([`WritePacer::observe`]) and holds a changed slot's read back
/// ([`read_admitted`]). A quarter of the fence margin.
pub(crate) fn slow_renewal(margin: Duration) -> Duration {
    margin / 4
}

/// How slow a renewal (per command) must be to say the database is busy, for
/// [`read_admitted`]: [`slow_renewal`], or twice the fastest renewal this lease has
/// seen (`floor`) when that is more, so that a link slow by distance alone (a
/// database 60 ms away) is not taken for a busy one. Never more than half the
/// margin: a lease claimed in a storm has a slow fastest renewal until the storm
/// passes, and its own reads must still take turns meanwhile.
pub(crate) fn busy_renewal(margin: Duration, floor: Option<Duration>) -> Duration {
    let by_floor = (floor.unwrap_or_default() * 2).min(margin / 2);
    slow_renewal(margin).max(by_floor)
}

/// Whether a holder reads its slot's robots right after a renewal that took
/// `renewal` per command, or waits for the next one; `waited` is how many renewals
/// in a row it has already let go by for that read.
///
/// A slot's read is the one big command a holder sends unasked, and after a mass
/// create every holder reads at once, queuing renewals past their margin. A slow
/// renewal says others are reading, so the holder waits for a fast one and the reads
/// take turns. Always admitted: the first read after a claim (a takeover waits on
/// it), and a read that has waited [`READ_WAITS_MOST`] renewals.
pub(crate) fn read_admitted(renewal: Duration, slow: Duration, first: bool, waited: u32) -> bool {
    first || renewal < slow || waited >= READ_WAITS_MOST
}

/// How many statements one command may carry so that it keeps the database busy
/// for at most `budget`, at the cost per statement the last command showed (`took`
/// for `done` statements), from `min` to `max`; `max` before anything was measured.
/// The cost is taken from the whole round trip, so it errs on the short side.
pub(crate) fn statements_within(
    budget: Duration,
    took: Duration,
    done: usize,
    min: usize,
    max: usize,
) -> usize {
    if done == 0 || took.is_zero() {
        return max;
    }
    let each = took.as_secs_f64() / done as f64;
    ((budget.as_secs_f64() / each).floor() as usize).clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_owned_permit_counts_and_gives_back_like_a_borrowed_one() {
        let p = Arc::new(WritePacer::new(MARGIN));
        let owned = p.acquire_owned().await;
        assert_eq!(p.inflight(), 1);
        tokio::spawn(async move { drop(owned) }).await.unwrap();
        assert_eq!(p.inflight(), 0);
    }

    const MARGIN: Duration = Duration::from_millis(400);

    /// A task that takes one more permit and gives it back at once.
    fn one_more_write(p: &Arc<WritePacer>) -> tokio::task::JoinHandle<()> {
        let p = p.clone();
        tokio::spawn(async move {
            let _c = p.acquire().await;
        })
    }

    #[test]
    fn a_changed_slots_read_waits_for_a_fast_renewal_but_not_for_ever() {
        let slow = slow_renewal(MARGIN);
        assert_eq!(slow, Duration::from_millis(100));
        assert!(read_admitted(Duration::from_millis(99), slow, false, 0));
        assert!(
            !read_admitted(slow, slow, false, 0),
            "as slow as the threshold waits"
        );
        assert!(!read_admitted(
            Duration::from_secs(1),
            slow,
            false,
            READ_WAITS_MOST - 1
        ));
        assert!(
            read_admitted(Duration::from_secs(1), slow, false, READ_WAITS_MOST),
            "a read that waited its most goes"
        );
        assert!(
            read_admitted(Duration::from_secs(1), slow, true, 0),
            "a claim's first read never waits"
        );
    }

    #[test]
    fn a_link_slow_by_distance_is_not_taken_for_a_busy_database() {
        let margin = MARGIN;
        assert_eq!(busy_renewal(margin, None), Duration::from_millis(100));
        assert_eq!(
            busy_renewal(margin, Some(Duration::from_millis(20))),
            Duration::from_millis(100),
            "a fast link keeps the margin's quarter"
        );
        let far = busy_renewal(margin, Some(Duration::from_millis(60)));
        assert_eq!(far, Duration::from_millis(120));
        assert!(read_admitted(Duration::from_millis(70), far, false, 0));
        assert!(!read_admitted(Duration::from_millis(130), far, false, 0));
        assert_eq!(
            busy_renewal(margin, Some(Duration::from_millis(400))),
            margin / 2,
            "a lease whose fastest renewal came in a storm still judges by half the margin"
        );
    }

    #[test]
    fn slow_renewals_halve_fast_ones_add_one() {
        let p = WritePacer::new(MARGIN);
        assert_eq!(p.limit(), MAX_INFLIGHT_WRITES);
        // Between the thresholds (40 ms .. 100 ms): unchanged.
        assert_eq!(p.observe(Duration::from_millis(60)), 8);
        assert_eq!(p.observe(Duration::from_millis(100)), 4);
        assert_eq!(p.observe(Duration::from_millis(300)), 2);
        assert_eq!(p.observe(Duration::from_millis(300)), 1);
        assert_eq!(p.observe(Duration::from_secs(5)), 1, "never below one");
        assert_eq!(p.observe(Duration::from_millis(40)), 2);
        for _ in 0..20 {
            p.observe(Duration::from_millis(1));
        }
        assert_eq!(p.limit(), MAX_INFLIGHT_WRITES, "never above the cap");
    }

    #[tokio::test]
    async fn never_more_in_flight_than_the_limit() {
        let p = Arc::new(WritePacer::new(MARGIN));
        p.observe(Duration::from_secs(1)); // 4
        p.observe(Duration::from_secs(1)); // 2
        let a = p.acquire().await;
        let _b = p.acquire().await;
        assert_eq!(p.inflight(), 2);
        let waiter = one_more_write(&p);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a third write waits at limit 2");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a freed permit lets the waiter go")
            .unwrap();
    }

    #[tokio::test]
    async fn a_raised_limit_wakes_a_waiter() {
        let p = Arc::new(WritePacer::new(MARGIN));
        for _ in 0..3 {
            p.observe(Duration::from_secs(1));
        }
        assert_eq!(p.limit(), 1);
        let _held = p.acquire().await;
        let waiter = one_more_write(&p);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        p.observe(Duration::from_millis(1)); // limit 2
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("raising the limit lets a waiter go")
            .unwrap();
    }

    #[tokio::test]
    async fn a_lowered_limit_holds_new_writes_until_enough_finish() {
        let p = Arc::new(WritePacer::new(MARGIN));
        let held: Vec<_> = futures::future::join_all((0..4).map(|_| p.acquire())).await;
        p.observe(Duration::from_secs(1)); // 4
        p.observe(Duration::from_secs(1)); // 2: four are in flight
        let waiter = one_more_write(&p);
        let mut held = held;
        held.pop();
        held.pop();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "still 2 in flight at limit 2");
        held.pop();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("below the limit again, the waiter goes")
            .unwrap();
    }
}
