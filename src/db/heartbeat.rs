//! What a heartbeat in `workers` means: how often one is written, and whether the
//! worker that wrote it is alive, judged on the server's clock. The standby line
//! and the pool's view (the CLI and the dashboard) read it by the same rule.

use bson::{doc, Bson, Document};

use crate::db::field::{LAST_SEEN, TICK_MS};
use crate::db::store::int;
use crate::db::words::words;

words! {
    /// A live worker's role (judged by [`crate::pool::view::worker_role`]).
    WorkerRole {
        Holder => "holder",
        Standby => "standby",
        /// Holds nothing and missed a heartbeat, or said it held a slot it lost.
        Overdue => "overdue",
    }
}

/// A worker that holds nothing yet.
impl Default for WorkerRole {
    fn default() -> Self {
        WorkerRole::Standby
    }
}

/// Heartbeats at the front of the line are this many ticks apart (further back,
/// see `worker::standby_line::beat_pace`), and so are a holder's surveys at a
/// tick so long that the rear's safety survey would come sooner.
pub const REAR_TICKS: u32 = 5;

/// Whether a `workers` document read through [`liveness`] is alive: its own
/// `alive_ms` (time left on its heartbeat, on the server's clock) when it wrote
/// one, else (a worker of an older version) two of its ticks and a second since it
/// was last seen.
pub fn is_alive(d: &Document) -> bool {
    if let Some(left) = int(d, "alive_ms") {
        return left > 0;
    }
    let tick = int(d, TICK_MS).unwrap_or(1000).clamp(1, 3_600_000);
    int(d, "seen_ms").is_some_and(|s| s <= 2 * tick + 1000)
}

/// Aggregation stages that add `seen_ms` and `alive_ms` to each heartbeat, on the
/// server's clock, for [`is_alive`].
pub fn liveness() -> Vec<Document> {
    let now = doc! {"$toLong": "$$NOW"};
    vec![
        doc! {"$match": {LAST_SEEN: {"$type": "date"}}},
        doc! {"$addFields": {
            "seen_ms": {"$subtract": [&now, {"$toLong": "$last_seen"}]},
            "alive_ms": {"$cond": [
                {"$in": [{"$type": "$alive_until_ms"}, ["int", "long"]]},
                {"$subtract": ["$alive_until_ms", &now]},
                Bson::Null,
            ]},
        }},
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_from_its_own_deadline_or_the_legacy_rule() {
        assert!(is_alive(&doc! {"alive_ms": 5_i64, "seen_ms": 999_999_i64}));
        assert!(!is_alive(&doc! {"alive_ms": -1_i64, "seen_ms": 0_i64}));
        assert!(!is_alive(&doc! {"alive_ms": 0_i64}));
        // An older worker: no deadline of its own, judged by its tick.
        assert!(is_alive(&doc! {"seen_ms": 3000_i64, "tick_ms": 1000_i64}));
        assert!(!is_alive(&doc! {"seen_ms": 3001_i64, "tick_ms": 1000_i64}));
        assert!(!is_alive(&doc! {"tick_ms": 1000_i64}), "never seen");
    }
}
