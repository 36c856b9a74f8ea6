//! The indexes that keep people's reads of `robots` off a full scan, and reads that
//! name the one they use.
//!
//! At 100,000 robots with contexts up to 1 MiB, a read that scans the collection
//! competes with every renewal for the server's disk and cache. `status`, the counts
//! behind `init` and `rebalance`, and placement read `robots` through these instead:
//! a group over [`SLOT_STATE`]'s fields alone is answered from the index (mongod's
//! covered plan, no document read), and the few robots that declare limits or failed
//! are read through partial indexes that hold only them. Each read names its index (a
//! hint), so no planner may choose a scan.
//!
//! `slotpool init` makes them. A pool whose database predates them (an `init` of an
//! older release) is read without the hint, with a warning that says to run `init`.

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::options::{Hint, IndexOptions};
use mongodb::IndexModel;

use crate::db::field::{PAUSED, SLOT_ID, STATUS, WORKER};
use crate::db::robot_doc::RobotStatus;
use crate::db::store::Store;

/// `{slot_id}` (its default name): a slot's robots, and the robots bound to no slot.
pub const BY_SLOT: &str = "slot_id_1";
/// `{slot_id, status, paused, worker}`: a slot's robots by state, and each slot's
/// robot count, read from the index alone.
pub const SLOT_STATE: &str = "slot_state";
/// The robots whose spec declares `limits` (partial: only they are in it).
pub const DECLARES_LIMITS: &str = "declares_limits";
/// The failed robots (partial), whose errors `status` shows.
pub const FAILED: &str = "failed_robots";

/// The filter [`DECLARES_LIMITS`] holds; a read through it must say the same.
pub(crate) fn declares_limits_filter() -> Document {
    doc! {"spec.limits": {"$type": "object"}}
}

/// The filter [`FAILED`] holds; a read through it must say the same.
pub(crate) fn failed_filter() -> Document {
    doc! {STATUS: RobotStatus::Failed.as_str()}
}

/// The three indexes, as `init` makes them.
pub(crate) fn models() -> Vec<IndexModel> {
    let named = |name: &str| IndexOptions::builder().name(name.to_string());
    vec![
        IndexModel::builder()
            .keys(doc! {SLOT_ID: 1, STATUS: 1, PAUSED: 1, WORKER: 1})
            .options(named(SLOT_STATE).build())
            .build(),
        IndexModel::builder()
            .keys(doc! {SLOT_ID: 1, "_id": 1})
            .options(
                named(DECLARES_LIMITS)
                    .partial_filter_expression(declares_limits_filter())
                    .build(),
            )
            .build(),
        // Keys of its own: mongod before 5.0 took no two indexes of one key pattern.
        IndexModel::builder()
            .keys(doc! {STATUS: 1, SLOT_ID: 1})
            .options(
                named(FAILED)
                    .partial_filter_expression(failed_filter())
                    .build(),
            )
            .build(),
    ]
}

/// Whether `e` is the server saying a hinted index does not exist (mongod: code 2
/// BadValue, "hint provided does not correspond to an existing index").
fn no_such_index(e: &mongodb::error::Error) -> bool {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => {
            c.code == 2 && c.message.to_ascii_lowercase().contains("hint")
        }
        _ => false,
    }
}

fn warn_missing(index: &str) {
    tracing::warn!(
        "the robots index {index} is missing (the database was set up by an older \
         slotpool init): reading without it, which scans every robot. Run \
         `slotpool init` to make it"
    );
}

/// `pipeline` over `robots` through the index named `index`.
pub(crate) async fn aggregate(
    store: &Store,
    index: &str,
    pipeline: Vec<Document>,
) -> mongodb::error::Result<Vec<Document>> {
    let hinted = store
        .robots()
        .aggregate(pipeline.clone())
        .hint(Hint::Name(index.to_string()))
        .await;
    let cursor = match hinted {
        Err(e) if no_such_index(&e) => {
            warn_missing(index);
            store.robots().aggregate(pipeline).await?
        }
        other => other?,
    };
    cursor.try_collect().await
}

/// `filter` over `robots`, only `projection`'s fields, through the index `index`.
pub(crate) async fn find(
    store: &Store,
    index: &str,
    filter: Document,
    projection: Document,
) -> mongodb::error::Result<Vec<Document>> {
    let hinted = store
        .robots()
        .find(filter.clone())
        .projection(projection.clone())
        .hint(Hint::Name(index.to_string()))
        .await;
    let cursor = match hinted {
        Err(e) if no_such_index(&e) => {
            warn_missing(index);
            store.robots().find(filter).projection(projection).await?
        }
        other => other?,
    };
    cursor.try_collect().await
}
