//! What placement stores: each slot's `robot_count` and its reservations, and the
//! binding of robots to slots. The choice of slots is in [`crate::pool::placement`];
//! every query it needs is here.

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{
    COST, DRAINING, EPOCH, EXPIRES_MS, NAME, OWNER, RETIRING, REV, ROBOT_COUNT, SLOT_ID, SPEC,
    STATUS, WORKER,
};
use crate::db::robot_count::reservation;
use crate::db::robot_doc::RobotStatus;
use crate::db::store::{int, Store, CHUNK};

type Result<T> = std::result::Result<T, mongodb::error::Error>;

/// A slot as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlotLoad {
    pub(crate) id: String,
    pub(crate) robots: i64,
    /// The `robot_count` value as read, None when the field is missing.
    pub(crate) seen: Option<i64>,
    /// Its holder, while its lease is live on the server's clock.
    pub(crate) holder: Option<String>,
    /// Its robots' cost as its holder last recorded it.
    pub(crate) cost: Option<crate::load::SlotCost>,
    /// What its robots' `spec.limits` declare, in all (see
    /// [`declared_limits`]; zero until the caller adds it).
    pub(crate) declared: crate::load::Cost,
}

/// The part of a slot filter that admits only slots robots may be placed on.
fn open_for_robots() -> Document {
    doc! {DRAINING: {"$ne": true}, RETIRING: {"$ne": true}}
}

/// Every slot robots may be placed on, with its load, by id.
pub(crate) async fn loads(store: &Store) -> Result<Vec<SlotLoad>> {
    let mut open = open_for_robots();
    open.insert("_id", doc! {"$type": "string"});
    let pipeline = vec![
        doc! {"$match": open},
        doc! {"$sort": {"_id": 1}},
        doc! {"$project": {
            ROBOT_COUNT: 1, OWNER: 1, COST: 1,
            "live": {"$gt": [{"$ifNull": [format!("${EXPIRES_MS}"), 0_i64]}, {"$toLong": "$$NOW"}]},
        }},
    ];
    let mut cursor = store.slots().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        let seen = int(&d, ROBOT_COUNT);
        let live = matches!(d.get("live"), Some(Bson::Boolean(true)));
        out.push(SlotLoad {
            id: d.get_str("_id").unwrap_or_default().to_string(),
            robots: seen.unwrap_or(0).max(0),
            seen,
            holder: d.get_str(OWNER).ok().filter(|_| live).map(str::to_string),
            cost: crate::db::load::cost_of(&d),
            declared: crate::load::Cost::default(),
        });
    }
    Ok(out)
}

/// Reserves room for `k` robots on `slot` if its count is still the one `slot` was
/// read with and it still takes robots: a compare-and-set; false when another
/// create or move got there first.
pub(crate) async fn reserve_as_seen(store: &Store, slot: &SlotLoad, k: i64) -> Result<bool> {
    let mut filter = match slot.seen {
        Some(c) => doc! {"_id": &slot.id, ROBOT_COUNT: c},
        None => doc! {"_id": &slot.id, ROBOT_COUNT: {"$exists": false}},
    };
    filter.extend(open_for_robots());
    let r = store.slots().update_one(filter, reservation(k)).await?;
    Ok(r.modified_count == 1)
}

/// Why a slot took no reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    NoSuchSlot,
    /// Draining or retiring.
    Closed,
}

/// Reserves room for `k` robots on `slot` whatever its count, atomically with the
/// check that it takes robots: a drain or a retirement after this sees it.
pub(crate) async fn reserve(
    store: &Store,
    slot: &str,
    k: i64,
) -> Result<std::result::Result<(), Refused>> {
    let mut filter = doc! {"_id": slot};
    filter.extend(open_for_robots());
    if store
        .slots()
        .update_one(filter, reservation(k))
        .await?
        .matched_count
        == 1
    {
        return Ok(Ok(()));
    }
    let found = store
        .slots()
        .find_one(doc! {"_id": slot})
        .projection(doc! {"_id": 1})
        .await?;
    Ok(Err(match found {
        None => Refused::NoSuchSlot,
        Some(_) => Refused::Closed,
    }))
}

/// Changes a slot's `robot_count` by `delta`, bumping `rev` when `bump` (its
/// holder then reads its robots again).
pub(crate) async fn adjust(store: &Store, slot: &str, delta: i64, bump: bool) -> Result<()> {
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
pub(crate) async fn bump_revs(store: &Store, slots: &[String]) -> Result<()> {
    let mut unique: Vec<&String> = slots.iter().collect();
    unique.sort();
    unique.dedup();
    store
        .slots()
        .update_many(doc! {"_id": {"$in": unique}}, doc! {"$inc": {REV: 1_i64}})
        .await?;
    Ok(())
}

/// Those of `slots` that exist and are not retiring.
pub(crate) async fn standing(store: &Store, slots: &[String]) -> Result<Vec<String>> {
    slot_ids(store, doc! {"_id": {"$in": slots}, RETIRING: {"$ne": true}}).await
}

/// Every slot that is not retiring.
pub(crate) async fn all_standing(store: &Store) -> Result<Vec<String>> {
    slot_ids(store, doc! {RETIRING: {"$ne": true}}).await
}

async fn slot_ids(store: &Store, filter: Document) -> Result<Vec<String>> {
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

/// The update that binds robots to slot `to`: epoch back to 0 so `to`'s holder
/// adopts them (raising their generation, which fences every instance that ran
/// before), no worker, and `pending` unless paused.
fn rebind_to(to: &str) -> Vec<Document> {
    vec![doc! {"$set": {
        SLOT_ID: {"$literal": to}, EPOCH: 0_i64, WORKER: Bson::Null,
        STATUS: {"$cond": [{"$eq": ["$paused", true]}, RobotStatus::Paused, RobotStatus::Pending]},
    }}]
}

/// Binds those of `ids` still on `from` to `to`; how many moved.
pub(crate) async fn rebind(store: &Store, ids: &[ObjectId], from: &str, to: &str) -> Result<u64> {
    let r = store
        .robots()
        .update_many(doc! {"_id": {"$in": ids}, SLOT_ID: from}, rebind_to(to))
        .await?;
    Ok(r.modified_count)
}

/// Those of `ids` bound to one of `slots`, with their slot.
pub(crate) async fn bound_to(
    store: &Store,
    ids: &[ObjectId],
    slots: &[&String],
) -> Result<Vec<(ObjectId, String)>> {
    let mut found = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let mut cursor = store
            .robots()
            .find(doc! {"_id": {"$in": chunk}, SLOT_ID: {"$in": slots}})
            .projection(doc! {SLOT_ID: 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            if let (Ok(id), Ok(slot)) = (d.get_object_id("_id"), d.get_str(SLOT_ID)) {
                found.push((id, slot.to_string()));
            }
        }
    }
    Ok(found)
}

/// Every robot bound to none of `slots`, with its slot (None when it has none, or
/// not a string).
pub(crate) async fn stranded(
    store: &Store,
    slots: &[String],
) -> Result<Vec<(ObjectId, Option<String>)>> {
    // Through the slot_id index: its keys outside `slots` are the stranded robots.
    let docs = crate::db::indexed::find(
        store,
        crate::db::indexed::BY_SLOT,
        doc! {SLOT_ID: {"$nin": slots}},
        doc! {"_id": 1, SLOT_ID: 1},
    )
    .await?;
    Ok(docs
        .iter()
        .filter_map(|d| {
            let id = d.get_object_id("_id").ok()?;
            Some((id, d.get_str(SLOT_ID).ok().map(str::to_string)))
        })
        .collect())
}

/// `k` robots of slot `from` not among `taken`, by name, last first (so a plan
/// reads the same twice).
pub(crate) async fn pick(
    store: &Store,
    from: &str,
    k: usize,
    taken: &[ObjectId],
) -> Result<Vec<(ObjectId, String)>> {
    let docs: Vec<Document> = store
        .robots()
        .find(doc! {SLOT_ID: from, "_id": {"$nin": taken}})
        .projection(doc! {"_id": 1, NAME: 1})
        .sort(doc! {NAME: -1})
        .limit(k as i64)
        .await?
        .try_collect()
        .await?;
    Ok(with_text(&docs, NAME))
}

/// Every robot whose spec declares `limits`, as its slot and its `spec.limits`:
/// what placement counts for robots no holder has measured yet. Usually few: only
/// robots that declare limits are read, through the index that holds only them.
pub(crate) async fn declared_limits(store: &Store) -> Result<Vec<(String, Document)>> {
    let docs = crate::db::indexed::find(
        store,
        crate::db::indexed::DECLARES_LIMITS,
        crate::db::indexed::declares_limits_filter(),
        doc! {SLOT_ID: 1, "spec.limits": 1},
    )
    .await?;
    Ok(docs
        .iter()
        .filter_map(|d| {
            let slot = d.get_str(SLOT_ID).ok()?.to_string();
            let limits = d
                .get_document(SPEC)
                .ok()?
                .get_document("limits")
                .ok()?
                .clone();
            Some((slot, limits))
        })
        .collect())
}

/// Those of the robots named `names` still bound to slot `from`, with their names.
pub(crate) async fn named_on(
    store: &Store,
    from: &str,
    names: &[String],
) -> Result<Vec<(ObjectId, String)>> {
    let docs: Vec<Document> = store
        .robots()
        .find(doc! {SLOT_ID: from, NAME: {"$in": names}})
        .projection(doc! {"_id": 1, NAME: 1})
        .sort(doc! {NAME: 1})
        .await?
        .try_collect()
        .await?;
    Ok(with_text(&docs, NAME))
}

/// Each document's ObjectId `_id` with its text `field` (empty when it is none).
fn with_text(docs: &[Document], field: &str) -> Vec<(ObjectId, String)> {
    docs.iter()
        .filter_map(|d| {
            let id = d.get_object_id("_id").ok()?;
            Some((id, d.get_str(field).unwrap_or_default().to_string()))
        })
        .collect()
}

/// Drains slot `slot` (its holder stops the robots and releases it; no worker
/// claims it) or lets workers claim it again. None when there is no such slot,
/// else whether it changed.
pub(crate) async fn set_draining(store: &Store, slot: &str, on: bool) -> Result<Option<bool>> {
    let r = store
        .slots()
        .update_one(doc! {"_id": slot}, doc! {"$set": {DRAINING: on}})
        .await?;
    Ok((r.matched_count == 1).then_some(r.modified_count == 1))
}
