//! What happens when a robot's run ends without being asked to: start it again after
//! a backoff, or give up and mark it `failed`.
//!
//! The policy is the robot's own, `spec.restart: {attempts, within, max_backoff}`: a
//! robot that ends `attempts` times within `within` is not started again. The backoff
//! starts at [`FIRST_BACKOFF`] and doubles up to `max_backoff`, and starts over after
//! a [`HEALTHY_RUN`]. The defaults ([`RestartPolicy::default`]) ride out an outage of
//! several minutes yet stop a crash loop within about a minute and a half. [`Budget`]
//! is the decision alone, on instants it is given, so its tests are exact.

use std::collections::VecDeque;
use std::time::Duration;

use bson::{Bson, Document};
use tokio::time::Instant;

use super::spec_duration;

/// The backoff before the first restart.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The least backoff after a run that could not start (a bad spec, an unknown kind, a
/// command the exec policy refuses): trying again at once would only repeat it.
pub(crate) const INVALID_BACKOFF: Duration = Duration::from_secs(2);
/// A run this long resets the backoff: it was healthy, the next end is news.
pub(crate) const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// The spec field that holds a robot's restart policy.
pub(crate) const SPEC_FIELD: &str = "restart";

crate::db::words::words! {
    /// Which ends of a run start the robot again (`spec.restart.on`).
    RestartOn {
        /// Every end: a daemon (the default without a schedule).
        Always => "always",
        /// A failure (an exit other than 0, a crash); an exit 0 completes the robot,
        /// or, on a schedule, ends the firing's run.
        Failure => "failure",
        /// None: the run's end is final (the default on a schedule).
        Never => "never",
    }
}

/// When to stop restarting a robot, and how long to wait between its runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RestartPolicy {
    /// Which ends start it again.
    pub(crate) on: RestartOn,
    /// How many ends within [`RestartPolicy::within`] make the robot `failed`.
    pub(crate) attempts: u32,
    pub(crate) within: Duration,
    /// The longest backoff between two runs.
    pub(crate) max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            on: RestartOn::Always,
            attempts: 10,
            within: Duration::from_secs(600),
            max_backoff: Duration::from_secs(60),
        }
    }
}

impl RestartPolicy {
    /// Reads `spec.restart` (absent: the defaults). The spec is written by whoever
    /// may write robot documents, so every value is checked and bounded.
    pub(crate) fn from_spec(spec: &Document) -> Result<RestartPolicy, String> {
        let scheduled = !matches!(
            spec.get(super::schedule::SPEC_FIELD),
            None | Some(Bson::Null)
        );
        let mut policy = RestartPolicy::default();
        if scheduled {
            policy.on = RestartOn::Never;
        }
        let restart = match spec.get(SPEC_FIELD) {
            None | Some(Bson::Null) => return Ok(policy),
            Some(Bson::Document(d)) => d,
            Some(other) => {
                return Err(format!(
                    "spec.restart must be a document such as {{\"attempts\": 3, \"within\": \"1m\"}}, found {other}"
                ))
            }
        };
        for key in restart.keys() {
            if !["on", "attempts", "within", "max_backoff"].contains(&key.as_str()) {
                return Err(format!(
                    "spec.restart.{} is not a setting: use on, attempts, within, max_backoff",
                    crate::printable::escape(key)
                ));
            }
        }
        if let Some(v) = restart.get("on") {
            let words = "always, failure, never";
            policy.on = match v {
                Bson::String(w) => RestartOn::parse(w.trim()).ok_or_else(|| {
                    format!(
                        "spec.restart.on {:?} is not one of: {words}",
                        crate::printable::escape(w)
                    )
                })?,
                other => {
                    return Err(format!(
                        "spec.restart.on must be one of {words}, found {other}"
                    ))
                }
            };
            if scheduled && policy.on == RestartOn::Always {
                return Err("spec.restart.on \"always\" cannot go with spec.schedule: a scheduled run ends, and its next firing starts the next one; use \"failure\" (a failed run is tried again) or \"never\"".into());
            }
        }
        if let Some(v) = restart.get("attempts") {
            let n = match v {
                Bson::Int32(n) => *n as i64,
                Bson::Int64(n) => *n,
                other => {
                    return Err(format!(
                        "spec.restart.attempts must be a whole number, found {other}"
                    ))
                }
            };
            if !(1..=1_000_000).contains(&n) {
                return Err(format!(
                    "spec.restart.attempts must be between 1 and 1000000, got {n}"
                ));
            }
            policy.attempts = n as u32;
        }
        if let Some(v) = restart.get("within") {
            policy.within = spec_duration("restart.within", v, Duration::from_secs(1), MAX_WITHIN)?;
        }
        if let Some(v) = restart.get("max_backoff") {
            policy.max_backoff = spec_duration(
                "restart.max_backoff",
                v,
                FIRST_BACKOFF,
                Duration::from_secs(3600),
            )?;
        }
        Ok(policy)
    }
}

/// The longest `within`: a week of ends remembered is already more than anyone reads.
const MAX_WITHIN: Duration = Duration::from_secs(7 * 24 * 3600);

/// What to do after a run ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Start it again after this long.
    RestartAfter(Duration),
    /// It ended `attempts` times within `within`: stop and mark it failed.
    GiveUp { ends: u32, within: Duration },
}

/// One robot instance's record of its ends, judged by its policy.
#[derive(Debug)]
pub(crate) struct Budget {
    policy: RestartPolicy,
    /// When each end within the window came, oldest first.
    ends: VecDeque<Instant>,
    backoff: Duration,
}

impl Budget {
    pub(crate) fn new(policy: RestartPolicy) -> Self {
        Budget {
            policy,
            ends: VecDeque::new(),
            backoff: FIRST_BACKOFF,
        }
    }

    /// The policy in force.
    pub(crate) fn policy(&self) -> RestartPolicy {
        self.policy
    }

    /// The policy may change between runs (the spec is read at each start); the ends
    /// counted so far still count.
    pub(crate) fn set_policy(&mut self, policy: RestartPolicy) {
        self.policy = policy;
    }

    /// Takes over the ends an earlier instance recorded (oldest first), so a crash
    /// loop on a slot that changes hands still reaches its limit. Only those within
    /// the policy's window at `now` count, and the backoff goes on from where they
    /// left it.
    pub(crate) fn restore(&mut self, ends: impl IntoIterator<Item = Instant>, now: Instant) {
        for end in ends {
            if now.saturating_duration_since(end) >= self.policy.within {
                continue;
            }
            self.ends.push_back(end);
            self.backoff = (self.backoff * 2).min(self.policy.max_backoff.max(FIRST_BACKOFF));
        }
    }

    /// A run that began at `began` ended by itself at `now`; `invalid` when it could not
    /// start at all (its backoff is at least [`INVALID_BACKOFF`]).
    pub(crate) fn ended(&mut self, began: Instant, now: Instant, invalid: bool) -> Next {
        if now.saturating_duration_since(began) >= HEALTHY_RUN {
            self.backoff = FIRST_BACKOFF;
        }
        self.ends.push_back(now);
        while let Some(&first) = self.ends.front() {
            if now.saturating_duration_since(first) >= self.policy.within {
                self.ends.pop_front();
            } else {
                break;
            }
        }
        if self.ends.len() >= self.policy.attempts as usize {
            return Next::GiveUp {
                ends: self.ends.len() as u32,
                within: self.policy.within,
            };
        }
        let floor = if invalid {
            INVALID_BACKOFF
        } else {
            FIRST_BACKOFF
        };
        let wait = self
            .backoff
            .max(floor)
            .min(self.policy.max_backoff.max(floor));
        self.backoff = (wait * 2).min(self.policy.max_backoff);
        Next::RestartAfter(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn policy(attempts: u32, within_s: u64, max_backoff_s: u64) -> RestartPolicy {
        RestartPolicy {
            on: RestartOn::Always,
            attempts,
            within: Duration::from_secs(within_s),
            max_backoff: Duration::from_secs(max_backoff_s),
        }
    }

    #[test]
    fn three_quick_ends_within_a_minute_give_up_on_the_third() {
        let mut b = Budget::new(policy(3, 60, 30));
        let t = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(
            b.ended(t, t + s(1), false),
            Next::RestartAfter(FIRST_BACKOFF)
        );
        assert_eq!(
            b.ended(t + s(2), t + s(3), false),
            Next::RestartAfter(FIRST_BACKOFF * 2)
        );
        assert_eq!(
            b.ended(t + s(4), t + s(5), false),
            Next::GiveUp {
                ends: 3,
                within: s(60)
            }
        );
    }

    #[test]
    fn ends_restored_from_an_earlier_holder_count_toward_the_limit() {
        let t = Instant::now() + Duration::from_secs(3600);
        let s = Duration::from_secs;
        let mut b = Budget::new(policy(4, 60, 30));
        // Two ends on the last holder, 20 s and 10 s ago; one from before the window.
        b.restore([t - s(90), t - s(20), t - s(10)], t);
        assert_eq!(
            b.backoff,
            FIRST_BACKOFF * 4,
            "two ends in the window, two doublings"
        );
        assert!(matches!(b.ended(t, t + s(1), false), Next::RestartAfter(_)));
        assert_eq!(
            b.ended(t + s(2), t + s(3), false),
            Next::GiveUp {
                ends: 4,
                within: s(60)
            },
            "two here and two there make four"
        );
        let mut fresh = Budget::new(policy(4, 60, 30));
        assert!(matches!(
            fresh.ended(t, t + s(1), false),
            Next::RestartAfter(_)
        ));
        assert!(matches!(
            fresh.ended(t + s(2), t + s(3), false),
            Next::RestartAfter(_)
        ));
    }

    #[test]
    fn ends_older_than_the_window_no_longer_count() {
        let mut b = Budget::new(policy(3, 60, 30));
        let t = Instant::now();
        let s = Duration::from_secs;
        assert!(matches!(b.ended(t, t + s(1), false), Next::RestartAfter(_)));
        assert!(matches!(
            b.ended(t + s(2), t + s(30), false),
            Next::RestartAfter(_)
        ));
        // The first end (at 1 s) is 61 s old by now: two ends in the window.
        assert!(matches!(
            b.ended(t + s(31), t + s(62), false),
            Next::RestartAfter(_)
        ));
        // And now three: 30 s, 62 s, 63 s.
        assert!(matches!(
            b.ended(t + s(62), t + s(63), false),
            Next::GiveUp { ends: 3, .. }
        ));
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_a_healthy_run_resets_it() {
        let mut b = Budget::new(policy(1000, 3600, 1));
        let t = Instant::now();
        let waits: Vec<Duration> = (0..5)
            .map(|_| match b.ended(t, t, false) {
                Next::RestartAfter(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(waits, [ms(200), ms(400), ms(800), ms(1000), ms(1000)]);
        // A run of HEALTHY_RUN starts over.
        assert_eq!(
            b.ended(t, t + HEALTHY_RUN, false),
            Next::RestartAfter(FIRST_BACKOFF)
        );
        // A run that could not start waits at least INVALID_BACKOFF, even past the cap.
        assert_eq!(b.ended(t, t, true), Next::RestartAfter(INVALID_BACKOFF));
    }

    #[test]
    fn the_defaults_stop_an_instant_crash_loop_within_two_minutes() {
        let mut b = Budget::new(RestartPolicy::default());
        let t0 = Instant::now();
        let mut now = t0;
        let mut starts = 1;
        loop {
            match b.ended(now, now, false) {
                Next::RestartAfter(d) => {
                    now += d;
                    starts += 1;
                }
                Next::GiveUp { ends, .. } => {
                    assert_eq!(ends, 10);
                    break;
                }
            }
        }
        assert_eq!(starts, 10);
        // 0.2 + 0.4 + … + 51.2 s of backoff.
        assert_eq!(now - t0, Duration::from_millis(102_200));
    }

    #[test]
    fn the_spec_is_read_and_checked() {
        assert_eq!(
            RestartPolicy::from_spec(&doc! {}),
            Ok(RestartPolicy::default())
        );
        let p =
            RestartPolicy::from_spec(&doc! {"restart": {"attempts": 3, "within": "1m"}}).unwrap();
        assert_eq!((p.attempts, p.within), (3, Duration::from_secs(60)));
        assert_eq!(p.max_backoff, RestartPolicy::default().max_backoff);
        let p = RestartPolicy::from_spec(&doc! {"restart": {"max_backoff": "5s"}}).unwrap();
        assert_eq!(p.max_backoff, Duration::from_secs(5));
        for (bad, says) in [
            (doc! {"restart": 3}, "must be a document"),
            (doc! {"restart": {"attempts": 0}}, "between 1 and"),
            (doc! {"restart": {"attempts": "3"}}, "whole number"),
            (doc! {"restart": {"within": 60}}, "a duration such as"),
            (doc! {"restart": {"within": "soon"}}, "spec.restart.within"),
            (doc! {"restart": {"within": "10ms"}}, "between 1s and"),
            (doc! {"restart": {"max_backoff": "2h"}}, "between"),
            (doc! {"restart": {"retries": 3}}, "not a setting"),
            (
                doc! {"restart": {"on": "sometimes"}},
                "is not one of: always, failure, never",
            ),
            (doc! {"restart": {"on": true}}, "must be one of"),
            (
                doc! {"schedule": {"every": "1m"}, "restart": {"on": "always"}},
                "cannot go with spec.schedule",
            ),
        ] {
            let e = RestartPolicy::from_spec(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn restart_on_defaults_to_always_and_to_never_on_a_schedule() {
        let on = |spec: Document| RestartPolicy::from_spec(&spec).unwrap().on;
        assert_eq!(on(doc! {}), RestartOn::Always);
        assert_eq!(on(doc! {"schedule": {"every": "1m"}}), RestartOn::Never);
        assert_eq!(on(doc! {"restart": {"on": "failure"}}), RestartOn::Failure);
        assert_eq!(
            on(doc! {"schedule": {"every": "1m"}, "restart": {"on": "failure"}}),
            RestartOn::Failure
        );
        assert_eq!(on(doc! {"restart": {"on": "never"}}), RestartOn::Never);
    }
}
