//! Which slots a worker holds: the pure decisions behind claiming, overflow and
//! hand-back. The worker loop gathers a [`Round`] (its own slots, the live workers,
//! the expired slots, all judged on the server's clock) and acts on what these
//! functions say; nothing here does I/O, so every rule is unit-tested.
//!
//! - **Standby.** A worker holding nothing claims any expired slot at once.
//! - **Overflow.** A slot still expired `overflow_after` past its expiry (standbys had
//!   their chance) is claimed by a holder with room (below `--max-slots`). Holders with
//!   fewer slots go first: each slot a holder has above the emptiest holder with room
//!   delays it by one more tick, so orphans spread over the survivors instead of
//!   piling onto whoever polls first, yet one is always taken if anyone has room.
//! - **Hand-back.** While a live standby exists, a worker holding more than one slot
//!   gives one back (robots stop and checkpoint, the slot is released, the first
//!   standby's release poll finds it). One slot per standby: the donors, ranked by most slots
//!   then by id, give back only as many as there are standbys, and a donor waits
//!   until its previous hand-back is held by someone before giving another, so no
//!   slot is left unheld. A standby that did not take a handed slot (frozen, say:
//!   its heartbeat is still believed for two beats) is *passed over* until it beats
//!   again ([`HandBack::NotTaken`]), so a slot is handed to it once, not bounced
//!   back and forth until its heartbeat runs out.

use std::collections::HashMap;
use std::time::Duration;

use crate::db::lease::Candidate;
use crate::worker::standby_line::LiveWorker;

/// A live worker as the round sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    /// Slots it holds now (from its heartbeat; its own count for this worker).
    pub held: usize,
    /// Its `--max-slots`, None for no cap.
    pub max_slots: Option<usize>,
    /// A standby that left a slot handed to it untaken and has not beaten since:
    /// no slot is handed back for it.
    pub passed_over: bool,
}

impl Peer {
    fn has_room(&self) -> bool {
        self.max_slots.is_none_or(|m| self.held < m)
    }
}

/// Everything one round decides from.
#[derive(Debug, Clone)]
pub struct Round<'a> {
    /// This worker; it is also among `workers`.
    pub me: &'a str,
    /// Every live worker, this one included, with what it holds.
    pub workers: &'a [Peer],
    pub expired: &'a [Candidate],
    pub overflow_after: Duration,
    pub tick: Duration,
}

impl Round<'_> {
    fn mine(&self) -> Peer {
        self.workers
            .iter()
            .find(|p| p.id == self.me)
            .cloned()
            .unwrap_or_else(|| Peer {
                id: self.me.to_string(),
                held: 0,
                max_slots: None,
                passed_over: false,
            })
    }

    /// How long past its expiry a slot must stand before this worker may claim it:
    /// zero for a standby, `overflow_after` plus one tick per slot above the
    /// emptiest holder with room for a holder, never for a worker at its cap.
    pub fn claim_delay(&self) -> Option<Duration> {
        let me = self.mine();
        if !me.has_room() {
            return None;
        }
        if me.held == 0 {
            return Some(Duration::ZERO);
        }
        let fewest = self
            .workers
            .iter()
            .filter(|p| p.held > 0 && p.has_room())
            .map(|p| p.held)
            .min()
            .unwrap_or(me.held)
            .min(me.held);
        Some(self.overflow_after + self.tick * (me.held - fewest) as u32)
    }

    /// The expired slots this worker may claim now, sorted by id (the claim starts at
    /// this worker's hash position among them).
    pub fn claimable(&self) -> Vec<Candidate> {
        let Some(delay) = self.claim_delay() else {
            return Vec::new();
        };
        let mut out: Vec<Candidate> = self
            .expired
            .iter()
            .filter(|o| o.expired_for >= delay)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// How long until an expired slot becomes claimable by this worker, if one will.
    pub fn next_claimable_in(&self) -> Option<Duration> {
        let delay = self.claim_delay()?;
        self.expired
            .iter()
            .filter(|o| o.expired_for < delay)
            .map(|o| delay - o.expired_for)
            .min()
    }

    /// True when this worker should give one slot back now: it holds more than one,
    /// and its rank among the donors is below the number of live standbys.
    pub fn should_give_back(&self) -> bool {
        let standbys = self
            .workers
            .iter()
            .filter(|p| p.held == 0 && !p.passed_over)
            .count();
        if standbys == 0 {
            return false;
        }
        let mut donors: Vec<&Peer> = self.workers.iter().filter(|p| p.held > 1).collect();
        donors.sort_by(|a, b| b.held.cmp(&a.held).then_with(|| a.id.cmp(&b.id)));
        donors
            .iter()
            .position(|p| p.id == self.me)
            .is_some_and(|rank| rank < standbys)
    }
}

/// Live workers with the number of slots each holds: their heartbeats say who is
/// alive and what others hold (each sends one at once when that changes); this
/// worker knows its own. `passed_over` maps standbys that left a handed slot
/// untaken to the heartbeat they had then; one that has not beaten since is passed
/// over.
pub fn peers(
    alive: &[LiveWorker],
    me: &str,
    my_held: usize,
    my_max: Option<usize>,
    passed_over: &HashMap<String, Option<i64>>,
) -> Vec<Peer> {
    let mut out: Vec<Peer> = alive
        .iter()
        .filter(|w| w.id != me)
        .map(|w| Peer {
            id: w.id.clone(),
            held: w.held,
            max_slots: w.max_slots,
            passed_over: passed_over.get(&w.id) == Some(&w.seen_at_ms),
        })
        .collect();
    out.push(Peer {
        id: me.to_string(),
        held: my_held,
        max_slots: my_max,
        passed_over: false,
    });
    out
}

/// What became of a slot this worker handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandBack {
    /// Still being released, or unheld for less than two leases.
    Pending,
    /// Someone else holds it.
    Taken,
    /// Nobody took it: it stayed unheld two leases, or this worker holds it again
    /// (claimed back as overflow). The standbys of the moment are passed over.
    NotTaken,
}

/// Decides [`HandBack`] from what the round sees of the handed slot.
pub fn hand_back_outcome(
    releasing: bool,
    expired: bool,
    mine_again: bool,
    waited: Duration,
    lease: Duration,
) -> HandBack {
    if releasing {
        HandBack::Pending
    } else if mine_again {
        HandBack::NotTaken
    } else if expired {
        if waited < lease * 2 {
            HandBack::Pending
        } else {
            HandBack::NotTaken
        }
    } else {
        HandBack::Taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);
    const L: Duration = Duration::from_secs(2);

    fn peer(id: &str, held: usize) -> Peer {
        Peer {
            id: id.into(),
            held,
            max_slots: None,
            passed_over: false,
        }
    }

    fn orphan(id: &str, ms: u64) -> Candidate {
        Candidate {
            id: id.into(),
            time: None,
            epoch: 1,
            expired_for: Duration::from_millis(ms),
        }
    }

    fn round<'a>(me: &'a str, workers: &'a [Peer], expired: &'a [Candidate]) -> Round<'a> {
        Round {
            me,
            workers,
            expired,
            overflow_after: L,
            tick: T,
        }
    }

    fn ids(c: Vec<Candidate>) -> Vec<String> {
        c.into_iter().map(|c| c.id).collect()
    }

    #[test]
    fn a_standby_claims_at_expiry() {
        let w = [peer("a", 0), peer("b", 1)];
        let e = [orphan("s2", 0), orphan("s1", 5)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1", "s2"]);
    }

    #[test]
    fn a_holder_waits_for_the_standbys_then_overflows() {
        let w = [peer("a", 1), peer("b", 0)];
        let e = [orphan("s1", 1999)];
        let r = round("a", &w, &e);
        assert!(r.claimable().is_empty(), "the standby's turn");
        assert_eq!(r.next_claimable_in(), Some(Duration::from_millis(1)));
        let e = [orphan("s1", 2000)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s1"]);
    }

    #[test]
    fn holders_with_fewer_slots_go_first() {
        let w = [peer("a", 2), peer("b", 1), peer("c", 1)];
        let e = [orphan("s4", 2500)];
        assert_eq!(ids(round("b", &w, &e).claimable()), ["s4"]);
        assert_eq!(ids(round("c", &w, &e).claimable()), ["s4"]);
        assert!(round("a", &w, &e).claimable().is_empty());
        assert_eq!(
            round("a", &w, &e).next_claimable_in(),
            Some(Duration::from_millis(500)),
            "one tick later, in case b and c cannot"
        );
    }

    #[test]
    fn a_full_holder_does_not_count_as_the_emptiest() {
        let mut b = peer("b", 1);
        b.max_slots = Some(1);
        let w = [peer("a", 2), b];
        let e = [orphan("s3", 2000)];
        assert_eq!(ids(round("a", &w, &e).claimable()), ["s3"]);
        assert!(round("b", &w, &e).claimable().is_empty(), "at its cap");
        assert_eq!(round("b", &w, &e).claim_delay(), None);
    }

    #[test]
    fn one_slot_back_per_standby_from_the_most_loaded() {
        let w = [peer("a", 3), peer("b", 2), peer("c", 0)];
        assert!(round("a", &w, &[]).should_give_back());
        assert!(
            !round("b", &w, &[]).should_give_back(),
            "one standby, one donor"
        );
        let w = [peer("a", 3), peer("b", 2), peer("c", 0), peer("d", 0)];
        assert!(round("b", &w, &[]).should_give_back());
        let w = [peer("a", 2), peer("b", 2), peer("c", 0)];
        assert!(round("a", &w, &[]).should_give_back(), "ties by id");
        assert!(!round("b", &w, &[]).should_give_back());
        let w = [peer("a", 1), peer("c", 0)];
        assert!(
            !round("a", &w, &[]).should_give_back(),
            "never below one slot"
        );
        let w = [peer("a", 3), peer("b", 1)];
        assert!(!round("a", &w, &[]).should_give_back(), "no standby");
    }

    #[test]
    fn peers_from_heartbeats_and_my_own_count() {
        let live = |id: &str, held, max| LiveWorker {
            id: id.into(),
            held,
            max_slots: max,
            seen_at_ms: Some(100),
        };
        let alive = [live("a", 1, None), live("b", 0, Some(2))];
        let none = HashMap::new();
        let p = peers(&alive, "a", 2, Some(3), &none);
        assert_eq!(p.len(), 2);
        assert!(p.contains(&Peer {
            id: "a".into(),
            held: 2,
            max_slots: Some(3),
            passed_over: false,
        }));
        assert!(p.contains(&Peer {
            id: "b".into(),
            held: 0,
            max_slots: Some(2),
            passed_over: false,
        }));
        // A worker whose heartbeat is not in yet still counts itself.
        assert_eq!(peers(&[], "me", 0, None, &none), [peer("me", 0)]);
    }

    #[test]
    fn a_standby_that_left_a_handed_slot_is_passed_over_until_it_beats_again() {
        let live = |seen| LiveWorker {
            id: "s".into(),
            held: 0,
            max_slots: None,
            seen_at_ms: Some(seen),
        };
        let passed: HashMap<String, Option<i64>> = [("s".to_string(), Some(100))].into();
        let w = peers(&[live(100)], "a", 2, None, &passed);
        assert!(!round("a", &w, &[]).should_give_back(), "still frozen");
        let w = peers(&[live(5100)], "a", 2, None, &passed);
        assert!(round("a", &w, &[]).should_give_back(), "it beat again");
    }

    #[test]
    fn a_hand_back_is_taken_pending_or_not_taken() {
        use HandBack::*;
        let l = L;
        assert_eq!(hand_back_outcome(true, false, false, 10 * l, l), Pending);
        assert_eq!(hand_back_outcome(false, true, false, l, l), Pending);
        assert_eq!(hand_back_outcome(false, true, false, 2 * l, l), NotTaken);
        assert_eq!(hand_back_outcome(false, false, true, l / 2, l), NotTaken);
        assert_eq!(hand_back_outcome(false, false, false, l / 2, l), Taken);
    }
}
