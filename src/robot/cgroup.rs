//! The shim's I/O for [`super::limits`]: a cgroup of its own for one robot run (v1 or
//! v2), or rlimits, made ready before the command starts; the counters that say a
//! limit was hit, read while it runs; the cgroup removed after it.
//!
//! The robot's cgroup is a child of the worker's own (`slotpool-robot.<shim pid>`
//! beside the worker's processes), so whatever bounds the worker (a container, a
//! systemd unit) still bounds the robot: the robot's limit is the inner one. The
//! command joins it between fork and exec (it writes `0` to `cgroup.procs`), so not
//! one of its processes, however early it forks, is outside. The shim itself stays
//! outside: the kernel's OOM killer, looking for a victim inside the robot's
//! cgroup, never picks the process that must report it and clean up.
//!
//! A cgroup left behind by a shim that was killed with -9 (its robot's orphans may
//! still be in it) is swept by the next shim to start beside it: what is left in it
//! is killed and the cgroup removed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::limits::{Applied, Limits, Via};

/// The name of a robot run's cgroup, under the worker's own.
const PREFIX: &str = "slotpool-robot.";

/// A v1 `cgroup` or v2 `cgroup2` mount, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// Where it is mounted.
    pub(crate) point: PathBuf,
    /// Which cgroup of the hierarchy appears at `point` (`/` on a host; a
    /// container's own cgroup in a container without a cgroup namespace).
    pub(crate) root: String,
    /// v1: the controllers of this hierarchy; v2: None.
    pub(crate) v1: Option<Vec<String>>,
}

/// The cgroup mounts in a `mountinfo` text.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (root, point) = (*left.get(3)?, *left.get(4)?);
            let v1 = match *right.first()? {
                "cgroup2" => None,
                "cgroup" => Some(
                    right
                        .get(2)?
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
                        .map(str::to_string)
                        .collect(),
                ),
                _ => return None,
            };
            Some(Mount {
                point: PathBuf::from(unescape(point)),
                root: unescape(root),
                v1,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// This process's cgroup per hierarchy, from `/proc/self/cgroup`: (controllers,
/// path); v2's line has no controllers.
pub(crate) fn parse_own(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((controllers, path.to_string()))
        })
        .collect()
}

/// The directory of cgroup `own` as seen under mount `m`.
fn dir_of(m: &Mount, own: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        own
    } else {
        own.strip_prefix(m.root.as_str())?
    };
    Some(m.point.join(rel.trim_start_matches('/')))
}

/// The controllers `limits` needs.
fn needed(limits: &Limits) -> Vec<&'static str> {
    let mut c = Vec::new();
    if limits.memory.is_some() {
        c.push("memory");
    }
    if limits.pids.is_some() {
        c.push("pids");
    }
    if limits.cpu_millis.is_some() {
        c.push("cpu");
    }
    c
}

/// A robot run's cgroup directory, with the controllers it serves.
pub(crate) type Dir = (PathBuf, Vec<String>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// Where each controller's cgroup for this robot run will be: one directory per v1
/// hierarchy, or the one v2 directory. Pure, from the two `/proc` texts.
pub(crate) fn layout(
    mounts: &[Mount],
    own: &[(Vec<String>, String)],
    controllers: &[&str],
    name: &str,
) -> Result<(Version, Vec<Dir>), String> {
    // v1 when every needed controller has a v1 hierarchy (a hybrid host mounts an
    // empty v2 beside them).
    let mut v1: Vec<Dir> = Vec::new();
    let mut missing = Vec::new();
    for c in controllers {
        let found = mounts.iter().find_map(|m| {
            let ctrls = m.v1.as_ref()?;
            ctrls.iter().any(|x| x == c).then_some(())?;
            let path = own
                .iter()
                .find(|(cs, _)| cs.iter().any(|x| x == c))
                .map(|(_, p)| p)?;
            dir_of(m, path)
        });
        match found {
            // Controllers mounted together (`cpu,cpuacct`) share one directory.
            Some(dir) => match v1.iter_mut().find(|(d, _)| *d == dir) {
                Some((_, cs)) => cs.push(c.to_string()),
                None => v1.push((dir, vec![c.to_string()])),
            },
            None => missing.push(*c),
        }
    }
    if missing.is_empty() {
        return Ok((
            Version::V1,
            v1.into_iter().map(|(d, cs)| (d.join(name), cs)).collect(),
        ));
    }
    let v2 = mounts.iter().find(|m| m.v1.is_none());
    let path = own.iter().find(|(cs, _)| cs.is_empty()).map(|(_, p)| p);
    match (v2, path) {
        (Some(m), Some(p)) => {
            let dir = dir_of(m, p).ok_or("this process's cgroup is outside the mounted v2 tree")?;
            Ok((
                Version::V2,
                vec![(dir, controllers.iter().map(|c| c.to_string()).collect())],
            ))
        }
        _ => Err(format!(
            "no cgroup hierarchy offers {} here",
            missing.join(", ")
        )),
    }
}

/// One robot run's cgroup: made before the command starts, removed after its tree
/// is gone.
#[derive(Debug)]
pub(crate) struct RobotCgroup {
    version: Version,
    /// Each hierarchy's directory for this run.
    dirs: Vec<Dir>,
    /// `cgroup.procs` of each, open for the command to join between fork and exec.
    procs: Vec<File>,
    oom_kills: u64,
    pids_max_hits: u64,
}

impl RobotCgroup {
    /// Makes the cgroup for `limits` under this process's own and writes the limits.
    pub(crate) fn create(limits: &Limits) -> Result<RobotCgroup, String> {
        let mounts =
            parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
        let own = parse_own(&fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        let name = format!("{PREFIX}{}", std::process::id());
        let (version, dirs) = layout(&mounts, &own, &needed(limits), &name)?;
        let dirs = match version {
            Version::V1 => dirs,
            Version::V2 => {
                let (parent, controllers) = dirs.into_iter().next().expect("one v2 directory");
                enable_v2(&parent, &controllers)?;
                vec![(parent.join(&name), controllers)]
            }
        };
        let mut cg = RobotCgroup {
            version,
            dirs: Vec::new(),
            procs: Vec::new(),
            oom_kills: 0,
            pids_max_hits: 0,
        };
        for (dir, controllers) in dirs {
            if let Some(parent) = dir.parent() {
                sweep(parent);
            }
            fs::create_dir(&dir)
                .map_err(|e| format!("cannot create cgroup {}: {e}", dir.display()))?;
            // Kept from here on, so a failure below removes what was made.
            cg.dirs.push((dir.clone(), controllers.clone()));
            for c in &controllers {
                cg.write_limit(&dir, c, limits)?;
            }
            let procs = OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(|e| format!("cannot open {}/cgroup.procs: {e}", dir.display()))?;
            cg.procs.push(procs);
        }
        Ok(cg)
    }

    pub(crate) fn version(&self) -> &'static str {
        match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }

    fn write_limit(&self, dir: &Path, controller: &str, limits: &Limits) -> Result<(), String> {
        let set = |file: &str, value: String| {
            write_file(&dir.join(file), &value)
                .map_err(|e| format!("cannot set {}/{file} to {value}: {e}", dir.display()))
        };
        match (self.version, controller) {
            (Version::V1, "memory") => {
                let m = limits.memory.unwrap_or_default();
                set("memory.limit_in_bytes", m.to_string())?;
                // Memory plus swap, where swap accounting is on: a robot over its
                // limit is killed, not swapped out without end.
                let _ = write_file(&dir.join("memory.memsw.limit_in_bytes"), &m.to_string());
            }
            (Version::V1, "pids") | (Version::V2, "pids") => {
                set("pids.max", limits.pids.unwrap_or_default().to_string())?
            }
            (Version::V1, "cpu") => {
                set("cpu.cfs_period_us", "100000".into())?;
                set(
                    "cpu.cfs_quota_us",
                    (limits.cpu_millis.unwrap_or_default() * 100).to_string(),
                )?
            }
            (Version::V2, "memory") => {
                set("memory.max", limits.memory.unwrap_or_default().to_string())?;
                let _ = write_file(&dir.join("memory.swap.max"), "0");
                // The whole robot dies at the limit, not one process of it.
                let _ = write_file(&dir.join("memory.oom.group"), "1");
            }
            (Version::V2, "cpu") => set(
                "cpu.max",
                format!("{} 100000", limits.cpu_millis.unwrap_or_default() * 100),
            )?,
            _ => {}
        }
        Ok(())
    }

    /// The descriptors the command writes `0` to between fork and exec to join.
    pub(crate) fn join_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(|f| f.as_raw_fd()).collect()
    }

    fn counter(&self, controller: &str, file: &str, key: &str) -> u64 {
        self.dirs
            .iter()
            .find(|(_, cs)| cs.iter().any(|c| c == controller))
            .and_then(|(d, _)| fs::read_to_string(d.join(file)).ok())
            .and_then(|text| counter(&text, key))
            .unwrap_or(0)
    }

    /// True once the kernel killed a process of the robot for its memory limit
    /// (first time only).
    pub(crate) fn oom_killed(&mut self) -> bool {
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let n = self.counter("memory", file, "oom_kill");
        let new = n > self.oom_kills;
        self.oom_kills = n;
        new
    }

    /// True when a fork failed at the pids limit since the last call.
    pub(crate) fn pids_limit_hit(&mut self) -> bool {
        let n = self.counter("pids", "pids.events", "max");
        let new = n > self.pids_max_hits;
        self.pids_max_hits = n;
        new
    }

    /// Freezes (`on`) or thaws the whole cgroup, on cgroup v2 (`cgroup.freeze`);
    /// false where that cannot be done (v1: the shim stops the tree by signals).
    pub(crate) fn freeze(&self, on: bool) -> bool {
        if self.version != Version::V2 {
            return false;
        }
        let Some((dir, _)) = self.dirs.first() else {
            return false;
        };
        write_file(&dir.join("cgroup.freeze"), if on { "1" } else { "0" }).is_ok()
    }

    pub(crate) fn has_memory(&self) -> bool {
        self.dirs
            .iter()
            .any(|(_, cs)| cs.iter().any(|c| c == "memory"))
    }
}

impl Drop for RobotCgroup {
    /// Removes the cgroup: the shim drops it only once the robot's tree is gone.
    fn drop(&mut self) {
        self.procs.clear();
        for (dir, _) in &self.dirs {
            remove(dir);
        }
    }
}

/// A `key N` line's N in a cgroup counter file.
pub(crate) fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn write_file(path: &Path, value: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// v2 hands a controller to children only through the parent's
/// `cgroup.subtree_control`, and refuses that for a cgroup that holds processes
/// (the worker's own, usually): the error says so.
fn enable_v2(parent: &Path, controllers: &[String]) -> Result<(), String> {
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<&String> = controllers
        .iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == c.as_str()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = missing
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    write_file(&parent.join("cgroup.subtree_control"), &line).map_err(|e| {
        format!(
            "cgroup v2: cannot enable {line} for {} ({e}); a cgroup that holds processes cannot \
             hand controllers to children: delegate an empty subtree to the worker",
            parent.display()
        )
    })
}

/// Removes a cgroup directory, waiting briefly: the kernel refuses (EBUSY) until
/// the last process in it is fully gone.
fn remove(dir: &Path) {
    for _ in 0..100 {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Kills what is left in the cgroups of shims that no longer exist below `parent`
/// and removes them.
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        for _ in 0..10 {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }
            for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) on a pid; no memory involved.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        remove(&dir);
    }
}

/// How a robot run's limits are enforced, decided and made ready by the shim before
/// the command starts.
#[derive(Debug)]
pub(crate) enum Enforcement {
    /// No limits asked.
    None,
    Cgroup(RobotCgroup, Applied),
    /// `(resource, value)` pairs for `setrlimit` between fork and exec.
    Rlimit(Vec<(RlimitResource, u64)>, Applied),
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) type RlimitResource = libc::c_int;

impl Enforcement {
    /// Makes `limits` ready the way `via` asks. Only `Via::Cgroup` can fail.
    pub(crate) fn prepare(via: Via, limits: &Limits) -> Result<Enforcement, String> {
        if limits.is_empty() {
            return Ok(Enforcement::None);
        }
        let why_not = match via {
            Via::Rlimit => "--exec-limits-via rlimit".to_string(),
            Via::Cgroup | Via::Auto => match RobotCgroup::create(limits) {
                Ok(cg) => {
                    let applied = Applied::cgroup(cg.version(), limits);
                    return Ok(Enforcement::Cgroup(cg, applied));
                }
                Err(e) if via == Via::Cgroup => {
                    return Err(format!("--exec-limits-via cgroup: {e}"))
                }
                Err(e) => e,
            },
        };
        // SAFETY: geteuid has no failure mode.
        let root = unsafe { libc::geteuid() } == 0;
        let applied = Applied::rlimit(limits, root, Some(format!("cgroups not used: {why_not}")));
        Ok(Enforcement::Rlimit(rlimits(limits), applied))
    }

    pub(crate) fn applied(&self) -> Option<&Applied> {
        match self {
            Enforcement::None => None,
            Enforcement::Cgroup(_, a) | Enforcement::Rlimit(_, a) => Some(a),
        }
    }
}

/// The rlimits for `limits`: memory as address space, pids as processes of the user.
fn rlimits(limits: &Limits) -> Vec<(RlimitResource, u64)> {
    let mut r = Vec::new();
    if let Some(m) = limits.memory {
        r.push((libc::RLIMIT_AS as RlimitResource, m));
    }
    if let Some(p) = limits.pids {
        r.push((libc::RLIMIT_NPROC as RlimitResource, p));
    }
    r
}

/// Between fork and exec: joins the cgroup and sets the rlimits. Raw syscalls only.
pub(crate) fn apply_in_child(
    join: &[RawFd],
    rlimits: &[(RlimitResource, u64)],
) -> std::io::Result<()> {
    for &fd in join {
        // SAFETY: write(2) of a static byte string on a descriptor the shim owns.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    for &(resource, value) in rlimits {
        let lim = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit(2) with a struct we own.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "\
30 1 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 30 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
40 1 8:1 / / rw,relatime - ext4 /dev/root rw";

    const OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
1:cpu:/
0::/";

    #[test]
    fn mountinfo_finds_the_cgroup_hierarchies() {
        let m = parse_mountinfo(HOST);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(m[0].v1.as_deref(), Some(&["cpu".to_string()][..]));
        assert_eq!(
            m[3].v1.as_deref(),
            Some(&["xattr".to_string()][..]),
            "name= is not a controller"
        );
        assert_eq!(m[4].v1, None);
        let own = parse_own(OWN);
        assert_eq!(
            own[2],
            (vec!["memory".to_string()], "/process_api/abc".to_string())
        );
        assert_eq!(own[4], (vec![], "/".to_string()));
    }

    #[test]
    fn a_v1_host_gets_one_directory_per_hierarchy_under_its_own_cgroup() {
        let (v, dirs) = layout(
            &parse_mountinfo(HOST),
            &parse_own(OWN),
            &["memory", "pids", "cpu"],
            "slotpool-robot.7",
        )
        .unwrap();
        assert_eq!(v, Version::V1);
        assert_eq!(
            dirs,
            vec![
                (
                    PathBuf::from("/sys/fs/cgroup/memory/process_api/abc/slotpool-robot.7"),
                    vec!["memory".to_string()]
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/pids/slotpool-robot.7"),
                    vec!["pids".to_string()]
                ),
                (
                    PathBuf::from("/sys/fs/cgroup/cpu/slotpool-robot.7"),
                    vec!["cpu".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn a_container_sees_its_own_cgroup_at_the_mount_s_root() {
        let mounts = parse_mountinfo(
            "50 40 0:29 /docker/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory",
        );
        let (_, dirs) = layout(
            &mounts,
            &parse_own("4:memory:/docker/c1"),
            &["memory"],
            "r.1",
        )
        .unwrap();
        assert_eq!(dirs[0].0, PathBuf::from("/sys/fs/cgroup/memory/r.1"));
    }

    #[test]
    fn a_v2_host_gets_one_directory_and_a_missing_controller_is_named() {
        let mounts = parse_mountinfo("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw");
        let (v, dirs) = layout(
            &mounts,
            &parse_own("0::/system.slice/w.service"),
            &["memory", "pids"],
            "r.1",
        )
        .unwrap();
        assert_eq!(v, Version::V2);
        assert_eq!(
            dirs[0].0,
            PathBuf::from("/sys/fs/cgroup/system.slice/w.service")
        );
        let e = layout(&[], &[], &["pids"], "r.1").unwrap_err();
        assert_eq!(e, "no cgroup hierarchy offers pids here");
    }

    #[test]
    fn counters_are_read_by_key() {
        assert_eq!(
            counter("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(counter("max 17\n", "max"), Some(17));
        assert_eq!(counter("low 0\n", "oom_kill"), None);
    }
}
