//! What became of the slots this worker handed back to a standby.
//!
//! One hand-back at a time: until the slot handed back is held again, nothing more is
//! handed back, so one standby never gets two slots and none is left unheld. A
//! standby that leaves a slot handed to it untaken is passed over until it beats
//! again (see [`claim_policy::HandBack`]). The rule is [`claim_policy::hand_back_outcome`];
//! this keeps the memory it judges.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::db::heartbeat::LiveWorker;
use crate::worker::claim_policy::{self, HandBack};
use crate::worker::held_slot::HeldSlot;

/// A standby as a hand-back saw it: its id and the heartbeat it had then.
pub(crate) type Standby = (String, Option<i64>);

/// A slot handed back to a standby, until someone holds it again.
#[derive(Debug)]
struct HandedBack {
    slot: String,
    /// When it was handed back.
    at: Instant,
    /// The standbys of the moment, with their last heartbeats: passed over if none
    /// takes it.
    standbys: Vec<Standby>,
}

/// The last hand-back, and the standbys passed over.
#[derive(Debug, Default)]
pub(crate) struct HandBacks {
    /// A slot this worker handed back, until someone holds it again.
    last: Option<HandedBack>,
    /// Standbys that left a slot handed to them untaken, with the heartbeat they had
    /// then.
    passed_over: HashMap<String, Option<i64>>,
}

impl HandBacks {
    /// The standbys passed over, with the heartbeat each had then.
    pub(crate) fn passed_over(&self) -> &HashMap<String, Option<i64>> {
        &self.passed_over
    }

    /// Forgets the passed-over once they are no longer believed alive.
    pub(crate) fn keep_only(&mut self, alive: &[LiveWorker]) {
        self.passed_over
            .retain(|id, _| alive.iter().any(|w| &w.id == id));
    }

    /// `slot` was handed back at `at`, with these standbys live.
    pub(crate) fn handed(&mut self, slot: String, at: Instant, standbys: Vec<Standby>) {
        self.last = Some(HandedBack { slot, at, standbys });
    }

    /// False while the last hand-back has not been taken up yet (the slot is still
    /// unheld), for at most two leases (`lease` each): `held` are this worker's
    /// slots, `expired` whether a slot is expired in the survey just made.
    pub(crate) fn ready(
        &mut self,
        held: &[HeldSlot],
        expired: impl Fn(&str) -> bool,
        now: Instant,
        lease: Duration,
    ) -> bool {
        let Some(HandedBack { slot, at, .. }) = &self.last else {
            return true;
        };
        let releasing = held.iter().any(|h| &h.slot_id == slot && h.giving_back());
        let mine_again = held.iter().any(|h| &h.slot_id == slot && !h.giving_back());
        let outcome = claim_policy::hand_back_outcome(
            releasing,
            expired(slot),
            mine_again,
            now.saturating_duration_since(*at),
            lease,
        );
        match outcome {
            HandBack::Pending => return false,
            HandBack::Taken => {}
            HandBack::NotTaken => {
                let HandedBack { slot, standbys, .. } = self.last.take().expect("checked above");
                tracing::warn!(%slot, standbys = ?standbys.iter().map(|(id, _)| id).collect::<Vec<_>>(), "no standby took the slot handed back; passing them over until they send a heartbeat again");
                self.passed_over.extend(standbys);
            }
        }
        self.last = None;
        true
    }
}
