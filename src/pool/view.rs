//! The pool as people see it: every slot judged on the server's clock, the live
//! workers, and what each robot is doing now, derived from its slot's lease rather
//! than from the status its last holder wrote (a holder that died cannot update its
//! robots, so a stored `running` alone proves nothing). The CLI (`status`, `slots
//! list`, `robot list`, `robot show`) and `slotpool web` both show this.

use std::collections::HashMap;

use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::db::field::{DRAINING, EPOCH, OWNER, SLOT_ID};
use crate::db::store::Store;

pub use crate::db::store::int;

/// A text field; a non-string value is shown as BSON text.
pub fn text(d: &Document, key: &str) -> Option<String> {
    match d.get(key) {
        Some(Bson::String(s)) => Some(s.clone()),
        Some(Bson::Null) | None => None,
        Some(other) => Some(other.to_string()),
    }
}

/// A slot row as the server sees it now.
pub struct SlotRow {
    pub doc: Document,
    pub lease_age_ms: Option<i64>,
    pub state: &'static str,
}

/// Reads every slot with its lease age and state judged on the server's clock.
pub async fn slot_rows(store: &Store) -> anyhow::Result<Vec<SlotRow>> {
    let pipeline = vec![
        doc! {"$sort": {"_id": 1}},
        doc! {"$addFields": {
            "_age_ms": {"$cond": [
                {"$eq": [{"$type": "$time"}, "date"]},
                {"$subtract": [{"$toLong": "$$NOW"}, {"$toLong": "$time"}]},
                Bson::Null,
            ]},
        }},
    ];
    let mut cursor = store.slots().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(mut d) = cursor.try_next().await? {
        let lease_age_ms = int(&d, "_age_ms");
        d.remove("_age_ms");
        let lease_ms = int(&d, "lease_ms");
        let owner = text(&d, OWNER);
        let live =
            matches!((&owner, lease_age_ms, lease_ms), (Some(_), Some(a), Some(l)) if a <= l);
        let state = if matches!(d.get(DRAINING), Some(Bson::Boolean(true))) {
            if live {
                "draining"
            } else {
                "drained"
            }
        } else if !matches!(d.get(EPOCH), Some(Bson::Int64(_) | Bson::Int32(_))) {
            "invalid"
        } else {
            match (live, owner) {
                (true, _) => "held",
                (false, Some(_)) => "expired",
                (false, None) => "free",
            }
        };
        out.push(SlotRow {
            doc: d,
            lease_age_ms,
            state,
        });
    }
    Ok(out)
}

/// Workers whose heartbeat still counts (see [`crate::db::heartbeat::is_alive`]).
pub async fn live_workers(store: &Store) -> Result<Vec<Document>, mongodb::error::Error> {
    let mut pipeline = crate::db::heartbeat::liveness();
    pipeline.push(doc! {"$sort": {"_id": 1}});
    let mut cursor = store.workers().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        if crate::db::heartbeat::is_alive(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// A live worker's role: the one rule the CLI and the dashboard share.
///
/// - `holder`: a live lease names it (`holds_live_slot`), whatever its own document
///   says: a killed worker cannot take back the slot it still names there;
/// - `standby`: it holds nothing, its heartbeat is fresh, and that heartbeat says it
///   holds nothing;
/// - `overdue`: it holds nothing and has missed a heartbeat, or its last heartbeat
///   names slots that no live lease gives it any more. Heartbeats are at most
///   [`REAR_TICKS`](crate::db::heartbeat::REAR_TICKS) ticks apart (`beat_ms`), and
///   the line believes one for two beats, so a worker killed a moment ago still
///   counts as live there; past one beat and a second of slack it is no standby to
///   count on. A holder killed a moment ago, whose slot a standby just took, is
///   caught sooner: its last word was that it held the slot, and a live worker that
///   loses a slot beats again at once to say it holds nothing.
pub fn worker_role(worker: &Document, holds_live_slot: bool) -> &'static str {
    let tick = int(worker, "tick_ms").unwrap_or(1000).clamp(1, 3_600_000);
    let every = int(worker, "beat_ms")
        .filter(|b| (1..=3_600_000 * crate::db::heartbeat::REAR_TICKS as i64).contains(b))
        .unwrap_or(tick * crate::db::heartbeat::REAR_TICKS as i64);
    let late = int(worker, "seen_ms").is_some_and(|s| s > every + 1000);
    let said_it_held =
        int(worker, "held").is_some_and(|h| h > 0) || text(worker, SLOT_ID).is_some();
    match (holds_live_slot, late || said_it_held) {
        (true, _) => "holder",
        (false, false) => "standby",
        (false, true) => "overdue",
    }
}

/// Whether a live lease among `slots` (held or draining) names `worker_id`.
pub fn holds_live_slot(worker_id: &str, slots: &[SlotRow]) -> bool {
    slots.iter().any(|s| {
        matches!(s.state, "held" | "draining") && text(&s.doc, OWNER).as_deref() == Some(worker_id)
    })
}

/// What the pool can take: slots held, slots waiting for a worker, and how many more
/// holder failures standbys can absorb now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Held or draining (a live lease).
    pub held: usize,
    /// Free or expired: waiting for a worker (drained and invalid slots are neither).
    pub unheld: usize,
    pub failures_absorbable: usize,
}

/// The capacity of a pool whose slots are in `states` (as [`slot_rows`] judges
/// them), with `standbys` live standbys.
pub fn capacity<'a>(states: impl IntoIterator<Item = &'a str>, standbys: usize) -> Capacity {
    let (mut held, mut unheld) = (0, 0);
    for state in states {
        match state {
            "held" | "draining" => held += 1,
            "free" | "expired" => unheld += 1,
            _ => {}
        }
    }
    Capacity {
        held,
        unheld,
        // Each holder failure needs one standby; unheld slots take standbys first.
        // Without a standby the survivors overflow (see docs/running.md), but that costs room.
        failures_absorbable: standbys.saturating_sub(unheld),
    }
}

/// A slot as robot views need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// `held`, `expired`, `free`, `draining`, `drained` or `invalid`, judged on the
    /// server's clock.
    pub state: &'static str,
    /// The holder while the lease is live.
    pub holder: Option<String>,
}

impl SlotView {
    pub fn of(row: &SlotRow) -> SlotView {
        let live = matches!(row.state, "held" | "draining");
        SlotView {
            state: row.state,
            holder: live.then(|| text(&row.doc, OWNER)).flatten(),
        }
    }
}

/// Every slot by id.
pub fn slot_views(rows: &[SlotRow]) -> HashMap<String, SlotView> {
    rows.iter()
        .filter_map(|r| Some((text(&r.doc, "_id")?, SlotView::of(r))))
        .collect()
}

/// A robot's derived state: what it is doing, who runs it, and why not when it is
/// not running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RobotState {
    /// `running`, `starting`, `restarting`, `failed`, `paused` or `waiting`.
    pub state: &'static str,
    /// The worker running it now, if any.
    pub holder: Option<String>,
    /// Why it is not running, for everything but `running`.
    pub why: Option<String>,
}

/// Derives a robot's state from its stored fields and its slot (None: no such slot).
pub fn derive(
    slot_id: &str,
    stored_status: Option<&str>,
    paused: bool,
    worker: Option<&str>,
    slot: Option<&SlotView>,
) -> RobotState {
    let waiting = |why: String| RobotState {
        state: "waiting",
        holder: None,
        why: Some(why),
    };
    if paused && stored_status == Some("failed") {
        return RobotState {
            state: "failed",
            holder: None,
            why: Some(
                "stopped by its restart policy: it kept ending (robot resume NAME runs it again)"
                    .into(),
            ),
        };
    }
    if paused {
        return RobotState {
            state: "paused",
            holder: None,
            why: Some("paused by an operator (robot resume NAME)".into()),
        };
    }
    let Some(slot) = slot else {
        return waiting(format!("its slot {slot_id} does not exist"));
    };
    let holder = match (slot.state, &slot.holder) {
        ("held" | "draining", Some(h)) => h.clone(),
        ("drained", _) => {
            return waiting(format!("{slot_id} is drained (slots undrain {slot_id})"))
        }
        ("invalid", _) => return waiting(format!("{slot_id}'s document is invalid")),
        _ => return waiting(format!("no live worker holds {slot_id}")),
    };
    let adopted = worker == Some(holder.as_str());
    let (state, why) = match stored_status {
        Some("running") if adopted => ("running", None),
        Some("restarting") if adopted => ("restarting", Some("crashed; restarting with backoff")),
        Some("failed") if adopted => ("failed", Some("its spec or context cannot work")),
        _ => ("starting", Some("its slot's holder is starting it")),
    };
    RobotState {
        state,
        holder: Some(holder),
        why: why.map(str::to_string),
    }
}

/// `1.2s`, `340ms`, `3m05s`, or `-` when unknown.
pub fn age(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 0 => "0ms".into(),
        Some(ms) if ms < 1000 => format!("{ms}ms"),
        Some(ms) if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        Some(ms) => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_role_follows_the_leases_and_its_heartbeats_age() {
        let fresh =
            doc! {"_id": "w", "seen_ms": 500_i64, "tick_ms": 1000_i64, "slot_id": "slot-001"};
        assert_eq!(worker_role(&fresh, true), "holder");
        // Its own document names a slot, but no live lease names it: killed a moment
        // ago (a live one would have said it holds nothing), no standby to count on.
        assert_eq!(worker_role(&fresh, false), "overdue");
        let lost = doc! {"_id": "w", "seen_ms": 500_i64, "tick_ms": 1000_i64, "held": 1_i64};
        assert_eq!(worker_role(&lost, false), "overdue");
        let standby = doc! {"_id": "w", "seen_ms": 500_i64, "tick_ms": 1000_i64,
        "slot_id": null, "held": 0_i64};
        assert_eq!(worker_role(&standby, false), "standby");
        // Its own beat period when it wrote one.
        let slow = doc! {"_id": "w", "seen_ms": 6500_i64, "tick_ms": 1000_i64, "beat_ms": 2000_i64};
        assert_eq!(worker_role(&slow, false), "overdue");
        let beat = 1000 * crate::db::heartbeat::REAR_TICKS as i64 + 1000;
        let late = doc! {"_id": "w", "seen_ms": beat + 1, "tick_ms": 1000_i64};
        assert_eq!(worker_role(&late, false), "overdue");
        assert_eq!(worker_role(&late, true), "holder");
        let at_the_bound = doc! {"_id": "w", "seen_ms": beat, "tick_ms": 1000_i64};
        assert_eq!(worker_role(&at_the_bound, false), "standby");
    }

    fn slot(state: &'static str, holder: Option<&str>) -> SlotView {
        SlotView {
            state,
            holder: holder.map(str::to_string),
        }
    }

    #[test]
    fn unheld_slots_take_standbys_before_failures_can_be_absorbed() {
        let states = ["held", "expired", "free", "draining", "drained", "invalid"];
        assert_eq!(
            capacity(states, 3),
            Capacity {
                held: 2,
                unheld: 2,
                failures_absorbable: 1
            }
        );
        assert_eq!(capacity(states, 1).failures_absorbable, 0);
    }

    #[test]
    fn a_dead_holders_robots_are_waiting_not_running() {
        let s = derive(
            "slot-1",
            Some("running"),
            false,
            Some("w:1"),
            Some(&slot("expired", None)),
        );
        assert_eq!(s.state, "waiting");
        assert_eq!(s.holder, None);
        assert!(s.why.unwrap().contains("no live worker holds slot-1"));
    }

    #[test]
    fn running_only_under_the_live_holder() {
        let held = slot("held", Some("w:1"));
        let s = derive("slot-1", Some("running"), false, Some("w:1"), Some(&held));
        assert_eq!(
            (s.state, s.holder.as_deref(), s.why),
            ("running", Some("w:1"), None)
        );
        // Written by the previous holder, not yet adopted by this one.
        let s = derive("slot-1", Some("running"), false, Some("w:0"), Some(&held));
        assert_eq!((s.state, s.holder.as_deref()), ("starting", Some("w:1")));
        let s = derive("slot-1", Some("pending"), false, None, Some(&held));
        assert_eq!(s.state, "starting");
        let s = derive("slot-1", Some("failed"), false, Some("w:1"), Some(&held));
        assert_eq!(s.state, "failed");
        // Given up on by its restart policy: held like a paused robot, but failed.
        let s = derive("slot-1", Some("failed"), true, Some("w:1"), Some(&held));
        assert_eq!((s.state, s.holder), ("failed", None));
        assert!(s.why.unwrap().contains("robot resume"));
        let s = derive("slot-1", Some("paused"), true, Some("w:1"), Some(&held));
        assert_eq!(s.state, "paused");
    }

    #[test]
    fn paused_drained_and_missing() {
        let held = slot("held", Some("w:1"));
        assert_eq!(
            derive("s", Some("running"), true, Some("w:1"), Some(&held)).state,
            "paused"
        );
        let s = derive(
            "s",
            Some("running"),
            false,
            None,
            Some(&slot("drained", None)),
        );
        assert!(s.state == "waiting" && s.why.unwrap().contains("drained"));
        let s = derive("gone", Some("running"), false, None, None);
        assert!(s.state == "waiting" && s.why.unwrap().contains("does not exist"));
    }
}
