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
pub(crate) mod held_slot;
pub(crate) mod holding;
pub(crate) mod http;
pub(crate) mod identity;
pub(crate) mod load_sampler;
pub(crate) mod poke;
pub(crate) mod renewal_timing;
pub(crate) mod standby_line;
pub(crate) mod status;
pub(crate) mod supervisor;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::ServerClock;
use crate::clock::{MonotonicClock, SharedClock};
use crate::config::{Identity, LeaseTiming};
use crate::db::heartbeat::{Beat, BeatError, LiveWorker, Roster};
use crate::db::lease::{LeaseProtocol, Survey};
use crate::db::store::Store;
use crate::metrics::Metrics;
use crate::random::{random_u64, random_unit};
use crate::robot::Registry;
use crate::worker::claim_policy::{peers, ClaimDecision, HandBack, Round, Seen};
use crate::worker::held_slot::{Ended, HeldSlot, HoldContext};
use crate::worker::standby_line::{Looks, Place};
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

/// How a survey goes: where the worker stands, how far it reads, and when the next
/// one is due at this pace.
#[derive(Debug, Clone, Copy)]
struct Pace {
    place: Place,
    narrow: bool,
    every: Duration,
    horizon: Duration,
}

/// A standby as a hand-back saw it: its id and the heartbeat it had then.
type Standby = (String, Option<i64>);

/// Why a worker stopped by itself rather than on request.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Another live process advertises the same `ip:port`. Both would count as
    /// one worker in the line, in hand-backs and on the dashboard, so the one that
    /// finds the other refuses to run (at start, before it claims anything; or
    /// later, when its own heartbeat lapsed and the other took the identity over).
    #[error(transparent)]
    IdentityInUse(BeatError),
    /// The server refused the first heartbeat outright (not "not now"): sent again,
    /// it would be refused again, so the worker stops rather than retry for ever.
    #[error("the database server refused this worker's first heartbeat: {0}")]
    Refused(crate::db::store::Refusal),
}

/// What one heartbeat attempt gave.
enum Beaten {
    /// Written (and the server's clock read with it, when it was due).
    Written,
    /// The database did not take it (unreachable, slow): tried again later. Says
    /// why, scrubbed of credentials.
    Failed(String),
    /// The server answered and refused it: the same beat would be refused again.
    Refused(crate::db::store::Refusal),
    InUse(BeatError),
}

/// The other process's heartbeat under this identity, as this worker first found
/// it, and when waiting for it is over.
struct FirstSeen {
    predecessor: Option<crate::db::heartbeat::Predecessor>,
    deadline: Instant,
    /// Whether the wait was logged.
    warned: bool,
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

/// A slot handed back to a standby, until someone holds it again.
#[derive(Debug)]
struct HandedBack {
    slot: String,
    /// When it was handed back.
    at: Instant,
    /// The standbys of the moment, with their last heartbeats: passed over if none
    /// takes it.
    standbys: Vec<Standby>,
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
    /// This process's random id in its heartbeat (see [`Roster::beat`]).
    instance: String,
    /// The network namespace this process beats from (see [`identity`]).
    netns: Option<String>,
    /// Set when another process took this worker's identity: the loop stops.
    refused: Option<BeatError>,
    protocol: LeaseProtocol,
    reported: HashSet<String>,
    held: Vec<HeldSlot>,
    /// A slot this worker handed back, until someone holds it again: no further
    /// hand-back meanwhile, so one standby never gets two slots and none is left
    /// unheld.
    handed_back: Option<HandedBack>,
    /// Standbys that left a slot handed to them untaken, with the heartbeat they had
    /// then: passed over until they beat again (see [`crate::worker::claim_policy::HandBack`]).
    passed_over: HashMap<String, Option<i64>>,
    /// Wakes the loop: a held slot that ended.
    wake: Arc<Notify>,
    line: Roster,
    /// The server's clock as last read with a heartbeat (see
    /// [`standby_line::CLOCK_REFRESH`]).
    server: Option<ServerClock>,
    /// Forward steps of the server's clock, and the claims they hold back (see
    /// [`clock_step`]).
    steps: clock_step::StepWatch,
    /// How many forward steps of the server's clock this worker has seen: each held
    /// slot reads the server's clock again for its scheduled robots when it changes.
    clock_steps: Arc<std::sync::atomic::AtomicU64>,
    /// When to look next, and what the last looks found.
    looks: Looks,
    /// The lease's own connection pool (see [`Store::dedicated`]).
    lease_store: Store,
    /// Whether `lease_store` has a client of its own (else it shares `store`'s,
    /// which is its caller's to close).
    own_lease_client: bool,
    /// Whether the robots' pool was warmed (see [`ROBOT_POOL_WARM`]).
    robots_warmed: bool,
    /// The lease pool's spare connection: [`SPARE_NONE`], [`SPARE_OPENING`] or
    /// [`SPARE_OPEN`].
    lease_spare: Arc<std::sync::atomic::AtomicU8>,
    /// When this worker began (see [`claim_policy::may_claim`]).
    born: Instant,
    /// Every robot run of this worker, for its load and its slots' costs.
    meters: crate::robot::meter::Meters,
    /// The latest load and slot costs measured (see [`load_sampler`]).
    load: load_sampler::LoadReading,
}

/// The lease pool's spare connection: not opened (or its opening failed), ...
const SPARE_NONE: u8 = 0;
/// ... being opened, ...
const SPARE_OPENING: u8 = 1;
/// ... open.
const SPARE_OPEN: u8 = 2;

/// The most connections the lease's own pool opens: renewals of several held slots
/// and the loop's survey, heartbeat or place read may overlap. A standby keeps one
/// open until it first stands at the front, then two (see
/// [`claim_policy::may_claim`]); a holder of `n > 1` slots, `n + 1` (see
/// [`Store::dedicated`]).
const LEASE_POOL: u32 = 4;

/// Connections the robots' pool keeps open once this worker stands at the front of
/// the line: what a watcher's claim sends at once (the claim's event, the server's
/// clock, the slot's robots, the adoption beside the first firing's write), each of
/// which would otherwise cost a handshake first. A worker further back keeps one;
/// it opens the rest when it first moves up.
const ROBOT_POOL_WARM: u32 = 4;

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
        let (lease_store, own_lease_client) = match store.for_leases(LEASE_POOL, 1) {
            Ok(own) => (own, true),
            Err(e) => {
                tracing::warn!(
                    "no dedicated lease connection pool ({e}); sharing the robots' pool"
                );
                (store.clone(), false)
            }
        };
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
        let timing = settings.timing;
        let steps = clock_step::StepWatch::new(
            timing.lease(),
            clock_step::StepWatch::tolerance(timing.margin, timing.stop_grace),
            Instant::now(),
        );
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
        Worker {
            settings,
            store,
            registry,
            clock,
            metrics: Arc::new(Metrics::default()),
            status: Arc::new(Mutex::new(status)),
            health: Arc::new(Health::default()),
            shutdown: CancellationToken::new(),
            instance,
            netns: identity::network_namespace(),
            refused: None,
            protocol,
            reported: HashSet::new(),
            held: Vec::new(),
            handed_back: None,
            passed_over: HashMap::new(),
            wake: Arc::new(Notify::new()),
            line: Roster::new(&lease_store),
            server: None,
            steps,
            clock_steps: Arc::default(),
            looks: Looks::new(now),
            lease_store,
            own_lease_client,
            robots_warmed: false,
            lease_spare: Arc::new(std::sync::atomic::AtomicU8::new(SPARE_NONE)),
            born: now,
            meters: Default::default(),
            load: Default::default(),
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

    /// How long this worker still leaves slots vacant since before it began (see
    /// [`claim_policy::first_hold`]): its heartbeat says so, and holders leave such
    /// slots to it meanwhile (see [`claim_policy::Round::claimable`]).
    fn settles_in(&self) -> Duration {
        claim_policy::first_hold(&self.settings.timing).saturating_sub(self.clock.since(self.born))
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
            line: self.line.clone(),
            watchers: self.settings.watchers,
            clock_steps: self.clock_steps.clone(),
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
        self.take_identity().await?;
        // Where it stands, before its first survey: at a pool's cold start, only the
        // front surveys at once (the rest learn of the vacancies from the claimers'
        // pokes), rather than every new worker surveying and racing for every slot.
        self.read_place(false).await;
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
        self.leave().await;
        sampler.abort();
        // Last, its own lease client: nothing of this worker's uses it any more, and
        // a client shut down holds no request in flight when the process ends (see
        // main.rs). The store it was given is its caller's to close.
        if self.own_lease_client {
            self.lease_store.close().await;
        }
        match self.refused.take() {
            Some(e) => Err(WorkerError::IdentityInUse(e)),
            None => Ok(()),
        }
    }

    /// Beats once before anything else, so a second process with this worker's
    /// `ip:port` is found before it claims a slot. Another process's heartbeat there
    /// is judged as [`identity`] says: a predecessor gone from this worker's own
    /// address, holding no lease, is replaced at once; one that answers there, or
    /// beats again meanwhile, is a live second worker, and this one refuses to run;
    /// otherwise it is waited out, as long as it was still believed when first seen.
    async fn take_identity(&mut self) -> Result<(), WorkerError> {
        let mut first: Option<FirstSeen> = None;
        while !self.shutdown.is_cancelled() {
            let pace = standby_line::beat_pace(self.place(), self.tick());
            let pause = match self.bounded_heartbeat(pace).await {
                Beaten::Written => {
                    self.beaten(Vec::new(), pace);
                    return Ok(());
                }
                Beaten::Failed(why) => {
                    self.db_failed(&format!("the first heartbeat was not written: {why}"));
                    self.tick()
                }
                Beaten::Refused(r) => return Err(WorkerError::Refused(r)),
                Beaten::InUse(e) => match self.judge_predecessor(e, &mut first, pace).await? {
                    Some(pause) => pause,
                    None => return Ok(()),
                },
            };
            self.status.lock().expect("status lock").round_done();
            tokio::select! {
                _ = self.shutdown.cancelled() => {}
                _ = self.clock.sleep(pause) => {}
            }
        }
        Ok(())
    }

    /// One look at the other process's heartbeat under this identity (`e`, as this
    /// beat found it): `None` once this worker took the identity over, else how long
    /// to wait before the next look; an error when it must not run.
    async fn judge_predecessor(
        &mut self,
        e: BeatError,
        first: &mut Option<FirstSeen>,
        pace: Duration,
    ) -> Result<Option<Duration>, WorkerError> {
        let (left, now_seen) = match &e {
            BeatError::IdentityInUse {
                left_ms,
                predecessor,
                ..
            } => (
                Duration::from_millis((*left_ms).max(0) as u64),
                predecessor.clone(),
            ),
            BeatError::Db(_) => return Ok(Some(self.tick())),
        };
        let now = self.clock.now();
        let seen = first.get_or_insert_with(|| FirstSeen {
            predecessor: now_seen.clone(),
            deadline: now + left + self.tick(),
            warned: false,
        });
        let past_deadline = now >= seen.deadline;
        let until_deadline = seen.deadline.saturating_duration_since(now);
        let (Some(was), Some(is)) = (seen.predecessor.clone(), now_seen) else {
            // A heartbeat that names no process: only waiting it out is left.
            if past_deadline {
                tracing::error!(worker = %self.owner(), "{e}");
                return Err(WorkerError::IdentityInUse(e));
            }
            if !std::mem::replace(&mut seen.warned, true) {
                tracing::warn!(worker = %self.owner(), "{e}; waiting {} ms for it to lapse", left.as_millis());
            }
            let next = (left + Duration::from_millis(50)).min(until_deadline);
            return Ok(Some(next.max(Duration::from_millis(50))));
        };
        let addr = self.settings.identity.socket_addr();
        let at = identity::probe(addr, &self.instance, &is.instance).await;
        let conclusive = identity::answer_is_conclusive(
            addr.ip().is_loopback(),
            self.netns.as_deref(),
            is.netns.as_deref(),
        );
        let leased = at == identity::AtAddress::Me
            && conclusive
            && !matches!(
                tokio::time::timeout(
                    self.bookkeeping_timeout(),
                    self.protocol.leased_under_identity()
                )
                .await,
                Ok(Ok(false))
            );
        match identity::verdict(&was, &is, &at, conclusive, leased, past_deadline) {
            identity::Verdict::TakeOver => {
                if self.take_over(&is, pace).await {
                    tracing::info!(worker = %self.owner(), predecessor = %is.instance, "took over this address's identity from a predecessor gone from it: this process answers at the address, and no slot is leased under it");
                    self.beaten(Vec::new(), pace);
                    return Ok(None);
                }
                // It beat meanwhile (the next look refuses), or the write failed
                // or was refused: look again a tick on, not at once.
                Ok(Some(self.tick()))
            }
            identity::Verdict::Refuse(why) => {
                tracing::error!(worker = %self.owner(), "{e}: {why}");
                Err(WorkerError::IdentityInUse(e))
            }
            identity::Verdict::Wait => {
                if !seen.warned {
                    seen.warned = true;
                    let about = if at == identity::AtAddress::Me && conclusive {
                        "a slot is still leased under it: waiting for that lease to run out or the heartbeat to lapse"
                    } else {
                        "its address does not lead back to this process, so it may be alive: waiting for it to lapse, in case it was this worker's predecessor"
                    };
                    tracing::warn!(worker = %self.owner(), "{e}; {about} (at most {} ms)", until_deadline.as_millis());
                }
                // A lease runs out within one: look again each tick. Otherwise only
                // the heartbeat's own lapse can change the answer.
                let next = if at == identity::AtAddress::Me && conclusive {
                    self.tick()
                } else {
                    left + Duration::from_millis(50)
                };
                Ok(Some(
                    next.min(until_deadline).max(Duration::from_millis(50)),
                ))
            }
        }
    }

    /// Replaces the predecessor's heartbeat, as read, with this worker's first.
    async fn take_over(
        &mut self,
        predecessor: &crate::db::heartbeat::Predecessor,
        pace: Duration,
    ) -> bool {
        let limit = self.bookkeeping_timeout();
        let me = self.owner();
        let beat = Beat {
            me: &me,
            instance: &self.instance,
            netns: self.netns.as_deref(),
            held: &[],
            max_slots: self.settings.max_slots,
            tick: self.tick(),
            pace,
            settles_in: self.settles_in(),
            load: self.load.load(),
        };
        matches!(
            tokio::time::timeout(limit, self.line.take_over(&beat, predecessor)).await,
            Ok(Ok(true))
        )
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
            let first_standby = self.held.is_empty() && self.looks.ahead == 0;
            let poll = self
                .settings
                .release_poll
                .filter(|_| first_standby && now >= self.looks.poll_muted_until);
            let nap = poll.map_or(until - now, |p| p.min(until - now));
            tokio::select! {
                _ = self.shutdown.cancelled() => return Pause::Shutdown,
                _ = self.wake.notified() => return Pause::Woken,
                _ = self.clock.sleep(nap) => {}
            }
            if poll.is_some() && self.clock.now() < until && self.anything_free().await {
                self.looks.polled_free = true;
                self.metrics.release_poll_hits.inc();
                return Pause::Woken;
            }
        }
    }

    /// The release poll's one read; false when it cannot tell.
    async fn anything_free(&self) -> bool {
        let Some(clock) = self.server else {
            return false;
        };
        let read = self.protocol.anything_free(clock.now_ms());
        let sent = Instant::now();
        match tokio::time::timeout(self.op_timeout(), read).await {
            Ok(Ok(found)) => {
                self.answered(sent.elapsed());
                found
            }
            Ok(Err(e)) => {
                tracing::debug!("release poll failed: {}", self.store.scrub(&e.to_string()));
                false
            }
            Err(_) => false,
        }
    }

    /// Opens the lease pool's spare connection, in the background, if it is not
    /// open or opening: the first renewals then find a connection ready. A failure
    /// (no answer within [`claim_policy::SETTLE_MOST`]) lets the next call try again.
    fn spare_lease_connection(&mut self) {
        use std::sync::atomic::Ordering;
        let state = &self.lease_spare;
        if state
            .compare_exchange(
                SPARE_NONE,
                SPARE_OPENING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            let (store, state) = (self.lease_store.clone(), state.clone());
            tokio::spawn(async move {
                let opened = store.warm(2, claim_policy::SETTLE_MOST).await;
                if !opened {
                    tracing::debug!(
                        "the lease's spare connection did not open; trying again at the next claim"
                    );
                }
                state.store(
                    if opened { SPARE_OPEN } else { SPARE_NONE },
                    Ordering::Release,
                );
            });
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
        let poked = woken && self.looks.placed_at.is_none_or(|t| t < began);
        let moved_up = self.keep_place(poked).await;
        let now = self.clock.now();
        if moved_up {
            // Moving up: look at once rather than at the rear's pace.
            self.looks.next_survey = now;
            return Duration::ZERO;
        }
        // Rounds come at least once a front-paced beat even at the rear, where they
        // ask the database nothing unless something is due: `/livez` judges the
        // loop by them.
        let wait = wait
            .min(self.looks.next_beat.saturating_duration_since(now))
            .min(standby_line::beat_every(self.tick()));
        if self.looks.place_wanted {
            let since_read = self.looks.placed_at.map(|t| self.clock.since(t));
            return wait.min(standby_line::poked_place_in(since_read, self.tick()));
        }
        wait
    }

    /// The survey half of [`Worker::round`]: returns how long until the next survey.
    async fn survey_round(&mut self, woken: bool) -> Duration {
        let wait = self.survey_and_claim(woken).await;
        // The poll found something this worker could not take (a race lost, a broken
        // document, a holder whose lease is longer than its expires_ms says): poll
        // again only after the next survey, so it cannot turn into a survey loop.
        if std::mem::take(&mut self.looks.polled_free) && self.held.is_empty() {
            self.looks.poll_muted_until = self.looks.next_survey;
        }
        wait
    }

    /// Surveys when due (or `woken`), then claims, gives a slot back or waits, as
    /// [`claim_policy::decide`] says; returns how long until the next survey.
    async fn survey_and_claim(&mut self, woken: bool) -> Duration {
        let pace = match self.survey_due(woken) {
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
        let ready_to_give_back = self.ready_to_give_back(&survey);
        let workers = peers(
            &alive,
            &me,
            self.held.len(),
            self.settings.max_slots,
            &self.passed_over,
        );
        // Slots expired or about to lapse together, as this survey or the one a tick
        // before it saw them (see Round::expiring).
        let now = self.clock.now();
        let expiring_now = survey.expired.len() + survey.expiring_soon;
        let expiring = match self.looks.expiring {
            Some((at, n)) if self.clock.since(at) <= self.tick() => n.max(expiring_now),
            _ => expiring_now,
        };
        self.looks.expiring = Some((now, expiring_now));
        let seen = Seen {
            round: Round {
                me: &me,
                workers: &workers,
                expired: &survey.expired,
                overflow_after: self.settings.overflow_after,
                tick: self.tick(),
                contact: self.health.contact(Instant::now()),
                idler_in_front: claim_policy::idler_in_front(
                    &me,
                    self.load.load().map(|l| l.score()),
                    &self.looks.front,
                ),
                expiring,
            },
            place: pace.place,
            woken,
            narrow: pace.narrow,
            every: pace.every,
            next_expiry: survey.next_expiry,
            ready_to_give_back,
            step_hold: self.steps.holding(Instant::now()),
            age: self.clock.since(self.born),
            survey_took,
            timing: &self.settings.timing,
        };
        let decision = claim_policy::decide(&seen);
        let wait = decision.wake_in();
        self.act(decision, &alive).await;
        self.looks.next_survey = self.clock.now() + wait;
        wait
    }

    /// Whether a survey is due now (or `woken`): its pace if so, else how long
    /// until it is.
    fn survey_due(&mut self, woken: bool) -> Result<Pace, Duration> {
        let now = self.clock.now();
        let narrow = self.looks.narrow(now);
        let (place, held, tick) = (self.place(), self.held.len(), self.tick());
        if !woken && now < self.looks.next_survey {
            return Err(self.looks.next_survey - now);
        }
        let every =
            claim_policy::survey_every(place, held, narrow, tick, self.settings.overflow_after);
        let every = self.spread(every);
        self.looks.next_survey = now + every;
        Ok(Pace {
            place,
            narrow,
            every,
            horizon: claim_policy::survey_horizon(place, held, narrow, tick),
        })
    }

    /// Carries out what the claim policy decided.
    async fn act(&mut self, decision: ClaimDecision, alive: &[LiveWorker]) {
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
                self.spare_lease_connection();
                self.claim(&slots, !self.held.is_empty()).await;
            }
            ClaimDecision::Wait {
                held_back: Some(ready),
                ..
            } => {
                self.spare_lease_connection();
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
            .server
            .map(|c| c.latest_ms() + horizon.as_millis() as i64);
        let sent = Instant::now();
        let survey = match tokio::time::timeout(limit, self.protocol.survey(until)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.db_failed(&e.to_string());
                return None;
            }
            Err(_) => {
                // Not at once: a survey that did not finish in time would not the
                // next time either, and each one sent keeps the server busy.
                self.db_failed(&format!("no answer within {} ms", limit.as_millis()));
                return None;
            }
        };
        let survey_took = sent.elapsed();
        self.metrics.surveys.inc();
        if let Some(server_ms) = survey.server_ms {
            let received = Instant::now();
            self.server_clock_read(server_ms, sent, received);
            // The freshest reading narrows the next surveys too: after a forward
            // step, an older one would leave them reading too little.
            self.server = Some(ServerClock::observed(server_ms, sent, received));
        }
        if horizon > self.tick() && survey.read > claim_policy::WIDE_MOST {
            self.looks.narrow_until = Some(self.clock.now() + claim_policy::NARROW_FOR);
        }
        self.metrics.slots_unheld.set(survey.expired.len() as i64);
        let longest = survey.expired.iter().map(|c| c.expired_for).max();
        self.metrics
            .slot_unheld
            .set(longest.map_or(0.0, |d| d.as_secs_f64()));
        self.metrics.survey_docs.inc_by(survey.read as u64);
        self.answered(survey_took);
        self.health.ok(&self.metrics, &self.status);
        self.report_invalid(&survey.invalid);
        Some((survey, survey_took))
    }

    /// How long a survey or the live workers' read may take.
    fn survey_limit(&self) -> Duration {
        if self.held.is_empty() {
            self.op_timeout() * 5
        } else {
            self.op_timeout()
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
        let alive = match tokio::time::timeout(self.survey_limit(), self.line.live()).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                self.db_failed(&crate::db::store::brief(&e));
                return None;
            }
            Err(_) => return None,
        };
        // Forget the passed-over once they are no longer believed alive.
        self.passed_over
            .retain(|id, _| alive.iter().any(|w| &w.id == id));
        Some(alive)
    }

    /// Heartbeats when one is due or what this worker holds changed, and then
    /// re-reads its place in the line when that is due (see
    /// [`standby_line::place_due`]) or when `woken` (a poke: someone ahead may have
    /// claimed). True when it moved up to the front.
    async fn keep_place(&mut self, woken: bool) -> bool {
        let holding = self.held_leases();
        let ids: Vec<String> = holding.iter().map(|(s, _)| s.clone()).collect();
        let changed = self.looks.beaten.as_ref() != Some(&ids);
        let beat_due = changed || self.clock.now() >= self.looks.next_beat;
        if beat_due {
            let pace = standby_line::beat_pace(self.place(), self.tick());
            let beaten = self.bounded_heartbeat(pace).await;
            // A step of the round: `/livez` judges the loop by these too, as one
            // round may hold a survey, two heartbeats and a place read.
            self.status.lock().expect("status lock").round_done();
            match beaten {
                Beaten::Written => self.beaten(ids, pace),
                failed @ (Beaten::Failed(_) | Beaten::Refused(_)) => {
                    let why = match failed {
                        Beaten::Refused(r) => format!("refused by the server: {r}"),
                        Beaten::Failed(why) => why,
                        _ => unreachable!("matched above"),
                    };
                    self.health.write_failed();
                    if self.judged_by_heartbeat() {
                        self.db_failed(&format!("the heartbeat was not written: {why}"));
                    }
                    // Tried again within a front-paced beat, not the rear's 40 s:
                    // the last beat that landed is believed for two of its own
                    // paces, and a standby behind the watchers is unready until one
                    // lands (one slow write must not hold it so for 40 s).
                    let retry = pace.min(standby_line::beat_every(self.tick()));
                    self.looks.next_beat = self.clock.now() + retry;
                    self.looks.beat_failed = true;
                    // A place read a poke put off goes with the failed beat: kept,
                    // it would have the round come back at once, and beat again
                    // at once, for as long as the database fails (what it holds
                    // changed, so a beat is due every round until one lands). The
                    // next beat that lands reads the place.
                    self.looks.place_wanted = false;
                    return false;
                }
                Beaten::InUse(e) => {
                    tracing::error!(worker = %self.owner(), "{e}; this process's heartbeat had lapsed and another took its identity over: stopping its robots and exiting");
                    self.refused = Some(e);
                    self.shutdown.cancel();
                    return false;
                }
            }
        }
        let since_read = self.looks.placed_at.map(|t| self.clock.since(t));
        let beat = standby_line::beat_every(self.tick());
        let due = beat_due && standby_line::place_due(self.place(), changed, since_read, beat);
        let wanted = woken || self.looks.place_wanted;
        if !(due || wanted) {
            return false;
        }
        if !due && !standby_line::poked_place_in(since_read, self.tick()).is_zero() {
            // Read when the last read is a tick old: `round` wakes for it.
            self.looks.place_wanted = true;
            return false;
        }
        self.looks.place_wanted = false;
        let was = self.place();
        self.read_place(true).await;
        self.status.lock().expect("status lock").round_done();
        let place = self.place();
        if place == Place::Front && was == Place::Rear {
            // Its last heartbeat promised the rear's pace: a watcher that died would
            // be believed for two of those. Promise the front's at once.
            let pace = standby_line::beat_pace(place, self.tick());
            if self.looks.pace > pace {
                if let Beaten::Written = self.bounded_heartbeat(pace).await {
                    self.beaten(
                        self.held_leases().into_iter().map(|(s, _)| s).collect(),
                        pace,
                    );
                }
            }
        }
        place == Place::Front && was != Place::Front
    }

    /// Records a heartbeat written for `ids` that promised `pace`: the next comes at
    /// that pace, or, after the first at a pace (a new one, or the first since a beat
    /// failed), at a random point of its second half (see
    /// [`standby_line::next_beat_in`]).
    fn beaten(&mut self, ids: Vec<String>, pace: Duration) {
        let first = pace != self.looks.pace || std::mem::take(&mut self.looks.beat_failed);
        self.looks.beaten = Some(ids);
        self.looks.pace = pace;
        let next = standby_line::next_beat_in(pace, first, random_unit());
        self.looks.next_beat = self.clock.now() + next;
    }

    /// Reads this worker's place in the line (and the server's clock with it). The
    /// first in line also marks, now and then, slots the survey's index cannot see.
    /// Unsure where it stands (no answer), a worker watches, as every worker did
    /// before the line; `settled` says it stood somewhere already, so a move to the
    /// rear reschedules its survey at the rear's pace.
    async fn read_place(&mut self, settled: bool) {
        self.looks.placed_at = Some(self.clock.now());
        let me = self.owner();
        let held = self.held_leases().len();
        let limit = self.bookkeeping_timeout();
        let was = self.place();
        let watchers = self.settings.watchers;
        // Kept through a failed read: any standby ahead is a sound place to start.
        let near = self.looks.near.clone();
        let read = self.line.place(&me, held, watchers, near.as_deref());
        let sent = Instant::now();
        match tokio::time::timeout(limit, read).await {
            Ok(Ok(placed)) => {
                self.metrics.place_reads.inc();
                if placed.whole {
                    self.metrics.place_reads_whole.inc();
                }
                // Only a standby behind the front starts its next read at its
                // nearest: at the front a read from there finds too few by
                // definition, and would only come before the whole one.
                if let Some(front) = placed.front.clone() {
                    let idler = claim_policy::idler_in_front(
                        &self.owner(),
                        self.load.load().map(|l| l.score()),
                        &front,
                    );
                    self.status.lock().expect("status lock").idler_in_front = Some(idler);
                    self.looks.front = front;
                }
                if held > 0 {
                    self.status.lock().expect("status lock").idler_in_front = None;
                }
                let behind = held == 0 && placed.ahead >= watchers;
                self.looks.ahead = placed.ahead.min(watchers);
                self.looks.near = placed.near.filter(|_| behind);
                if let Some(c) = placed.clock {
                    let (server_ms, sent, received) = c.reading();
                    self.server_clock_read(server_ms, sent, received);
                    self.server = Some(c);
                }
                self.answered(sent.elapsed());
                self.standby_reached_database();
            }
            Ok(Err(_)) | Err(_) => self.looks.ahead = 0,
        }
        let place = self.place();
        if place != was || !settled {
            tracing::debug!(?place, ahead = self.looks.ahead, "moved in the line");
        }
        if place == Place::Rear && (was == Place::Front || !settled) {
            let every = claim_policy::survey_every(
                place,
                held,
                true,
                self.tick(),
                self.settings.overflow_after,
            );
            let at = self.clock.now() + self.spread(every);
            self.looks.next_survey = at;
        }
        self.metrics.line_front.set((place == Place::Front) as i64);
        if place == Place::Front && !self.robots_warmed {
            self.robots_warmed = true;
            let (store, within) = (self.store.clone(), self.op_timeout());
            tokio::spawn(async move { store.warm(ROBOT_POOL_WARM, within).await });
            self.spare_lease_connection();
        }
        // One marker is enough: the first in line, now and then.
        let due = self
            .looks
            .marked_at
            .is_none_or(|t| self.clock.since(t) >= standby_line::MARK_EVERY);
        if self.looks.ahead == 0 && due {
            self.looks.marked_at = Some(self.clock.now());
            if self.looks.indexes_ensured {
                self.mark_unknown().await;
            } else {
                self.looks.indexes_ensured = true;
                self.ensure_indexes().await;
            }
        }
    }

    /// A survey period at the rear, spread to a random point of its second half
    /// (see [`claim_policy::rear_survey_in`]); anything shorter than a tick's few
    /// multiples is kept as it is.
    fn spread(&self, every: Duration) -> Duration {
        if self.place() != Place::Rear || every <= self.tick() * crate::db::heartbeat::REAR_TICKS {
            return every;
        }
        claim_policy::rear_survey_in(every, random_unit())
    }

    /// Where this worker stands in the line.
    fn place(&self) -> Place {
        Place::behind(self.looks.ahead, self.settings.watchers)
    }

    /// The first in line, once, makes sure the indexes the line and the survey read
    /// through exist (a pool made by an older `init` lacks some; creating one that
    /// exists changes nothing) and marks slots without `expires_ms`. Only the first:
    /// at a pool's cold start, each of hundreds of workers sending its five
    /// statements at once was that much more for a holder's first renewal to queue
    /// behind.
    async fn ensure_indexes(&self) {
        let made = crate::db::lease::ensure_indexes(&self.store);
        match tokio::time::timeout(self.op_timeout() * 5, made).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                "could not create the lease indexes ({}); surveys read every slot",
                self.store.scrub(&e.to_string())
            ),
            Err(_) => {
                tracing::warn!("no answer creating the lease indexes; surveys read every slot")
            }
        }
    }

    /// The first in line makes sure the survey's index sees every slot: one inserted
    /// by hand or by an older version has no `expires_ms` (an indexed test, cheap when
    /// there is none).
    async fn mark_unknown(&self) {
        match tokio::time::timeout(self.op_timeout(), self.protocol.mark_unknown()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(
                slots = n,
                "slots without expires_ms (inserted by hand or by an older version) are now surveyed"
            ),
            Ok(Err(e)) => tracing::debug!("could not mark slots without expires_ms: {e}"),
            Err(_) => tracing::debug!("no answer marking slots without expires_ms"),
        }
    }

    /// `(slot, epoch)` of every slot held and not ended.
    fn held_leases(&self) -> Vec<(String, i64)> {
        self.held
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| (h.slot_id.clone(), h.epoch))
            .collect()
    }

    /// Logs each broken slot document once (per reason).
    fn report_invalid(&mut self, invalid: &[crate::db::lease::InvalidSlot]) {
        for bad in invalid {
            if self.reported.insert(format!("{}:{}", bad.id, bad.why)) {
                tracing::error!(slot = %bad.id, "skipping broken slot document: {}", bad.why);
            }
        }
    }

    /// One reading of the server's clock, made between `sent` and `received`: a
    /// forward step is logged, counted and recorded, and holds stamped slots back
    /// for a lease (see [`clock_step`]).
    fn server_clock_read(&mut self, server_ms: i64, sent: Instant, received: Instant) {
        let Some(step_ms) = self.steps.observe(server_ms, sent, received) else {
            return;
        };
        self.metrics.server_clock_steps.inc();
        // Held slots read the server's clock again for their scheduled robots.
        self.clock_steps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lease_ms = self.settings.timing.lease_ms();
        tracing::warn!(
            step_ms,
            "the database server's clock stepped forward by at least {step_ms} ms: leases stamped before it may look expired while their holders still run, so no such slot is claimed for {lease_ms} ms (one lease)"
        );
        let store = self.store.clone();
        let me = self.owner();
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

    /// Claims one of `claimable` (hash start, compare-and-set) and starts holding it.
    async fn claim(&mut self, claimable: &[crate::db::lease::Candidate], overflow: bool) {
        match tokio::time::timeout(self.op_timeout(), self.protocol.claim_among(claimable)).await {
            Err(_) => {
                // A claim may have landed without its answer: that slot then expires
                // unrenewed after L and is claimed again, with a new epoch.
                self.claim_failed();
                self.db_failed(&format!(
                    "no answer to a claim within {} ms",
                    self.op_timeout().as_millis()
                ));
            }
            Ok(Ok(outcome)) => {
                self.report_invalid(&outcome.refused);
                self.metrics.claim_attempts.inc_by(outcome.attempts as u64);
                self.metrics
                    .claim_conflicts
                    .inc_by(outcome.conflicts as u64);
                match outcome.lease {
                    Some(lease) => {
                        self.reopen_after_outage();
                        let held = HeldSlot::spawn(lease, self.hold_context(), overflow);
                        self.held.push(held);
                        // Tell the others who holds what right away (and move back
                        // in the line).
                        self.keep_place(false).await;
                        if !overflow {
                            self.poke_successors(claimable.len());
                        }
                        // A second slot's renewals may overlap the first's: its
                        // connection is opened now, not at that moment. The first
                        // slot's renewals have the spare opened in the background
                        // since the worker first stood at the front (see
                        // `spare_lease_connection`); pinging the pool here would
                        // cost two requests a claim at a mass failure's busiest
                        // moment.
                        if self.held.len() > 1 {
                            let open = (self.held.len() as u32 + 1).min(LEASE_POOL);
                            let (store, within) = (self.lease_store.clone(), self.op_timeout());
                            tokio::spawn(async move { store.warm(open, within).await });
                        }
                    }
                    None if outcome.conflicts > 0 => tracing::debug!(
                        conflicts = outcome.conflicts,
                        "every expired slot was taken first by another worker"
                    ),
                    None => {}
                }
            }
            Ok(Err(e)) => {
                self.claim_failed();
                self.db_failed(&e.to_string());
            }
        }
    }

    /// A claim failed (an election's "not primary", a lost answer): no contact
    /// counts until a write lands (see [`Health::write_failed`]), and the heartbeat
    /// is sent at the next round to find out when writes land again.
    fn claim_failed(&mut self) {
        self.health.write_failed();
        self.looks.next_beat = self.clock.now();
    }

    /// Replaces the robots' client (and with it every connection in its pool) when
    /// an outage began since it was made, before a new slot's robots use it (see
    /// [`Store::reopen_after`]): a connection pooled before the outage may never
    /// answer. The lease's client is replaced at a resume (a holder's renewals
    /// would meet such a connection at once); a claim or heartbeat that meets one
    /// is given up at its own bound, which closes the connection.
    fn reopen_after_outage(&mut self) {
        match self.store.reopen_after(self.health.outages()) {
            Ok(true) => {
                tracing::info!(
                    "the database was out of reach since the robots' connections were opened: opening new ones"
                );
                self.robots_warmed = false;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("could not open a new client for the robots: {e}"),
        }
    }

    /// A standby that claimed one of `seen` claimable slots pokes the next standbys
    /// in line, in the background: one for each slot it left (they may expire
    /// together: a machine's workers died at once), and `--watchers` more for the
    /// place it leaves at the front. A poked worker surveys at once and re-reads its
    /// place (at most once a tick), so the rest are claimed within a round trip or
    /// two rather than at the rear's next look, and the front is whole again. A lost
    /// poke costs latency only (see [`poke`]).
    fn poke_successors(&self, seen: usize) {
        let n = standby_line::successors_to_poke(seen, self.settings.watchers);
        let (line, me, metrics) = (self.line.clone(), self.owner(), self.metrics.clone());
        tokio::spawn(async move {
            poke::poke_front(&line, &me, n, &metrics).await;
        });
    }

    /// False while a previous hand-back has not been taken up yet (the slot is still
    /// unheld), for at most two leases.
    fn ready_to_give_back(&mut self, survey: &Survey) -> bool {
        let Some(HandedBack { slot, at, .. }) = &self.handed_back else {
            return true;
        };
        let releasing = self
            .held
            .iter()
            .any(|h| &h.slot_id == slot && h.giving_back());
        let mine_again = self
            .held
            .iter()
            .any(|h| &h.slot_id == slot && !h.giving_back());
        let expired = survey.expired.iter().any(|c| &c.id == slot);
        let outcome = crate::worker::claim_policy::hand_back_outcome(
            releasing,
            expired,
            mine_again,
            self.clock.since(*at),
            self.settings.timing.lease(),
        );
        match outcome {
            HandBack::Pending => return false,
            HandBack::Taken => {}
            HandBack::NotTaken => {
                let HandedBack { slot, standbys, .. } =
                    self.handed_back.take().expect("checked above");
                tracing::warn!(%slot, standbys = ?standbys.iter().map(|(id, _)| id).collect::<Vec<_>>(), "no standby took the slot handed back; passing them over until they send a heartbeat again");
                self.passed_over.extend(standbys);
            }
        }
        self.handed_back = None;
        true
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
        self.handed_back = Some(HandedBack {
            slot: h.slot_id.clone(),
            at: self.clock.now(),
            standbys,
        });
    }

    /// How long a standby or bookkeeping operation may take before it counts as a
    /// database failure (the driver has no socket timeout).
    fn op_timeout(&self) -> Duration {
        (self.tick() * 2).max(Duration::from_secs(2))
    }

    /// How long the loop waits for a heartbeat or a read of its place: a holder,
    /// [`Worker::op_timeout`]; a standby, three times that
    /// ([`standby_line::STANDBY_PATIENCE`]).
    fn bookkeeping_timeout(&self) -> Duration {
        if self.held.is_empty() {
            self.op_timeout() * standby_line::STANDBY_PATIENCE
        } else {
            self.op_timeout()
        }
    }

    /// Sends a heartbeat, bounded like every bookkeeping call; on success,
    /// remembers and returns the server's clock.
    ///
    /// A standby waits longer (see [`Worker::bookkeeping_timeout`]). Not bounded by
    /// less: a heartbeat is two round trips, and one abandoned in flight costs the
    /// lease's pool a connection that a renewal may then have to wait for.
    async fn bounded_heartbeat(&mut self, pace: Duration) -> Beaten {
        let limit = self.bookkeeping_timeout();
        let holding = self.held_leases();
        let me = self.owner();
        let beat = Beat {
            me: &me,
            instance: &self.instance,
            netns: self.netns.as_deref(),
            held: &holding,
            max_slots: self.settings.max_slots,
            tick: self.tick(),
            pace,
            settles_in: self.settles_in(),
            load: self.load.load(),
        };
        // The first beat reads no clock: the place read that follows it does.
        let read_clock = match self.server {
            None => self.looks.beaten.is_some(),
            Some(c) => c.age() >= standby_line::CLOCK_REFRESH,
        };
        let sent = Instant::now();
        match tokio::time::timeout(limit, self.line.beat(&beat, read_clock)).await {
            Ok(Ok(clock)) => {
                self.health
                    .write_landed(Instant::now(), sent.elapsed(), self.tick());
                if let Some(c) = clock {
                    let (server_ms, sent, received) = c.reading();
                    self.server_clock_read(server_ms, sent, received);
                    self.server = Some(c);
                }
                self.standby_reached_database();
                Beaten::Written
            }
            Ok(Err(e @ BeatError::IdentityInUse { .. })) => Beaten::InUse(e),
            Ok(Err(BeatError::Db(e))) => {
                if let Some(refusal) = crate::db::store::refusal(&e) {
                    return Beaten::Refused(refusal);
                }
                let why = self.store.scrub(&crate::db::store::brief(&e));
                tracing::debug!("heartbeat failed: {why}");
                Beaten::Failed(why)
            }
            Err(_) => {
                let why = format!("no answer within {} ms", limit.as_millis());
                tracing::debug!("heartbeat got {why}");
                Beaten::Failed(why)
            }
        }
    }

    /// The database answered a request of this worker's that took `took` (see
    /// [`Health::answered`]).
    fn answered(&self, took: Duration) {
        self.health.answered(Instant::now(), took, self.tick());
    }

    /// A standby behind the watchers asks the database for nothing but its
    /// heartbeat and its place, and may not survey for minutes: those answers are
    /// what `/healthz` knows of the database. (A holder's renewals speak for it.)
    fn standby_reached_database(&self) {
        if self.judged_by_heartbeat() {
            self.health.ok(&self.metrics, &self.status);
        }
    }

    /// Whether `/healthz` follows this worker's heartbeat: a standby behind the
    /// watchers. A holder's renewals and a watcher's surveys (every tick) speak for
    /// theirs; judged by both, a watcher whose surveys fail while its heartbeats
    /// land would flip between ready and not.
    fn judged_by_heartbeat(&self) -> bool {
        self.held.is_empty() && self.place() == Place::Rear
    }

    fn db_failed(&self, why: &str) {
        self.health
            .failed(&self.metrics, &self.status, &self.store.scrub(why));
    }

    /// On a clean exit the worker leaves the `workers` list, so standbys are counted
    /// honestly.
    /// Removes this worker's heartbeat, waiting at most [`Worker::op_timeout`]: the
    /// driver has no socket timeout, and a database that answers nothing (a
    /// blackholed link) would hold the exit for good. A heartbeat left behind lapses
    /// by itself.
    async fn leave(&self) {
        let limit = self.op_timeout();
        match tokio::time::timeout(limit, self.line.leave(&self.owner(), &self.instance)).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                "could not remove this worker's heartbeat ({}); it lapses by itself",
                self.store.scrub(&e.to_string())
            ),
            Err(_) => tracing::warn!(
                "no answer within {} ms to the removal of this worker's heartbeat; it lapses by itself",
                limit.as_millis()
            ),
        }
        tracing::info!(worker = %self.owner(), "worker stopped");
    }
}

/// A random id for this process (64 bits, hex), told apart from any other process
/// advertising the same `ip:port`.
fn new_instance() -> String {
    format!("{:016x}", random_u64())
}
