//! Least-loaded slot choice for new robots, safe under concurrent creates.
//!
//! Each slot keeps `robot_count` beside `rev`. A create *reserves* room with a
//! compare-and-set on the count it saw (`{_id, robot_count: seen} → $inc`), so two
//! CLIs that both saw slot A as emptiest cannot both land there: the loser re-reads
//! and picks again. Only after the robot documents exist is `rev` bumped, so the
//! holder that notices the bump finds them.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::store::Store;

/// A slot as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotLoad {
    pub id: String,
    pub robots: i64,
    pub live: bool,
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
    /// True when no slot was live and the least-loaded slot overall was used.
    pub no_live_slot: bool,
}

/// Reads every non-draining slot's load and liveness (judged by the server).
pub async fn loads(store: &Store) -> Result<Vec<SlotLoad>, PlacementError> {
    let pipeline = vec![
        doc! {"$match": {"draining": {"$ne": true}, "_id": {"$type": "string"}}},
        doc! {"$sort": {"_id": 1}},
        doc! {"$project": {
            "robot_count": 1,
            "live": {"$and": [
                {"$eq": [{"$type": "$owner"}, "string"]},
                {"$eq": [{"$type": "$time"}, "date"]},
                {"$in": [{"$type": "$lease_ms"}, ["int", "long"]]},
                {"$gte": [
                    {"$add": [{"$toLong": {"$cond": [{"$eq": [{"$type": "$time"}, "date"]}, "$time", "$$NOW"]}}, {"$ifNull": ["$lease_ms", 0]}]},
                    {"$toLong": "$$NOW"},
                ]},
            ]},
        }},
    ];
    let mut cursor = store.slots().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        let seen = match d.get("robot_count") {
            Some(Bson::Int64(n)) => Some(*n),
            Some(Bson::Int32(n)) => Some(*n as i64),
            _ => None,
        };
        out.push(SlotLoad {
            id: d.get_str("_id").unwrap_or_default().to_string(),
            robots: seen.unwrap_or(0).max(0),
            live: d.get_bool("live").unwrap_or(false),
            seen,
        });
    }
    Ok(out)
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
        let all = loads(store).await?;
        if all.is_empty() {
            return Err(PlacementError::NoSlots);
        }
        let live: Vec<SlotLoad> = all.iter().filter(|s| s.live).cloned().collect();
        let no_live_slot = live.is_empty();
        let pool = if no_live_slot { all } else { live };
        let take = plan(&pool, n);
        let mut reserved: Vec<(usize, usize)> = Vec::new();
        let mut lost_race = false;
        for (i, k) in take.iter().enumerate().filter(|(_, k)| **k > 0) {
            let s = &pool[i];
            let filter = match s.seen {
                Some(c) => doc! {"_id": &s.id, "robot_count": c},
                None => doc! {"_id": &s.id, "robot_count": {"$exists": false}},
            };
            let r = store
                .slots()
                .update_one(filter, doc! {"$inc": {"robot_count": *k as i64}})
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
        return Ok(Placement {
            slots,
            no_live_slot,
        });
    }
    Err(PlacementError::Contention)
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
        inc.insert("robot_count", delta);
    }
    if bump {
        inc.insert("rev", 1_i64);
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
        .update_many(doc! {"_id": {"$in": unique}}, doc! {"$inc": {"rev": 1_i64}})
        .await?;
    Ok(())
}

/// Sets every slot's `robot_count` to the true count (run by `init`, repairing drift
/// from hand edits).
pub async fn reconcile_counts(store: &Store) -> Result<(), mongodb::error::Error> {
    let mut counts = std::collections::HashMap::new();
    let mut cursor = store
        .robots()
        .aggregate(vec![doc! {"$group": {"_id": "$slot_id", "n": {"$sum": 1}}}])
        .await?;
    while let Some(d) = cursor.try_next().await? {
        if let Ok(id) = d.get_str("_id") {
            let n = match d.get("n") {
                Some(Bson::Int32(n)) => *n as i64,
                Some(Bson::Int64(n)) => *n,
                _ => 0,
            };
            counts.insert(id.to_string(), n);
        }
    }
    let mut slots = store
        .slots()
        .find(doc! {})
        .projection(doc! {"_id": 1})
        .await?;
    let mut ids = Vec::new();
    while let Some(d) = slots.try_next().await? {
        if let Ok(id) = d.get_str("_id") {
            ids.push(id.to_string());
        }
    }
    for id in ids {
        let n = counts.get(&id).copied().unwrap_or(0);
        store
            .slots()
            .update_one(doc! {"_id": &id}, doc! {"$set": {"robot_count": n}})
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(id: &str, robots: i64) -> SlotLoad {
        SlotLoad {
            id: id.into(),
            robots,
            live: true,
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
    }
}
