//! The cgroup freezer, as `docker pause` uses it: a cgroup of the test's own that
//! holds a worker and everything it starts (shims and robots are forked below it,
//! so they join it), frozen and thawed together.
//!
//! cgroup v1's `freezer` hierarchy where it is mounted (`freezer.state`), else
//! cgroup v2 (`cgroup.freeze`). Needs root, as CI and the dev machines have.

use std::path::PathBuf;
use std::time::Duration;

pub struct Freezer {
    dir: PathBuf,
    v1: bool,
}

impl Freezer {
    /// A new, thawed cgroup named for the test.
    pub fn new(name: &str) -> Freezer {
        let v1 = PathBuf::from("/sys/fs/cgroup/freezer");
        let (root, is_v1) = if v1.join("cgroup.procs").exists() {
            (v1, true)
        } else if PathBuf::from("/sys/fs/cgroup/unified/cgroup.procs").exists() {
            (PathBuf::from("/sys/fs/cgroup/unified"), false)
        } else {
            (PathBuf::from("/sys/fs/cgroup"), false)
        };
        let dir = root.join(format!("slotpool-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
            panic!(
                "this test needs the cgroup freezer (root, a writable {}): {e}",
                root.display()
            )
        });
        Freezer { dir, v1: is_v1 }
    }

    /// Its `cgroup.procs`: a process that writes `0` there moves itself in (see
    /// `TestDb::exec_worker_in`).
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Moves `pid` into the cgroup; what it forks from now on is born inside.
    pub fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }

    /// Whether `pid` is in this cgroup now.
    pub fn holds(&self, pid: i32) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.trim() == pid.to_string())
    }

    pub fn freeze(&self) {
        self.set(true);
        // v1 freezes in the background: FREEZING until every task is stopped.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while !self.frozen() {
            assert!(
                std::time::Instant::now() < end,
                "the freeze never completed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn thaw(&self) {
        self.set(false);
    }

    fn frozen(&self) -> bool {
        if self.v1 {
            std::fs::read_to_string(self.dir.join("freezer.state"))
                .unwrap_or_default()
                .trim()
                == "FROZEN"
        } else {
            std::fs::read_to_string(self.dir.join("cgroup.events"))
                .unwrap_or_default()
                .lines()
                .any(|l| l.trim() == "frozen 1")
        }
    }

    fn set(&self, frozen: bool) {
        let (file, value) = match (self.v1, frozen) {
            (true, true) => ("freezer.state", "FROZEN"),
            (true, false) => ("freezer.state", "THAWED"),
            (false, true) => ("cgroup.freeze", "1"),
            (false, false) => ("cgroup.freeze", "0"),
        };
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("write {value} to {file}: {e}"));
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.thaw();
        // Whatever is left inside goes back to the root, so the cgroup can go.
        let root = self.dir.parent().unwrap().join("cgroup.procs");
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines() {
                let _ = std::fs::write(&root, pid.trim());
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
