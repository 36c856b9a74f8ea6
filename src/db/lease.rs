//! The slot lease protocol: survey, claim, renew, release, and the expiry predicate.
//!
//! Expiry is judged by the server on its own `$$NOW`, so no worker's clock matters:
//!
//! ```text
//! time == null  OR  toLong(time) < toLong($$NOW) - L          (L = 2 × tick)
//! ```
//!
//! in milliseconds, because the dev server mis-compares two dates inside `$expr`.
//! Claims and renewals also write `expires_ms`, so [`LeaseProtocol::survey`] can use an
//! index. The holder self-fences at `last renew sent + L - margin` on its monotonic
//! clock and comes back only by a fresh claim, which bumps the slot's `epoch` (the
//! fencing token robots' checkpoints carry).

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::options::ReturnDocument;
use mongodb::{Collection, IndexModel};
use tokio::time::Instant;

use crate::clock::SharedClock;
use crate::config::{Identity, LeaseTiming};
use crate::db::field::{
    DRAINING, EPOCH, EXPIRES_MS, EXPIRE_AT, HELD, IP, LEASE_MS, OWNER, PORT, RELEASED_AT, REV,
    ROOM, SUSPEND_MS, TIME,
};
use crate::db::store::{Store, StoreError};

/// Why a lease ended or an operation on it failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The renewal matched nothing: another worker claimed the slot (new epoch), an
    /// operator released it, or the slot was removed.
    #[error(
        "lost slot {slot} (epoch {epoch}): it is no longer held by this worker under this epoch"
    )]
    Lost { slot: String, epoch: i64 },
    /// No successful renewal before the local deadline; never renew this lease again.
    #[error("self-fenced on slot {slot} (epoch {epoch}): no successful renewal before the local deadline")]
    SelfFenced { slot: String, epoch: i64 },
    #[error("database error: {}", crate::db::store::brief(.0))]
    Db(#[from] mongodb::error::Error),
}

/// A claimed slot, held while renewals keep succeeding before [`Lease::deadline`].
#[derive(Debug, Clone)]
pub struct Lease {
    pub slot_id: String,
    pub epoch: i64,
    /// The slot's `rev` as of the last claim or renewal.
    pub rev: i64,
    deadline: Instant,
    last_renewed: Instant,
    fenced: bool,
}

impl Lease {
    /// The local monotonic instant past which this lease must be treated as lost.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// When the last successful claim or renewal was sent.
    pub fn last_renewed(&self) -> Instant {
        self.last_renewed
    }

    /// True once the lease self-fenced or was lost; it can never be renewed again.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }
}

/// One expired, non-draining slot as the server judged it at survey time.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub time: Option<bson::DateTime>,
    pub epoch: i64,
    /// How long it has been expired: since `time + L`, or since its release, or
    /// "long ago" for a slot never held.
    pub expired_for: Duration,
    /// The worker whose lease lapsed, when one did (none once released).
    pub owner: Option<String>,
}

/// The largest epoch a slot may carry: 2^53 − 1, exact as a double too, and beyond
/// any real use (a claim per millisecond for 285,000 years). A slot above it could
/// not be claimed (its epoch cannot be raised), so it is treated as invalid.
pub const MAX_EPOCH: i64 = (1 << 53) - 1;

/// `expired_for` of a slot never held and never released.
pub(crate) const LONG_AGO: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest lease a slot's `lease_ms` is believed to ask for (a hand-edited
/// value beyond it does not keep a slot from ever expiring).
const MAX_LEASE_MS: i64 = 3_600_000;

/// A slot document that could not be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InvalidSlot {
    pub id: String,
    pub why: String,
}

/// The standby's view of the slots, from one aggregation.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    /// Expired, non-draining slots, sorted by `_id`.
    pub expired: Vec<Candidate>,
    /// Server-side time until the earliest held lease seen expires (within the
    /// survey's horizon, see [`LeaseProtocol::survey`]).
    pub next_expiry: Option<Duration>,
    /// How many held leases seen expire within a tick.
    pub expiring_soon: usize,
    /// Hand-edited or otherwise broken slot documents, skipped.
    pub invalid: Vec<InvalidSlot>,
    /// How many documents the server returned (the survey's cost).
    pub read: usize,
    /// The server's clock (`$$NOW`, ms) as it judged these leases, when it returned
    /// any.
    pub server_ms: Option<i64>,
}

/// What a successful renewal learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    pub rev: i64,
    /// An operator asked for the slot back (`slotpool slots drain`).
    pub draining: bool,
    /// Commands the renewal took: 1, or 2 when the slot had changed (see
    /// [`LeaseProtocol::renew`]), so that a round trip can be judged per command.
    pub commands: u32,
}

/// What a claim attempt did.
#[derive(Debug, Default)]
pub struct ClaimOutcome {
    pub lease: Option<Lease>,
    /// Compare-and-set updates sent.
    pub attempts: u32,
    /// Of those, how many lost the race.
    pub conflicts: u32,
    /// Slots the database refused to let this claim change (a hand-edited document
    /// failing the validator): skipped, the other candidates still tried.
    pub refused: Vec<InvalidSlot>,
}

/// Runs the protocol for one worker identity.
#[derive(Debug, Clone)]
pub struct LeaseProtocol {
    /// The lease's own client (in a worker); its clones share one connection pool,
    /// replaced for all of them after an outage (see [`LeaseProtocol::reopen_after`]).
    store: Store,
    identity: Identity,
    owner: String,
    timing: LeaseTiming,
    clock: SharedClock,
    hashing: bool,
}

impl LeaseProtocol {
    /// The protocol on `store`'s client (the lease's own pool, in a worker).
    pub fn new(store: &Store, identity: Identity, timing: LeaseTiming, clock: SharedClock) -> Self {
        LeaseProtocol {
            store: store.clone(),
            owner: identity.to_string(),
            identity,
            timing,
            clock,
            hashing: true,
        }
    }

    /// Turns off the hash start point (every worker tries the first expired slot
    /// first). Only for benchmarks showing what hashing buys.
    pub fn without_hashing(mut self) -> Self {
        self.hashing = false;
        self
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    fn slots(&self) -> Collection<Document> {
        self.store.slots()
    }

    /// Replaces the lease's client when `outages` (the worker's count of outages
    /// begun) moved since it was made (see [`Store::reopen_after`]): a holder whose
    /// robots were just resumed must not send its next renewal on a connection that
    /// stayed open across the outage. Called at each resume; a second held slot
    /// resuming from the same outage finds the client already new.
    pub(crate) fn reopen_after(&self, outages: u64) {
        match self.store.reopen_after(outages) {
            Ok(true) => tracing::info!(
                "the database was out of reach since the lease's connections were opened: opening new ones"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("could not open a new client for the lease: {e}"),
        }
    }

    /// Which client the lease's requests go out on now (see [`Store::generation`]).
    pub(crate) fn client_generation(&self) -> u64 {
        self.store.generation()
    }

    /// A request sent on client generation `seen` was given up on: its place in the
    /// driver's queue would hold up the next request, so the next goes out on a new
    /// client, unless another part replaced it already (see
    /// [`Store::reopen_unless_replaced`]).
    pub(crate) fn reopen_after_giving_up(&self, seen: u64, outages: u64) {
        match self.store.reopen_unless_replaced(seen, outages) {
            Ok(true) => tracing::debug!(
                "a late renewal was given up on: the next goes out on a new client for the lease"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("could not open a new client for the lease: {e}"),
        }
    }

    pub fn timing(&self) -> LeaseTiming {
        self.timing
    }

    /// Lets the server say which non-draining slots are expired, for how long, and
    /// how long until the next one expires.
    ///
    /// With `until` (server-clock ms), only slots whose `expires_ms` is before it are
    /// read: one index range, O(expired); free and unmarked slots have `expires_ms` 0
    /// ([`LeaseProtocol::mark_unknown`]). Expiry is still judged on `$$NOW`, so a wrong
    /// `until` costs only a delay or a larger read. A slot's lease is the longer of this
    /// worker's `L` and its holder's `lease_ms`, so a short-tick worker never takes a
    /// slot before a long-tick holder's lease is over.
    pub async fn survey(&self, until: Option<i64>) -> Result<Survey, LeaseError> {
        let lease_ms = self.timing.lease_ms();
        let now = doc! {"$toLong": "$$NOW"};
        let mut matching = doc! {DRAINING: {"$ne": true}};
        if let Some(until) = until {
            matching.insert(EXPIRES_MS, doc! {"$lt": until});
        }
        let pipeline = vec![
            doc! {"$match": matching},
            doc! {"$sort": {"_id": 1}},
            doc! {"$project": {
                TIME: 1, EPOCH: 1, OWNER: 1,
                // The server's clock as it judged expiry: a worker checks it for a
                // forward step before it claims (see worker::clock_step).
                "now_ms": &now,
                "id_type": {"$type": "$_id"},
                "time_type": {"$type": "$time"},
                "epoch_type": {"$type": "$epoch"},
                "lease": {"$max": [lease_ms, {"$cond": [
                    {"$in": [{"$type": "$lease_ms"}, ["int", "long"]]},
                    {"$min": [{"$toLong": "$lease_ms"}, MAX_LEASE_MS]},
                    0_i64,
                ]}]},
                "released_ms": {"$cond": [
                    {"$eq": [{"$type": "$released_at"}, "date"]},
                    {"$subtract": [&now, {"$toLong": "$released_at"}]},
                    Bson::Null,
                ]},
            }},
            doc! {"$addFields": {
                "remaining_ms": {"$cond": [
                    {"$eq": ["$time_type", "date"]},
                    {"$subtract": [{"$add": [{"$toLong": "$time"}, "$lease"]}, &now]},
                    Bson::Null,
                ]},
            }},
        ];
        let mut cursor = self.slots().aggregate(pipeline).await?;
        let mut survey = Survey::default();
        while let Some(d) = cursor.try_next().await? {
            survey.read += 1;
            if survey.server_ms.is_none() {
                survey.server_ms = crate::db::store::int(&d, "now_ms");
            }
            match judge(&d) {
                Ok(Judged::Live { remaining }) => {
                    if remaining as u128 <= self.timing.tick.as_millis() {
                        survey.expiring_soon += 1;
                    }
                    let wait = Duration::from_millis(remaining as u64 + 1);
                    survey.next_expiry = Some(survey.next_expiry.map_or(wait, |w| w.min(wait)));
                }
                Ok(Judged::Expired(candidate)) => survey.expired.push(candidate),
                Err(bad) => survey.invalid.push(bad),
            }
        }
        Ok(survey)
    }

    /// Tries to claim one of the surveyed expired slots, starting at this worker's
    /// hash position and wrapping around once. Each try is a compare-and-set on the
    /// `time` and `epoch` seen by the survey: time only moves forward, so an unchanged
    /// slot is still expired, and a changed one means another worker won.
    pub async fn claim(&self, survey: &Survey) -> Result<ClaimOutcome, LeaseError> {
        self.claim_among(&survey.expired).await
    }

    /// [`LeaseProtocol::claim`] over a chosen subset of the surveyed expired slots
    /// (sorted by `_id`), e.g. those an overflowing holder may take.
    pub async fn claim_among(&self, expired: &[Candidate]) -> Result<ClaimOutcome, LeaseError> {
        let mut outcome = ClaimOutcome::default();
        let n = expired.len();
        if n == 0 {
            return Ok(outcome);
        }
        let start = if self.hashing {
            (stable_hash(&self.owner) % n as u64) as usize
        } else {
            0
        };
        for i in 0..n {
            let c = &expired[(start + i) % n];
            outcome.attempts += 1;
            match self.try_claim(c).await {
                Ok(Some(lease)) => {
                    outcome.lease = Some(lease);
                    return Ok(outcome);
                }
                Ok(None) => outcome.conflicts += 1,
                // One document the server will not change is that slot's problem,
                // not the database's: skip it and try the others.
                Err(LeaseError::Db(e)) if !crate::db::store::is_transient(&e) => {
                    outcome.refused.push(InvalidSlot {
                        id: c.id.clone(),
                        why: format!("the claim was refused: {}", crate::db::store::brief(&e)),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(outcome)
    }

    async fn try_claim(&self, c: &Candidate) -> Result<Option<Lease>, LeaseError> {
        let seen_time = c.time.map_or(Bson::Null, Bson::DateTime);
        let filter = doc! {"_id": &c.id, TIME: seen_time, EPOCH: c.epoch};
        let update = vec![doc! {"$set": {
            OWNER: &self.owner,
            IP: self.identity.ip.to_string(),
            PORT: self.identity.port as i32,
            TIME: "$$NOW",
            LEASE_MS: self.timing.lease_ms(),
            SUSPEND_MS: self.timing.suspend_for.as_millis() as i64,
            EXPIRES_MS: self.expires_ms(),
            EPOCH: {"$add": ["$epoch", 1_i64]},
        }}];
        let sent = self.clock.now();
        let claimed = self
            .slots()
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::After)
            .projection(doc! {EPOCH: 1, REV: 1})
            .await?;
        Ok(claimed.map(|d| Lease {
            slot_id: c.id.clone(),
            epoch: int64(&d, EPOCH).unwrap_or(c.epoch + 1),
            rev: int64(&d, REV).unwrap_or(0),
            deadline: sent + self.fence_window(),
            last_renewed: sent,
            fenced: false,
        }))
    }

    /// Whether some non-draining slot's `expires_ms` is before `by_ms` (server-clock
    /// milliseconds): a slot released (0), added (0), or whose lease ran out. One
    /// indexed read of at most one document, so the first standby can ask often:
    /// while every slot is held and renewed, the range is empty. A hit only says
    /// "survey now"; the survey judges, as always, on the server's `$$NOW`.
    pub async fn anything_free(&self, by_ms: i64) -> Result<bool, LeaseError> {
        let found = self
            .slots()
            .find_one(doc! {EXPIRES_MS: {"$lt": by_ms}, DRAINING: {"$ne": true}})
            .projection(doc! {"_id": 1})
            .await?;
        Ok(found.is_some())
    }

    /// Whether a slot is still leased under this worker's identity (owned by it,
    /// its lease not run out on the server's clock, by `expires_ms` or, for a slot
    /// an older version renewed, by `time` and the longer of this worker's lease and
    /// the slot's own `lease_ms`): whoever holds it may still renew it.
    /// Asked before a new process takes the identity over from another's heartbeat.
    pub async fn leased_under_identity(&self) -> Result<bool, LeaseError> {
        let now = doc! {"$toLong": "$$NOW"};
        let live = doc! {"$or": [
            {"$gt": [{"$ifNull": ["$expires_ms", 0_i64]}, &now]},
            {"$gt": [
                {"$toLong": {"$ifNull": ["$time", bson::DateTime::from_millis(0)]}},
                {"$subtract": [&now, {"$max": [
                    self.timing.lease_ms(), {"$ifNull": ["$lease_ms", 0_i64]},
                ]}]},
            ]},
        ]};
        let found = self
            .slots()
            .find_one(doc! {OWNER: &self.owner, "$expr": live})
            .projection(doc! {"_id": 1})
            .await?;
        Ok(found.is_some())
    }

    /// Gives every slot without an `expires_ms` (inserted by hand or by an older
    /// version, whose holders renew `time` only) the value 0, "unknown: read me", so
    /// the survey's index range sees it. A claim by this version sets the real value;
    /// an older holder's claims and renewals leave the 0 alone, and the survey judges
    /// its slot by `time`. Returns how many slots it marked.
    pub async fn mark_unknown(&self) -> Result<u64, LeaseError> {
        Ok(mark_unknown(&self.slots()).await?)
    }

    /// `$$NOW + L` in server-clock milliseconds, as an update-pipeline expression.
    fn expires_ms(&self) -> Document {
        doc! {"$add": [{"$toLong": "$$NOW"}, self.timing.lease_ms()]}
    }

    /// `L - margin`: how long after sending a successful renewal the lease stays good.
    fn fence_window(&self) -> Duration {
        self.timing.lease() - self.timing.margin
    }

    /// Proves ownership and epoch and moves `time` to the server's now. Returns the
    /// slot's `rev` and `draining`, so robot changes and drain requests are noticed
    /// without another query.
    ///
    /// Refuses without touching the database once the local deadline has passed. A
    /// renewal still in flight at the deadline is abandoned, and one whose reply comes
    /// after the deadline (a paused process) does not count: the robots were due to be
    /// stopped, so the lease is fenced anyway.
    pub async fn renew(&self, lease: &mut Lease) -> Result<Renewed, LeaseError> {
        self.renew_reporting(lease, None).await
    }

    /// [`LeaseProtocol::renew`], recording the slot's measured cost with it when
    /// given (see [`crate::db::load::cost_set`]): the renewal is a write the holder
    /// sends anyway, so the cost costs no request.
    pub(crate) async fn renew_reporting(
        &self,
        lease: &mut Lease,
        cost: Option<&crate::load::SlotCost>,
    ) -> Result<Renewed, LeaseError> {
        let fenced = |lease: &mut Lease| {
            lease.fenced = true;
            LeaseError::SelfFenced {
                slot: lease.slot_id.clone(),
                epoch: lease.epoch,
            }
        };
        let sent = self.clock.now();
        if lease.fenced || sent >= lease.deadline {
            return Err(fenced(lease));
        }
        let request = self.renew_once(lease.slot_id.clone(), lease.epoch, lease.rev, cost);
        let reply = tokio::time::timeout(lease.deadline - sent, request).await;
        if self.clock.now() >= lease.deadline {
            return Err(fenced(lease));
        }
        match reply {
            Err(_elapsed) => Err(fenced(lease)),
            Ok(Err(e)) => Err(LeaseError::Db(e)),
            Ok(Ok(None)) => {
                lease.fenced = true;
                Err(LeaseError::Lost {
                    slot: lease.slot_id.clone(),
                    epoch: lease.epoch,
                })
            }
            Ok(Ok(Some(renewed))) => {
                lease.deadline = sent + self.fence_window();
                lease.last_renewed = sent;
                lease.rev = renewed.rev;
                Ok(renewed)
            }
        }
    }

    /// A renewal sent after the local deadline passed, while the holder's robots are
    /// suspended (see `worker::held_slot`): the same `{_id, owner, epoch}` match as
    /// [`LeaseProtocol::renew`], and it proves the same: no one claimed the slot
    /// since this holder's last renewal, since every claim raises the epoch. It
    /// needs no unexpired lease on the server. Its answer goes to
    /// [`LeaseProtocol::settle_late`].
    pub fn late_renewal(
        &self,
        lease: &Lease,
    ) -> impl std::future::Future<Output = Result<Option<Renewed>, mongodb::error::Error>> + Send + '_
    {
        self.renew_once(lease.slot_id.clone(), lease.epoch, lease.rev, None)
    }

    /// What the answer to a [`LeaseProtocol::late_renewal`] sent at `sent` means.
    /// Matched, the lease is live again with a deadline counted from the sending,
    /// as after any renewal; an answer slower than `L - margin` gives a deadline
    /// already past, so it counts as none ([`LeaseError::Db`]: renew late again).
    pub fn settle_late(
        &self,
        lease: &mut Lease,
        sent: Instant,
        reply: Result<Option<Renewed>, mongodb::error::Error>,
    ) -> Result<Renewed, LeaseError> {
        match reply {
            Err(e) => Err(LeaseError::Db(e)),
            Ok(None) => {
                lease.fenced = true;
                Err(LeaseError::Lost {
                    slot: lease.slot_id.clone(),
                    epoch: lease.epoch,
                })
            }
            Ok(Some(_)) if self.clock.now() >= sent + self.fence_window() => {
                Err(LeaseError::Db(mongodb::error::Error::custom(format!(
                    "a late renewal matched, but its answer took longer than {} ms",
                    self.fence_window().as_millis()
                ))))
            }
            Ok(Some(renewed)) => {
                lease.fenced = false;
                lease.deadline = sent + self.fence_window();
                lease.last_renewed = sent;
                lease.rev = renewed.rev;
                Ok(renewed)
            }
        }
    }

    /// One renewal. Usually a single `update` whose filter also says "nothing changed
    /// since the last renewal" (same `rev`, not draining). Only when that matches
    /// nothing (the slot's robots changed, a drain was asked for, or the slot is no
    /// longer ours) does a `findAndModify` renew and read `rev` and `draining`. None:
    /// the slot is not ours.
    ///
    /// Why not `findAndModify` every tick: the dev server answers it with a collection
    /// scan, where the update uses the index.
    async fn renew_once(
        &self,
        slot: String,
        epoch: i64,
        rev: i64,
        cost: Option<&crate::load::SlotCost>,
    ) -> Result<Option<Renewed>, mongodb::error::Error> {
        let ours = doc! {"_id": &slot, OWNER: &self.owner, EPOCH: epoch};
        let mut set = doc! {TIME: "$$NOW", EXPIRES_MS: self.expires_ms()};
        if let Some(c) = cost {
            set.insert(crate::db::field::COST, crate::db::load::cost_set(c));
        }
        let renew = vec![doc! {"$set": set}];
        let mut unchanged = ours.clone();
        unchanged.insert(REV, rev);
        unchanged.insert(DRAINING, doc! {"$ne": true});
        let r = self.slots().update_one(unchanged, renew.clone()).await?;
        if r.matched_count == 1 {
            return Ok(Some(Renewed {
                rev,
                draining: false,
                commands: 1,
            }));
        }
        let d = self
            .slots()
            .find_one_and_update(ours, renew)
            .return_document(ReturnDocument::After)
            .projection(doc! {REV: 1, DRAINING: 1})
            .await?;
        Ok(d.map(|d| Renewed {
            rev: int64(&d, REV).unwrap_or(rev),
            draining: matches!(d.get(DRAINING), Some(Bson::Boolean(true))),
            commands: 2,
        }))
    }

    /// Gives the slot back (owner and time to null) so a standby can take it at once;
    /// `released_at` (server clock) is when overflowing holders start counting.
    /// Returns false when it was no longer ours. Call only after the robots stopped.
    pub async fn release(&self, lease: &mut Lease) -> Result<bool, LeaseError> {
        lease.fenced = true;
        let result = self
            .slots()
            .update_one(
                doc! {"_id": &lease.slot_id, OWNER: &self.owner, EPOCH: lease.epoch},
                doc! {
                    "$set": {OWNER: Bson::Null, TIME: Bson::Null, EXPIRES_MS: 0_i64},
                    "$currentDate": {RELEASED_AT: true},
                },
            )
            .await?;
        Ok(result.matched_count == 1)
    }
}

/// See [`LeaseProtocol::mark_unknown`]; `init` and a worker's start run it too.
pub(crate) async fn mark_unknown(
    slots: &Collection<Document>,
) -> Result<u64, mongodb::error::Error> {
    let r = slots
        .update_many(
            doc! {EXPIRES_MS: Bson::Null},
            doc! {"$set": {EXPIRES_MS: 0_i64}},
        )
        .await?;
    Ok(r.modified_count)
}

/// A surveyed slot, judged.
#[derive(Debug, PartialEq)]
enum Judged {
    /// Held: its lease has `remaining` ms to run.
    Live {
        remaining: i64,
    },
    Expired(Candidate),
}

/// Checks a surveyed document and says whether it is live or claimable.
fn judge(d: &Document) -> Result<Judged, InvalidSlot> {
    let id = match d.get("_id") {
        Some(Bson::String(s)) => s.clone(),
        Some(other) => {
            return Err(InvalidSlot {
                id: other.to_string(),
                why: "_id is not a string".into(),
            })
        }
        None => unreachable!("every document has an _id"),
    };
    let bad = |why: String| InvalidSlot {
        id: id.clone(),
        why,
    };
    let epoch = match d.get(EPOCH) {
        Some(Bson::Int64(e)) if (0..=MAX_EPOCH).contains(e) => *e,
        Some(Bson::Int32(e)) if *e >= 0 => *e as i64,
        Some(Bson::Int64(e)) if *e > MAX_EPOCH => {
            return Err(bad(format!(
                "epoch {e} is too large to be raised by a claim (at most {MAX_EPOCH}); set it back by hand, e.g. db.slots.updateOne({{_id: \"{id}\"}}, {{$set: {{epoch: NumberLong(1)}}}})"
            )))
        }
        Some(other) => {
            return Err(bad(format!(
                "epoch must be a non-negative Int64, found {other}"
            )))
        }
        None => return Err(bad("epoch is missing".into())),
    };
    let time = match d.get(TIME) {
        Some(Bson::DateTime(t)) => Some(*t),
        Some(Bson::Null) | None => None,
        Some(other) => return Err(bad(format!("time must be a date or null, found {other}"))),
    };
    if let Some(remaining) = int64(d, "remaining_ms").filter(|r| *r >= 0) {
        return Ok(Judged::Live { remaining });
    }
    let expired_for = match (int64(d, "remaining_ms"), int64(d, "released_ms")) {
        (Some(r), _) => Duration::from_millis(r.unsigned_abs()),
        (None, Some(ms)) => Duration::from_millis(ms.max(0) as u64),
        (None, None) => LONG_AGO,
    };
    Ok(Judged::Expired(Candidate {
        id,
        time,
        epoch,
        expired_for,
        owner: time.and_then(|_| d.get_str(OWNER).ok()).map(str::to_string),
    }))
}

fn int64(d: &Document, key: &str) -> Option<i64> {
    match d.get(key) {
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Int32(v)) => Some(*v as i64),
        _ => None,
    }
}

/// 64-bit FNV-1a: the same on every platform and build, unlike `std`'s `Hasher`s.
pub(crate) fn stable_hash(s: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    s.bytes()
        .fold(OFFSET, |h, b| (h ^ b as u64).wrapping_mul(PRIME))
}

/// The indexes the survey and the line read through: slots by when their lease
/// runs out (the survey reads only the expired ones), workers by their place in
/// the line. Workers create them at start too, for pools made by an older init.
/// Slots from before `expires_ms` get 0 ("unknown: read me"; see
/// [`crate::db::lease::LeaseProtocol::mark_unknown`]).
pub(crate) async fn ensure_indexes(store: &Store) -> Result<(), StoreError> {
    mark_unknown(&store.slots()).await?;
    store
        .slots()
        .create_index(IndexModel::builder().keys(doc! {EXPIRES_MS: 1}).build())
        .await?;
    store
        .workers()
        .create_index(
            IndexModel::builder()
                .keys(doc! {ROOM: 1, HELD: 1, "_id": 1})
                .build(),
        )
        .await?;
    // Documents that leave by themselves at their `expire_at`: dead workers'
    // heartbeats, and deleted robots' output tombstones.
    let at_expiry = IndexOptions::builder()
        .expire_after(Duration::from_secs(0))
        .build();
    for coll in [store.workers(), store.outputs()] {
        coll.create_index(
            IndexModel::builder()
                .keys(doc! {EXPIRE_AT: 1})
                .options(at_expiry.clone())
                .build(),
        )
        .await?;
    }
    Ok(())
}

/// The epochs of those of `slots` that exist, by slot.
pub(crate) async fn epochs(
    store: &crate::db::store::Store,
    slots: &[String],
) -> Result<std::collections::HashMap<String, i64>, mongodb::error::Error> {
    let mut cursor = store
        .slots()
        .find(doc! {"_id": {"$in": slots}})
        .projection(doc! {EPOCH: 1})
        .await?;
    let mut out = std::collections::HashMap::new();
    while let Some(d) = cursor.try_next().await? {
        if let (Ok(id), Some(e)) = (d.get_str("_id"), crate::db::store::int(&d, EPOCH)) {
            out.insert(id.to_string(), e);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(stable_hash(""), 0xcbf29ce484222325);
        assert_eq!(stable_hash("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(stable_hash("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn judge_tells_live_from_expired_and_for_how_long() {
        let live = doc! {"_id": "s", "epoch": 3_i64, "owner": "w:1", "remaining_ms": 5_i64};
        assert_eq!(judge(&live).unwrap(), Judged::Live { remaining: 5 });
        let lapsed = doc! {"_id": "s", "epoch": 3_i64, "remaining_ms": -1500_i64};
        let Judged::Expired(c) = judge(&lapsed).unwrap() else {
            panic!("expired")
        };
        assert_eq!(c.expired_for, Duration::from_millis(1500));
        let released =
            doc! {"_id": "s", "epoch": 3_i64, "time": Bson::Null, "released_ms": 700_i64};
        let Judged::Expired(c) = judge(&released).unwrap() else {
            panic!("expired")
        };
        assert_eq!(c.expired_for, Duration::from_millis(700));
        let never = doc! {"_id": "s", "epoch": 0_i64, "time": Bson::Null};
        let Judged::Expired(c) = judge(&never).unwrap() else {
            panic!("expired")
        };
        assert_eq!(c.expired_for, LONG_AGO);
    }

    #[test]
    fn judge_rejects_nonsense() {
        let ok = doc! {"_id": "slot-001", "epoch": 3_i64, "time": Bson::Null};
        assert!(matches!(judge(&ok).unwrap(), Judged::Expired(c) if c.epoch == 3));
        let bad_epoch = doc! {"_id": "slot-001", "epoch": "three"};
        assert!(judge(&bad_epoch).unwrap_err().why.contains("epoch"));
        let bad_time = doc! {"_id": "slot-001", "epoch": 1_i64, "time": "yesterday"};
        assert!(judge(&bad_time).unwrap_err().why.contains("time"));
        let bad_id = doc! {"_id": 7, "epoch": 1_i64};
        assert!(judge(&bad_id).is_err());
        let huge = doc! {"_id": "s", "epoch": i64::MAX, "time": Bson::Null};
        assert!(judge(&huge).unwrap_err().why.contains("too large"));
        let last = doc! {"_id": "s", "epoch": MAX_EPOCH, "time": Bson::Null};
        assert!(judge(&last).is_ok());
    }
}
