//! The database's shape: collections with their validators, indexes, and the slot
//! documents themselves as `slotpool init` makes and retires them.

use std::collections::HashSet;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::IndexModel;

use crate::db::field::{
    DRAINING, EPOCH, EXPIRES_MS, IP, NAME, OWNER, PORT, RETIRING, REV, ROBOT_COUNT, SLOT_ID, TIME,
};
use crate::db::store::{is_namespace_exists, Store, StoreError, EVENTS, ROBOTS, SLOTS, WORKERS};

const EVENTS_CAP_BYTES: i64 = 16 * 1024 * 1024;

const SCHEMAS: [(&str, &str); 4] = [
    (SLOTS, include_str!("../../schemas/slots.json")),
    (ROBOTS, include_str!("../../schemas/robots.json")),
    (WORKERS, include_str!("../../schemas/workers.json")),
    (EVENTS, include_str!("../../schemas/events.json")),
];

/// Creates the collections that are missing, sets every validator, and creates the
/// indexes. Idempotent, and safe beside another `init`.
pub(crate) async fn install(store: &Store) -> Result<(), StoreError> {
    install_schemas(store).await?;
    create_indexes(store).await
}

async fn install_schemas(store: &Store) -> Result<(), StoreError> {
    let db = store.db();
    let existing = db.list_collection_names().await?;
    for (name, schema) in SCHEMAS {
        let validator: Document = serde_json::from_str::<serde_json::Value>(schema)
            .ok()
            .and_then(|v| bson::to_document(&v).ok())
            .expect("schemas/*.json are valid JSON objects, checked by tests");
        if !existing.iter().any(|c| c == name) {
            let create = db.create_collection(name);
            let create = if name == EVENTS {
                create.capped(true).size(EVENTS_CAP_BYTES as u64)
            } else {
                create
            };
            if let Err(e) = create.await {
                // Another `init` may have created it between the list and here.
                if !is_namespace_exists(&e) {
                    return Err(e.into());
                }
            }
        }
        store
            .db()
            .run_command(doc! {
                "collMod": name,
                "validator": validator,
                // moderate: a document someone hand-edited past the validator
                // can still be updated (fenced, status), so one broken robot
                // cannot block its slot; valid documents cannot turn invalid.
                "validationLevel": "moderate",
                "validationAction": "error",
            })
            .await?;
    }
    Ok(())
}

async fn create_indexes(store: &Store) -> Result<(), StoreError> {
    let unique = IndexOptions::builder().unique(true).build();
    store
        .robots()
        .create_index(
            IndexModel::builder()
                .keys(doc! {NAME: 1})
                .options(unique)
                .build(),
        )
        .await?;
    store
        .robots()
        .create_index(IndexModel::builder().keys(doc! {SLOT_ID: 1}).build())
        .await?;
    store
        .robots()
        .create_indexes(crate::db::indexed::models())
        .await?;
    store
        .workers()
        .create_index(IndexModel::builder().keys(doc! {SLOT_ID: 1}).build())
        .await?;
    crate::db::lease::ensure_indexes(store).await
}

/// The ids of every slot document.
pub(crate) async fn slot_ids(store: &Store) -> Result<Vec<String>, StoreError> {
    let mut present = Vec::new();
    let mut cursor = store
        .slots()
        .find(doc! {})
        .projection(doc! {"_id": 1})
        .await?;
    while let Some(d) = cursor.try_next().await? {
        if let Ok(id) = d.get_str("_id") {
            present.push(id.to_string());
        }
    }
    Ok(present)
}

/// Inserts vacant slots of these ids; the ids this call added (a slot another
/// `init` inserted meanwhile is not ours to report).
pub(crate) async fn add_slots(store: &Store, ids: &[&String]) -> Result<Vec<String>, StoreError> {
    let missing: Vec<Document> = ids
        .iter()
        .map(|id| {
            doc! {
                "_id": id, OWNER: Bson::Null, IP: Bson::Null, PORT: Bson::Null,
                TIME: Bson::Null, EXPIRES_MS: 0_i64, EPOCH: 0_i64, REV: 0_i64,
                DRAINING: false, ROBOT_COUNT: 0_i64,
            }
        })
        .collect();
    let mut added = Vec::new();
    // In chunks, unordered: a slot another `init` inserted meanwhile is a
    // duplicate-key error for that one document only.
    for chunk in missing.chunks(crate::db::store::CHUNK) {
        match store.slots().insert_many(chunk).ordered(false).await {
            Ok(r) => added.extend(
                r.inserted_ids
                    .values()
                    .filter_map(|v| v.as_str().map(str::to_string)),
            ),
            Err(e) => match e.kind.as_ref() {
                mongodb::error::ErrorKind::InsertMany(m)
                    if m.write_errors
                        .as_ref()
                        .is_some_and(|w| w.iter().all(|w| w.code == 11000)) =>
                {
                    let failed: HashSet<usize> =
                        m.write_errors.iter().flatten().map(|w| w.index).collect();
                    added.extend(
                        chunk
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| !failed.contains(i))
                            .filter_map(|(_, d)| d.get_str("_id").ok().map(str::to_string)),
                    );
                }
                _ => return Err(e.into()),
            },
        }
    }
    Ok(added)
}

/// Removes `extra` slots safely against concurrent creates and moves: retire
/// them (no reservation can land on a retiring slot), then check that no robot
/// is bound to them, then delete. A create or move that reserved before the
/// retirement either shows up in the check (and the shrink is refused) or sees
/// the retirement in its own check after writing, and re-places its robots
/// (see [`crate::pool::placement`]).
pub(crate) async fn retire_slots(
    store: &Store,
    wanted: u32,
    extra: &[String],
) -> Result<Vec<String>, StoreError> {
    store
        .slots()
        .update_many(
            doc! {"_id": {"$in": extra}},
            doc! {"$set": {RETIRING: true}},
        )
        .await?;
    let mut cursor = store
        .robots()
        .aggregate(vec![
            doc! {"$match": {SLOT_ID: {"$in": extra}}},
            doc! {"$group": {"_id": "$slot_id", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$limit": 1},
        ])
        .await?;
    use futures::TryStreamExt;
    if let Some(d) = cursor.try_next().await? {
        store
            .slots()
            .update_many(
                doc! {"_id": {"$in": extra}},
                doc! {"$unset": {RETIRING: ""}},
            )
            .await?;
        let robots = crate::db::store::int(&d, "n").map_or(1, |n| n.max(0) as u64);
        return Err(StoreError::ShrinkWithRobots {
            wanted,
            slot: d.get_str("_id").unwrap_or("?").to_string(),
            robots,
        });
    }
    store
        .slots()
        .delete_many(doc! {"_id": {"$in": extra}, RETIRING: true})
        .await?;
    Ok(extra.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_json_objects() {
        for (name, text) in SCHEMAS {
            let v: serde_json::Value = serde_json::from_str(text).expect(name);
            assert!(v.get("$jsonSchema").is_some(), "{name}");
        }
    }
}
