//! `slotpool rebalance`: even out robots over the non-draining slots with fenced
//! moves, e.g. after `init --slots` grew the pool or robots piled onto a few slots.

use super::output::print_json;
use super::replies;
use crate::db::store::Store;
use crate::pool::actions::{self, Actor, Rebalance};
use anyhow::bail;
use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct RebalanceArgs {
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

pub(crate) async fn run(store: &Store, args: RebalanceArgs) -> anyhow::Result<()> {
    let r = actions::rebalance(store, args.max_moves, args.dry_run, &Actor::cli()).await?;
    report(&args, &r);
    let refused: Vec<&str> = r
        .moves
        .iter()
        .filter_map(|p| p.refused.as_deref())
        .collect();
    if !refused.is_empty() {
        bail!(
            "rebalance incomplete: {}; run `slotpool rebalance` again",
            refused.join("; ")
        );
    }
    Ok(())
}

fn report(args: &RebalanceArgs, r: &Rebalance) {
    let (before, plan, after) = (&r.before, &r.moves, r.after());
    let shape = |c: &[(String, i64)]| {
        c.iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if args.json {
        let moves = plan
            .iter()
            .map(|p| replies::RebalanceMove {
                from: &p.from,
                to: &p.to,
                robots: p.robots.iter().map(|(_, n)| n.as_str()).collect(),
                moved: p.moved,
                refused: p.refused.as_deref(),
            })
            .collect();
        let counts = |c: &[(String, i64)]| c.iter().map(|(s, n)| (s.clone(), *n)).collect();
        print_json(&replies::Rebalanced {
            dry_run: args.dry_run,
            moves,
            before: counts(before),
            after: counts(&after),
        });
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
