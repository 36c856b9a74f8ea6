use std::time::Duration;

use anyhow::{bail, Context as _};
use bson::{doc, Bson, Document};
use clap::Subcommand;
use futures::TryStreamExt;
use serde_json::json;

use super::{age, int, print_json, print_table, text};
use crate::store::Store;

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

/// A slot row as the server sees it now.
pub struct SlotRow {
    pub doc: Document,
    pub lease_age_ms: Option<i64>,
    pub state: &'static str,
}

/// Reads every slot with its lease age and state judged on the server's clock.
pub async fn slot_rows(store: &Store) -> anyhow::Result<Vec<SlotRow>> {
    let pipeline = vec![
        doc! {"$sort": {"_id": 1}},
        doc! {"$addFields": {
            "_age_ms": {"$cond": [
                {"$eq": [{"$type": "$time"}, "date"]},
                {"$subtract": [{"$toLong": "$$NOW"}, {"$toLong": "$time"}]},
                Bson::Null,
            ]},
        }},
    ];
    let mut cursor = store.slots().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(mut d) = cursor.try_next().await? {
        let lease_age_ms = int(&d, "_age_ms");
        d.remove("_age_ms");
        let lease_ms = int(&d, "lease_ms");
        let owner = text(&d, "owner");
        let live =
            matches!((&owner, lease_age_ms, lease_ms), (Some(_), Some(a), Some(l)) if a <= l);
        let state = if matches!(d.get("draining"), Some(Bson::Boolean(true))) {
            if live {
                "draining"
            } else {
                "drained"
            }
        } else if !matches!(d.get("epoch"), Some(Bson::Int64(_) | Bson::Int32(_))) {
            "invalid"
        } else {
            match (live, owner) {
                (true, _) => "held",
                (false, Some(_)) => "expired",
                (false, None) => "free",
            }
        };
        out.push(SlotRow {
            doc: d,
            lease_age_ms,
            state,
        });
    }
    Ok(out)
}

/// Workers whose heartbeat still counts (see [`crate::line::is_alive`]).
pub async fn live_workers(store: &Store) -> anyhow::Result<Vec<Document>> {
    let mut pipeline = crate::line::liveness();
    pipeline.push(doc! {"$sort": {"_id": 1}});
    let mut cursor = store.workers().aggregate(pipeline).await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        if crate::line::is_alive(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

async fn list(store: &Store, as_json: bool) -> anyhow::Result<()> {
    let rows = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let standbys: Vec<String> = workers
        .iter()
        .filter(|w| text(w, "slot_id").is_none())
        .filter_map(|w| text(w, "_id"))
        .collect();
    if as_json {
        let slots: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": text(&r.doc, "_id"),
                    "owner": super::state::SlotView::of(r).holder,
                    "epoch": int(&r.doc, "epoch"),
                    "rev": int(&r.doc, "rev"),
                    "state": r.state,
                    "lease_age_ms": r.lease_age_ms,
                    "lease_ms": int(&r.doc, "lease_ms"),
                    "robots": int(&r.doc, "robot_count").unwrap_or(0),
                    "draining": matches!(r.doc.get("draining"), Some(Bson::Boolean(true))),
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
                super::state::SlotView::of(r)
                    .holder
                    .unwrap_or_else(|| "-".into()),
                r.doc
                    .get("epoch")
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "-".into()),
                age(r.lease_age_ms),
                int(&r.doc, "robot_count").unwrap_or(0).to_string(),
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
    let r = store
        .slots()
        .update_one(doc! {"_id": slot}, doc! {"$set": {"draining": on}})
        .await
        .context("updating the slot")?;
    if r.matched_count == 0 {
        bail!("no slot {slot:?}: see `slotpool slots list`");
    }
    store
        .record_event(if on { "drain" } else { "undrain" }, doc! {"slot_id": slot})
        .await;
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
