use std::time::Duration;

use anyhow::{bail, Context as _};
use bson::Bson;
use clap::Subcommand;
use serde_json::json;

use super::{age, int, print_json, print_table, text};
use crate::db::field::{DRAINING, EPOCH, REV, ROBOT_COUNT, SLOT_ID};
use crate::db::store::Store;
use crate::pool::view::{live_workers, slot_rows, SlotView};

#[derive(Debug, Subcommand)]
pub enum SlotsCommand {
    /// Every slot with its holder, epoch, lease age and robots; then the standbys.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Hand a slot back and keep every worker off it (its robots stop until undrained).
    Drain {
        slot: String,
        /// Wait until the holder has stopped the robots and released the slot.
        #[arg(long)]
        wait: bool,
    },
    /// Let workers claim a drained slot again.
    Undrain { slot: String },
}

pub async fn run(store: &Store, cmd: SlotsCommand) -> anyhow::Result<()> {
    match cmd {
        SlotsCommand::List { json } => list(store, json).await,
        SlotsCommand::Drain { slot, wait } => drain(store, &slot, true, wait).await,
        SlotsCommand::Undrain { slot } => drain(store, &slot, false, false).await,
    }
}

async fn list(store: &Store, as_json: bool) -> anyhow::Result<()> {
    let rows = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let standbys: Vec<String> = workers
        .iter()
        .filter(|w| text(w, SLOT_ID).is_none())
        .filter_map(|w| text(w, "_id"))
        .collect();
    if as_json {
        let slots: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": text(&r.doc, "_id"),
                    "owner": SlotView::of(r).holder,
                    "epoch": int(&r.doc, EPOCH),
                    "rev": int(&r.doc, REV),
                    "state": r.state,
                    "lease_age_ms": r.lease_age_ms,
                    "lease_ms": int(&r.doc, "lease_ms"),
                    "robots": int(&r.doc, ROBOT_COUNT).unwrap_or(0),
                    "draining": matches!(r.doc.get(DRAINING), Some(Bson::Boolean(true))),
                })
            })
            .collect();
        print_json(&json!({"slots": slots, "standbys": standbys}));
        return Ok(());
    }
    if rows.is_empty() {
        say!("no slots: run `slotpool init --slots N`");
        return Ok(());
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                text(&r.doc, "_id").unwrap_or_default(),
                r.state.to_string(),
                SlotView::of(r).holder.unwrap_or_else(|| "-".into()),
                r.doc
                    .get(EPOCH)
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "-".into()),
                age(r.lease_age_ms),
                int(&r.doc, ROBOT_COUNT).unwrap_or(0).to_string(),
            ]
        })
        .collect();
    print_table(
        &["SLOT", "STATE", "OWNER", "EPOCH", "LEASE AGE", "ROBOTS"],
        &table,
    );
    say!(
        "standbys: {}",
        if standbys.is_empty() {
            "none".to_string()
        } else {
            format!("{} ({})", standbys.len(), standbys.join(", "))
        }
    );
    Ok(())
}

async fn drain(store: &Store, slot: &str, on: bool, wait: bool) -> anyhow::Result<()> {
    use crate::pool::actions::{self, Actor};
    actions::set_draining(store, slot, on, &Actor::cli()).await?;
    if !on {
        say!("{slot}: workers may claim it again");
        return Ok(());
    }
    if !wait {
        say!("{slot}: draining; its holder stops the robots and releases it at its next tick");
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows = slot_rows(store).await?;
        let row = rows
            .iter()
            .find(|r| text(&r.doc, "_id").as_deref() == Some(slot))
            .context("the slot disappeared")?;
        if row.state == "drained" {
            say!("{slot}: drained (no holder, robots stopped)");
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{slot} is still held after 60s; is its holder running an older slotpool?");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
