use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde::Serialize;

use super::output::{age, print_json, print_table, text};
use crate::db::field::SLOT_ID;
use crate::db::store::Store;
use crate::pool::view::{
    live_workers, shown_cpu, shown_heaviest, shown_score, slot_rows, SlotRow, SlotState, SlotView,
};
use std::collections::HashMap;

#[derive(Debug, Subcommand)]
pub(crate) enum SlotsCommand {
    /// Every slot with its holder, epoch, lease age and robots; then the standbys.
    List {
        /// Print the slots and standbys as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hand a slot back and keep every worker off it (its robots stop until undrained).
    Drain {
        /// The slot's id, e.g. slot-002.
        slot: String,
        /// Wait until the holder has stopped the robots and released the slot.
        #[arg(long)]
        wait: bool,
    },
    /// Let workers claim a drained slot again.
    Undrain {
        /// The slot's id, e.g. slot-002.
        slot: String,
    },
}

pub(crate) async fn run(store: &Store, cmd: SlotsCommand) -> anyhow::Result<()> {
    match cmd {
        SlotsCommand::List { json } => list(store, json).await,
        SlotsCommand::Drain { slot, wait } => drain(store, &slot, true, wait).await,
        SlotsCommand::Undrain { slot } => drain(store, &slot, false, false).await,
    }
}

/// One slot in `slots list --json`. The field names are the CLI's promise to
/// scripts, pinned by `slots_list_json_keeps_its_field_names` below.
#[derive(Debug, Serialize)]
struct ListedSlot {
    id: String,
    /// Its holder while the lease is live.
    owner: Option<String>,
    epoch: Option<i64>,
    rev: Option<i64>,
    state: SlotState,
    lease_age_ms: Option<i64>,
    lease_ms: Option<i64>,
    robots: i64,
    draining: bool,
    /// Its holder's load score.
    holder_load: Option<f64>,
    /// What its running robots cost, as its holder last recorded it.
    cost: Option<crate::load::SlotCost>,
}

impl ListedSlot {
    fn of(r: &SlotRow, loads: &HashMap<String, crate::load::Load>) -> ListedSlot {
        ListedSlot {
            id: r.slot.id.clone(),
            owner: SlotView::of(r).holder,
            epoch: r.slot.epoch,
            rev: r.slot.rev,
            state: r.state,
            lease_age_ms: r.lease_age_ms,
            lease_ms: r.slot.lease_ms,
            robots: r.slot.robot_count,
            draining: r.slot.draining,
            holder_load: holder_load(r, loads).map(|l| l.score()),
            cost: r.slot.cost.clone(),
        }
    }
}

/// A slot's holder's load, from its heartbeat.
fn holder_load(
    r: &SlotRow,
    loads: &HashMap<String, crate::load::Load>,
) -> Option<crate::load::Load> {
    SlotView::of(r).holder.and_then(|h| loads.get(&h).copied())
}

/// `slots list --json`.
#[derive(Debug, Serialize)]
struct SlotList {
    slots: Vec<ListedSlot>,
    /// The live workers that hold nothing.
    standbys: Vec<String>,
}

async fn list(store: &Store, as_json: bool) -> anyhow::Result<()> {
    let rows = slot_rows(store).await?;
    let workers = live_workers(store).await?;
    let loads = crate::pool::view::loads(&workers);
    let standbys: Vec<String> = workers
        .iter()
        .filter(|w| text(w, SLOT_ID).is_none())
        .filter_map(|w| text(w, "_id"))
        .collect();
    if as_json {
        let slots = rows.iter().map(|r| ListedSlot::of(r, &loads)).collect();
        print_json(&SlotList { slots, standbys });
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
                r.slot.id.clone(),
                r.state.to_string(),
                SlotView::of(r).holder.unwrap_or_else(|| "-".into()),
                r.slot.epoch.map_or("-".into(), |e| e.to_string()),
                age(r.lease_age_ms),
                r.slot.robot_count.to_string(),
                shown_score(holder_load(r, &loads).as_ref()),
                shown_cpu(r.slot.cost.as_ref()),
                shown_heaviest(r.slot.cost.as_ref()),
            ]
        })
        .collect();
    print_table(
        &[
            "SLOT",
            "STATE",
            "OWNER",
            "EPOCH",
            "LEASE AGE",
            "ROBOTS",
            "LOAD",
            "CPU",
            "HEAVIEST",
        ],
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
            .find(|r| r.slot.id == slot)
            .context("the slot disappeared")?;
        if row.state == SlotState::Drained {
            say!("{slot}: drained (no holder, robots stopped)");
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{slot} is still held after 60s; is its holder running an older slotpool?");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::db::slot_doc::SlotDoc;

    /// Scripts read `slots list --json` by these names: a rename must fail here first.
    #[test]
    fn slots_list_json_keeps_its_field_names() {
        let row = SlotRow {
            slot: SlotDoc::from_doc(
                &bson::doc! {"_id": "slot-001", "owner": "w:1", "epoch": 3_i64, "lease_ms": 2000_i64},
            ),
            lease_age_ms: Some(10),
            state: SlotState::Held,
        };
        let v = serde_json::to_value(SlotList {
            slots: vec![ListedSlot::of(&row, &HashMap::new())],
            standbys: vec!["w:2".into()],
        })
        .unwrap();
        let mut top: Vec<&String> = v.as_object().unwrap().keys().collect();
        top.sort();
        assert_eq!(top, ["slots", "standbys"]);
        let mut keys: Vec<&String> = v["slots"][0].as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "cost",
                "draining",
                "epoch",
                "holder_load",
                "id",
                "lease_age_ms",
                "lease_ms",
                "owner",
                "rev",
                "robots",
                "state"
            ]
        );
        assert_eq!(
            (
                v["slots"][0]["state"].as_str(),
                v["slots"][0]["owner"].as_str()
            ),
            (Some("held"), Some("w:1"))
        );
    }
}
