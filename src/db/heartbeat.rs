//! Heartbeats in `workers`: how one is written, whether the worker that wrote it is
//! alive (judged on the server's clock), and the queries the standby line reads
//! through [`Roster`]: a worker's place, the live workers, the first standbys. The
//! standby line and the pool's view (the CLI and the dashboard) read them by the
//! same rule.

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::Collection;
use tokio::time::Instant;

use crate::clock::ServerClock;
use crate::db::field::{
    ALIVE_UNTIL_MS, BEAT_MS, EPOCH, EXPIRE_AT, HELD, INSTANCE, LAST_SEEN, LOAD, MAX_SLOTS, NETNS,
    ROOM, SETTLES_AT_MS, SLOTS, SLOT_ID, TICK_MS, VERSION,
};
use crate::db::store::{int, Store};
use crate::db::words::words;

/// A field as an aggregation expression reads it: `$name`.
fn field(name: &str) -> String {
    format!("${name}")
}

words! {
    /// A live worker's role (judged by [`crate::pool::view::worker_role`]).
    WorkerRole {
        Holder => "holder",
        Standby => "standby",
        /// Holds nothing and missed a heartbeat, or said it held a slot it lost.
        Overdue => "overdue",
    }
}

/// A worker that holds nothing yet.
impl Default for WorkerRole {
    fn default() -> Self {
        WorkerRole::Standby
    }
}

/// Heartbeats at the front of the line are this many ticks apart (further back,
/// see `worker::standby_line::beat_pace`), and so are a holder's surveys at a
/// tick so long that the rear's safety survey would come sooner.
pub(crate) const REAR_TICKS: u32 = 5;

/// Whether a `workers` document read through [`liveness`] is alive: its own
/// `alive_ms` (time left on its heartbeat, on the server's clock) when it wrote
/// one, else (a worker of an older version) two of its ticks and a second since it
/// was last seen.
pub(crate) fn is_alive(d: &Document) -> bool {
    if let Some(left) = int(d, "alive_ms") {
        return left > 0;
    }
    let tick = int(d, TICK_MS).unwrap_or(1000).clamp(1, 3_600_000);
    int(d, "seen_ms").is_some_and(|s| s <= 2 * tick + 1000)
}

/// Aggregation stages that add `seen_ms` and `alive_ms` to each heartbeat, on the
/// server's clock, for [`is_alive`].
pub(crate) fn liveness() -> Vec<Document> {
    let now = doc! {"$toLong": "$$NOW"};
    vec![
        doc! {"$match": {LAST_SEEN: {"$type": "date"}}},
        doc! {"$addFields": {
            "seen_ms": {"$subtract": [&now, {"$toLong": field(LAST_SEEN)}]},
            "alive_ms": {"$cond": [
                {"$in": [{"$type": field(ALIVE_UNTIL_MS)}, ["int", "long"]]},
                {"$subtract": [field(ALIVE_UNTIL_MS), &now]},
                Bson::Null,
            ]},
        }},
    ]
}

/// Every worker whose heartbeat still counts ([`is_alive`]), by id, as read
/// through [`liveness`].
pub(crate) async fn live_workers(
    store: &crate::db::store::Store,
) -> Result<Vec<Document>, mongodb::error::Error> {
    let mut pipeline = liveness();
    pipeline.push(doc! {"$sort": {"_id": 1}});
    let mut cursor = store.workers().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        if is_alive(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// The other process's heartbeat under this worker's identity, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Predecessor {
    /// Its process's random id.
    pub(crate) instance: String,
    /// Until when it is believed (server-clock ms): rewritten by each of its beats.
    pub(crate) alive_until_ms: i64,
    /// The network namespace it beat from, when it said (see [`crate::worker::identity::network_namespace`]).
    pub(crate) netns: Option<String>,
}

/// How many live standbys beyond `--watchers` a place read keeps in sight (see
/// [`Placed::near`]): up to this many of those just ahead may die before a rear
/// standby's next place read has to read the whole line ahead of it again.
pub(crate) const NEAR_SPARE: u64 = 2;

/// What one read of a worker's place in the line found.
#[derive(Debug, Default)]
pub(crate) struct Placed {
    /// Live workers with room ahead of this one, counted up to `--watchers` +
    /// [`NEAR_SPARE`] (only whether they are `--watchers` or more decides anything).
    pub(crate) ahead: u64,
    /// For a standby: the id of the farthest of the nearest live standbys ahead of it
    /// that the read counted; its next place read starts there.
    pub(crate) near: Option<String>,
    /// The server's clock as of the read.
    pub(crate) clock: Option<ServerClock>,
    /// Whether it read the whole line ahead, not only from [`Placed::near`] on.
    pub(crate) whole: bool,
    /// A standby's whole read: the front of the line (the first `--watchers`
    /// standbys by id), each with its load score when its heartbeat has one.
    pub(crate) front: Option<Vec<(String, Option<f64>)>>,
}

/// The aggregation that reads a worker's place in the line: the live workers with
/// room ahead of `me` (see [`Roster::place`]), for a standby nearest first, at most `watchers` +
/// [`NEAR_SPARE`] of them, counted, with the farthest of them and the server's clock.
/// For a standby, `from` bounds the read to the standbys from that id on: the same
/// filter with one more condition, so it counts a subset of what the whole read
/// would, and stays cheap however long the line is.
pub(crate) fn place_pipeline(
    me: &str,
    held: usize,
    watchers: u64,
    from: Option<&str>,
) -> Vec<Document> {
    let alive = doc! {"$gt": [{"$ifNull": [field(ALIVE_UNTIL_MS), 0_i64]}, {"$toLong": "$$NOW"}]};
    let filter = match (held, from) {
        (0, None) => doc! {ROOM: true, HELD: 0_i64},
        (0, Some(from)) => doc! {ROOM: true, HELD: 0_i64, "_id": {"$gte": from, "$lt": me}},
        _ => doc! {ROOM: true, HELD: {"$lt": held as i64}},
    };
    // Liveness in a stage of its own: the dev server scans the whole collection for
    // a `$match` with a top-level `$expr`, so the line's index serves the rest.
    let mut pipeline = vec![doc! {"$match": filter}, doc! {"$match": {"$expr": alive}}];
    let mut ahead: Vec<Document> = Vec::new();
    // A standby's nearest are those with the largest ids below its own: the line's
    // index gives them in that order. A holder needs no nearest (its filter ranges
    // over `held`, where the index could not give that order).
    if held == 0 {
        if from.is_none() {
            ahead.push(doc! {"$match": {"_id": {"$lt": me}}});
        }
        ahead.push(doc! {"$sort": {"_id": -1}});
    }
    ahead.extend([
        doc! {"$limit": (watchers.max(1) + NEAR_SPARE) as i64},
        doc! {"$group": {"_id": Bson::Null, "n": {"$sum": 1_i64}, "near": {"$min": "$_id"}}},
    ]);
    // A standby's whole read also names the front (the first `watchers` standbys)
    // with their load scores: the idlest of them claims first (see
    // `claim_policy::Round::claim_delay`).
    let facet = if held == 0 && from.is_none() {
        let front = vec![
            doc! {"$sort": {"_id": 1}},
            doc! {"$limit": watchers.max(1) as i64},
            doc! {"$project": {"_id": 1, LOAD: 1}},
        ];
        doc! {"ahead": ahead, "front": front}
    } else {
        doc! {"ahead": ahead}
    };
    pipeline.extend([
        doc! {"$facet": facet},
        doc! {"$project": {"ahead": 1, "front": 1, "now": {"$toLong": "$$NOW"}}},
    ]);
    pipeline
}

/// How long after its last beat a worker's heartbeat document is removed (by the
/// TTL index on `expire_at`): ten minutes, or three times as long as a beat is
/// believed when that is longer, so a live worker's document never goes. A killed
/// worker shows as overdue meanwhile, then leaves; churn no longer piles up.
pub(crate) fn forgotten_after(beat: Duration) -> Duration {
    (believed_for(beat) * 3).max(Duration::from_secs(600))
}

/// How long a heartbeat is believed: two beats and a second, so one lost or late
/// heartbeat never makes a live worker look dead.
pub(crate) fn believed_for(beat: Duration) -> Duration {
    beat * 2 + Duration::from_secs(1)
}

/// One worker's heartbeat, as written to `workers`.
#[derive(Debug, Clone)]
pub(crate) struct Beat<'a> {
    pub(crate) me: &'a str,
    /// This process's own random id: two processes advertising the same `ip:port`
    /// (a copied `SLOTPOOL_ADVERTISE`, host networking) are told apart by it.
    pub(crate) instance: &'a str,
    /// The network namespace it beats from (see
    /// [`crate::worker::identity::network_namespace`]).
    pub(crate) netns: Option<&'a str>,
    /// `(slot, epoch)` of every slot held.
    pub(crate) held: &'a [(String, i64)],
    pub(crate) max_slots: Option<usize>,
    pub(crate) tick: Duration,
    /// How soon the next heartbeat comes (see [`beat_pace`](crate::worker::standby_line::beat_pace)): the heartbeat is
    /// believed for [`believed_for`] this.
    pub(crate) pace: Duration,
    /// How long after this beat the worker still leaves slots vacant since before
    /// it began (its first-lease hold): zero once settled.
    pub(crate) settles_in: Duration,
    /// Its load as last measured (none before the first measurement).
    pub(crate) load: Option<crate::load::Load>,
}

/// A live worker as its heartbeat says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LiveWorker {
    pub(crate) id: String,
    pub(crate) max_slots: Option<usize>,
    /// Slots it held at its last heartbeat.
    pub(crate) held: usize,
    /// When that heartbeat was written (server-clock ms): a worker that beat again
    /// since is alive, not merely still believed.
    pub(crate) seen_at_ms: Option<i64>,
    /// How long ago (server-clock ms) its first-lease hold ended, negative while it
    /// lasts; None from a worker whose heartbeat does not say.
    pub(crate) settled_ms: Option<i64>,
    /// Its load score, when its heartbeat has one.
    pub(crate) score: Option<f64>,
}

/// Why a heartbeat was not written.
#[derive(Debug, thiserror::Error)]
pub enum BeatError {
    /// Another process beats under this worker's `ip:port`, and its heartbeat is
    /// still believed: the two would share one identity in the line, in hand-backs
    /// and on the dashboard.
    #[error(
        "another live worker process advertises {id} (its heartbeat has {left_ms} ms left): \
         give every worker its own --advertise address (SLOTPOOL_ADVERTISE)"
    )]
    IdentityInUse {
        id: String,
        left_ms: i64,
        /// The other process's heartbeat as read, when it names its process.
        predecessor: Option<Predecessor>,
    },
    #[error(transparent)]
    Db(#[from] mongodb::error::Error),
}

/// The heartbeat's filter: this worker's document, unless another process's
/// heartbeat there is still believed. A document without an instance (an older
/// version) or whose time ran out (a predecessor that was killed) is taken over.
///
/// Never an upsert's filter: mongod refuses `$expr` in the query of an upsert in
/// every version (code 224, see docs/mongodb.md). Where it matches nothing,
/// [`Roster::beat`] inserts a [`placeholder`] and beats again.
fn own_heartbeat(me: &str, instance: &str) -> Document {
    doc! {"_id": me, "$expr": {"$or": [
        {"$eq": [{"$ifNull": [field(INSTANCE), instance]}, instance]},
        {"$lte": [{"$ifNull": [field(ALIVE_UNTIL_MS), 0_i64]}, {"$toLong": "$$NOW"}]},
    ]}}
}

/// A worker's first `workers` document, inserted only where it has none: its `_id`
/// and its process, believed by nobody (`alive_until_ms` 0, outside the line), so
/// that [`own_heartbeat`] then matches it. The insert collides with any document
/// already there: that duplicate key is how a second live process learns of the
/// first. Its clock fields are this machine's (an insert cannot read `$$NOW`); the
/// heartbeat that follows at once stamps the server's. One left behind by a crash
/// between the two is removed by the TTL index, or taken over by the next start.
fn placeholder(beat: &Beat<'_>, now: bson::DateTime) -> Document {
    let forgotten = forgotten_after(beat.pace).as_millis() as i64;
    doc! {
        "_id": beat.me, INSTANCE: beat.instance,
        LAST_SEEN: now, ALIVE_UNTIL_MS: 0_i64,
        EXPIRE_AT: bson::DateTime::from_millis(now.timestamp_millis().saturating_add(forgotten)),
    }
}

/// The heartbeat itself: who holds what, how long it is believed, and when its
/// document is forgotten, stamped with the server's `$$NOW`.
fn heartbeat_update(beat: &Beat<'_>) -> Vec<Document> {
    let ids: Vec<&String> = beat.held.iter().map(|(s, _)| s).collect();
    let (slot, epoch) = match beat.held.first() {
        Some((s, e)) => (Bson::String(s.clone()), Bson::Int64(*e)),
        None => (Bson::Null, Bson::Null),
    };
    let max = beat.max_slots.map_or(Bson::Null, |m| Bson::Int64(m as i64));
    let every = beat.pace;
    let netns = beat
        .netns
        .map_or(Bson::Null, |n| Bson::String(n.to_string()));
    vec![doc! {"$set": {
        INSTANCE: beat.instance, NETNS: {"$literal": netns},
        SLOT_ID: slot, EPOCH: epoch, SLOTS: {"$literal": ids},
        HELD: beat.held.len() as i64, ROOM: beat.room(),
        MAX_SLOTS: max, LAST_SEEN: "$$NOW",
        TICK_MS: beat.tick.as_millis() as i64,
        BEAT_MS: every.as_millis() as i64,
        ALIVE_UNTIL_MS: {"$add": [
            {"$toLong": "$$NOW"}, believed_for(every).as_millis() as i64,
        ]},
        SETTLES_AT_MS: {"$add": [{"$toLong": "$$NOW"}, beat.settles_in.as_millis() as i64]},
        EXPIRE_AT: {"$add": ["$$NOW", forgotten_after(every).as_millis() as i64]},
        VERSION: env!("CARGO_PKG_VERSION"),
        LOAD: {"$literal": beat.load.as_ref().map_or(Bson::Null, |l| Bson::Document(crate::db::load::load_doc(l)))},
    }}]
}

/// The roster: the `workers` collection, where every worker beats and the line is
/// read from. It keeps the lease's store, not a collection taken from it once, so a
/// client replaced after an outage (see [`Store::reopen_after`]) serves it too.
#[derive(Debug, Clone)]
pub(crate) struct Roster {
    store: Store,
}

impl Beat<'_> {
    /// Below `--max-slots` (or uncapped): stands in the line.
    pub(crate) fn room(&self) -> bool {
        self.max_slots.is_none_or(|m| self.held.len() < m)
    }
}

impl Roster {
    pub(crate) fn new(store: &Store) -> Self {
        Roster {
            store: store.clone(),
        }
    }

    fn workers(&self) -> Collection<Document> {
        self.store.workers()
    }

    /// Writes this worker's heartbeat and, when `read_clock`, returns the server's
    /// clock as of it; refuses with [`BeatError::IdentityInUse`] while another
    /// process's heartbeat under the same `ip:port` is believed.
    ///
    /// An `updateOne` and a `hello` (whose `localTime` is the clock `$$NOW` reads)
    /// rather than one `findAndModify`: the dev server answers `findAndModify` by
    /// scanning the collection, and the two cost it less than half as much. The
    /// `hello` only when asked: see
    /// [`CLOCK_REFRESH`](crate::worker::standby_line::CLOCK_REFRESH).
    pub(crate) async fn beat(
        &self,
        beat: &Beat<'_>,
        read_clock: bool,
    ) -> Result<Option<ServerClock>, BeatError> {
        if !self.beat_own(beat).await? {
            // No document of this worker's yet, or another live process's.
            let first = placeholder(beat, bson::DateTime::now());
            match self.workers().insert_one(first).await {
                Ok(_) => {}
                Err(e) if crate::db::store::is_duplicate_key(&e) => {}
                Err(e) => return Err(e.into()),
            }
            // Ours now, unless another process's heartbeat is believed there (or
            // a predecessor's ran out between the two reads: then it is taken).
            if !self.beat_own(beat).await? {
                return Err(self.in_use(beat.me).await);
            }
        }
        if !read_clock {
            return Ok(None);
        }
        let sent = Instant::now();
        let db = self.store.db();
        let hello = db.run_command(doc! {"hello": 1}).await?;
        let server_ms = hello
            .get_datetime("localTime")
            .map_or(0, |t| t.timestamp_millis());
        Ok(Some(ServerClock::observed(server_ms, sent, Instant::now())))
    }

    /// Writes the heartbeat over this worker's own document ([`own_heartbeat`]);
    /// false when there is none to write over.
    async fn beat_own(&self, beat: &Beat<'_>) -> Result<bool, mongodb::error::Error> {
        let written = self
            .workers()
            .update_one(
                own_heartbeat(beat.me, beat.instance),
                heartbeat_update(beat),
            )
            .await?;
        Ok(written.matched_count == 1)
    }

    /// Replaces another process's heartbeat under this worker's identity with this
    /// one's, only while it is exactly as read (same process, not beaten since): a
    /// predecessor judged gone (see [`crate::worker::identity`]) that beat after all
    /// keeps its identity. True when it was replaced.
    pub(crate) async fn take_over(
        &self,
        beat: &Beat<'_>,
        predecessor: &Predecessor,
    ) -> Result<bool, mongodb::error::Error> {
        let as_read = doc! {
            "_id": beat.me, INSTANCE: &predecessor.instance,
            ALIVE_UNTIL_MS: predecessor.alive_until_ms,
        };
        let r = self
            .workers()
            .update_one(as_read, heartbeat_update(beat))
            .await?;
        Ok(r.matched_count == 1)
    }

    /// How many live workers with room stand ahead of this one (counted up to
    /// `watchers` + [`NEAR_SPARE`]), and the server's clock as of the read. For a
    /// standby: the standbys with a smaller id. For a holder: the workers holding fewer
    /// slots; holders holding as many do not count, so each keeps looking every tick
    /// and [`crate::worker::claim_policy`]'s delays decide which overflows first.
    ///
    /// With `near` ([`Placed::near`]) only the standbys from there are read, and the
    /// whole line only when too few of those are alive ([`place_pipeline`]). The
    /// answer carries `$$NOW`, so a rear worker needs no `hello` of its own.
    pub(crate) async fn place(
        &self,
        me: &str,
        held: usize,
        watchers: u64,
        near: Option<&str>,
    ) -> Result<Placed, mongodb::error::Error> {
        if held == 0 {
            if let Some(from) = near {
                let placed = self
                    .read_place(place_pipeline(me, held, watchers, Some(from)))
                    .await?;
                if placed.ahead >= watchers.max(1) {
                    return Ok(placed);
                }
            }
        }
        let placed = self.read_place(place_pipeline(me, held, watchers, None));
        Ok(Placed {
            whole: true,
            ..placed.await?
        })
    }

    /// Runs one place read (see [`place_pipeline`]).
    async fn read_place(&self, pipeline: Vec<Document>) -> Result<Placed, mongodb::error::Error> {
        let sent = Instant::now();
        let mut cursor = self.workers().aggregate(pipeline).await?;
        let answer = cursor.try_next().await?;
        let received = Instant::now();
        let Some(d) = answer else {
            return Ok(Placed::default());
        };
        let found = d
            .get_array("ahead")
            .ok()
            .and_then(|a| a.first())
            .and_then(Bson::as_document);
        let ahead = found.and_then(|c| int(c, "n")).unwrap_or(0).max(0) as u64;
        let near = found
            .and_then(|c| c.get_str("near").ok())
            .map(str::to_string);
        let clock = int(&d, "now").map(|ms| ServerClock::observed(ms, sent, received));
        let front = d.get_array("front").ok().map(|f| {
            f.iter()
                .filter_map(Bson::as_document)
                .filter_map(|w| {
                    // Read as every other reader of a heartbeat's load reads it.
                    let score = crate::db::load::load_of(w).map(|l| l.score());
                    Some((w.get_str("_id").ok()?.to_string(), score))
                })
                .collect()
        });
        Ok(Placed {
            ahead,
            near,
            clock,
            whole: false,
            front,
        })
    }

    /// The first live workers in line other than `me`, at most `n`, as the line
    /// orders them (standbys first by id, then holders with room by how many slots
    /// they hold): their addresses as their heartbeats give them, for pokes (see
    /// [`crate::worker::poke`]). `standbys_only` stops at the standbys. Judged on the
    /// server's clock; read through the line's index on `(room, held, _id)`.
    pub(crate) async fn first_in_line(
        &self,
        me: &str,
        n: u64,
        standbys_only: bool,
    ) -> Result<Vec<String>, mongodb::error::Error> {
        let mut filter = doc! {
            ROOM: true, "_id": {"$ne": me},
            "$expr": {"$gt": [{"$ifNull": [field(ALIVE_UNTIL_MS), 0_i64]}, {"$toLong": "$$NOW"}]},
        };
        if standbys_only {
            filter.insert(HELD, 0_i64);
        }
        let found: Vec<Document> = self
            .workers()
            .find(filter)
            .sort(doc! {ROOM: 1, HELD: 1, "_id": 1})
            .projection(doc! {"_id": 1})
            .limit(n as i64)
            .await?
            .try_collect()
            .await?;
        Ok(found
            .iter()
            .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
            .collect())
    }

    /// Every live worker, with its `--max-slots` and what it held at its last
    /// heartbeat (judged on the server's clock).
    pub(crate) async fn live(&self) -> Result<Vec<LiveWorker>, mongodb::error::Error> {
        let mut pipeline = liveness();
        pipeline.push(doc! {"$project": {
            MAX_SLOTS: 1, TICK_MS: 1, "seen_ms": 1, "alive_ms": 1, LOAD: 1,
            "seen_at_ms": {"$toLong": field(LAST_SEEN)},
            "settled_ms": {"$cond": [
                {"$in": [{"$type": field(SETTLES_AT_MS)}, ["int", "long"]]},
                {"$subtract": [{"$toLong": "$$NOW"}, field(SETTLES_AT_MS)]},
                Bson::Null,
            ]},
            HELD: {"$cond": [{"$isArray": field(SLOTS)}, {"$size": field(SLOTS)}, 0]},
        }});
        let mut cursor = self.workers().aggregate(pipeline).await?;
        let mut out = Vec::new();
        while let Some(d) = cursor.try_next().await? {
            if let (true, Ok(id)) = (is_alive(&d), d.get_str("_id")) {
                out.push(LiveWorker {
                    id: id.to_string(),
                    max_slots: int(&d, MAX_SLOTS).filter(|m| *m > 0).map(|m| m as usize),
                    held: int(&d, HELD).unwrap_or(0).max(0) as usize,
                    seen_at_ms: int(&d, "seen_at_ms"),
                    settled_ms: int(&d, "settled_ms"),
                    score: crate::db::load::load_of(&d).map(|l| l.score()),
                });
            }
        }
        Ok(out)
    }

    /// The refusal for a heartbeat that collided with another process's: how long
    /// that one's heartbeat is still believed.
    async fn in_use(&self, me: &str) -> BeatError {
        let mut pipeline = vec![doc! {"$match": {"_id": me}}];
        pipeline.extend(liveness());
        let found = match self.workers().aggregate(pipeline).await {
            Ok(mut cursor) => cursor.try_next().await.ok().flatten(),
            Err(e) => return e.into(),
        };
        let left_ms = found.as_ref().and_then(|d| int(d, "alive_ms")).unwrap_or(0);
        let predecessor = found.as_ref().and_then(|d| {
            Some(Predecessor {
                instance: d.get_str(INSTANCE).ok()?.to_string(),
                alive_until_ms: int(d, ALIVE_UNTIL_MS)?,
                netns: d.get_str(NETNS).ok().map(str::to_string),
            })
        });
        BeatError::IdentityInUse {
            id: me.to_string(),
            left_ms,
            predecessor,
        }
    }

    /// Leaves the line on a clean exit, so standbys are counted honestly; never
    /// removes another process's heartbeat under the same `ip:port`.
    pub(crate) async fn leave(
        &self,
        me: &str,
        instance: &str,
    ) -> Result<(), mongodb::error::Error> {
        self.workers()
            .delete_one(doc! {"_id": me, INSTANCE: instance})
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);
    /// A front-paced beat at a 1 s tick.
    const BEAT: Duration = Duration::from_secs(5);

    #[test]
    fn liveness_from_its_own_deadline_or_the_legacy_rule() {
        assert!(is_alive(&doc! {"alive_ms": 5_i64, "seen_ms": 999_999_i64}));
        assert!(!is_alive(&doc! {"alive_ms": -1_i64, "seen_ms": 0_i64}));
        assert!(!is_alive(&doc! {"alive_ms": 0_i64}));
        // An older worker: no deadline of its own, judged by its tick.
        assert!(is_alive(&doc! {"seen_ms": 3000_i64, "tick_ms": 1000_i64}));
        assert!(!is_alive(&doc! {"seen_ms": 3001_i64, "tick_ms": 1000_i64}));
        assert!(!is_alive(&doc! {"tick_ms": 1000_i64}), "never seen");
    }

    #[test]
    fn a_place_read_from_the_near_standbys_counts_a_subset_of_the_whole_line() {
        let whole = place_pipeline("10.0.0.9:7700", 0, 3, None);
        let near = place_pipeline("10.0.0.9:7700", 0, 3, Some("10.0.0.4:7700"));
        assert_eq!(whole.len(), near.len());
        assert_eq!(whole[1], near[1], "the same liveness");
        // What the whole read counts ahead: the standbys below this one, ...
        let facet = |p: &[Document]| p[2].get_document("$facet").unwrap().clone();
        let stages = |f: &Document| f.get_array("ahead").unwrap().clone();
        let (w, n) = (stages(&facet(&whole)), stages(&facet(&near)));
        assert_eq!(
            w[0],
            Bson::Document(doc! {"$match": {"_id": {"$lt": "10.0.0.9:7700"}}})
        );
        // ... counted as the near read counts ...
        assert_eq!(w[1..], n[..]);
        // ... whose filter is the whole read's, from `near` up to this one.
        let filter = |p: &[Document]| p[0].get_document("$match").unwrap().clone();
        let mut wf = filter(&whole);
        wf.insert(
            "_id",
            doc! {"$gte": "10.0.0.4:7700", "$lt": "10.0.0.9:7700"},
        );
        assert_eq!(wf, filter(&near));
        // Nearest first, and as many as the watchers and the spare.
        assert_eq!(n[0], Bson::Document(doc! {"$sort": {"_id": -1}}));
        assert_eq!(n[1], Bson::Document(doc! {"$limit": 5_i64}));
        // The whole read names the front with its scores; the near one does not.
        assert!(facet(&whole).contains_key("front"));
        assert!(!facet(&near).contains_key("front"));
        // A holder's place has no bound to start from, nor an order.
        assert_eq!(
            place_pipeline("h", 2, 3, Some("x")),
            place_pipeline("h", 2, 3, None)
        );
        assert!(!place_pipeline("h", 2, 3, None)
            .iter()
            .any(|s| s.contains_key("$sort")));
    }

    #[test]
    fn a_heartbeat_outlives_one_lost_beat() {
        let beat = BEAT;
        assert!(believed_for(beat) > beat * 2);
    }

    #[test]
    fn room_follows_the_cap() {
        let held = [("s1".to_string(), 1_i64)];
        let beat = |max| Beat {
            me: "w",
            instance: "i",
            netns: None,
            held: &held,
            max_slots: max,
            tick: T,
            pace: BEAT,
            settles_in: Duration::ZERO,
            load: None,
        };
        assert!(beat(None).room());
        assert!(beat(Some(2)).room());
        assert!(!beat(Some(1)).room());
    }
}
