//! Robot documents as people's actions, the CLI and the dashboard read and write
//! them: by name, created in chunks, restarted, paused, updated, deleted. The
//! holder's fenced writes are in [`crate::db::context`] and [`crate::db::firing`].

use std::collections::{HashMap, HashSet};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{
    KIND, NAME, PAUSED, RECENT_ENDS, SLOT_ID, SPEC, START_REV, STATUS, UPDATE, UPDATE_RESULT,
};
use crate::db::robot_doc::RobotStatus;
use crate::db::store::{Store, CHUNK};

type Result<T> = std::result::Result<T, mongodb::error::Error>;

fn fields(names: &[&str]) -> Document {
    names
        .iter()
        .map(|f| (f.to_string(), Bson::Int32(1)))
        .collect()
}

/// The robot named `name`, with only `only` of its fields (and `_id`).
pub(crate) async fn by_name(store: &Store, name: &str, only: &[&str]) -> Result<Option<Document>> {
    store
        .robots()
        .find_one(doc! {NAME: name})
        .projection(fields(only))
        .await
}

/// The robot whose `_id` is `id`, with only `only` of its fields (and `_id`).
pub(crate) async fn by_id(store: &Store, id: &Bson, only: &[&str]) -> Result<Option<Document>> {
    store
        .robots()
        .find_one(doc! {"_id": id})
        .projection(fields(only))
        .await
}

/// The robot named `name`, whole.
pub(crate) async fn whole(store: &Store, name: &str) -> Result<Option<Document>> {
    store.robots().find_one(doc! {NAME: name}).await
}

/// Which of `ids` exist.
pub(crate) async fn existing_ids(store: &Store, ids: &[ObjectId]) -> Result<HashSet<ObjectId>> {
    let mut found = HashSet::new();
    for chunk in ids.chunks(CHUNK) {
        let mut cursor = store
            .robots()
            .find(doc! {"_id": {"$in": chunk}})
            .projection(doc! {"_id": 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            if let Ok(id) = d.get_object_id("_id") {
                found.insert(id);
            }
        }
    }
    Ok(found)
}

/// The robots of these names that exist (name, kind and spec), by name.
pub(crate) async fn named(store: &Store, names: &[String]) -> Result<HashMap<String, Document>> {
    let mut found = HashMap::new();
    for chunk in names.chunks(CHUNK) {
        let mut cursor = store
            .robots()
            .find(doc! {NAME: {"$in": chunk}})
            .projection(doc! {NAME: 1, KIND: 1, SPEC: 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            if let Ok(n) = d.get_str(NAME) {
                found.insert(n.to_string(), d);
            }
        }
    }
    Ok(found)
}

/// Inserts new robot documents in order, [`CHUNK`] at a time; stops at the first
/// failure.
pub(crate) async fn insert(store: &Store, docs: &[Document]) -> Result<()> {
    for chunk in docs.chunks(CHUNK) {
        store
            .robots()
            .insert_many(chunk.to_vec())
            .ordered(true)
            .await?;
    }
    Ok(())
}

/// Starts robot `id` afresh from its context: unpaused, pending, a new start
/// (its holder restarts it under a new generation) and a fresh restart budget.
pub(crate) async fn restart(store: &Store, id: &Bson) -> Result<()> {
    store
        .robots()
        .update_one(
            doc! {"_id": id},
            doc! {
                "$set": {PAUSED: false, STATUS: RobotStatus::Pending},
                "$inc": {START_REV: 1_i64},
                "$unset": {RECENT_ENDS: ""},
            },
        )
        .await?;
    Ok(())
}

/// Pauses robot `id` (its firing state marks the pause when `scheduled`, so the
/// firings of the pause are recorded skipped), or resumes it with a fresh restart
/// budget.
pub(crate) async fn set_paused(
    store: &Store,
    id: &Bson,
    paused: bool,
    scheduled: bool,
) -> Result<()> {
    let update = if paused {
        let mut update = doc! {"$set": {PAUSED: true, STATUS: RobotStatus::Paused}};
        if scheduled {
            crate::db::firing::mark_paused(&mut update);
        }
        update
    } else {
        doc! {"$set": {PAUSED: false, STATUS: RobotStatus::Pending}, "$unset": {RECENT_ENDS: ""}}
    };
    store.robots().update_one(doc! {"_id": id}, update).await?;
    Ok(())
}

/// Deletes robot `id`; whether it was there.
pub(crate) async fn delete(store: &Store, id: &Bson) -> Result<bool> {
    let r = store.robots().delete_one(doc! {"_id": id}).await?;
    Ok(r.deleted_count == 1)
}

/// Asks robot `id`'s holder to make its kind and spec these (`update_id` names the
/// request), only if they are still `old_kind` and `old_spec` and no other update
/// waits. False when either changed.
pub(crate) async fn ask_update(
    store: &Store,
    id: &Bson,
    (old_kind, old_spec): (&str, &Document),
    update_id: ObjectId,
    (kind, spec): (&str, Document),
) -> Result<bool> {
    let asked = store
        .robots()
        .update_one(
            doc! {
                "_id": id, KIND: old_kind, SPEC: old_spec.clone(),
                "$nor": [{"update.id": {"$type": "objectId"}, "update.kind": {"$type": "string"}, "update.spec": {"$type": "object"}}],
            },
            doc! {"$set": {UPDATE: {"id": update_id, KIND: kind, SPEC: spec}}},
        )
        .await?;
    Ok(asked.matched_count == 1)
}

/// The fields `robot update` reads of a robot: its slot, kind, spec, context and
/// any update waiting.
pub(crate) const UPDATE_FIELDS: [&str; 5] =
    [SLOT_ID, KIND, SPEC, crate::db::field::CONTEXT, UPDATE];

/// The fields of a holder's answer to an update.
pub(crate) const ANSWER_FIELDS: [&str; 1] = [UPDATE_RESULT];
