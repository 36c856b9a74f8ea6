//! The slot's plan: pure decisions over what a sync listed and what runs, with no
//! I/O. Which instances stop and which robots start ([`plan_sync`]), what a probe
//! must find if nothing changed ([`Fingerprint`]), when one adoption statement over
//! the slot takes exactly the robots about to start ([`slot_statement_takes_only`]),
//! and when a read of the slot's robots threatens the lease
//! ([`read_threatens_lease`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bson::oid::ObjectId;

use crate::config::LeaseTiming;

/// What a probe counts on a slot, and what the last read expects it to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fingerprint {
    /// Robots bound to the slot (with an ObjectId `_id`).
    pub(crate) total: i64,
    /// Unpaused robots whose epoch is not this holder's: waiting to be adopted, or
    /// refused, or a newer holder's.
    pub(crate) unadopted: i64,
    pub(crate) paused: i64,
    /// Robots with an update not yet judged.
    pub(crate) updates: i64,
}

impl Fingerprint {
    /// What a probe must find right after a sync that listed `listed` and adopted
    /// `adopted` under epoch `mine`, if nothing changed since.
    pub(super) fn expected(listed: &[View], adopted: &HashSet<ObjectId>, mine: i64) -> Fingerprint {
        let mut f = Fingerprint {
            total: listed.len() as i64,
            ..Default::default()
        };
        for v in listed {
            if v.paused {
                f.paused += 1;
            } else if v.epoch != mine && !adopted.contains(&v.id) {
                f.unadopted += 1;
            }
        }
        f
    }
}

/// A listed robot, as [`plan_sync`] needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct View {
    pub(super) id: ObjectId,
    pub(super) epoch: i64,
    pub(super) gen: i64,
    pub(super) start_rev: i64,
    pub(super) paused: bool,
}

/// A running instance, as [`plan_sync`] needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Instance {
    pub(super) gen: i64,
    pub(super) start_rev: i64,
    pub(super) stopping: bool,
}

/// What one sync does, decided from the listed robots and the running instances.
#[derive(Debug, Default, PartialEq)]
pub(super) struct SyncPlan {
    /// Instances to stop: their robot was deleted, moved, paused, restarted, or adopted
    /// again since they started (a newer generation or another epoch), so they are
    /// stale.
    pub(super) stop: Vec<ObjectId>,
    /// Robots to adopt (raise their generation) and start.
    pub(super) start: Vec<ObjectId>,
    /// A robot waits for its old instance to exit before it starts again.
    pub(super) incomplete: bool,
}

/// Whether a read of the slot's robots that took `took` leaves a renewal queued behind
/// it too little room: over half of [`LeaseTiming::renewal_wait`], since a renewal
/// sent during such a read waits behind it at short ticks (see
/// docs/bench/2026-11-24-requests-and-takeovers-issue-23.md).
pub(super) fn read_threatens_lease(took: Duration, timing: &LeaseTiming) -> bool {
    took > timing.renewal_wait() / 2
}

/// Whether one adoption statement over the slot ([`ContextStore::adopt_slot`]: its
/// unpaused robots with an epoch older than `mine`) takes exactly the robots in
/// `rest`, as listed, once the robots in `adopted` (earlier chunks of this sync, now
/// at `mine`) are left out: each of `rest` is older than `mine` (one at `mine` is
/// this holder's own, restarted, and needs the `_id` form), and no other listed
/// robot would be taken (one still stopping would be fenced before its last
/// checkpoint; one an earlier chunk could not adopt would be tried again).
pub(super) fn slot_statement_takes_only(
    listed: &[View],
    adopted: &HashSet<ObjectId>,
    rest: &[ObjectId],
    mine: i64,
) -> bool {
    let rest: HashSet<&ObjectId> = rest.iter().collect();
    let taken: Vec<&View> = listed
        .iter()
        .filter(|v| !v.paused && v.epoch < mine && !adopted.contains(&v.id))
        .collect();
    taken.len() == rest.len() && taken.iter().all(|v| rest.contains(&v.id))
}

/// Decides which instances to stop and which robots to start. An instance is current
/// only while its robot is listed unpaused on this slot at this holder's epoch, at the
/// instance's own generation and under the `start_rev` it started with; anything else
/// means the robot changed hands (even if it came back, X → Y → X) or an operator asked
/// for a fresh start, and that instance must go. A restarted robot starts again only
/// once its old instance has exited (after its last checkpoint), under a new
/// generation. A robot whose epoch is above ours belongs to a newer holder of this
/// slot: never started here.
pub(super) fn plan_sync(
    listed: &[View],
    running: &HashMap<ObjectId, Instance>,
    mine: i64,
) -> SyncPlan {
    let by_id: HashMap<ObjectId, &View> = listed.iter().map(|v| (v.id, v)).collect();
    let mut plan = SyncPlan::default();
    for (id, inst) in running {
        if inst.stopping {
            continue;
        }
        let current = by_id.get(id).is_some_and(|v| {
            !v.paused && v.epoch == mine && v.gen == inst.gen && v.start_rev == inst.start_rev
        });
        if !current {
            plan.stop.push(*id);
        }
    }
    plan.stop.sort();
    let stopping: HashSet<&ObjectId> = plan.stop.iter().collect();
    for v in listed {
        if v.paused || v.epoch > mine {
            continue;
        }
        match running.get(&v.id) {
            None => plan.start.push(v.id),
            Some(inst) if inst.stopping || stopping.contains(&v.id) => plan.incomplete = true,
            Some(_) => {}
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: ObjectId, epoch: i64, gen: i64) -> View {
        View {
            id,
            epoch,
            gen,
            start_rev: 0,
            paused: false,
        }
    }

    fn running(entries: &[(ObjectId, i64, bool)]) -> HashMap<ObjectId, Instance> {
        entries
            .iter()
            .map(|(id, gen, stopping)| {
                let inst = Instance {
                    gen: *gen,
                    start_rev: 0,
                    stopping: *stopping,
                };
                (*id, inst)
            })
            .collect()
    }

    #[test]
    fn new_and_older_epoch_robots_start_newer_ones_never() {
        let (a, b, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let listed = [view(a, 0, 0), view(b, 4, 9), view(c, 6, 1)];
        let plan = plan_sync(&listed, &HashMap::new(), 5);
        assert_eq!(plan.start, vec![a, b], "epoch 6 belongs to a newer holder");
        assert!(plan.stop.is_empty() && !plan.incomplete);
    }

    #[test]
    fn the_expected_fingerprint_counts_what_a_probe_would_after_the_sync() {
        let (a, b, c, d) = (
            ObjectId::new(),
            ObjectId::new(),
            ObjectId::new(),
            ObjectId::new(),
        );
        let mut paused = view(c, 0, 0);
        paused.paused = true;
        // a: adopted now; b: already ours; c: paused; d: refused (left unadopted).
        let listed = [view(a, 0, 0), view(b, 5, 2), paused, view(d, 0, 0)];
        let adopted: HashSet<ObjectId> = [a].into_iter().collect();
        assert_eq!(
            Fingerprint::expected(&listed, &adopted, 5),
            Fingerprint {
                total: 4,
                unadopted: 1,
                paused: 1,
                updates: 0,
            }
        );
    }

    #[test]
    fn a_read_longer_than_half_the_renewal_wait_is_called_out() {
        let t = LeaseTiming::from_tick(Duration::from_millis(250));
        // L - margin = 500 - 112.5 ms.
        assert_eq!(t.renewal_wait(), Duration::from_micros(387_500));
        assert!(!read_threatens_lease(Duration::from_millis(150), &t));
        assert!(read_threatens_lease(Duration::from_millis(500), &t));
        let t = LeaseTiming::from_tick(Duration::from_secs(1));
        assert!(!read_threatens_lease(Duration::from_millis(500), &t));
    }

    #[test]
    fn one_statement_over_the_slot_only_when_it_takes_exactly_the_rest() {
        let [a, b, c, d]: [ObjectId; 4] = std::array::from_fn(|_| ObjectId::new());
        let mut paused = view(c, 1, 1);
        paused.paused = true;
        // a, b older than 5; c paused; d already ours.
        let listed = [view(a, 4, 1), view(b, 0, 0), paused, view(d, 5, 2)];
        let none = HashSet::new();
        assert!(slot_statement_takes_only(&listed, &none, &[a, b], 5));
        assert!(slot_statement_takes_only(&listed, &none, &[b, a], 5));
        // b would be taken though it is not to start (still stopping, or an
        // earlier chunk could not adopt it) ...
        assert!(!slot_statement_takes_only(&listed, &none, &[a], 5));
        // ... unless an earlier chunk of this sync adopted it.
        let b_adopted: HashSet<ObjectId> = [b].into_iter().collect();
        assert!(slot_statement_takes_only(&listed, &b_adopted, &[a], 5));
        // d is this holder's own (restarted): it needs the `_id` form.
        assert!(!slot_statement_takes_only(&listed, &none, &[a, b, d], 5));
        // Not listed at all.
        let stranger = ObjectId::new();
        assert!(!slot_statement_takes_only(
            &listed,
            &none,
            &[a, b, stranger],
            5
        ));
    }

    #[test]
    fn a_current_instance_is_left_alone() {
        let a = ObjectId::new();
        let plan = plan_sync(&[view(a, 5, 3)], &running(&[(a, 3, false)]), 5);
        assert_eq!(plan, SyncPlan::default());
    }

    #[test]
    fn moved_away_and_back_stops_the_old_instance_then_starts_anew() {
        // X → Y → X inside one tick: the robot is listed again on X, epoch reset by
        // the moves (or raised again by Y's holder), its generation moved on.
        let a = ObjectId::new();
        for listed in [view(a, 0, 4), view(a, 5, 4), view(a, 2, 4)] {
            let plan = plan_sync(&[listed], &running(&[(a, 3, false)]), 5);
            assert_eq!(plan.stop, vec![a], "{listed:?}");
            assert!(plan.start.is_empty(), "start only once the old one exited");
            assert!(plan.incomplete);
        }
        // Once it exited, it is adopted again.
        let plan = plan_sync(&[view(a, 0, 4)], &HashMap::new(), 5);
        assert_eq!(plan.start, vec![a]);
    }

    #[test]
    fn deleted_paused_or_taken_by_a_newer_holder_stops() {
        let (a, b, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let mut paused = view(b, 5, 1);
        paused.paused = true;
        let listed = [paused, view(c, 6, 2)];
        let plan = plan_sync(
            &listed,
            &running(&[(a, 1, false), (b, 1, false), (c, 1, false)]),
            5,
        );
        let mut want = vec![a, b, c];
        want.sort();
        assert_eq!(plan.stop, want);
        assert!(plan.start.is_empty() && !plan.incomplete);
    }

    #[test]
    fn a_restart_stops_the_instance_then_starts_it_once_it_exited() {
        let a = ObjectId::new();
        let restarted = View {
            start_rev: 1,
            ..view(a, 5, 3)
        };
        let plan = plan_sync(&[restarted], &running(&[(a, 3, false)]), 5);
        assert_eq!(plan.stop, vec![a], "started under start_rev 0");
        assert!(
            plan.start.is_empty() && plan.incomplete,
            "not before it exited"
        );
        let plan = plan_sync(&[restarted], &HashMap::new(), 5);
        assert_eq!(plan.start, vec![a], "then it starts again");
    }

    #[test]
    fn a_stopping_instance_is_waited_for() {
        let a = ObjectId::new();
        let plan = plan_sync(&[view(a, 5, 3)], &running(&[(a, 3, true)]), 5);
        assert!(plan.stop.is_empty() && plan.start.is_empty() && plan.incomplete);
    }
}
