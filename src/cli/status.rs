use std::time::Duration;

use bson::doc;
use clap::Args;
use serde::Serialize;

use std::collections::BTreeMap;

use super::output::{age, int, print_json, print_table, text};
use crate::db::robot_doc::RobotStatus;
use crate::db::store::Store;
use crate::pool::view::{
    self as state, live_workers, slot_rows, RobotState, SlotRow, SlotState, WorkerRole,
};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Redraw every this many seconds until interrupted. A round that cannot read
    /// the pool says since when and why (`database unreachable since …`), and the
    /// view keeps watching.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
}

pub(crate) async fn run(store: &Store, args: StatusArgs) -> anyhow::Result<()> {
    let Some(every) = args.watch else {
        return once(store, args.json, false).await;
    };
    if !(0.1..=3600.0).contains(&every) {
        anyhow::bail!("--watch takes 0.1 to 3600 seconds");
    }
    // Registered once, before the first query: a Ctrl-C arriving while a query runs
    // is kept for the select below, not lost (tokio's handler replaces the default
    // action as soon as it is installed).
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let every = Duration::from_secs_f64(every);
    // Since when the rounds fail (wall clock, for the person reading), if they do.
    let mut failing_since: Option<chrono::DateTime<chrono::Utc>> = None;
    loop {
        let round = async {
            match once(store, args.json, !args.json).await {
                Ok(()) => failing_since = None,
                Err(e) => {
                    let now = chrono::Utc::now();
                    let since = *failing_since.get_or_insert(now);
                    let failed = FailedRound::new(since, now, &e, every);
                    if args.json {
                        print_json(&failed);
                    } else {
                        print!("\x1b[2J\x1b[H");
                        for line in failed.lines() {
                            say!("{line}");
                        }
                    }
                }
            }
            tokio::time::sleep(every).await;
        };
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            () = round => {}
        }
    }
}

/// A round of `status --watch` that could not read the pool: what the view shows
/// instead, and goes on watching (as `watch` and `kubectl get -w` do). In `--json`,
/// one object with these fields, so a script tells it from a summary.
#[derive(Debug, Serialize, PartialEq)]
struct FailedRound {
    /// Whether the database did not answer (rather than refused).
    unreachable: bool,
    /// What failed, in words (never the driver's whole error, never a credential).
    error: String,
    /// When the rounds began to fail (RFC 3339, UTC).
    failing_since: String,
    /// For how long, in whole seconds.
    failing_for_s: i64,
    /// When the next round comes, in seconds.
    retry_in_s: f64,
}

impl FailedRound {
    fn new(
        since: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
        e: &anyhow::Error,
        every: Duration,
    ) -> FailedRound {
        FailedRound {
            unreachable: crate::db::store::is_unreachable(e),
            error: crate::db::store::explain(e),
            failing_since: since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            failing_for_s: (now - since).num_seconds().max(0),
            retry_in_s: every.as_secs_f64(),
        }
    }

    /// The text view: one line saying since when, and what failed.
    fn lines(&self) -> [String; 2] {
        let what = if self.unreachable {
            "database unreachable"
        } else {
            "status failing"
        };
        [
            format!(
                "{what} since {} ({} s): {}",
                self.failing_since, self.failing_for_s, self.error
            ),
            format!(
                "still watching: the next round in {} s (Ctrl-C to stop)",
                self.retry_in_s
            ),
        ]
    }
}

/// Robots counted by derived state, and the reasons of those not running.
#[derive(Default)]
struct RobotCounts {
    per_state: BTreeMap<&'static str, i64>,
    per_slot: BTreeMap<String, i64>,
    /// "why" → how many robots.
    not_running: BTreeMap<String, i64>,
}

/// An error text cut to one readable line.
fn brief(error: &str) -> String {
    let line = error.lines().next().unwrap_or("");
    if line.chars().count() > 160 {
        format!("{}…", line.chars().take(160).collect::<String>())
    } else {
        line.to_string()
    }
}

/// Counts the robots by their state derived from their slot's lease: one grouped
/// query, so it stays cheap at thousands of robots.
async fn count_robots(store: &Store, slots: &[SlotRow]) -> anyhow::Result<RobotCounts> {
    let views = state::slot_views(slots);
    let mut counts = RobotCounts::default();
    for d in crate::db::listing::robots_by_state(store).await? {
        let key = d.get_document("_id").cloned().unwrap_or_default();
        let n = int(&d, "n").unwrap_or(0);
        let slot = text(&key, "slot").unwrap_or_default();
        let st = state::derive(
            &slot,
            key.get_str("status").ok().and_then(RobotStatus::parse),
            key.get_bool("paused").unwrap_or(false),
            key.get_str("worker").ok(),
            views.get(&slot),
        );
        *counts.per_slot.entry(slot).or_default() += n;
        *counts.per_state.entry(st.state.as_str()).or_default() += n;
        let error = text(&key, "error").filter(|_| st.state == RobotState::Failed);
        if let Some(why) = error.map(|e| brief(&e)).or(st.why) {
            *counts
                .not_running
                .entry(format!("{}: {why}", st.state))
                .or_default() += n;
        }
    }
    Ok(counts)
}

/// `status --json`. The field names are the CLI's promise to scripts, pinned by
/// `status_json_keeps_its_field_names` below.
#[derive(Debug, Serialize)]
struct Status {
    slots: Vec<StatusSlot>,
    /// Slots with a live lease.
    held: usize,
    /// Free or expired slots, waiting for a worker.
    unheld: usize,
    standbys: Vec<String>,
    workers: usize,
    robots: i64,
    robots_by_state: BTreeMap<&'static str, i64>,
    robots_not_running: i64,
    /// Why robots are not running, each reason with how many.
    not_running_why: BTreeMap<String, i64>,
    failures_absorbable: usize,
    /// Each live worker's load score and parts, from its heartbeat.
    loads: BTreeMap<String, crate::load::LoadInfo>,
}

#[derive(Debug, Serialize)]
struct StatusSlot {
    id: String,
    state: SlotState,
    /// Its holder while the lease is live.
    owner: Option<String>,
    epoch: Option<i64>,
    lease_age_ms: Option<i64>,
    /// Robots bound to it, counted.
    robots: i64,
    /// Its holder's load score.
    holder_load: Option<f64>,
    /// What its running robots cost, as its holder last recorded it.
    cost: Option<crate::load::SlotCost>,
}

/// One summary: every read first, then, when `clear` says so, the screen cleared
/// and the summary printed (a round that fails prints nothing of its own).
async fn once(store: &Store, as_json: bool, clear: bool) -> anyhow::Result<()> {
    let status = summary(store).await?;
    if clear {
        print!("\x1b[2J\x1b[H");
    }
    if as_json {
        print_json(&status);
    } else {
        print_slots(&status.slots);
        print_totals(&status);
    }
    Ok(())
}

/// The pool as its slots, heartbeats and robots say, read now.
async fn summary(store: &Store) -> anyhow::Result<Status> {
    let slots = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let counts = count_robots(store, &slots).await?;
    let loads = state::loads(&workers);
    let holder_load = |s: &SlotRow| {
        state::SlotView::of(s)
            .holder
            .and_then(|h| loads.get(&h).copied())
    };
    let standbys: Vec<String> = workers
        .iter()
        .filter_map(|w| text(w, "_id").map(|id| (w, id)))
        .filter(|(w, id)| {
            state::worker_role(w, state::holds_live_slot(id, &slots)) == WorkerRole::Standby
        })
        .map(|(_, id)| id)
        .collect();
    let state::Capacity {
        held,
        unheld,
        failures_absorbable,
    } = state::capacity(slots.iter().map(|s| s.state), standbys.len());
    let total: i64 = counts.per_state.values().sum();
    let running = counts
        .per_state
        .get(RobotState::Running.as_str())
        .copied()
        .unwrap_or(0);
    Ok(Status {
        slots: slots
            .iter()
            .map(|s| StatusSlot {
                id: s.slot.id.clone(),
                state: s.state,
                owner: state::SlotView::of(s).holder,
                epoch: s.slot.epoch,
                lease_age_ms: s.lease_age_ms,
                robots: counts.per_slot.get(&s.slot.id).copied().unwrap_or(0),
                holder_load: holder_load(s).map(|l| l.score()),
                cost: s.slot.cost.clone(),
            })
            .collect(),
        loads: loads.iter().map(|(w, l)| (w.clone(), l.into())).collect(),
        held,
        unheld,
        standbys,
        workers: workers.len(),
        robots: total,
        robots_by_state: counts.per_state,
        robots_not_running: total - running,
        not_running_why: counts.not_running,
        failures_absorbable,
    })
}

/// The slots as a table, one row each.
fn print_slots(slots: &[StatusSlot]) {
    let rows: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.state.to_string(),
                s.owner.clone().unwrap_or_else(|| "-".into()),
                s.epoch.map_or("-".into(), |e| e.to_string()),
                age(s.lease_age_ms),
                s.robots.to_string(),
                state::shown_score_of(s.holder_load),
                state::shown_cpu(s.cost.as_ref()),
            ]
        })
        .collect();
    print_table(
        &[
            "SLOT",
            "STATE",
            "HOLDER",
            "EPOCH",
            "LEASE AGE",
            "ROBOTS",
            "LOAD",
            "CPU",
        ],
        &rows,
    );
}

/// The totals under the table, in words.
fn print_totals(status: &Status) {
    let (held, claimable, total) = (status.held, status.unheld, status.robots);
    let by: Vec<String> = status
        .robots_by_state
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    say!("");
    say!(
        "slots:    {held} of {} held{}",
        status.slots.len(),
        if claimable > 0 {
            format!(", {claimable} waiting for a worker")
        } else {
            String::new()
        }
    );
    say!(
        "robots:   {total}{}",
        if by.is_empty() {
            String::new()
        } else {
            format!(" ({})", by.join(", "))
        }
    );
    if status.robots_not_running > 0 {
        say!("          {} not running now:", status.robots_not_running);
        for (why, n) in &status.not_running_why {
            say!("            {n} {why}");
        }
    }
    let standbys = &status.standbys;
    say!(
        "workers:  {} live, {} standby{}",
        status.workers,
        standbys.len(),
        if standbys.is_empty() {
            String::new()
        } else {
            format!(" ({})", standbys.join(", "))
        }
    );
    if !status.loads.is_empty() {
        let mut by_score: Vec<(&String, f64)> =
            status.loads.iter().map(|(w, l)| (w, l.score)).collect();
        by_score.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)));
        let shown: Vec<String> = by_score
            .iter()
            .map(|(w, score)| format!("{w} {score:.1}"))
            .collect();
        say!(
            "load:     {} (idlest first; 0 idle, 100 full)",
            shown.join(", ")
        );
    }
    let absorb = status.failures_absorbable;
    say!(
        "can absorb {absorb} holder failure(s) now with a standby{}",
        if absorb == 0 {
            ": add workers for redundancy (survivors with room overflow meanwhile)"
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round the database did not answer reads as one line in words: since when,
    /// for how long, what failed; never the driver's debug form.
    #[test]
    fn a_failed_round_says_since_when_and_what_failed_in_words() {
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "unexpected end of file");
        let cut: mongodb::error::Error =
            mongodb::error::ErrorKind::Io(std::sync::Arc::new(io)).into();
        let e = anyhow::Error::new(cut).context("reading the slots");
        let since = chrono::DateTime::parse_from_rfc3339("2026-12-06T10:00:00Z")
            .unwrap()
            .to_utc();
        let now = since + chrono::Duration::seconds(42);
        let round = FailedRound::new(since, now, &e, Duration::from_secs(1));
        let [first, second] = round.lines();
        assert_eq!(
            first,
            "database unreachable since 2026-12-06T10:00:00Z (42 s): reading the slots: \
             the connection to the database failed: unexpected end of file"
        );
        assert!(second.starts_with("still watching"), "{second}");
        for shown in [&first, &serde_json::to_string(&round).unwrap()] {
            assert!(
                !shown.contains("Kind:") && !shown.contains("labels"),
                "{shown}"
            );
        }
        // A refusal is no outage: the view says the status fails, and why.
        let refused: mongodb::error::Error = mongodb::error::ErrorKind::Command(
            bson::from_document(
                doc! {"code": 13, "codeName": "Unauthorized", "errmsg": "not authorized"},
            )
            .unwrap(),
        )
        .into();
        let round = FailedRound::new(
            since,
            since,
            &anyhow::Error::new(refused),
            Duration::from_secs(1),
        );
        assert!(!round.unreachable);
        assert!(
            round.lines()[0].starts_with("status failing since"),
            "{:?}",
            round.lines()
        );
    }

    /// Scripts read `status --json` by these names: a rename must fail here first.
    #[test]
    fn status_json_keeps_its_field_names() {
        let v = serde_json::to_value(Status {
            slots: vec![StatusSlot {
                id: "slot-001".into(),
                state: SlotState::Expired,
                owner: None,
                epoch: Some(2),
                lease_age_ms: Some(3000),
                robots: 4,
                holder_load: None,
                cost: None,
            }],
            held: 0,
            unheld: 1,
            standbys: vec![],
            workers: 0,
            robots: 4,
            robots_by_state: [(RobotState::Waiting.as_str(), 4)].into(),
            robots_not_running: 4,
            not_running_why: [("waiting: no live worker holds slot-001".to_string(), 4)].into(),
            failures_absorbable: 0,
            loads: BTreeMap::new(),
        })
        .unwrap();
        let mut top: Vec<&String> = v.as_object().unwrap().keys().collect();
        top.sort();
        assert_eq!(
            top,
            [
                "failures_absorbable",
                "held",
                "loads",
                "not_running_why",
                "robots",
                "robots_by_state",
                "robots_not_running",
                "slots",
                "standbys",
                "unheld",
                "workers",
            ]
        );
        let mut slot: Vec<&String> = v["slots"][0].as_object().unwrap().keys().collect();
        slot.sort();
        assert_eq!(
            slot,
            [
                "cost",
                "epoch",
                "holder_load",
                "id",
                "lease_age_ms",
                "owner",
                "robots",
                "state"
            ]
        );
        assert_eq!(v["slots"][0]["state"], "expired");
        assert_eq!(v["robots_by_state"]["waiting"], 4);
    }
}
