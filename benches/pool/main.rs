//! slotpool benchmarks against the dev server (or MONGODB_URI): real worker
//! processes, real kill -9 and SIGTERM, figures printed as one table and recorded
//! (see record.rs): a file of its own under docs/bench/runs/ and a line in
//! BENCHMARKS.md.
//!
//!   scripts/bench.sh            full run
//!   scripts/bench.sh --quick    fewer trials (a smoke run)
//!   scripts/bench.sh --only takeover,ctakeover,cpool,handoff,orphan,handback,rebalance,storm,cost,idle,sweep,adopt,standbys,create,output,restore,slots,web,webload,schedule,edge,scale,outage,atscale
//!
//! One file per phase; this one parses the arguments, runs the phases asked for
//! and prints the table.

mod at_scale;
#[path = "../../tests/common/mod.rs"]
mod common;
mod containers;
mod cost;
mod numbers;
mod outage;
mod placement;
mod probe;
mod record;
mod scale;
mod schedule;
mod sweep;
mod takeover;
mod web;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};

use bson::{doc, Bson};
use common::containers::{container_of, docker, ip, Pool};
use common::{metric, owner, TestDb, WorkerProc};
use containers::*;
use cost::*;
use numbers::*;
use outage::*;
use placement::*;
use probe::*;
use record::*;
use scale::*;
use schedule::*;
use sweep::*;
use takeover::*;
use web::*;

struct Row {
    name: String,
    figures: String,
    goal: String,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn dist(ms: &mut [f64]) -> String {
    if ms.is_empty() {
        return "n=0".into();
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "n={} p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms.len(),
        pct(ms, 0.5),
        pct(ms, 0.99),
        ms[ms.len() - 1]
    )
}

/// The 99th percentile of `ms` (any order).
fn p99(ms: &[f64]) -> f64 {
    if ms.is_empty() {
        return f64::NAN;
    }
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    pct(&sorted, 0.99)
}

/// A goal and its verdict on this run's own figures: "goal: **met** (evidence)".
fn judged(goal: &str, met: bool, evidence: String) -> String {
    let verdict = if met { "met" } else { "not met" };
    format!("{goal}: **{verdict}** ({evidence})")
}

/// Like [`dist`], for counts.
fn counts(n: &mut [f64]) -> String {
    n.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "n={} p50 {:.0}, max {:.0}",
        n.len(),
        pct(n, 0.5),
        n[n.len() - 1]
    )
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Prints a finished row at once (a long run shows progress) and keeps it.
fn show(rows: &mut Vec<Row>, row: Row) {
    println!("{} | {}", row.name, row.figures);
    rows.push(row);
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = mem
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map(|m| m.trim().to_string())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({model}), {total} memory, Linux {}, release build; database: SecantusDB 0.7.0b3 dev server on the same machine", kernel.trim())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary
    // without it, and must not start a half-hour benchmark.
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "benchmarks run with scripts/bench.sh (cargo bench --bench pool); nothing to test here"
        );
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args[i + 1].split(',').map(str::to_string).collect());
    let want = |k: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == k));
    let trials = if quick { 5 } else { 30 };
    let big = if quick { 1000 } else { 10_000 };
    let mut rows: Vec<Row> = Vec::new();
    if want("takeover") {
        show(&mut rows, handover(trials, 100, false).await);
    }
    if want("ctakeover") {
        show(&mut rows, container_takeover(trials, 100).await);
    }
    if want("cpool") {
        // More workers than slots, so that standbys take the killed holders' slots.
        let (workers, slots, robots, rounds) = if quick {
            (20, 10, 500, 3)
        } else {
            (50, 20, 2000, 10)
        };
        show(
            &mut rows,
            container_pool(workers, slots, robots, 5, rounds).await,
        );
    }
    if want("handoff") {
        show(&mut rows, handover(trials, 100, true).await);
    }
    if want("orphan") {
        show(&mut rows, orphan(trials, 100).await);
    }
    if want("handback") {
        show(&mut rows, handback(trials).await);
    }
    if want("rebalance") {
        show(&mut rows, rebalance(1000).await);
    }
    if want("storm") {
        for r in storm_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("cost") {
        for r in cost_rows(big).await {
            show(&mut rows, r);
        }
    }
    if want("idle") {
        for r in idle_rows().await {
            show(&mut rows, r);
        }
    }
    if want("sweep") {
        for r in sweep_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("adopt") {
        for r in adopt_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("create") {
        show(&mut rows, create(1000).await);
    }
    if want("atscale") {
        show(&mut rows, at_scale::at_scale(quick).await);
    }
    if want("standbys") {
        show(&mut rows, standbys(100).await);
    }
    if want("web") {
        show(&mut rows, web_cost(big as u32).await);
    }
    if want("webload") {
        show(&mut rows, web_load().await);
    }
    if want("output") {
        show(&mut rows, output().await);
    }
    if want("restore") {
        for n in [2000, big as u32] {
            for r in restore(n).await {
                show(&mut rows, r);
            }
        }
    }
    if want("slots") {
        for r in slots_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("schedule") {
        for r in schedule_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("schedule") || want("edge") {
        show(&mut rows, edge_row(quick).await);
    }
    if want("scale") {
        for r in scale_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("outage") {
        for r in outage_rows(quick).await {
            show(&mut rows, r);
        }
    }
    if want("placement") {
        for r in placement_rows().await {
            show(&mut rows, r);
        }
    }
    let run = if quick {
        "quick run (`--quick`)".to_string()
    } else if let Some(o) = &only {
        format!("partial run (`--only {}`)", o.join(","))
    } else {
        "full run".to_string()
    };
    let when = chrono::Utc::now().format("%Y-%m-%d %H:%M").to_string();
    let commit = commit();
    let mut table = String::new();
    let _ = writeln!(table, "- Machine: {}", machine());
    let _ = writeln!(table, "- Run: {when} UTC, {run}, commit {commit}\n");
    let _ = writeln!(table, "| benchmark | measured | goal |\n|---|---|---|");
    for r in &rows {
        let _ = writeln!(table, "| {} | {} | {} |", r.name, r.figures, r.goal);
    }
    println!("\n{table}");
    let path = std::env::var("SLOTPOOL_BENCH_OUT")
        .unwrap_or_else(|_| format!("{}/BENCHMARKS.md", env!("CARGO_MANIFEST_DIR")));
    if !rows.is_empty() {
        let run = Run {
            when: &when,
            kind: &run,
            commit: &commit,
            table: &table,
            full: !quick && only.is_none(),
        };
        // The run's own file sits beside BENCHMARKS.md's docs/bench/runs/.
        let runs = std::path::Path::new(&path)
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("docs/bench/runs");
        std::fs::create_dir_all(&runs).unwrap();
        // Two runs in one minute: the second file gets a suffix.
        let first = run.file_name();
        let stem = first.trim_end_matches(".md").to_string();
        let file = std::iter::once(first)
            .chain((2..).map(|n| format!("{stem}-{n}.md")))
            .find(|f| !runs.join(f).exists())
            .expect("a free name");
        std::fs::write(runs.join(&file), run.file()).unwrap();
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, record(&old, &run, &file)).unwrap();
        println!("written to {path} and {}", runs.join(&file).display());
    }
}
/// The commit the bench was built from, `+dirty` with uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let hash = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{hash}+dirty")
    } else {
        hash
    }
}
