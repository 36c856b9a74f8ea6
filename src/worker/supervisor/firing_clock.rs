//! The clock of a held slot's scheduled robots: one timer for all of them ([`Alarm`]),
//! on the server's time as the slot's supervisor reads it
//! ([`crate::clock::ServerTime`]):
//! every scheduled robot of the slot waits on the same heap, keyed by the local
//! instant its next step is due, so a thousand idle schedules are a thousand heap
//! entries and one sleeping task, never a query per robot per tick.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{ServerTime, SharedClock};
use crate::worker::renewal_timing::RenewalTiming;

/// How often the server's clock is read again while a slot is held.
pub(crate) const SERVER_TIME_EVERY: Duration = Duration::from_secs(60);

// === impl FirstSteps ===

/// The first steps of the scheduled robots a takeover started before their adoption
/// write: the adoption waits for them (a little), so that a lost run's record, which
/// its retry must wait for, reaches the server ahead of the adoption rather than
/// behind it. Their writes are fenced by the state they were listed with until the
/// adoption lands (see `ContextStore::start_early`), so their order does not matter
/// to safety, only to how soon the retry starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct FirstSteps {
    pending: Arc<AtomicUsize>,
    done: Arc<Notify>,
}

/// One instance's first step, pending until it is dropped.
#[derive(Debug)]
pub(crate) struct FirstStep(FirstSteps);

impl Drop for FirstStep {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
        self.0.done.notify_waiters();
    }
}

impl FirstSteps {
    /// One more first step to wait for, until the returned guard is dropped.
    pub(crate) fn expect(&self) -> FirstStep {
        self.pending.fetch_add(1, Ordering::AcqRel);
        FirstStep(self.clone())
    }

    /// Waits until every expected first step is done, or `limit` passed.
    pub(crate) async fn all_done(&self, limit: Duration, clock: &SharedClock) {
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
pub(crate) struct Alarm {
    tx: mpsc::UnboundedSender<(Instant, oneshot::Sender<()>)>,
}

impl Alarm {
    /// Starts the slot's timer; it ends with `stop`.
    pub(crate) fn spawn(clock: SharedClock, stop: CancellationToken) -> Alarm {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(alarm_task(clock, stop, rx));
        Alarm { tx }
    }

    /// Completes at `at` (at once when it has passed), or never once the timer is
    /// gone (its slot's robots are stopping).
    pub(crate) async fn until(&self, at: Instant) {
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
pub(crate) struct Shared {
    pub(crate) time: ServerTime,
    pub(crate) alarm: Alarm,
    /// Notified when a sync lists the robot with another firing state than the one
    /// this instance knows (`rev`): a run-now request, a pause's mark.
    pub(crate) wake: Arc<Notify>,
    /// The firing state's `rev` this instance knows.
    pub(crate) known_rev: Arc<AtomicI64>,
    /// The lease `L`: a slot gone this long has no holder finishing a stop.
    pub(crate) lease: Duration,
    /// The slot's renewal timing: an instance is counted there while it lives.
    pub(crate) renewals: RenewalTiming,
}
