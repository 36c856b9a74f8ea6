//! `slotpool init`: collections, validators and indexes, and exactly the slots asked
//! for (growing adds slots; shrinking retires them safely, refused while a removed
//! slot has robots).

use std::collections::HashSet;

use serde::Serialize;

use crate::db::schema;
use crate::db::store::{slot_name, slot_width, Store, StoreError, MAX_SLOTS};

/// What `init` changed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct InitReport {
    pub(crate) total: u32,
    pub(crate) added: Vec<String>,
    pub(crate) removed: Vec<String>,
    /// Robots that were bound to a slot that no longer exists, now re-placed.
    pub(crate) rescued: u64,
    /// Slots whose `robot_count` was corrected.
    pub(crate) recounted: u64,
    /// Kept output of robots that no longer exist, removed.
    pub(crate) orphaned_output: u64,
}

/// Creates collections, validators and indexes, and makes exactly `count` slots
/// exist. Idempotent; growing adds slots, shrinking refuses while a removed slot
/// has robots.
pub async fn init(store: &Store, count: u32) -> Result<InitReport, StoreError> {
    if count == 0 || count > MAX_SLOTS {
        return Err(StoreError::SlotCount(count));
    }
    crate::db::schema::install(store).await?;
    resize_slots(store, count).await
}

async fn resize_slots(store: &Store, count: u32) -> Result<InitReport, StoreError> {
    let mut report = InitReport::default();
    let present = schema::slot_ids(store).await?;
    let width = slot_width(&present, count)?;
    let wanted: Vec<String> = (1..=count).map(|n| slot_name(n, width)).collect();
    let wanted_set: HashSet<&String> = wanted.iter().collect();
    let extra: Vec<String> = present
        .iter()
        .filter(|p| !wanted_set.contains(p))
        .cloned()
        .collect();
    if !extra.is_empty() {
        report.removed = schema::retire_slots(store, count, &extra).await?;
    }
    let present: HashSet<&String> = present.iter().collect();
    let missing: Vec<&String> = wanted.iter().filter(|id| !present.contains(id)).collect();
    report.added = schema::add_slots(store, &missing).await?;
    report.added.sort();
    report.total = count;
    // Robots left on a slot that is gone (a hand edit, an older version's
    // shrink) are re-placed; then the counts are made true.
    report.rescued = crate::pool::placement::rescue_all(store).await?;
    report.recounted = crate::db::robot_count::reconcile_counts(store).await?;
    report.orphaned_output = crate::db::output_log::remove_orphaned(store).await?;
    Ok(report)
}
