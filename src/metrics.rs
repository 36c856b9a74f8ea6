//! Worker counters and gauges, rendered in the Prometheus text format by `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Renewal round-trip latency buckets, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Debug, Default)]
pub struct Histogram {
    inner: Mutex<HistogramInner>,
}

#[derive(Debug, Default)]
struct HistogramInner {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = self.inner.lock().expect("histogram lock");
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    pub fn count(&self) -> u64 {
        self.inner.lock().expect("histogram lock").count
    }
}

/// Everything one worker counts. Shared as `Arc<Metrics>`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub slot_held: Gauge,
    pub epoch: Gauge,
    /// Milliseconds since the last successful renewal was sent, updated every tick.
    pub lease_age_ms: Gauge,
    pub db_healthy: Gauge,
    pub claims: Counter,
    pub claim_attempts: Counter,
    pub claim_conflicts: Counter,
    pub surveys: Counter,
    pub survey_docs: Counter,
    pub release_poll_hits: Counter,
    pub line_front: Gauge,
    pub losses: Counter,
    pub self_fences: Counter,
    pub releases: Counter,
    pub renew_failures: Counter,
    pub fenced_writes: Counter,
    pub checkpoints: Counter,
    pub checkpoints_refused: Counter,
    pub write_batches: Counter,
    pub batched_writes: Counter,
    pub log_lines_dropped: Counter,
    pub robot_restarts: Counter,
    pub robots_running: Gauge,
    pub robots_restarting: Gauge,
    pub robot_write_limit: Gauge,
    pub renew_latency: Histogram,
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP slotpool_{name} {help}");
            let _ = writeln!(out, "# TYPE slotpool_{name} {kind}");
            let _ = writeln!(out, "slotpool_{name} {value}");
        };
        let g = |v: &Gauge| v.get().to_string();
        let c = |v: &Counter| v.get().to_string();
        one(
            "slot_held",
            "gauge",
            "1 while this worker holds a slot",
            g(&self.slot_held),
        );
        one(
            "epoch",
            "gauge",
            "epoch of the held slot (0 when standby)",
            g(&self.epoch),
        );
        one(
            "lease_age_seconds",
            "gauge",
            "time since the last successful renewal was sent",
            format!("{:.3}", self.lease_age_ms.get() as f64 / 1000.0),
        );
        one(
            "database_up",
            "gauge",
            "1 when the last database operation succeeded",
            g(&self.db_healthy),
        );
        one("claims_total", "counter", "slots claimed", c(&self.claims));
        one(
            "claim_attempts_total",
            "counter",
            "compare-and-set claim updates sent",
            c(&self.claim_attempts),
        );
        one(
            "claim_conflicts_total",
            "counter",
            "claim updates that lost the race",
            c(&self.claim_conflicts),
        );
        one(
            "surveys_total",
            "counter",
            "surveys of the expired slots",
            c(&self.surveys),
        );
        one(
            "survey_documents_total",
            "counter",
            "slot documents the surveys read (expired and soon-expiring ones only)",
            c(&self.survey_docs),
        );
        one(
            "release_poll_hits_total",
            "counter",
            "release polls (first standby in line) that found a free slot and surveyed at once",
            c(&self.release_poll_hits),
        );
        one(
            "line_front",
            "gauge",
            "1 while this worker is at the front of the line (watches every tick), 0 behind it",
            g(&self.line_front),
        );
        one(
            "losses_total",
            "counter",
            "leases lost to another worker or removal",
            c(&self.losses),
        );
        one(
            "self_fences_total",
            "counter",
            "leases dropped because the local deadline passed",
            c(&self.self_fences),
        );
        one(
            "releases_total",
            "counter",
            "slots released on shutdown or drain",
            c(&self.releases),
        );
        one(
            "renew_failures_total",
            "counter",
            "renewals that failed with a database error",
            c(&self.renew_failures),
        );
        one(
            "fenced_writes_total",
            "counter",
            "robot writes refused by the epoch fence",
            c(&self.fenced_writes),
        );
        one(
            "checkpoints_total",
            "counter",
            "robot checkpoints persisted",
            c(&self.checkpoints),
        );
        one(
            "checkpoint_batches_total",
            "counter",
            "group commits sent: multi-statement updates carrying robot checkpoints",
            c(&self.write_batches),
        );
        one(
            "checkpoint_batched_total",
            "counter",
            "checkpoints sent in group commits (divide by checkpoint_batches_total for the batch size)",
            c(&self.batched_writes),
        );
        one(
            "checkpoints_refused_total",
            "counter",
            "robot checkpoints refused as unstorable (too large, not a document, out of range)",
            c(&self.checkpoints_refused),
        );
        one(
            "robot_log_lines_dropped_total",
            "counter",
            "robot output lines not logged because the robot wrote more than its log rate",
            c(&self.log_lines_dropped),
        );
        one(
            "robot_restarts_total",
            "counter",
            "robot restarts after a crash or exit",
            c(&self.robot_restarts),
        );
        one(
            "robots_running",
            "gauge",
            "robots running on this worker",
            g(&self.robots_running),
        );
        one(
            "robots_restarting",
            "gauge",
            "robots waiting in restart backoff",
            g(&self.robots_restarting),
        );
        one(
            "robot_write_limit",
            "gauge",
            "robot writes allowed in flight, paced by renewal latency (0 when holding no slot)",
            g(&self.robot_write_limit),
        );
        let h = self.renew_latency.inner.lock().expect("histogram lock");
        let _ = writeln!(
            out,
            "# HELP slotpool_renew_latency_seconds round trip of lease renewals"
        );
        let _ = writeln!(out, "# TYPE slotpool_renew_latency_seconds histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "slotpool_renew_latency_seconds_bucket{{le=\"{b}\"}} {}",
                h.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "slotpool_renew_latency_seconds_bucket{{le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "slotpool_renew_latency_seconds_sum {:.6}", h.sum);
        let _ = writeln!(out, "slotpool_renew_latency_seconds_count {}", h.count);
        out
    }
}
