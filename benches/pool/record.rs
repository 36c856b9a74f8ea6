//! BENCHMARKS.md: this run written in, the current table and the history kept.

/// BENCHMARKS.md with this run recorded: a full run becomes the current table and
/// the one it replaces moves to the top of the history; a quick or partial run goes
/// to the top of the history, dated, and leaves the current table alone. Notes left
/// in the file (they belong in docs/benchmarks-notes.md) are kept as they are.
pub(super) fn record(old: &str, table: &str, full: bool) -> String {
    let (head, notes) = match old.find("\n## Notes") {
        Some(i) => (&old[..i], &old[i..]),
        None => (old, ""),
    };
    let (head, history) = match head.find("\n## History") {
        Some(i) => (
            &head[..i],
            head[i..].trim_start_matches("\n## History").trim(),
        ),
        None => (head, ""),
    };
    // The current table: from its "- Machine:" line to the end of the head.
    let current = head.find("\n- Machine:").map(|i| head[i..].trim());
    let dated = |t: &str| {
        // "### 2026-11-24 09:00 UTC, full run": the run line up to its commit.
        let when = t
            .lines()
            .find_map(|l| l.strip_prefix("- Run: "))
            .map(|r| r.split([';']).next().unwrap_or(r))
            .map(|r| r.split(", commit").next().unwrap_or(r).trim().to_string())
            .unwrap_or_else(|| "an earlier run".into());
        format!("### {when}\n\n{}\n", t.trim())
    };
    let (now, newest_past) = if full {
        (table.trim().to_string(), current.map(dated))
    } else {
        (
            current.unwrap_or("(no full run recorded yet)").to_string(),
            Some(dated(table)),
        )
    };
    let mut out = String::new();
    out.push_str(BENCHMARKS_HEAD);
    out.push_str("\n## Current\n\n");
    out.push_str(&now);
    out.push_str("\n\n## History\n\n");
    out.push_str("Older runs, newest first, each on the machine it names. Figures here are\n");
    out.push_str("not current: compare a row with the current table only when the machine\n");
    out.push_str("and the commit say they are comparable.\n\n");
    if let Some(p) = newest_past {
        out.push_str(&p);
        out.push('\n');
    }
    let past = history
        .split_once("\n### ")
        .map(|(_, rest)| format!("### {rest}"))
        .unwrap_or_default();
    out.push_str(past.trim());
    let mut out = out.trim_end().to_string();
    out.push('\n');
    out.push_str(notes);
    out
}

/// What BENCHMARKS.md says before its tables.
pub(super) const BENCHMARKS_HEAD: &str = "# Benchmarks

Reproduce: `scripts/bench.sh` (`scripts/bench.sh --statements` for the cost of one write by its form; `--quick` for fewer trials, `--only takeover,ctakeover,cpool,handoff,orphan,handback,rebalance,storm,cost,idle,sweep,adopt,standbys,create,output,restore,slots,web,webload,schedule,edge`).
It runs release builds of real worker processes (and, for the container rows, real
containers) against a throwaway dev server of its own, restarted fresh before every
phase. It prints one table. A full run replaces the current table below and moves the
one before it into the history; a quick or partial run is added to the history.
Only figures measured by this script are listed; each row says how it was measured,
and each goal with a number says whether this run met it. What the figures mean, how
they were found and what was tried: [docs/benchmarks-notes.md](docs/benchmarks-notes.md).
";

/// The commit the bench was built from, `+dirty` with uncommitted changes.
pub(super) fn commit() -> String {
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
