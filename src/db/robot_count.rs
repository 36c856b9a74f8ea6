//! A slot's `robot_count`: how many robots placement believes are bound to it. A
//! create or move *reserves* room ([`reservation`], a compare-and-set in
//! [`crate::pool::placement`]) before its robots are written, so the count may run
//! ahead of the robots for a while; the holder that reads its slot's robots
//! ([`heal_count`]) and `init` ([`reconcile_counts`]) bring it back to the truth,
//! lowering it only once no reservation is recent.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{ROBOT_COUNT, SLOT_ID};
use crate::db::store::{int, Store};

/// When a slot's room was last reserved (server clock).
const RESERVED_AT: &str = "reserved_at";

/// Room for `k` more robots, stamped with the server's time: until
/// [`STALE_RESERVATION`] has passed, a count above the true one may be robots
/// still being written, and [`reconcile_counts`] leaves it alone.
pub(crate) fn reservation(k: i64) -> Document {
    doc! {"$inc": {ROBOT_COUNT: k}, "$currentDate": {RESERVED_AT: true}}
}

/// How long after its last reservation a slot's count may include robots that
/// are still being created or moved (a 100,000-robot create takes minutes).
pub(crate) const STALE_RESERVATION: std::time::Duration = std::time::Duration::from_secs(600);

/// Robots per slot, counted from the robots themselves (not `robot_count`).
pub(crate) async fn true_counts(
    store: &Store,
) -> Result<std::collections::HashMap<String, i64>, mongodb::error::Error> {
    let mut counts = std::collections::HashMap::new();
    // From the slot_state index alone (its first field), no robot document read.
    let groups = crate::db::indexed::aggregate(
        store,
        crate::db::indexed::SLOT_STATE,
        vec![
            doc! {"$project": {"_id": 0, SLOT_ID: 1}},
            doc! {"$group": {"_id": "$slot_id", "n": {"$sum": 1}}},
        ],
    )
    .await?;
    for d in groups {
        if let Ok(id) = d.get_str("_id") {
            let n = int(&d, "n").unwrap_or(0);
            counts.insert(id.to_string(), n);
        }
    }
    Ok(counts)
}

/// Makes one slot's `robot_count` the count its holder just read, `truth`, in one
/// conditional write judged on the server's clock: raised at once when below it,
/// lowered only when the slot saw no reservation for [`STALE_RESERVATION`] (a create
/// in flight may have reserved room for robots not yet written). So a create cut
/// off by a long outage stops skewing placement by itself, without an operator.
/// Returns whether the count changed.
pub(crate) async fn heal_count(
    store: &Store,
    slot: &str,
    truth: i64,
) -> Result<bool, mongodb::error::Error> {
    let stale_ms = STALE_RESERVATION.as_millis() as i64;
    let filter = doc! {
        "_id": slot,
        ROBOT_COUNT: {"$ne": truth},
        "$expr": {"$or": [
            {"$lt": ["$robot_count", truth]},
            {"$eq": [{"$type": "$reserved_at"}, "missing"]},
            {"$lt": [
                {"$toLong": "$reserved_at"},
                {"$subtract": [{"$toLong": "$$NOW"}, stale_ms]},
            ]},
        ]},
    };
    let r = store
        .slots()
        .update_one(filter, doc! {"$set": {ROBOT_COUNT: truth}})
        .await?;
    Ok(r.modified_count == 1)
}

/// Makes each slot's `robot_count` the true count of its robots (run by `init`),
/// repairing drift from hand edits and from creates that died half-way. Without
/// stopping anyone: a count below the truth is raised at once (in-flight work only
/// ever makes a count too high); a count above it is lowered only when the slot
/// saw no reservation for [`STALE_RESERVATION`], since until then the excess may be
/// robots being written right now. Each write is conditional on the count it read.
/// Returns how many slots were corrected.
pub(crate) async fn reconcile_counts(store: &Store) -> Result<u64, mongodb::error::Error> {
    let mut slots: Vec<Document> = store
        .slots()
        .find(doc! {})
        .projection(doc! {"_id": 1, ROBOT_COUNT: 1, RESERVED_AT: 1})
        .await?
        .try_collect()
        .await?;
    slots.retain(|d| d.get_str("_id").is_ok());
    let truth = true_counts(store).await?;
    let now = store.server_now().await?;
    let mut fixed = 0;
    for slot in slots {
        let id = slot.get_str("_id").unwrap_or_default();
        let seen = slot.get(ROBOT_COUNT).cloned();
        let count = int(&slot, ROBOT_COUNT).unwrap_or(-1);
        let t = truth.get(id).copied().unwrap_or(0);
        if count == t {
            continue;
        }
        let mut filter = doc! {"_id": id, ROBOT_COUNT: seen.clone().unwrap_or(Bson::Null)};
        if seen.is_none() {
            filter.insert(ROBOT_COUNT, doc! {"$exists": false});
        }
        if count > t {
            let reserved_at = slot.get_datetime(RESERVED_AT).ok().copied();
            let quiet = reserved_at.is_none_or(|at| {
                now.timestamp_millis() - at.timestamp_millis()
                    > STALE_RESERVATION.as_millis() as i64
            });
            if !quiet {
                continue;
            }
            filter.insert(RESERVED_AT, reserved_at.map_or(Bson::Null, Bson::DateTime));
        }
        let r = store
            .slots()
            .update_one(filter, doc! {"$set": {ROBOT_COUNT: t}})
            .await?;
        fixed += r.modified_count;
    }
    Ok(fixed)
}
