//! A slot document as people look at it (the CLI, the dashboard, the pool's view):
//! decoded leniently, since anyone with the mongo shell may have edited it.

use bson::{Bson, Document};

use crate::db::field::{DRAINING, EPOCH, LEASE_MS, OWNER, REV, ROBOT_COUNT, SUSPEND_MS};
use crate::db::store::int;

/// A slot document, decoded leniently for the people who look at it (the CLI, the
/// dashboard): a hand-edited slot is shown, not dropped. The lease itself never reads
/// slots through this: [`crate::db::lease`] filters and judges on the server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlotDoc {
    /// `_id` as text.
    pub id: String,
    /// Its holder (`ip:port`), or None once released.
    pub owner: Option<String>,
    /// Whole numbers only; None for anything else.
    pub epoch: Option<i64>,
    pub rev: Option<i64>,
    /// The holder's lease `L`, written at its claim.
    pub lease_ms: Option<i64>,
    /// The holder's `--suspend-for`, written at its claim: how long past its lease
    /// it may still renew late and resume its suspended robots.
    pub suspend_ms: Option<i64>,
    /// How many robots it says it has (0 when unset).
    pub robot_count: i64,
    /// True only when `draining` is `true`.
    pub draining: bool,
    /// Its robots' measured cost, as its holder last recorded it on a renewal.
    pub cost: Option<crate::load::SlotCost>,
}

impl SlotDoc {
    pub fn from_doc(d: &Document) -> SlotDoc {
        SlotDoc {
            id: crate::db::event::text(d, "_id").unwrap_or_default(),
            owner: crate::db::event::text(d, OWNER),
            epoch: int(d, EPOCH),
            rev: int(d, REV),
            lease_ms: int(d, LEASE_MS),
            suspend_ms: int(d, SUSPEND_MS),
            robot_count: int(d, ROBOT_COUNT).unwrap_or(0),
            draining: matches!(d.get(DRAINING), Some(Bson::Boolean(true))),
            cost: crate::db::load::cost_of(d),
        }
    }
}
