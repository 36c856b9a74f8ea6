//! The robots of the held slot: adopt, start, restart with backoff, stop, fence.
//!
//! One `Supervisor` lives exactly as long as one lease (slot + epoch). The worker
//! calls [`Supervisor::sync`] after every renewal with the slot's `rev`, and the
//! slot's robots are read again only when `rev` moved. Since a writer can die before
//! its bump, a quiet slot is also probed every [`PROBE_EVERY`] ([`Fingerprint`]).
//! Each robot runs in its own task under a child [`CancellationToken`]: a crash
//! restarts it with backoff, a fenced checkpoint ends it for good on this holder.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use futures::TryStreamExt;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) mod firing_clock;
pub(crate) mod firing_plan;
mod plan;
mod runner;
pub(crate) mod scheduled;
pub(crate) mod suspension;

pub(crate) use plan::Fingerprint;
use plan::{plan_sync, read_threatens_lease, slot_statement_takes_only, Instance, View};
use runner::Runner;
use suspension::Suspension;

use crate::clock::SharedClock;
use crate::config::LeaseTiming;
use crate::db::adoption::{adopt_rest_at_once, next_adopt_chunk, ADOPT_CHUNK_MIN};
use crate::db::context::{ContextError, ContextStore, Loaded};
use crate::db::event::EventKind;
use crate::db::field::{DETAIL, EPOCH, SLOT_ID, WORKER, WRITES};
use crate::db::robot_doc::{PendingUpdate, RobotDoc, UpdateField};
use crate::db::store::Store;
use crate::metrics::Metrics;

use crate::robot::Registry;

/// Even without a `rev` change, re-read the slot's robots at least this often: a
/// safety net for documents edited by hand without bumping `rev`.
const FULL_RESYNC: Duration = Duration::from_secs(60);
/// Each full re-read comes up to this much later than [`FULL_RESYNC`], at random, so
/// holders whose slots all changed at once do not all re-read together every minute
/// and hold renewals back (see docs/bench/2026-11-25-scheduled-robots.md).
const RESYNC_SPREAD: Duration = Duration::from_secs(30);

/// The longest wait between full re-reads, however slow they are.
const FULL_RESYNC_MAX: Duration = Duration::from_secs(600);

/// When the next full re-read is due after one that began at `began` and took
/// `took`: [`FULL_RESYNC`], or, for a read so slow that it would take more than
/// 1/[`PROBE_SHARE`] of the time, that much later (at most [`FULL_RESYNC_MAX`]);
/// then `random` spreads it over [`RESYNC_SPREAD`]. The probes ([`probe_gap`]) still
/// come at least every minute.
fn next_full_read(began: Instant, took: Duration, random: u64) -> Instant {
    let spread = RESYNC_SPREAD.as_millis() as u64;
    let wait = took
        .saturating_mul(PROBE_SHARE)
        .clamp(FULL_RESYNC, FULL_RESYNC_MAX);
    began + wait + Duration::from_millis(random % spread.max(1))
}

/// How often a quiet slot is probed for robot changes that came without a `rev`
/// bump (an interrupted move): one aggregation over the slot's robots. It trades how
/// soon such a rare change is noticed against a scan of every held slot, all the
/// time (see docs/bench/2026-11-24-requests-and-takeovers-issue-23.md).
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(10);

/// A probe keeps at most one part in this many of the time between probes: a slow
/// one spaces the next out (see [`probe_gap`]).
const PROBE_SHARE: u32 = 200;

/// How long after a probe that took `took` the next one comes: [`PROBE_EVERY`], or
/// longer when the probe is costly, so that it takes at most 1/[`PROBE_SHARE`] of
/// the time; never longer than [`FULL_RESYNC`], which reads every robot anyway
/// (see docs/bench/2026-11-25-scheduled-robots.md).
pub(crate) fn probe_gap(took: Duration) -> Duration {
    took.saturating_mul(PROBE_SHARE)
        .clamp(PROBE_EVERY, FULL_RESYNC)
}

/// One robot of the slot as a sync reads it.
struct Listed {
    id: ObjectId,
    name: String,
    /// Its fencing epoch; a missing or odd one counts as 0 (adoptable).
    epoch: i64,
    /// Its generation: which instance may write.
    gen: i64,
    /// The generation adopting it gives it, if nothing adopts it meanwhile.
    next_gen: i64,
    /// Raised by `robot restart`: an instance started under another one is stale.
    start_rev: i64,
    paused: bool,
    /// Held after its restart policy gave up (paused, status `failed`): an applied
    /// update runs it again.
    failed: bool,
    /// What a first start needs, or None to load it (and report the problem) later.
    loaded: Option<Loaded>,
    /// An update asked for and not yet judged.
    update: Option<PendingUpdate>,
    /// An `update` that cannot be one (a hand edit): left alone, counted by the probe.
    odd_update: bool,
    /// Its firing state's `rev`, for a scheduled robot.
    firings_rev: Option<i64>,
    /// Its `(gen, epoch)` exactly as stored, when both are whole numbers (a `gen`
    /// never written is None): what an instance started before its adoption write
    /// matches meanwhile (see [`ContextStore::start_early`]). None for a hand-broken
    /// one, which is adopted first.
    as_stored: Option<(Option<i64>, i64)>,
}

/// What one sync starts, and how far it got.
struct Starts {
    /// The robots the plan starts that wait for their adoption, by id.
    wanted: HashMap<ObjectId, Listed>,
    /// Robots started before their adoption write, with the generation it gives.
    early: HashMap<ObjectId, i64>,
    /// Robots this sync adopted.
    adopted: HashSet<ObjectId>,
    started: usize,
    /// Adoption writes sent.
    writes: i64,
    /// How long the first adoption write took: what decided whether the rest went
    /// as one statement ([`adopt_rest_at_once`]).
    first_write: Option<Duration>,
    /// An early start was undone: its robot is looked at again next sync.
    undone: bool,
}

impl Starts {
    fn new(listed: Vec<Listed>, start: &[ObjectId]) -> Starts {
        let starting: HashSet<&ObjectId> = start.iter().collect();
        Starts {
            wanted: listed
                .into_iter()
                .filter(|l| starting.contains(&l.id))
                .map(|l| (l.id, l))
                .collect(),
            early: HashMap::new(),
            adopted: HashSet::new(),
            started: 0,
            first_write: None,
            writes: 0,
            undone: false,
        }
    }

    /// Each robot of a chunk with the generation its adoption gives it. 0 matches no
    /// generation: a robot not in `wanted` (none is) would be fenced at its first
    /// write, never run twice.
    fn with_generations(&self, ids: &[ObjectId]) -> Vec<(ObjectId, i64)> {
        ids.iter()
            .map(|id| {
                let gen = self
                    .early
                    .get(id)
                    .copied()
                    .or_else(|| self.wanted.get(id).map(|l| l.next_gen));
                (*id, gen.unwrap_or(0))
            })
            .collect()
    }
}

impl Listed {
    fn new(id: ObjectId, robot: RobotDoc) -> Listed {
        let name = robot.name_or_id();
        let (update, odd_update) = match robot.update.clone() {
            UpdateField::None => (None, false),
            UpdateField::Pending(u) => (Some(u), false),
            UpdateField::Malformed => (None, true),
        };
        Listed {
            id,
            epoch: robot.epoch.unwrap_or(0),
            gen: robot.gen.unwrap_or(0),
            next_gen: robot.next_gen,
            start_rev: robot.start_rev.unwrap_or(0),
            paused: robot.paused,
            failed: robot.given_up(),
            update,
            odd_update,
            as_stored: robot.fence_as_stored,
            firings_rev: robot.firings.rev,
            loaded: preload(robot, &name),
            name,
        }
    }

    /// What [`plan_sync`] needs of it.
    fn view(&self) -> View {
        View {
            id: self.id,
            epoch: self.epoch,
            gen: self.gen,
            start_rev: self.start_rev,
            paused: self.paused,
        }
    }
}

struct Running {
    name: String,
    /// The generation this instance was adopted under.
    gen: i64,
    /// The robot's `start_rev` when this instance started.
    start_rev: i64,
    token: CancellationToken,
    stopping: bool,
    /// For a scheduled instance: woken when a read finds its firing state newer
    /// than the `rev` it knows.
    wake: Arc<tokio::sync::Notify>,
    known_rev: Arc<std::sync::atomic::AtomicI64>,
}

/// One robot's instance: a robot on a schedule runs once per firing, in its own
/// loop ([`scheduled::Scheduled`]); any other runs and restarts as its policy says
/// ([`Runner::run`]).
async fn instance(
    runner: Runner,
    mut first: Option<Loaded>,
    first_step: Option<firing_clock::FirstStep>,
) -> ObjectId {
    if first.is_none() && !runner.token.is_cancelled() {
        first = runner
            .ctx
            .load(&runner.id, runner.gen, &runner.name)
            .await
            .ok();
    }
    if let Some(loaded) = &first {
        if let Some(schedule) = runner.schedule_of(loaded) {
            let shared = runner.scheduling.clone();
            return scheduled::Scheduled::new(runner, shared, loaded, schedule)
                .run(first_step)
                .await;
        }
    }
    drop(first_step);
    runner.run(first).await
}

/// A command bounded by [`ContextStore::answered`], as the driver's error that a sync
/// reports and retries: the lease lapsing or no answer in time.
fn answered<T>(
    r: Result<Result<T, mongodb::error::Error>, ContextError>,
) -> Result<T, mongodb::error::Error> {
    match r {
        Ok(r) => r,
        Err(ContextError::Db(e)) => Err(e),
        Err(other) => Err(mongodb::error::Error::custom(other.to_string())),
    }
}

pub struct Supervisor {
    store: Store,
    ctx: ContextStore,
    registry: Registry,
    timing: LeaseTiming,
    metrics: Arc<Metrics>,
    root: CancellationToken,
    running: HashMap<ObjectId, Running>,
    tasks: JoinSet<ObjectId>,
    synced_rev: Option<i64>,
    warned: HashSet<String>,
    adopted: bool,
    /// When the slot's robots are read again even without a `rev` change.
    next_full: Instant,
    /// Robot documents bound to the slot at the last read, odd ones included.
    listed_total: i64,
    /// What the next probe should find, once a complete sync set it.
    expected: Option<Fingerprint>,
    last_probe: Instant,
    /// The wait from one probe to the next ([`probe_gap`]).
    probe_gap: Duration,
    /// Reads and waits of the slot's lease (resyncs, probes, restart backoff).
    clock: SharedClock,
    /// Robots in the next adoption write (see [`next_adopt_chunk`]).
    adopt_chunk: usize,
    /// The server's clock as last read, for scheduled robots.
    time: crate::clock::ServerTime,
    /// The slot's one timer for its scheduled robots.
    alarm: firing_clock::Alarm,
    /// When the slot's renewals go, for its scheduled robots.
    renewals: crate::worker::renewal_timing::RenewalTiming,
    /// The first steps of the robots started before their adoption write.
    first_steps: firing_clock::FirstSteps,
    /// Told when the claim's event is written: no robot writes before it.
    claim_recorded: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Whether the lease is suspended: the robots' futures are not polled then.
    suspension: Arc<Suspension>,
    /// True until the first sync after the claim: that sync starts each robot an
    /// earlier holder of this slot adopted (`0 < epoch <` this one) before its
    /// adoption write lands. Their old instances self-fenced before the claim, and the
    /// `seq` compare-and-set orders any write of theirs still in flight (see
    /// [`ContextStore::start_early`]). Robots new to the slot (epoch 0, whose previous
    /// holder may still run them) are adopted first.
    early: bool,
    /// The worker's count of forward steps of the server's clock, and the count as
    /// of the slot's last reading.
    clock_steps: Option<Arc<std::sync::atomic::AtomicU64>>,
    steps_seen: u64,
    /// Where each robot run is listed for the worker's load sampler.
    meters: crate::robot::meter::Meters,
}

impl Supervisor {
    pub fn new(
        store: Store,
        ctx: ContextStore,
        registry: Registry,
        timing: LeaseTiming,
        metrics: Arc<Metrics>,
        clock: SharedClock,
    ) -> Self {
        let now = clock.now();
        let root = CancellationToken::new();
        let alarm = firing_clock::Alarm::spawn(clock.clone(), root.clone());
        let time = crate::clock::ServerTime::default();
        let renewals =
            crate::worker::renewal_timing::RenewalTiming::new(time.clone(), ctx.slot_id());
        Supervisor {
            store,
            ctx,
            registry,
            timing,
            metrics,
            root,
            alarm,
            renewals,
            first_steps: firing_clock::FirstSteps::default(),
            claim_recorded: None,
            suspension: Arc::new(Suspension::default()),
            time,
            running: HashMap::new(),
            tasks: JoinSet::new(),
            synced_rev: None,
            warned: Default::default(),
            adopted: false,
            next_full: next_full_read(now, Duration::ZERO, crate::random::random_u64()),
            listed_total: 0,
            expected: None,
            last_probe: now,
            probe_gap: PROBE_EVERY,
            clock,
            // The first write measures the server; the next ones fit its pace.
            adopt_chunk: ADOPT_CHUNK_MIN,
            early: true,
            clock_steps: None,
            steps_seen: 0,
            meters: Default::default(),
        }
    }

    /// No robot starts (or writes) before `recorded` is told that the claim's
    /// event was written (or refused by the server): each epoch's claim comes first
    /// in `events`, which the timeline and the invariant checker rely on. The
    /// event's write overlaps the first read of the slot's robots, and is never
    /// given up for want of an answer while the slot is held (see
    /// [`crate::db::store::Store::record_event_patiently`]).
    pub fn after_claim_recorded(&mut self, recorded: tokio::sync::oneshot::Receiver<()>) {
        self.claim_recorded = Some(recorded);
    }

    /// Counts the forward steps of the server's clock its worker sees: after one,
    /// the slot's reading is taken again at once rather than within
    /// [`firing_clock::SERVER_TIME_EVERY`], so that claimed firings are judged on the
    /// stepped clock.
    /// Lists every robot run in the worker's `meters`, so the load sampler measures it.
    pub(crate) fn measure_into(&mut self, meters: crate::robot::meter::Meters) {
        self.meters = meters;
    }

    pub fn follow_clock_steps(&mut self, steps: Arc<std::sync::atomic::AtomicU64>) {
        self.steps_seen = steps.load(std::sync::atomic::Ordering::Relaxed);
        self.clock_steps = Some(steps);
    }

    /// When the slot's renewals should go (the held slot's loop asks it each tick).
    pub(crate) fn renewal_timing(&self) -> crate::worker::renewal_timing::RenewalTiming {
        self.renewals.clone()
    }

    /// How many robots have a live task (including those stopping).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether this lease's first read of the slot's robots is still to come (see
    /// `early`): a takeover's read, which never waits for a fast renewal.
    pub fn first_read_pending(&self) -> bool {
        self.early
    }

    /// The slot this supervisor runs the robots of.
    pub fn slot_id(&self) -> &str {
        self.ctx.slot_id()
    }

    /// Whether a sync at `rev` would read the slot's robots, rather than only tidy up.
    pub fn will_read(&self, rev: i64) -> bool {
        self.synced_rev != Some(rev) || self.clock.now() >= self.next_full
    }

    /// Brings the running set in line with the slot's robots when `rev` changed (or a
    /// previous sync is unfinished). Returns how many robots were started.
    ///
    /// `may_read`: whether this renewal lets a read go (see
    /// [`crate::db::pacing::read_admitted`]); a read not let go waits for the next
    /// renewal's sync. One read of the slot's robots serves adoption and start alike,
    /// since every extra read may be a scan that this holder's renewals wait out.
    pub async fn sync(&mut self, rev: i64, may_read: bool) -> Result<usize, mongodb::error::Error> {
        self.reap();
        // The server's clock is read beside the slot's robots, not before them: a
        // takeover's scheduled robots need both before they plan.
        let reading = self.read_server_time();
        if !self.will_read(rev) {
            let changed = self.probe_finds_changes().await?;
            if !changed || !may_read {
                if changed {
                    // Read at the next renewal that lets a read go.
                    self.synced_rev = None;
                }
                if let Some(r) = reading {
                    let _ = r.await;
                }
                return Ok(0);
            }
        }
        let began = Instant::now();
        let mut listed = self.read_slot().await?;
        let mut outwaited = false;
        if let Some(recorded) = self.claim_recorded.take() {
            let asked = self.clock.now();
            let _ = recorded.await;
            outwaited = self.clock.since(asked) > self.timing.tick / 4;
        }
        if let Some(r) = reading {
            let _ = r.await;
        }
        if outwaited {
            // The claim's event took its time: the listing is older than a sync acts
            // on (a move, pause or delete may have come meanwhile), so the next
            // renewal's sync reads the slot again.
            return Ok(0);
        }
        self.wake_scheduled(&listed);
        let listed_ms = began.elapsed().as_millis() as u64;
        self.heal_robot_count().await;
        self.judge_updates(&mut listed).await;
        let updates_left = self.updates_left(&listed);
        let views: Vec<View> = listed.iter().map(Listed::view).collect();
        let plan = plan_sync(&views, &self.instances(), self.ctx.epoch());
        self.stop_stale(&plan.stop);
        let mut starts = Starts::new(listed, &plan.start);
        if std::mem::take(&mut self.early) {
            self.start_early(&plan.start, &mut starts);
            // A lost run's record goes ahead of the adoption: its retry waits on it.
            // Bounded, so that a slow server never holds the robots new to the
            // slot back for long.
            self.first_steps
                .all_done(self.timing.tick / 4, &self.clock)
                .await;
        }
        self.adopt_and_start(&plan.start, &views, &mut starts)
            .await?;
        self.record_adoption(&starts).await;
        tracing::debug!(
            slot = %self.ctx.slot_id(), listed = views.len(), listed_ms,
            started = starts.started, adoption_writes = starts.writes,
            took_ms = began.elapsed().as_millis() as u64,
            "synced the slot's robots"
        );
        // An early start undone: its robot is looked at again next sync.
        self.synced_rev = (!plan.incomplete && !starts.undone).then_some(rev);
        if !plan.incomplete {
            let mut expected = Fingerprint::expected(&views, &starts.adopted, self.ctx.epoch());
            expected.updates = updates_left;
            self.expected = Some(expected);
        }
        Ok(starts.started)
    }

    /// Reads the server's clock for the slot's scheduled robots: first thing after
    /// the claim (which fixes when this lease began), then every
    /// [`firing_clock::SERVER_TIME_EVERY`].
    ///
    /// The reading runs as a task of its own, so that it overlaps the sync's first
    /// read; None when none is due.
    fn read_server_time(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let steps = self
            .clock_steps
            .as_ref()
            .map_or(0, |s| s.load(std::sync::atomic::Ordering::Relaxed));
        let due = steps != self.steps_seen
            || self
                .time
                .age(&self.clock)
                .is_none_or(|a| a >= firing_clock::SERVER_TIME_EVERY);
        if !due || !self.ctx.lease_open() {
            return None;
        }
        self.steps_seen = steps;
        let (time, store, clock) = (self.time.clone(), self.store.clone(), self.clock.clone());
        let slot = self.ctx.slot_id().to_string();
        Some(tokio::spawn(async move {
            let sent = clock.now();
            let read = store.server_now().await;
            let received = clock.now();
            let taken = read
                .map_err(|e| crate::db::store::brief(&e))
                .and_then(|server| time.observe(server.timestamp_millis(), sent, received));
            if let Err(e) = taken {
                tracing::debug!(slot = %slot, "could not read the server's clock ({e})");
            }
        }))
    }

    /// Tells each scheduled instance whose robot's firing state changed (a run-now
    /// request, a pause's mark) to read it: no read per robot otherwise.
    fn wake_scheduled(&self, listed: &[Listed]) {
        use std::sync::atomic::Ordering;
        for l in listed {
            let (Some(rev), Some(r)) = (l.firings_rev, self.running.get(&l.id)) else {
                continue;
            };
            if rev != r.known_rev.load(Ordering::Acquire) {
                r.wake.notify_one();
            }
        }
    }

    /// Reads every robot of the slot, bounded like an adoption's commands, and times
    /// the read: a slow one leaves a renewal queued behind it too little room.
    async fn read_slot(&mut self) -> Result<Vec<Listed>, mongodb::error::Error> {
        let at = self.clock.now();
        self.next_full = next_full_read(at, Duration::ZERO, crate::random::random_u64());
        self.last_probe = at;
        self.expected = None;
        let began = Instant::now();
        let ctx = self.ctx.clone();
        let listed = answered(
            ctx.answered("the read of the slot's robots", self.list())
                .await,
        )?;
        let took = began.elapsed();
        self.next_full = next_full_read(at, took, crate::random::random_u64());
        self.metrics.slot_read.observe(took);
        if read_threatens_lease(took, &self.timing) && self.warned.insert("slow-read".into()) {
            tracing::warn!(
                slot = %self.ctx.slot_id(), robots = listed.len(), listed_ms = took.as_millis() as u64,
                "reading the slot's robots took over half the {} ms a renewal may wait before this holder fences itself; on a database where a read holds up every command (the dev server does) a renewal waits behind that read: use a longer --tick or fewer robots per slot (docs/running.md: the sub-second profile)",
                self.timing.renewal_wait().as_millis()
            );
        }
        Ok(listed)
    }

    /// The slot's count of robots, kept for placement, healed from what was just read
    /// (a create cut off mid-way leaves it too high).
    async fn heal_robot_count(&self) {
        if !self.ctx.lease_open() {
            return;
        }
        let slot = self.ctx.slot_id();
        match crate::db::robot_count::heal_count(&self.store, slot, self.listed_total).await {
            Ok(true) => {
                tracing::info!(slot = %slot, robots = self.listed_total, "robot_count corrected to the robots bound to the slot")
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(
                "could not correct robot_count: {}",
                crate::db::store::brief(&e)
            ),
        }
    }

    /// How many updates are still unjudged after [`Supervisor::judge_updates`] (a
    /// newer holder's, or hand edits that cannot be one, each said once in the log):
    /// what the next probe expects to count.
    fn updates_left(&mut self, listed: &[Listed]) -> i64 {
        for l in listed.iter().filter(|l| l.odd_update) {
            if self.warned.insert(format!("update:{}", l.id)) {
                tracing::warn!(robot = %l.name, "ignoring its `update`: not {{id, kind, spec}} (edited by hand?); `robot update` writes a valid one");
            }
        }
        listed
            .iter()
            .filter(|l| l.update.is_some() || l.odd_update)
            .count() as i64
    }

    /// The running instances, as [`plan_sync`] needs them.
    fn instances(&self) -> HashMap<ObjectId, Instance> {
        self.running
            .iter()
            .map(|(id, r)| {
                let inst = Instance {
                    gen: r.gen,
                    start_rev: r.start_rev,
                    stopping: r.stopping,
                };
                (*id, inst)
            })
            .collect()
    }

    /// Asks each stale instance to stop (after a last checkpoint).
    fn stop_stale(&mut self, stop: &[ObjectId]) {
        for id in stop {
            if let Some(r) = self.running.get_mut(id) {
                tracing::info!(robot = %r.name, slot = %self.ctx.slot_id(), "stopping robot (deleted, moved, paused, restarted or adopted again)");
                r.token.cancel();
                r.stopping = true;
            }
        }
    }

    /// The first sync after a claim starts the robots the slot's earlier holders ran
    /// now, each under the generation its adoption will give it and, until then,
    /// under the state it was listed with; the adoption follows (see
    /// [`Supervisor::early`]).
    fn start_early(&mut self, start: &[ObjectId], s: &mut Starts) {
        for id in start {
            let Some(l) = s.wanted.get(id) else { continue };
            let Some((gen, epoch)) = l.as_stored else {
                continue;
            };
            if epoch < 1 || epoch >= self.ctx.epoch() {
                continue;
            }
            let Some(l) = s.wanted.remove(id) else {
                continue;
            };
            self.ctx.start_early(l.id, gen, epoch);
            s.early.insert(l.id, l.next_gen);
            let first_step = self.first_steps.expect();
            self.start(
                l.id,
                l.next_gen,
                l.start_rev,
                l.name,
                l.loaded,
                Some(first_step),
            );
        }
        if !s.early.is_empty() {
            tracing::info!(slot = %self.ctx.slot_id(), robots = s.early.len(), "started robots before their adoption write: the slot's earlier holders stopped them before it could be claimed");
        }
    }

    /// Adopts the robots to start chunk by chunk, each chunk's robots started as soon
    /// as it is adopted: their first checkpoints go out while the next chunk is being
    /// adopted.
    ///
    /// Each chunk is sized from the last one's time ([`next_adopt_chunk`]), so no
    /// write holds this slot's renewal back for more than half the fence margin. Once
    /// a chunk has measured the server and the whole slot fits the same budget, the
    /// rest goes as one statement over the slot (O(1) statements a slot on a server
    /// fast enough for it; see [`ContextStore::adopt_slot`]).
    async fn adopt_and_start(
        &mut self,
        start: &[ObjectId],
        views: &[View],
        s: &mut Starts,
    ) -> Result<(), mongodb::error::Error> {
        let budget = self.adopt_budget();
        // Every document the statement would examine, odd ones included.
        let slot = self.listed_total as usize;
        let mut rest = start;
        let mut last: Option<(Duration, usize)> = None;
        while !rest.is_empty() {
            let at_once = last
                .is_some_and(|(took, done)| adopt_rest_at_once(took, done, slot, budget))
                && slot_statement_takes_only(views, &s.adopted, rest, self.ctx.epoch());
            let (ids, tail) = if at_once {
                (rest, &rest[rest.len()..])
            } else {
                rest.split_at(self.adopt_chunk.min(rest.len()))
            };
            rest = tail;
            let chunk = s.with_generations(ids);
            // The database's time, measured on real time.
            let took = std::time::Instant::now();
            s.writes += 1;
            let Some(adopted) = self.adopt_or_undo(&chunk, at_once, s).await? else {
                break;
            };
            let took = took.elapsed();
            s.first_write.get_or_insert(took);
            if !at_once {
                self.adopt_chunk = next_adopt_chunk(took, chunk.len(), budget);
            }
            last = Some((took, chunk.len()));
            self.start_adopted(adopted, &chunk, s);
        }
        Ok(())
    }

    /// How long one adoption write may hold this slot's renewal back: half the fence
    /// margin, at any tick.
    fn adopt_budget(&self) -> Duration {
        self.timing.margin / 2
    }

    /// One adoption write. When the adoption stops part-way (the lease lapsing, the
    /// database out of reach), robots started early and not adopted yet are stopped,
    /// to start again the usual way, adoption first; None once the lease lapsed.
    async fn adopt_or_undo(
        &mut self,
        chunk: &[(ObjectId, i64)],
        at_once: bool,
        s: &mut Starts,
    ) -> Result<Option<Vec<(ObjectId, i64)>>, mongodb::error::Error> {
        let outcome = self.adopt(chunk, at_once).await;
        if !matches!(outcome, Ok(Some(_))) {
            for id in std::mem::take(&mut s.early).into_keys() {
                self.undo_early_start(&id);
                s.undone = true;
            }
        }
        outcome
    }

    /// Starts each robot of `chunk` that the write adopted, or confirms the instance
    /// started early; an early start that the write did not make current is undone.
    fn start_adopted(
        &mut self,
        adopted: Vec<(ObjectId, i64)>,
        chunk: &[(ObjectId, i64)],
        s: &mut Starts,
    ) {
        s.started += adopted.len();
        for (id, gen) in adopted {
            s.adopted.insert(id);
            if let Some(expected) = s.early.remove(&id) {
                if gen == expected {
                    self.ctx.adopted(&id);
                } else {
                    // Adopted elsewhere between the list and the write: the instance
                    // started early is not the current one.
                    self.undo_early_start(&id);
                    s.undone = true;
                }
            } else if let Some(l) = s.wanted.remove(&id) {
                self.start(id, gen, l.start_rev, l.name, l.loaded, None);
            }
        }
        // Started early but not adopted (moved, deleted, refused, or adopted by a
        // newer holder since the list): stopped, and fenced from now on.
        for (id, _) in chunk {
            if s.early.remove(id).is_some() {
                self.undo_early_start(id);
                s.undone = true;
            }
        }
    }

    /// Every [`PROBE_EVERY`], counts the slot's robots and says whether they differ
    /// from what the last complete read left (robots changed without a `rev` bump).
    async fn probe_finds_changes(&mut self) -> Result<bool, mongodb::error::Error> {
        let Some(expected) = self.expected else {
            return Ok(false);
        };
        if self.clock.since(self.last_probe) < self.probe_gap {
            return Ok(false);
        }
        self.last_probe = self.clock.now();
        let mine = self.ctx.epoch();
        let read = crate::db::adoption::tally(&self.store, self.ctx.slot_id(), mine);
        let began = Instant::now();
        let t = answered(self.ctx.answered("the slot's probe", read).await)?;
        self.probe_gap = probe_gap(began.elapsed());
        let found = Fingerprint {
            total: t.total,
            unadopted: t.unadopted,
            paused: t.paused,
            updates: t.updates,
        };
        if found != expected {
            tracing::info!(slot = %self.ctx.slot_id(), ?expected, ?found, "the slot's robots changed without a rev bump (an interrupted move?); reading them again");
            self.metrics.unbumped_changes.inc();
        }
        Ok(found != expected)
    }

    /// Judges every update asked for on this slot's robots (not those of a newer
    /// holder): applied when this worker would run the new kind and spec from the
    /// robot's context, refused with the reason otherwise, and the answer written for
    /// the asker. An applied update raises the robot's `start_rev` in the same write,
    /// so the plan below stops a running instance (after its last checkpoint) and the
    /// next sync starts it with the new spec under a new generation.
    async fn judge_updates(&mut self, listed: &mut [Listed]) {
        let mine = self.ctx.epoch();
        for l in listed.iter_mut() {
            let Some(u) = l.update.clone() else { continue };
            if l.epoch > mine {
                continue;
            }
            let empty = Document::new();
            let context = l.loaded.as_ref().map_or(&empty, |x| &x.context);
            let verdict = self.registry.admits(&u.kind, &u.spec, context);
            let answer = match &verdict {
                Ok(()) => Ok((u.kind.as_str(), &u.spec)),
                Err(why) => Err(why.as_str()),
            };
            match self.ctx.answer_update(&l.id, &u.id, answer).await {
                Ok(true) => {
                    l.update = None;
                    match verdict {
                        Ok(()) => {
                            tracing::info!(robot = %l.name, kind = %u.kind, "update applied: the robot starts again with its new spec");
                            l.start_rev += 1;
                            // Loaded again at its start, with the new spec.
                            l.loaded = None;
                            if l.failed {
                                // The same write let it run again (see answer_update).
                                l.paused = false;
                                l.failed = false;
                            }
                        }
                        Err(why) => {
                            tracing::warn!(robot = %l.name, "update refused, the robot is unchanged: {}", crate::secrets::scrub(&why))
                        }
                    }
                }
                // Moved, deleted, taken over or updated again meanwhile: the next
                // read sees what is true now.
                Ok(false) => l.update = None,
                Err(e) => tracing::warn!(robot = %l.name, "could not answer an update: {e}"),
            }
        }
    }

    /// Adopts one chunk of the robots about to start (sized by [`next_adopt_chunk`]):
    /// each gets our epoch and a new generation, and is marked running, in one write.
    /// Returns each adopted robot with its generation, or None once the lease lapsed.
    /// A robot the database refuses (a hand-edited document failing the validator) is
    /// reported once and skipped; it holds back no other.
    ///
    /// `whole_slot`: the chunk is every robot one statement over the slot takes
    /// ([`ContextStore::adopt_slot`]).
    async fn adopt(
        &mut self,
        chunk: &[(ObjectId, i64)],
        whole_slot: bool,
    ) -> Result<Option<Vec<(ObjectId, i64)>>, mongodb::error::Error> {
        let outcome = if whole_slot {
            self.ctx.adopt_slot(chunk).await
        } else {
            self.ctx.adopt(chunk).await
        };
        match outcome {
            Ok(a) => {
                for r in a.refused {
                    if self.warned.insert(format!("adopt:{}", r.id)) {
                        tracing::error!(robot = %r.id, slot = %self.ctx.slot_id(), "cannot adopt robot, skipping it: {}", crate::secrets::scrub(&r.why));
                    }
                }
                Ok(Some(a.ours))
            }
            Err(ContextError::Db(e)) => Err(e),
            Err(_lapsed) => Ok(None),
        }
    }

    /// The first adoption under this epoch goes into `events`: from then on no
    /// checkpoint of an older epoch can land on this slot's robots. It says how many
    /// robots the sync adopted and in how many writes, in words and as `writes`, and
    /// what decided that count: the first write's time (`first_write_us`) against
    /// the budget (`budget_us`), both in microseconds.
    async fn record_adoption(&mut self, s: &Starts) {
        if self.adopted {
            return;
        }
        self.adopted = true;
        let (started, writes) = (s.started, s.writes);
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let mut event = doc! {
            WORKER: self.ctx.worker(), SLOT_ID: self.ctx.slot_id(),
            EPOCH: self.ctx.epoch(),
            DETAIL: format!("{started} robot(s) adopted in {writes} write(s)"),
            WRITES: writes,
            "budget_us": micros(self.adopt_budget()),
        };
        if let Some(first) = s.first_write {
            event.insert("first_write_us", micros(first));
        }
        self.store.record_event(EventKind::Adopt, event).await;
    }

    /// Every robot bound to the slot, of any epoch (see
    /// [`crate::db::adoption::slot_robots`]).
    async fn list(&mut self) -> Result<Vec<Listed>, mongodb::error::Error> {
        let mut cursor = crate::db::adoption::slot_robots(&self.store, self.ctx.slot_id()).await?;
        let mut out = Vec::new();
        self.listed_total = 0;
        while let Some(d) = cursor.try_next().await? {
            self.listed_total += 1;
            let Some(Bson::ObjectId(id)) = d.get("_id").cloned() else {
                let key = format!("{:?}", d.get("_id"));
                if self.warned.insert(key.clone()) {
                    tracing::warn!(id = %key, "skipping robot document whose _id is not an ObjectId");
                }
                continue;
            };
            out.push(Listed::new(id, RobotDoc::from_doc(&d)));
        }
        Ok(out)
    }

    fn start(
        &mut self,
        id: ObjectId,
        gen: i64,
        start_rev: i64,
        name: String,
        loaded: Option<Loaded>,
        first_step: Option<firing_clock::FirstStep>,
    ) {
        let token = self.root.child_token();
        let wake = Arc::new(tokio::sync::Notify::new());
        let known_rev = Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN));
        let scheduling = firing_clock::Shared {
            time: self.time.clone(),
            alarm: self.alarm.clone(),
            wake: wake.clone(),
            known_rev: known_rev.clone(),
            lease: self.timing.lease(),
            renewals: self.renewals.clone(),
        };
        let runner = Runner {
            scheduling,
            id,
            gen,
            start_rev,
            name: name.clone(),
            ctx: self.ctx.clone(),
            registry: self.registry.clone(),
            token: token.clone(),
            grace: self.timing.stop_grace,
            backstop: self.timing.stop_grace + self.timing.abort_slack(),
            suspend_for: self.timing.suspend_for,
            suspended: self.suspension.watch(),
            metrics: self.metrics.clone(),
            store: self.store.clone(),
            clock: self.clock.clone(),
            meters: self.meters.clone(),
        };
        self.tasks.spawn(instance(runner, loaded, first_step));
        self.running.insert(
            id,
            Running {
                name,
                gen,
                start_rev,
                token,
                stopping: false,
                wake,
                known_rev,
            },
        );
    }

    /// Stops an instance started before its adoption write when that write did not
    /// make it the current one; its robot's writes match its adopted state alone
    /// from now on, which fences it.
    fn undo_early_start(&mut self, id: &ObjectId) {
        self.ctx.adopted(id);
        if let Some(r) = self.running.get_mut(id) {
            tracing::info!(robot = %r.name, slot = %self.ctx.slot_id(), "stopping a robot started before its adoption: the adoption did not take");
            r.token.cancel();
            r.stopping = true;
        }
    }

    /// Forgets robots whose task ended (stopped or fenced).
    fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Ok(id) = done {
                if let Some(r) = self.running.remove(&id) {
                    if r.stopping {
                        tracing::info!(robot = %r.name, slot = %self.ctx.slot_id(), "robot stopped");
                    } else {
                        // Ended by itself (fenced): look at the slot again next sync.
                        self.synced_rev = None;
                    }
                }
            }
        }
    }

    /// The switch that suspends and resumes every robot of the slot (see
    /// [`suspension`]).
    pub(crate) fn suspension(&self) -> Arc<Suspension> {
        self.suspension.clone()
    }

    /// Stops every robot: cancel, wait up to the stop grace (plus a little for the
    /// tasks to return), then abort whatever is left. Suspended robots are aborted
    /// at once: they are not polled, so they could not see the cancellation, and a
    /// suspended robot is never thawed to be stopped (see [`suspension`]).
    pub async fn stop_all(mut self) {
        self.root.cancel();
        if self.suspension.is_suspended() {
            tracing::info!(
                robots = self.tasks.len(),
                "the lease given up while suspended: aborting its robots at once"
            );
            self.tasks.abort_all();
        }
        let limit = Instant::now() + self.timing.stop_grace + self.timing.abort_slack();
        while !self.tasks.is_empty() {
            match tokio::time::timeout_at(limit, self.tasks.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        left = self.tasks.len(),
                        "robots still running after the stop grace; aborting them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                }
            }
        }
        self.running.clear();
    }
}

/// Turns a listed document into what a first start needs, or None to load it fresh
/// (and report the problem) in the runner.
fn preload(robot: RobotDoc, name: &str) -> Option<Loaded> {
    robot.kind.as_ref()?;
    robot.spec.as_ref()?;
    Loaded::from_robot(robot, name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_reads_are_spread_over_half_a_minute_after_the_minute() {
        let t0 = Instant::now();
        let quick = Duration::from_millis(20);
        assert_eq!(next_full_read(t0, quick, 0), t0 + FULL_RESYNC);
        assert_eq!(
            next_full_read(t0, quick, 29_999),
            t0 + FULL_RESYNC + Duration::from_millis(29_999)
        );
        assert_eq!(next_full_read(t0, quick, 30_000), t0 + FULL_RESYNC);
        assert!(next_full_read(t0, quick, u64::MAX) < t0 + FULL_RESYNC + RESYNC_SPREAD);
    }

    #[test]
    fn a_slow_full_read_spaces_out_the_next_one() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        assert_eq!(next_full_read(t0, Duration::ZERO, 0), t0 + FULL_RESYNC);
        assert_eq!(
            next_full_read(t0, Duration::from_millis(300), 0),
            t0 + FULL_RESYNC
        );
        assert_eq!(next_full_read(t0, secs(1), 0), t0 + secs(200));
        assert_eq!(
            next_full_read(t0, secs(5), 7),
            t0 + FULL_RESYNC_MAX + Duration::from_millis(7)
        );
    }

    #[test]
    fn a_costly_probe_spaces_out_the_next_one_up_to_a_full_reads_period() {
        let ms = Duration::from_millis;
        assert_eq!(probe_gap(ms(2)), PROBE_EVERY, "a cheap probe: every 10 s");
        assert_eq!(probe_gap(ms(50)), PROBE_EVERY);
        assert_eq!(probe_gap(ms(150)), Duration::from_secs(30));
        assert_eq!(probe_gap(ms(900)), FULL_RESYNC);
        assert_eq!(probe_gap(Duration::MAX), FULL_RESYNC);
    }
}
