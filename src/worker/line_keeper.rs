//! Keeping this worker's place in the line: its heartbeat at its place's pace, the
//! re-reads of its place, and the server's clock read with both. The rules (how
//! far apart, who stands where) are [`crate::worker::standby_line`]'s; this keeps
//! the schedule and what the looks found behind a small API, so the claim loop
//! only asks where the worker stands and when the keeper next has something to do.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{Identity, LeaseTiming};
use crate::db::heartbeat::{Beat, BeatError, Predecessor, Roster};
use crate::db::lease::LeaseProtocol;
use crate::db::store::Store;
use crate::metrics::Metrics;
use crate::random::random_unit;
use crate::worker::claim_policy;
use crate::worker::connections::Connections;
use crate::worker::load_sampler::LoadReading;
use crate::worker::poke::Poked;
use crate::worker::server_watch::ServerWatch;
use crate::worker::standby_line::{
    beat_every, beat_pace, next_beat_in, place_due, poked_place_in, successors_to_poke, Place,
    CLOCK_REFRESH, MARK_EVERY, STANDBY_PATIENCE,
};
use crate::worker::status::{Health, SharedStatus};

/// What a [`LineKeeper`] is made of: the worker's parts it beats and reads with.
pub(crate) struct KeeperParts {
    pub(crate) roster: Roster,
    pub(crate) identity: Identity,
    /// The network namespace this process beats from (see
    /// `identity::network_namespace`).
    pub(crate) netns: Option<String>,
    pub(crate) watchers: u64,
    pub(crate) max_slots: Option<usize>,
    pub(crate) timing: LeaseTiming,
    pub(crate) clock: SharedClock,
    /// When the worker began (see [`claim_policy::first_hold`]).
    pub(crate) born: Instant,
    pub(crate) load: LoadReading,
    pub(crate) health: Arc<Health>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: SharedStatus,
    /// The robots' store: the indexes, and credentials scrubbed from messages.
    pub(crate) store: Store,
    pub(crate) protocol: LeaseProtocol,
    pub(crate) connections: Arc<Connections>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) server: ServerWatch,
}

/// What this worker holds, as the keeper reports it and judges by it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holdings<'a> {
    /// `(slot, epoch)` of every slot held and not ended: what the heartbeat and the
    /// place read report.
    pub(crate) leases: &'a [(String, i64)],
    /// Whether any slot is held, one whose task just ended and is not yet
    /// forgotten included: a holder's bounds and health are judged by it.
    pub(crate) any: bool,
}

impl Holdings<'_> {
    /// A worker that holds nothing (its first heartbeat).
    pub(crate) const NONE: Holdings<'static> = Holdings {
        leases: &[],
        any: false,
    };
}

/// What one heartbeat attempt gave.
pub(crate) enum Beaten {
    /// Written (and the server's clock read with it, when it was due).
    Written,
    /// The database did not take it (unreachable, slow): tried again later. Says
    /// why, scrubbed of credentials.
    Failed(String),
    /// The server answered and refused it: the same beat would be refused again.
    Refused(crate::db::store::Refusal),
    InUse(BeatError),
}

/// How a read of its place moved the worker in the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    Stayed,
    /// Up to the front from behind it: it looks at once.
    ToFront,
    /// Back behind the front, or there at its first read: its surveys slow to the
    /// rear's pace.
    ToRear,
}

/// Keeps this worker's place in the line: beats at its place's pace, re-reads the
/// place when due or poked, and reads the server's clock with both. Its schedule
/// and what its looks found stay behind this API; the claim loop asks where the
/// worker stands and when it next has something to do.
pub(crate) struct LineKeeper {
    roster: Roster,
    identity: Identity,
    me: String,
    /// This process's random id in its heartbeat (see [`Roster::beat`]).
    instance: String,
    /// The network namespace this process beats from (see
    /// [`crate::worker::identity`]).
    netns: Option<String>,
    watchers: u64,
    max_slots: Option<usize>,
    timing: LeaseTiming,
    clock: SharedClock,
    born: Instant,
    load: LoadReading,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    status: SharedStatus,
    store: Store,
    protocol: LeaseProtocol,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
    server: ServerWatch,
    /// Set when another process took this worker's identity: the worker stops.
    refused: Option<BeatError>,
    /// Live workers with room ahead of this one in the line (counted up to
    /// `--watchers`); its place follows from it.
    ahead: u64,
    /// When slots without `expires_ms` were last marked (first in line only).
    marked_at: Option<Instant>,
    /// Whether this worker made sure of the indexes, as the first in line, once.
    indexes_ensured: bool,
    /// When this worker last read its place in line (see [`place_due`]).
    placed_at: Option<Instant>,
    /// Where its next place read starts, as a standby (see [`Placed::near`](crate::db::heartbeat::Placed::near)).
    near: Option<String>,
    /// The front of the line with the standbys' load scores, as its last whole place
    /// read as a standby found it (see [`Placed::front`](crate::db::heartbeat::Placed::front)).
    front: Vec<(String, Option<f64>)>,
    /// A poke asked for a place read too soon after the last one: it is read when
    /// that is a tick old (see [`poked_place_in`]).
    place_wanted: bool,
    /// The slots the last heartbeat reported; a change sends one at once.
    beaten: Option<Vec<String>>,
    /// The pace the last heartbeat promised (see [`beat_pace`]).
    pace: Duration,
    /// A heartbeat failed since the last that landed: the next that lands is a first
    /// at its pace (see [`next_beat_in`]).
    beat_failed: bool,
    next_beat: Instant,
}

impl LineKeeper {
    /// A keeper that has looked at nothing yet: a heartbeat is due now.
    pub(crate) fn new(parts: KeeperParts, instance: String) -> LineKeeper {
        let now = parts.clock.now();
        LineKeeper {
            me: parts.identity.to_string(),
            instance,
            netns: parts.netns,
            roster: parts.roster,
            identity: parts.identity,
            watchers: parts.watchers,
            max_slots: parts.max_slots,
            timing: parts.timing,
            clock: parts.clock,
            born: parts.born,
            load: parts.load,
            health: parts.health,
            metrics: parts.metrics,
            status: parts.status,
            store: parts.store,
            protocol: parts.protocol,
            connections: parts.connections,
            shutdown: parts.shutdown,
            server: parts.server,
            refused: None,
            ahead: 0,
            marked_at: None,
            indexes_ensured: false,
            placed_at: None,
            near: None,
            front: Vec::new(),
            place_wanted: false,
            beaten: None,
            pace: Duration::ZERO,
            beat_failed: false,
            next_beat: now,
        }
    }

    /// Where this worker stands in the line.
    pub(crate) fn place(&self) -> Place {
        Place::behind(self.ahead, self.watchers)
    }

    /// Whether nobody with room stands ahead of this worker.
    pub(crate) fn first_in_line(&self) -> bool {
        self.ahead == 0
    }

    /// The front of the line with the standbys' load scores, as the last whole place
    /// read found it.
    pub(crate) fn front(&self) -> &[(String, Option<f64>)] {
        &self.front
    }

    /// The server's clock as last read, and its steps.
    pub(crate) fn server(&self) -> &ServerWatch {
        &self.server
    }

    pub(crate) fn server_mut(&mut self) -> &mut ServerWatch {
        &mut self.server
    }

    /// The identity taken over by another process, once this worker's heartbeat
    /// found it so (the worker has stopped itself then).
    pub(crate) fn take_refusal(&mut self) -> Option<BeatError> {
        self.refused.take()
    }

    /// Whether the place was last read before `t` (or never).
    pub(crate) fn placed_before(&self, t: Instant) -> bool {
        self.placed_at.is_none_or(|at| at < t)
    }

    /// How long until the keeper has something to do: the next heartbeat, a place
    /// read a poke put off, and at least once a front-paced beat (rounds come that
    /// often even at the rear, where they ask the database nothing unless something
    /// is due: `/livez` judges the loop by them).
    pub(crate) fn next_in(&self) -> Duration {
        let now = self.clock.now();
        let wait = self
            .next_beat
            .saturating_duration_since(now)
            .min(beat_every(self.timing.tick));
        if !self.place_wanted {
            return wait;
        }
        let since_read = self.placed_at.map(|t| self.clock.since(t));
        wait.min(poked_place_in(since_read, self.timing.tick))
    }

    /// A write of this worker's failed: the heartbeat is sent at the next round,
    /// to find out when writes land again.
    pub(crate) fn beat_soon(&mut self) {
        self.next_beat = self.clock.now();
    }

    /// Whether `/healthz` follows this worker's heartbeat: a standby behind the
    /// watchers. A holder's renewals and a watcher's surveys (every tick) speak for
    /// theirs; judged by both, a watcher whose surveys fail while its heartbeats
    /// land would flip between ready and not.
    pub(crate) fn judged_by_heartbeat(&self, holding: bool) -> bool {
        !holding && self.place() == Place::Rear
    }

    /// How long a standby or bookkeeping operation may take before it counts as a
    /// database failure (the driver has no socket timeout).
    pub(crate) fn op_timeout(&self) -> Duration {
        op_timeout(self.timing.tick)
    }

    /// How long the loop waits for a heartbeat or a read of its place: a holder,
    /// [`op_timeout`]; a standby, [`STANDBY_PATIENCE`] times that.
    pub(crate) fn bookkeeping_timeout(&self, holding: bool) -> Duration {
        if holding {
            self.op_timeout()
        } else {
            self.op_timeout() * STANDBY_PATIENCE
        }
    }

    /// How long this worker still leaves slots vacant since before it began (see
    /// [`claim_policy::first_hold`]): its heartbeat says so, and holders leave such
    /// slots to it meanwhile (see [`claim_policy::Round::claimable`]).
    fn settles_in(&self) -> Duration {
        claim_policy::first_hold(&self.timing).saturating_sub(self.clock.since(self.born))
    }

    /// This worker's heartbeat, holding `held` (`(slot, epoch)` each) and promising
    /// `pace`.
    fn beat_of<'a>(&'a self, held: &'a [(String, i64)], pace: Duration) -> Beat<'a> {
        Beat {
            me: &self.me,
            instance: &self.instance,
            netns: self.netns.as_deref(),
            held,
            max_slots: self.max_slots,
            tick: self.timing.tick,
            pace,
            settles_in: self.settles_in(),
            load: self.load.load(),
        }
    }

    /// Heartbeats when one is due or what this worker holds (`held`) changed, and
    /// then re-reads its place in the line when that is due (see [`place_due`]) or
    /// when `woken` (a poke: someone ahead may have claimed).
    pub(crate) async fn keep_place(&mut self, held: Holdings<'_>, woken: bool) -> Moved {
        let ids: Vec<String> = held.leases.iter().map(|(s, _)| s.clone()).collect();
        let changed = self.beaten.as_ref() != Some(&ids);
        let beat_due = changed || self.clock.now() >= self.next_beat;
        if beat_due {
            let pace = beat_pace(self.place(), self.timing.tick);
            let beaten = self.beat(held, pace).await;
            // A step of the round: `/livez` judges the loop by these too, as one
            // round may hold a survey, two heartbeats and a place read.
            self.status.lock().expect("status lock").round_done();
            if !self.landed(beaten, ids, pace, held.any) {
                return Moved::Stayed;
            }
        }
        let since_read = self.placed_at.map(|t| self.clock.since(t));
        let beat = beat_every(self.timing.tick);
        let due = beat_due && place_due(self.place(), changed, since_read, beat);
        if !(due || woken || self.place_wanted) {
            return Moved::Stayed;
        }
        if !due && !poked_place_in(since_read, self.timing.tick).is_zero() {
            // Read when the last read is a tick old: the loop wakes for it.
            self.place_wanted = true;
            return Moved::Stayed;
        }
        self.place_wanted = false;
        let moved = self.read_place(held, true).await;
        self.status.lock().expect("status lock").round_done();
        if moved == Moved::ToFront {
            // Its last heartbeat promised the rear's pace: a watcher that died would
            // be believed for two of those. Promise the front's at once.
            let pace = beat_pace(Place::Front, self.timing.tick);
            if self.pace > pace {
                if let Beaten::Written = self.beat(held, pace).await {
                    self.beaten(held.leases.iter().map(|(s, _)| s.clone()).collect(), pace);
                }
            }
        }
        moved
    }

    /// What a heartbeat for `ids` promising `pace` gave, taken in: false when it did
    /// not land (the next is tried within a front-paced beat) or another process
    /// took the identity (the worker stops).
    fn landed(&mut self, beaten: Beaten, ids: Vec<String>, pace: Duration, holding: bool) -> bool {
        let why = match beaten {
            Beaten::Written => {
                self.beaten(ids, pace);
                return true;
            }
            Beaten::InUse(e) => {
                tracing::error!(worker = %self.me, "{e}; this process's heartbeat had lapsed and another took its identity over: stopping its robots and exiting");
                self.refused = Some(e);
                self.shutdown.cancel();
                return false;
            }
            Beaten::Refused(r) => format!("refused by the server: {r}"),
            Beaten::Failed(why) => why,
        };
        self.health.write_failed();
        if self.judged_by_heartbeat(holding) {
            self.db_failed(&format!("the heartbeat was not written: {why}"));
        }
        // Tried again within a front-paced beat, not the rear's 40 s: the last beat
        // that landed is believed for two of its own paces, and a standby behind the
        // watchers is unready until one lands (one slow write must not hold it so
        // for 40 s).
        let retry = pace.min(beat_every(self.timing.tick));
        self.next_beat = self.clock.now() + retry;
        self.beat_failed = true;
        // A place read a poke put off goes with the failed beat: kept, it would have
        // the round come back at once, and beat again at once, for as long as the
        // database fails (what it holds changed, so a beat is due every round until
        // one lands). The next beat that lands reads the place.
        self.place_wanted = false;
        false
    }

    /// Records a heartbeat written for `ids` that promised `pace`: the next comes at
    /// that pace, or, after the first at a pace (a new one, or the first since a beat
    /// failed), at a random point of its second half (see [`next_beat_in`]).
    pub(crate) fn beaten(&mut self, ids: Vec<String>, pace: Duration) {
        let first = pace != self.pace || std::mem::take(&mut self.beat_failed);
        self.beaten = Some(ids);
        self.pace = pace;
        let next = next_beat_in(pace, first, random_unit());
        self.next_beat = self.clock.now() + next;
    }

    /// Sends a heartbeat holding `held`, bounded like every bookkeeping call; on
    /// success, reads the server's clock with it when a reading is due.
    ///
    /// A standby waits longer (see [`LineKeeper::bookkeeping_timeout`]). Not bounded
    /// by less: a heartbeat is two round trips, and one abandoned in flight costs
    /// the lease's pool a connection that a renewal may then have to wait for.
    pub(crate) async fn beat(&mut self, held: Holdings<'_>, pace: Duration) -> Beaten {
        let limit = self.bookkeeping_timeout(held.any);
        // The first beat reads no clock: the place read that follows it does.
        let read_clock = match self.server.last() {
            None => self.beaten.is_some(),
            Some(c) => c.age() >= CLOCK_REFRESH,
        };
        let sent = Instant::now();
        let written = {
            let beat = self.beat_of(held.leases, pace);
            tokio::time::timeout(limit, self.roster.beat(&beat, read_clock)).await
        };
        match written {
            Ok(Ok(clock)) => {
                self.health
                    .write_landed(Instant::now(), sent.elapsed(), self.timing.tick);
                if let Some(c) = clock {
                    self.server.read(c);
                }
                self.reached_database(held.any);
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

    /// Replaces `predecessor`'s heartbeat, as read, with this worker's first
    /// (promising `pace`); true when it did.
    pub(crate) async fn take_over(&self, predecessor: &Predecessor, pace: Duration) -> bool {
        let limit = self.bookkeeping_timeout(false);
        let beat = self.beat_of(&[], pace);
        matches!(
            tokio::time::timeout(limit, self.roster.take_over(&beat, predecessor)).await,
            Ok(Ok(true))
        )
    }

    /// Reads this worker's place in the line (and the server's clock with it). The
    /// first in line also marks, now and then, slots the survey's index cannot see.
    /// Unsure where it stands (no answer), a worker watches, as every worker did
    /// before the line; `settled` says it stood somewhere already, so a move to the
    /// rear slows its surveys to the rear's pace.
    pub(crate) async fn read_place(&mut self, held: Holdings<'_>, settled: bool) -> Moved {
        self.placed_at = Some(self.clock.now());
        let holding = held.leases.len();
        let limit = self.bookkeeping_timeout(held.any);
        let was = self.place();
        // Kept through a failed read: any standby ahead is a sound place to start.
        let near = self.near.clone();
        let read = self
            .roster
            .place(&self.me, holding, self.watchers, near.as_deref());
        let sent = Instant::now();
        match tokio::time::timeout(limit, read).await {
            Ok(Ok(placed)) => self.placed(placed, held, sent.elapsed()),
            Ok(Err(_)) | Err(_) => self.ahead = 0,
        }
        let place = self.place();
        if place != was || !settled {
            tracing::debug!(?place, ahead = self.ahead, "moved in the line");
        }
        self.metrics.line_front.set((place == Place::Front) as i64);
        if place == Place::Front {
            self.connections.at_front(self.op_timeout());
        }
        self.first_in_line_chores().await;
        match (was, place) {
            (Place::Rear, Place::Front) => Moved::ToFront,
            (Place::Front, Place::Rear) => Moved::ToRear,
            (_, Place::Rear) if !settled => Moved::ToRear,
            _ => Moved::Stayed,
        }
    }

    /// Takes in a place read that came back after `took`, for a worker holding
    /// `held`.
    fn placed(&mut self, placed: crate::db::heartbeat::Placed, held: Holdings<'_>, took: Duration) {
        let holding = held.leases.len();
        self.metrics.place_reads.inc();
        if placed.whole {
            self.metrics.place_reads_whole.inc();
        }
        // Only a standby behind the front starts its next read at its nearest: at
        // the front a read from there finds too few by definition, and would only
        // come before the whole one.
        if let Some(front) = placed.front {
            let idler =
                claim_policy::idler_in_front(&self.me, self.load.load().map(|l| l.score()), &front);
            self.status.lock().expect("status lock").idler_in_front = Some(idler);
            self.front = front;
        }
        if holding > 0 {
            self.status.lock().expect("status lock").idler_in_front = None;
        }
        let behind = holding == 0 && placed.ahead >= self.watchers;
        self.ahead = placed.ahead.min(self.watchers);
        self.near = placed.near.filter(|_| behind);
        if let Some(c) = placed.clock {
            self.server.read(c);
        }
        self.answered(took);
        self.reached_database(held.any);
    }

    /// The first in line, now and then (one marker is enough): the first time, makes
    /// sure of the indexes; after that, marks slots the survey's index cannot see.
    async fn first_in_line_chores(&mut self) {
        let due = self
            .marked_at
            .is_none_or(|t| self.clock.since(t) >= MARK_EVERY);
        if self.ahead != 0 || !due {
            return;
        }
        self.marked_at = Some(self.clock.now());
        if self.indexes_ensured {
            self.mark_unknown().await;
        } else {
            self.indexes_ensured = true;
            self.ensure_indexes().await;
        }
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

    /// A standby that claimed one of `seen` claimable slots pokes the next in line,
    /// in the background: one for each slot it left (they may expire together: a
    /// machine's workers died at once), and `--watchers` more for the place it
    /// leaves at the front. Standbys first; when fewer are left, holders with room,
    /// which may stand at the front now (see [`Poked::Line`]). A poked worker surveys at once and re-reads its
    /// place (at most once a tick), so the rest are claimed within a round trip or
    /// two rather than at the rear's next look, and the front is whole again. A lost
    /// poke costs latency only (see [`crate::worker::poke`]).
    pub(crate) fn poke_successors(&self, seen: usize) {
        let n = successors_to_poke(seen, self.watchers);
        let (line, me, metrics) = (self.roster.clone(), self.me.clone(), self.metrics.clone());
        tokio::spawn(async move {
            crate::worker::poke::poke_front(&line, &me, n, Poked::Line, &metrics).await;
        });
    }

    /// The database answered a request of this worker's that took `took` (see
    /// [`Health::answered`]).
    pub(crate) fn answered(&self, took: Duration) {
        self.health.answered(Instant::now(), took, self.timing.tick);
    }

    /// A standby behind the watchers asks the database for nothing but its
    /// heartbeat and its place, and may not survey for minutes: those answers are
    /// what `/healthz` knows of the database. (A holder's renewals speak for it.)
    fn reached_database(&self, holding: bool) {
        if self.judged_by_heartbeat(holding) {
            self.health.ok(&self.metrics, &self.status);
        }
    }

    /// The database failed a request of this worker's, for `why` (credentials are
    /// scrubbed here).
    pub(crate) fn db_failed(&self, why: &str) {
        self.health
            .failed(&self.metrics, &self.status, &self.store.scrub(why));
    }

    /// On a clean exit the worker leaves the `workers` list, so standbys are
    /// counted honestly. Waits at most [`op_timeout`]: the driver has no socket
    /// timeout, and a database that answers nothing (a blackholed link) would hold
    /// the exit for good. A heartbeat left behind lapses by itself.
    pub(crate) async fn leave(&self) {
        let limit = self.op_timeout();
        match tokio::time::timeout(limit, self.roster.leave(&self.me, &self.instance)).await {
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
    }

    /// This worker's `ip:port`, its process id, its network namespace: what judging
    /// another heartbeat under the identity needs (see [`crate::worker::identity`]).
    pub(crate) fn who(&self) -> (&Identity, &str, Option<&str>) {
        (&self.identity, &self.instance, self.netns.as_deref())
    }

    /// The lease protocol, for what the identity takeover asks it.
    pub(crate) fn protocol(&self) -> &LeaseProtocol {
        &self.protocol
    }

    pub(crate) fn tick(&self) -> Duration {
        self.timing.tick
    }

    pub(crate) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub(crate) fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A step of the loop, for `/livez`.
    pub(crate) fn round_done(&self) {
        self.status.lock().expect("status lock").round_done();
    }
}

/// How long a standby or bookkeeping operation may take before it counts as a
/// database failure (the driver has no socket timeout): two ticks, at least 2 s.
pub(crate) fn op_timeout(tick: Duration) -> Duration {
    (tick * 2).max(Duration::from_secs(2))
}
