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
//!   slot is left unheld and none bounces.

use std::time::Duration;

use crate::lease::Candidate;
use crate::line::LiveWorker;

/// A live worker as the round sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    /// Slots it holds now (from its heartbeat; its own count for this worker).
    pub held: usize,
    /// Its `--max-slots`, None for no cap.
    pub max_slots: Option<usize>,
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
        let standbys = self.workers.iter().filter(|p| p.held == 0).count();
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
/// worker knows its own.
pub fn peers(alive: &[LiveWorker], me: &str, my_held: usize, my_max: Option<usize>) -> Vec<Peer> {
    let mut out: Vec<Peer> = alive
        .iter()
        .filter(|w| w.id != me)
        .map(|w| Peer {
            id: w.id.clone(),
            held: w.held,
            max_slots: w.max_slots,
        })
        .collect();
    out.push(Peer {
        id: me.to_string(),
        held: my_held,
        max_slots: my_max,
    });
    out
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
        };
        let alive = [live("a", 1, None), live("b", 0, Some(2))];
        let p = peers(&alive, "a", 2, Some(3));
        assert_eq!(p.len(), 2);
        assert!(p.contains(&Peer {
            id: "a".into(),
            held: 2,
            max_slots: Some(3)
        }));
        assert!(p.contains(&Peer {
            id: "b".into(),
            held: 0,
            max_slots: Some(2)
        }));
        // A worker whose heartbeat is not in yet still counts itself.
        assert_eq!(peers(&[], "me", 0, None), [peer("me", 0)]);
    }
}
