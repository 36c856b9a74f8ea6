//! A robot's schedule, `spec.schedule`: when its firings fall, and what becomes of a
//! firing that would overlap a run, comes late, or was cut off with its holder's
//! lease. The fields and the daylight-saving rules are in docs/schedules.md.
//!
//! `every` is aligned to the Unix epoch, so a takeover does not shift the grid.
//! Firings are whole seconds of real (UTC) time, each found after the previous one,
//! so a schedule never goes back and never returns one instant twice. Everything
//! here is pure: instants in, instants out.

use std::str::FromStr;
use std::time::Duration;

use bson::{Bson, Document};
use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::spec_duration;
use crate::db::words::words;

/// The spec field that holds a robot's schedule.
pub(crate) const SPEC_FIELD: &str = "schedule";
/// How late a firing may still start, by default: long enough for any takeover at
/// any sane tick, short enough that a pool back from an hour's outage does not
/// replay the hour.
pub(crate) const DEFAULT_CATCHUP: Duration = Duration::from_secs(10 * 60);
/// The shortest catch-up window: a second. A holder acts on a firing a few
/// milliseconds after its time; a shorter window would call a firing that merely
/// overlapped a run, or came during a write, missed rather than skipped or run.
pub(crate) const MIN_CATCHUP: Duration = Duration::from_secs(1);
/// The longest catch-up window: a week. Past that, a firing is history, not work.
pub(crate) const MAX_CATCHUP: Duration = Duration::from_secs(7 * 24 * 3600);
/// Runs kept in a robot's `runs` by default, and at most.
pub(crate) const DEFAULT_KEEP_RUNS: u32 = 50;
pub(crate) const MAX_KEEP_RUNS: u32 = 1000;
/// The shortest and longest `every`.
pub(crate) const MIN_EVERY: Duration = Duration::from_secs(1);
pub(crate) const MAX_EVERY: Duration = Duration::from_secs(366 * 24 * 3600);
/// Missed firings are counted one by one up to this many; past it the count says
/// "at least". (`* * * * * *` missed over a week is 604,800 firings.)
pub(crate) const MAX_COUNTED: u64 = 100_000;

const FIELDS: &[&str] = &[
    "cron",
    "every",
    "timezone",
    "overlap",
    "catchup",
    "on_lost",
    "keep_runs",
];

words! {
    /// What a firing does when a run of the robot is still in flight.
    Overlap {
        /// Skip the new firing, and record it skipped (the default).
        Skip => "skip",
        /// Keep the newest firing waiting and run it when the run ends; the ones it
        /// replaces are recorded skipped.
        BufferOne => "buffer_one",
        /// Keep every firing waiting and run them in order, one at a time.
        BufferAll => "buffer_all",
        /// Stop the run in flight (its stop grace, as any stop) and start the new one.
        CancelOther => "cancel_other",
        /// Start the new run beside the one in flight.
        Allow => "allow",
    }
}

words! {
    /// What a holder does with a run it finds recorded in flight under an earlier
    /// holder's lease: that lease stopped the run's process, so the run was lost.
    OnLost {
        /// Run the firing again, as the next attempt (the default).
        Retry => "retry",
        /// Record it lost and go on with the next firing.
        Skip => "skip",
    }
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Pattern {
    Cron {
        cron: Box<croner::Cron>,
        zone: Tz,
    },
    /// Every so many milliseconds, counted from the Unix epoch.
    Every {
        period_ms: i64,
    },
}

/// A robot's schedule, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Schedule {
    pub(crate) pattern: Pattern,
    pub(crate) overlap: Overlap,
    pub(crate) catchup: Duration,
    pub(crate) on_lost: OnLost,
    pub(crate) keep_runs: u32,
    /// `spec.schedule` as written, so the firings it owed can be found again after
    /// it changed.
    pub(crate) source: Document,
}

/// The firings owed at one instant, after the last one claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owed {
    /// Firings too old to start (before `now − catchup`), if any.
    pub(crate) missed: Option<Missed>,
    /// Firings within the catch-up window, oldest first, at most the limit asked for.
    pub(crate) due: Vec<i64>,
    /// The first firing after `now`.
    pub(crate) next: Option<i64>,
}

/// A run of firings that fell outside the catch-up window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Missed {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) count: u64,
    /// The count stopped at [`MAX_COUNTED`]: there were at least that many.
    pub(crate) at_least: bool,
}

impl Schedule {
    /// Reads `spec.schedule`: None without one. The spec is written by whoever may
    /// write robot documents, so every value is checked, and every error says what
    /// was found and what is wanted. `now_ms` is only used to check that a cron
    /// pattern fires at all.
    pub(crate) fn from_spec(spec: &Document, now_ms: i64) -> Result<Option<Schedule>, String> {
        let s = match spec.get(SPEC_FIELD) {
            None | Some(Bson::Null) => return Ok(None),
            Some(Bson::Document(d)) => d,
            Some(other) => {
                return Err(format!(
                    "spec.schedule must be a document such as {{\"cron\": \"0 * * * *\"}} or {{\"every\": \"30s\"}}, found {other}"
                ))
            }
        };
        for key in s.keys() {
            if !FIELDS.contains(&key.as_str()) {
                return Err(format!(
                    "spec.schedule.{} is not a setting: use {}",
                    crate::printable::escape(key),
                    FIELDS.join(", ")
                ));
            }
        }
        let pattern = Pattern::from_schedule(s)?;
        let overlap = match s.get("overlap") {
            None | Some(Bson::Null) => Overlap::Skip,
            Some(v) => word(v, "overlap", Overlap::parse, Overlap::ALL)?,
        };
        let on_lost = match s.get("on_lost") {
            None | Some(Bson::Null) => OnLost::Retry,
            Some(v) => word(v, "on_lost", OnLost::parse, OnLost::ALL)?,
        };
        let catchup = match s.get("catchup") {
            None | Some(Bson::Null) => DEFAULT_CATCHUP,
            Some(v) => spec_duration("schedule.catchup", v, MIN_CATCHUP, MAX_CATCHUP)?,
        };
        let keep_runs = match s.get("keep_runs") {
            None | Some(Bson::Null) => DEFAULT_KEEP_RUNS,
            Some(v) => keep_runs(v)?,
        };
        let schedule = Schedule {
            pattern,
            overlap,
            catchup,
            on_lost,
            keep_runs,
            source: s.clone(),
        };
        if schedule.next_after(now_ms).is_none() {
            return Err(format!(
                "spec.schedule.cron {} never fires (no matching date before the year 5000)",
                schedule.describe()
            ));
        }
        Ok(Some(schedule))
    }

    /// The first firing strictly after `after_ms`; None when there is none (a cron
    /// that never matches again).
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        match &self.pattern {
            Pattern::Every { period_ms } => after_ms
                .div_euclid(*period_ms)
                .checked_add(1)?
                .checked_mul(*period_ms),
            Pattern::Cron { cron, zone } => {
                // Firings are whole seconds: from the second `after` falls in, the next
                // match is strictly after `after` itself.
                let from = DateTime::<Utc>::from_timestamp(after_ms.div_euclid(1000), 0)?;
                let next = cron
                    .find_next_occurrence(&from.with_timezone(zone), false)
                    .ok()?;
                Some(next.timestamp_millis())
            }
        }
    }

    /// The firings in `(after_ms, until_ms]`, counted (one by one up to
    /// [`MAX_COUNTED`] for cron, arithmetically for `every`); None when there are none.
    pub(crate) fn span(&self, after_ms: i64, until_ms: i64) -> Option<Missed> {
        let first = self.next_after(after_ms).filter(|t| *t <= until_ms)?;
        if let Pattern::Every { period_ms } = self.pattern {
            let last = until_ms.div_euclid(period_ms) * period_ms;
            return Some(Missed {
                first,
                last,
                count: ((last - first) / period_ms + 1) as u64,
                at_least: false,
            });
        }
        let mut m = Missed {
            first,
            last: first,
            count: 1,
            at_least: false,
        };
        while let Some(t) = self.next_after(m.last) {
            if t > until_ms {
                break;
            }
            if m.count >= MAX_COUNTED {
                m.at_least = true;
                // The last one is found without counting what lies between.
                if let Some(p) = self.previous_at_or_before(until_ms) {
                    m.last = m.last.max(p);
                }
                break;
            }
            m.last = t;
            m.count += 1;
        }
        Some(m)
    }

    /// The last firing at or before `at_ms` (cron only; None for `every`, which
    /// needs no search).
    fn previous_at_or_before(&self, at_ms: i64) -> Option<i64> {
        let Pattern::Cron { cron, zone } = &self.pattern else {
            return None;
        };
        let from = DateTime::<Utc>::from_timestamp(at_ms.div_euclid(1000), 0)?;
        cron.find_previous_occurrence(&from.with_timezone(zone), true)
            .ok()
            .map(|t| t.timestamp_millis())
    }

    /// What is owed at `now_ms` when every firing up to `from_ms` is settled:
    /// those before the catch-up window are missed; at most `limit` of those within
    /// it are due, oldest first; and the next one after `now_ms`.
    pub(crate) fn owed(&self, from_ms: i64, now_ms: i64, limit: usize) -> Owed {
        let window = now_ms.saturating_sub(self.catchup.as_millis() as i64);
        // Firings strictly before the window are missed.
        let missed = self.span(from_ms, window - 1);
        let at = missed.map_or(from_ms, |m| m.last.max(from_ms));
        let mut due = Vec::new();
        let mut next = None;
        let mut at = at;
        while let Some(t) = self.next_after(at) {
            if t > now_ms {
                next = Some(t);
                break;
            }
            if due.len() >= limit {
                break;
            }
            due.push(t);
            at = t;
        }
        if next.is_none() && due.len() >= limit {
            next = self.next_after(now_ms);
        }
        Owed { missed, due, next }
    }

    /// The next firing to show at `now_ms`: one already claimed ahead (`in_flight`
    /// firings after now), or the first after now and after the last one settled.
    pub(crate) fn next_shown(
        &self,
        claimed: Option<i64>,
        in_flight: impl IntoIterator<Item = i64>,
        now_ms: i64,
    ) -> Option<i64> {
        let ahead = in_flight.into_iter().filter(|f| *f > now_ms).min();
        let after = self.next_after(now_ms.max(claimed.unwrap_or(i64::MIN)));
        match (ahead, after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The schedule in a few words: `0 3 * * * (Europe/Berlin)`, `every 30s`.
    pub(crate) fn describe(&self) -> String {
        match &self.pattern {
            Pattern::Cron { cron, zone } => format!("{} ({zone})", cron.pattern),
            Pattern::Every { period_ms } => format!(
                "every {}",
                humantime::format_duration(Duration::from_millis(*period_ms as u64))
            ),
        }
    }
}

fn parse_zone(z: &str) -> Result<Tz, String> {
    Tz::from_str(z.trim()).map_err(|_| {
        format!(
            "spec.schedule.timezone {:?} is not a known IANA zone (e.g. \"Europe/Berlin\", \"America/New_York\", \"UTC\")",
            crate::printable::escape(z)
        )
    })
}

fn parse_cron(text: &str) -> Result<croner::Cron, String> {
    let shown = crate::printable::escape(text);
    if text.len() > 200 {
        return Err(format!(
            "spec.schedule.cron is {} bytes long; a cron pattern has at most 7 short fields",
            text.len()
        ));
    }
    croner::Cron::from_str(text.trim()).map_err(|e| {
        format!(
            "spec.schedule.cron {shown:?} is not a cron pattern: {e} (write 5 fields \"min hour day month weekday\", 6 with seconds first, or @hourly, @daily, @weekly, @monthly, @yearly)"
        )
    })
}

fn word<W: Copy + std::fmt::Display>(
    v: &Bson,
    field: &str,
    parse: fn(&str) -> Option<W>,
    all: &[W],
) -> Result<W, String> {
    let words = all
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match v {
        Bson::String(s) => parse(s.trim()).ok_or_else(|| {
            format!(
                "spec.schedule.{field} {:?} is not one of: {words}",
                crate::printable::escape(s)
            )
        }),
        other => Err(format!(
            "spec.schedule.{field} must be one of {words}, found {other}"
        )),
    }
}

/// A firing as RFC 3339 text in UTC (what `SLOTPOOL_FIRING` carries).
pub fn rfc3339(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

impl Pattern {
    /// The pattern a `spec.schedule` document asks for: `cron` (with its
    /// `timezone`) or `every`, exactly one.
    fn from_schedule(s: &Document) -> Result<Pattern, String> {
        match (s.get("cron"), s.get("every")) {
            (Some(_), Some(_)) => Err("spec.schedule has both cron and every: give one".into()),
            (None, None) => Err(
                "spec.schedule needs cron (e.g. \"*/5 * * * *\") or every (e.g. \"30s\")".into(),
            ),
            (Some(c), None) => {
                let zone = match s.get("timezone") {
                    None | Some(Bson::Null) => Tz::UTC,
                    Some(Bson::String(z)) => parse_zone(z)?,
                    Some(other) => {
                        return Err(format!(
                            "spec.schedule.timezone must be an IANA zone name such as \"Europe/Berlin\", found {other}"
                        ))
                    }
                };
                let Bson::String(text) = c else {
                    return Err(format!(
                        "spec.schedule.cron must be text such as \"*/5 * * * *\", found {c}"
                    ));
                };
                Ok(Pattern::Cron {
                    cron: Box::new(parse_cron(text)?),
                    zone,
                })
            }
            (None, Some(e)) => {
                if s.contains_key("timezone") {
                    return Err("spec.schedule.timezone applies to cron only: every counts real time from the Unix epoch, in no zone".into());
                }
                let period = spec_duration("schedule.every", e, MIN_EVERY, MAX_EVERY)?;
                if period.subsec_millis() != 0 || period.subsec_nanos() != 0 {
                    return Err(format!(
                        "spec.schedule.every must be whole seconds, got {}",
                        humantime::format_duration(period)
                    ));
                }
                Ok(Pattern::Every {
                    period_ms: period.as_millis() as i64,
                })
            }
        }
    }
}

/// `spec.schedule.keep_runs`, checked: a whole number from 1 to [`MAX_KEEP_RUNS`].
fn keep_runs(v: &Bson) -> Result<u32, String> {
    let n = match v {
        Bson::Int32(n) => *n as i64,
        Bson::Int64(n) => *n,
        other => {
            return Err(format!(
                "spec.schedule.keep_runs must be a whole number, found {other}"
            ))
        }
    };
    if !(1..=MAX_KEEP_RUNS as i64).contains(&n) {
        return Err(format!(
            "spec.schedule.keep_runs must be between 1 and {MAX_KEEP_RUNS}, got {n}"
        ));
    }
    Ok(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// 2026-01-01T00:00:00Z.
    const NOW: i64 = 1_767_225_600_000;

    fn schedule(s: Document) -> Schedule {
        Schedule::from_spec(&doc! {"schedule": s}, NOW)
            .unwrap()
            .unwrap()
    }

    fn refused(s: Bson) -> String {
        Schedule::from_spec(&doc! {"schedule": s}, NOW).unwrap_err()
    }

    fn utc(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    /// The next `n` firings after `from`, as RFC 3339 in UTC.
    fn firings(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        let mut at = utc(from);
        let mut out = Vec::new();
        for _ in 0..n {
            at = s.next_after(at).unwrap();
            out.push(rfc3339(at));
        }
        out
    }

    #[test]
    fn no_schedule_is_none_and_defaults_are_filled_in() {
        assert_eq!(Schedule::from_spec(&doc! {}, NOW).unwrap(), None);
        let s = schedule(doc! {"cron": "*/5 * * * *"});
        assert_eq!(s.overlap, Overlap::Skip);
        assert_eq!(s.on_lost, OnLost::Retry);
        assert_eq!(s.catchup, DEFAULT_CATCHUP);
        assert_eq!(s.keep_runs, DEFAULT_KEEP_RUNS);
        assert_eq!(s.describe(), "*/5 * * * * (UTC)");
        let s = schedule(
            doc! {"every": "30s", "overlap": "buffer_all", "on_lost": "skip", "catchup": "1h", "keep_runs": 5},
        );
        assert_eq!(s.overlap, Overlap::BufferAll);
        assert_eq!(s.on_lost, OnLost::Skip);
        assert_eq!(s.catchup, Duration::from_secs(3600));
        assert_eq!(s.keep_runs, 5);
        assert_eq!(s.describe(), "every 30s");
    }

    #[test]
    fn every_is_aligned_to_the_epoch() {
        let s = schedule(doc! {"every": "30s"});
        assert_eq!(
            firings(&s, "2026-03-01T10:00:07.250Z", 3),
            [
                "2026-03-01T10:00:30.000Z",
                "2026-03-01T10:01:00.000Z",
                "2026-03-01T10:01:30.000Z"
            ]
        );
        // Exactly on a firing: the next one, never the same again.
        assert_eq!(
            s.next_after(utc("2026-03-01T10:00:30Z")),
            Some(utc("2026-03-01T10:01:00Z"))
        );
    }

    #[test]
    fn five_and_six_fields_and_names_parse() {
        let s = schedule(doc! {"cron": "*/10 * * * * *"});
        assert_eq!(
            firings(&s, "2026-03-01T10:00:00.500Z", 2),
            ["2026-03-01T10:00:10.000Z", "2026-03-01T10:00:20.000Z"]
        );
        let s = schedule(doc! {"cron": "@hourly"});
        assert_eq!(
            firings(&s, "2026-03-01T10:00:00Z", 1),
            ["2026-03-01T11:00:00.000Z"]
        );
        let s = schedule(doc! {"cron": "0 3 * * *", "timezone": "Europe/Berlin"});
        // 03:00 in Berlin in winter is 02:00 UTC.
        assert_eq!(
            firings(&s, "2026-01-10T12:00:00Z", 1),
            ["2026-01-11T02:00:00.000Z"]
        );
    }

    #[test]
    fn a_firing_in_a_skipped_hour_runs_once_at_the_jump() {
        // Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC).
        let s = schedule(doc! {"cron": "30 2 * * *", "timezone": "Europe/Berlin"});
        assert_eq!(
            firings(&s, "2026-03-27T12:00:00Z", 3),
            [
                // 02:30 CET
                "2026-03-28T01:30:00.000Z",
                // 02:30 does not exist: once, at the jump (03:00 CEST)
                "2026-03-29T01:00:00.000Z",
                // 02:30 CEST
                "2026-03-30T00:30:00.000Z",
            ]
        );
        // A stepped pattern skips what does not exist, and keeps its grid.
        let s = schedule(doc! {"cron": "*/30 * * * *", "timezone": "Europe/Berlin"});
        assert_eq!(
            firings(&s, "2026-03-29T00:15:00Z", 3),
            [
                "2026-03-29T00:30:00.000Z", // 01:30 CET
                "2026-03-29T01:00:00.000Z", // 03:00 CEST: 02:00 and 02:30 never were
                "2026-03-29T01:30:00.000Z", // 03:30 CEST
            ]
        );
    }

    #[test]
    fn a_firing_in_a_repeated_hour_runs_once() {
        // Europe/Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC), so
        // 02:30 happens at 00:30 UTC and again at 01:30 UTC.
        let s = schedule(doc! {"cron": "30 2 * * *", "timezone": "Europe/Berlin"});
        assert_eq!(
            firings(&s, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]
        );
        // A stepped pattern fires for every real instant that matches: through both
        // passes of the hour, every 30 minutes of real time, none twice.
        let s = schedule(doc! {"cron": "*/30 * * * *", "timezone": "Europe/Berlin"});
        assert_eq!(
            firings(&s, "2026-10-25T00:15:00Z", 4),
            [
                "2026-10-25T00:30:00.000Z", // 02:30 CEST
                "2026-10-25T01:00:00.000Z", // 02:00 CET
                "2026-10-25T01:30:00.000Z", // 02:30 CET
                "2026-10-25T02:00:00.000Z", // 03:00 CET
            ]
        );
    }

    #[test]
    fn a_zone_with_a_half_hour_shift() {
        // Australia/Lord_Howe moves by 30 minutes: on 2026-10-04 02:00 +10:30
        // becomes 02:30 +11:00 (2026-10-03T15:30Z), so 02:15 does not exist.
        let s = schedule(doc! {"cron": "15 2 * * *", "timezone": "Australia/Lord_Howe"});
        assert_eq!(
            firings(&s, "2026-10-02T12:00:00Z", 3),
            [
                "2026-10-02T15:45:00.000Z", // 02:15 +10:30
                "2026-10-03T15:30:00.000Z", // at the jump, 02:30 +11:00
                "2026-10-04T15:15:00.000Z", // 02:15 +11:00
            ]
        );
        // On 2026-04-05 02:00 +11:00 becomes 01:30 +10:30 (2026-04-04T15:00Z):
        // 01:45 happens twice, and fires once.
        let s = schedule(doc! {"cron": "45 1 * * *", "timezone": "Australia/Lord_Howe"});
        assert_eq!(
            firings(&s, "2026-04-04T00:00:00Z", 2),
            ["2026-04-04T14:45:00.000Z", "2026-04-05T15:15:00.000Z"]
        );
    }

    #[test]
    fn owed_splits_missed_due_and_next() {
        let s = schedule(doc! {"every": "10s", "catchup": "30s"});
        let from = utc("2026-03-01T10:00:00Z");
        let now = utc("2026-03-01T10:02:05Z");
        let owed = s.owed(from, now, 100);
        // The window opens at 10:01:35: 10:00:10 … 10:01:30 are missed (9).
        assert_eq!(
            owed.missed,
            Some(Missed {
                first: utc("2026-03-01T10:00:10Z"),
                last: utc("2026-03-01T10:01:30Z"),
                count: 9,
                at_least: false,
            })
        );
        assert_eq!(
            owed.due,
            [
                utc("2026-03-01T10:01:40Z"),
                utc("2026-03-01T10:01:50Z"),
                utc("2026-03-01T10:02:00Z")
            ]
        );
        assert_eq!(owed.next, Some(utc("2026-03-01T10:02:10Z")));
        // The same by cron, counted one by one.
        let c = schedule(doc! {"cron": "*/10 * * * * *", "catchup": "30s"});
        assert_eq!(c.owed(from, now, 100), owed);
        // Nothing owed: only the next.
        let quiet = s.owed(utc("2026-03-01T10:02:00Z"), now, 100);
        assert_eq!(quiet.missed, None);
        assert!(quiet.due.is_empty());
        assert_eq!(quiet.next, Some(utc("2026-03-01T10:02:10Z")));
        // A limit: the oldest first, and still the next after now.
        let some = s.owed(from, now, 2);
        assert_eq!(some.due.len(), 2);
        assert_eq!(some.next, Some(utc("2026-03-01T10:02:10Z")));
    }

    #[test]
    fn a_week_of_seconds_missed_is_counted_up_to_the_cap() {
        let c = schedule(doc! {"cron": "* * * * * *", "catchup": "1s"});
        let from = utc("2026-03-01T00:00:00Z");
        let owed = c.owed(from, from + 7 * 24 * 3600 * 1000, 10);
        let m = owed.missed.unwrap();
        assert_eq!(m.count, MAX_COUNTED);
        assert!(m.at_least);
        // The last one is the real last, not the last counted: the window is the
        // last second, and the firing at its start is due, not missed.
        assert_eq!(m.last, from + 7 * 24 * 3600 * 1000 - 2000);
        // Exactly the cap is not "at least".
        let exact = c.span(from, from + MAX_COUNTED as i64 * 1000).unwrap();
        assert_eq!((exact.count, exact.at_least), (MAX_COUNTED, false));
        let e = schedule(doc! {"every": "1s", "catchup": "1s"});
        let m = e
            .owed(from, from + 7 * 24 * 3600 * 1000, 10)
            .missed
            .unwrap();
        assert_eq!(m.count, 7 * 24 * 3600 - 2);
        assert!(!m.at_least);
    }

    #[test]
    fn bad_schedules_say_why() {
        let cases: Vec<(Bson, &str)> = vec![
            (Bson::String("hourly".into()), "must be a document"),
            (doc! {}.into(), "needs cron"),
            (doc! {"cron": "* * * * *", "every": "1s"}.into(), "both"),
            (doc! {"cron": "61 * * * *"}.into(), "is not a cron pattern"),
            (doc! {"cron": "* * *"}.into(), "is not a cron pattern"),
            (doc! {"cron": 5}.into(), "must be text"),
            (doc! {"cron": "0 0 30 2 *"}.into(), "never fires"),
            (
                doc! {"cron": "* * * * *", "timezone": "Mars/Olympus"}.into(),
                "not a known IANA zone",
            ),
            (
                doc! {"every": "1s", "timezone": "UTC"}.into(),
                "applies to cron only",
            ),
            (doc! {"every": "500ms"}.into(), "between"),
            (doc! {"every": "1500ms"}.into(), "whole seconds"),
            (doc! {"every": "soon"}.into(), "spec.schedule.every"),
            (
                doc! {"cron": "* * * * *", "catchup": "8d"}.into(),
                "spec.schedule.catchup must be between",
            ),
            (
                doc! {"cron": "* * * * *", "catchup": "0s"}.into(),
                "spec.schedule.catchup must be between 1s",
            ),
            (
                doc! {"cron": "* * * * *", "overlap": "twice"}.into(),
                "is not one of: skip, buffer_one, buffer_all, cancel_other, allow",
            ),
            (
                doc! {"cron": "* * * * *", "on_lost": 1}.into(),
                "must be one of",
            ),
            (
                doc! {"cron": "* * * * *", "keep_runs": 0}.into(),
                "between 1",
            ),
            (
                doc! {"cron": "* * * * *", "when": "now"}.into(),
                "is not a setting",
            ),
        ];
        for (s, want) in cases {
            let got = refused(s.clone());
            assert!(got.contains(want), "{s}: {got:?} lacks {want:?}");
        }
    }
}
