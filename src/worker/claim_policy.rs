//! When a worker claims a slot, gives one back, and looks again, decided without I/O
//! from what one survey saw. [`decide`] is the one entry: it takes what the survey
//! brought and the policy's [`Memory`] of the last, and returns one [`ClaimDecision`]
//! and the memory for the next; [`apply_rules`] applies these rules in order. See docs/internals.md, "Claim rules".
//!
//! 1. Who may take what ([`Round`]): a standby at once, a holder by overflow, and
//!    a lapsed lease only after a full lease of contact ([`outage_hold`]).
//! 2. After a forward step of the server's clock ([`after_clock_step`]).
//! 3. Hand-back ([`Round::should_give_back`], [`hand_back_outcome`]).
//! 4. A new worker's holds at a cold start ([`claimable_after_survey`], [`may_claim`]).
//! 5. When to look again ([`survey_every`], [`wake_at_expiry`], [`claim_again_in`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::LeaseTiming;
use crate::db::heartbeat::LiveWorker;
use crate::db::heartbeat::REAR_TICKS;
use crate::db::lease::{Candidate, Survey};
use crate::load::SCORE_TIE;
use crate::worker::standby_line::Place;

// === The one entry: a survey in, a decision and the memory out ===

/// What one survey brought, and what the worker knows of itself then: all that
/// [`decide`] weighs.
#[derive(Debug, Clone)]
pub(crate) struct Looked<'a> {
    pub(crate) me: &'a str,
    /// The live workers, when the round read them (see `Worker::live_if_needed`).
    pub(crate) alive: &'a [LiveWorker],
    /// The slots this worker holds.
    pub(crate) held: usize,
    pub(crate) max_slots: Option<usize>,
    /// Standbys passed over by a hand-back (see [`crate::worker::hand_back`]).
    pub(crate) passed_over: &'a HashMap<String, Option<i64>>,
    pub(crate) survey: &'a Survey,
    /// How long the survey took to come back.
    pub(crate) survey_took: Duration,
    /// The pace the survey was made at (see [`Memory::due`]).
    pub(crate) pace: Pace,
    /// The survey was woken (a poke, a release, a slot that ended) rather than due.
    pub(crate) woken: bool,
    /// The front of the line with the standbys' load scores, as the last whole
    /// place read found it, and this worker's own score (see [`idler_in_front`]).
    pub(crate) front: &'a [(String, Option<f64>)],
    pub(crate) my_score: Option<f64>,
    /// How long this worker has reached the database without a break.
    pub(crate) contact: Duration,
    /// The last slot this worker handed back was taken, or there was none.
    pub(crate) ready_to_give_back: bool,
    /// See [`Seen::step_hold`].
    pub(crate) step_hold: Option<Duration>,
    /// How long the worker has run.
    pub(crate) age: Duration,
    pub(crate) overflow_after: Duration,
    pub(crate) timing: &'a LeaseTiming,
    pub(crate) now: Instant,
}

/// The claim policy's one entry: what to do after a survey, and what to remember
/// of it for the next (the slots expiring together, whether surveys stay narrow).
pub(crate) fn decide(looked: &Looked, memory: Memory) -> (ClaimDecision, Memory) {
    let (survey, now, tick) = (looked.survey, looked.now, looked.timing.tick);
    let mut memory = memory;
    // A wide survey that read too many slots: narrow ones for a while.
    if looked.pace.horizon > tick && survey.read > WIDE_MOST {
        memory.narrow_until = Some(now + NARROW_FOR);
    }
    // Slots expired or about to lapse together, as this survey or the one a tick
    // before it saw them (see Round::expiring).
    let expiring_now = survey.expired.len() + survey.expiring_soon;
    let expiring = expiring_together(memory.expiring, expiring_now, now, tick);
    memory.expiring = Some((now, expiring_now));
    let workers = peers(
        looked.alive,
        looked.me,
        looked.held,
        looked.max_slots,
        looked.passed_over,
    );
    let seen = Seen {
        round: Round {
            me: looked.me,
            workers: &workers,
            expired: &survey.expired,
            overflow_after: looked.overflow_after,
            tick,
            contact: looked.contact,
            idler_in_front: idler_in_front(looked.me, looked.my_score, looked.front),
            expiring,
        },
        place: looked.pace.place,
        woken: looked.woken,
        narrow: looked.pace.narrow,
        every: looked.pace.every,
        next_expiry: survey.next_expiry,
        ready_to_give_back: looked.ready_to_give_back,
        step_hold: looked.step_hold,
        age: looked.age,
        survey_took: looked.survey_took,
        timing: looked.timing,
    };
    (apply_rules(&seen), memory)
}

/// How many slots count as expiring together (see [`Round::expiring`]): the
/// `expiring_now` this survey saw expired or expiring within a tick, or as many as
/// the one `before` it saw, when that was no more than a tick before `now`.
fn expiring_together(
    before: Option<(Instant, usize)>,
    expiring_now: usize,
    now: Instant,
    tick: Duration,
) -> usize {
    match before {
        Some((at, n)) if now.saturating_duration_since(at) <= tick => n.max(expiring_now),
        _ => expiring_now,
    }
}

/// How a survey goes: where the worker stands, how far it reads, and when the next
/// one is due at this pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    pub(crate) place: Place,
    /// Only what expires within a tick is read (see [`survey_horizon`]).
    pub(crate) narrow: bool,
    pub(crate) every: Duration,
    pub(crate) horizon: Duration,
}

/// Where a worker stands as it looks: what sets its surveys' pace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Standing {
    pub(crate) place: Place,
    /// The slots it holds.
    pub(crate) held: usize,
    pub(crate) tick: Duration,
    pub(crate) overflow_after: Duration,
    pub(crate) now: Instant,
    /// A number in `[0, 1)`: where in its second half a rear period ends (see
    /// [`rear_survey_in`]).
    pub(crate) random: f64,
}

/// What the claim policy remembers from one survey to the next.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    /// When the next survey is due.
    next_survey: Instant,
    /// How many slots the last survey saw expired or expiring within a tick, and
    /// when (see [`Round::expiring`]).
    expiring: Option<(Instant, usize)>,
    /// Narrow surveys only until then: a wide one read too many slots (see
    /// [`NARROW_FOR`]).
    narrow_until: Option<Instant>,
}

impl Memory {
    /// A worker that has looked at nothing yet: a survey is due now.
    pub(crate) fn new(now: Instant) -> Memory {
        Memory {
            next_survey: now,
            expiring: None,
            narrow_until: None,
        }
    }

    /// When the next survey is due.
    pub(crate) fn next_survey(&self) -> Instant {
        self.next_survey
    }

    /// The next survey is due at `at` (after a decision was carried out, or at once
    /// when the worker moved up to the front).
    pub(crate) fn next_at(&mut self, at: Instant) {
        self.next_survey = at;
    }

    /// Whether a survey is due (or `woken`): its pace if so, the next one then
    /// being due a period on, else how long until it is.
    pub(crate) fn due(&mut self, at: &Standing, woken: bool) -> Result<Pace, Duration> {
        let narrow = self.narrow_until.is_some_and(|t| at.now < t);
        if !woken && at.now < self.next_survey {
            return Err(self.next_survey - at.now);
        }
        let every = survey_every(at.place, at.held, narrow, at.tick, at.overflow_after);
        let every = spread(at, every);
        self.next_survey = at.now + every;
        Ok(Pace {
            place: at.place,
            narrow,
            every,
            horizon: survey_horizon(at.place, at.held, narrow, at.tick),
        })
    }

    /// The worker moved up to the front as a claim's own place read found (the
    /// claim was decided at the rear's pace): its next survey comes no later than
    /// the front's pace from now. A holder of one slot left surveying at the rear's
    /// pace (minutes) would miss every overflow turn, and the slots of dead holders
    /// would all go to the other survivors.
    pub(crate) fn at_front(&mut self, at: &Standing) {
        let narrow = self.narrow_until.is_some_and(|t| at.now < t);
        let every = survey_every(Place::Front, at.held, narrow, at.tick, at.overflow_after);
        self.next_survey = self.next_survey.min(at.now + every);
    }

    /// The worker moved back to the rear (or first found itself there): its next
    /// survey comes at the rear's pace, not the front's.
    pub(crate) fn at_rear(&mut self, at: &Standing) {
        let every = survey_every(Place::Rear, at.held, true, at.tick, at.overflow_after);
        self.next_survey = at.now
            + spread(
                &Standing {
                    place: Place::Rear,
                    ..*at
                },
                every,
            );
    }
}

/// A survey period at the rear, spread to a random point of its second half (see
/// [`rear_survey_in`]); anything shorter than a tick's few multiples is kept as it is.
fn spread(at: &Standing, every: Duration) -> Duration {
    if at.place != Place::Rear || every <= at.tick * REAR_TICKS {
        return every;
    }
    rear_survey_in(every, at.random)
}

// === The rules ===

/// What one survey saw, and what the worker knows of itself then.
#[derive(Debug, Clone)]
pub(crate) struct Seen<'a> {
    /// This worker, the live workers and the expired slots.
    pub(crate) round: Round<'a>,
    /// Where this worker stands in the line.
    pub(crate) place: Place,
    /// The survey was woken (a poke, a release, a slot that ended) rather than due.
    pub(crate) woken: bool,
    /// The survey read only what expires within a tick (see [`survey_horizon`]).
    pub(crate) narrow: bool,
    /// How long until the next survey at this worker's pace.
    pub(crate) every: Duration,
    /// How long until the first lease the survey read (and did not find expired)
    /// expires.
    pub(crate) next_expiry: Option<Duration>,
    /// The last slot this worker handed back was taken, or there was none.
    pub(crate) ready_to_give_back: bool,
    /// How long slots stamped by a holder must still wait after a forward step of
    /// the server's clock (see [`crate::worker::clock_step`]).
    pub(crate) step_hold: Option<Duration>,
    /// How long the worker has run.
    pub(crate) age: Duration,
    /// How long the survey took to come back.
    pub(crate) survey_took: Duration,
    pub(crate) timing: &'a LeaseTiming,
}

/// What a worker does after a survey.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClaimDecision {
    /// Give the most recently claimed slot back to a live standby; look again within
    /// `wake_in`.
    GiveBack { wake_in: Duration },
    /// Claim one of `slots` (tried in turn, from this worker's place by hash); look
    /// again within `wake_in`, at the pace of a holder of one more slot.
    Claim {
        slots: Vec<Candidate>,
        wake_in: Duration,
    },
    /// Claim nothing now; look again within `wake_in`. `held_back` says why a new
    /// worker did not claim what it found (see [`may_claim`]).
    Wait {
        wake_in: Duration,
        held_back: Option<Readiness>,
    },
}

impl ClaimDecision {
    /// How long until the worker looks again.
    pub(crate) fn wake_in(&self) -> Duration {
        match self {
            ClaimDecision::GiveBack { wake_in }
            | ClaimDecision::Claim { wake_in, .. }
            | ClaimDecision::Wait { wake_in, .. } => *wake_in,
        }
    }
}

/// The decision after a survey: the rules of the module's documentation, in order.
pub(crate) fn apply_rules(seen: &Seen) -> ClaimDecision {
    let round = &seen.round;
    let (claimable, held_for) = after_clock_step(round.claimable(), seen.step_hold);
    let wake_in = [
        Some(seen.every),
        held_for.map(|left| left + Duration::from_millis(1)),
        wake_at_expiry(seen),
        round
            .next_claimable_in()
            .map(|soon| soon + Duration::from_millis(1)),
    ]
    .into_iter()
    .flatten()
    .min()
    .expect("the pace is always there");
    if seen.ready_to_give_back && round.should_give_back() {
        return ClaimDecision::GiveBack { wake_in };
    }
    if claimable.is_empty() {
        return ClaimDecision::Wait {
            wake_in,
            held_back: None,
        };
    }
    let claimable = claimable_after_survey(claimable, seen.age, seen.survey_took, seen.timing);
    let held = round.mine().held;
    let ready = Readiness {
        age: seen.age,
        survey_took: seen.survey_took,
        vacant_before: vacant_before(&claimable, seen.age),
        holding: held > 0,
    };
    let overflow_after = round.overflow_after;
    if !may_claim(ready, seen.timing, overflow_after) {
        return ClaimDecision::Wait {
            wake_in: wake_in.min(claim_again_in(ready, seen.timing, overflow_after)),
            held_back: Some(ready),
        };
    }
    // What it will hold sets how soon it looks again: a holder of two surveys every
    // tick, to see a new standby and hand one back.
    let then = survey_every(
        seen.place,
        held + 1,
        seen.narrow,
        round.tick,
        overflow_after,
    );
    ClaimDecision::Claim {
        slots: claimable,
        wake_in: wake_in.min(then),
    }
}

/// After a forward step of the server's clock (or before this worker has watched it
/// for a lease), a stamped slot's holder may still run its robots: only unstamped
/// slots (released, or never held) may be claimed, and the worker looks again when
/// the hold ends (the second value) if that held a slot back.
pub(crate) fn after_clock_step(
    mut claimable: Vec<Candidate>,
    hold: Option<Duration>,
) -> (Vec<Candidate>, Option<Duration>) {
    let Some(left) = hold else {
        return (claimable, None);
    };
    let before = claimable.len();
    claimable.retain(|c| c.time.is_none());
    let held_back = claimable.len() < before;
    (claimable, held_back.then_some(left))
}

/// A watcher, or a poked worker, wakes when the first lease its survey read expires
/// (plus its own claim delay): that is when it may take the slot.
pub(crate) fn wake_at_expiry(seen: &Seen) -> Option<Duration> {
    if !wakes_at_expiry(seen.place, seen.woken) {
        return None;
    }
    Some(seen.next_expiry? + seen.round.claim_delay()?)
}

// === Who may take what ===

/// A live worker as the round sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Peer {
    pub(crate) id: String,
    /// Slots it holds now (from its heartbeat; its own count for this worker).
    pub(crate) held: usize,
    /// Its `--max-slots`, None for no cap.
    pub(crate) max_slots: Option<usize>,
    /// A standby that left a slot handed to it untaken and has not beaten since:
    /// no slot is handed back for it.
    pub(crate) passed_over: bool,
    /// How long ago its first-lease hold ended (ms, server clock), negative while it
    /// lasts; `i64::MAX` when its heartbeat does not say.
    pub(crate) settled_ms: i64,
    /// Its load score, when its heartbeat has one.
    pub(crate) score: Option<f64>,
}

impl Peer {
    fn has_room(&self) -> bool {
        self.max_slots.is_none_or(|m| self.held < m)
    }
}

/// Everything one round decides from.
#[derive(Debug, Clone)]
pub(crate) struct Round<'a> {
    /// This worker; it is also among `workers`.
    pub(crate) me: &'a str,
    /// Every live worker, this one included, with what it holds.
    pub(crate) workers: &'a [Peer],
    pub(crate) expired: &'a [Candidate],
    pub(crate) overflow_after: Duration,
    pub(crate) tick: Duration,
    /// How long this worker has reached the database without a break (see
    /// [`outage_hold`]).
    pub(crate) contact: Duration,
    /// For a standby: how many of the standbys at the front of the line are idler
    /// than it (see [`idler_in_front`]).
    pub(crate) idler_in_front: usize,
    /// How many slots the worker saw expired or about to expire together (within a
    /// tick), at this survey or the one before it a tick ago: a standby whose
    /// pre-expiry survey saw two leases about to lapse claims the second at once,
    /// even when its survey at the expiry finds the first already taken.
    pub(crate) expiring: usize,
}

/// How much later than the one before it each standby in the front claims a slot,
/// idlest first, and each holder with room overflows, idlest first among those
/// holding as many: a tenth of a tick, several times what a survey and a claim take.
/// The idlest claims at once; the rest wait only while no more slots are expiring
/// than idler workers stand ahead of them (see [`Round::turn`]).
pub(crate) fn idle_first_step(tick: Duration) -> Duration {
    tick / 10
}

/// A score as the idlest-first order compares it: whole [`SCORE_TIE`] steps, so two
/// idle workers whose measures differ by noise keep their order (by id) from one
/// read to the next; no score counts as busiest.
fn rank_key(score: Option<f64>) -> f64 {
    score.map_or(f64::INFINITY, |s| (s / SCORE_TIE).floor())
}

/// How many of the `front` standbys (ids with their load scores, from the last
/// whole place read) are idler than `me`: a lower score, or the same one and a
/// smaller id. A standby that says no score counts as busier than any that does.
/// `me`'s own score is the one the same read saw, so that every standby orders the
/// front from the same figures.
pub(crate) fn idler_in_front(
    me: &str,
    my_score: Option<f64>,
    front: &[(String, Option<f64>)],
) -> usize {
    let key = rank_key;
    let mine = front
        .iter()
        .find(|(id, _)| id == me)
        .map_or(my_score, |(_, s)| *s);
    front
        .iter()
        .filter(|(id, s)| {
            id != me && (key(*s) < key(mine) || (key(*s) == key(mine) && id.as_str() < me))
        })
        .count()
}

impl Round<'_> {
    fn mine(&self) -> Peer {
        self.workers
            .iter()
            .find(|p| p.id == self.me)
            .cloned()
            .unwrap_or_else(|| Peer {
                id: self.me.to_string(),
                held: 0,
                max_slots: None,
                passed_over: false,
                settled_ms: i64::MAX,
                score: None,
            })
    }

    /// This worker's turn after `idler` workers ahead of it: none while more slots
    /// are expired or expiring together ([`Round::expiring`]) than idler workers
    /// stand ahead, so that every one of them has a claimer at once; else `idler`
    /// steps of [`idle_first_step`], time for the idler ones to claim first.
    fn turn(&self, idler: usize) -> Duration {
        if self.expired.len().max(self.expiring) > idler {
            Duration::ZERO
        } else {
            idle_first_step(self.tick) * idler as u32
        }
    }

    /// How many holders with room, holding as many slots as this one, are idler
    /// than it: a lower score, or the same one and a smaller id (no score: busier
    /// than any). A holder whose own slot is among the expired is dead or cut off,
    /// whatever its heartbeat still says: it does not count.
    fn idler_holders(&self, me: &Peer) -> usize {
        let key = |p: &Peer| rank_key(p.score);
        let gone = |p: &Peer| {
            self.expired
                .iter()
                .any(|c| c.owner.as_deref() == Some(&p.id))
        };
        self.workers
            .iter()
            .filter(|p| p.id != me.id && p.held == me.held && p.has_room() && !gone(p))
            .filter(|p| key(p) < key(me) || (key(p) == key(me) && p.id < me.id))
            .count()
    }

    /// How long past its expiry a slot must stand before this worker may claim it,
    /// idlest first:
    /// - a standby: its turn among the standbys at the front of the line, by load
    ///   (zero for the idlest, see [`Round::turn`]);
    /// - a holder: `overflow_after`, plus one tick per slot above the emptiest
    ///   holder with room, plus its turn by load among those holding as many;
    /// - never, for a worker at its cap.
    pub(crate) fn claim_delay(&self) -> Option<Duration> {
        let me = self.mine();
        if !me.has_room() {
            return None;
        }
        if me.held == 0 {
            return Some(self.turn(self.idler_in_front));
        }
        let fewest = self
            .workers
            .iter()
            .filter(|p| p.held > 0 && p.has_room())
            .map(|p| p.held)
            .min()
            .unwrap_or(me.held)
            .min(me.held);
        Some(
            self.overflow_after
                + self.tick * (me.held - fewest) as u32
                + self.turn(self.idler_holders(&me)),
        )
    }

    /// The most any slot can have stood for this worker's claim (ms, negative while
    /// none can): unbounded for a standby; for a holder, since the last standby's
    /// first-lease hold ended. A standby in that hold leaves a slot vacant since
    /// before it began, so the standbys' `overflow_after` counts from when they could
    /// take it, not from an expiry long past (a pool whose workers start seconds
    /// apart). Read once per round, not per slot.
    fn standing_cap_ms(&self) -> i64 {
        if self.mine().held == 0 {
            return i64::MAX;
        }
        self.workers
            .iter()
            .filter(|p| p.id != self.me && p.held == 0 && p.has_room() && !p.passed_over)
            .map(|p| p.settled_ms)
            .min()
            .unwrap_or(i64::MAX)
    }

    /// How long `slot` has stood for this worker's claim (ms): since its expiry,
    /// at most `cap` (see [`Round::standing_cap_ms`]).
    fn standing_ms(slot: &Candidate, cap: i64) -> i64 {
        (slot.expired_for.as_millis() as i64).min(cap)
    }

    /// The expired slots this worker may claim now, sorted by id (the claim starts at
    /// this worker's hash position among them).
    pub(crate) fn claimable(&self) -> Vec<Candidate> {
        let Some(delay) = self.claim_delay() else {
            return Vec::new();
        };
        let cap = self.standing_cap_ms();
        let mut out: Vec<Candidate> = self
            .expired
            .iter()
            .filter(|o| self.claimable_in(o, delay, cap).is_zero())
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// How long until an expired slot becomes claimable by this worker, if one will.
    pub(crate) fn next_claimable_in(&self) -> Option<Duration> {
        let delay = self.claim_delay()?;
        let cap = self.standing_cap_ms();
        self.expired
            .iter()
            .map(|o| self.claimable_in(o, delay, cap))
            .filter(|wait| !wait.is_zero())
            .min()
    }

    /// How long until `o` is claimable by this worker, whose claims wait `delay`
    /// past expiry: zero when it is now.
    fn claimable_in(&self, o: &Candidate, delay: Duration, cap: i64) -> Duration {
        let left = (delay.as_millis() as i64 - Self::standing_ms(o, cap)).max(0);
        let past_expiry = Duration::from_millis(left as u64);
        let contact = outage_hold(o, self.contact, self.tick * 2).unwrap_or_default();
        past_expiry.max(contact)
    }

    /// True when this worker should give one slot back now: it holds more than one,
    /// and its rank among the donors is below the number of live standbys.
    pub(crate) fn should_give_back(&self) -> bool {
        let standbys = self
            .workers
            .iter()
            .filter(|p| p.held == 0 && !p.passed_over)
            .count();
        if standbys == 0 {
            return false;
        }
        let mut donors: Vec<&Peer> = self.workers.iter().filter(|p| p.held > 1).collect();
        donors.sort_by(|a, b| b.held.cmp(&a.held).then_with(|| a.id.cmp(&b.id)));
        donors
            .iter()
            .position(|p| p.id == self.me)
            .is_some_and(|rank| rank < standbys)
    }
}

/// How long a worker that could not reach the database during slot `o`'s last lease
/// must still wait before claiming it: until it has had `lease` of unbroken
/// `contact`. A lease that lapsed while the claimer could not see it may belong to
/// a holder that is suspended, not dead (the database was away for everyone), and
/// that holder renews late the moment the database answers: the wait gives it that
/// first chance, so an outage that everyone saw moves no slot. A claimer that kept
/// contact through the whole lease (a holder partitioned alone) waits nothing, and a
/// slot released or never held has no holder to wait for. The rule only delays a
/// claim, never hastens one.
pub(crate) fn outage_hold(o: &Candidate, contact: Duration, lease: Duration) -> Option<Duration> {
    let lapsed = o.time.is_some();
    if !lapsed || contact >= lease {
        return None;
    }
    Some(lease - contact)
}

/// Live workers with the number of slots each holds: their heartbeats say who is
/// alive and what others hold (each sends one at once when that changes); this
/// worker knows its own. `passed_over` maps standbys that left a handed slot
/// untaken to the heartbeat they had then; one that has not beaten since is passed
/// over.
pub(crate) fn peers(
    alive: &[LiveWorker],
    me: &str,
    my_held: usize,
    my_max: Option<usize>,
    passed_over: &HashMap<String, Option<i64>>,
) -> Vec<Peer> {
    let mut out: Vec<Peer> = alive
        .iter()
        .filter(|w| w.id != me)
        .map(|w| Peer {
            id: w.id.clone(),
            held: w.held,
            max_slots: w.max_slots,
            passed_over: passed_over.get(&w.id) == Some(&w.seen_at_ms),
            settled_ms: w.settled_ms.unwrap_or(i64::MAX),
            score: w.score,
        })
        .collect();
    let my_score = alive.iter().find(|w| w.id == me).and_then(|w| w.score);
    out.push(Peer {
        id: me.to_string(),
        held: my_held,
        max_slots: my_max,
        passed_over: false,
        settled_ms: i64::MAX,
        score: my_score,
    });
    out
}

/// What became of a slot this worker handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandBack {
    /// Still being released, or unheld for less than two leases.
    Pending,
    /// Someone else holds it.
    Taken,
    /// Nobody took it: it stayed unheld two leases, or this worker holds it again
    /// (claimed back as overflow). The standbys of the moment are passed over.
    NotTaken,
}

/// Decides [`HandBack`] from what the round sees of the handed slot.
pub(crate) fn hand_back_outcome(
    releasing: bool,
    expired: bool,
    mine_again: bool,
    waited: Duration,
    lease: Duration,
) -> HandBack {
    if releasing {
        HandBack::Pending
    } else if mine_again {
        HandBack::NotTaken
    } else if expired {
        if waited < lease * 2 {
            HandBack::Pending
        } else {
            HandBack::NotTaken
        }
    } else {
        HandBack::Taken
    }
}

// === A new worker's holds, and how often to look ===

/// How often a worker surveys the slots when the last survey found nothing it will
/// be able to claim sooner (`narrow` as for [`survey_horizon`]): after a wide survey,
/// once per horizon; a front standby or a holder of several slots, every tick; a
/// front holder of one slot, every tick plus `overflow_after` (it can take nothing
/// sooner); everyone else, once per [`safety_survey_every`] ([`rear_survey_in`]).
pub(crate) fn survey_every(
    place: Place,
    held: usize,
    narrow: bool,
    tick: Duration,
    overflow_after: Duration,
) -> Duration {
    let horizon = survey_horizon(place, held, narrow, tick);
    if horizon > tick {
        return horizon;
    }
    match (place, held) {
        (_, h) if h > 1 => tick,
        (Place::Front, 0) => tick,
        (Place::Front, _) => (tick + overflow_after).min(tick * REAR_TICKS),
        (Place::Rear, _) => safety_survey_every(tick),
    }
}

/// How often a worker behind the watchers surveys, at most: every [`SAFETY_SURVEY`],
/// or every [`REAR_TICKS`] ticks at a tick so long that those are longer.
///
/// So seldom is safe because the watchers claim at expiry and poke the rear; this
/// survey only catches what the line missed (every watcher killed with the holder).
/// See docs/internals.md, "Claim rules".
pub(crate) fn safety_survey_every(tick: Duration) -> Duration {
    SAFETY_SURVEY.max(tick * REAR_TICKS)
}

/// See [`safety_survey_every`]: five minutes. An idle rear standby then costs the
/// database about a survey every 3.75 minutes (0.004 requests a second).
pub(crate) const SAFETY_SURVEY: Duration = Duration::from_secs(300);

/// When a rear worker's next survey comes, `every` being its period and `random` a
/// number in `[0, 1)`: somewhere in the second half of the period. Workers that went
/// to the rear together (a pool's cold start) would otherwise survey together, a
/// burst of hundreds at once every period; spread, they come one at a time, and a
/// rear worker never goes more than a period without one.
pub(crate) fn rear_survey_in(every: Duration, random: f64) -> Duration {
    every.mul_f64(0.5 + random.clamp(0.0, 1.0) / 2.0)
}

/// The most slots a standby's wide survey may read before it goes back to narrow
/// ones (see [`survey_horizon`]).
pub(crate) const WIDE_MOST: usize = 16;

/// How long a standby whose wide survey read more than [`WIDE_MOST`] slots keeps to
/// narrow ones before it tries a wide one again (the pool may have shrunk).
pub(crate) const NARROW_FOR: Duration = Duration::from_secs(60);

/// How far ahead a survey reads, on the server's clock: which leases it sees before
/// they expire, and so how long its worker may sleep after it.
///
/// - **Wide**, one lease (`L`), for a front standby of a small pool: it reads every
///   slot and sleeps until the earliest expiry it read, about a third fewer surveys.
/// - **Narrow**, one tick, otherwise and past [`WIDE_MOST`] slots: it reads only the
///   late leases (O(expired)), and the worker looks again within a tick.
///
/// `narrow` says the last wide survey read too many slots a short while ago.
pub(crate) fn survey_horizon(place: Place, held: usize, narrow: bool, tick: Duration) -> Duration {
    if place == Place::Front && held == 0 && !narrow {
        tick * 2
    } else {
        tick
    }
}

/// Whether a survey's worker wakes when the first lease it read (one ending within
/// its horizon) expires: a watcher always; a worker behind them when the survey was
/// woken (a poke). A claimer pokes the standbys behind it because its holder's
/// neighbours may have died with it, and their leases end up to a tick apart: woken
/// at their expiry, the poked take them then instead of at their rear pace.
pub(crate) fn wakes_at_expiry(place: Place, woken: bool) -> bool {
    place == Place::Front || woken
}

/// How long a new worker may hold off claiming (see [`may_claim`]): a worker older
/// than this claims whatever its connections and the database's answers.
pub(crate) const SETTLE_MOST: Duration = Duration::from_secs(20);

/// What [`may_claim`] weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// How long the worker has run.
    pub(crate) age: Duration,
    /// How long the survey that found the slot took to come back.
    pub(crate) survey_took: Duration,
    /// Whether every slot it found was vacant before the worker began: none was
    /// released or orphaned since (see [`vacant_before`]).
    pub(crate) vacant_before: bool,
    /// Whether it holds a slot already: the claim would be an overflow.
    pub(crate) holding: bool,
}

/// Whether every one of `claimable` has been vacant for at least `age` (how long the
/// worker has run): nobody was there to take them, so the whole pool is starting.
/// A slot released or left by a dead holder since the worker began is a hand-back
/// or a takeover, which it takes at once.
pub(crate) fn vacant_before(claimable: &[crate::db::lease::Candidate], age: Duration) -> bool {
    claimable.iter().all(|c| c.expired_for >= age)
}

/// Whether a worker may claim the slots its survey found: always once it is older
/// than [`SETTLE_MOST`]; before that, once the survey came back within the time a
/// renewal may take (`L − margin − T`,
/// 0.55 T), and, when every slot it found was vacant before it began (a pool
/// starting), once it has run its first lease (`2 T`, at most 2 s: [`first_hold`]).
///
/// At a cold start the first claimers could not renew in time; a takeover or a
/// hand-back is never held back. See docs/internals.md, "Claim rules", and
/// docs/bench/2026-11-26-a-pool-of-200-workers.md.
pub(crate) fn may_claim(
    r: Readiness,
    timing: &crate::config::LeaseTiming,
    overflow_after: Duration,
) -> bool {
    let in_time = timing.renewal_wait().saturating_sub(timing.tick);
    let held_out = r.age >= hold(r, timing, overflow_after) || !r.vacant_before;
    let survey_in_time = r.survey_took <= in_time || !r.vacant_before;
    r.age >= SETTLE_MOST || (held_out && survey_in_time)
}

/// What a worker may claim of `claimable` after a survey that took `survey_took`,
/// at `age`: all of them, except that a new worker after a slow survey leaves the
/// slots vacant since before it began (those [`may_claim`] holds back then) and
/// takes only those orphaned or released since, when there are any. One such slot
/// must not lift the slow-survey gate for a starting pool's others.
pub(crate) fn claimable_after_survey(
    mut claimable: Vec<crate::db::lease::Candidate>,
    age: Duration,
    survey_took: Duration,
    timing: &crate::config::LeaseTiming,
) -> Vec<crate::db::lease::Candidate> {
    let in_time = timing.renewal_wait().saturating_sub(timing.tick);
    if age < SETTLE_MOST && survey_took > in_time {
        let recent: Vec<_> = claimable
            .iter()
            .filter(|c| c.expired_for < age)
            .cloned()
            .collect();
        if !recent.is_empty() {
            claimable = recent;
        }
    }
    claimable
}

/// How long a new worker holds off slots vacant since before it began: its first
/// lease, at most 2 s. Other processes' starts reach the server within that
/// whatever the tick; a 20 s tick would otherwise hold a pool's first claim 40 s.
pub(crate) fn first_hold(timing: &crate::config::LeaseTiming) -> Duration {
    timing.lease().min(Duration::from_secs(2))
}

/// How long from its start a worker holds off slots vacant since before it began:
/// [`first_hold`], and `overflow_after` more for a second slot (see [`may_claim`]).
pub(crate) fn hold(
    r: Readiness,
    timing: &crate::config::LeaseTiming,
    overflow_after: Duration,
) -> Duration {
    if r.holding {
        first_hold(timing) + overflow_after
    } else {
        first_hold(timing)
    }
}

/// When a worker held back by [`may_claim`] looks again: when its [`hold`] is
/// out, if that is what holds it back; otherwise a tick on.
pub(crate) fn claim_again_in(
    r: Readiness,
    timing: &crate::config::LeaseTiming,
    overflow_after: Duration,
) -> Duration {
    let hold = hold(r, timing, overflow_after);
    if r.vacant_before && r.age < hold {
        hold - r.age
    } else {
        timing.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);
    const L: Duration = Duration::from_secs(2);

    fn peer(id: &str, held: usize) -> Peer {
        Peer {
            id: id.into(),
            held,
            max_slots: None,
            passed_over: false,
            settled_ms: i64::MAX,
            score: None,
        }
    }

    fn orphan(id: &str, ms: u64) -> Candidate {
        Candidate {
            id: id.into(),
            time: None,
            epoch: 1,
            expired_for: Duration::from_millis(ms),
            owner: None,
        }
    }

    fn round<'a>(me: &'a str, workers: &'a [Peer], expired: &'a [Candidate]) -> Round<'a> {
        Round {
            me,
            workers,
            expired,
            overflow_after: L,
            tick: T,
            contact: Duration::from_secs(3600),
            idler_in_front: 0,
            expiring: 0,
        }
    }

    #[test]
    fn the_idlest_standby_in_front_claims_first_and_the_rest_only_when_slots_are_short() {
        let front = |v: &[(&str, Option<f64>)]| -> Vec<(String, Option<f64>)> {
            v.iter().map(|(i, s)| (i.to_string(), *s)).collect()
        };
        let f = front(&[("a", Some(30.0)), ("b", Some(2.0)), ("c", None)]);
        assert_eq!(idler_in_front("b", None, &f), 0, "the idlest");
        assert_eq!(idler_in_front("a", None, &f), 1);
        assert_eq!(idler_in_front("c", None, &f), 2, "no score: last");
        // Equal scores: by id. Not in the front: its own score against theirs.
        let f = front(&[("a", Some(2.0)), ("b", Some(2.0))]);
        assert_eq!(idler_in_front("b", None, &f), 1);
        assert_eq!(idler_in_front("z", Some(1.0), &f), 0);
        assert_eq!(idler_in_front("z", Some(9.0), &f), 2);

        let w = [peer("a", 1), peer("s", 0)];
        let one = [orphan("x", 0)];
        let mut r = round("s", &w, &one);
        assert_eq!(r.claim_delay(), Some(Duration::ZERO));
        r.idler_in_front = 1;
        // One idler standby ahead and one slot: it waits its turn, a tenth of a tick.
        assert_eq!(r.claim_delay(), Some(idle_first_step(T)));
        assert!(r.claimable().is_empty());
        let stood = [orphan("x", 200)];
        assert_eq!(ids(round_with_idler("s", &w, &stood, 1).claimable()), ["x"]);
        // Two leases about to lapse together, seen before the expiry: the second
        // standby claims at once, even when the idlest already took one.
        let r = Round {
            expiring: 2,
            ..round_with_idler("s", &w, &one, 1)
        };
        assert_eq!(r.claim_delay(), Some(Duration::ZERO));
        // Idle standbys whose measures differ by noise keep their order by id.
        let f = front(&[("a", Some(0.4)), ("b", Some(0.1))]);
        assert_eq!(idler_in_front("a", None, &f), 0);
        assert_eq!(idler_in_front("b", None, &f), 1);
        // Two slots for two standbys: no turn to wait.
        let two = [orphan("x", 0), orphan("y", 0)];
        assert_eq!(
            round_with_idler("s", &w, &two, 1).claim_delay(),
            Some(Duration::ZERO)
        );
    }

    fn round_with_idler<'a>(
        me: &'a str,
        workers: &'a [Peer],
        expired: &'a [Candidate],
        idler: usize,
    ) -> Round<'a> {
        Round {
            idler_in_front: idler,
            ..round(me, workers, expired)
        }
    }

    #[test]
    fn the_idlest_survivor_overflows_first_among_those_holding_as_many() {
        let busy = |id: &str, held, score| Peer {
            score: Some(score),
            ..peer(id, held)
        };
        let w = [busy("a", 1, 40.0), busy("b", 1, 5.0), busy("c", 2, 1.0)];
        let one = [orphan("x", 0)];
        assert_eq!(round("b", &w, &one).claim_delay(), Some(L));
        assert_eq!(
            round("a", &w, &one).claim_delay(),
            Some(L + idle_first_step(T))
        );
        // Holding more still waits a tick a slot, whatever its score.
        assert_eq!(round("c", &w, &one).claim_delay(), Some(L + T));
        // A holder whose own slot lapsed is gone, whatever its heartbeat says: the
        // survivor does not wait for it.
        let w = [busy("dead", 1, 0.0), busy("b", 1, 5.0)];
        let lost = [Candidate {
            owner: Some("dead".into()),
            time: Some(bson::DateTime::from_millis(1)),
            ..orphan("x", 0)
        }];
        assert_eq!(round("b", &w, &lost).claim_delay(), Some(L));
        assert_eq!(
            round("b", &w, &one).claim_delay(),
            Some(L + idle_first_step(T))
        );
        let w = [busy("a", 1, 40.0), busy("b", 1, 5.0), busy("c", 2, 1.0)];
        // Two orphans: the two idlest of those holding one take them at once.
        let two = [orphan("x", 0), orphan("y", 0)];
        assert_eq!(round("a", &w, &two).claim_delay(), Some(L));
    }

    fn ids(c: Vec<Candidate>) -> Vec<String> {
        c.into_iter().map(|c| c.id).collect()
    }

    fn lapsed(id: &str, ms: u64) -> Candidate {
        Candidate {
            time: Some(bson::DateTime::from_millis(1)),
            ..orphan(id, ms)
        }
    }

    #[test]
    fn a_lapsed_lease_waits_for_a_full_lease_of_contact() {
        // The database was away for this worker too: it has had 500 ms of contact.
        let hold = outage_hold(&lapsed("s1", 100), Duration::from_millis(500), L);
        assert_eq!(hold, Some(Duration::from_millis(1500)));
        // A full lease of contact: the holder had its chance to renew late.
        assert_eq!(outage_hold(&lapsed("s1", 100), L, L), None);
    }

    #[test]
    fn a_claimer_that_saw_the_whole_lease_waits_nothing() {
        // Contact through the lease and since its expiry: a holder partitioned alone.
        assert_eq!(outage_hold(&lapsed("s1", 0), L, L), None);
        assert_eq!(
            outage_hold(&lapsed("s1", 300), L + Duration::from_millis(300), L),
            None
        );
    }

    #[test]
    fn a_released_or_never_held_slot_has_no_holder_to_wait_for() {
        assert_eq!(outage_hold(&orphan("s1", 0), Duration::ZERO, L), None);
    }

    #[test]
    fn the_outage_hold_delays_the_claim_and_says_when() {
        let w = [peer("a", 0), peer("b", 1)];
        let e = [lapsed("s1", 100), orphan("s2", 0)];
        let mut r = round("a", &w, &e);
        r.contact = Duration::from_millis(500);
        assert_eq!(
            ids(r.claimable()),
            ["s2"],
            "the released slot is taken at once"
        );
        assert_eq!(r.next_claimable_in(), Some(Duration::from_millis(1500)));
        r.contact = L;
        assert_eq!(ids(r.claimable()), ["s1", "s2"]);
        assert_eq!(r.next_claimable_in(), None);
    }

    #[test]
    fn the_outage_hold_never_hastens_an_overflow() {
        // A holder's overflow waits `overflow_after` past expiry whatever its contact.
        let w = [peer("a", 1)];
        let e = [lapsed("s1", 100)];
        let mut r = round("a", &w, &e);
        r.contact = Duration::from_secs(3600);
        assert!(r.claimable().is_empty());
        assert_eq!(r.next_claimable_in(), Some(L - Duration::from_millis(100)));
        r.contact = Duration::ZERO;
        assert_eq!(r.next_claimable_in(), Some(L));
    }

    #[test]
    fn a_standby_claims_at_expiry() {
        let w = [peer("a", 0), peer("b", 1)];
        let e = [orphan("s2", 0), orphan("s1", 5)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1", "s2"]);
    }

    #[test]
    fn a_holder_waits_for_the_standbys_then_overflows() {
        let w = [peer("a", 1), peer("b", 0)];
        let e = [orphan("s1", 1999)];
        let r = round("a", &w, &e);
        assert!(r.claimable().is_empty(), "the standby's turn");
        assert_eq!(r.next_claimable_in(), Some(Duration::from_millis(1)));
        let e = [orphan("s1", 2000)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1"]);
    }

    #[test]
    fn a_holder_leaves_a_long_vacant_slot_to_a_standby_still_in_its_first_hold() {
        // A pool starting seconds apart: the slot has been vacant a minute, and the
        // standby b began a second ago (its first-lease hold ends in a second).
        let mut b = peer("b", 0);
        b.settled_ms = -1000;
        let e = [orphan("s1", 60_000)];
        let w = [peer("a", 1), b.clone()];
        let r = round("a", &w, &e);
        assert!(r.claimable().is_empty(), "b takes it when its hold ends");
        assert_eq!(
            r.next_claimable_in(),
            Some(Duration::from_millis(3000)),
            "overflow_after past then"
        );
        // Settled for overflow_after and still a standby: a holder may take it.
        b.settled_ms = 2000;
        let w = [peer("a", 1), b.clone()];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1"]);
        // A standby passed over, or at its cap, holds nobody back.
        b.settled_ms = -1000;
        b.passed_over = true;
        assert_eq!(
            ids(round("a", &[peer("a", 1), b.clone()], &e).claimable()),
            ["s1"]
        );
        b.passed_over = false;
        b.max_slots = Some(0);
        assert_eq!(
            ids(round("a", &[peer("a", 1), b.clone()], &e).claimable()),
            ["s1"]
        );
        // A slot that expired since the standby settled counts from its expiry.
        b.max_slots = None;
        b.settled_ms = 10_000;
        let w = [peer("a", 1), b.clone()];
        let e = [orphan("s1", 1500)];
        assert_eq!(
            round("a", &w, &e).next_claimable_in(),
            Some(Duration::from_millis(500))
        );
        // A standby never waits for another.
        let w = [peer("a", 0), b];
        let e = [orphan("s1", 0)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1"]);
    }

    #[test]
    fn holders_with_fewer_slots_go_first() {
        let w = [peer("a", 2), peer("b", 1), peer("c", 1)];
        let e = [orphan("s4", 2500)];
        assert_eq!(ids(round("b", &w, &e).claimable()), ["s4"]);
        assert_eq!(ids(round("c", &w, &e).claimable()), ["s4"]);
        assert!(round("a", &w, &e).claimable().is_empty());
        assert_eq!(
            round("a", &w, &e).next_claimable_in(),
            Some(Duration::from_millis(500)),
            "one tick later, in case b and c cannot"
        );
    }

    #[test]
    fn a_full_holder_does_not_count_as_the_emptiest() {
        let mut b = peer("b", 1);
        b.max_slots = Some(1);
        let w = [peer("a", 2), b];
        let e = [orphan("s3", 2000)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s3"]);
        assert!(round("b", &w, &e).claimable().is_empty(), "at its cap");
        assert_eq!(round("b", &w, &e).claim_delay(), None);
    }

    #[test]
    fn one_slot_back_per_standby_from_the_most_loaded() {
        let w = [peer("a", 3), peer("b", 2), peer("c", 0)];
        assert!(round("a", &w, &[]).should_give_back());
        assert!(
            !round("b", &w, &[]).should_give_back(),
            "one standby, one donor"
        );
        let w = [peer("a", 3), peer("b", 2), peer("c", 0), peer("d", 0)];
        assert!(round("b", &w, &[]).should_give_back());
        let w = [peer("a", 2), peer("b", 2), peer("c", 0)];
        assert!(round("a", &w, &[]).should_give_back(), "ties by id");
        assert!(!round("b", &w, &[]).should_give_back());
        let w = [peer("a", 1), peer("c", 0)];
        assert!(
            !round("a", &w, &[]).should_give_back(),
            "never below one slot"
        );
        let w = [peer("a", 3), peer("b", 1)];
        assert!(!round("a", &w, &[]).should_give_back(), "no standby");
    }

    #[test]
    fn peers_from_heartbeats_and_my_own_count() {
        let live = |id: &str, held, max| LiveWorker {
            id: id.into(),
            held,
            max_slots: max,
            seen_at_ms: Some(100),
            settled_ms: None,
            score: None,
        };
        let alive = [live("a", 1, None), live("b", 0, Some(2))];
        let none = HashMap::new();
        let p = peers(&alive, "a", 2, Some(3), &none);
        assert_eq!(p.len(), 2);
        assert!(p.contains(&Peer {
            id: "a".into(),
            held: 2,
            max_slots: Some(3),
            passed_over: false,
            settled_ms: i64::MAX,
            score: None,
        }));
        assert!(p.contains(&Peer {
            id: "b".into(),
            held: 0,
            max_slots: Some(2),
            passed_over: false,
            settled_ms: i64::MAX,
            score: None,
        }));
        // A worker whose heartbeat is not in yet still counts itself.
        assert_eq!(peers(&[], "me", 0, None, &none), [peer("me", 0)]);
    }

    #[test]
    fn a_standby_that_left_a_handed_slot_is_passed_over_until_it_beats_again() {
        let live = |seen| LiveWorker {
            id: "s".into(),
            held: 0,
            max_slots: None,
            seen_at_ms: Some(seen),
            settled_ms: None,
            score: None,
        };
        let passed: HashMap<String, Option<i64>> = [("s".to_string(), Some(100))].into();
        let w = peers(&[live(100)], "a", 2, None, &passed);
        assert!(!round("a", &w, &[]).should_give_back(), "still frozen");
        let w = peers(&[live(5100)], "a", 2, None, &passed);
        assert!(round("a", &w, &[]).should_give_back(), "it beat again");
    }

    #[test]
    fn a_hand_back_is_taken_pending_or_not_taken() {
        use HandBack::*;
        let l = L;
        assert_eq!(hand_back_outcome(true, false, false, 10 * l, l), Pending);
        assert_eq!(hand_back_outcome(false, true, false, l, l), Pending);
        assert_eq!(hand_back_outcome(false, true, false, 2 * l, l), NotTaken);
        assert_eq!(hand_back_outcome(false, false, true, l / 2, l), NotTaken);
        assert_eq!(hand_back_outcome(false, false, false, l / 2, l), Taken);
    }

    #[test]
    fn only_a_standby_at_the_front_of_a_small_pool_reads_a_lease_ahead() {
        assert_eq!(survey_horizon(Place::Front, 0, false, T), T * 2);
        assert_eq!(
            survey_every(Place::Front, 0, false, T, Duration::from_secs(2)),
            T * 2,
            "a wide survey saw every lease that ends within its horizon"
        );
        assert_eq!(survey_horizon(Place::Front, 0, true, T), T, "a large pool");
        assert_eq!(survey_horizon(Place::Front, 1, false, T), T, "a holder");
        assert_eq!(survey_horizon(Place::Rear, 0, false, T), T);
    }

    #[test]
    fn vacancies_older_than_the_worker_mean_a_pool_starting() {
        let slot = |secs: u64| crate::db::lease::Candidate {
            id: "slot-001".into(),
            time: None,
            epoch: 1,
            expired_for: Duration::from_secs(secs),
            owner: None,
        };
        let age = Duration::from_secs(5);
        assert!(vacant_before(&[slot(5), slot(60)], age));
        assert!(
            !vacant_before(&[slot(60), slot(4)], age),
            "one since: take it"
        );
        assert!(vacant_before(
            &[crate::db::lease::Candidate {
                expired_for: crate::db::lease::LONG_AGO,
                ..slot(0)
            }],
            age
        ));
    }

    #[test]
    fn a_new_worker_claims_once_settled_an_old_one_at_once() {
        let timing = crate::config::LeaseTiming::from_tick(Duration::from_secs(1));
        let ms = Duration::from_millis;
        // The default `--overflow-after`, a lease.
        const O: Duration = Duration::from_secs(2);
        let ready = Readiness {
            age: ms(2000),
            survey_took: ms(550),
            vacant_before: true,
            holding: false,
        };
        assert!(may_claim(ready, &timing, O));
        // Within its first lease; after a slow survey.
        assert!(!may_claim(
            Readiness {
                age: ms(1999),
                ..ready
            },
            &timing,
            O
        ));
        assert!(!may_claim(
            Readiness {
                survey_took: ms(551),
                ..ready
            },
            &timing,
            O
        ));
        // Past SETTLE_MOST, nothing holds it back.
        let old = Readiness {
            age: SETTLE_MOST,
            survey_took: ms(5000),
            vacant_before: true,
            holding: false,
        };
        assert!(may_claim(old, &timing, O));
        // At a 20 s tick the hold is 2 s, not a lease.
        let slow = crate::config::LeaseTiming::from_tick(Duration::from_secs(20));
        let at_2s = Readiness {
            age: ms(2000),
            survey_took: ms(50),
            ..ready
        };
        assert!(may_claim(at_2s, &slow, O));
        assert!(!may_claim(
            Readiness {
                age: ms(1999),
                ..at_2s
            },
            &slow,
            O
        ));
        assert_eq!(
            claim_again_in(
                Readiness {
                    age: ms(500),
                    ..at_2s
                },
                &slow,
                O
            ),
            ms(1500)
        );
        assert_eq!(
            claim_again_in(
                Readiness {
                    age: ms(500),
                    ..at_2s
                },
                &timing,
                O
            ),
            ms(1500)
        );
        assert_eq!(claim_again_in(at_2s, &timing, O), timing.tick);
        // At a 250 ms tick: a lease is 500 ms, a survey may take 137 ms.
        let quick = crate::config::LeaseTiming::from_tick(ms(250));
        let r = Readiness {
            age: ms(500),
            survey_took: ms(137),
            vacant_before: true,
            holding: false,
        };
        assert!(may_claim(r, &quick, O));
        assert!(!may_claim(
            Readiness {
                survey_took: ms(140),
                ..r
            },
            &quick,
            O
        ));
    }

    #[test]
    fn a_new_holder_leaves_a_second_slot_to_the_standbys_for_overflow_after() {
        let timing = crate::config::LeaseTiming::from_tick(Duration::from_secs(1));
        let overflow_after = timing.lease();
        let ms = Duration::from_millis;
        // Its first slot at 2 s; a poke at 2.2 s has it survey, and every other
        // slot of the starting pool is still vacant.
        let poked = Readiness {
            age: ms(2200),
            survey_took: ms(20),
            vacant_before: true,
            holding: true,
        };
        assert!(!may_claim(poked, &timing, overflow_after));
        assert_eq!(claim_again_in(poked, &timing, overflow_after), ms(1800));
        let later = Readiness {
            age: ms(4000),
            ..poked
        };
        assert!(may_claim(later, &timing, overflow_after), "nobody took it");
        // A slot released or orphaned since it began is another matter: the
        // overflow rule's own delay (from its expiry) is all it waits.
        let orphaned = Readiness {
            vacant_before: false,
            ..poked
        };
        assert!(may_claim(orphaned, &timing, overflow_after));
        // A standby is held only its first lease.
        let standby = Readiness {
            holding: false,
            ..poked
        };
        assert!(may_claim(standby, &timing, overflow_after));
    }

    #[test]
    fn a_new_worker_takes_an_orphaned_slot_whatever_its_survey_took() {
        let timing = crate::config::LeaseTiming::from_tick(Duration::from_secs(1));
        let ms = Duration::from_millis;
        let slow = Readiness {
            age: ms(7000),
            survey_took: ms(900),
            vacant_before: false,
            holding: false,
        };
        assert!(may_claim(slow, &timing, timing.lease()), "a takeover");
        // A pool starting: the same survey holds it back a tick.
        let starting = Readiness {
            vacant_before: true,
            ..slow
        };
        assert!(!may_claim(starting, &timing, timing.lease()));
        assert_eq!(
            claim_again_in(starting, &timing, timing.lease()),
            timing.tick
        );
    }

    #[test]
    fn after_a_slow_survey_a_new_worker_takes_only_the_orphaned_slots() {
        let timing = crate::config::LeaseTiming::from_tick(Duration::from_secs(1));
        let ms = Duration::from_millis;
        let slot = |id: &str, expired_for| crate::db::lease::Candidate {
            id: id.into(),
            time: None,
            epoch: 1,
            expired_for,
            owner: None,
        };
        let old = slot("slot-001", crate::db::lease::LONG_AGO);
        let orphaned = slot("slot-002", ms(300));
        let both = vec![old.clone(), orphaned.clone()];
        let slow = claimable_after_survey(both.clone(), ms(7000), ms(900), &timing);
        assert_eq!(slow.len(), 1);
        assert_eq!(slow[0].id, orphaned.id);
        assert!(!vacant_before(&slow, ms(7000)), "so may_claim lets it go");
        // In time, or an old worker: everything.
        assert_eq!(
            claimable_after_survey(both.clone(), ms(7000), ms(100), &timing).len(),
            2
        );
        assert_eq!(
            claimable_after_survey(both, SETTLE_MOST, ms(900), &timing).len(),
            2
        );
        // Only slots vacant since before it began: left to may_claim's gate.
        let starting = claimable_after_survey(vec![old], ms(7000), ms(900), &timing);
        assert!(vacant_before(&starting, ms(7000)));
    }

    #[test]
    fn a_poked_worker_wakes_at_the_expiry_its_survey_read() {
        assert!(wakes_at_expiry(Place::Front, false));
        assert!(wakes_at_expiry(Place::Rear, true));
        assert!(!wakes_at_expiry(Place::Rear, false));
    }

    /// What a settled worker (a minute old) saw after a
    /// quick survey.
    fn seen<'a>(
        workers: &'a [Peer],
        expired: &'a [Candidate],
        timing: &'a LeaseTiming,
    ) -> Seen<'a> {
        Seen {
            round: Round {
                me: "me",
                workers,
                expired,
                overflow_after: L,
                tick: T,
                contact: Duration::from_secs(3600),
                idler_in_front: 0,
                expiring: 0,
            },
            place: Place::Front,
            woken: false,
            narrow: true,
            every: T,
            next_expiry: None,
            ready_to_give_back: true,
            step_hold: None,
            age: Duration::from_secs(60),
            survey_took: Duration::from_millis(5),
            timing,
        }
    }

    fn stamped(id: &str, ms: u64) -> Candidate {
        Candidate {
            time: Some(bson::DateTime::from_millis(1_000)),
            ..orphan(id, ms)
        }
    }

    #[test]
    fn a_standby_claims_what_it_found_expired() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 0), peer("b", 1)];
        let expired = [stamped("s2", 10), orphan("s1", 10)];
        let d = apply_rules(&seen(&workers, &expired, &timing));
        let ClaimDecision::Claim { slots, wake_in } = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            slots.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["s1", "s2"]
        );
        assert_eq!(wake_in, T);
    }

    #[test]
    fn after_a_clock_step_only_unstamped_slots_are_claimed_and_the_hold_wakes_it() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 0)];
        let expired = [stamped("s1", 10)];
        let mut s = seen(&workers, &expired, &timing);
        s.step_hold = Some(Duration::from_millis(300));
        assert_eq!(
            apply_rules(&s),
            ClaimDecision::Wait {
                wake_in: Duration::from_millis(301),
                held_back: None
            }
        );
        // A released slot has no holder to wait for.
        let expired = [stamped("s1", 10), orphan("s2", 10)];
        let mut s = seen(&workers, &expired, &timing);
        s.step_hold = Some(Duration::from_millis(300));
        let ClaimDecision::Claim { slots, .. } = apply_rules(&s) else {
            panic!()
        };
        assert_eq!(slots.len(), 1);
        assert_eq!(slots[0].id, "s2");
    }

    #[test]
    fn a_holder_of_two_gives_one_back_once_its_last_hand_back_was_taken() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 2), peer("new", 0)];
        let s = seen(&workers, &[], &timing);
        assert_eq!(apply_rules(&s), ClaimDecision::GiveBack { wake_in: T });
        let mut pending = s.clone();
        pending.ready_to_give_back = false;
        assert!(matches!(apply_rules(&pending), ClaimDecision::Wait { .. }));
    }

    #[test]
    fn a_new_worker_at_a_cold_start_waits_out_its_first_lease() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 0)];
        // Vacant since long before it began: a pool starting.
        let expired = [orphan("s1", 60_000)];
        let mut s = seen(&workers, &expired, &timing);
        s.age = Duration::from_millis(500);
        s.every = Duration::from_secs(10);
        let d = apply_rules(&s);
        let ClaimDecision::Wait {
            wake_in,
            held_back: Some(ready),
        } = d
        else {
            panic!("{d:?}")
        };
        assert!(ready.vacant_before);
        assert_eq!(
            wake_in,
            Duration::from_millis(1_500),
            "at its first lease's end"
        );
        // A slot released since it began (a hand-back to it) is taken at once.
        let expired = [orphan("s1", 100)];
        let mut s = seen(&workers, &expired, &timing);
        s.age = Duration::from_millis(500);
        assert!(matches!(apply_rules(&s), ClaimDecision::Claim { .. }));
    }

    #[test]
    fn a_holder_that_overflows_looks_again_within_a_tick_to_hand_back() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 1)];
        let expired = [orphan("s2", 5_000)];
        let mut s = seen(&workers, &expired, &timing);
        // The pace of a holder of one slot: a look every tick + overflow_after.
        s.every = survey_every(Place::Front, 1, true, T, L);
        assert_eq!(s.every, T + L);
        let ClaimDecision::Claim { wake_in, .. } = apply_rules(&s) else {
            panic!()
        };
        assert_eq!(wake_in, T, "a holder of two looks every tick");
    }

    #[test]
    fn a_watcher_wakes_at_the_first_expiry_it_read_plus_its_claim_delay() {
        let timing = LeaseTiming::from_tick(T);
        let workers = [peer("me", 1), peer("b", 1)];
        let mut s = seen(&workers, &[], &timing);
        s.every = Duration::from_secs(10);
        s.next_expiry = Some(Duration::from_millis(400));
        // "b" holds as many and, with no scores, comes first by id: "me" waits its
        // turn after it.
        let turn = idle_first_step(T);
        assert_eq!(
            apply_rules(&s).wake_in(),
            Duration::from_millis(400) + L + turn
        );
        // Behind the watchers, only when poked.
        s.place = Place::Rear;
        assert_eq!(apply_rules(&s).wake_in(), Duration::from_secs(10));
        s.woken = true;
        assert_eq!(
            apply_rules(&s).wake_in(),
            Duration::from_millis(400) + L + turn
        );
    }

    #[test]
    fn how_often_a_worker_surveys_follows_what_it_may_claim() {
        const O: Duration = Duration::from_secs(2);
        assert_eq!(survey_every(Place::Front, 0, true, T, O), T);
        assert_eq!(survey_every(Place::Rear, 0, true, T, O), SAFETY_SURVEY);
        assert_eq!(survey_every(Place::Rear, 1, true, T, O), SAFETY_SURVEY);
        assert_eq!(
            survey_every(Place::Rear, 2, true, T, O),
            T,
            "an overflowing holder looks for standbys every tick"
        );
        assert_eq!(
            survey_every(Place::Front, 1, true, T, O),
            T + O,
            "a holder of one slot may take another only `overflow_after` past its expiry"
        );
        assert_eq!(
            survey_every(Place::Front, 1, true, T, Duration::from_secs(60)),
            T * REAR_TICKS,
            "never rarer than the rear"
        );
    }

    #[test]
    fn the_rear_surveys_seldom_at_a_random_point() {
        let long = Duration::from_secs(100);
        assert_eq!(safety_survey_every(long), long * REAR_TICKS);
        let every = safety_survey_every(T);
        assert_eq!(rear_survey_in(every, 0.0), every / 2);
        assert_eq!(rear_survey_in(every, 0.5), every.mul_f64(0.75));
        assert!(rear_survey_in(every, 0.999_999) <= every);
        assert_eq!(rear_survey_in(every, 7.0), every, "clamped");
    }

    // === The one entry and its memory ===

    fn standing(place: Place, held: usize, now: Instant) -> Standing {
        Standing {
            place,
            held,
            tick: T,
            overflow_after: L,
            now,
            random: 0.0,
        }
    }

    fn looked<'a>(
        survey: &'a Survey,
        pace: Pace,
        timing: &'a LeaseTiming,
        none: &'a HashMap<String, Option<i64>>,
        now: Instant,
    ) -> Looked<'a> {
        Looked {
            me: "me",
            alive: &[],
            held: 0,
            max_slots: None,
            passed_over: none,
            survey,
            survey_took: Duration::from_millis(5),
            pace,
            woken: false,
            front: &[],
            my_score: None,
            contact: Duration::from_secs(3600),
            ready_to_give_back: true,
            step_hold: None,
            age: Duration::from_secs(3600),
            overflow_after: L,
            timing,
            now,
        }
    }

    #[test]
    fn a_survey_is_due_at_its_pace_and_at_once_when_woken() {
        let t0 = Instant::now();
        let mut memory = Memory::new(t0);
        let pace = memory.due(&standing(Place::Front, 0, t0), false).unwrap();
        assert_eq!(
            (pace.every, pace.horizon, pace.narrow),
            (2 * T, 2 * T, false),
            "a front standby of a small pool surveys wide, once per horizon"
        );
        assert_eq!(memory.next_survey(), t0 + 2 * T);
        let soon = t0 + Duration::from_millis(300);
        assert_eq!(
            memory.due(&standing(Place::Front, 0, soon), false),
            Err(Duration::from_millis(1700)),
            "not yet: the rest of the period"
        );
        assert!(
            memory.due(&standing(Place::Front, 0, soon), true).is_ok(),
            "woken"
        );
        assert_eq!(
            memory.next_survey(),
            soon + 2 * T,
            "the next period counts from there"
        );
    }

    #[test]
    fn at_the_rear_surveys_spread_over_the_second_half_of_the_safety_period() {
        let t0 = Instant::now();
        let mut memory = Memory::new(t0);
        memory.at_rear(&Standing {
            random: 0.0,
            ..standing(Place::Rear, 0, t0)
        });
        assert_eq!(memory.next_survey(), t0 + SAFETY_SURVEY / 2);
        memory.at_rear(&Standing {
            random: 0.999_999,
            ..standing(Place::Front, 0, t0)
        });
        let last = memory.next_survey() - t0;
        assert!(
            last <= SAFETY_SURVEY && last > SAFETY_SURVEY.mul_f64(0.99),
            "{last:?}"
        );
        memory.next_at(t0);
        assert!(
            memory.due(&standing(Place::Rear, 0, t0), false).is_ok(),
            "moved up: at once"
        );
    }

    #[test]
    fn a_wide_survey_that_read_too_many_slots_keeps_surveys_narrow_for_a_while() {
        let t0 = Instant::now();
        let timing = LeaseTiming::from_tick(T);
        let none = HashMap::new();
        let mut memory = Memory::new(t0);
        let wide = memory.due(&standing(Place::Front, 0, t0), false).unwrap();
        let big = Survey {
            read: WIDE_MOST + 1,
            ..Survey::default()
        };
        let (_, after) = decide(&looked(&big, wide, &timing, &none, t0), memory);
        let next = { after }
            .due(&standing(Place::Front, 0, t0 + T), true)
            .expect("due");
        assert!(
            next.narrow,
            "narrow after a wide survey read {} slots",
            WIDE_MOST + 1
        );
        assert_eq!(next.horizon, T);
        let mut later = after;
        let back = later
            .due(&standing(Place::Front, 0, t0 + NARROW_FOR), true)
            .expect("due");
        assert!(!back.narrow, "wide again once NARROW_FOR passed");
        let small = Survey {
            read: WIDE_MOST,
            ..Survey::default()
        };
        let (_, fine) = decide(&looked(&small, wide, &timing, &none, t0), memory);
        assert!(
            !{ fine }
                .due(&standing(Place::Front, 0, t0 + T), true)
                .unwrap()
                .narrow
        );
        let narrow_pace = Pace {
            horizon: T,
            narrow: true,
            ..wide
        };
        let (_, still) = decide(&looked(&big, narrow_pace, &timing, &none, t0), memory);
        assert!(
            !{ still }
                .due(&standing(Place::Front, 0, t0 + T), true)
                .unwrap()
                .narrow,
            "a narrow survey sets no deadline, however many it read"
        );
    }

    #[test]
    fn slots_seen_expiring_a_tick_before_still_count_at_the_next_survey() {
        let t0 = Instant::now();
        assert_eq!(expiring_together(None, 1, t0, T), 1, "nothing seen before");
        let before = Some((t0, 2));
        assert_eq!(
            expiring_together(before, 1, t0 + T, T),
            2,
            "two seen a tick ago"
        );
        assert_eq!(expiring_together(before, 3, t0 + T, T), 3);
        assert_eq!(
            expiring_together(before, 1, t0 + T + Duration::from_millis(1), T),
            1,
            "more than a tick ago: only this survey counts"
        );
        let timing = LeaseTiming::from_tick(T);
        let none = HashMap::new();
        let pace = Memory::new(t0)
            .due(&standing(Place::Front, 0, t0), false)
            .unwrap();
        let soon = Survey {
            expiring_soon: 2,
            ..Survey::default()
        };
        let (_, memory) = decide(&looked(&soon, pace, &timing, &none, t0), Memory::new(t0));
        assert_eq!(
            memory.expiring,
            Some((t0, 2)),
            "remembered for the next survey"
        );
        let one = Survey {
            expired: vec![orphan("s1", 10)],
            ..Survey::default()
        };
        let (decision, memory) = decide(&looked(&one, pace, &timing, &none, t0 + T), memory);
        assert!(
            matches!(decision, ClaimDecision::Claim { .. }),
            "{decision:?}"
        );
        assert_eq!(
            memory.expiring,
            Some((t0 + T, 1)),
            "this survey's own count"
        );
    }

    #[test]
    fn a_claimer_that_moved_up_to_the_front_surveys_at_the_fronts_pace() {
        let t0 = Instant::now();
        let mut memory = Memory::new(t0);
        // Decided at the rear: the next survey minutes away.
        memory.next_at(t0 + SAFETY_SURVEY);
        memory.at_front(&standing(Place::Front, 1, t0));
        assert_eq!(
            memory.next_survey(),
            t0 + T + L,
            "a front holder of one slot: every tick and overflow_after"
        );
        // Never later than it was.
        memory.next_at(t0 + T);
        memory.at_front(&standing(Place::Front, 1, t0));
        assert_eq!(memory.next_survey(), t0 + T);
    }
}
