//! The pool's last hour, drawn: one lane per slot showing who held it and when, the
//! gaps with no holder, overflow claims, self-fences and losses, and a lane of robot
//! restarts and failures. Built from `events` alone by [`Timeline::build`] (pure) and
//! drawn as SVG on the server ([`Timeline::svg`]), with no script.
//!
//! What the log cannot say is drawn as such: a holder killed with -9 wrote nothing, so
//! its span ends at the latest moment it can have renewed (the next claim minus the
//! lease), and a slot's holder before its first event in the window is unknown.

use std::collections::BTreeMap;

use maud::{html, Markup};

use crate::db::event::EventKind;

/// How far back the timeline looks.
pub(crate) const WINDOW_MS: i64 = 3600 * 1000;

/// The event kinds the timeline reads.
pub(crate) const KINDS: [EventKind; 8] = [
    EventKind::Claim,
    EventKind::Release,
    EventKind::Lost,
    EventKind::SelfFence,
    EventKind::RobotRestart,
    EventKind::RobotFailed,
    EventKind::FiringLost,
    EventKind::FiringMissed,
];

/// One event as the timeline needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Moment {
    /// Server-clock milliseconds.
    pub(crate) at_ms: i64,
    pub(crate) kind: EventKind,
    pub(crate) worker: Option<String>,
    pub(crate) slot: Option<String>,
    pub(crate) robot: Option<String>,
    /// A claim made by a worker that already held a slot.
    pub(crate) overflow: bool,
}

/// A slot as it is now, for the lane's right end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotNow {
    pub(crate) id: String,
    /// Its live holder, if any.
    pub(crate) holder: Option<String>,
    /// Its lease, to date a silent holder's last possible renewal.
    pub(crate) lease_ms: i64,
}

/// A stretch of one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Span {
    Held {
        worker: String,
        overflow: bool,
        from: i64,
        to: i64,
    },
    /// No holder: the slot's robots did not run.
    Gap { from: i64, to: i64 },
    /// Before the first event in the window.
    Unknown { from: i64, to: i64 },
}

/// A moment drawn as a mark on a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) at: i64,
    /// `self_fence`, `lost`, `robot_restart` or `robot_failed`.
    pub(crate) kind: EventKind,
    /// What its tooltip says.
    pub(crate) what: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) slot: String,
    pub(crate) spans: Vec<Span>,
    pub(crate) marks: Vec<Mark>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Timeline {
    pub(crate) from: i64,
    pub(crate) to: i64,
    pub(crate) lanes: Vec<Lane>,
    /// Robot restarts and failures, any slot.
    pub(crate) robots: Vec<Mark>,
    /// Scheduled robots' latest firings, with their outcomes.
    pub(crate) firings: Vec<FiringMark>,
}

/// A scheduled robot's latest firing, as the timeline marks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FiringMark {
    pub(crate) at: i64,
    pub(crate) robot: String,
    pub(crate) outcome: crate::db::firing::Outcome,
}

/// A firing's mark: green when it ran well, grey when it did not run by choice
/// (skipped, stopped, cancelled), red when it failed, was lost or missed.
fn firing_colour(o: crate::db::firing::Outcome) -> &'static str {
    use crate::db::firing::Outcome;
    match o {
        Outcome::Succeeded => "#5cb85c",
        Outcome::Skipped | Outcome::Stopped | Outcome::Cancelled => "#999",
        Outcome::Failed | Outcome::Lost | Outcome::Missed => "#d9534f",
    }
}

/// The most firings the timeline marks (the newest): more would be ink, not news.
pub(crate) const MAX_FIRING_MARKS: usize = 500;

impl Timeline {
    /// The lanes of `slots` over the window ending at `now_ms`, from `moments` (any
    /// order; those outside the window or of other kinds are ignored).
    pub(crate) fn build(moments: &[Moment], slots: &[SlotNow], now_ms: i64) -> Timeline {
        let from = now_ms - WINDOW_MS;
        let mut by_slot: BTreeMap<&str, Vec<&Moment>> = BTreeMap::new();
        let mut robots = Vec::new();
        let mut sorted: Vec<&Moment> = moments
            .iter()
            .filter(|m| m.at_ms >= from && m.at_ms <= now_ms)
            .collect();
        sorted.sort_by_key(|m| m.at_ms);
        for m in sorted {
            match m.kind {
                EventKind::RobotRestart
                | EventKind::RobotFailed
                | EventKind::FiringLost
                | EventKind::FiringMissed => robots.push(Mark {
                    at: m.at_ms,
                    kind: m.kind,
                    what: format!(
                        "{} {}{}",
                        m.robot.as_deref().unwrap_or("a robot"),
                        match m.kind {
                            EventKind::RobotFailed => "failed",
                            EventKind::FiringLost => "lost a run with its holder's lease",
                            EventKind::FiringMissed => "missed firings",
                            _ => "restarted",
                        },
                        m.slot
                            .as_deref()
                            .map(|s| format!(" on {s}"))
                            .unwrap_or_default()
                    ),
                }),
                _ => {
                    if let Some(s) = m.slot.as_deref() {
                        by_slot.entry(s).or_default().push(m);
                    }
                }
            }
        }
        let lanes = slots
            .iter()
            .map(|s| {
                let moments = by_slot.get(s.id.as_str()).map_or(&[][..], |v| &v[..]);
                lane(s, moments, from, now_ms)
            })
            .collect();
        Timeline {
            from,
            to: now_ms,
            lanes,
            robots,
            firings: Vec::new(),
        }
    }

    /// Adds scheduled robots' latest firings within the window, the newest
    /// [`MAX_FIRING_MARKS`] of them.
    pub(crate) fn with_firings(
        mut self,
        firings: impl IntoIterator<Item = FiringMark>,
    ) -> Timeline {
        let mut marks: Vec<FiringMark> = firings
            .into_iter()
            .filter(|f| f.at >= self.from && f.at <= self.to)
            .collect();
        marks.sort_by_key(|f| std::cmp::Reverse(f.at));
        marks.truncate(MAX_FIRING_MARKS);
        self.firings = marks;
        self
    }
}

/// One slot's lane, from its moments in time order.
fn lane(slot: &SlotNow, moments: &[&Moment], from: i64, now: i64) -> Lane {
    let mut spans = Vec::new();
    let mut marks = Vec::new();
    // Who holds it since when, as the log has said so far.
    let mut open: Option<(String, bool, i64)> = None;
    // Where the lane is drawn up to.
    let mut drawn = from;
    for m in moments {
        let who = m.worker.clone().unwrap_or_default();
        match m.kind {
            EventKind::Claim => {
                match open.take() {
                    // The previous holder went silent (killed, frozen, cut off): it
                    // cannot have renewed after the lease before this claim.
                    Some((w, o, since)) => {
                        let last = (m.at_ms - slot.lease_ms).max(since);
                        spans.push(held(w, o, since, last));
                        drawn = last;
                    }
                    None if drawn == from && spans.is_empty() => {
                        spans.push(Span::Unknown { from, to: m.at_ms });
                        drawn = m.at_ms;
                    }
                    None => {}
                }
                if drawn < m.at_ms {
                    spans.push(Span::Gap {
                        from: drawn,
                        to: m.at_ms,
                    });
                }
                open = Some((who, m.overflow, m.at_ms));
                drawn = m.at_ms;
            }
            EventKind::Release | EventKind::Lost | EventKind::SelfFence => {
                let since = match open.take() {
                    Some((w, o, since)) if w == who => Some((w, o, since)),
                    // Its claim came before the window: it held the slot from the start.
                    None if spans.is_empty() => Some((who.clone(), false, from)),
                    other => {
                        open = other;
                        None
                    }
                };
                if let Some((w, o, since)) = since {
                    spans.push(held(w, o, since, m.at_ms));
                    drawn = m.at_ms;
                }
                if m.kind != EventKind::Release {
                    marks.push(Mark {
                        at: m.at_ms,
                        kind: m.kind,
                        what: format!(
                            "{who} {}",
                            if m.kind == EventKind::Lost {
                                "lost the slot"
                            } else {
                                "fenced itself: its lease lapsed"
                            }
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    match (open, &slot.holder) {
        (Some((w, o, since)), Some(h)) if &w == h => spans.push(held(w, o, since, now)),
        (Some((w, o, since)), _) => {
            // Its holder is gone: silent since its last possible renewal.
            let last = (now - slot.lease_ms).max(since);
            spans.push(held(w, o, since, last));
            spans.push(Span::Gap {
                from: last,
                to: now,
            });
        }
        (None, Some(h)) if spans.is_empty() => spans.push(held(h.clone(), false, from, now)),
        (None, _) if drawn < now => spans.push(Span::Gap {
            from: drawn,
            to: now,
        }),
        (None, _) => {}
    }
    Lane {
        slot: slot.id.clone(),
        spans,
        marks,
    }
}

fn held(worker: String, overflow: bool, from: i64, to: i64) -> Span {
    Span::Held {
        worker,
        overflow,
        from,
        to,
    }
}

/// A worker's colour: the same worker, the same colour, on every page.
fn colour(worker: &str) -> String {
    let mut h: u32 = 2166136261;
    for b in worker.bytes() {
        h = (h ^ b as u32).wrapping_mul(16777619);
    }
    format!("hsl({}, 55%, 55%)", h % 360)
}

/// Time of day on the server's clock, UTC.
fn clock(ms: i64) -> String {
    bson::DateTime::from_millis(ms)
        .try_to_rfc3339_string()
        .ok()
        .and_then(|s| s.get(11..19).map(str::to_string))
        .unwrap_or_default()
}

const WIDTH: f64 = 1000.0;
const LABEL: f64 = 110.0;
const ROW: f64 = 22.0;

impl Timeline {
    fn x(&self, t: i64) -> f64 {
        let span = (self.to - self.from).max(1) as f64;
        LABEL + (t - self.from).clamp(0, self.to - self.from) as f64 / span * (WIDTH - LABEL)
    }

    /// The timeline as inline SVG: presentation attributes only (the pages' content
    /// security policy allows no inline style), every name as escaped text.
    pub(crate) fn svg(&self) -> Markup {
        let rows = self.lanes.len() + 1 + usize::from(!self.firings.is_empty());
        let height = ROW * rows as f64 + 24.0;
        let w = |a: i64, b: i64| (self.x(b) - self.x(a)).max(1.0);
        html! {
            svg #timeline xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {WIDTH} {height}"))
                role="img" aria-label="Who held each slot over the last hour" {
                @for (i, lane) in self.lanes.iter().enumerate() {
                    @let y = ROW * i as f64;
                    g.lane data-slot=(lane.slot) {
                        text x="0" y=(y + 15.0) font-size="12" { (lane.slot) }
                        @for span in &lane.spans {
                            @match span {
                                Span::Held { worker, overflow, from, to } => {
                                    rect class=(if *overflow { "held overflow" } else { "held" })
                                        data-slot=(lane.slot) data-worker=(worker)
                                        x=(self.x(*from)) y=(y + 3.0) width=(w(*from, *to)) height=(ROW - 6.0)
                                        fill=(colour(worker))
                                        stroke=(if *overflow { "#333" } else { "none" })
                                        stroke-dasharray=(if *overflow { "4 2" } else { "none" }) {
                                        title { (worker) " held " (lane.slot) (if *overflow { " (overflow)" } else { "" }) ", " (clock(*from)) "–" (clock(*to)) }
                                    }
                                }
                                Span::Gap { from, to } => {
                                    rect.gap data-slot=(lane.slot) x=(self.x(*from)) y=(y + 3.0)
                                        width=(w(*from, *to)) height=(ROW - 6.0) fill="#d9534f" {
                                        title { "no holder: " (lane.slot) "'s robots did not run, " (clock(*from)) "–" (clock(*to)) }
                                    }
                                }
                                Span::Unknown { from, to } => {
                                    rect.unknown data-slot=(lane.slot) x=(self.x(*from)) y=(y + 3.0)
                                        width=(w(*from, *to)) height=(ROW - 6.0) fill="#e6e6e6" {
                                        title { "not in the log's last hour" }
                                    }
                                }
                            }
                        }
                        @for m in &lane.marks {
                            @let x = self.x(m.at);
                            path class=(m.kind.as_str()) d=(format!("M{x} {} l-5 -8 h10 z", y + 10.0)) fill="#000" {
                                title { (clock(m.at)) " " (m.what) }
                            }
                        }
                    }
                }
                @let y = ROW * self.lanes.len() as f64;
                g.lane.robots {
                    text x="0" y=(y + 15.0) font-size="12" { "robots" }
                    line x1=(LABEL) x2=(WIDTH) y1=(y + 11.0) y2=(y + 11.0) stroke="#bbb" {}
                    @for m in &self.robots {
                        @let x = self.x(m.at);
                        circle class=(m.kind.as_str()) cx=(x) cy=(y + 11.0) r="4"
                            fill=(if matches!(m.kind, EventKind::RobotFailed | EventKind::FiringLost | EventKind::FiringMissed) { "#d9534f" } else { "#f0ad4e" }) {
                            title { (clock(m.at)) " " (m.what) }
                        }
                    }
                }
                @if !self.firings.is_empty() {
                    @let y = ROW * (self.lanes.len() + 1) as f64;
                    g.lane.firings {
                        text x="0" y=(y + 15.0) font-size="12" { "firings" }
                        line x1=(LABEL) x2=(WIDTH) y1=(y + 11.0) y2=(y + 11.0) stroke="#bbb" {}
                        @for f in &self.firings {
                            @let x = self.x(f.at);
                            @let fill = firing_colour(f.outcome);
                            rect class=(f.outcome.as_str()) x=(x - 1.0) y=(y + 5.0) width="2" height="12" fill=(fill) {
                                title { (clock(f.at)) " " (f.robot) ": " (f.outcome) }
                            }
                        }
                    }
                }
                text x=(LABEL) y=(height - 4.0) font-size="11" { (clock(self.from)) }
                text x=(WIDTH) y=(height - 4.0) font-size="11" text-anchor="end" { (clock(self.to)) " UTC" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 10 * WINDOW_MS;
    const L: i64 = 2000;

    fn at(min_ago: i64, kind: &str, worker: &str) -> Moment {
        let kind = EventKind::parse(kind).expect("a kind");
        Moment {
            at_ms: NOW - min_ago * 60_000,
            kind,
            worker: Some(worker.into()),
            slot: Some("s1".into()),
            robot: None,
            overflow: false,
        }
    }

    fn slot(holder: Option<&str>) -> SlotNow {
        SlotNow {
            id: "s1".into(),
            holder: holder.map(str::to_string),
            lease_ms: L,
        }
    }

    fn lane_of(moments: &[Moment], holder: Option<&str>) -> Vec<Span> {
        Timeline::build(moments, &[slot(holder)], NOW).lanes[0]
            .spans
            .clone()
    }

    #[test]
    fn a_kill_9_shows_the_silent_holder_until_its_last_possible_renewal_then_a_gap() {
        let spans = lane_of(&[at(50, "claim", "a"), at(20, "claim", "b")], Some("b"));
        let (t50, t20) = (NOW - 50 * 60_000, NOW - 20 * 60_000);
        assert_eq!(
            spans,
            [
                Span::Unknown {
                    from: NOW - WINDOW_MS,
                    to: t50
                },
                held("a".into(), false, t50, t20 - L),
                Span::Gap {
                    from: t20 - L,
                    to: t20
                },
                held("b".into(), false, t20, NOW),
            ]
        );
    }

    #[test]
    fn a_release_ends_the_span_and_the_next_claim_ends_the_gap() {
        let spans = lane_of(&[at(40, "release", "a"), at(39, "claim", "b")], Some("b"));
        let (t40, t39) = (NOW - 40 * 60_000, NOW - 39 * 60_000);
        assert_eq!(
            spans,
            [
                held("a".into(), false, NOW - WINDOW_MS, t40),
                Span::Gap { from: t40, to: t39 },
                held("b".into(), false, t39, NOW),
            ]
        );
    }

    #[test]
    fn self_fences_are_marked_and_an_unheld_slot_ends_in_a_gap() {
        let mut overflow = at(30, "claim", "a");
        overflow.overflow = true;
        let t = Timeline::build(&[overflow, at(10, "self_fence", "a")], &[slot(None)], NOW);
        let lane = &t.lanes[0];
        let (t30, t10) = (NOW - 30 * 60_000, NOW - 10 * 60_000);
        assert_eq!(
            lane.spans[1..],
            [
                held("a".into(), true, t30, t10),
                Span::Gap { from: t10, to: NOW },
            ]
        );
        assert_eq!(lane.marks.len(), 1);
        assert_eq!(lane.marks[0].kind, EventKind::SelfFence);
    }

    #[test]
    fn a_quiet_slot_held_now_was_held_throughout_and_robots_get_their_own_lane() {
        let mut failed = at(5, "robot_failed", "a");
        failed.robot = Some("<b>r</b>".into());
        let t = Timeline::build(&[failed], &[slot(Some("a"))], NOW);
        assert_eq!(
            t.lanes[0].spans,
            [held("a".into(), false, NOW - WINDOW_MS, NOW)]
        );
        assert_eq!(t.robots.len(), 1);
        // Names reach the page as escaped text only.
        let svg = t.svg().into_string();
        assert!(svg.contains("&lt;b&gt;r&lt;/b&gt; failed"), "{svg}");
        assert!(!svg.contains("<b>"));
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains(r#"data-worker="a""#));
    }

    #[test]
    fn the_latest_firings_in_the_window_are_marked_newest_first_and_capped() {
        use crate::db::firing::Outcome;
        let mark = |at: i64| FiringMark {
            at,
            robot: format!("r{at}"),
            outcome: Outcome::Succeeded,
        };
        let t = Timeline::build(&[], &[slot(Some("a"))], NOW).with_firings(
            (0..(MAX_FIRING_MARKS as i64 + 10))
                .map(|i| mark(NOW - i * 1000))
                .chain([mark(NOW - 2 * WINDOW_MS), mark(NOW + 5)]),
        );
        assert_eq!(t.firings.len(), MAX_FIRING_MARKS);
        assert_eq!(t.firings[0].at, NOW);
        assert!(t
            .firings
            .iter()
            .all(|f| f.at >= NOW - WINDOW_MS && f.at <= NOW));
        let svg = t.svg().into_string();
        assert!(svg.contains(r#"class="lane firings""#), "{svg}");
        assert!(!Timeline::build(&[], &[slot(None)], NOW)
            .svg()
            .into_string()
            .contains("firings"));
    }
}
