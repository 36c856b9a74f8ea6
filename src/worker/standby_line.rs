//! Standbys in line, not in a herd: who is alive, and where each worker stands (how
//! often it looks at the slots from there is [`crate::worker::claim_policy`]'s).
//!
//! Live workers with room for another slot stand in one line, standbys first. Only
//! the first [`FRONT`] (`--watchers`) watch the slots every tick; everyone behind
//! only beats every [`REAR_BEAT`] and reads its place, and learns of a vacancy by a
//! poke, by moving up to the front, or by a rare safety survey. This is the herd-effect
//! fix of ZooKeeper's lock recipe. The decisions here are pure; the queries are
//! [`crate::db::heartbeat::Roster`]'s. See docs/internals.md, "The standby line".

use std::time::Duration;

use crate::db::heartbeat::REAR_TICKS;

/// How many workers at the front of the line watch at full rate, by default
/// (`--watchers`).
pub(crate) const FRONT: u64 = 3;

/// Where a worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Among the first [`FRONT`]: watches every tick, wakes at the earliest expiry.
    Front,
    /// Behind them: beats and reads its place every [`REAR_BEAT`], surveys every
    /// [`SAFETY_SURVEY`](crate::worker::claim_policy::SAFETY_SURVEY) at most.
    Rear,
}

impl Place {
    /// The place of a worker with `ahead` live workers with room before it, when the
    /// first `watchers` watch.
    pub(crate) fn behind(ahead: u64, watchers: u64) -> Place {
        if ahead < watchers {
            Place::Front
        } else {
            Place::Rear
        }
    }
}

/// Whether a worker re-reads its place in line after this heartbeat. Behind the
/// front, every beat: a worker moves up when one ahead claims a slot or dies, and
/// must start watching then. At the front, only when what it holds changed or every
/// [`FRONT_PLACE_BEATS`] beats: a front worker can only move back (a worker with a
/// smaller id joined, say), and one that watches a little longer than it must costs
/// a few surveys, never a missed expiry. In a pool no larger than its watchers
/// (three workers, say), that is most of the line's reads.
pub(crate) fn place_due(
    place: Place,
    holding_changed: bool,
    since_read: Option<Duration>,
    beat: Duration,
) -> bool {
    match (place, since_read) {
        (_, None) => true,
        (Place::Rear, _) => true,
        (Place::Front, Some(age)) => holding_changed || age >= beat * FRONT_PLACE_BEATS,
    }
}

/// How long a poked worker waits before it re-reads its place: not at all when its
/// last read is a tick old (or it never read one), else until it is. A poke says
/// someone ahead may have claimed, so this worker may have moved up; the poke's own
/// survey (not held back) already finds what there is to claim, and the place only
/// sets the pace of the looks that follow, so a tick late costs nothing. At a cold
/// start every claimer pokes the same first standbys, each up to ten times a second
/// (see [`crate::worker::poke::spacing`]): one place read each per poke was most of
/// what the line read from the database then.
pub(crate) fn poked_place_in(since_read: Option<Duration>, tick: Duration) -> Duration {
    since_read.map_or(Duration::ZERO, |age| tick.saturating_sub(age))
}

/// How many standbys a standby that just claimed one of `seen` claimable slots
/// pokes: one for each slot it left, and `watchers` for the front it leaves.
pub(crate) fn successors_to_poke(seen: usize, watchers: u64) -> u64 {
    (seen.saturating_sub(1) as u64).saturating_add(watchers)
}

/// At the front, a worker re-reads its place once per this many heartbeats (see
/// [`place_due`]).
pub(crate) const FRONT_PLACE_BEATS: u32 = 6;

/// How far apart heartbeats are at the front of the line (besides the one sent at
/// once whenever what a worker holds changes): every [`REAR_TICKS`] ticks, so a
/// watcher that dies without a word is no longer believed (and the next in line
/// moves up) within [`believed_for`](crate::db::heartbeat::believed_for) this, 11 s at the default tick.
pub(crate) fn beat_every(tick: Duration) -> Duration {
    tick * REAR_TICKS
}

/// How far apart a worker's heartbeats are, where it stands: at the front, every
/// [`beat_every`]; behind it, every [`REAR_BEAT`] (or the front's pace, when that is
/// longer).
///
/// Each heartbeat is believed for [`believed_for`](crate::db::heartbeat::believed_for)
/// the pace it promised, so a worker that moves up beats again at once at the front's
/// pace. See docs/internals.md, "The standby line".
pub(crate) fn beat_pace(place: Place, tick: Duration) -> Duration {
    match place {
        Place::Front => beat_every(tick),
        Place::Rear => beat_every(tick).max(REAR_BEAT),
    }
}

/// A rear worker's heartbeat period: 40 s (the first at it at a random point of its
/// second half, [`next_beat_in`]). Its heartbeat and the read of its place with it
/// are then 0.05 requests a second, and the driver's monitors (one `hello` a minute
/// from the lease's client, one every 5 minutes from the robots') 0.02: 0.07 in all,
/// under the 0.1 a standby may cost. Longer would cost more than it saves where it shows:
/// a dead rear worker is believed for two beats and a second (81 s), and a worker
/// restarted under the same `ip:port` waits that long for its predecessor's
/// heartbeat to lapse before it runs (see `identity::take_identity`).
pub(crate) const REAR_BEAT: Duration = Duration::from_secs(40);

/// How much earlier than its pace the first heartbeat at a pace may come: up to half
/// of it (see [`next_beat_in`]).
pub(crate) const FIRST_BEAT_SPREAD: f64 = 0.5;

/// How long after a heartbeat that promised `pace` the next one comes, `random` being
/// a number in `[0, 1)`: the pace itself, except after the `first` beat at a pace (a
/// worker's first, its first after it moved, its first after a failed beat), when it
/// comes at a random point of the pace's second half. Never later than the pace (the
/// heartbeat is believed for two of them).
///
/// The random first beat keeps workers that started or moved together from beating
/// together for ever; later beats keep the pace exactly, so a settled standby costs
/// what its pace says (see docs/bench/2026-11-26-a-pool-of-200-workers.md).
pub(crate) fn next_beat_in(pace: Duration, first: bool, random: f64) -> Duration {
    if first {
        pace.mul_f64(1.0 - FIRST_BEAT_SPREAD * random.clamp(0.0, 1.0))
    } else {
        pace
    }
}

/// How many times the worker's usual bound (`line_keeper::op_timeout`) a standby waits for its
/// heartbeat and the read of its place.
///
/// A standby has no lease for a slow answer to hold back, and an abandoned request
/// still loads the server and costs a new connection's handshake; `/livez` still sees
/// the loop within `status::stuck_after` (see
/// docs/bench/2026-11-26-a-pool-of-200-workers.md).
pub(crate) const STANDBY_PATIENCE: u32 = 3;

/// How old an observation of the server's clock may grow before a heartbeat reads
/// it again (one `hello`). It is carried forward on the local monotonic clock, which
/// drifts by parts per million, and it only narrows what a survey reads: a `hello`
/// with every heartbeat (every 5 ticks) was a tenth of an idle pool's requests,
/// and one every 30 s still 3 %. Surveys and place reads return the server's clock
/// too, so the `hello` is for a worker that made neither for this long.
/// Refreshed this often, a step of the server's wall clock is caught up within it.
pub(crate) const CLOCK_REFRESH: Duration = Duration::from_secs(60);

/// How often the first in line marks slots without `expires_ms` (inserted by hand
/// or by an older version) so the survey's index sees them: at its start, and then
/// this often rather than with every heartbeat.
pub(crate) const MARK_EVERY: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_few_watch_the_rest_look_now_and_then() {
        assert_eq!(Place::behind(0, FRONT), Place::Front);
        assert_eq!(Place::behind(FRONT - 1, FRONT), Place::Front);
        assert_eq!(Place::behind(FRONT, FRONT), Place::Rear);
        assert_eq!(Place::behind(0, 1), Place::Front);
        assert_eq!(Place::behind(1, 1), Place::Rear);
    }

    #[test]
    fn the_front_rereads_its_place_rarely_the_rear_every_beat() {
        let beat = beat_every(T);
        assert!(place_due(Place::Front, false, None, beat), "never read");
        assert!(place_due(Place::Rear, false, Some(Duration::ZERO), beat));
        assert!(!place_due(Place::Front, false, Some(beat * 5), beat));
        assert!(place_due(
            Place::Front,
            false,
            Some(beat * FRONT_PLACE_BEATS),
            beat
        ));
        assert!(
            place_due(Place::Front, true, Some(Duration::ZERO), beat),
            "what it holds changed: its place did too"
        );
    }

    #[test]
    fn a_poked_worker_rereads_its_place_at_most_once_a_tick() {
        assert_eq!(poked_place_in(None, T), Duration::ZERO, "never read");
        assert_eq!(poked_place_in(Some(T), T), Duration::ZERO);
        assert_eq!(poked_place_in(Some(T * 3), T), Duration::ZERO);
        assert_eq!(
            poked_place_in(Some(Duration::from_millis(300)), T),
            Duration::from_millis(700),
            "read a moment ago: again when that is a tick old"
        );
        assert_eq!(poked_place_in(Some(Duration::ZERO), T), T);
    }

    #[test]
    fn the_rear_beats_slowly_and_costs_under_a_tenth_of_a_request_a_second() {
        assert_eq!(beat_pace(Place::Front, T), T * REAR_TICKS);
        assert_eq!(beat_pace(Place::Rear, T), REAR_BEAT);
        let long = Duration::from_secs(100);
        assert_eq!(
            beat_pace(Place::Rear, long),
            long * REAR_TICKS,
            "never faster than the front"
        );
        let every = crate::worker::claim_policy::safety_survey_every(T);
        // What an idle rear standby asks, per second: its heartbeat and place every
        // REAR_BEAT, the driver's two monitors (the lease's and the robots'), and a
        // survey per 3/4 of the safety period on average.
        let per_s = 2.0 / REAR_BEAT.as_secs_f64()
            + 1.0 / crate::db::store::LEASE_MONITOR_EVERY.as_secs_f64()
            + 1.0 / crate::db::store::MONITOR_EVERY.as_secs_f64()
            + 1.0 / (0.75 * every.as_secs_f64());
        assert!(per_s <= 0.1, "{per_s:.3} requests a second");
    }

    #[test]
    fn the_first_heartbeat_at_a_pace_comes_in_its_second_half_the_rest_at_the_pace() {
        assert_eq!(next_beat_in(REAR_BEAT, false, 0.0), REAR_BEAT);
        assert_eq!(next_beat_in(REAR_BEAT, false, 0.7), REAR_BEAT);
        assert_eq!(next_beat_in(REAR_BEAT, true, 0.0), REAR_BEAT);
        assert_eq!(next_beat_in(REAR_BEAT, true, 0.5), Duration::from_secs(30));
        assert_eq!(next_beat_in(REAR_BEAT, true, 1.0), Duration::from_secs(20));
        assert_eq!(
            next_beat_in(REAR_BEAT, true, 7.0),
            Duration::from_secs(20),
            "clamped"
        );
        assert_eq!(next_beat_in(REAR_BEAT, true, -1.0), REAR_BEAT, "clamped");
        // Never later than promised, whatever the pace.
        for pace in [T, T * REAR_TICKS, REAR_BEAT, Duration::from_secs(500)] {
            for r in [0.0, 0.3, 0.999_999] {
                let next = next_beat_in(pace, true, r);
                assert!(next <= pace && next >= pace / 2, "{pace:?} {r}: {next:?}");
            }
        }
        // Workers that moved back together spread over 20 s; after that, 40 s apart:
        // no 60 s holds more than two of one worker's beats after its first at the
        // rear's pace, and a settled worker beats no more often than its pace.
        let at: Vec<Duration> = (0..200)
            .map(|i| next_beat_in(REAR_BEAT, true, i as f64 / 200.0))
            .collect();
        let spread = *at.iter().max().unwrap() - *at.iter().min().unwrap();
        assert!(spread >= Duration::from_millis(19_800), "{spread:?}");
        assert!(next_beat_in(REAR_BEAT, false, 0.999) * 2 > Duration::from_secs(60));
    }

    #[test]
    fn a_claimer_pokes_one_successor_per_slot_left_and_the_front_it_leaves() {
        assert_eq!(successors_to_poke(1, 3), 3);
        assert_eq!(successors_to_poke(10, 3), 12);
        assert_eq!(successors_to_poke(0, 1), 1);
    }
}
