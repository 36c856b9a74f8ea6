//! Holding one slot, as one explicit state.
//!
//! A held slot is [`Holding::Renewing`] on time, or [`Holding::Suspended`] (no
//! renewal before its local deadline: the robots wait, suspended, while late
//! renewals go out), until it leaves by one of two ways: [`Holding::Releasing`]
//! (handed back, drained or shut down) or [`Holding::Lost`] (taken, fenced, or given
//! up while suspended). [`Holding::step`] takes what the last renewal (or the
//! worker) did and returns the next state with what to carry out, in order. It is
//! pure: time comes in with each step. The held slot's task
//! (`held_slot::hold`) only waits, sends and carries out.

use std::time::Duration;

use tokio::time::Instant;

use crate::db::event::EventKind;
use crate::db::lease::Renewed;
use crate::metrics::SuspensionOutcome;

/// How a held slot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Given back on request (hand-back or shutdown): robots stopped, slot released.
    Released,
    /// An operator drained it: robots stopped, slot released.
    Drained,
    /// Lost to another worker, removed, or self-fenced: robots stopped at once.
    Lost,
}

/// Where a held slot is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Holding {
    /// Renewing on time: the next renewal goes at `next`, or at the deadline if that
    /// comes first. `at_edges`: the renewals go just after the tick's edges, where
    /// firings fall (see `RenewalTiming`).
    Renewing { next: Instant, at_edges: bool },
    /// No renewal before the local deadline: the robots are suspended, not stopped.
    Suspended(RideOut),
    /// Handed back, drained or shut down: the robots stop (each may write a last
    /// checkpoint), then the slot is released.
    Releasing(Ended),
    /// Taken, fenced, or given up while suspended: the guard is revoked and the
    /// robots stop at once; `kind` is the event that says so.
    Lost { kind: EventKind, detail: String },
}

/// A suspension under way: late renewals go out until one matches (resume), the
/// slot proves taken (lost), or `until` passes (`--suspend-for` past the deadline).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RideOut {
    pub(crate) since: Instant,
    pub(crate) until: Instant,
    /// The robots suspended.
    pub(crate) robots: usize,
    /// When the next late renewal goes.
    pub(crate) next: Instant,
    /// Late renewals that failed so far.
    pub(crate) failures: u32,
    /// The renewals' phase before, kept for the resume.
    pub(crate) at_edges: bool,
}

/// What happened since the last step.
#[derive(Debug)]
pub(crate) enum Seen {
    /// The worker asked for the slot back (a hand-back or shutdown).
    ReleaseAsked,
    /// A renewal sent on time at `sent` answered.
    Renewal { sent: Instant, answer: Answer },
    /// A late renewal sent at `sent` answered (or got no answer in time: `Failed`).
    LateRenewal { sent: Instant, answer: Answer },
    /// `--suspend-for` passed since the deadline with no late renewal matching.
    OutOfTime,
}

/// What a renewal did.
#[derive(Debug)]
pub(crate) enum Answer {
    /// It matched, after `latency`; `advance` is how much earlier than a tick on the
    /// next one goes, to fall just after the tick's edge (None: keep its own phase).
    Renewed {
        renewed: Renewed,
        latency: Duration,
        advance: Option<Duration>,
    },
    /// It failed for a reason the next one may not have.
    Failed { why: String },
    /// The local deadline passed with no renewal: never renew on time again.
    DeadlinePassed { detail: String },
    /// The slot has another epoch, or is gone.
    Lost { detail: String },
}

/// What the step knows besides the state: the time, the lease, the settings.
#[derive(Debug, Clone)]
pub(crate) struct Facts<'a> {
    pub(crate) now: Instant,
    pub(crate) slot: &'a str,
    pub(crate) epoch: i64,
    /// The lease's local deadline, as of the last renewal that matched.
    pub(crate) deadline: Instant,
    pub(crate) tick: Duration,
    pub(crate) suspend_for: Duration,
    /// The robots running now.
    pub(crate) robots: usize,
}

/// One thing to carry out, in the order given.
#[derive(Debug, PartialEq)]
pub(crate) enum Do {
    /// Let the robots write until the lease's new deadline.
    ExtendGuard,
    /// Let no robot write again (before anything else of a loss).
    RevokeGuard,
    /// Suspend the robots: their futures are not polled until the resume.
    SuspendRobots,
    /// New clients (a connection left open across an outage would hold each first
    /// write in doubt), then the guard to the new deadline, then the robots go on.
    ResumeRobots,
    /// Pace the robots' writes by this renewal's round trip.
    Pace(Duration),
    /// Tell the robots' supervisor of the renewal: `rev` is the slot's robot
    /// revision, `per_command` the round trip per command (zero: not measured).
    Beat { rev: i64, per_command: Duration },
    /// Report a step of the slot's life (log, metrics, status, events).
    Report(SlotEvent),
}

/// A step in one held slot's life, reported to the log, the metrics, the worker's
/// status and `events` at once (`held_slot::report`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SlotEvent {
    /// A renewal landed after `latency`; `rev` is the slot's robot revision.
    Renewed { latency: Duration, rev: i64 },
    /// The renewals moved to just after the tick's edges (`at_edges`) or back to
    /// their own phase.
    Phase { at_edges: bool },
    /// A renewal failed for a reason the next one may not have; `left` until the
    /// local deadline.
    RenewFailed { why: String, left: Duration },
    /// An operator drained the slot: it is being handed back.
    Draining,
    /// Taken by another worker or removed: robots are being stopped.
    Lost { detail: String },
    /// No renewal succeeded before the local deadline: robots are being stopped.
    SelfFenced { detail: String },
    /// No renewal succeeded before the local deadline: the `robots` are suspended
    /// while the holder renews late.
    Suspended { robots: usize },
    /// A late renewal failed; `tries` so far.
    LateRenewalFailed { why: String, tries: u32 },
    /// A late renewal matched `after` the suspension began: the robots go on.
    Resumed { robots: usize, after: Duration },
    /// The suspension ended without a renewal: the robots are being killed.
    SuspensionEnded {
        outcome: SuspensionOutcome,
        robots: usize,
        detail: String,
    },
    /// The robots of a lost (`kind` "lost") or self-fenced ("self_fence") slot are
    /// all stopped.
    RobotsStopped { kind: EventKind, detail: String },
    /// A hand-back, drain or shutdown: the `running` robots are being stopped
    /// (each may write a last checkpoint) before the slot is released.
    Releasing { running: usize },
    /// The slot was released: a standby may take it at once.
    Released,
    /// The release did not land; the slot expires by itself.
    ReleaseFailed { why: String },
    /// The held slot is over, however it ended.
    Left,
}

impl Holding {
    /// A freshly claimed slot, whose first renewal goes at `first`.
    pub(crate) fn claimed(first: Instant) -> Holding {
        Holding::Renewing {
            next: first,
            at_edges: false,
        }
    }

    /// The next state after `seen`, with what to carry out on the way there.
    pub(crate) fn step(self, seen: Seen, f: &Facts) -> (Holding, Vec<Do>) {
        match (self, seen) {
            (Holding::Renewing { .. }, Seen::ReleaseAsked) => {
                (Holding::Releasing(Ended::Released), vec![])
            }
            (Holding::Renewing { at_edges, .. }, Seen::Renewal { sent, answer }) => {
                renewal(at_edges, sent, answer, f)
            }
            (Holding::Suspended(s), Seen::ReleaseAsked) => s.ended(
                SuspensionOutcome::Stopped,
                "the slot was given up while suspended".into(),
            ),
            (Holding::Suspended(s), Seen::OutOfTime) => s.ended(
                SuspensionOutcome::Expired,
                format!(
                    "no renewal within --suspend-for {} past the deadline",
                    humantime::format_duration(f.suspend_for)
                ),
            ),
            (Holding::Suspended(s), Seen::LateRenewal { sent, answer }) => {
                s.late_renewal(sent, answer, f)
            }
            // A slot on its way out stays so, whatever comes after.
            (state @ (Holding::Releasing(_) | Holding::Lost { .. }), _) => (state, vec![]),
            // Nothing else can be seen in a state: the task waits for what each state
            // waits for (a renewal on time while renewing, a late one or the end of
            // --suspend-for while suspended). A pair outside that is a bug in the
            // task, caught in tests; in a release build the state stays as it was.
            (state, seen) => {
                debug_assert!(false, "{state:?} cannot see {seen:?}");
                (state, vec![])
            }
        }
    }
}

/// A renewal sent on time answered.
fn renewal(at_edges: bool, sent: Instant, answer: Answer, f: &Facts) -> (Holding, Vec<Do>) {
    match answer {
        Answer::Renewed {
            renewed,
            latency,
            advance,
        } => {
            let mut doing = vec![
                Do::ExtendGuard,
                Do::Report(SlotEvent::Renewed {
                    latency,
                    rev: renewed.rev,
                }),
            ];
            if renewed.draining {
                doing.push(Do::Report(SlotEvent::Draining));
                return (Holding::Releasing(Ended::Drained), doing);
            }
            let edges = advance.is_some();
            if edges != at_edges {
                doing.push(Do::Report(SlotEvent::Phase { at_edges: edges }));
            }
            doing.push(Do::Pace(latency));
            doing.push(Do::Beat {
                rev: renewed.rev,
                per_command: latency / renewed.commands.max(1),
            });
            let next = sent + f.tick - advance.unwrap_or_default();
            (
                Holding::Renewing {
                    next,
                    at_edges: edges,
                },
                doing,
            )
        }
        Answer::Failed { why } => {
            let left = f.deadline.saturating_duration_since(f.now);
            let next = f.now + (f.tick / 4).min(left);
            (
                Holding::Renewing { next, at_edges },
                vec![Do::Report(SlotEvent::RenewFailed { why, left })],
            )
        }
        Answer::DeadlinePassed { .. } if !f.suspend_for.is_zero() => {
            let s = RideOut {
                since: f.now,
                until: f.deadline + f.suspend_for,
                robots: f.robots,
                next: f.now,
                failures: 0,
                at_edges,
            };
            let doing = vec![
                Do::SuspendRobots,
                Do::Report(SlotEvent::Suspended { robots: f.robots }),
            ];
            (Holding::Suspended(s), doing)
        }
        Answer::DeadlinePassed { detail } => lost(
            EventKind::SelfFence,
            SlotEvent::SelfFenced {
                detail: detail.clone(),
            },
            detail,
        ),
        Answer::Lost { detail } => lost(
            EventKind::Lost,
            SlotEvent::Lost {
                detail: detail.clone(),
            },
            detail,
        ),
    }
}

/// The slot is lost: the guard first, so nothing more of the robots' is written,
/// then the report.
fn lost(kind: EventKind, event: SlotEvent, detail: String) -> (Holding, Vec<Do>) {
    (
        Holding::Lost { kind, detail },
        vec![Do::RevokeGuard, Do::Report(event)],
    )
}

impl RideOut {
    fn late_renewal(mut self, sent: Instant, answer: Answer, f: &Facts) -> (Holding, Vec<Do>) {
        match answer {
            Answer::Renewed { renewed, .. } => {
                let mut doing = vec![
                    Do::ResumeRobots,
                    Do::Report(SlotEvent::Resumed {
                        robots: self.robots,
                        after: f.now.saturating_duration_since(self.since),
                    }),
                ];
                if renewed.draining {
                    doing.push(Do::Report(SlotEvent::Draining));
                    return (Holding::Releasing(Ended::Drained), doing);
                }
                // Not measured: a late renewal's round trip says nothing of the link.
                doing.push(Do::Beat {
                    rev: renewed.rev,
                    per_command: Duration::ZERO,
                });
                let next = sent + f.tick;
                (
                    Holding::Renewing {
                        next,
                        at_edges: self.at_edges,
                    },
                    doing,
                )
            }
            Answer::Lost { .. } => self.ended(
                SuspensionOutcome::Lost,
                format!(
                    "lost slot {} (epoch {}) while suspended: another worker claimed it",
                    f.slot, f.epoch
                ),
            ),
            Answer::Failed { why } | Answer::DeadlinePassed { detail: why } => {
                self.failures += 1;
                // At once after an answer that came too late (the link is back);
                // otherwise a quarter tick after the last sending.
                self.next = (sent + f.tick / 4).min(self.until);
                let event = SlotEvent::LateRenewalFailed {
                    why,
                    tries: self.failures,
                };
                (Holding::Suspended(self), vec![Do::Report(event)])
            }
        }
    }

    /// The suspension ends without a renewal: the robots are killed, never thawed.
    fn ended(self, outcome: SuspensionOutcome, detail: String) -> (Holding, Vec<Do>) {
        let kind = match outcome {
            SuspensionOutcome::Lost => EventKind::Lost,
            _ => EventKind::SelfFence,
        };
        let event = SlotEvent::SuspensionEnded {
            outcome,
            robots: self.robots,
            detail: detail.clone(),
        };
        lost(kind, event, detail)
    }

    /// Whether `--suspend-for` has passed since the deadline.
    pub(crate) fn out_of_time(&self, now: Instant) -> bool {
        now >= self.until
    }

    /// How long a late renewal sent at `sent` is waited for: a tick, or until the
    /// suspension is out of time. A link that holds its bytes (a partition, a paused
    /// server) answers it the moment it heals, while one stuck on a connection that
    /// will never answer (a server restarted under it) is replaced in time to renew
    /// within the lease of contact the standbys give this holder.
    pub(crate) fn give_up_at(&self, sent: Instant, tick: Duration) -> Instant {
        (sent + tick).min(self.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(1000);
    const SUSPEND_FOR: Duration = Duration::from_secs(30);

    fn facts(now: Instant, deadline: Instant) -> Facts<'static> {
        Facts {
            now,
            slot: "slot-001",
            epoch: 7,
            deadline,
            tick: TICK,
            suspend_for: SUSPEND_FOR,
            robots: 4,
        }
    }

    fn renewed(rev: i64, draining: bool, commands: u32) -> Renewed {
        Renewed {
            rev,
            draining,
            commands,
        }
    }

    fn ok(rev: i64, latency_ms: u64, advance: Option<Duration>) -> Answer {
        Answer::Renewed {
            renewed: renewed(rev, false, 1),
            latency: Duration::from_millis(latency_ms),
            advance,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The slot is lost as `kind`, and the guard is revoked before anything else.
    fn lost_as(state: &Holding, doing: &[Do], kind: EventKind) {
        assert!(
            matches!(state, Holding::Lost { kind: k, .. } if *k == kind),
            "{state:?}"
        );
        assert_eq!(doing[0], Do::RevokeGuard);
    }

    /// Renewing at `t0 + 1 s`, its deadline 2 s later.
    fn renewing(t0: Instant) -> Holding {
        Holding::claimed(t0 + TICK)
    }

    /// Suspended at its deadline, `t0 + 2 s`: the robots first, then the report.
    fn suspended(t0: Instant) -> (Holding, Facts<'static>) {
        let f = facts(t0 + ms(2000), t0 + ms(2000));
        let answer = Answer::DeadlinePassed {
            detail: "self-fenced".into(),
        };
        let (state, doing) = renewing(t0).step(Seen::Renewal { sent: t0, answer }, &f);
        assert_eq!(
            doing,
            vec![
                Do::SuspendRobots,
                Do::Report(SlotEvent::Suspended { robots: 4 })
            ]
        );
        (state, f)
    }

    #[test]
    fn a_renewal_extends_the_guard_reports_paces_and_beats_and_sets_the_next_a_tick_after_its_sending(
    ) {
        let t0 = Instant::now();
        let f = facts(t0 + ms(40), t0 + ms(2040));
        let (next, doing) = renewing(t0).step(
            Seen::Renewal {
                sent: t0,
                answer: Answer::Renewed {
                    renewed: renewed(9, false, 2),
                    latency: ms(40),
                    advance: None,
                },
            },
            &f,
        );
        assert_eq!(
            next,
            Holding::Renewing {
                next: t0 + TICK,
                at_edges: false
            }
        );
        assert_eq!(
            doing,
            vec![
                Do::ExtendGuard,
                Do::Report(SlotEvent::Renewed {
                    latency: ms(40),
                    rev: 9
                }),
                Do::Pace(ms(40)),
                // Two commands: the slot had changed.
                Do::Beat {
                    rev: 9,
                    per_command: ms(20)
                },
            ]
        );
    }

    #[test]
    fn renewals_move_to_the_ticks_edges_and_back_and_say_so_once_each_way() {
        let t0 = Instant::now();
        let f = facts(t0 + ms(10), t0 + ms(2010));
        let renewal = |advance| Seen::Renewal {
            sent: t0,
            answer: ok(1, 10, advance),
        };
        let (at_edges, doing) = renewing(t0).step(renewal(Some(ms(300))), &f);
        assert_eq!(
            at_edges,
            Holding::Renewing {
                next: t0 + TICK - ms(300),
                at_edges: true
            }
        );
        assert!(doing.contains(&Do::Report(SlotEvent::Phase { at_edges: true })));
        let (still, doing) = at_edges.clone().step(renewal(Some(ms(200))), &f);
        assert!(!doing
            .iter()
            .any(|d| matches!(d, Do::Report(SlotEvent::Phase { .. }))));
        let (own, doing) = still.step(renewal(None), &f);
        assert_eq!(
            own,
            Holding::Renewing {
                next: t0 + TICK,
                at_edges: false
            }
        );
        assert!(doing.contains(&Do::Report(SlotEvent::Phase { at_edges: false })));
    }

    #[test]
    fn a_failed_renewal_is_sent_again_a_quarter_tick_on_or_at_the_deadline_if_sooner() {
        let t0 = Instant::now();
        let failed = || Seen::Renewal {
            sent: t0,
            answer: Answer::Failed {
                why: "connection refused".into(),
            },
        };
        let f = facts(t0 + ms(100), t0 + ms(2000));
        let (next, doing) = renewing(t0).step(failed(), &f);
        assert_eq!(
            next,
            Holding::Renewing {
                next: t0 + ms(350),
                at_edges: false
            }
        );
        assert_eq!(
            doing,
            vec![Do::Report(SlotEvent::RenewFailed {
                why: "connection refused".into(),
                left: ms(1900)
            })]
        );
        // 100 ms before the deadline: the next try goes at the deadline.
        let f = facts(t0 + ms(1900), t0 + ms(2000));
        let (next, _) = renewing(t0).step(failed(), &f);
        assert_eq!(
            next,
            Holding::Renewing {
                next: t0 + ms(2000),
                at_edges: false
            }
        );
        // The renewal after a failure matches: renewing a tick after it again.
        let f = facts(t0 + ms(400), t0 + ms(2400));
        let (next, doing) = next.step(
            Seen::Renewal {
                sent: t0 + ms(350),
                answer: ok(1, 50, None),
            },
            &f,
        );
        assert_eq!(
            next,
            Holding::Renewing {
                next: t0 + ms(1350),
                at_edges: false
            }
        );
        assert_eq!(doing[0], Do::ExtendGuard);
    }

    #[test]
    fn the_deadline_passing_suspends_the_robots_until_suspend_for_past_it() {
        let t0 = Instant::now();
        let (state, f) = suspended(t0);
        assert_eq!(
            state,
            Holding::Suspended(RideOut {
                since: f.now,
                until: f.deadline + SUSPEND_FOR,
                robots: 4,
                next: f.now,
                failures: 0,
                at_edges: false,
            })
        );
        let Holding::Suspended(s) = &state else {
            unreachable!()
        };
        assert!(!s.out_of_time(f.deadline + SUSPEND_FOR - ms(1)));
        assert!(s.out_of_time(f.deadline + SUSPEND_FOR));
        assert_eq!(s.give_up_at(f.now, TICK), f.now + TICK);
        assert_eq!(
            s.give_up_at(f.deadline + SUSPEND_FOR - ms(10), TICK),
            s.until
        );
    }

    #[test]
    fn with_suspend_for_zero_the_deadline_passing_fences_at_once() {
        let t0 = Instant::now();
        let mut f = facts(t0 + ms(2000), t0 + ms(2000));
        f.suspend_for = Duration::ZERO;
        let (state, doing) = renewing(t0).step(
            Seen::Renewal {
                sent: t0,
                answer: Answer::DeadlinePassed {
                    detail: "self-fenced on slot-001".into(),
                },
            },
            &f,
        );
        assert_eq!(
            state,
            Holding::Lost {
                kind: EventKind::SelfFence,
                detail: "self-fenced on slot-001".into()
            }
        );
        assert_eq!(
            doing,
            vec![
                Do::RevokeGuard,
                Do::Report(SlotEvent::SelfFenced {
                    detail: "self-fenced on slot-001".into()
                })
            ]
        );
    }

    #[test]
    fn a_renewal_that_finds_another_epoch_revokes_the_guard_before_reporting_the_loss() {
        let t0 = Instant::now();
        let f = facts(t0 + ms(30), t0 + ms(2000));
        let (state, doing) = renewing(t0).step(
            Seen::Renewal {
                sent: t0,
                answer: Answer::Lost {
                    detail: "lost slot slot-001 (epoch 7)".into(),
                },
            },
            &f,
        );
        lost_as(&state, &doing, EventKind::Lost);
        assert!(matches!(doing[1], Do::Report(SlotEvent::Lost { .. })));
    }

    #[test]
    fn a_late_renewal_that_matches_resumes_the_robots_in_place_and_renews_a_tick_after_it() {
        let t0 = Instant::now();
        let (state, f) = suspended(t0);
        let sent = f.now + ms(5000);
        let later = facts(sent + ms(20), sent + ms(2020));
        let (state, doing) = state.step(
            Seen::LateRenewal {
                sent,
                answer: ok(3, 20, None),
            },
            &later,
        );
        assert_eq!(
            state,
            Holding::Renewing {
                next: sent + TICK,
                at_edges: false
            }
        );
        assert_eq!(
            doing,
            vec![
                Do::ResumeRobots,
                Do::Report(SlotEvent::Resumed {
                    robots: 4,
                    after: ms(5020)
                }),
                Do::Beat {
                    rev: 3,
                    per_command: Duration::ZERO
                },
            ]
        );
    }

    #[test]
    fn a_failed_late_renewal_goes_again_a_quarter_tick_after_its_sending_and_counts_the_tries() {
        let t0 = Instant::now();
        let (state, f) = suspended(t0);
        let failed = |sent| Seen::LateRenewal {
            sent,
            answer: Answer::Failed {
                why: "no answer to a late renewal within 1000 ms".into(),
            },
        };
        let (state, doing) = state.step(failed(f.now), &facts(f.now + TICK, f.deadline));
        let Holding::Suspended(s) = &state else {
            panic!("{state:?}")
        };
        // It waited a whole tick: the next goes at once.
        assert_eq!(s.next, f.now + TICK / 4);
        assert_eq!(s.failures, 1);
        assert!(matches!(
            &doing[..],
            [Do::Report(SlotEvent::LateRenewalFailed { tries: 1, .. })]
        ));
        // Near the end: never past `until`.
        let sent = s.until - ms(100);
        let (state, _) = state.step(failed(sent), &facts(sent + ms(10), f.deadline));
        let Holding::Suspended(s) = &state else {
            panic!("{state:?}")
        };
        assert_eq!(s.next, s.until);
        assert_eq!(s.failures, 2);
    }

    #[test]
    fn suspend_for_passing_ends_the_suspension_as_a_self_fence() {
        let t0 = Instant::now();
        let (state, f) = suspended(t0);
        let (state, doing) = state.step(
            Seen::OutOfTime,
            &facts(f.deadline + SUSPEND_FOR, f.deadline),
        );
        lost_as(&state, &doing, EventKind::SelfFence);
        let Do::Report(SlotEvent::SuspensionEnded {
            outcome,
            robots,
            detail,
        }) = &doing[1]
        else {
            panic!("{doing:?}")
        };
        assert_eq!(*outcome, SuspensionOutcome::Expired);
        assert_eq!(*robots, 4);
        assert!(detail.contains("--suspend-for 30s"), "{detail}");
    }

    #[test]
    fn a_late_renewal_that_finds_another_epoch_ends_the_suspension_as_lost() {
        let t0 = Instant::now();
        let (state, f) = suspended(t0);
        let (state, doing) = state.step(
            Seen::LateRenewal {
                sent: f.now,
                answer: Answer::Lost {
                    detail: "lost".into(),
                },
            },
            &f,
        );
        lost_as(&state, &doing, EventKind::Lost);
        assert!(matches!(
            &doing[1],
            Do::Report(SlotEvent::SuspensionEnded { outcome: SuspensionOutcome::Lost, detail, .. })
                if detail == "lost slot slot-001 (epoch 7) while suspended: another worker claimed it"
        ));
    }

    #[test]
    fn a_release_asked_while_renewing_releases_and_while_suspended_gives_the_slot_up() {
        let t0 = Instant::now();
        let f = facts(t0, t0 + ms(2000));
        let (state, doing) = renewing(t0).step(Seen::ReleaseAsked, &f);
        assert_eq!(state, Holding::Releasing(Ended::Released));
        assert!(doing.is_empty());
        let (state, f) = suspended(t0);
        let (state, doing) = state.step(Seen::ReleaseAsked, &f);
        lost_as(&state, &doing, EventKind::SelfFence);
        assert!(matches!(
            &doing[1],
            Do::Report(SlotEvent::SuspensionEnded {
                outcome: SuspensionOutcome::Stopped,
                ..
            })
        ));
    }

    #[test]
    fn a_drain_seen_by_a_renewal_or_a_late_one_hands_the_slot_back() {
        let t0 = Instant::now();
        let f = facts(t0 + ms(10), t0 + ms(2010));
        let draining = || Answer::Renewed {
            renewed: renewed(1, true, 1),
            latency: ms(10),
            advance: None,
        };
        let (state, doing) = renewing(t0).step(
            Seen::Renewal {
                sent: t0,
                answer: draining(),
            },
            &f,
        );
        assert_eq!(state, Holding::Releasing(Ended::Drained));
        assert_eq!(doing.last(), Some(&Do::Report(SlotEvent::Draining)));
        let (state, f) = suspended(t0);
        let (state, doing) = state.step(
            Seen::LateRenewal {
                sent: f.now,
                answer: draining(),
            },
            &f,
        );
        assert_eq!(state, Holding::Releasing(Ended::Drained));
        assert_eq!(doing[0], Do::ResumeRobots);
        assert_eq!(doing.last(), Some(&Do::Report(SlotEvent::Draining)));
    }

    #[test]
    fn a_slot_on_its_way_out_stays_so_whatever_comes_after() {
        let t0 = Instant::now();
        let f = facts(t0, t0 + ms(2000));
        let out = Holding::Releasing(Ended::Released);
        let (state, doing) = out.clone().step(
            Seen::Renewal {
                sent: t0,
                answer: ok(1, 1, None),
            },
            &f,
        );
        assert_eq!(state, out);
        assert!(doing.is_empty());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "cannot see")]
    fn a_late_renewal_seen_while_renewing_on_time_is_a_bug_caught_in_tests() {
        let t0 = Instant::now();
        let f = facts(t0, t0 + ms(2000));
        let _ = Holding::claimed(t0).step(
            Seen::LateRenewal {
                sent: t0,
                answer: ok(1, 1, None),
            },
            &f,
        );
    }
}
