//! The database server's clock as the worker's loop reads it (with surveys,
//! heartbeats and place reads), and what a forward step of it sets off.
//!
//! The readings narrow what a survey reads and time the release poll; each one goes
//! through [`StepWatch`], and a step is logged, counted, recorded as an event and
//! told to the held slots, whose scheduled robots then read the clock again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::ServerClock;
use crate::config::LeaseTiming;
use crate::db::store::Store;
use crate::metrics::Metrics;
use crate::worker::clock_step::StepWatch;

/// The last reading of the server's clock, and its forward steps.
#[derive(Debug)]
pub(crate) struct ServerWatch {
    /// The last reading (see [`crate::worker::standby_line::CLOCK_REFRESH`]).
    last: Option<ServerClock>,
    /// Forward steps, and the claims they hold back (see [`crate::worker::clock_step`]).
    steps: StepWatch,
    /// How many forward steps this worker has seen: each held slot reads the
    /// server's clock again for its scheduled robots when it changes.
    stepped: Arc<AtomicU64>,
    lease_ms: i64,
    metrics: Arc<Metrics>,
    store: Store,
    /// This worker, as its events name it.
    me: String,
}

impl ServerWatch {
    pub(crate) fn new(
        timing: LeaseTiming,
        metrics: Arc<Metrics>,
        store: Store,
        me: String,
    ) -> Self {
        ServerWatch {
            last: None,
            steps: StepWatch::new(
                timing.lease(),
                StepWatch::tolerance(timing.margin, timing.stop_grace),
                Instant::now(),
            ),
            stepped: Arc::default(),
            lease_ms: timing.lease_ms(),
            metrics,
            store,
            me,
        }
    }

    /// The count of forward steps seen, for the held slots to follow.
    pub(crate) fn stepped(&self) -> Arc<AtomicU64> {
        self.stepped.clone()
    }

    /// The last reading, if any.
    pub(crate) fn last(&self) -> Option<ServerClock> {
        self.last
    }

    /// For how much longer stamped slots are held back after a step (see
    /// [`StepWatch::holding`]).
    pub(crate) fn holding(&self, now: Instant) -> Option<Duration> {
        self.steps.holding(now)
    }

    /// One reading of the server's clock: it becomes the last (the freshest narrows
    /// the next surveys too: after a forward step, an older one would leave them
    /// reading too little); a forward step is logged, counted and recorded, and
    /// holds stamped slots back for a lease.
    pub(crate) fn read(&mut self, reading: ServerClock) {
        let (server_ms, sent, received) = reading.reading();
        self.observed(server_ms, sent, received);
        self.last = Some(reading);
    }

    /// The server's clock read `server_ms` between the local instants `sent` and
    /// `received`: as [`ServerWatch::read`].
    pub(crate) fn read_at(&mut self, server_ms: i64, sent: Instant, received: Instant) {
        self.observed(server_ms, sent, received);
        self.last = Some(ServerClock::observed(server_ms, sent, received));
    }

    fn observed(&mut self, server_ms: i64, sent: Instant, received: Instant) {
        let Some(step_ms) = self.steps.observe(server_ms, sent, received) else {
            return;
        };
        self.metrics.server_clock_steps.inc();
        self.stepped.fetch_add(1, Ordering::Relaxed);
        let lease_ms = self.lease_ms;
        tracing::warn!(
            step_ms,
            "the database server's clock stepped forward by at least {step_ms} ms: leases stamped before it may look expired while their holders still run, so no such slot is claimed for {lease_ms} ms (one lease)"
        );
        let (store, me) = (self.store.clone(), self.me.clone());
        tokio::spawn(async move {
            store
                .record_event(
                    crate::db::event::EventKind::ServerClockStep,
                    bson::doc! {
                        crate::db::field::WORKER: me,
                        crate::db::field::DETAIL: format!("the server's clock stepped forward by at least {step_ms} ms; stamped slots held back for {lease_ms} ms"),
                    },
                )
                .await;
        });
    }
}
