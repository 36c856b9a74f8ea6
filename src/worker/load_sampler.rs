//! Measures the worker's load ([`crate::load`]) and each held slot's cost, every
//! [`SAMPLE_EVERY`], from `/proc` and the worker's cgroup: one scan of the process
//! table serves the worker's own figure and every exec robot's tree. The heartbeat
//! carries the latest load and each renewal its slot's cost: measuring adds no
//! request. The parsers and the arithmetic are pure functions with unit tests; the
//! file reads are in [`LoadSampler::sample`].
//!
//! Where the figures come from:
//! - the CPU allowance is the lowest quota on the worker's cgroup and its
//!   ancestors (a container's `--cpus`, a unit's `CPUQuota`), and the CPU used is
//!   that cgroup's own counter, so everything in the container counts; without a
//!   quota, the allowance is the host's cores and the CPU used is the worker's and
//!   its descendants' (the robots), from `/proc`;
//! - memory likewise: the cgroup's limit and use (less inactive page cache), else
//!   the host's `MemTotal` and the tree's resident memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::load::{Allowed, Cost, Load, LoadWeights, RobotCost, SlotCost, Used};
use crate::robot::cgroup::{parse_mountinfo, parse_own, Mount};
use crate::robot::meter::Meters;

/// How often the load is measured: the front of the line beats every five ticks, so
/// each heartbeat finds a figure at most this old.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// How far back the CPU figure looks, as Keeper's did.
pub(crate) const CPU_WINDOW: Duration = Duration::from_secs(60);

/// How many of a slot's heaviest robots its cost names.
pub(crate) const TOP_ROBOTS: usize = 5;

// === the process table ===

/// One process, from its `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcRow {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    /// CPU time of the process and of its reaped children, in clock ticks.
    pub(crate) ticks: u64,
    pub(crate) rss_pages: u64,
}

/// A `/proc/PID/stat` line, read after the command name's last `)` (the name may
/// hold spaces and parentheses). None for a zombie.
pub(crate) fn parse_proc_stat(pid: i32, stat: &str) -> Option<ProcRow> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields from 3 (state): ppid is 4, utime..cstime 14..17, rss 24.
    let at = |n: usize| f.get(n - 3).and_then(|v| v.parse::<i64>().ok());
    if matches!(f.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    let ticks = [14, 15, 16, 17]
        .iter()
        .map(|n| at(*n).unwrap_or(0).max(0) as u64)
        .sum();
    Some(ProcRow {
        pid,
        ppid: at(4)? as i32,
        ticks,
        rss_pages: at(24).unwrap_or(0).max(0) as u64,
    })
}

/// The process table as one scan saw it.
#[derive(Debug, Default)]
pub(crate) struct ProcTable {
    rows: HashMap<i32, ProcRow>,
    children: HashMap<i32, Vec<i32>>,
}

impl ProcTable {
    pub(crate) fn new(rows: Vec<ProcRow>) -> ProcTable {
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        for r in &rows {
            children.entry(r.ppid).or_default().push(r.pid);
        }
        ProcTable {
            rows: rows.into_iter().map(|r| (r.pid, r)).collect(),
            children,
        }
    }

    /// The CPU ticks and resident pages of `root` and everything below it.
    pub(crate) fn tree(&self, root: i32) -> (u64, u64) {
        let (mut ticks, mut pages) = (0, 0);
        let mut seen = std::collections::HashSet::new();
        let mut frontier = vec![root];
        while let Some(p) = frontier.pop() {
            if !seen.insert(p) {
                continue;
            }
            if let Some(r) = self.rows.get(&p) {
                ticks += r.ticks;
                pages += r.rss_pages;
            }
            if let Some(c) = self.children.get(&p) {
                frontier.extend(c);
            }
        }
        (ticks, pages)
    }
}

// === the cgroup's files ===

/// A v2 `cpu.max` (`QUOTA PERIOD`, `max` for none) in cores.
pub(crate) fn quota_v2(cpu_max: &str) -> Option<f64> {
    let mut f = cpu_max.split_whitespace();
    let quota: f64 = f.next()?.parse().ok()?;
    let period: f64 = f.next().unwrap_or("100000").parse().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// A v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (-1 for none) in cores.
pub(crate) fn quota_v1(quota: &str, period: &str) -> Option<f64> {
    let q: f64 = quota.trim().parse().ok()?;
    let p: f64 = period.trim().parse().ok()?;
    (q > 0.0 && p > 0.0).then(|| q / p)
}

/// A memory limit file (`memory.max`, `memory.limit_in_bytes`): None for `max` or
/// v1's "no limit" (a number near 2^63).
pub(crate) fn memory_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n > 0 && n < 1 << 60).then_some(n)
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub(crate) fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A cgroup's memory in use: its usage less the inactive page cache the kernel
/// reclaims first (what `docker stats` shows). `stat` is its `memory.stat`.
pub(crate) fn memory_used(usage: &str, stat: &str) -> Option<u64> {
    let usage: u64 = usage.trim().parse().ok()?;
    // v1's usage is hierarchical: so is `total_inactive_file` (robots' child
    // cgroups included), where `inactive_file` is the cgroup's own.
    let inactive = ["total_inactive_file", "inactive_file"]
        .iter()
        .find_map(|k| crate::robot::cgroup::counter(stat, k))
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

/// `/a/b` and its ancestors, nearest first: `/a/b`, `/a`, `/`.
fn ancestors(path: &str) -> Vec<String> {
    let mut out = vec![];
    let mut p = path.trim_end_matches('/').to_string();
    loop {
        out.push(if p.is_empty() {
            "/".to_string()
        } else {
            p.clone()
        });
        match p.rfind('/') {
            Some(i) if !p.is_empty() => p.truncate(i),
            _ => break,
        }
    }
    out
}

/// Where one controller's files are for this process's cgroup and its ancestors
/// that are visible, nearest first (none when the controller is not mounted).
fn controller_dirs(
    mounts: &[Mount],
    own: &[(Vec<String>, String)],
    controller: &str,
) -> Vec<PathBuf> {
    let v1 = mounts.iter().find_map(|m| {
        let cs = m.v1.as_ref()?;
        cs.iter().any(|c| c == controller).then_some(())?;
        let path = own
            .iter()
            .find(|(cs, _)| cs.iter().any(|c| c == controller))?;
        Some((m, path.1.clone()))
    });
    let found = v1.or_else(|| {
        let m = mounts.iter().find(|m| m.v1.is_none())?;
        let path = own.iter().find(|(cs, _)| cs.is_empty())?;
        Some((m, path.1.clone()))
    });
    let Some((m, path)) = found else {
        return Vec::new();
    };
    ancestors(&path)
        .into_iter()
        .filter_map(|p| {
            let rel = if m.root == "/" {
                p.as_str()
            } else {
                p.strip_prefix(m.root.as_str())?
            };
            Some(m.point.join(rel.trim_start_matches('/')))
        })
        .collect()
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The cgroup directories the sampler reads, found once.
#[derive(Debug, Default)]
struct Cgroup {
    /// v2 (`cpu.max`, `cpu.stat`, `memory.max`) when true, else v1.
    v2: bool,
    cpu: Vec<PathBuf>,
    cpuacct: Vec<PathBuf>,
    memory: Vec<PathBuf>,
}

impl Cgroup {
    fn find() -> Cgroup {
        let mounts = parse_mountinfo(&read(Path::new("/proc/self/mountinfo")).unwrap_or_default());
        let own = parse_own(&read(Path::new("/proc/self/cgroup")).unwrap_or_default());
        let v1 = |c: &str| {
            mounts
                .iter()
                .any(|m| m.v1.as_ref().is_some_and(|cs| cs.iter().any(|x| x == c)))
        };
        Cgroup {
            v2: !v1("cpu"),
            cpu: controller_dirs(&mounts, &own, "cpu"),
            cpuacct: controller_dirs(&mounts, &own, if v1("cpuacct") { "cpuacct" } else { "cpu" }),
            memory: controller_dirs(&mounts, &own, "memory"),
        }
    }

    /// The lowest CPU quota on the way up, with how far up it is.
    fn quota(&self) -> Option<(usize, f64)> {
        self.cpu
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                let q = if self.v2 {
                    quota_v2(&read(&d.join("cpu.max"))?)
                } else {
                    quota_v1(
                        &read(&d.join("cpu.cfs_quota_us"))?,
                        &read(&d.join("cpu.cfs_period_us"))?,
                    )
                }?;
                Some((i, q))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// CPU seconds used by the cgroup `up` levels above this process's.
    fn cpu_seconds(&self, up: usize) -> Option<f64> {
        if self.v2 {
            let stat = read(&self.cpu.get(up)?.join("cpu.stat"))?;
            Some(crate::robot::cgroup::counter(&stat, "usage_usec")? as f64 / 1e6)
        } else {
            let ns: f64 = read(&self.cpuacct.get(up)?.join("cpuacct.usage"))?
                .trim()
                .parse()
                .ok()?;
            Some(ns / 1e9)
        }
    }

    /// The lowest memory limit on the way up, and that cgroup's use.
    fn memory(&self) -> Option<(u64, u64)> {
        let (limit_file, usage_file) = if self.v2 {
            ("memory.max", "memory.current")
        } else {
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        };
        let (dir, limit) = self
            .memory
            .iter()
            .filter_map(|d| Some((d, memory_limit(&read(&d.join(limit_file))?)?)))
            .min_by_key(|(_, l)| *l)?;
        let used = memory_used(
            &read(&dir.join(usage_file))?,
            &read(&dir.join("memory.stat")).unwrap_or_default(),
        )?;
        Some((limit, used))
    }
}

// === figures over time ===

/// A cumulative CPU counter's samples over the last [`CPU_WINDOW`], for its rate.
#[derive(Debug, Default, Clone)]
pub(crate) struct CpuWindow {
    samples: VecDeque<(Instant, f64)>,
}

impl CpuWindow {
    /// Adds a reading of the counter (CPU seconds) at `at`. A counter that went
    /// back (a process replaced) starts the window again.
    pub(crate) fn push(&mut self, at: Instant, seconds: f64) {
        if self.samples.back().is_some_and(|(_, s)| seconds < *s) {
            self.samples.clear();
        }
        self.samples.push_back((at, seconds));
        // Keep one sample at least the window old, so the rate spans all of it.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| at.saturating_duration_since(*t) >= CPU_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Cores' worth of CPU used over the window (up to [`CPU_WINDOW`] back); None
    /// before two readings.
    pub(crate) fn cores(&self) -> Option<f64> {
        let (t0, s0) = self.samples.front()?;
        let (t1, s1) = self.samples.back()?;
        let span = t1.saturating_duration_since(*t0).as_secs_f64();
        (span > 0.0).then(|| ((s1 - s0) / span).max(0.0))
    }
}

/// Each slot's cost from its robots' figures: `(slot, name, measured, declared)`
/// per run, each robot weighing what it was measured to use or what it declared,
/// whichever is more. The [`TOP_ROBOTS`] heaviest are named, by CPU then memory.
pub(crate) fn slot_costs(runs: &[(String, String, Cost, Cost)]) -> BTreeMap<String, SlotCost> {
    let mut out: BTreeMap<String, SlotCost> = BTreeMap::new();
    for (slot, name, measured, declared) in runs {
        let weight = Cost {
            robots: 1,
            millicores: measured.millicores.max(declared.millicores),
            memory_bytes: measured.memory_bytes.max(declared.memory_bytes),
        };
        let cost = out.entry(slot.clone()).or_default();
        cost.total = cost.total + weight;
        cost.top.push(RobotCost {
            name: name.clone(),
            millicores: weight.millicores,
            memory_bytes: weight.memory_bytes,
        });
    }
    for cost in out.values_mut() {
        cost.top.sort_by(|a, b| {
            (b.millicores, b.memory_bytes, &a.name).cmp(&(a.millicores, a.memory_bytes, &b.name))
        });
        cost.top.truncate(TOP_ROBOTS);
    }
    out
}

// === the sampler ===

/// The latest figures, shared with the heartbeat and the held slots' renewals.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadReading(Arc<Mutex<Option<Reading>>>);

/// One sample's figures.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    /// None until the CPU figure has a rate (two samples): a worker that says it
    /// uses no CPU before it knows would look idlest to everyone.
    pub(crate) load: Option<Load>,
    /// Each held slot's cost (a slot with no robot running has none).
    pub(crate) slots: BTreeMap<String, SlotCost>,
}

impl LoadReading {
    pub(crate) fn load(&self) -> Option<Load> {
        self.0
            .lock()
            .expect("load lock")
            .as_ref()
            .and_then(|r| r.load)
    }

    /// A held slot's cost: zero robots when none of its robots runs.
    pub(crate) fn slot(&self, slot: &str) -> Option<SlotCost> {
        let r = self.0.lock().expect("load lock");
        let r = r.as_ref()?;
        Some(r.slots.get(slot).cloned().unwrap_or_default())
    }

    fn set(&self, r: Reading) {
        *self.0.lock().expect("load lock") = Some(r);
    }
}

/// Measures the worker's load and its slots' costs.
#[derive(Debug)]
pub(crate) struct LoadSampler {
    weights: LoadWeights,
    capacity: u64,
    meters: Meters,
    cgroup: Cgroup,
    host_cores: f64,
    host_memory: u64,
    clk_tck: f64,
    page: u64,
    own: CpuWindow,
    robots: HashMap<u64, CpuWindow>,
}

impl LoadSampler {
    pub(crate) fn new(weights: LoadWeights, capacity: u64, meters: Meters) -> LoadSampler {
        // SAFETY: sysconf reads a system constant.
        let (tck, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        // The CPUs this process may run on (its affinity, a cpuset), not the host's.
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        LoadSampler {
            weights,
            capacity,
            meters,
            cgroup: Cgroup::find(),
            host_cores: online.max(1) as f64,
            host_memory: read(Path::new("/proc/meminfo"))
                .and_then(|m| mem_total(&m))
                .unwrap_or(1 << 30),
            clk_tck: if tck > 0 { tck as f64 } else { 100.0 },
            page: if page > 0 { page as u64 } else { 4096 },
            own: CpuWindow::default(),
            robots: HashMap::new(),
        }
    }

    fn scan() -> ProcTable {
        let mut rows = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<i32>().ok())
                else {
                    continue;
                };
                if let Some(row) =
                    read(&entry.path().join("stat")).and_then(|s| parse_proc_stat(pid, &s))
                {
                    rows.push(row);
                }
            }
        }
        ProcTable::new(rows)
    }

    /// Takes one sample at `now`.
    pub(crate) fn sample(&mut self, now: Instant) -> Reading {
        let table = Self::scan();
        let me = std::process::id() as i32;
        let (ticks, pages) = table.tree(me);
        let quota = self.cgroup.quota();
        let (cores, used_seconds) =
            match quota.and_then(|(up, q)| Some((q, self.cgroup.cpu_seconds(up)?))) {
                Some((q, s)) => (q.min(self.host_cores), s),
                None => (self.host_cores, ticks as f64 / self.clk_tck),
            };
        self.own.push(now, used_seconds);
        let (memory_bytes, memory_used) = self
            .cgroup
            .memory()
            .unwrap_or((self.host_memory, pages * self.page));
        let runs = self.meters.runs();
        let mut measured = Vec::with_capacity(runs.len());
        let mut live = std::collections::HashSet::new();
        for run in &runs {
            let key = run.key;
            live.insert(key);
            let (t, p) = run.meter.process().map_or((0, 0), |pid| table.tree(pid));
            let seconds = t as f64 / self.clk_tck + run.meter.polled().as_secs_f64();
            let window = self.robots.entry(key).or_default();
            window.push(now, seconds);
            let cost = Cost {
                robots: 1,
                millicores: (window.cores().unwrap_or(0.0) * 1000.0).round() as u64,
                memory_bytes: p * self.page,
            };
            measured.push((run.slot.clone(), run.name.clone(), cost, run.declared));
        }
        self.robots.retain(|k, _| live.contains(k));
        let load = self.own.cores().map(|used| {
            Load::measured(
                Used {
                    cores: used,
                    robots: runs.len() as u64,
                    memory_bytes: memory_used,
                },
                Allowed {
                    cores,
                    capacity: self.capacity,
                    memory_bytes,
                },
                self.weights,
            )
        });
        Reading {
            load,
            slots: slot_costs(&measured),
        }
    }

    /// Samples every [`SAMPLE_EVERY`] into `reading`, the metrics and the
    /// worker's status until `stop`.
    pub(crate) fn spawn(
        mut self,
        reading: LoadReading,
        metrics: Arc<crate::metrics::Metrics>,
        status: crate::worker::status::SharedStatus,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    at = every.tick() => {
                        // The /proc scan is blocking file I/O: off the runtime's threads.
                        let taken = tokio::task::spawn_blocking(move || {
                            let r = self.sample(at);
                            (self, r)
                        })
                        .await;
                        match taken {
                            Ok((s, r)) => {
                                self = s;
                                if let Some(load) = &r.load {
                                    metrics.load_measured(load);
                                    status.lock().expect("status lock").load = Some(load.into());
                                }
                                reading.set(r);
                            }
                            Err(_) => return,
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_parentheses_in_its_name_is_read() {
        let line = "1234 (my (odd) robot) S 77 1234 1234 0 -1 4194560 100 0 0 0 \
                    150 50 10 5 20 0 1 0 100 12345678 2560 18446744073709551615";
        let r = parse_proc_stat(1234, line).unwrap();
        assert_eq!((r.pid, r.ppid, r.ticks, r.rss_pages), (1234, 77, 215, 2560));
        assert_eq!(
            parse_proc_stat(9, "9 (gone) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0"),
            None
        );
    }

    #[test]
    fn a_tree_sums_its_processes() {
        let row = |pid, ppid, ticks, rss_pages| ProcRow {
            pid,
            ppid,
            ticks,
            rss_pages,
        };
        let t = ProcTable::new(vec![
            row(1, 0, 1000, 1),
            row(10, 1, 5, 10),
            row(11, 10, 7, 20),
            row(12, 11, 3, 30),
            row(20, 1, 100, 100),
        ]);
        assert_eq!(t.tree(10), (15, 60));
        assert_eq!(t.tree(20), (100, 100));
        assert_eq!(t.tree(99), (0, 0));
    }

    #[test]
    fn quotas_and_limits_read_from_cgroup_files() {
        assert_eq!(quota_v2("50000 100000\n"), Some(0.5));
        assert_eq!(quota_v2("max 100000\n"), None);
        assert_eq!(quota_v2("250000 100000"), Some(2.5));
        assert_eq!(quota_v1("-1\n", "100000\n"), None);
        assert_eq!(quota_v1("150000\n", "100000\n"), Some(1.5));
        assert_eq!(memory_limit("max\n"), None);
        assert_eq!(memory_limit("9223372036854771712\n"), None);
        assert_eq!(memory_limit("536870912\n"), Some(512 << 20));
        assert_eq!(
            mem_total("MemTotal:       16384000 kB\nMemFree: 1 kB\n"),
            Some(16_384_000 * 1024)
        );
        assert_eq!(
            memory_used("1000000\n", "anon 1\ninactive_file 300000\n"),
            Some(700_000)
        );
        assert_eq!(memory_used("1000\n", "total_inactive_file 5000\n"), Some(0));
    }

    #[test]
    fn a_quota_bounds_the_cpu_share() {
        // A container limited to half a core that uses a quarter of one: half full.
        let l = Load::measured(
            Used {
                cores: 0.25,
                robots: 0,
                memory_bytes: 0,
            },
            Allowed {
                cores: quota_v2("50000 100000").unwrap(),
                capacity: 100,
                memory_bytes: 1,
            },
            LoadWeights::default(),
        );
        assert_eq!(l.cpu, 0.5);
        assert_eq!(l.score(), 32.0);
    }

    #[test]
    fn ancestors_go_up_to_the_root() {
        assert_eq!(ancestors("/a/b"), vec!["/a/b", "/a", "/"]);
        assert_eq!(ancestors("/"), vec!["/"]);
    }

    #[test]
    fn no_cgroup_means_no_directories() {
        assert!(controller_dirs(&[], &[], "cpu").is_empty());
        let mounts = parse_mountinfo(
            "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n",
        );
        let own = parse_own("1:cpu:/docker/abc\n");
        // Inside a container the mount's root is the container's cgroup: its
        // ancestors are not visible.
        assert_eq!(
            controller_dirs(&mounts, &own, "cpu"),
            vec![PathBuf::from("/sys/fs/cgroup/cpu")]
        );
        let host = parse_mountinfo("32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
        assert_eq!(
            controller_dirs(&host, &own, "cpu"),
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu/docker/abc"),
                PathBuf::from("/sys/fs/cgroup/cpu/docker"),
                PathBuf::from("/sys/fs/cgroup/cpu"),
            ]
        );
    }

    #[test]
    fn the_cpu_window_gives_the_rate_over_the_last_minute() {
        let t0 = Instant::now();
        let mut w = CpuWindow::default();
        assert_eq!(w.cores(), None);
        w.push(t0, 10.0);
        assert_eq!(w.cores(), None);
        // Half a core for 10 s.
        w.push(t0 + Duration::from_secs(10), 15.0);
        assert_eq!(w.cores(), Some(0.5));
        // A minute at a full core later, the first readings have left the window.
        for s in 1..=12 {
            w.push(t0 + Duration::from_secs(10 + 5 * s), 15.0 + 5.0 * s as f64);
        }
        assert_eq!(w.cores(), Some(1.0));
        // A counter that went back starts again.
        w.push(t0 + Duration::from_secs(80), 1.0);
        assert_eq!(w.cores(), None);
    }

    #[test]
    fn a_slot_s_cost_counts_declared_limits_and_names_the_heaviest() {
        let c = |m, b| Cost {
            robots: 1,
            millicores: m,
            memory_bytes: b,
        };
        let runs = vec![
            ("s1".into(), "idle".into(), c(0, 10), Cost::default()),
            ("s1".into(), "hog".into(), c(950, 100), Cost::default()),
            ("s1".into(), "declared".into(), c(10, 10), c(2000, 0)),
            ("s1".into(), "small".into(), c(5, 10), Cost::default()),
            ("s2".into(), "alone".into(), c(1, 1), Cost::default()),
        ];
        let costs = slot_costs(&runs);
        let s1 = &costs["s1"];
        assert_eq!(s1.total, c(2955, 130).with_robots(4));
        let names: Vec<&str> = s1.top.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["declared", "hog", "small", "idle"]);
        assert_eq!(costs["s2"].total.robots, 1);
    }
}
