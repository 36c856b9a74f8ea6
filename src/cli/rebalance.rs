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
    /// What to even out: `count` (the default) moves robots from the slots with
    /// the most to those with the fewest until counts differ by at most one;
    /// `load` moves the heaviest measured robots (each slot's cost names its few
    /// heaviest) from the busiest holders to the idlest until their load scores
    /// are within --band points. Robots are measured over a minute: rebalance by
    /// load a minute after they started.
    #[arg(long, value_enum, default_value_t = crate::pool::placement::PlaceBy::Count)]
    by: crate::pool::placement::PlaceBy,
    /// With --by load: how far apart (score points, 0 to 100) the busiest and the
    /// idlest holder may stay.
    #[arg(long, default_value_t = crate::pool::placement::LOAD_BAND, value_parser = parse_band)]
    band: f64,
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

fn parse_band(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(b) if (0.0..=100.0).contains(&b) => Ok(b),
        _ => Err(format!(
            "{s:?}: --band takes load score points from 0 to 100 (default {})",
            crate::pool::placement::LOAD_BAND
        )),
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(crate) async fn run(store: &Store, args: RebalanceArgs) -> anyhow::Result<()> {
    let by = match args.by {
        crate::pool::placement::PlaceBy::Count => actions::Evening::Count,
        crate::pool::placement::PlaceBy::Load => actions::Evening::Load { band: args.band },
    };
    let r = actions::rebalance(store, args.max_moves, args.dry_run, by, &Actor::cli()).await?;
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
            scores: r
                .scores
                .iter()
                .map(|(h, b, a)| {
                    (
                        h.clone(),
                        replies::HolderScores {
                            before: round(*b),
                            after: round(*a),
                        },
                    )
                })
                .collect(),
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
    if !r.scores.is_empty() {
        let scores = |pick: fn(&(String, f64, f64)) -> f64| {
            r.scores
                .iter()
                .map(|s| format!("{}: {:.1}", s.0, pick(s)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        say!("holders' load before: {}", scores(|s| s.1));
        say!(
            "holders' load after:  {} (as planned from the robots' measured cost)",
            scores(|s| s.2)
        );
    }
    if args.dry_run {
        say!("(dry run: nothing changed)");
    }
}
