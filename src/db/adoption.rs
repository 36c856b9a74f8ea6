//! Adoption: how a new holder makes a slot's robots its own, and how big each write
//! may be.
//!
//! Adopting a robot raises its generation and sets its epoch to the holder's, in one
//! write; from then on every earlier instance is fenced (see [`crate::db::context`]).
//! A takeover adopts a whole slot's robots, so the writes are sized from the server's
//! measured pace ([`next_adopt_chunk`]) and, once the whole slot fits the budget, go
//! as one statement over the slot ([`ContextStore::adopt_slot`]).

use std::collections::HashSet;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::db::context::{long_or_zero, ContextError, ContextStore, BATCH};
use crate::db::field::{EPOCH, ERROR, GEN, PAUSED, SLOT_ID, STATUS, STATUS_AT, WORKER};
use crate::db::group_commit::{Statement, Update, Written};
use crate::db::robot_doc::RobotStatus;

/// Robots per adoption write: a write's cost grows faster than its count, so small
/// chunks are both gentler on renewals and faster overall (see
/// docs/bench/2026-11-22-restoring-10000-robots.md).
pub(crate) const ADOPT_CHUNK: usize = 100;

/// The fewest robots per adoption write, however slow the server: below this the
/// round trips, not the server's work, would set the pace.
pub(crate) const ADOPT_CHUNK_MIN: usize = 10;

/// Robots in the next adoption write, from how long the last one took: as many as
/// fit in `budget` at the measured cost per robot, from [`ADOPT_CHUNK_MIN`] to
/// [`ADOPT_CHUNK`]. A renewal sent meanwhile may wait behind the whole chunk, so the
/// budget (half the fence margin) keeps that wait inside the margin at any tick
/// (see docs/bench/2026-11-24-requests-and-takeovers-issue-23.md).
pub(crate) fn next_adopt_chunk(took: Duration, robots: usize, budget: Duration) -> usize {
    crate::db::pacing::statements_within(budget, took, robots, ADOPT_CHUNK_MIN, ADOPT_CHUNK)
}

/// Whether the robots left to adopt can go as one statement over the slot
/// ([`ContextStore::adopt_slot`]) rather than in more chunks: when the last chunk's
/// cost per robot (`took` for `done`) puts `slot` robots within `budget`. `slot`
/// counts every robot bound to the slot, since the statement examines each of them
/// and examining costs no more than writing. Nothing measured yet means no
/// (see docs/bench/2026-11-24-requests-and-takeovers-issue-23.md).
pub(crate) fn adopt_rest_at_once(
    took: Duration,
    done: usize,
    slot: usize,
    budget: Duration,
) -> bool {
    done > 0
        && !took.is_zero()
        && crate::db::pacing::statements_within(budget, took, done, 0, usize::MAX) >= slot
}

/// What one adoption write did.
#[derive(Debug, Default)]
pub struct Adopted {
    /// Each adopted robot with its new generation.
    pub ours: Vec<(ObjectId, i64)>,
    /// Robots the database refused to change, with its message.
    pub refused: Vec<AdoptRefused>,
}

#[derive(Debug)]
pub struct AdoptRefused {
    pub id: ObjectId,
    pub why: String,
}

// === impl ContextStore: adoption ===

impl ContextStore {
    /// Adopts these robots (read from this slot) for a new running instance each, in
    /// one write: the robot's epoch becomes ours and its generation goes up by one, so
    /// every earlier instance, here or elsewhere, is fenced. Returns each adopted
    /// robot with its new generation; one moved, deleted or adopted by a newer holder
    /// since it was read is left out. The generations are computed, not read back,
    /// when the write matched every robot: a wrong guess fails closed (fenced at its
    /// first write, restarted by the next sync). Callers pass at most [`ADOPT_CHUNK`]
    /// robots, so one write cannot starve this holder's renewals.
    pub async fn adopt(&self, robots: &[(ObjectId, i64)]) -> Result<Adopted, ContextError> {
        let ids: Vec<ObjectId> = robots.iter().map(|(id, _)| *id).collect();
        let ids = &ids[..];
        if !self.guard.admit().await {
            return Err(self.lapsed("(adoption)"));
        }
        // `$not: {$gt}` rather than `$lte`: a hand-broken epoch (missing, a string)
        // is taken over too instead of leaving its robot unrun. Equal epochs are
        // this holder's own: a re-adoption after a move away and back, or a restart.
        let update = self.adoption_update();
        // The whole chunk as one multi-document statement of the group-commit path's
        // `update` command: on the dev server that costs 0.43 ms a robot, where a
        // statement per robot costs 0.63 ms. Refused as a whole (a hand-edited
        // document failing the validator), the chunk goes again a statement per
        // robot, so one broken robot holds back no other.
        // Not paused: a robot paused (or failed, which holds it as paused) after the
        // listing keeps its status and reason, and is not started.
        let filter = |ids: Bson| {
            doc! {
                "_id": ids, SLOT_ID: &self.slot_id,
                EPOCH: {"$not": {"$gt": self.epoch}},
                PAUSED: {"$ne": true},
            }
        };
        let mut refused = Vec::new();
        let together = Statement {
            id: ids[0],
            filter: filter(doc! {"$in": ids}.into()),
            update: Update::Pipeline(update.clone()),
        };
        let taken: Vec<ObjectId> = match self
            .answered(
                "an adoption write",
                crate::db::group_commit::send_many(&self.store.robots(), &together),
            )
            .await?
        {
            Ok(n) if n == ids.len() as u64 => {
                return Ok(Adopted {
                    ours: robots.to_vec(),
                    refused,
                })
            }
            Ok(_) => ids.to_vec(),
            Err(e) if crate::db::store::is_transient(&e) => return Err(e.into()),
            Err(_) => {
                let one_each: Vec<Statement> = ids
                    .iter()
                    .map(|id| Statement {
                        id: *id,
                        filter: filter(Bson::ObjectId(*id)),
                        update: Update::Pipeline(update.clone()),
                    })
                    .collect();
                let written = self
                    .answered(
                        "an adoption write",
                        crate::db::group_commit::send(&self.store.robots(), &one_each),
                    )
                    .await??;
                let mut taken = Vec::with_capacity(ids.len());
                for (s, w) in one_each.iter().zip(written) {
                    match w {
                        Written::Refused(why) => refused.push(AdoptRefused { id: s.id, why }),
                        _ => taken.push(s.id),
                    }
                }
                taken
            }
        };
        // Read back each robot's new generation (by _id, so a point lookup).
        let ours = self.generations(&taken).await?;
        Ok(Adopted { ours, refused })
    }

    /// Adopts, in one statement over the slot, every unpaused robot bound to it whose
    /// epoch is older than this holder's (or hand-broken): [`ContextStore::adopt`]'s
    /// write, filtered by `slot_id`. `robots` must be all those the caller listed, with
    /// the generation this gives each; the caller checks no other listed robot matches
    /// (one still stopping under an older epoch would be fenced before its last
    /// checkpoint). Sent only when its cost fits ([`adopt_rest_at_once`]). A robot moved
    /// in since the listing is adopted with no instance, which fences its old holder's
    /// copy, and the next sync starts it. A validator refusal stops the statement
    /// part-way; the rest are then adopted by `_id`.
    pub async fn adopt_slot(&self, robots: &[(ObjectId, i64)]) -> Result<Adopted, ContextError> {
        if !self.guard.admit().await {
            return Err(self.lapsed("(adoption)"));
        }
        let all = Statement {
            id: robots.first().map_or_else(ObjectId::new, |(id, _)| *id),
            filter: doc! {
                SLOT_ID: &self.slot_id, PAUSED: {"$ne": true},
                EPOCH: {"$not": {"$gte": self.epoch}},
            },
            update: Update::Pipeline(self.adoption_update()),
        };
        let sent = self
            .answered(
                "an adoption write",
                crate::db::group_commit::send_many(&self.store.robots(), &all),
            )
            .await?;
        let refused = match sent {
            Ok(n) if n == robots.len() as u64 => {
                return Ok(Adopted {
                    ours: robots.to_vec(),
                    refused: Vec::new(),
                })
            }
            Ok(_) => false,
            Err(e) if crate::db::store::is_transient(&e) => return Err(e.into()),
            Err(_) => true,
        };
        // More (created or moved in since the listing) or fewer (moved out, deleted,
        // taken by a newer holder), or refused part-way: read back what it took. A
        // listed robot now at this epoch was taken by it, since this holder writes
        // its own epoch only when adopting and every robot here was listed older.
        let mut ours = self.adopted_here(robots).await?;
        if !refused {
            return Ok(Adopted {
                ours,
                refused: Vec::new(),
            });
        }
        // Refused at a hand-edited document: on MongoDB the robots before it are
        // adopted and the rest are not. The rest go again by `_id`, where a refused
        // robot holds back no other.
        let taken: HashSet<ObjectId> = ours.iter().map(|(id, _)| *id).collect();
        let left: Vec<(ObjectId, i64)> = robots
            .iter()
            .filter(|(id, _)| !taken.contains(id))
            .copied()
            .collect();
        if left.is_empty() {
            return Ok(Adopted {
                ours,
                refused: Vec::new(),
            });
        }
        let more = self.adopt(&left).await?;
        ours.extend(more.ours);
        Ok(Adopted {
            ours,
            refused: more.refused,
        })
    }

    /// The generations of those of `taken` at this holder's epoch, read by `_id`.
    async fn generations(&self, taken: &[ObjectId]) -> Result<Vec<(ObjectId, i64)>, ContextError> {
        let filter = doc! {
            "_id": {"$in": taken}, SLOT_ID: &self.slot_id, EPOCH: self.epoch,
            PAUSED: {"$ne": true},
        };
        self.read_generations(filter, |_| true).await
    }

    /// Those of `robots` that are at this holder's epoch now, with their generations:
    /// read by slot, as one `$in` of a whole slot's ids costs the dev server more
    /// than the slot itself.
    async fn adopted_here(
        &self,
        robots: &[(ObjectId, i64)],
    ) -> Result<Vec<(ObjectId, i64)>, ContextError> {
        let wanted: HashSet<ObjectId> = robots.iter().map(|(id, _)| *id).collect();
        let filter = doc! {SLOT_ID: &self.slot_id, EPOCH: self.epoch, PAUSED: {"$ne": true}};
        self.read_generations(filter, |id| wanted.contains(id))
            .await
    }

    /// Each robot matching `filter` that `keep` keeps, with its generation: an
    /// adoption's read-back, bounded like its writes.
    async fn read_generations(
        &self,
        filter: Document,
        keep: impl Fn(&ObjectId) -> bool,
    ) -> Result<Vec<(ObjectId, i64)>, ContextError> {
        let read = async {
            let mut cursor = self
                .store
                .robots()
                .find(filter)
                .projection(doc! {"_id": 1, GEN: 1})
                .batch_size(BATCH)
                .await?;
            let mut ours = Vec::new();
            while let Some(d) = futures::TryStreamExt::try_next(&mut cursor).await? {
                match d.get_object_id("_id") {
                    Ok(id) if keep(&id) => ours.push((id, long_or_zero(&d, GEN))),
                    _ => {}
                }
            }
            Ok(ours)
        };
        Ok(self.answered("an adoption's read-back", read).await??)
    }

    /// The adoption write: this holder's epoch, the generation up by one, marked
    /// running here. A pipeline, so a hand-broken `gen` (a string) restarts from 1
    /// instead of failing the write the way `$inc` would.
    fn adoption_update(&self) -> Vec<Document> {
        vec![doc! {"$set": {
            EPOCH: self.epoch,
            GEN: {"$add": [
                {"$cond": [{"$in": [{"$type": "$gen"}, ["int", "long"]]}, {"$toLong": "$gen"}, 0_i64]},
                1_i64,
            ]},
            STATUS: RobotStatus::Running, ERROR: Bson::Null,
            WORKER: {"$literal": &self.worker}, STATUS_AT: "$$NOW",
        }}]
    }
}

/// Every robot bound to `slot`, of any epoch, in one query (batches of
/// [`BATCH`]). Without the checkpoint history and a scheduled robot's run records:
/// the holder reads neither here, and up to a thousand records a robot would be
/// shipped in a command that holds its renewal behind it.
pub(crate) async fn slot_robots(
    store: &crate::db::store::Store,
    slot: &str,
) -> Result<mongodb::Cursor<Document>, mongodb::error::Error> {
    store
        .robots()
        .find(doc! {SLOT_ID: slot})
        .projection(doc! {crate::db::field::HISTORY: 0, crate::db::firing::RUNS: 0})
        .batch_size(BATCH)
        .await
}

/// What one grouped query counts of a slot's robots, to tell whether they changed
/// since the holder last read them all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) total: i64,
    /// Not paused, and of an epoch other than `mine`.
    pub(crate) unadopted: i64,
    pub(crate) paused: i64,
    /// With an `update` waiting.
    pub(crate) updates: i64,
}

/// Counts `slot`'s robots (those with an ObjectId `_id`) for [`Tally`], judging
/// adoption against epoch `mine`.
pub(crate) async fn tally(
    store: &crate::db::store::Store,
    slot: &str,
    mine: i64,
) -> Result<Tally, mongodb::error::Error> {
    use futures::TryStreamExt;
    let pipeline = vec![
        doc! {"$match": {SLOT_ID: slot, "_id": {"$type": "objectId"}}},
        doc! {"$group": {
            "_id": Bson::Null,
            "total": {"$sum": 1_i64},
            PAUSED: {"$sum": {"$cond": [{"$eq": ["$paused", true]}, 1_i64, 0_i64]}},
            "updates": {"$sum": {"$cond": [{"$eq": [{"$type": "$update"}, "object"]}, 1_i64, 0_i64]}},
            "unadopted": {"$sum": {"$cond": [
                {"$and": [{"$ne": ["$paused", true]}, {"$ne": ["$epoch", mine]}]},
                1_i64, 0_i64,
            ]}},
        }},
    ];
    let mut cursor = store.robots().aggregate(pipeline).await?;
    Ok(match cursor.try_next().await? {
        Some(d) => Tally {
            total: long_or_zero(&d, "total"),
            unadopted: long_or_zero(&d, "unadopted"),
            paused: long_or_zero(&d, PAUSED),
            updates: long_or_zero(&d, "updates"),
        },
        None => Tally::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rest_goes_at_once_only_when_the_whole_slot_fits_the_budget() {
        // 10 robots took 10 ms: 1 ms each, 225 ms of budget: a slot of 225 at most.
        assert!(adopt_rest_at_once(MS * 10, 10, 225, MS * 225));
        assert!(!adopt_rest_at_once(MS * 10, 10, 226, MS * 225));
        // At 250 ms (a 56 ms budget) on the dev server (0.7 ms a robot): 80 at most.
        assert!(adopt_rest_at_once(MS * 7, 10, 80, MS * 56));
        assert!(!adopt_rest_at_once(MS * 7, 10, 990, MS * 56));
        // Nothing measured: never.
        assert!(!adopt_rest_at_once(Duration::ZERO, 10, 1, MS * 225));
        assert!(!adopt_rest_at_once(MS, 0, 1, MS * 225));
    }

    #[test]
    fn adoption_chunks_fit_the_budget_measured_from_the_last() {
        // 100 robots in 100 ms: 1 ms each.
        assert_eq!(
            next_adopt_chunk(MS * 100, 100, MS * 225),
            ADOPT_CHUNK,
            "capped"
        );
        assert_eq!(next_adopt_chunk(MS * 100, 100, MS * 56), 56);
        assert_eq!(next_adopt_chunk(MS * 100, 100, MS * 22), 22);
        // A server that slowed down to 10 ms a robot: the floor.
        assert_eq!(next_adopt_chunk(MS * 500, 50, MS * 22), ADOPT_CHUNK_MIN);
        // Nothing measured: the largest.
        assert_eq!(next_adopt_chunk(Duration::ZERO, 10, MS * 22), ADOPT_CHUNK);
        assert_eq!(next_adopt_chunk(MS, 0, MS * 22), ADOPT_CHUNK);
    }
}
