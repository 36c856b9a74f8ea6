//! A run written down: its whole table in a file of its own under docs/bench/runs/,
//! one line in BENCHMARKS.md's history, and, for a full run, the current table.

/// A run as it is recorded.
pub(super) struct Run<'a> {
    /// "2026-11-28 10:03": when it ran (UTC).
    pub when: &'a str,
    /// "full run", "partial run (`--only handback`)", …
    pub kind: &'a str,
    pub commit: &'a str,
    /// Its whole table: the machine and run lines, then the rows.
    pub table: &'a str,
    pub full: bool,
}

impl Run<'_> {
    /// The name of its file under docs/bench/runs/: `2026-11-28-1003.md`.
    pub(super) fn file_name(&self) -> String {
        format!("{}.md", self.when.replace(' ', "-").replace(':', ""))
    }

    /// Its file under docs/bench/runs/: a title, then the table.
    pub(super) fn file(&self) -> String {
        format!(
            "# Benchmark run: {} UTC, {}\n\n{}\n",
            self.when,
            self.kind,
            self.table.trim()
        )
    }

    /// Its line in the history: what ran, on which commit, how many goals it met
    /// (naming the rows that missed one), and a link to its whole table.
    pub(super) fn history_line(&self, file: &str) -> String {
        let rows: Vec<&str> = self
            .table
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| benchmark "))
            .collect();
        let met: usize = rows.iter().map(|r| r.matches("**met**").count()).sum();
        let not_met: usize = rows.iter().map(|r| r.matches("**not met**").count()).sum();
        let missed: Vec<String> = rows
            .iter()
            .filter(|r| r.contains("**not met**"))
            .map(|r| {
                let name = r.split('|').nth(1).unwrap_or_default();
                name.split([':', '('])
                    .next()
                    .unwrap_or(name)
                    .trim()
                    .to_string()
            })
            .collect();
        let mut summary = format!(
            "{} row{}",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" }
        );
        let goals = met + not_met;
        if goals > 0 {
            summary.push_str(&format!(", goals met {met} of {goals}"));
            if !missed.is_empty() {
                summary.push_str(&format!(" (not met: {})", missed.join("; ")));
            }
        }
        format!(
            "- {} UTC, {}, commit {}: {summary}. [Detail](docs/bench/runs/{file})",
            self.when, self.kind, self.commit
        )
    }
}

/// BENCHMARKS.md with `run` recorded: its line at the top of the history (which
/// links `file`), and for a full run its table as the current one. Notes after the
/// history are kept as they are.
pub(super) fn record(old: &str, run: &Run, file: &str) -> String {
    let (head, notes) = match old.find("\n## Notes") {
        Some(i) => (&old[..i], &old[i..]),
        None => (old, ""),
    };
    let (head, history) = match head.find("\n## History") {
        Some(i) => (&head[..i], &head[i..]),
        None => (head, ""),
    };
    // The current table: from its "- Machine:" line to the end of the head.
    let current = head
        .find("\n- Machine:")
        .map(|i| head[i..].trim())
        .unwrap_or("(no full run recorded yet)");
    let now = if run.full { run.table.trim() } else { current };
    let past: Vec<&str> = history.lines().filter(|l| l.starts_with("- ")).collect();
    let mut out = String::new();
    out.push_str(BENCHMARKS_HEAD);
    out.push_str("\n## Current\n\n");
    out.push_str(now);
    out.push_str("\n\n## History\n\n");
    out.push_str(HISTORY_HEAD);
    out.push('\n');
    out.push_str(&run.history_line(file));
    out.push('\n');
    for line in past {
        out.push_str(line);
        out.push('\n');
    }
    let mut out = out.trim_end().to_string();
    out.push('\n');
    out.push_str(notes);
    out
}

/// What BENCHMARKS.md says before its tables.
pub(super) const BENCHMARKS_HEAD: &str = "# Benchmarks

Reproduce: `scripts/bench.sh` (`--quick` for fewer trials; `--only takeover,ctakeover,cpool,handoff,orphan,handback,rebalance,storm,cost,idle,sweep,adopt,standbys,create,output,restore,slots,web,webload,schedule,edge,scale` for some phases; `--statements` for the cost of one write by its form).
It runs release builds of real worker processes (and, for the container rows, real
containers) against a throwaway dev server of its own, restarted fresh before every
phase, and prints one table. Every run writes its whole table, with the machine and
the commit, to a file of its own in [docs/bench/runs/](docs/bench/runs/) and adds one
line to the history below; a full run's table also becomes the current table.
Only figures measured by this script are listed; each row says how it was measured,
and each goal with a number says whether the run met it. What the figures mean, how
they were found and what was tried: [docs/benchmarks-notes.md](docs/benchmarks-notes.md).
";

/// What the history says before its lines.
pub(super) const HISTORY_HEAD: &str =
    "Every run, newest first: its kind, its commit, how many of its goals it met, and a
link to its whole table. Compare figures across runs only when the machine and the
commit say they are comparable.
";
