//! A compose project of this repository's images (`scripts/images.sh`), for the
//! container tests and benchmarks: `compose.yaml` + `compose.dev.yaml` on a project
//! name of its own, torn down (`down -v`) when dropped, and the containers' bridge
//! addresses, which are the only ones the tests talk to.

use std::process::{Command, Output};
use std::time::Duration;

/// The lease at the compose file's default tick (1 s).
pub const L: Duration = Duration::from_secs(2);

/// Pools made by this process so far: each gets a project name of its own.
static POOLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("run docker")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One compose project of this test; `down -v` when dropped.
pub struct Pool {
    pub project: String,
    /// The dashboard's port on the host's loopback.
    pub web_port: u16,
    /// `init --slots` (compose.yaml's `SLOTS`).
    pub slots: u32,
    /// The workers' tick (compose.yaml's `TICK`).
    pub tick: &'static str,
    /// Containers started beside compose's (`docker run`), removed on drop.
    extra: std::sync::Mutex<Vec<String>>,
}

impl Pool {
    /// `docker-compose` on this pool's project. In a test, every container's log is
    /// kept first (see [`Pool::keep_logs`]): the command may remove containers. (A
    /// benchmark's rounds scale its 50 containers back up; it keeps logs only on a
    /// failure.)
    pub fn compose(&self, args: &[&str]) -> Output {
        if cfg!(test) {
            self.keep_logs();
        }
        self.compose_only(args)
    }

    fn compose_only(&self, args: &[&str]) -> Output {
        Command::new("docker-compose")
            .current_dir(ROOT)
            .args([
                "-p",
                &self.project,
                "-f",
                "compose.yaml",
                "-f",
                "compose.dev.yaml",
            ])
            .args(args)
            .env("SLOTS", self.slots.to_string())
            .env("TICK", self.tick)
            .env("WEB_PORT", self.web_port.to_string())
            .output()
            .expect("run docker-compose")
    }

    /// Three slots and `workers` workers.
    pub fn up(workers: usize) -> Pool {
        Self::up_with(3, workers)
    }

    pub fn up_with(slots: u32, workers: usize) -> Pool {
        Self::up_ticking(slots, workers, "1s")
    }

    /// `slots` slots and `workers` workers renewing every `tick`.
    pub fn up_ticking(slots: u32, workers: usize, tick: &'static str) -> Pool {
        for image in ["slotpool:local", "slotpool-devdb:local"] {
            let o = docker(&["image", "inspect", image]);
            assert!(
                o.status.success(),
                "image {image} is missing: run scripts/images.sh (scripts/test.sh does) — {}",
                text(&o)
            );
        }
        let pool = Pool {
            project: format!(
                "spt{}x{}",
                std::process::id(),
                POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            web_port: super::free_port(),
            slots,
            tick,
            extra: Default::default(),
        };
        let scale = format!("worker={workers}");
        let o = pool.compose_only(&["up", "-d", "--scale", &scale]);
        assert!(o.status.success(), "compose up: {}", text(&o));
        pool
    }

    /// The containers of a service, by name.
    pub fn containers(&self, service: &str) -> Vec<String> {
        let o = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
            "--filter",
            &format!("label=com.docker.compose.service={service}"),
            "--format",
            "{{.Names}}",
        ]);
        let mut out: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        out.sort();
        out
    }

    pub fn network(&self) -> String {
        format!("{}_default", self.project)
    }

    /// `docker run -d` of one more container on the pool's network; its name.
    pub fn run(&self, name: &str, args: &[&str]) -> String {
        let name = format!("{}_{name}", self.project);
        let net = self.network();
        let mut all = vec!["run", "-d", "--name", &name, "--network", &net];
        all.extend_from_slice(args);
        let o = docker(&all);
        assert!(o.status.success(), "docker run {name}: {}", text(&o));
        self.extra.lock().unwrap().push(name.clone());
        name
    }
}

impl Pool {
    /// Where this pool's container logs are kept: under the test target's temporary
    /// directory, by project name.
    fn logs_dir(&self) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("container-logs")
            .join(&self.project)
    }

    /// Writes every container's log (name and id, so that a container removed by a
    /// scale-down and one re-created under its name are both kept) into
    /// [`Pool::logs_dir`]: what a failed test leaves to read. Taken before each
    /// [`Pool::compose`] of a test (which may remove containers) and on a failure;
    /// removed when the pool ends without one.
    fn keep_logs(&self) {
        let dir = self.logs_dir();
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        let o = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=com.docker.compose.project={}", self.project),
            "--format",
            "{{.Names}} {{.ID}}",
        ]);
        // (file name, what `docker logs` is given)
        let mut which: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(name, id)| (format!("{name}-{id}"), id.to_string()))
            .collect();
        let extra = self.extra.lock().unwrap().clone();
        which.extend(extra.into_iter().map(|name| (name.clone(), name)));
        for (file, container) in which {
            let log = docker(&["logs", "-t", &container]);
            if log.status.success() {
                let _ = std::fs::write(dir.join(format!("{file}.log")), text(&log));
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_logs();
            eprintln!("container logs kept in {}", self.logs_dir().display());
        } else {
            let _ = std::fs::remove_dir_all(self.logs_dir());
        }
        for c in self.extra.lock().unwrap().iter() {
            let _ = docker(&["rm", "-f", "-v", c]);
        }
        let _ = self.compose_only(&["down", "-v", "-t", "2"]);
    }
}

/// The URI of a pool's dev database container, as the host reaches it (the same
/// options as `scripts/dev-mongo.sh` gives: see there why retryable writes are off).
pub fn devdb_uri(mongo: &str) -> String {
    format!("mongodb://{}:27017/?{DEVDB_OPTIONS}", ip(mongo))
}

/// The options every client of a pool's dev database connects with.
pub const DEVDB_OPTIONS: &str = "directConnection=true&retryWrites=false";

/// A container's address on the pool's network.
pub fn ip(container: &str) -> String {
    let o = docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The worker container advertising `id` (`ip:7700`).
pub fn container_of(workers: &[String], id: &str) -> String {
    workers
        .iter()
        .find(|c| format!("{}:7700", ip(c)) == id)
        .unwrap_or_else(|| panic!("no worker container advertises {id}"))
        .clone()
}

/// A worker's `/metrics`, read on its container's own address (`ip:7700`).
pub fn metrics_at(addr: &str) -> Option<String> {
    get_at(addr, "/metrics", Duration::from_secs(5)).map(|(_, body)| body)
}

/// `GET path` on a container's own address (`ip:port`), as a kubelet's probe asks:
/// the status and the body, None when nothing answered within `timeout`.
pub fn get_at(addr: &str, path: &str, timeout: Duration) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(2))).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}
