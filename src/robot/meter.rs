//! What each robot run costs its worker, for the load score and the slot's cost:
//! a [`RobotMeter`] per run, which the run's kind feeds (an exec robot names its
//! shim, whose process tree the worker's load sampler reads in `/proc`) and whose
//! polls are timed ([`metered`]: an in-process kind's cost is the time spent
//! polling it), listed in the worker's [`Meters`] while the run lasts.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::load::Cost;

/// One robot run's cost, as it runs.
#[derive(Debug, Default)]
pub(crate) struct RobotMeter {
    /// The pid of the run's shim (0: none), whose tree is the robot's processes.
    process: AtomicI32,
    /// Time spent polling the run's future, in nanoseconds.
    polled_ns: AtomicU64,
}

impl RobotMeter {
    /// Names the process whose tree this run's processes are.
    pub(crate) fn track_process(&self, pid: i32) {
        self.process.store(pid, Ordering::Relaxed);
    }

    /// The process named by [`RobotMeter::track_process`], if any.
    pub(crate) fn process(&self) -> Option<i32> {
        Some(self.process.load(Ordering::Relaxed)).filter(|p| *p > 0)
    }

    /// How long this run's future was polled, in all.
    pub(crate) fn polled(&self) -> Duration {
        Duration::from_nanos(self.polled_ns.load(Ordering::Relaxed))
    }

    fn add_poll(&self, d: Duration) {
        self.polled_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// `fut`, with the time spent in each of its polls added to `meter`.
pub(crate) async fn metered<F: Future>(fut: F, meter: Arc<RobotMeter>) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let began = std::time::Instant::now();
        let out = fut.as_mut().poll(cx);
        meter.add_poll(began.elapsed());
        out
    })
    .await
}

/// One run in the worker's [`Meters`].
#[derive(Debug, Clone)]
pub(crate) struct Metered {
    /// This run's own key in [`Meters`], never reused.
    pub(crate) key: u64,
    pub(crate) name: String,
    pub(crate) slot: String,
    /// What its spec's `limits` declare: it weighs at least that much.
    pub(crate) declared: Cost,
    pub(crate) meter: Arc<RobotMeter>,
}

/// Every robot run of a worker, while it lasts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meters(Arc<Mutex<MetersInner>>);

#[derive(Debug, Default)]
struct MetersInner {
    next: u64,
    runs: HashMap<u64, Metered>,
}

/// Keeps a run listed in [`Meters`] until dropped.
#[derive(Debug)]
pub(crate) struct Listed {
    meters: Meters,
    key: u64,
    pub(crate) meter: Arc<RobotMeter>,
}

impl Meters {
    /// Lists a run until the returned guard is dropped.
    pub(crate) fn list(&self, name: &str, slot: &str, declared: Cost) -> Listed {
        let meter = Arc::new(RobotMeter::default());
        let mut inner = self.0.lock().expect("meters lock");
        inner.next += 1;
        let key = inner.next;
        inner.runs.insert(
            key,
            Metered {
                key,
                name: name.to_string(),
                slot: slot.to_string(),
                declared,
                meter: meter.clone(),
            },
        );
        Listed {
            meters: self.clone(),
            key,
            meter,
        }
    }

    /// The runs of the moment.
    pub(crate) fn runs(&self) -> Vec<Metered> {
        let inner = self.0.lock().expect("meters lock");
        let mut runs: Vec<Metered> = inner.runs.values().cloned().collect();
        runs.sort_by(|a, b| (&a.slot, &a.name).cmp(&(&b.slot, &b.name)));
        runs
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.meters.0.lock() {
            inner.runs.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn polls_are_timed_and_runs_listed_while_they_last() {
        let meters = Meters::default();
        let listed = meters.list("busy", "s1", Cost::default());
        assert_eq!(meters.runs().len(), 1);
        let meter = listed.meter.clone();
        metered(
            async {
                // A poll that works for 20 ms.
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_millis(20) {
                    std::hint::spin_loop();
                }
                tokio::task::yield_now().await;
            },
            meter.clone(),
        )
        .await;
        assert!(meter.polled() >= Duration::from_millis(20));
        meter.track_process(42);
        assert_eq!(meters.runs()[0].meter.process(), Some(42));
        drop(listed);
        assert!(meters.runs().is_empty());
    }
}
