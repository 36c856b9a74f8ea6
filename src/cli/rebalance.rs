//! `slotpool rebalance`: even out robots over the non-draining slots with fenced
//! moves, e.g. after `init --slots` grew the pool or robots piled onto a few slots.

use anyhow::bail;
use bson::{doc, oid::ObjectId};
use clap::Args;
use futures::TryStreamExt;
use serde_json::json;

use super::print_json;
use crate::placement::{self, MoveError};
use crate::store::Store;

#[derive(Debug, Args)]
pub struct RebalanceArgs {
    /// Print the plan and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Move at most this many robots (run again to continue).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), allow_hyphen_values = true)]
    max_moves: Option<u32>,
    /// Print the plan (robots per move, counts before and after) as JSON.
    #[arg(long)]
    json: bool,
}

/// One planned move of `robots` from one slot to another.
struct Planned {
    from: String,
    to: String,
    robots: Vec<(ObjectId, String)>,
    moved: u64,
    refused: Option<String>,
}

pub async fn run(store: &Store, args: RebalanceArgs) -> anyhow::Result<()> {
    let slots = placement::loads(store).await?;
    if slots.is_empty() {
        bail!("no slots to rebalance over: run `slotpool init --slots N` first (draining slots are not used)");
    }
    let counts = placement::true_counts(store).await?;
    let before: Vec<(String, i64)> = slots
        .iter()
        .map(|s| (s.id.clone(), counts.get(&s.id).copied().unwrap_or(0)))
        .collect();
    let max = args.max_moves.map_or(usize::MAX, |m| m as usize);
    let mut plan: Vec<Planned> = Vec::new();
    for (from, to, k) in placement::rebalance_plan(&before, max) {
        // Several moves may leave one slot: each takes robots none before it took.
        let taken: Vec<ObjectId> = plan
            .iter()
            .filter(|p| p.from == from)
            .flat_map(|p| p.robots.iter().map(|(id, _)| *id))
            .collect();
        let robots = pick(store, &from, k, &taken).await?;
        plan.push(Planned {
            from,
            to,
            robots,
            moved: 0,
            refused: None,
        });
    }
    if !args.dry_run {
        for p in &mut plan {
            let ids: Vec<ObjectId> = p.robots.iter().map(|(id, _)| *id).collect();
            match placement::move_robots(store, &ids, &p.from, &p.to).await {
                Ok(n) => p.moved = n,
                Err(MoveError::Db(e)) => return Err(e.into()),
                Err(e) => p.refused = Some(e.to_string()),
            }
        }
        store
            .record_event(
                "rebalance",
                doc! {"moved": plan.iter().map(|p| p.moved as i64).sum::<i64>()},
            )
            .await;
    }
    report(&args, &before, &plan);
    let refused: Vec<&String> = plan.iter().filter_map(|p| p.refused.as_ref()).collect();
    if !refused.is_empty() {
        let why: Vec<&str> = refused.iter().map(|s| s.as_str()).collect();
        bail!(
            "rebalance incomplete: {}; run `slotpool rebalance` again",
            why.join("; ")
        );
    }
    Ok(())
}

/// `k` robots of `from` not among `taken`, by name (so a plan reads the same twice).
async fn pick(
    store: &Store,
    from: &str,
    k: usize,
    taken: &[ObjectId],
) -> anyhow::Result<Vec<(ObjectId, String)>> {
    let docs: Vec<bson::Document> = store
        .robots()
        .find(doc! {"slot_id": from, "_id": {"$nin": taken}})
        .projection(doc! {"_id": 1, "name": 1})
        .sort(doc! {"name": -1})
        .limit(k as i64)
        .await?
        .try_collect()
        .await?;
    Ok(docs
        .iter()
        .filter_map(|d| {
            let id = d.get_object_id("_id").ok()?;
            Some((id, d.get_str("name").unwrap_or_default().to_string()))
        })
        .collect())
}

fn report(args: &RebalanceArgs, before: &[(String, i64)], plan: &[Planned]) {
    let mut after: Vec<(String, i64)> = before.to_vec();
    for p in plan {
        let n = if args.dry_run {
            p.robots.len() as i64
        } else {
            p.moved as i64
        };
        for (slot, delta) in [(&p.from, -n), (&p.to, n)] {
            if let Some(c) = after.iter_mut().find(|c| &c.0 == slot) {
                c.1 += delta;
            }
        }
    }
    let shape = |c: &[(String, i64)]| {
        c.iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if args.json {
        let moves: Vec<_> = plan
            .iter()
            .map(|p| {
                json!({
                    "from": p.from, "to": p.to,
                    "robots": p.robots.iter().map(|(_, n)| n).collect::<Vec<_>>(),
                    "moved": p.moved, "refused": p.refused,
                })
            })
            .collect();
        let counts = |c: &[(String, i64)]| -> serde_json::Map<String, serde_json::Value> {
            c.iter().map(|(s, n)| (s.clone(), json!(n))).collect()
        };
        print_json(&json!({
            "dry_run": args.dry_run, "moves": moves,
            "before": counts(before), "after": counts(&after),
        }));
        return;
    }
    if plan.is_empty() {
        let total: i64 = before.iter().map(|c| c.1).sum();
        if total == 0 {
            say!("nothing to rebalance: there are no robots");
        } else {
            say!("already balanced ({})", shape(before));
        }
        return;
    }
    let verb = if args.dry_run { "would move" } else { "moved" };
    for p in plan {
        let names: Vec<&str> = p.robots.iter().take(5).map(|(_, n)| n.as_str()).collect();
        let more = p.robots.len().saturating_sub(names.len());
        let n = if args.dry_run {
            p.robots.len() as u64
        } else {
            p.moved
        };
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        match &p.refused {
            Some(why) => say!("{} -> {}: refused: {why}", p.from, p.to),
            None => say!(
                "{} -> {}: {verb} {n} robot(s) ({}{tail})",
                p.from,
                p.to,
                names.join(", ")
            ),
        }
    }
    say!("before: {}", shape(before));
    say!("after:  {}", shape(&after));
    if args.dry_run {
        say!("(dry run: nothing changed)");
    }
}
