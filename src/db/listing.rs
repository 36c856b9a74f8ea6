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
/// worth reading); `n` the count. The counts come from one read that touches no
/// robot document: a group over the [`indexed::SLOT_STATE`] index's own fields. The
/// failed robots' errors come from a second, through [`indexed::FAILED`], and only
/// split the first read's failed counts ([`with_errors`]).
pub(crate) async fn robots_by_state(store: &Store) -> Result<Vec<Document>> {
    let key =
        doc! {"slot": "$slot_id", "status": "$status", "paused": "$paused", "worker": "$worker"};
    let groups = indexed::aggregate(
        store,
        indexed::SLOT_STATE,
        vec![
            doc! {"$project": {"_id": 0, SLOT_ID: 1, STATUS: 1, PAUSED: 1, WORKER: 1}},
            doc! {"$group": {"_id": key.clone(), "n": {"$sum": 1}}},
        ],
    )
    .await?;
    let mut by_error = key;
    by_error.insert("error", "$error");
    let failed = indexed::aggregate(
        store,
        indexed::FAILED,
        vec![
            doc! {"$match": indexed::failed_filter()},
            doc! {"$group": {"_id": by_error, "n": {"$sum": 1}}},
        ],
    )
    .await?;
    Ok(with_errors(groups, &failed))
}

/// `groups` with each failed group's count split by the error texts `failed` found
/// for the same slot, paused flag and worker: the most common first, never more
/// than the group's own count (a robot that failed between the two reads adds
/// nothing), and what `failed` does not account for (one that left `failed`
/// meanwhile) kept without a text.
fn with_errors(groups: Vec<Document>, failed: &[Document]) -> Vec<Document> {
    const SAME: [&str; 4] = ["slot", "status", "paused", "worker"];
    let n_of = |d: &Document| crate::db::store::int(d, "n").unwrap_or(0);
    let status_failed = RobotStatus::Failed.as_str();
    let mut out = Vec::with_capacity(groups.len());
    for group in groups {
        let key = group.get_document("_id").cloned().unwrap_or_default();
        if key.get_str("status") != Ok(status_failed) {
            out.push(group);
            continue;
        }
        let mut texts: Vec<(&Document, i64)> = failed
            .iter()
            .filter_map(|f| {
                let k = f.get_document("_id").ok()?;
                SAME.iter()
                    .all(|field| k.get(*field) == key.get(*field))
                    .then(|| (k, n_of(f)))
            })
            .collect();
        texts.sort_by_key(|t| std::cmp::Reverse(t.1));
        let mut left = n_of(&group);
        for (k, n) in texts {
            let take = n.min(left);
            if take > 0 {
                out.push(doc! {"_id": k.clone(), "n": take});
                left -= take;
            }
        }
        if left > 0 {
            out.push(doc! {"_id": key, "n": left});
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn group(slot: &str, status: &str, n: i64) -> Document {
        doc! {"_id": {"slot": slot, "status": status, "paused": false, "worker": "w1"}, "n": n}
    }

    fn failed(slot: &str, error: &str, n: i64) -> Document {
        doc! {"_id": {"slot": slot, "status": "failed", "paused": false, "worker": "w1", "error": error}, "n": n}
    }

    fn counts(docs: &[Document]) -> Vec<(String, Option<String>, i64)> {
        let mut v: Vec<_> = docs
            .iter()
            .map(|d| {
                let k = d.get_document("_id").unwrap();
                (
                    format!(
                        "{}/{}",
                        k.get_str("slot").unwrap(),
                        k.get_str("status").unwrap()
                    ),
                    k.get_str("error").ok().map(str::to_string),
                    d.get_i64("n").unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_counts_are_the_first_reads_and_the_errors_only_split_them() {
        let groups = vec![
            group("s1", "running", 5),
            group("s1", "failed", 3),
            group("s2", "failed", 1),
        ];
        // s1: one more failed between the reads (4 texts for 3); s2: its one left
        // failed meanwhile; s3's failure came after the first read.
        let errors = [
            failed("s1", "boom", 3),
            failed("s1", "bang", 1),
            failed("s3", "late", 1),
        ];
        assert_eq!(
            counts(&with_errors(groups, &errors)),
            vec![
                ("s1/failed".into(), Some("boom".into()), 3),
                ("s1/running".into(), None, 5),
                ("s2/failed".into(), None, 1),
            ]
        );
    }

    #[test]
    fn a_failed_group_the_errors_do_not_cover_keeps_its_count() {
        let groups = vec![group("s1", "failed", 4)];
        let errors = [failed("s1", "boom", 1), failed("s1", "bang", 2)];
        assert_eq!(
            counts(&with_errors(groups, &errors)),
            vec![
                ("s1/failed".into(), None, 1),
                ("s1/failed".into(), Some("bang".into()), 2),
                ("s1/failed".into(), Some("boom".into()), 1),
            ]
        );
    }
}
