//! What people look at, read as the CLI's listings and the dashboard need it: slots
//! with their lease age, robots with their checkpoint age or counted by state, a
//! robot with its kept output, and the event log read forward by `_id`. Each read
//! judges ages on the server's clock (`$$NOW`).

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{
    EPOCH, ERROR, GEN, KIND, NAME, PAUSED, RESTARTS, SEQ, SLOT_ID, STATUS, WORKER,
};
use crate::db::indexed;
use crate::db::robot_doc::RobotStatus;
use crate::db::store::Store;

type Result<T> = std::result::Result<T, mongodb::error::Error>;

/// The age on the server's clock of date field `field`, in ms (null when it is no
/// date).
fn age_ms(field: &str) -> Document {
    doc! {"$cond": [
        {"$eq": [{"$type": format!("${field}")}, "date"]},
        {"$subtract": [{"$toLong": "$$NOW"}, {"$toLong": format!("${field}")}]},
        Bson::Null,
    ]}
}

/// Every slot by id, with `_age_ms`: how long ago its lease was stamped.
pub(crate) async fn slots_aged(store: &Store) -> Result<Vec<Document>> {
    store
        .slots()
        .aggregate(vec![
            doc! {"$sort": {"_id": 1}},
            doc! {"$addFields": {"_age_ms": age_ms(crate::db::field::TIME)}},
        ])
        .await?
        .try_collect()
        .await
}

/// The robots (of `slot`, or all) by name, with what `robot list` shows and
/// `checkpoint_age_ms`.
pub(crate) async fn robots_listed(store: &Store, slot: Option<&str>) -> Result<Vec<Document>> {
    let filter = match slot {
        Some(s) => doc! {SLOT_ID: s},
        None => doc! {},
    };
    store
        .robots()
        .aggregate(vec![
            doc! {"$match": filter},
            doc! {"$sort": {NAME: 1}},
            doc! {"$project": {
                NAME: 1, KIND: 1, SLOT_ID: 1, STATUS: 1, ERROR: 1, SEQ: 1, PAUSED: 1,
                EPOCH: 1, GEN: 1, RESTARTS: 1, WORKER: 1,
                "checkpoint_age_ms": age_ms(crate::db::field::CHECKPOINTED_AT),
            }},
        ])
        .await?
        .try_collect()
        .await
}

/// The robots counted by state: each document's `_id` holds `slot`, `status`,
/// `paused`, `worker` and, for a failed robot, its `error` (few distinct texts, each
/// worth reading); `n` the count. Two reads that touch no robot document but the
/// failed ones: a group over the [`indexed::SLOT_STATE`] index's own fields, and the
/// failed robots through [`indexed::FAILED`] (they replace the first read's failed
/// groups).
pub(crate) async fn robots_by_state(store: &Store) -> Result<Vec<Document>> {
    let key =
        doc! {"slot": "$slot_id", "status": "$status", "paused": "$paused", "worker": "$worker"};
    let mut all: Vec<Document> = indexed::aggregate(
        store,
        indexed::SLOT_STATE,
        vec![
            doc! {"$project": {"_id": 0, SLOT_ID: 1, STATUS: 1, PAUSED: 1, WORKER: 1}},
            doc! {"$group": {"_id": key.clone(), "n": {"$sum": 1}}},
        ],
    )
    .await?;
    let failed = RobotStatus::Failed.as_str();
    all.retain(|d| {
        d.get_document("_id")
            .map_or(true, |k| k.get_str("status") != Ok(failed))
    });
    let mut with_error = key;
    with_error.insert("error", "$error");
    all.extend(
        indexed::aggregate(
            store,
            indexed::FAILED,
            vec![
                doc! {"$match": indexed::failed_filter()},
                doc! {"$group": {"_id": with_error, "n": {"$sum": 1}}},
            ],
        )
        .await?,
    );
    Ok(all)
}

/// The dashboard's rows of the robots bound to `slot` (see
/// [`crate::db::robot_doc::list_row_projection`]).
pub(crate) async fn rows_on(store: &Store, slot: &str) -> Result<Vec<Document>> {
    store
        .robots()
        .find(doc! {SLOT_ID: slot})
        .projection(crate::db::robot_doc::list_row_projection())
        .await?
        .try_collect()
        .await
}

/// About how many robots there are (the collection's count, not a scan).
pub(crate) async fn robots_about(store: &Store) -> Result<u64> {
    store.robots().estimated_document_count().await
}

/// The robot named `name`, whole, with its kept output document if it has one.
pub(crate) async fn robot_with_output(
    store: &Store,
    name: &str,
) -> Result<Option<(Document, Option<Document>)>> {
    let Some(robot) = crate::db::robots::whole(store, name).await? else {
        return Ok(None);
    };
    let output = match robot.get("_id") {
        Some(id) => crate::db::output_log::kept(store, id).await?,
        None => None,
    };
    Ok(Some((robot, output)))
}

/// Up to `limit` events whose `_id` is above `after` (of `kinds`, or any), oldest
/// first or newest first. A range of `_id` stays small whatever the size of the
/// capped log.
pub(crate) async fn events_after(
    store: &Store,
    after: ObjectId,
    kinds: Option<&[crate::db::event::EventKind]>,
    newest_first: bool,
    limit: i64,
) -> Result<Vec<Document>> {
    let mut filter = doc! {"_id": {"$gt": after}};
    if let Some(kinds) = kinds {
        filter.insert(KIND, doc! {"$in": kinds.to_vec()});
    }
    store
        .events()
        .find(filter)
        .sort(doc! {"_id": if newest_first { -1 } else { 1 }})
        .limit(limit)
        .await?
        .try_collect()
        .await
}
