use std::time::Duration;

use bson::{doc, Bson};
use clap::Args;
use futures::TryStreamExt;
use serde_json::json;

use super::slots::{live_workers, slot_rows};
use super::{age, int, print_json, print_table, text};
use crate::store::Store;

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
    loop {
        if !args.json {
            print!("\x1b[2J\x1b[H");
        }
        once(store, args.json).await?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs_f64(every)) => {}
        }
    }
}

async fn once(store: &Store, as_json: bool) -> anyhow::Result<()> {
    let slots = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let mut per_status = std::collections::BTreeMap::<String, i64>::new();
    let mut cursor = store
        .robots()
        .aggregate(vec![
            doc! {"$group": {"_id": {"slot": "$slot_id", "status": "$status"}, "n": {"$sum": 1}}},
        ])
        .await?;
    let mut per_slot = std::collections::BTreeMap::<String, i64>::new();
    while let Some(d) = cursor.try_next().await? {
        let key = d.get_document("_id").cloned().unwrap_or_default();
        let n = int(&d, "n").unwrap_or(0);
        *per_slot
            .entry(text(&key, "slot").unwrap_or_default())
            .or_default() += n;
        *per_status
            .entry(text(&key, "status").unwrap_or_else(|| "?".into()))
            .or_default() += n;
    }
    let held = slots.iter().filter(|s| s.state == "held").count();
    let claimable = slots
        .iter()
        .filter(|s| matches!(s.state, "free" | "expired"))
        .count();
    let standbys: Vec<String> = workers
        .iter()
        .filter(|w| text(w, "slot_id").is_none())
        .filter_map(|w| text(w, "_id"))
        .collect();
    // Each holder failure needs one standby; unheld slots consume standbys first.
    let absorb = standbys.len().saturating_sub(claimable);
    if as_json {
        let v: Vec<_> = slots
            .iter()
            .map(|s| {
                let id = text(&s.doc, "_id").unwrap_or_default();
                json!({
                    "id": id, "state": s.state, "owner": text(&s.doc, "owner"),
                    "epoch": int(&s.doc, "epoch"), "lease_age_ms": s.lease_age_ms,
                    "robots": per_slot.get(&id).copied().unwrap_or(0),
                })
            })
            .collect();
        print_json(&json!({
            "slots": v, "held": held, "unheld": claimable, "standbys": standbys,
            "workers": workers.len(), "robots_by_status": per_status,
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
                text(&s.doc, "owner").unwrap_or_else(|| "-".into()),
                s.doc
                    .get("epoch")
                    .map(Bson::to_string)
                    .unwrap_or_else(|| "-".into()),
                age(s.lease_age_ms),
                per_slot.get(&id).copied().unwrap_or(0).to_string(),
            ]
        })
        .collect();
    print_table(
        &["SLOT", "STATE", "HOLDER", "EPOCH", "LEASE AGE", "ROBOTS"],
        &rows,
    );
    let total: i64 = per_status.values().sum();
    let by: Vec<String> = per_status.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!();
    println!(
        "slots:    {held} of {} held{}",
        slots.len(),
        if claimable > 0 {
            format!(", {claimable} waiting for a worker")
        } else {
            String::new()
        }
    );
    println!(
        "robots:   {total}{}",
        if by.is_empty() {
            String::new()
        } else {
            format!(" ({})", by.join(", "))
        }
    );
    println!(
        "workers:  {} live, {} standby{}",
        workers.len(),
        standbys.len(),
        if standbys.is_empty() {
            String::new()
        } else {
            format!(" ({})", standbys.join(", "))
        }
    );
    println!(
        "can absorb {absorb} holder failure(s) now{}",
        if absorb == 0 {
            ": add workers for redundancy"
        } else {
            ""
        }
    );
    Ok(())
}
