//! `slotpool robot runs NAME` and `slotpool robot trigger NAME`: a scheduled
//! robot's record of its last runs, and one extra run now.

use bson::doc;
use serde::Serialize;

use super::output::{print_json, print_table};
use crate::db::field::{NAME, SPEC};
use crate::db::firing::{runs_of, FiringState, RunRecord, FIRINGS, RUNS};
use crate::db::store::Store;
use crate::pool::actions::{self, ActionError, Actor};
use crate::robot::schedule::{rfc3339, Schedule};

/// One run in `robot runs --json`. The field names are the CLI's promise to scripts,
/// pinned by `robot_runs_json_keeps_its_field_names` below.
#[derive(Debug, Serialize)]
struct RunRow {
    /// The firing (RFC 3339, UTC); for a run-now request, when it was taken.
    firing: String,
    attempt: i64,
    /// succeeded, failed, lost, stopped, cancelled, skipped or missed.
    outcome: String,
    reason: Option<String>,
    started: Option<String>,
    ended: Option<String>,
    lateness_ms: Option<i64>,
    worker: String,
    slot: String,
    epoch: i64,
    /// Who asked, for a run-now request.
    by: Option<String>,
    /// For one record of many firings (skipped or missed together).
    count: Option<i64>,
    last: Option<String>,
}

/// `robot runs --json`: the schedule, what is in flight and owed, and the runs.
#[derive(Debug, Serialize)]
struct Runs {
    name: String,
    schedule: Option<String>,
    /// The next firing, from the schedule (a firing claimed ahead included).
    next: Option<String>,
    /// Firings whose time came, in flight (or starting).
    running: Vec<String>,
    /// Firings claimed ahead of their time: not started yet.
    claimed: Vec<String>,
    /// Runs a stopping instance cut off or handed on before they started
    /// (`firings.lost`): the robot's next instance retries, starts or settles each.
    handed_on: Vec<String>,
    /// Run-now requests waiting for the holder.
    triggers: usize,
    /// Firings missed outside the catch-up window, in all.
    missed: i64,
    runs: Vec<RunRow>,
}

impl From<&RunRecord> for RunRow {
    fn from(r: &RunRecord) -> RunRow {
        RunRow {
            firing: rfc3339(r.firing),
            attempt: r.attempt,
            outcome: r.outcome.map_or("?".into(), |o| o.to_string()),
            reason: r.reason.clone(),
            started: r.started.map(rfc3339),
            ended: r.ended.map(rfc3339),
            lateness_ms: r.lateness_ms,
            worker: r.worker.clone(),
            slot: r.slot.clone(),
            epoch: r.epoch,
            by: r.by.clone(),
            count: r.count,
            last: r.last.map(rfc3339),
        }
    }
}

pub(crate) async fn runs(
    store: &Store,
    name: &str,
    limit: usize,
    as_json: bool,
) -> anyhow::Result<()> {
    let d = crate::db::robots::by_name(store, name, &[NAME, SPEC, FIRINGS, RUNS])
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))?;
    let spec = d.get_document(SPEC).cloned().unwrap_or_default();
    // Firings are on the server's clock.
    let now = store.server_now().await?.timestamp_millis();
    let parsed = Schedule::from_spec(&spec, now);
    let st = FiringState::from_robot(&d);
    // The next firing, from the schedule itself: one claimed ahead, or the first
    // after now and after the last one settled.
    let next = match &parsed {
        Ok(Some(s)) => s.next_shown(st.claimed, st.running.iter().map(|e| e.firing), now),
        _ => None,
    };
    let schedule = match parsed {
        Ok(s) => s.map(|s| s.describe()),
        Err(e) => Some(format!("invalid: {e}")),
    };
    let (due, claimed) = st.due_and_claimed(now);
    let mut records = runs_of(&d);
    // Newest first, at most `limit`.
    records.reverse();
    records.truncate(limit);
    let out = Runs {
        name: name.to_string(),
        schedule,
        next: next.map(rfc3339),
        running: due.into_iter().map(rfc3339).collect(),
        claimed: claimed.into_iter().map(rfc3339).collect(),
        handed_on: st.lost.iter().map(|e| rfc3339(e.firing)).collect(),
        triggers: st.triggers.len(),
        missed: st.missed,
        runs: records.iter().map(RunRow::from).collect(),
    };
    if as_json {
        print_json(&out);
        return Ok(());
    }
    let Some(schedule) = &out.schedule else {
        say!("{name} has no spec.schedule: it runs as a daemon (or to completion, under spec.restart.on), and keeps no run record");
        return Ok(());
    };
    say!("{name}: {schedule}");
    say!(
        "next firing: {}; in flight: {}; claimed ahead: {}; handed on to the next instance: {}; run-now requests waiting: {}; missed in all: {}",
        out.next.as_deref().unwrap_or("-"),
        listed(&out.running),
        listed(&out.claimed),
        listed(&out.handed_on),
        out.triggers,
        out.missed
    );
    let rows: Vec<Vec<String>> = out
        .runs
        .iter()
        .map(|r| {
            let firing = match (&r.last, r.count) {
                (Some(last), Some(n)) => format!("{} … {last} ({n})", r.firing),
                _ => r.firing.clone(),
            };
            vec![
                firing,
                r.attempt.to_string(),
                r.outcome.clone(),
                r.lateness_ms.map_or("-".into(), |l| format!("{l} ms")),
                r.worker.clone(),
                r.by.clone().unwrap_or_default(),
                r.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(
        &[
            "FIRING", "ATTEMPT", "OUTCOME", "LATENESS", "WORKER", "BY", "REASON",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn trigger(store: &Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    let d = actions::trigger(store, name, &Actor::cli()).await?;
    if as_json {
        print_json(&super::replies::Triggered {
            triggered: name,
            slot: d.slot,
        });
    } else {
        say!(
            "asked {name}'s holder on {} for one run now (under its overlap policy); `slotpool robot runs {name}` shows it",
            d.slot.unwrap_or_default()
        );
    }
    Ok(())
}

/// Firings as a list in a sentence.
fn listed(firings: &[String]) -> String {
    if firings.is_empty() {
        "none".to_string()
    } else {
        firings.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn robot_runs_json_keeps_its_field_names() {
        let r = RunRow::from(&RunRecord::default());
        assert_eq!(
            keys(serde_json::to_value(&r).unwrap()),
            [
                "attempt",
                "by",
                "count",
                "ended",
                "epoch",
                "firing",
                "last",
                "lateness_ms",
                "outcome",
                "reason",
                "slot",
                "started",
                "worker"
            ]
        );
        let all = Runs {
            name: "x".into(),
            schedule: None,
            next: None,
            running: vec![],
            claimed: vec![],
            handed_on: vec![],
            triggers: 0,
            missed: 0,
            runs: vec![],
        };
        assert_eq!(
            keys(serde_json::to_value(&all).unwrap()),
            [
                "claimed",
                "handed_on",
                "missed",
                "name",
                "next",
                "running",
                "runs",
                "schedule",
                "triggers"
            ]
        );
    }
}
