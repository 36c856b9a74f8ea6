//! What the worker shows of itself: its `/status` (role, held slots, lease ages) and
//! whether the database answers. Kept current by the loop and the held slots, read
//! by the HTTP server.

use crate::db::heartbeat::WorkerRole;
use std::sync::{Arc, Mutex};

use std::time::Duration;
use tokio::time::Instant;

use crate::db::lease::Lease;
use crate::metrics::Metrics;

/// One held slot as `/status` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct HeldStatus {
    pub(crate) slot_id: String,
    pub(crate) epoch: i64,
    pub(crate) overflow: bool,
    #[serde(skip)]
    pub(crate) last_renewed: Instant,
    pub(crate) lease_age_ms: u64,
    /// Past the self-fence deadline, its robots suspended while the holder renews
    /// late.
    pub(crate) suspended: bool,
}

/// A slot this worker no longer holds, learnt lost or given up, whose robots are
/// still being stopped: `/status` shows it apart from the held ones at once, so a
/// view that counts holders never sees this worker and the slot's new holder both.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LeavingStatus {
    pub(crate) slot_id: String,
    pub(crate) epoch: i64,
    /// Why it was given up, in words.
    pub(crate) why: String,
}

/// What `/status` shows, kept current by the loop and the held slots.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct WorkerStatus {
    pub(crate) worker: String,
    /// This process's random id, as its heartbeat gives it: a new process asks its
    /// own address for it to learn whether the address leads back to itself.
    pub(crate) instance: String,
    /// `standby` (holds nothing) or `holder`.
    pub(crate) role: WorkerRole,
    /// The first slot held (see `slots` for all of them).
    pub(crate) slot_id: Option<String>,
    pub(crate) epoch: Option<i64>,
    /// Age of the oldest renewal among the held slots.
    pub(crate) lease_age_ms: Option<u64>,
    pub(crate) slots: Vec<HeldStatus>,
    /// Slots learnt lost or given up, their robots still stopping.
    pub(crate) leaving: Vec<LeavingStatus>,
    pub(crate) max_slots: Option<usize>,
    /// As a standby: how many standbys at the front of the line are idler than this
    /// one (0: it claims the next expired slot first), as of its last whole place
    /// read.
    pub(crate) idler_in_front: Option<usize>,
    /// Its load as last measured (none before the first measurement).
    pub(crate) load: Option<crate::load::LoadInfo>,
    /// Filled in from the metrics when served.
    pub(crate) robots_running: i64,
    pub(crate) robots_restarting: i64,
    pub(crate) database_ok: bool,
    pub(crate) tick_ms: u64,
    pub(crate) version: &'static str,
    /// When the worker's loop last finished a round (or started): what `/livez`
    /// judges, whatever the database does.
    #[serde(skip)]
    pub(crate) last_round: Option<Instant>,
    /// How long ago that was, as served.
    pub(crate) loop_age_ms: u64,
}

/// How long the worker's loop may go without finishing a round, or a survey,
/// heartbeat or place read within one, before `/livez` says it is stuck: four heartbeat periods
/// (a round comes at least once a period, and each of its database calls is bounded:
/// a survey by at most `5 × max(2 T, 2 s)`, a standby's heartbeat and place read by
/// three times that bound, see `standby_line::STANDBY_PATIENCE`), and never under
/// 30 s. A database that does not answer does not stop rounds, so it never makes a
/// worker look dead: only a loop that hangs does.
pub(crate) fn stuck_after(tick: std::time::Duration) -> std::time::Duration {
    (crate::worker::standby_line::beat_every(tick) * 4).max(std::time::Duration::from_secs(30))
}

/// Whether the loop is alive: it finished a round within [`stuck_after`].
pub(crate) fn loop_alive(since_last_round: std::time::Duration, tick: std::time::Duration) -> bool {
    since_last_round < stuck_after(tick)
}

impl WorkerStatus {
    pub(crate) fn held(&mut self, lease: &Lease, overflow: bool) {
        self.slots.push(HeldStatus {
            slot_id: lease.slot_id.clone(),
            epoch: lease.epoch,
            overflow,
            last_renewed: lease.last_renewed(),
            lease_age_ms: 0,
            suspended: false,
        });
        self.summarize();
    }

    pub(crate) fn renewed(&mut self, lease: &Lease) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.slot_id == lease.slot_id) {
            s.last_renewed = lease.last_renewed();
        }
    }

    pub(crate) fn suspended(&mut self, slot_id: &str, suspended: bool) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.slot_id == slot_id) {
            s.suspended = suspended;
        }
    }

    /// The slot is no longer held (another worker claimed it, or this one gave it
    /// up at its deadline or at `--suspend-for`): it moves to `leaving` while its
    /// robots stop. True when it was listed as held.
    pub(crate) fn given_up(&mut self, slot_id: &str, epoch: i64, why: &str) -> bool {
        let Some(at) = self
            .slots
            .iter()
            .position(|s| s.slot_id == slot_id && s.epoch == epoch)
        else {
            return false;
        };
        let held = self.slots.remove(at);
        self.leaving.push(LeavingStatus {
            slot_id: held.slot_id,
            epoch: held.epoch,
            why: why.to_string(),
        });
        self.summarize();
        true
    }

    /// The hold of the slot under `epoch` is over, its robots stopped. True when it
    /// was still listed as held (released, drained or shut down: not given up
    /// first). By epoch: the worker may hold the slot again already, under a new one.
    pub(crate) fn left(&mut self, slot_id: &str, epoch: i64) -> bool {
        let this = |id: &str, e: i64| id == slot_id && e == epoch;
        self.leaving.retain(|s| !this(&s.slot_id, s.epoch));
        let before = self.slots.len();
        self.slots.retain(|s| !this(&s.slot_id, s.epoch));
        self.summarize();
        self.slots.len() < before
    }

    fn summarize(&mut self) {
        self.role = if self.slots.is_empty() {
            WorkerRole::Standby
        } else {
            WorkerRole::Holder
        };
        self.slot_id = self.slots.first().map(|s| s.slot_id.clone());
        self.epoch = self.slots.first().map(|s| s.epoch);
    }

    /// Fills in the lease ages as of now (for serving).
    pub(crate) fn with_ages(mut self) -> Self {
        for s in &mut self.slots {
            s.lease_age_ms = s.last_renewed.elapsed().as_millis() as u64;
        }
        self.lease_age_ms = self.slots.iter().map(|s| s.lease_age_ms).max();
        self.loop_age_ms = self.since_last_round().as_millis() as u64;
        self
    }

    /// The loop finished a round, or a survey, heartbeat or place read within one
    /// (or began): it goes on.
    pub(crate) fn round_done(&mut self) {
        self.last_round = Some(Instant::now());
    }

    /// How long ago the loop last finished a round (zero before it began).
    pub(crate) fn since_last_round(&self) -> std::time::Duration {
        self.last_round
            .map_or(std::time::Duration::ZERO, |t| t.elapsed())
    }

    /// When the least recently renewed held slot was renewed.
    pub(crate) fn oldest_renewal(&self) -> Option<Instant> {
        self.slots.iter().map(|s| s.last_renewed).min()
    }
}

pub(crate) type SharedStatus = Arc<Mutex<WorkerStatus>>;

/// Whether the database answers, as every part of the worker last saw it: one
/// place for the metric, the status, and the once-per-outage log line.
#[derive(Debug, Default)]
pub(crate) struct Health {
    down_since: Mutex<Option<Instant>>,
    /// Since when the database has answered without a failure in between: None
    /// before its first answer and while it is down.
    up_since: Mutex<Option<Instant>>,
    /// Outages begun so far (see [`Health::outages`]).
    outages: std::sync::atomic::AtomicU64,
    /// When the database last answered this worker (see [`Health::answered`]).
    last_answer: Mutex<Option<Instant>>,
    /// A write of this worker's failed and none has landed since (see
    /// [`Health::write_failed`]): answers to reads are then no contact.
    writes_failing: std::sync::atomic::AtomicBool,
}

/// The longest spacing of a worker's answers that still counts as unbroken contact
/// with the database: a lease and a tick. A holder hears from it every tick (its
/// renewal), and a standby at the front at least once a lease (its survey), so only
/// an outage leaves them a longer silence. A standby behind the watchers hears from
/// it only at its heartbeat's pace: when it moves up or is poked, it waits a lease
/// of contact before claiming a lapsed lease. It cannot tell a quiet spell from an
/// outage it slept through, and the bench's outage showed a rear standby, moved up
/// at the server's return, claim a suspended holder's slot on contact from before.
pub(crate) fn contact_gap(tick: Duration) -> Duration {
    tick * 3
}

impl Health {
    /// How many outages have begun since the worker started: a change tells the
    /// worker that its connections may have died under it (see
    /// `Connections::reopen_after`).
    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How long the database has answered without a failure in between (zero before
    /// its first answer): how much of a slot's last lease this worker could see
    /// (see `claim_policy::outage_hold`).
    pub(crate) fn contact(&self, now: Instant) -> std::time::Duration {
        self.up_since
            .lock()
            .expect("health lock")
            .map_or(std::time::Duration::ZERO, |t| {
                now.saturating_duration_since(t)
            })
    }

    /// An answer from the database, received `now` after a request that took
    /// `took`. The contact counted by [`Health::contact`] begins afresh, as after a
    /// failure, when the database was out of this worker's sight since its previous
    /// answer:
    /// - the request itself took longer than [`contact_gap`] (a link that held its
    ///   bytes, a paused server);
    /// - or more than [`contact_gap`] passed since the previous answer. A worker
    ///   that asked nothing while the database was away saw no failure, yet cannot
    ///   say it answered in between.
    pub(crate) fn answered(&self, now: Instant, took: Duration, tick: Duration) {
        let gap = contact_gap(tick);
        let mut last = self.last_answer.lock().expect("health lock");
        let unseen = last.is_some_and(|prev| now.saturating_duration_since(prev) > gap);
        let mut up = self.up_since.lock().expect("health lock");
        if self
            .writes_failing
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            *up = None;
        } else if took > gap || unseen {
            *up = Some(now);
        } else {
            up.get_or_insert(now);
        }
        *last = Some(now);
    }

    /// A write of this worker's (a claim, a heartbeat, a renewal) failed: no contact
    /// counts until one lands ([`Health::write_landed`]), whatever reads answer. In
    /// an election a member that is no longer primary (a step-down; a driver
    /// connected to it directly) still answers reads, and a standby that counted
    /// them as contact would claim a suspended holder's slot the moment writes
    /// return, before the holder's late renewal (docs/guarantees.md, "Elections").
    pub(crate) fn write_failed(&self) {
        self.writes_failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.up_since.lock().expect("health lock") = None;
    }

    /// A write of this worker's landed, `took` after it was sent: contact counts
    /// again from this answer (see [`Health::answered`]).
    pub(crate) fn write_landed(&self, now: Instant, took: Duration, tick: Duration) {
        self.writes_failing
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.answered(now, took, tick);
    }

    pub(crate) fn ok(&self, metrics: &Metrics, status: &SharedStatus) {
        // While a write of ours is failing, only a landed write starts contact.
        if !self
            .writes_failing
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.up_since
                .lock()
                .expect("health lock")
                .get_or_insert_with(Instant::now);
        }
        if let Some(since) = self.down_since.lock().expect("health lock").take() {
            tracing::info!(
                down_ms = since.elapsed().as_millis() as u64,
                "database reachable again"
            );
        }
        metrics.db_healthy.set(1);
        status.lock().expect("status lock").database_ok = true;
    }

    /// `why` must already be scrubbed of credentials.
    pub(crate) fn failed(&self, metrics: &Metrics, status: &SharedStatus, why: &str) {
        metrics.db_healthy.set(0);
        status.lock().expect("status lock").database_ok = false;
        *self.up_since.lock().expect("health lock") = None;
        let mut down = self.down_since.lock().expect("health lock");
        if down.is_none() {
            *down = Some(Instant::now());
            self.outages
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tracing::error!("database unreachable: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn holding(slots: &[&str]) -> WorkerStatus {
        let mut st = WorkerStatus::default();
        for (i, id) in slots.iter().enumerate() {
            st.slots.push(HeldStatus {
                slot_id: id.to_string(),
                epoch: i as i64 + 1,
                overflow: i > 0,
                last_renewed: Instant::now(),
                lease_age_ms: 0,
                suspended: true,
            });
        }
        st.summarize();
        st
    }

    /// A slot learnt lost leaves the held list at once, though its robots still
    /// stop: no view that counts holders sees two for it.
    #[test]
    fn a_slot_given_up_is_no_longer_held_while_its_robots_stop() {
        let mut st = holding(&["slot-001", "slot-002"]);
        assert!(st.given_up("slot-001", 1, "another worker claimed it"));
        assert_eq!(st.slots.len(), 1);
        assert_eq!(st.slot_id.as_deref(), Some("slot-002"));
        assert_eq!(st.leaving.len(), 1);
        assert_eq!(st.leaving[0].epoch, 1);
        assert!(!st.given_up("slot-001", 1, "again"), "given up once");
        // Claimed again under a new epoch while the old hold's robots still stop:
        // the old hold's end leaves the new one listed.
        let mut again = holding(&["slot-001"]);
        again.slots[0].epoch = 5;
        st.slots.push(again.slots.remove(0));
        assert!(!st.left("slot-001", 1));
        assert!(st.leaving.is_empty());
        assert!(st
            .slots
            .iter()
            .any(|s| s.slot_id == "slot-001" && s.epoch == 5));
        assert!(st.left("slot-001", 5));
        // A slot released (never given up) was held until it left.
        assert!(st.left("slot-002", 2));
        assert_eq!(st.role, WorkerRole::Standby);
        let served = serde_json::to_value(st.with_ages()).unwrap();
        assert_eq!(served["slots"], serde_json::json!([]));
        assert_eq!(served["leaving"], serde_json::json!([]));
    }

    #[test]
    fn a_loop_is_judged_stuck_only_after_several_heartbeats_and_never_within_30_s() {
        let t = Duration::from_secs(1);
        let beat = crate::worker::standby_line::beat_every(t);
        assert_eq!(stuck_after(t), (beat * 4).max(Duration::from_secs(30)));
        assert!(loop_alive(Duration::from_secs(29), t));
        assert!(!loop_alive(stuck_after(t), t));
        // A short tick still gets 30 s; a long one four beats.
        assert_eq!(
            stuck_after(Duration::from_millis(100)),
            Duration::from_secs(30)
        );
        let long = Duration::from_secs(60);
        assert_eq!(
            stuck_after(long),
            crate::worker::standby_line::beat_every(long) * 4
        );
        assert!(loop_alive(
            stuck_after(long) - Duration::from_millis(1),
            long
        ));
    }

    #[test]
    fn contact_begins_afresh_after_a_silence_longer_than_a_lease_and_a_tick() {
        let t = Duration::from_secs(1);
        let health = Health::default();
        let t0 = Instant::now();
        assert_eq!(health.contact(t0), Duration::ZERO, "no answer yet");
        health.answered(t0, Duration::from_millis(5), t);
        // A front standby's surveys come at most a lease apart: contact runs on.
        for k in 1..=3 {
            health.answered(t0 + t * 2 * k, Duration::from_millis(5), t);
        }
        assert_eq!(health.contact(t0 + t * 7), t * 7);
        // It asked nothing while the database was away for 4 s: the first answer
        // after that starts the contact again, though no request failed.
        let back = t0 + t * 11;
        health.answered(back, Duration::from_millis(5), t);
        assert_eq!(health.contact(back + t), t);
        // So does a rear standby's next heartbeat, at its pace: it cannot tell a
        // quiet spell from an outage it slept through.
        let pace =
            crate::worker::standby_line::beat_pace(crate::worker::standby_line::Place::Rear, t);
        health.answered(back + pace, Duration::from_millis(5), t);
        assert_eq!(health.contact(back + pace), Duration::ZERO);
    }

    #[test]
    fn after_a_failed_write_only_a_landed_write_starts_the_contact_again() {
        let t = Duration::from_secs(1);
        let health = Health::default();
        let t0 = Instant::now();
        let quick = Duration::from_millis(5);
        health.answered(t0, quick, t);
        assert_eq!(health.contact(t0 + t), t);
        // A claim refused by a member that stepped down: reads still answer.
        health.write_failed();
        assert_eq!(health.contact(t0 + t), Duration::ZERO);
        for k in 1..10 {
            health.answered(t0 + t * k, quick, t);
            assert_eq!(
                health.contact(t0 + t * k),
                Duration::ZERO,
                "a read is no contact"
            );
        }
        // A heartbeat lands: contact counts from it.
        health.write_landed(t0 + t * 10, quick, t);
        health.answered(t0 + t * 11, quick, t);
        assert_eq!(health.contact(t0 + t * 12), t * 2);
    }

    #[test]
    fn an_answer_slower_than_a_lease_and_a_tick_starts_the_contact_again() {
        let t = Duration::from_secs(1);
        let health = Health::default();
        let t0 = Instant::now();
        health.answered(t0, Duration::from_millis(5), t);
        health.answered(t0 + t, Duration::from_millis(5), t);
        assert_eq!(health.contact(t0 + t * 2), t * 2);
        // Sent right after the last answer and held 3.5 s by the link: the gap
        // between answers is what the request itself took.
        let late = t0 + t * 4 + Duration::from_millis(500);
        health.answered(late, Duration::from_millis(3500), t);
        assert_eq!(health.contact(late), Duration::ZERO);
        // A slow survey (2.5 s, a busy server) is still contact: otherwise a pool
        // whose surveys are slow would never see a lease of it.
        health.answered(late + t * 3, Duration::from_millis(2500), t);
        assert_eq!(health.contact(late + t * 3), t * 3);
    }
}
