//! Least-loaded slot choice for new robots (every non-draining slot counts, held or
//! not), safe under concurrent creates, and the rebalance plans that even robots out.
//!
//! "Least loaded" is by the holders' load scores ([`crate::load`]) when every slot
//! has a live holder whose heartbeat carries one ([`plan_by_load`]), else by robot
//! counts ([`plan`]). `--by count` asks for counts.
//!
//! A create reserves room with a compare-and-set on the slot's `robot_count` as seen,
//! so two creates cannot both take the emptiest slot; `rev` is bumped only once the
//! robots exist. `init` retires a slot, checks it is empty, then deletes it; a create
//! or move checks after its own write that its slot is not retiring, else re-places
//! ([`rescue`]). Each side checks after its own write, so one of them always sees the
//! other: no robot is left bound to a missing slot.

use std::collections::HashMap;

use crate::db::placement as stored;
pub(crate) use crate::db::placement::{adjust, bump_revs, SlotLoad};
use crate::db::store::Store;
use crate::load::{Cost, Load};
pub(crate) use crate::pool::load_plan::{plan_by_load, plan_load_rebalance, LOAD_BAND};

#[derive(Debug, thiserror::Error)]
pub(crate) enum PlacementError {
    #[error("no slots to place robots on: run `slotpool init --slots N` first (draining slots are not used)")]
    NoSlots,
    #[error("too much contention placing robots; try again")]
    Contention,
    #[error("database error: {0}")]
    Db(#[from] mongodb::error::Error),
}

/// Where robots went.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placement {
    /// Slot per robot, in creation order.
    pub(crate) slots: Vec<String>,
}

/// Reads every non-draining slot's load.
pub(crate) async fn loads(store: &Store) -> Result<Vec<SlotLoad>, PlacementError> {
    Ok(stored::loads(store).await?)
}

/// What placement and rebalance go by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum PlaceBy {
    /// The holders' load scores, each slot's measured cost and the new robots'
    /// declared limits; robot counts where a slot's holder is unknown.
    #[default]
    Load,
    /// Robot counts only.
    Count,
}

/// What each slot's robots declare in their `spec.limits`, by slot: what a robot
/// weighs before its holder has measured it, for placement by load. A limits
/// document that does not parse counts as none.
pub(crate) async fn declared_by_slot(
    store: &Store,
) -> Result<HashMap<String, Cost>, PlacementError> {
    let mut out: HashMap<String, Cost> = HashMap::new();
    for (slot, limits) in stored::declared_limits(store).await? {
        let l = crate::robot::limits::Limits::from_doc(&limits, "spec.limits").unwrap_or_default();
        let c = out.entry(slot).or_default();
        *c = *c
            + Cost {
                robots: 1,
                millicores: l.cpu_millis.unwrap_or(0),
                memory_bytes: l.memory.unwrap_or(0),
            };
    }
    Ok(out)
}

/// Sets each slot's declared cost from [`declared_by_slot`].
pub(crate) fn with_declared(slots: &mut [SlotLoad], declared: &HashMap<String, Cost>) {
    for s in slots {
        s.declared = declared.get(&s.id).copied().unwrap_or_default();
    }
}

/// Every live worker's load, by id, from the heartbeats.
pub(crate) async fn holder_loads(store: &Store) -> Result<HashMap<String, Load>, PlacementError> {
    let workers = crate::db::heartbeat::live_workers(store).await?;
    Ok(crate::pool::view::loads(&workers))
}

/// Spreads `n` robots over `slots`, filling the emptiest first (ties by id).
pub(crate) fn plan(slots: &[SlotLoad], n: usize) -> Vec<usize> {
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

/// Reserves room for `n` robots, each expected to cost `each` (its declared
/// limits), and returns a slot per robot, placed `by` the holders' load or by
/// counts. The caller inserts the robots, then calls [`bump_revs`] (or [`adjust`]
/// back for those that failed).
pub(crate) async fn reserve(
    store: &Store,
    n: usize,
    each: Cost,
    by: PlaceBy,
) -> Result<Placement, PlacementError> {
    let (holders, declared) = match by {
        PlaceBy::Load => (holder_loads(store).await?, declared_by_slot(store).await?),
        PlaceBy::Count => (HashMap::new(), HashMap::new()),
    };
    for _round in 0..50 {
        let mut pool = loads(store).await?;
        with_declared(&mut pool, &declared);
        if pool.is_empty() {
            return Err(PlacementError::NoSlots);
        }
        let take = match by {
            PlaceBy::Load => plan_by_load(&pool, &holders, n, each),
            PlaceBy::Count => None,
        }
        .unwrap_or_else(|| plan(&pool, n));
        let mut reserved: Vec<(usize, usize)> = Vec::new();
        let mut lost_race = false;
        for (i, k) in take.iter().enumerate().filter(|(_, k)| **k > 0) {
            if stored::reserve_as_seen(store, &pool[i], *k as i64).await? {
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
pub(crate) fn rebalance_plan(
    counts: &[(String, i64)],
    max_moves: usize,
) -> Vec<(String, String, usize)> {
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
pub(crate) enum MoveError {
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
pub(crate) async fn move_robots(
    store: &Store,
    ids: &[bson::oid::ObjectId],
    from: &str,
    to: &str,
) -> Result<u64, MoveError> {
    // Reserve room first, atomically with the check that `to` takes robots: a
    // drain or a retirement after this point sees the reservation.
    let k = ids.len() as i64;
    match stored::reserve(store, to, k).await? {
        Ok(()) => {}
        Err(stored::Refused::NoSuchSlot) => return Err(MoveError::NoSuchSlot(to.to_string())),
        Err(stored::Refused::Closed) => return Err(MoveError::Draining(to.to_string())),
    }
    let moved = stored::rebind(store, ids, from, to).await? as i64;
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
pub(crate) async fn rescue(
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
        let fine = stored::standing(store, &slots).await?;
        let gone: Vec<&String> = slots.iter().filter(|s| !fine.contains(s)).collect();
        if gone.is_empty() {
            return Ok(rescued);
        }
        let lost = stored::bound_to(store, &ids, &gone).await?;
        if lost.is_empty() {
            return Ok(rescued);
        }
        let placement = match reserve(store, lost.len(), Cost::default(), PlaceBy::Load).await {
            Ok(p) => p,
            Err(PlacementError::Db(e)) => return Err(e),
            Err(_) => return Ok(rescued),
        };
        let mut moved = Vec::new();
        for ((id, old), new) in lost.iter().zip(&placement.slots) {
            if stored::rebind(store, &[*id], old, new).await? == 1 {
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

/// Re-places every robot bound to a slot that does not exist or is retiring.
pub(crate) async fn rescue_all(store: &Store) -> Result<u64, mongodb::error::Error> {
    let existing = stored::all_standing(store).await?;
    let stranded = stored::stranded(store, &existing).await?;
    if stranded.is_empty() {
        return Ok(0);
    }
    let ids: Vec<bson::oid::ObjectId> = stranded.iter().map(|(id, _)| *id).collect();
    let slots: Vec<String> = stranded.into_iter().filter_map(|(_, slot)| slot).collect();
    rescue(store, &ids, &slots).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(id: &str, robots: i64) -> SlotLoad {
        SlotLoad {
            id: id.into(),
            robots,
            seen: Some(robots),
            holder: None,
            cost: None,
            declared: Cost::default(),
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
