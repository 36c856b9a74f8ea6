//! The pool as people see it: every slot judged on the server's clock, the live
//! workers, and what each robot is doing now, derived from its slot's lease rather
//! than from the status its last holder wrote (a holder that died cannot update its
//! robots, so a stored `running` alone proves nothing). The CLI (`status`, `slots
//! list`, `robot list`, `robot show`) and `slotpool web` both show this.

use crate::db::field::{BEAT_MS, HELD, TICK_MS};
use std::collections::HashMap;

use bson::{doc, Bson, Document};

pub(crate) use crate::db::heartbeat::WorkerRole;
use crate::db::robot_doc::{RobotDoc, RobotStatus};
use crate::db::slot_doc::SlotDoc;
use crate::db::store::Store;
use crate::db::words::words;

pub(crate) use crate::db::event::text;
pub(crate) use crate::db::store::int;

words! {
    /// A slot judged on the server's clock.
    SlotState {
        /// A live lease.
        Held => "held",
        /// Its holder's lease ran out less than the holder's `--suspend-for` ago and
        /// nobody claimed it: the holder may be riding out a database outage with
        /// its robots frozen (it resumes them if a late renewal still matches), or be
        /// dead. A standby that kept contact with the database claims it as any
        /// expired slot.
        Suspended => "suspended",
        /// Its holder's lease ran out: waiting for a worker.
        Expired => "expired",
        /// Released, or never held: waiting for a worker.
        Free => "free",
        /// Draining, its holder still on it.
        Draining => "draining",
        /// Draining, with no holder: for nobody until undrained.
        Drained => "drained",
        /// Its document cannot be a slot (a hand edit).
        Invalid => "invalid",
    }
}

impl SlotState {
    /// A live lease: held or draining.
    pub(crate) fn is_live(self) -> bool {
        matches!(self, SlotState::Held | SlotState::Draining)
    }

    /// Waiting for a worker: free or expired.
    pub(crate) fn is_unheld(self) -> bool {
        matches!(
            self,
            SlotState::Free | SlotState::Expired | SlotState::Suspended
        )
    }
}

words! {
    /// What a robot is doing now, derived from its slot's lease ([`derive`]).
    RobotState {
        Running => "running",
        /// Its slot's holder has not adopted it yet.
        Starting => "starting",
        Restarting => "restarting",
        Failed => "failed",
        Paused => "paused",
        /// It ran to completion; `robot restart` runs it again.
        Completed => "completed",
        /// Its slot's lease is suspended (see [`SlotState::Suspended`]): frozen in
        /// place, to go on if its holder renews late, or to be restored elsewhere.
        Suspended => "suspended",
        /// No live holder can run it.
        Waiting => "waiting",
    }
}

/// A slot row as the server sees it now.
pub(crate) struct SlotRow {
    pub(crate) slot: SlotDoc,
    pub(crate) lease_age_ms: Option<i64>,
    pub(crate) state: SlotState,
}

/// A slot's state from its stored fields and its lease's age on the server's clock.
pub(crate) fn judge_slot(
    slot: &SlotDoc,
    epoch_whole: bool,
    lease_age_ms: Option<i64>,
) -> SlotState {
    let live =
        matches!((&slot.owner, lease_age_ms, slot.lease_ms), (Some(_), Some(a), Some(l)) if a <= l);
    if slot.draining {
        if live {
            SlotState::Draining
        } else {
            SlotState::Drained
        }
    } else if !epoch_whole {
        SlotState::Invalid
    } else {
        let within_suspension = matches!(
            (lease_age_ms, slot.lease_ms, slot.suspend_ms),
            (Some(a), Some(l), Some(s)) if a <= l.saturating_add(s)
        );
        match (live, &slot.owner) {
            (true, _) => SlotState::Held,
            (false, Some(_)) if within_suspension => SlotState::Suspended,
            (false, Some(_)) => SlotState::Expired,
            (false, None) => SlotState::Free,
        }
    }
}

/// Reads every slot with its lease age and state judged on the server's clock.
pub(crate) async fn slot_rows(store: &Store) -> anyhow::Result<Vec<SlotRow>> {
    let mut out = Vec::new();
    for d in crate::db::listing::slots_aged(store).await? {
        let lease_age_ms = int(&d, "_age_ms");
        // An epoch the claim's compare-and-set can match: an int or a long.
        let epoch_whole = matches!(
            d.get(crate::db::field::EPOCH),
            Some(Bson::Int64(_) | Bson::Int32(_))
        );
        let slot = SlotDoc::from_doc(&d);
        out.push(SlotRow {
            state: judge_slot(&slot, epoch_whole, lease_age_ms),
            slot,
            lease_age_ms,
        });
    }
    Ok(out)
}

/// Workers whose heartbeat still counts (see [`crate::db::heartbeat::is_alive`]).
pub(crate) async fn live_workers(store: &Store) -> Result<Vec<Document>, mongodb::error::Error> {
    crate::db::heartbeat::live_workers(store).await
}

/// Each live worker's load, from its heartbeat (workers of an older version, or
/// whose `load` makes no sense, have none).
pub(crate) fn loads(workers: &[Document]) -> HashMap<String, crate::load::Load> {
    workers
        .iter()
        .filter_map(|w| {
            let id = w.get_str("_id").ok()?;
            Some((id.to_string(), crate::db::load::load_of(w)?))
        })
        .collect()
}

/// A load score as the CLI prints it: `12.5`, or `-` when unknown.
pub(crate) fn shown_score(l: Option<&crate::load::Load>) -> String {
    shown_score_of(l.map(|l| l.score()))
}

/// A load score as the tables show it (see [`shown_score`]).
pub(crate) fn shown_score_of(score: Option<f64>) -> String {
    score.map_or("-".into(), |s| format!("{s:.1}"))
}

/// A slot's measured CPU as the CLI prints it, in cores: `0.95`, or `-`.
pub(crate) fn shown_cpu(c: Option<&crate::load::SlotCost>) -> String {
    c.map_or("-".into(), |c| {
        format!("{:.2}", c.total.millicores as f64 / 1000.0)
    })
}

/// A slot's heaviest robots as the CLI prints them: `hog 0.95, other 0.01`.
pub(crate) fn shown_heaviest(c: Option<&crate::load::SlotCost>) -> String {
    match c {
        Some(c) if !c.top.is_empty() => c
            .top
            .iter()
            .map(|r| format!("{} {:.2}", r.name, r.millicores as f64 / 1000.0))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "-".into(),
    }
}

/// A live worker's role: the one rule the CLI and the dashboard share.
///
/// - `holder`: a live lease names it, whatever its own document says (a killed
///   worker cannot take back the slot it still names there);
/// - `standby`: it holds nothing, and its fresh heartbeat says so;
/// - `overdue`: it holds nothing and missed a heartbeat (beats are at most
///   [`REAR_TICKS`](crate::db::heartbeat::REAR_TICKS) ticks apart), or its heartbeat
///   names slots no live lease gives it: the line may still believe it, but it is no
///   standby to count on.
pub(crate) fn worker_role(worker: &Document, holds_live_slot: bool) -> WorkerRole {
    let tick = int(worker, TICK_MS).unwrap_or(1000).clamp(1, 3_600_000);
    let every = int(worker, BEAT_MS)
        .filter(|b| (1..=3_600_000 * crate::db::heartbeat::REAR_TICKS as i64).contains(b))
        .unwrap_or(tick * crate::db::heartbeat::REAR_TICKS as i64);
    let late = int(worker, "seen_ms").is_some_and(|s| s > every + 1000);
    let said_it_held = int(worker, HELD).is_some_and(|h| h > 0)
        || text(worker, crate::db::field::SLOT_ID).is_some();
    match (holds_live_slot, late || said_it_held) {
        (true, _) => WorkerRole::Holder,
        (false, false) => WorkerRole::Standby,
        (false, true) => WorkerRole::Overdue,
    }
}

/// Whether a live lease among `slots` (held or draining) names `worker_id`.
pub(crate) fn holds_live_slot(worker_id: &str, slots: &[SlotRow]) -> bool {
    slots
        .iter()
        .any(|s| s.state.is_live() && s.slot.owner.as_deref() == Some(worker_id))
}

/// What the pool can take: slots held, slots waiting for a worker, and how many more
/// holder failures standbys can absorb now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capacity {
    /// Held or draining (a live lease).
    pub(crate) held: usize,
    /// Free or expired: waiting for a worker (drained and invalid slots are neither).
    pub(crate) unheld: usize,
    pub(crate) failures_absorbable: usize,
}

/// The capacity of a pool whose slots are in `states` (as [`slot_rows`] judges
/// them), with `standbys` live standbys.
pub(crate) fn capacity(states: impl IntoIterator<Item = SlotState>, standbys: usize) -> Capacity {
    let (mut held, mut unheld) = (0, 0);
    for state in states {
        if state.is_live() {
            held += 1;
        } else if state.is_unheld() {
            unheld += 1;
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
pub(crate) struct SlotView {
    /// Judged on the server's clock.
    pub(crate) state: SlotState,
    /// The holder while the lease is live.
    pub(crate) holder: Option<String>,
}

impl SlotView {
    pub(crate) fn of(row: &SlotRow) -> SlotView {
        SlotView {
            state: row.state,
            holder: row
                .state
                .is_live()
                .then(|| row.slot.owner.clone())
                .flatten(),
        }
    }
}

/// Every slot by id.
pub(crate) fn slot_views(rows: &[SlotRow]) -> HashMap<String, SlotView> {
    rows.iter()
        .map(|r| (r.slot.id.clone(), SlotView::of(r)))
        .collect()
}

/// A robot's derived state: what it is doing, who runs it, and why not when it is
/// not running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RobotNow {
    pub(crate) state: RobotState,
    /// The worker running it now, if any.
    pub(crate) holder: Option<String>,
    /// Why it is not running, for everything but `running`.
    pub(crate) why: Option<String>,
}

impl RobotNow {
    /// What `robot` is doing now, among `slots` (by id).
    pub(crate) fn of(robot: &RobotDoc, slots: &HashMap<String, SlotView>) -> RobotNow {
        let slot_id = robot.slot_id.clone().unwrap_or_default();
        derive(
            &slot_id,
            robot.status(),
            robot.paused,
            robot.worker.as_deref(),
            slots.get(&slot_id),
        )
    }
}

/// Derives a robot's state from its stored fields and its slot (None: no such slot).
pub(crate) fn derive(
    slot_id: &str,
    stored_status: Option<RobotStatus>,
    paused: bool,
    worker: Option<&str>,
    slot: Option<&SlotView>,
) -> RobotNow {
    let waiting = |why: String| RobotNow {
        state: RobotState::Waiting,
        holder: None,
        why: Some(why),
    };
    if paused && stored_status == Some(RobotStatus::Failed) {
        return RobotNow {
            state: RobotState::Failed,
            holder: None,
            why: Some(
                "stopped by its restart policy; its error says why (robot resume NAME runs it again)"
                    .into(),
            ),
        };
    }
    if paused && stored_status == Some(RobotStatus::Completed) {
        return RobotNow {
            state: RobotState::Completed,
            holder: None,
            why: Some("it ran to completion (robot restart NAME runs it again)".into()),
        };
    }
    if paused {
        return RobotNow {
            state: RobotState::Paused,
            holder: None,
            why: Some("paused by an operator (robot resume NAME)".into()),
        };
    }
    let Some(slot) = slot else {
        return waiting(format!("its slot {slot_id} does not exist"));
    };
    let holder = match (slot.state, &slot.holder) {
        (SlotState::Held | SlotState::Draining, Some(h)) => h.clone(),
        (SlotState::Drained, _) => {
            return waiting(format!("{slot_id} is drained (slots undrain {slot_id})"))
        }
        (SlotState::Invalid, _) => return waiting(format!("{slot_id}'s document is invalid")),
        (SlotState::Suspended, _) => {
            return RobotNow {
                state: RobotState::Suspended,
                holder: None,
                why: Some(format!(
                    "{slot_id}'s lease ran out: its holder may be riding out a database outage with it frozen, or be gone"
                )),
            }
        }
        _ => return waiting(format!("no live worker holds {slot_id}")),
    };
    let adopted = worker == Some(holder.as_str());
    let (state, why) = match stored_status {
        Some(RobotStatus::Running) if adopted => (RobotState::Running, None),
        Some(RobotStatus::Restarting) if adopted => (
            RobotState::Restarting,
            Some("crashed; restarting with backoff"),
        ),
        Some(RobotStatus::Failed) if adopted => {
            (RobotState::Failed, Some("its spec or context cannot work"))
        }
        _ => (
            RobotState::Starting,
            Some("its slot's holder is starting it"),
        ),
    };
    RobotNow {
        state,
        holder: Some(holder),
        why: why.map(str::to_string),
    }
}

/// `1.2s`, `340ms`, `3m05s`, or `-` when unknown.
pub(crate) fn age(ms: Option<i64>) -> String {
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
        assert_eq!(worker_role(&fresh, true), WorkerRole::Holder);
        // Its own document names a slot, but no live lease names it: killed a moment
        // ago (a live one would have said it holds nothing), no standby to count on.
        assert_eq!(worker_role(&fresh, false), WorkerRole::Overdue);
        let lost = doc! {"_id": "w", "seen_ms": 500_i64, "tick_ms": 1000_i64, "held": 1_i64};
        assert_eq!(worker_role(&lost, false), WorkerRole::Overdue);
        let standby = doc! {"_id": "w", "seen_ms": 500_i64, "tick_ms": 1000_i64,
        "slot_id": null, "held": 0_i64};
        assert_eq!(worker_role(&standby, false), WorkerRole::Standby);
        // Its own beat period when it wrote one.
        let slow = doc! {"_id": "w", "seen_ms": 6500_i64, "tick_ms": 1000_i64, "beat_ms": 2000_i64};
        assert_eq!(worker_role(&slow, false), WorkerRole::Overdue);
        let beat = 1000 * crate::db::heartbeat::REAR_TICKS as i64 + 1000;
        let late = doc! {"_id": "w", "seen_ms": beat + 1, "tick_ms": 1000_i64};
        assert_eq!(worker_role(&late, false), WorkerRole::Overdue);
        assert_eq!(worker_role(&late, true), WorkerRole::Holder);
        let at_the_bound = doc! {"_id": "w", "seen_ms": beat, "tick_ms": 1000_i64};
        assert_eq!(worker_role(&at_the_bound, false), WorkerRole::Standby);
    }

    fn slot(state: &str, holder: Option<&str>) -> SlotView {
        let state = SlotState::parse(state).expect("a slot state");
        SlotView {
            state,
            holder: holder.map(str::to_string),
        }
    }

    #[test]
    fn unheld_slots_take_standbys_before_failures_can_be_absorbed() {
        let states = SlotState::ALL.iter().copied();
        assert_eq!(
            capacity(states.clone(), 4),
            Capacity {
                held: 2,
                unheld: 3,
                failures_absorbable: 1
            }
        );
        assert_eq!(capacity(states, 3).failures_absorbable, 0);
    }

    #[test]
    fn a_lapsed_lease_is_suspended_within_its_holders_suspend_for_then_expired() {
        let doc = SlotDoc {
            id: "slot-1".into(),
            owner: Some("10.0.0.1:7700".into()),
            epoch: Some(3),
            rev: Some(1),
            lease_ms: Some(2000),
            suspend_ms: Some(60_000),
            robot_count: 2,
            draining: false,
            cost: None,
        };
        assert_eq!(judge_slot(&doc, true, Some(2000)), SlotState::Held);
        assert_eq!(judge_slot(&doc, true, Some(2001)), SlotState::Suspended);
        assert_eq!(judge_slot(&doc, true, Some(62_000)), SlotState::Suspended);
        assert_eq!(judge_slot(&doc, true, Some(62_001)), SlotState::Expired);
        // A holder from before the field, or one started with --suspend-for 0.
        let old = SlotDoc {
            suspend_ms: None,
            ..doc.clone()
        };
        assert_eq!(judge_slot(&old, true, Some(2001)), SlotState::Expired);
        let none = SlotDoc {
            suspend_ms: Some(0),
            ..doc.clone()
        };
        assert_eq!(judge_slot(&none, true, Some(2001)), SlotState::Expired);
        // Released: free, whatever the window.
        let released = SlotDoc { owner: None, ..doc };
        assert_eq!(judge_slot(&released, true, Some(2001)), SlotState::Free);
        let s = derive(
            "slot-1",
            Some(RobotStatus::Running),
            false,
            Some("10.0.0.1:7700"),
            Some(&slot("suspended", None)),
        );
        assert_eq!(s.state, RobotState::Suspended);
        assert!(s.why.unwrap().contains("database outage"));
    }

    #[test]
    fn a_dead_holders_robots_are_waiting_not_running() {
        let s = derive(
            "slot-1",
            Some(RobotStatus::Running),
            false,
            Some("w:1"),
            Some(&slot("expired", None)),
        );
        assert_eq!(s.state, RobotState::Waiting);
        assert_eq!(s.holder, None);
        assert!(s.why.unwrap().contains("no live worker holds slot-1"));
    }

    #[test]
    fn running_only_under_the_live_holder() {
        let held = slot("held", Some("w:1"));
        let s = derive(
            "slot-1",
            Some(RobotStatus::Running),
            false,
            Some("w:1"),
            Some(&held),
        );
        assert_eq!(
            (s.state, s.holder.as_deref(), s.why),
            (RobotState::Running, Some("w:1"), None)
        );
        // Written by the previous holder, not yet adopted by this one.
        let s = derive(
            "slot-1",
            Some(RobotStatus::Running),
            false,
            Some("w:0"),
            Some(&held),
        );
        assert_eq!(
            (s.state, s.holder.as_deref()),
            (RobotState::Starting, Some("w:1"))
        );
        let s = derive(
            "slot-1",
            Some(RobotStatus::Pending),
            false,
            None,
            Some(&held),
        );
        assert_eq!(s.state, RobotState::Starting);
        let s = derive(
            "slot-1",
            Some(RobotStatus::Failed),
            false,
            Some("w:1"),
            Some(&held),
        );
        assert_eq!(s.state, RobotState::Failed);
        // Given up on by its restart policy: held like a paused robot, but failed.
        let s = derive(
            "slot-1",
            Some(RobotStatus::Failed),
            true,
            Some("w:1"),
            Some(&held),
        );
        assert_eq!((s.state, s.holder), (RobotState::Failed, None));
        assert!(s.why.unwrap().contains("robot resume"));
        let s = derive(
            "slot-1",
            Some(RobotStatus::Paused),
            true,
            Some("w:1"),
            Some(&held),
        );
        assert_eq!(s.state, RobotState::Paused);
    }

    #[test]
    fn paused_drained_and_missing() {
        let held = slot("held", Some("w:1"));
        assert_eq!(
            derive(
                "s",
                Some(RobotStatus::Running),
                true,
                Some("w:1"),
                Some(&held)
            )
            .state,
            RobotState::Paused
        );
        let s = derive(
            "s",
            Some(RobotStatus::Running),
            false,
            None,
            Some(&slot("drained", None)),
        );
        assert!(s.state == RobotState::Waiting && s.why.unwrap().contains("drained"));
        let s = derive("gone", Some(RobotStatus::Running), false, None, None);
        assert!(s.state == RobotState::Waiting && s.why.unwrap().contains("does not exist"));
    }
}
