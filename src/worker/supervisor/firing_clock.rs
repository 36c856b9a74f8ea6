//! The clock of a held slot's scheduled robots: the server's time as the slot's
//! supervisor reads it ([`ServerTime`]), and one timer for all of them ([`Alarm`]):
//! every scheduled robot of the slot waits on the same heap, keyed by the local
//! instant its next step is due, so a thousand idle schedules are a thousand heap
//! entries and one sleeping task, never a query per robot per tick.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::db::store::Store;

/// How often the server's clock is read again while a slot is held.
pub const SERVER_TIME_EVERY: Duration = Duration::from_secs(60);

/// The slowest answer a reading is taken from. The server read its clock somewhere
/// within the round trip, so a reading is off by up to half of it: at most half a
/// second, within the planner's [`super::firing_plan::DRIFT_MS`].
pub const MAX_READING_ROUND_TRIP: Duration = Duration::from_secs(1);

// === impl ServerTime ===

/// The server's clock as a held slot's supervisor last read it, and the first
/// reading after the claim.
#[derive(Debug, Clone, Default)]
pub struct ServerTime {
    reading: Arc<Mutex<Option<(i64, Instant)>>>,
    began: Arc<OnceLock<i64>>,
}

impl ServerTime {
    /// Reads the server's clock (`hello`). The server read it somewhere within the
    /// round trip: taken at its middle, the estimate is off by half a round trip at
    /// most. The first reading of a lease also fixes [`ServerTime::lease_began`].
    pub async fn refresh(&self, store: &Store, clock: &SharedClock) -> Result<(), String> {
        let sent = clock.now();
        let server = store
            .server_now()
            .await
            .map_err(|e| crate::db::store::brief(&e))?;
        let received = clock.now();
        let round_trip = received.saturating_duration_since(sent);
        if round_trip > MAX_READING_ROUND_TRIP {
            return Err(format!(
                "the server's clock answered after {} ms, too slow to be read within half a second; read again later",
                round_trip.as_millis()
            ));
        }
        let mid = sent + round_trip / 2;
        let ms = server.timestamp_millis();
        *self.reading.lock().expect("server time lock") = Some((ms, mid));
        self.began.get_or_init(|| ms);
        Ok(())
    }

    /// How long ago the last reading was taken (None: never).
    pub fn age(&self, clock: &SharedClock) -> Option<Duration> {
        let r = *self.reading.lock().expect("server time lock");
        r.map(|(_, at)| clock.since(at))
    }

    /// The server's now, estimated; None before the first reading.
    pub fn now_ms(&self, clock: &SharedClock) -> Option<i64> {
        let (ms, at) = (*self.reading.lock().expect("server time lock"))?;
        Some(ms + clock.since(at).as_millis() as i64)
    }

    /// The local instant at which the server's clock reads `ms`, estimated.
    pub fn instant_at(&self, ms: i64, clock: &SharedClock) -> Option<Instant> {
        let now_ms = self.now_ms(clock)?;
        let ahead = Duration::from_millis(ms.saturating_sub(now_ms).max(0) as u64);
        Some(clock.now() + ahead)
    }

    /// The server's clock at the first reading after this slot was claimed: no
    /// earlier than the claim, by which time every earlier holder's lease was over.
    pub fn lease_began(&self) -> Option<i64> {
        self.began.get().copied()
    }
}

// === impl RenewalTiming ===

/// How wide the window just after a tick's edge is, on the server's clock, that a
/// renewal of a slot with scheduled robots aims at (its middle), at most: a tenth
/// of the tick below a tick of 100 ms.
pub const EDGE_WINDOW: Duration = Duration::from_millis(10);

/// How far past the edge a slot's window may begin, at most (a twentieth of the
/// tick below a tick of 1 s): each slot's by a hash of its id, so that the holders
/// of many slots do not all renew, and then look at their robots, at one instant.
pub const EDGE_SPREAD: Duration = Duration::from_millis(50);

/// When a held slot's renewals go. A slot that runs scheduled robots renews just
/// after each edge of the tick on the server's clock (a multiple of the tick since
/// the epoch: every whole second at a 1 s tick), where firings fall: in a window
/// that begins up to [`EDGE_SPREAD`] past the edge, by the slot.
///
/// Why: a successor can claim the slot only a lease `L` after the last renewal
/// before its holder died. Renewing just after the edges, the last renewal before
/// any death in the tick before a firing came a tick before that firing, so the
/// successor claims one tick (plus the window) after the firing, not anywhere up to
/// `L` after it. Renewals are only ever moved earlier, never later: the self-fence
/// deadline is counted from each renewal's sending, so an earlier one is always
/// safe. Slots without scheduled robots keep their phase (no reason to make every
/// holder renew at the same instant).
#[derive(Debug, Clone, Default)]
pub struct RenewalTiming {
    time: ServerTime,
    scheduled: Arc<AtomicUsize>,
    /// This slot's place in [`EDGE_SPREAD`], from its id.
    spread_key: u64,
}

/// A scheduled instance, counted by [`RenewalTiming`] while it lives.
#[derive(Debug)]
pub struct ScheduledMark(Arc<AtomicUsize>);

impl Drop for ScheduledMark {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RenewalTiming {
    pub fn new(time: ServerTime, slot: &str) -> RenewalTiming {
        RenewalTiming {
            time,
            scheduled: Arc::default(),
            spread_key: crate::db::lease::stable_hash(slot),
        }
    }

    /// Counts a scheduled instance until the mark is dropped.
    pub fn mark(&self) -> ScheduledMark {
        self.scheduled.fetch_add(1, Ordering::Relaxed);
        ScheduledMark(self.scheduled.clone())
    }

    /// How much earlier than `next` (a tick after the last renewal was sent) the
    /// next renewal goes; None when the renewals keep their own phase (no scheduled
    /// robots, or no reading of the server's clock yet).
    pub fn advance(&self, next: Instant, tick: Duration, clock: &SharedClock) -> Option<Duration> {
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
pub fn edge_advance(at_ms: i64, tick_ms: i64, window_ms: i64) -> i64 {
    if tick_ms <= 0 {
        return 0;
    }
    let past_edge = at_ms.rem_euclid(tick_ms);
    if past_edge <= window_ms {
        return 0;
    }
    past_edge - window_ms / 2
}

// === impl FirstSteps ===

/// The first steps of the scheduled robots a takeover started before their adoption
/// write: the adoption waits for them (a little), so that a lost run's record, which
/// its retry must wait for, reaches the server ahead of the adoption rather than
/// behind it. Their writes are fenced by the state they were listed with until the
/// adoption lands (see `ContextStore::start_early`), so their order does not matter
/// to safety, only to how soon the retry starts.
#[derive(Debug, Clone, Default)]
pub struct FirstSteps {
    pending: Arc<AtomicUsize>,
    done: Arc<Notify>,
}

/// One instance's first step, pending until it is dropped.
#[derive(Debug)]
pub struct FirstStep(FirstSteps);

impl Drop for FirstStep {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
        self.0.done.notify_waiters();
    }
}

impl FirstSteps {
    /// One more first step to wait for, until the returned guard is dropped.
    pub fn expect(&self) -> FirstStep {
        self.pending.fetch_add(1, Ordering::AcqRel);
        FirstStep(self.clone())
    }

    /// Waits until every expected first step is done, or `limit` passed.
    pub async fn all_done(&self, limit: Duration, clock: &SharedClock) {
        let all = async {
            loop {
                let notified = self.done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.pending.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::select! {
            () = all => {}
            () = clock.sleep(limit) => {}
        }
    }
}

// === impl Alarm ===

/// One timer for every scheduled robot of a held slot: a heap of wake-ups.
#[derive(Debug, Clone)]
pub struct Alarm {
    tx: mpsc::UnboundedSender<(Instant, oneshot::Sender<()>)>,
}

impl Alarm {
    /// Starts the slot's timer; it ends with `stop`.
    pub fn spawn(clock: SharedClock, stop: CancellationToken) -> Alarm {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(alarm_task(clock, stop, rx));
        Alarm { tx }
    }

    /// Completes at `at` (at once when it has passed), or never once the timer is
    /// gone (its slot's robots are stopping).
    pub async fn until(&self, at: Instant) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((at, tx)).is_err() || rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn alarm_task(
    clock: SharedClock,
    stop: CancellationToken,
    mut rx: mpsc::UnboundedReceiver<(Instant, oneshot::Sender<()>)>,
) {
    let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    let mut seq = 0u64;
    loop {
        let next = heap.peek().map(|Reverse((at, _))| *at);
        let due = async {
            match next {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            asked = rx.recv() => match asked {
                Some((at, tx)) => {
                    seq += 1;
                    heap.push(Reverse((at, seq)));
                    waiting.insert(seq, tx);
                }
                None => return,
            },
            () = due => {
                let now = clock.now();
                while let Some(Reverse((at, id))) = heap.peek().copied() {
                    if at > now {
                        break;
                    }
                    heap.pop();
                    if let Some(tx) = waiting.remove(&id) {
                        let _ = tx.send(());
                    }
                }
            }
        }
        // Waits given up on (their instance moved on) leave with the next pop; a
        // heap of them never outgrows the instances' waits by more than one each.
        if heap.len() > 4 * waiting.len().max(64) {
            heap.retain(|Reverse((_, id))| waiting.get(id).is_some_and(|t| !t.is_closed()));
            waiting.retain(|_, t| !t.is_closed());
        }
    }
}

/// What the supervisor shares with a scheduled instance.
#[derive(Debug, Clone)]
pub struct Shared {
    pub time: ServerTime,
    pub alarm: Alarm,
    /// Notified when a sync lists the robot with another firing state than the one
    /// this instance knows (`rev`): a run-now request, a pause's mark.
    pub wake: Arc<Notify>,
    /// The firing state's `rev` this instance knows.
    pub known_rev: Arc<AtomicI64>,
    /// The lease `L`: a slot gone this long has no holder finishing a stop.
    pub lease: Duration,
    /// The slot's renewal timing: an instance is counted there while it lives.
    pub renewals: RenewalTiming,
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
