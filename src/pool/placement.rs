//! Least-loaded slot choice for new robots, safe under concurrent creates, and the
//! rebalance plan that evens existing robots out.
//!
//! Every non-draining slot counts, held or not: every slot is held while one worker
//! lives (standbys claim, survivors overflow), so preferring the slots that happen to
//! be held right now would only pile robots up while workers are still claiming.
//!
//! Each slot keeps `robot_count` beside `rev`. A create *reserves* room with a
//! compare-and-set on the count it saw (`{_id, robot_count: seen} → $inc`), so two
//! CLIs that both saw slot A as emptiest cannot both land there: the loser re-reads
//! and picks again. Only after the robot documents exist is `rev` bumped, so the
//! holder that notices the bump finds them.
//!
//! A reservation, and so every create and move, requires the slot to be neither
//! draining nor `retiring`. `init` shrinks the pool by retiring a slot first, then
//! checking that no robot is bound to it, then deleting it; a create or move checks
//! *after* its own write that its slots still exist and are not retiring, and
//! re-places ([`rescue`]) any robot that landed on one that is. Each side checks after
//! its own write, so one of them always sees the other: no robot is ever left bound
//! to a slot that does not exist.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{DRAINING, EPOCH, RETIRING, REV, ROBOT_COUNT, SLOT_ID, STATUS, WORKER};
use crate::db::robot_count::reservation;
use crate::db::robot_doc::RobotStatus;
use crate::db::store::{int, Store};

/// A slot as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotLoad {
    pub id: String,
    pub robots: i64,
    /// The `robot_count` value as read, None when the field is missing.
    seen: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("no slots to place robots on: run `slotpool init --slots N` first (draining slots are not used)")]
    NoSlots,
    #[error("too much contention placing robots; try again")]
    Contention,
    #[error("database error: {0}")]
    Db(#[from] mongodb::error::Error),
}

/// Where robots went.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Slot per robot, in creation order.
    pub slots: Vec<String>,
}

/// Reads every non-draining slot's load.
pub async fn loads(store: &Store) -> Result<Vec<SlotLoad>, PlacementError> {
    let pipeline = vec![
        doc! {"$match": {DRAINING: {"$ne": true}, RETIRING: {"$ne": true}, "_id": {"$type": "string"}}},
        doc! {"$sort": {"_id": 1}},
        doc! {"$project": {ROBOT_COUNT: 1}},
    ];
    let mut cursor = store.slots().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        let seen = int(&d, ROBOT_COUNT);
        out.push(SlotLoad {
            id: d.get_str("_id").unwrap_or_default().to_string(),
            robots: seen.unwrap_or(0).max(0),
            seen,
        });
    }
    Ok(out)
}

/// The part of a slot filter that admits only slots robots may be placed on.
fn open_for_robots() -> Document {
    doc! {DRAINING: {"$ne": true}, RETIRING: {"$ne": true}}
}

/// Spreads `n` robots over `slots`, filling the emptiest first (ties by id).
pub fn plan(slots: &[SlotLoad], n: usize) -> Vec<usize> {
    let mut counts: Vec<i64> = slots.iter().map(|s| s.robots).collect();
    let mut take = vec![0usize; slots.len()];
    for _ in 0..n {
        let (i, _) = counts
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (**c, *i))
            .expect("plan needs at least one slot");
        counts[i] += 1;
        take[i] += 1;
    }
    take
}

/// Reserves room for `n` robots and returns a slot per robot. The caller inserts the
/// robots, then calls [`bump_revs`] (or [`unreserve`] for those that failed).
pub async fn reserve(store: &Store, n: usize) -> Result<Placement, PlacementError> {
    for _round in 0..50 {
        let pool = loads(store).await?;
        if pool.is_empty() {
            return Err(PlacementError::NoSlots);
        }
        let take = plan(&pool, n);
        let mut reserved: Vec<(usize, usize)> = Vec::new();
        let mut lost_race = false;
        for (i, k) in take.iter().enumerate().filter(|(_, k)| **k > 0) {
            let s = &pool[i];
            let mut filter = match s.seen {
                Some(c) => doc! {"_id": &s.id, ROBOT_COUNT: c},
                None => doc! {"_id": &s.id, ROBOT_COUNT: {"$exists": false}},
            };
            filter.extend(open_for_robots());
            let r = store
                .slots()
                .update_one(filter, reservation(*k as i64))
                .await?;
            if r.modified_count == 1 {
                reserved.push((i, *k));
            } else {
                lost_race = true;
                break;
            }
        }
        if lost_race {
            for (i, k) in reserved {
                adjust(store, &pool[i].id, -(k as i64), false).await?;
            }
            tokio::time::sleep(std::time::Duration::from_millis(
                5 + (std::process::id() % 20) as u64,
            ))
            .await;
            continue;
        }
        let mut slots = Vec::with_capacity(n);
        for (i, k) in reserved {
            slots.extend(std::iter::repeat_n(pool[i].id.clone(), k));
        }
        return Ok(Placement { slots });
    }
    Err(PlacementError::Contention)
}

/// Moves robots from the most to the least loaded slot, one at a time, until the
/// counts differ by at most one or `max_moves` is reached. Returns
/// `(from, to, how many)` in the order to carry out, ties broken by slot id.
pub fn rebalance_plan(counts: &[(String, i64)], max_moves: usize) -> Vec<(String, String, usize)> {
    let mut counts: Vec<(String, i64)> = counts.to_vec();
    counts.sort();
    let mut moves: Vec<(String, String, usize)> = Vec::new();
    for _ in 0..max_moves {
        let Some(hi) = (0..counts.len()).max_by_key(|&i| (counts[i].1, std::cmp::Reverse(i)))
        else {
            break;
        };
        let lo = (0..counts.len())
            .min_by_key(|&i| (counts[i].1, i))
            .expect("non-empty");
        if counts[hi].1 - counts[lo].1 <= 1 {
            break;
        }
        counts[hi].1 -= 1;
        counts[lo].1 += 1;
        let (from, to) = (&counts[hi].0, &counts[lo].0);
        match moves.iter_mut().find(|(f, t, _)| f == from && t == to) {
            Some(m) => m.2 += 1,
            None => moves.push((from.clone(), to.clone(), 1)),
        }
    }
    moves
}

/// Why a move was refused.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("no slot {0:?}: see `slotpool slots list`")]
    NoSuchSlot(String),
    #[error("{0} is draining: its robots are being stopped, so none may move onto it (slotpool slots undrain {0} first)")]
    Draining(String),
    #[error("database error: {0}")]
    Db(#[from] mongodb::error::Error),
}

/// Binds these robots (if still on `from`) to `to`: a fenced move. Their epoch goes
/// back to 0 so `to`'s holder adopts them (raising their generation, which fences
/// every instance that ran before); `from`'s holder stops its instances at its next
/// renewal, and their writes already fail the `slot_id` fence. A paused robot stays
/// paused. Returns how many moved.
pub async fn move_robots(
    store: &Store,
    ids: &[bson::oid::ObjectId],
    from: &str,
    to: &str,
) -> Result<u64, MoveError> {
    // Reserve room first, atomically with the check that `to` takes robots: a
    // drain or a retirement after this point sees the reservation.
    let k = ids.len() as i64;
    let mut filter = doc! {"_id": to};
    filter.extend(open_for_robots());
    let reserved = store.slots().update_one(filter, reservation(k)).await?;
    if reserved.matched_count == 0 {
        let dest = store
            .slots()
            .find_one(doc! {"_id": to})
            .projection(doc! {DRAINING: 1})
            .await?;
        return Err(match dest {
            None => MoveError::NoSuchSlot(to.to_string()),
            Some(_) => MoveError::Draining(to.to_string()),
        });
    }
    let r = store
        .robots()
        .update_many(doc! {"_id": {"$in": ids}, SLOT_ID: from}, rebind(to))
        .await?;
    let moved = r.modified_count as i64;
    adjust(store, to, moved - k, moved > 0).await?;
    if moved > 0 {
        adjust(store, from, -moved, true).await?;
        // `to` may have been retired between the reservation and the move.
        rescue(store, ids, &[to.to_string()]).await?;
    }
    Ok(moved as u64)
}

/// Re-places those of `ids` that are bound to one of `slots` that is missing or
/// retiring, on the least-loaded open slots; returns how many moved. Costs one
/// query on `slots` when none of them is (the common case). Safe to run from
/// several processes at once: each move is conditional on the robot's old slot.
pub async fn rescue(
    store: &Store,
    ids: &[bson::oid::ObjectId],
    slots: &[String],
) -> Result<u64, mongodb::error::Error> {
    let mut rescued = 0;
    let mut ids: Vec<bson::oid::ObjectId> = ids.to_vec();
    let mut slots: Vec<String> = slots.to_vec();
    for _round in 0..10 {
        slots.sort();
        slots.dedup();
        let fine = slot_ids(
            store,
            doc! {"_id": {"$in": &slots}, RETIRING: {"$ne": true}},
        )
        .await?;
        let gone: Vec<&String> = slots.iter().filter(|s| !fine.contains(s)).collect();
        if gone.is_empty() {
            return Ok(rescued);
        }
        let mut lost: Vec<(bson::oid::ObjectId, String)> = Vec::new();
        for chunk in ids.chunks(crate::db::store::CHUNK) {
            let mut cursor = store
                .robots()
                .find(doc! {"_id": {"$in": chunk}, SLOT_ID: {"$in": &gone}})
                .projection(doc! {SLOT_ID: 1})
                .await?;
            while let Some(d) = cursor.try_next().await? {
                if let (Ok(id), Ok(slot)) = (d.get_object_id("_id"), d.get_str(SLOT_ID)) {
                    lost.push((id, slot.to_string()));
                }
            }
        }
        if lost.is_empty() {
            return Ok(rescued);
        }
        let placement = match reserve(store, lost.len()).await {
            Ok(p) => p,
            Err(PlacementError::Db(e)) => return Err(e),
            Err(_) => return Ok(rescued),
        };
        let mut moved = Vec::new();
        for ((id, old), new) in lost.iter().zip(&placement.slots) {
            let r = store
                .robots()
                .update_one(doc! {"_id": id, SLOT_ID: old}, rebind(new))
                .await?;
            if r.modified_count == 1 {
                rescued += 1;
                moved.push(*id);
                adjust(store, old, -1, true).await?;
                tracing::warn!(robot = %id, from = %old, to = %new, "robot re-placed: its slot was removed");
            } else {
                adjust(store, new, -1, false).await?;
            }
        }
        bump_revs(store, &placement.slots).await?;
        // The new slots could be retired in turn: check them too.
        ids = moved;
        slots = placement.slots;
    }
    Ok(rescued)
}

/// The update that binds robots to slot `to`: epoch back to 0 so `to`'s holder
/// adopts them (raising their generation), no worker, and `pending` unless paused.
fn rebind(to: &str) -> Vec<Document> {
    vec![doc! {"$set": {
        SLOT_ID: {"$literal": to}, EPOCH: 0_i64, WORKER: Bson::Null,
        STATUS: {"$cond": [{"$eq": ["$paused", true]}, RobotStatus::Paused, RobotStatus::Pending]},
    }}]
}

/// The ids of the slots matching `filter`.
async fn slot_ids(store: &Store, filter: Document) -> Result<Vec<String>, mongodb::error::Error> {
    Ok(store
        .slots()
        .find(filter)
        .projection(doc! {"_id": 1})
        .await?
        .try_collect::<Vec<Document>>()
        .await?
        .iter()
        .filter_map(|d| d.get_str("_id").ok().map(str::to_string))
        .collect())
}

/// Re-places every robot bound to a slot that does not exist or is retiring.
pub async fn rescue_all(store: &Store) -> Result<u64, mongodb::error::Error> {
    let existing = slot_ids(store, doc! {RETIRING: {"$ne": true}}).await?;
    let stranded: Vec<Document> = store
        .robots()
        .find(doc! {SLOT_ID: {"$nin": &existing}})
        .projection(doc! {"_id": 1, SLOT_ID: 1})
        .await?
        .try_collect()
        .await?;
    if stranded.is_empty() {
        return Ok(0);
    }
    let ids: Vec<bson::oid::ObjectId> = stranded
        .iter()
        .filter_map(|d| d.get_object_id("_id").ok())
        .collect();
    let slots: Vec<String> = stranded
        .iter()
        .filter_map(|d| d.get_str(SLOT_ID).ok().map(str::to_string))
        .collect();
    rescue(store, &ids, &slots).await
}

/// Changes a slot's `robot_count` by `delta`, bumping `rev` when `bump`.
pub async fn adjust(
    store: &Store,
    slot: &str,
    delta: i64,
    bump: bool,
) -> Result<(), mongodb::error::Error> {
    let mut inc = Document::new();
    if delta != 0 {
        inc.insert(ROBOT_COUNT, delta);
    }
    if bump {
        inc.insert(REV, 1_i64);
    }
    if !inc.is_empty() {
        store
            .slots()
            .update_one(doc! {"_id": slot}, doc! {"$inc": inc})
            .await?;
    }
    Ok(())
}

/// Tells each slot's holder that its robots changed.
pub async fn bump_revs(store: &Store, slots: &[String]) -> Result<(), mongodb::error::Error> {
    let mut unique: Vec<&String> = slots.iter().collect();
    unique.sort();
    unique.dedup();
    store
        .slots()
        .update_many(doc! {"_id": {"$in": unique}}, doc! {"$inc": {REV: 1_i64}})
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(id: &str, robots: i64) -> SlotLoad {
        SlotLoad {
            id: id.into(),
            robots,
            seen: Some(robots),
        }
    }

    #[test]
    fn plan_fills_the_emptiest_first() {
        let slots = [load("a", 5), load("b", 0), load("c", 2)];
        assert_eq!(plan(&slots, 1), vec![0, 1, 0]);
        assert_eq!(plan(&slots, 5), vec![0, 4, 1]);
        assert_eq!(plan(&slots, 8), vec![0, 5, 3]);
        assert_eq!(plan(&slots, 11), vec![1, 6, 4]);
        let empty = [load("a", 0), load("b", 0), load("c", 0)];
        assert_eq!(plan(&empty, 6), vec![2, 2, 2]);
    }

    fn counts(c: &[(&str, i64)]) -> Vec<(String, i64)> {
        c.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    fn after(c: &[(&str, i64)], moves: &[(String, String, usize)]) -> Vec<i64> {
        let mut c = counts(c);
        for (f, t, k) in moves {
            c.iter_mut().find(|x| &x.0 == f).unwrap().1 -= *k as i64;
            c.iter_mut().find(|x| &x.0 == t).unwrap().1 += *k as i64;
        }
        c.iter().map(|x| x.1).collect()
    }

    #[test]
    fn rebalance_evens_out_to_within_one() {
        let c = [("a", 7), ("b", 1), ("c", 1)];
        let m = rebalance_plan(&counts(&c), usize::MAX);
        assert_eq!(after(&c, &m), vec![3, 3, 3]);
        assert_eq!(m.iter().map(|x| x.2).sum::<usize>(), 4);
        let c = [("a", 1000), ("b", 0), ("c", 0)];
        let m = rebalance_plan(&counts(&c), usize::MAX);
        assert_eq!(after(&c, &m), vec![334, 333, 333]);
        assert_eq!(m.len(), 2, "grouped per pair: {m:?}");
        let c = [("a", 2), ("b", 1), ("c", 1)];
        assert!(rebalance_plan(&counts(&c), usize::MAX).is_empty());
        assert!(rebalance_plan(&[], usize::MAX).is_empty());
    }

    #[test]
    fn rebalance_respects_max_moves() {
        let c = [("a", 9), ("b", 0), ("c", 0)];
        let m = rebalance_plan(&counts(&c), 2);
        assert_eq!(m.iter().map(|x| x.2).sum::<usize>(), 2);
    }
}
