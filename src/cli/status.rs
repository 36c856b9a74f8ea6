use std::time::Duration;

use bson::{doc, Bson};
use clap::Args;
use futures::TryStreamExt;
use serde_json::json;

use std::collections::BTreeMap;

use super::{age, int, print_json, print_table, text};
use crate::db::field::EPOCH;
use crate::db::store::Store;
use crate::pool::view::{self as state, live_workers, slot_rows, SlotRow};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[arg(long)]
    json: bool,
    /// Redraw every this many seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
}

pub async fn run(store: &Store, args: StatusArgs) -> anyhow::Result<()> {
    let Some(every) = args.watch else {
        return once(store, args.json).await;
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
    loop {
        let round = async {
            if !args.json {
                print!("\x1b[2J\x1b[H");
            }
            once(store, args.json).await?;
            tokio::time::sleep(Duration::from_secs_f64(every)).await;
            anyhow::Ok(())
        };
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            r = round => r?,
        }
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
    let mut cursor = store
        .robots()
        .aggregate(vec![doc! {"$group": {
            // A failed robot's error is its reason (exec disabled, a refused
            // variable, a bad checkpoint): few distinct texts, each worth reading.
            "_id": {"slot": "$slot_id", "status": "$status", "paused": "$paused", "worker": "$worker",
                    "error": {"$cond": [{"$eq": ["$status", "failed"]}, "$error", null]}},
            "n": {"$sum": 1},
        }}])
        .await?;
    let mut counts = RobotCounts::default();
    while let Some(d) = cursor.try_next().await? {
        let key = d.get_document("_id").cloned().unwrap_or_default();
        let n = int(&d, "n").unwrap_or(0);
        let slot = text(&key, "slot").unwrap_or_default();
        let st = state::derive(
            &slot,
            key.get_str("status").ok(),
            key.get_bool("paused").unwrap_or(false),
            key.get_str("worker").ok(),
            views.get(&slot),
        );
        *counts.per_slot.entry(slot).or_default() += n;
        *counts.per_state.entry(st.state).or_default() += n;
        let error = text(&key, "error").filter(|_| st.state == "failed");
        if let Some(why) = error.map(|e| brief(&e)).or(st.why) {
            *counts
                .not_running
                .entry(format!("{}: {why}", st.state))
                .or_default() += n;
        }
    }
    Ok(counts)
}

async fn once(store: &Store, as_json: bool) -> anyhow::Result<()> {
    let slots = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let counts = count_robots(store, &slots).await?;
    let standbys: Vec<String> = workers
        .iter()
        .filter_map(|w| text(w, "_id").map(|id| (w, id)))
        .filter(|(w, id)| state::worker_role(w, state::holds_live_slot(id, &slots)) == "standby")
        .map(|(_, id)| id)
        .collect();
    let state::Capacity {
        held,
        unheld: claimable,
        failures_absorbable: absorb,
    } = state::capacity(slots.iter().map(|s| s.state), standbys.len());
    let total: i64 = counts.per_state.values().sum();
    let running = counts.per_state.get("running").copied().unwrap_or(0);
    if as_json {
        let v: Vec<_> = slots
            .iter()
            .map(|s| {
                let id = text(&s.doc, "_id").unwrap_or_default();
                let view = state::SlotView::of(s);
                json!({
                    "id": id, "state": s.state, "owner": view.holder,
                    "epoch": int(&s.doc, EPOCH), "lease_age_ms": s.lease_age_ms,
                    "robots": counts.per_slot.get(&id).copied().unwrap_or(0),
                })
            })
            .collect();
        print_json(&json!({
            "slots": v, "held": held, "unheld": claimable, "standbys": standbys,
            "workers": workers.len(), "robots": total, "robots_by_state": counts.per_state,
            "robots_not_running": total - running, "not_running_why": counts.not_running,
            "failures_absorbable": absorb,
        }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            let id = text(&s.doc, "_id").unwrap_or_default();
            vec![
                id.clone(),
                s.state.to_string(),
                state::SlotView::of(s).holder.unwrap_or_else(|| "-".into()),
                s.doc
                    .get(EPOCH)
                    .map(Bson::to_string)
                    .unwrap_or_else(|| "-".into()),
                age(s.lease_age_ms),
                counts.per_slot.get(&id).copied().unwrap_or(0).to_string(),
            ]
        })
        .collect();
    print_table(
        &["SLOT", "STATE", "HOLDER", "EPOCH", "LEASE AGE", "ROBOTS"],
        &rows,
    );
    let by: Vec<String> = counts
        .per_state
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    say!("");
    say!(
        "slots:    {held} of {} held{}",
        slots.len(),
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
    if total > running {
        say!("          {} not running now:", total - running);
        for (why, n) in &counts.not_running {
            say!("            {n} {why}");
        }
    }
    say!(
        "workers:  {} live, {} standby{}",
        workers.len(),
        standbys.len(),
        if standbys.is_empty() {
            String::new()
        } else {
            format!(" ({})", standbys.join(", "))
        }
    );
    say!(
        "can absorb {absorb} holder failure(s) now with a standby{}",
        if absorb == 0 {
            ": add workers for redundancy (survivors with room overflow meanwhile)"
        } else {
            ""
        }
    );
    Ok(())
}
