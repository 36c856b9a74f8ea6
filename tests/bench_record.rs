//! How the benchmarks record a run (benches/pool/record.rs): the bench is built
//! without a test harness, so its record keeping is tested from here.

#[path = "../benches/pool/record.rs"]
mod record;

use record::*;

const TABLE: &str = "- Machine: 2 cores\n- Run: 2026-11-28 10:03 UTC, full run, commit abc1234\n\n| benchmark | measured | goal |\n|---|---|---|\n| Hand-back: a new worker | n=30 p99 1105 ms | p99 ≤ 1500 ms: **met** (p99 1105 ms) |\n| Container pool: 50 | p99 5239 ms | resumed: **not met** (p99 5239 ms); flat: **met**; quiet: **not met** |\n| Create rate | 3000/s | - |\n";

fn run(full: bool) -> Run<'static> {
    Run {
        when: "2026-11-28 10:03",
        kind: if full {
            "full run"
        } else {
            "partial run (`--only handback`)"
        },
        commit: "abc1234",
        table: TABLE,
        full,
    }
}

#[test]
fn a_run_is_one_line_naming_what_missed_its_goal() {
    let r = run(false);
    assert_eq!(r.file_name(), "2026-11-28-1003.md");
    assert_eq!(
        r.history_line("2026-11-28-1003.md"),
        "- 2026-11-28 10:03 UTC, partial run (`--only handback`), commit abc1234: 3 rows, goals met 2 of 4 (not met: Container pool). [Detail](docs/bench/runs/2026-11-28-1003.md)"
    );
    assert!(r
        .file()
        .starts_with("# Benchmark run: 2026-11-28 10:03 UTC, partial run"));
}

#[test]
fn a_full_run_replaces_the_current_table_and_a_partial_one_keeps_it() {
    let old = format!(
        "{BENCHMARKS_HEAD}\n## Current\n\n- Machine: old\n- Run: old\n\n## History\n\n{HISTORY_HEAD}\n- an older line\n\n## Notes\n\nkept\n"
    );
    let partial = record(&old, &run(false), "a.md");
    assert!(partial.contains("- Machine: old"), "{partial}");
    let lines: Vec<&str> = partial.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(lines.iter().any(|l| l.ends_with("(docs/bench/runs/a.md)")));
    assert!(
        partial.contains("- an older line\n\n## Notes\n\nkept\n"),
        "{partial}"
    );
    let full = record(&partial, &run(true), "b.md");
    assert!(!full.contains("- Machine: old"), "{full}");
    assert!(full.contains("- Machine: 2 cores"));
    let history = &full[full.find("## History").unwrap()..];
    let b = history.find("(docs/bench/runs/b.md)").unwrap();
    let a = history.find("(docs/bench/runs/a.md)").unwrap();
    assert!(b < a, "newest first: {history}");
    assert!(history.contains("- an older line"));
}
