//! Worker counters, gauges and the renewal-latency histogram, registered with
//! `prometheus-client` (name and help text at registration, in one table below) and
//! encoded by `/metrics` in the OpenMetrics text format.
//!
//! A counter registered as `claims` is exposed as `slotpool_claims_total`: the names
//! are those of the hand-written encoder this replaced.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`]'s page.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renewal round-trip latency buckets, in seconds.
const BUCKETS: [f64; 10] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Firing lateness buckets, in seconds: a few milliseconds on a timer, a second or
/// two after a takeover, up to a minute when a holder falls behind.
const LATENESS_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// How late scheduled runs start, in [`LATENESS_BUCKETS`].
#[derive(Debug, Clone)]
pub struct Lateness(Histogram);

impl Default for Lateness {
    fn default() -> Self {
        Lateness(Histogram::new(LATENESS_BUCKETS))
    }
}

impl Lateness {
    pub(crate) fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

impl EncodeMetric for Lateness {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> std::fmt::Result {
        self.0.encode(encoder)
    }
    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// The renewal round trip, in [`BUCKETS`].
#[derive(Debug, Clone)]
pub struct Latency(Histogram);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new(BUCKETS))
    }
}

impl Latency {
    pub(crate) fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

impl EncodeMetric for Latency {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Declares [`Metrics`]' fields and registers each under its name and help text,
/// so the two cannot drift apart.
macro_rules! metrics {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty = $name:literal, $help:literal; )*) => {
        /// Everything one worker counts. Shared as `Arc<Metrics>`; each metric is
        /// itself a shared handle, so the registry holds clones of the same values.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl Metrics {
            fn registry(&self) -> Registry {
                let mut r = Registry::with_prefix("slotpool");
                $( r.register($name, $help, self.$field.clone()); )*
                r
            }
        }
    };
}

metrics! {
    slot_held: Gauge = "slot_held", "slots this worker holds (0 as standby, more than 1 while overflowing)";
    epoch: Gauge = "epoch", "epoch of the slot claimed last (0 before the first claim)";
    /// Seconds since the last successful renewal was sent, set at each scrape.
    lease_age: Gauge<f64, AtomicU64> = "lease_age_seconds", "time since the last successful renewal was sent";
    db_healthy: Gauge = "database_up", "1 when the last database operation succeeded";
    claims: Counter = "claims", "slots claimed";
    claim_attempts: Counter = "claim_attempts", "compare-and-set claim updates sent";
    claim_conflicts: Counter = "claim_conflicts", "claim updates that lost the race";
    surveys: Counter = "surveys", "surveys of the expired slots";
    survey_docs: Counter = "survey_documents", "slot documents the surveys read (expired and soon-expiring ones; every lease in a front standby's survey of a small pool)";
    release_poll_hits: Counter = "release_poll_hits", "release polls (first standby in line) that found a free slot and surveyed at once";
    /// Expired, non-draining slots at this worker's last survey.
    slots_unheld: Gauge = "slots_unheld", "slots expired and not draining at this worker's last survey (their robots are not running)";
    /// The longest of those, in seconds since expiry (a slot never held counts as a year).
    slot_unheld: Gauge<f64, AtomicU64> = "slot_unheld_seconds", "longest time any of those slots had been expired at that survey (a slot never held: one year)";
    line_front: Gauge = "line_front", "1 while this worker is at the front of the line (watches the leases), 0 behind it";
    place_reads: Counter = "place_reads", "reads of this worker's place in the line";
    place_reads_whole: Counter = "place_reads_whole_line", "place reads that read the whole line ahead of this worker: a holder's, a watcher's, a standby's first, and a standby's when fewer than --watchers of the nearest standbys it knew were found alive";
    server_clock_steps: Counter = "server_clock_steps", "forward steps of the database server's clock this worker saw; each held back claims of stamped slots for one lease";
    losses: Counter = "losses", "leases lost to another worker or removal";
    self_fences: Counter = "self_fences", "local deadlines passed without a renewal: robots suspended (or stopped, with --suspend-for 0)";
    robots_suspended: Gauge = "robots_suspended", "robots of this worker's suspended leases: frozen (exec) or not polled while the holder renews late";
    suspensions: Family<SuspensionLabels, Counter> = "suspensions", "leases suspended at the self-fence deadline, by how the suspension ended: resumed in place (a late renewal matched), lost (another epoch), expired (--suspend-for passed) or stopped (the worker or the slot went away)";
    releases: Counter = "releases", "slots released on shutdown or drain";
    renew_failures: Counter = "renew_failures", "renewals that failed with a database error";
    fenced_writes: Counter = "fenced_writes", "robot writes refused by the epoch fence";
    checkpoints: Counter = "checkpoints", "robot checkpoints persisted";
    unbumped_changes: Counter = "unbumped_robot_changes", "robot changes on a held slot found by the probe, not by a rev bump (an interrupted move or a hand edit)";
    write_batches: Counter = "checkpoint_batches", "group commits sent: multi-statement updates carrying robot checkpoints";
    batched_writes: Counter = "checkpoint_batched", "checkpoints sent in group commits (divide by checkpoint_batches_total for the batch size)";
    checkpoints_refused: Counter = "checkpoints_refused", "robot checkpoints refused as unstorable (too large, not a document, out of range)";
    log_lines_dropped: Counter = "robot_log_lines_dropped", "robot output lines not logged because the robot wrote more than its log rate";
    late_kills: Counter = "robot_late_kills", "exec robots killed at once, with no stop grace, because their lease's deadline had long passed when the stop came (the worker was frozen or starved)";
    shims_stopped: Counter = "robot_shims_stopped", "exec robots killed because their shim was found stopped: the robot, sharing the worker's user, stopped it (see --exec-user)";
    robot_restarts: Counter = "robot_restarts", "robot restarts after a crash or exit";
    heartbeat_timeouts: Counter = "robot_heartbeat_timeouts", "exec robots stopped and started again because they showed no life (checkpoint or heartbeat line) within spec.heartbeat_timeout";
    pokes_received: Counter = "pokes_received", "pokes taken (POST /v1/poke): each made this worker survey the slots at once";
    pokes_ignored: Counter = "pokes_ignored", "pokes merged into a survey already due (one was taken within the last 100 ms, or tick if shorter)";
    pokes_sent: Counter = "pokes_sent", "pokes a standby answered, sent after this worker released a slot";
    pokes_lost: Counter = "pokes_lost", "pokes not delivered (no answer, refused, not an ip:port): the standby finds the slot at its next survey";
    memory_kills: Counter = "robot_memory_kills", "exec robots killed whole because the kernel killed one of their processes at spec.limits.memory";
    pids_limit_hits: Counter = "robot_pids_limit_hits", "seconds in which an exec robot's fork failed at spec.limits.pids (reported at most once a second per robot)";
    robot_failures: Counter = "robot_failures", "robots given up on under their restart policy (status failed, held until robot resume)";
    robots_completed: Counter = "robots_completed", "robots that ran to completion under spec.restart.on failure or never (status completed, held until robot restart)";
    firings_claimed: Counter = "firings_claimed", "scheduled firings claimed (each with one fenced write, before anything starts)";
    firings_started: Counter = "firings_started", "runs of scheduled robots started (retries and run-now requests included)";
    firings_failed: Counter = "firings_failed", "runs of scheduled robots that ended in failure";
    firings_skipped: Counter = "firings_skipped", "firings recorded skipped: overlap, paused, or lost with on_lost skip";
    firings_missed: Counter = "firings_missed", "firings recorded missed: due outside their catch-up window";
    firings_lost: Counter = "firings_lost", "runs found in flight under a lease that ended (then retried or skipped, as on_lost says)";
    firing_lateness: Lateness = "firing_lateness_seconds", "from a firing's time to its run's start, on the server's clock as the holder estimates it";
    robots_running: Gauge = "robots_running", "robots running on this worker";
    load_score: Gauge<f64, AtomicU64> = "worker_load_score", "this worker's load score, 0 (idle) to 100 (full): its parts weighed by --load-weights";
    load_parts: Family<LoadPartLabels, Gauge<f64, AtomicU64>> = "worker_load_part", "the load score's parts as shares of the worker's allowance, 0 to 1: cpu (over the last minute, of the cgroup's quota or the host's cores), executors (robots of --capacity), memory (of the cgroup's limit or the host's memory)";
    robots_restarting: Gauge = "robots_restarting", "robots waiting in restart backoff";
    robot_write_limit: Gauge = "robot_write_limit", "robot writes allowed in flight, paced by renewal latency (0 when holding no slot)";
    renew_latency: Latency = "renew_latency_seconds", "round trip of lease renewals";
    slot_read: Latency = "slot_read_seconds", "time to read a held slot's robots (one query per sync); on a server where a read holds up every command (the dev server), a renewal waits behind it";
}

/// How a suspension ended (`slotpool_suspensions_total{outcome}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum SuspensionOutcome {
    /// A late renewal matched: the same robots went on in place.
    Resumed,
    /// The slot had another epoch: the robots were killed, never thawed.
    Lost,
    /// `--suspend-for` passed without a renewal: the robots were stopped.
    Expired,
    /// The worker or the slot went away meanwhile: the robots were killed.
    Stopped,
}

impl EncodeLabelValue for SuspensionOutcome {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

impl SuspensionOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            SuspensionOutcome::Resumed => "resumed",
            SuspensionOutcome::Lost => "lost",
            SuspensionOutcome::Expired => "expired",
            SuspensionOutcome::Stopped => "stopped",
        }
    }
}

/// The label of [`Metrics::load_parts`]: `cpu`, `executors` or `memory`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadPartLabels {
    pub part: &'static str,
}

/// The label of [`Metrics::suspensions`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SuspensionLabels {
    pub outcome: SuspensionOutcome,
}

impl Metrics {
    /// Counts a suspension's end.
    pub(crate) fn suspension_ended(&self, outcome: SuspensionOutcome) {
        self.suspensions
            .get_or_create(&SuspensionLabels { outcome })
            .inc();
    }

    /// Shows a measured load.
    pub(crate) fn load_measured(&self, l: &crate::load::Load) {
        self.load_score.set(l.score());
        for (part, v) in [
            ("cpu", l.cpu),
            ("executors", l.executors),
            ("memory", l.memory),
        ] {
            self.load_parts
                .get_or_create(&LoadPartLabels { part })
                .set(v);
        }
    }

    /// The OpenMetrics text page ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry());
        out
    }
}

/// One unit of a gauge, held while this value lives and given back when it is
/// dropped: a task aborted part-way (a robot still running after its stop grace)
/// gives its unit back too, where a decrement after an `.await` would never run and
/// leave the gauge counting a robot that is gone.
#[derive(Debug)]
pub(crate) struct Held(Gauge);

impl Held {
    pub(crate) fn new(gauge: &Gauge) -> Held {
        gauge.inc();
        Held(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_unit_is_given_back_when_its_task_is_aborted() {
        let m = Metrics::default();
        let gauge = m.robots_running.clone();
        let (started, running) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let _running = Held::new(&gauge);
            let _ = started.send(());
            std::future::pending::<()>().await;
        });
        running.await.unwrap();
        assert_eq!(m.robots_running.get(), 1);
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(
            m.robots_running.get(),
            0,
            "the aborted task's unit came back"
        );
        {
            let _a = Held::new(&m.robots_running);
            let _b = Held::new(&m.robots_running);
            assert_eq!(m.robots_running.get(), 2);
        }
        assert_eq!(m.robots_running.get(), 0);
    }

    fn sample(page: &str, name: &str) -> Option<String> {
        page.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::to_string)
    }

    #[test]
    fn the_names_of_the_hand_written_encoder_are_kept() {
        let m = Metrics::default();
        m.claims.inc_by(3);
        m.slot_held.set(1);
        m.lease_age.set(0.25);
        m.renew_latency.observe(Duration::from_millis(3));
        let page = m.render();
        assert_eq!(sample(&page, "slotpool_claims_total").as_deref(), Some("3"));
        assert_eq!(sample(&page, "slotpool_slot_held").as_deref(), Some("1"));
        assert_eq!(
            sample(&page, "slotpool_lease_age_seconds").as_deref(),
            Some("0.25")
        );
        assert_eq!(
            sample(&page, "slotpool_renew_latency_seconds_bucket{le=\"0.005\"}").as_deref(),
            Some("1")
        );
        assert_eq!(
            sample(&page, "slotpool_renew_latency_seconds_count").as_deref(),
            Some("1")
        );
        assert!(
            page.contains("# HELP slotpool_claims slots claimed"),
            "{page}"
        );
        assert!(page.trim_end().ends_with("# EOF"), "{page}");
        // Every metric the worker had before is still there.
        for name in [
            "slotpool_epoch",
            "slotpool_database_up",
            "slotpool_claim_attempts_total",
            "slotpool_surveys_total",
            "slotpool_line_front",
            "slotpool_self_fences_total",
            "slotpool_fenced_writes_total",
            "slotpool_checkpoint_batches_total",
            "slotpool_robot_log_lines_dropped_total",
            "slotpool_robots_running",
            "slotpool_robot_write_limit",
            "slotpool_release_poll_hits_total",
        ] {
            assert!(sample(&page, name).is_some(), "{name} missing from\n{page}");
        }
    }
}
