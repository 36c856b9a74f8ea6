//! The worker: decides which slots to hold, and gives them back.
//!
//! Each round it heartbeats and re-reads its place in the line when those are due
//! ([`crate::worker::standby_line`]), surveys the expired slots, reads who else is
//! alive when that matters, and acts on what [`crate::worker::claim_policy`] decides:
//! claim an expired slot (at once as a standby; as overflow when standbys had their
//! chance), hand one back to a standby, or wait, and when to look again. At the front of the line rounds come every tick, at the earliest
//! expiry, or within a release poll (`--release-poll`) of a release; behind it,
//! every few ticks. Everything that lives as long as one held lease, renewals and
//! robots included, is a [`HeldSlot`]; a worker may hold several.

pub(crate) mod claim_policy;
pub(crate) mod clock_step;
pub(crate) mod connections;
pub(crate) mod hand_back;
pub(crate) mod held_slot;
pub(crate) mod holding;
pub(crate) mod http;
pub(crate) mod identity;
pub(crate) mod line_keeper;
pub(crate) mod load_sampler;
pub(crate) mod poke;
pub(crate) mod renewal_timing;
pub(crate) mod server_watch;
pub(crate) mod standby_line;
pub(crate) mod status;
pub(crate) mod supervisor;

pub use identity::WorkerError;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{MonotonicClock, SharedClock};
use crate::config::{Identity, LeaseTiming};
use crate::db::heartbeat::{LiveWorker, Roster};
use crate::db::lease::{LeaseProtocol, Survey};
use crate::db::store::Store;
use crate::metrics::Metrics;
use crate::random::{random_u64, random_unit};
use crate::robot::Registry;
use crate::worker::claim_policy::ClaimDecision;
use crate::worker::connections::Connections;
use crate::worker::hand_back::{HandBacks, Standby};
use crate::worker::held_slot::{Ended, HeldSlot, HoldContext};
use crate::worker::line_keeper::{Holdings, KeeperParts, LineKeeper, Moved};
use crate::worker::server_watch::ServerWatch;
use crate::worker::status::{Health, SharedStatus, WorkerStatus};

/// Everything a worker is configured with.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub identity: Identity,
    /// Where `/healthz`, `/metrics` and `/status` are served (the advertised port).
    pub listen: SocketAddr,
    pub timing: LeaseTiming,
    /// Start claims at the identity's hash position (off only for benchmarks).
    pub hashing: bool,
    /// How often the first standby in line asks whether a slot was released or
    /// added, between its surveys; None: only at its surveys (every tick).
    pub release_poll: Option<Duration>,
    /// The most slots this worker holds at once; None: no cap, so every robot runs
    /// while one worker lives.
    pub max_slots: Option<usize>,
    /// How long past its expiry a slot stays unheld before a holder with room
    /// claims it too (standbys claim at expiry). Default: one lease `L`.
    pub overflow_after: Duration,
    /// How many at the front of the line watch every tick (see [`crate::worker::standby_line`]).
    pub watchers: u64,
    /// How its load score is measured (`--capacity`, `--load-weights`).
    pub load: LoadSettings,
}

/// How a worker measures its load score (see [`crate::load`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSettings {
    /// The weights of the score's parts (`--load-weights`).
    pub weights: crate::load::LoadWeights,
    /// Robots it runs before its executors' part is full (`--capacity`).
    pub capacity: u64,
}

impl Default for LoadSettings {
    fn default() -> Self {
        LoadSettings {
            weights: crate::load::LoadWeights::default(),
            capacity: crate::load::DEFAULT_CAPACITY,
        }
    }
}

/// How a pause between two rounds ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// The worker is shutting down.
    Shutdown,
    /// Woken early: a held slot ended, or the release poll found a free slot.
    Woken,
    /// The wait is over.
    Due,
}

pub struct Worker {
    settings: WorkerSettings,
    store: Store,
    registry: Registry,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    status: SharedStatus,
    health: Arc<Health>,
    shutdown: CancellationToken,
    protocol: LeaseProtocol,
    /// Broken slot documents already logged (per reason).
    reported: HashSet<String>,
    held: Vec<HeldSlot>,
    /// What became of the slots handed back (see [`hand_back`]).
    hand_backs: HandBacks,
    /// Wakes the loop: a held slot that ended.
    wake: Arc<Notify>,
    /// This worker's place in the line, its heartbeat and the server's clock (see
    /// [`line_keeper::LineKeeper`]).
    line: LineKeeper,
    /// The claim policy's memory from one survey to the next.
    surveys: claim_policy::Memory,
    /// The release poll found a free slot: the next survey is its.
    polled_free: bool,
    /// No release poll before this (see [`Worker::survey_round`]).
    poll_muted_until: Instant,
    /// The robots' and the lease's connection pools.
    connections: Arc<Connections>,
    /// When this worker began (see [`claim_policy::may_claim`]).
    born: Instant,
    /// Every robot run of this worker, for its load and its slots' costs.
    meters: crate::robot::meter::Meters,
    /// The latest load and slot costs measured (see [`load_sampler`]).
    load: load_sampler::LoadReading,
}

impl Worker {
    pub fn new(settings: WorkerSettings, store: Store, registry: Registry) -> Self {
        Self::with_clock(settings, store, registry, Arc::new(MonotonicClock))
    }

    /// A worker whose every decision about time (renewals, the self-fence, surveys,
    /// heartbeats, hand-backs, robot restarts) reads and waits on `clock`, the one
    /// its leases use: tests drive the whole loop with a [`crate::clock::ManualClock`].
    pub fn with_clock(
        settings: WorkerSettings,
        store: Store,
        registry: Registry,
        clock: SharedClock,
    ) -> Self {
        // Lease traffic (survey, claim, renew, release, heartbeat) has a pool of its
        // own: robots' checkpoints must never delay a renewal. Each held slot renews
        // once a tick; a few connections serve several held slots at once.
        let connections = Arc::new(Connections::new(&store));
        let lease_store = connections.lease().clone();
        let mut protocol = LeaseProtocol::new(
            &lease_store,
            settings.identity,
            settings.timing,
            clock.clone(),
        );
        if !settings.hashing {
            protocol = protocol.without_hashing();
        }
        let now = clock.now();
        let instance = new_instance();
        let status = WorkerStatus {
            worker: settings.identity.to_string(),
            instance: instance.clone(),
            role: crate::db::heartbeat::WorkerRole::Standby,
            tick_ms: settings.timing.tick.as_millis() as u64,
            max_slots: settings.max_slots,
            version: env!("CARGO_PKG_VERSION"),
            last_round: Some(Instant::now()),
            ..Default::default()
        };
        let metrics = Arc::new(Metrics::default());
        let status = Arc::new(Mutex::new(status));
        let health = Arc::new(Health::default());
        let shutdown = CancellationToken::new();
        let load = load_sampler::LoadReading::default();
        let server = ServerWatch::new(
            settings.timing,
            metrics.clone(),
            store.clone(),
            settings.identity.to_string(),
        );
        let line = LineKeeper::new(
            KeeperParts {
                roster: Roster::new(&lease_store),
                identity: settings.identity,
                netns: identity::network_namespace(),
                watchers: settings.watchers,
                max_slots: settings.max_slots,
                timing: settings.timing,
                clock: clock.clone(),
                born: now,
                load: load.clone(),
                health: health.clone(),
                metrics: metrics.clone(),
                status: status.clone(),
                store: store.clone(),
                protocol: protocol.clone(),
                connections: connections.clone(),
                shutdown: shutdown.clone(),
                server,
            },
            instance,
        );
        Worker {
            settings,
            store,
            registry,
            clock,
            metrics,
            status,
            health,
            shutdown,
            protocol,
            reported: HashSet::new(),
            held: Vec::new(),
            hand_backs: HandBacks::default(),
            wake: Arc::new(Notify::new()),
            line,
            surveys: claim_policy::Memory::new(now),
            polled_free: false,
            poll_muted_until: now,
            connections,
            born: now,
            meters: Default::default(),
            load,
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    pub(crate) fn status(&self) -> SharedStatus {
        self.status.clone()
    }

    /// What takes pokes on the worker's port (see [`poke`]): at most one survey per
    /// [`poke::spacing`], none lost, woken on this worker's loop.
    pub(crate) fn poke_gate(&self) -> Arc<poke::PokeGate> {
        Arc::new(poke::PokeGate::new(
            poke::spacing(self.tick()),
            self.wake.clone(),
            self.metrics.clone(),
        ))
    }

    /// Cancel it to stop the worker gracefully (robots stopped, slots released).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    fn owner(&self) -> String {
        self.settings.identity.to_string()
    }

    fn tick(&self) -> Duration {
        self.settings.timing.tick
    }

    fn hold_context(&self) -> HoldContext {
        HoldContext {
            protocol: self.protocol.clone(),
            store: self.store.clone(),
            registry: self.registry.clone(),
            timing: self.settings.timing,
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            status: self.status.clone(),
            health: self.health.clone(),
            ended: self.wake.clone(),
            line: Roster::new(self.connections.lease()),
            watchers: self.settings.watchers,
            clock_steps: self.line.server().stepped(),
            meters: self.meters.clone(),
            load: self.load.clone(),
        }
    }

    /// Runs until the shutdown token is cancelled, then gives every slot back.
    /// Refuses to run (before claiming anything) while another live process
    /// advertises the same `ip:port`, and stops the same way if one takes the
    /// identity over later. The store it was given stays open: its caller closes
    /// it, last ([`Store::close`]); the worker closes only the clients it made.
    pub async fn run(mut self) -> Result<(), WorkerError> {
        tracing::info!(worker = %self.owner(), tick_ms = self.tick().as_millis() as u64, max_slots = ?self.settings.max_slots, "worker started as standby");
        let sampler = load_sampler::LoadSampler::new(
            self.settings.load.weights,
            self.settings.load.capacity,
            self.meters.clone(),
        )
        .spawn(
            self.load.clone(),
            self.metrics.clone(),
            self.status.clone(),
            self.shutdown.child_token(),
        );
        if let Err(e) = identity::take_identity(&mut self.line).await {
            // Nothing was claimed: only what began is ended.
            sampler.abort();
            self.connections.close().await;
            return Err(e);
        }
        // Where it stands, before its first survey: at a pool's cold start, only the
        // front surveys at once (the rest learn of the vacancies from the claimers'
        // pokes), rather than every new worker surveying and racing for every slot.
        let moved = self.line.read_place(Holdings::NONE, false).await;
        self.follow(moved);
        let mut woken = false;
        while !self.shutdown.is_cancelled() {
            self.reap().await;
            let wait = self.round(woken).await;
            self.status.lock().expect("status lock").round_done();
            woken = match self.pause(wait).await {
                Pause::Due => false,
                Pause::Woken => true,
                Pause::Shutdown => break,
            };
        }
        for h in &self.held {
            h.give_back();
        }
        for h in self.held.drain(..) {
            h.join().await;
        }
        self.line.leave().await;
        tracing::info!(worker = %self.owner(), "worker stopped");
        sampler.abort();
        // Last, its own lease client: nothing of this worker's uses it any more.
        self.connections.close().await;
        match self.line.take_refusal() {
            Some(e) => Err(WorkerError::IdentityInUse(e)),
            None => Ok(()),
        }
    }

    /// Waits `wait` for the next round, or less when woken early, by a held slot
    /// that ended or (first standby in line only) by the release poll finding a free
    /// slot.
    ///
    /// The release poll replaces a change stream on `slots`, whose cost grows with
    /// every renewal and checkpoint in the pool; the poll costs one indexed read per
    /// period whatever the pool does.
    async fn pause(&mut self, wait: Duration) -> Pause {
        let until = self.clock.now() + wait;
        loop {
            let now = self.clock.now();
            if now >= until {
                return Pause::Due;
            }
            let first_standby = self.held.is_empty() && self.line.first_in_line();
            let poll = self
                .settings
                .release_poll
                .filter(|_| first_standby && now >= self.poll_muted_until);
            let nap = poll.map_or(until - now, |p| p.min(until - now));
            tokio::select! {
                _ = self.shutdown.cancelled() => return Pause::Shutdown,
                _ = self.wake.notified() => return Pause::Woken,
                _ = self.clock.sleep(nap) => {}
            }
            if poll.is_some() && self.clock.now() < until && self.anything_free().await {
                self.polled_free = true;
                self.metrics.release_poll_hits.inc();
                return Pause::Woken;
            }
        }
    }

    /// The release poll's one read; false when it cannot tell.
    async fn anything_free(&self) -> bool {
        let Some(clock) = self.line.server().last() else {
            return false;
        };
        let read = self.protocol.anything_free(clock.now_ms());
        let sent = Instant::now();
        match tokio::time::timeout(self.line.op_timeout(), read).await {
            Ok(Ok(found)) => {
                self.line.answered(sent.elapsed());
                found
            }
            Ok(Err(e)) => {
                tracing::debug!("release poll failed: {}", self.store.scrub(&e.to_string()));
                false
            }
            Err(_) => false,
        }
    }

    /// Forgets held slots whose task ended (lost, drained or handed back).
    async fn reap(&mut self) {
        let (done, live): (Vec<HeldSlot>, Vec<HeldSlot>) =
            self.held.drain(..).partition(HeldSlot::is_finished);
        self.held = live;
        for h in done {
            let slot = h.slot_id.clone();
            if h.join().await == Ended::Lost {
                tracing::debug!(slot = %slot, "slot lost; robots stopped");
            }
        }
    }

    /// One round: survey when due (or when `woken` by a release or a slot that
    /// ended), claim or hand back, then heartbeat and re-read the place when due.
    /// Returns how long to wait before the next.
    ///
    /// The survey goes first: a standby woken at a lease's expiry claims at once,
    /// not behind the heartbeat's round trips, which on a loaded server can take most
    /// of the time a takeover has to spare.
    async fn round(&mut self, woken: bool) -> Duration {
        let began = self.clock.now();
        let wait = self.survey_round(woken).await;
        self.status.lock().expect("status lock").round_done();
        // A claim this round has read the place already (what it holds changed):
        // the poke is served.
        let poked = woken && self.line.placed_before(began);
        let leases = self.held_leases();
        let moved = self.line.keep_place(self.holdings(&leases), poked).await;
        if self.follow(moved) {
            // Moving up: look at once rather than at the rear's pace.
            self.surveys.next_at(self.clock.now());
            return Duration::ZERO;
        }
        wait.min(self.line.next_in())
    }

    /// Follows a move in the line with the surveys' pace: slower at the rear. True
    /// when the worker moved up to the front.
    fn follow(&mut self, moved: Moved) -> bool {
        match moved {
            Moved::ToFront => true,
            Moved::ToRear => {
                let standing = self.standing();
                self.surveys.at_rear(&standing);
                false
            }
            Moved::Stayed => false,
        }
    }

    /// Where this worker stands as it looks, for its surveys' pace.
    fn standing(&self) -> claim_policy::Standing {
        claim_policy::Standing {
            place: self.line.place(),
            held: self.held_leases().len(),
            tick: self.tick(),
            overflow_after: self.settings.overflow_after,
            now: self.clock.now(),
            random: random_unit(),
        }
    }

    /// The survey half of [`Worker::round`]: returns how long until the next survey.
    async fn survey_round(&mut self, woken: bool) -> Duration {
        let wait = self.survey_and_claim(woken).await;
        // The poll found something this worker could not take (a race lost, a broken
        // document, a holder whose lease is longer than its expires_ms says): poll
        // again only after the next survey, so it cannot turn into a survey loop.
        if std::mem::take(&mut self.polled_free) && self.held.is_empty() {
            self.poll_muted_until = self.surveys.next_survey();
        }
        wait
    }

    /// Surveys when due (or `woken`), then claims, gives a slot back or waits, as
    /// [`claim_policy::decide`] says; returns how long until the next survey.
    async fn survey_and_claim(&mut self, woken: bool) -> Duration {
        let standing = claim_policy::Standing {
            held: self.held.len(),
            ..self.standing()
        };
        let pace = match self.surveys.due(&standing, woken) {
            Ok(pace) => pace,
            Err(not_yet) => return not_yet,
        };
        let Some((survey, survey_took)) = self.survey(pace.horizon).await else {
            return self.tick();
        };
        let Some(alive) = self.live_if_needed(&survey).await else {
            return self.tick();
        };
        let me = self.owner();
        // First what became of the last hand-back: it may pass standbys over.
        let ready_to_give_back = self.hand_backs.ready(
            &self.held,
            |slot| survey.expired.iter().any(|c| c.id == slot),
            self.clock.now(),
            self.settings.timing.lease(),
        );
        let looked = claim_policy::Looked {
            me: &me,
            alive: &alive,
            held: self.held.len(),
            max_slots: self.settings.max_slots,
            passed_over: self.hand_backs.passed_over(),
            survey: &survey,
            survey_took,
            pace,
            woken,
            front: self.line.front(),
            my_score: self.load.load().map(|l| l.score()),
            contact: self.health.contact(Instant::now()),
            ready_to_give_back,
            step_hold: self.line.server().holding(Instant::now()),
            age: self.clock.since(self.born),
            overflow_after: self.settings.overflow_after,
            timing: &self.settings.timing,
            now: self.clock.now(),
        };
        let (decision, memory) = claim_policy::decide(&looked, self.surveys);
        self.surveys = memory;
        let wait = decision.wake_in();
        let moved = self.act(decision, &alive).await;
        let now = self.clock.now();
        self.surveys.next_at(now + wait);
        // A claim reads the place again: the next survey follows where it stands
        // now, not where it stood when the claim was decided.
        let standing = self.standing();
        match moved {
            Moved::ToFront => self.surveys.at_front(&standing),
            Moved::ToRear => self.surveys.at_rear(&standing),
            Moved::Stayed => {}
        }
        self.surveys.next_survey().saturating_duration_since(now)
    }

    /// Carries out what the claim policy decided; how a claim moved the worker in
    /// the line.
    async fn act(&mut self, decision: ClaimDecision, alive: &[LiveWorker]) -> Moved {
        match decision {
            ClaimDecision::GiveBack { .. } => {
                let standbys = alive
                    .iter()
                    .filter(|w| w.held == 0)
                    .map(|w| (w.id.clone(), w.seen_at_ms))
                    .collect();
                self.give_back_one(standbys);
            }
            ClaimDecision::Claim { slots, .. } => {
                self.connections.spare_lease();
                return self.claim(&slots, !self.held.is_empty()).await;
            }
            ClaimDecision::Wait {
                held_back: Some(ready),
                ..
            } => {
                self.connections.spare_lease();
                tracing::debug!(
                    age_ms = ready.age.as_millis() as u64,
                    survey_ms = ready.survey_took.as_millis() as u64,
                    "not claiming yet: this new worker waits out its first lease and a survey in time for a renewal"
                );
            }
            ClaimDecision::Wait {
                held_back: None, ..
            } => {}
        }
        Moved::Stayed
    }

    /// One survey of the slots, reading what expires within `horizon` too (it tells
    /// a watcher when to wake), with how long it took; None when it failed (said).
    async fn survey(&mut self, horizon: Duration) -> Option<(Survey, Duration)> {
        // A standby has no lease for a slow survey to hold back: it waits longer
        // for one. Bounded by op_timeout, a survey of 10,000 expired slots (a pool
        // just made) took longer than that on a 2-core machine, was abandoned and
        // sent again at once, for good, and the worker never claimed.
        let limit = self.survey_limit();
        let until = self
            .line
            .server()
            .last()
            .map(|c| c.latest_ms() + horizon.as_millis() as i64);
        let sent = Instant::now();
        let survey = match tokio::time::timeout(limit, self.protocol.survey(until)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.line.db_failed(&e.to_string());
                return None;
            }
            Err(_) => {
                // Not at once: a survey that did not finish in time would not the
                // next time either, and each one sent keeps the server busy.
                self.line
                    .db_failed(&format!("no answer within {} ms", limit.as_millis()));
                return None;
            }
        };
        let survey_took = sent.elapsed();
        self.metrics.surveys.inc();
        if let Some(server_ms) = survey.server_ms {
            self.line
                .server_mut()
                .read_at(server_ms, sent, Instant::now());
        }
        self.metrics.slots_unheld.set(survey.expired.len() as i64);
        let longest = survey.expired.iter().map(|c| c.expired_for).max();
        self.metrics
            .slot_unheld
            .set(longest.map_or(0.0, |d| d.as_secs_f64()));
        self.metrics.survey_docs.inc_by(survey.read as u64);
        self.line.answered(survey_took);
        self.health.ok(&self.metrics, &self.status);
        self.report_invalid(&survey.invalid);
        Some((survey, survey_took))
    }

    /// How long a survey or the live workers' read may take.
    fn survey_limit(&self) -> Duration {
        if self.held.is_empty() {
            self.line.op_timeout() * 5
        } else {
            self.line.op_timeout()
        }
    }

    /// The live workers, when the round needs them: to order overflow claims (some
    /// slot is expired) and to hand back (this worker holds more than one). A standby
    /// claims at expiry regardless, and a quiet holder of one slot reads nothing.
    /// None when the read failed (said).
    async fn live_if_needed(&mut self, survey: &Survey) -> Option<Vec<LiveWorker>> {
        let needed = !self.held.is_empty() && (!survey.expired.is_empty() || self.held.len() > 1);
        if !needed {
            return Some(Vec::new());
        }
        let roster = Roster::new(self.connections.lease());
        let alive = match tokio::time::timeout(self.survey_limit(), roster.live()).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                self.line.db_failed(&crate::db::store::brief(&e));
                return None;
            }
            Err(_) => return None,
        };
        self.hand_backs.keep_only(&alive);
        Some(alive)
    }

    /// `(slot, epoch)` of every slot held and not ended.
    fn held_leases(&self) -> Vec<(String, i64)> {
        self.held
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| (h.slot_id.clone(), h.epoch))
            .collect()
    }

    /// What this worker holds, for the line keeper: `leases` (see
    /// [`Worker::held_leases`]), and whether it holds anything at all.
    fn holdings<'a>(&self, leases: &'a [(String, i64)]) -> Holdings<'a> {
        Holdings {
            leases,
            any: !self.held.is_empty(),
        }
    }

    /// Logs each broken slot document once (per reason).
    fn report_invalid(&mut self, invalid: &[crate::db::lease::InvalidSlot]) {
        for bad in invalid {
            if self.reported.insert(format!("{}:{}", bad.id, bad.why)) {
                tracing::error!(slot = %bad.id, "skipping broken slot document: {}", bad.why);
            }
        }
    }

    /// Claims one of `claimable` (hash start, compare-and-set) and starts holding it;
    /// how the place read after it moved the worker in the line.
    async fn claim(&mut self, claimable: &[crate::db::lease::Candidate], overflow: bool) -> Moved {
        let limit = self.line.op_timeout();
        let outcome = match tokio::time::timeout(limit, self.protocol.claim_among(claimable)).await
        {
            Ok(Ok(outcome)) => outcome,
            failed => {
                // A claim may have landed without its answer: that slot then expires
                // unrenewed after L and is claimed again, with a new epoch. No
                // contact counts until a write lands (see Health::write_failed), and
                // the heartbeat is sent at the next round to find out when writes
                // land again (an election's "not primary", a lost answer).
                self.health.write_failed();
                self.line.beat_soon();
                self.line.db_failed(&match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer to a claim within {} ms", limit.as_millis()),
                });
                return Moved::Stayed;
            }
        };
        self.report_invalid(&outcome.refused);
        self.metrics.claim_attempts.inc_by(outcome.attempts as u64);
        self.metrics
            .claim_conflicts
            .inc_by(outcome.conflicts as u64);
        let Some(lease) = outcome.lease else {
            if outcome.conflicts > 0 {
                tracing::debug!(
                    conflicts = outcome.conflicts,
                    "every expired slot was taken first by another worker"
                );
            }
            return Moved::Stayed;
        };
        self.connections.reopen_after(self.health.outages());
        let held = HeldSlot::spawn(lease, self.hold_context(), overflow);
        self.held.push(held);
        // Tell the others who holds what right away (and move back in the line).
        let leases = self.held_leases();
        let moved = self.line.keep_place(self.holdings(&leases), false).await;
        if !overflow {
            self.line.poke_successors(claimable.len());
        }
        self.connections.holding(self.held.len(), limit);
        moved
    }

    /// Hands the most recently claimed slot back to a standby.
    fn give_back_one(&mut self, standbys: Vec<Standby>) {
        let Some(h) = self
            .held
            .iter()
            .filter(|h| !h.giving_back())
            .max_by_key(|h| h.claimed_at)
        else {
            return;
        };
        tracing::info!(slot = %h.slot_id, held = self.held.len(), "a standby is live: handing a slot back");
        h.give_back();
        self.hand_backs
            .handed(h.slot_id.clone(), self.clock.now(), standbys);
    }
}

/// A random id for this process (64 bits, hex), told apart from any other process
/// advertising the same `ip:port`.
fn new_instance() -> String {
    format!("{:016x}", random_u64())
}
