//! Test helpers: the dev server, a unique database per test, real worker processes,
//! and waiting for conditions with deadlines.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use slotpool::Store;

pub mod containers;
pub mod freezer;
pub mod invariants;
pub mod kubernetes;
pub mod proxy;
pub mod web;

pub const BIN: &str = env!("CARGO_BIN_EXE_slotpool");

/// The server's base URI: `MONGODB_URI` if set, else the dev server, started once by
/// `scripts/dev-mongo.sh`.
pub fn base_uri() -> &'static str {
    static URI: OnceLock<String> = OnceLock::new();
    URI.get_or_init(|| {
        if let Ok(uri) = std::env::var("MONGODB_URI") {
            return uri;
        }
        dev_mongo("start")
    })
}

/// Runs `scripts/dev-mongo.sh ACTION` on the project's own dev server (never on a
/// `MONGODB_URI` server) and returns what it printed (the URI, for start/fresh).
pub fn dev_mongo(action: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/dev-mongo.sh"))
        .arg(action)
        .env_remove("MONGODB_URI")
        .output()
        .expect("run scripts/dev-mongo.sh");
    assert!(
        out.status.success(),
        "scripts/dev-mongo.sh {action} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// One sample's value from a Prometheus text page (0 when absent).
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `base` with its database path replaced by `db`.
pub fn with_database(base: &str, db: &str) -> String {
    let (scheme, rest) = base.split_once("://").expect("a mongodb:// URI");
    let (hosts, query) = match rest.find(['/', '?']) {
        Some(i) => {
            let tail = &rest[i..];
            let q = tail.find('?').map(|j| &tail[j..]).unwrap_or("");
            (&rest[..i], q)
        }
        None => (rest, ""),
    };
    format!("{scheme}://{hosts}/{db}{query}")
}

/// A database of its own for one test.
pub struct TestDb {
    pub uri: String,
    pub name: String,
    pub store: Store,
    pub dir: PathBuf,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub async fn new(label: &str) -> TestDb {
        Self::new_on(base_uri(), label).await
    }

    /// A database of its own (and a directory of its own) on the server at `base`.
    pub async fn new_on(base: &str, label: &str) -> TestDb {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("t_{label}_{}_{n}_{nanos}", std::process::id());
        Self::on(base, &name).await
    }

    /// The database `name` on the server at `base`.
    pub async fn on(base: &str, name: &str) -> TestDb {
        let name = name.to_string();
        let uri = with_database(base, &name);
        let store = Store::connect(&uri)
            .await
            .expect("connect to the test server");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        TestDb {
            uri,
            name,
            store,
            dir,
        }
    }

    pub async fn init(&self, slots: u32) {
        slotpool::pool::init::init(&self.store, slots)
            .await
            .expect("init");
    }

    /// Runs the CLI against this database.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("MONGODB_URI", &self.uri)
            .env("SLOTPOOL_LOG", "warn")
            .output()
            .expect("run slotpool")
    }

    /// Starts the CLI without waiting for it (to race it against another command).
    pub fn cli_child(&self, args: &[&str]) -> std::process::Child {
        Command::new(BIN)
            .args(args)
            .env("MONGODB_URI", &self.uri)
            .env("SLOTPOOL_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run slotpool")
    }

    /// Runs the CLI and insists it succeeded; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "slotpool {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `robot create` of `count` counters `NAME-1`… stepping every `interval_ms`, each
    /// keeping its whole history for the invariant checker.
    pub fn counters(&self, name: &str, count: u32, interval_ms: u32) -> Output {
        self.cli(&[
            "robot",
            "create",
            "--name",
            name,
            "--kind",
            "counter",
            "--interval-ms",
            &interval_ms.to_string(),
            "--history",
            "1000",
            "--count",
            &count.to_string(),
            // By count: these tests are about what happens to robots, not where
            // load sends them (tests/placement.rs is), and a worker's measured
            // load varies with the machine.
            "--by",
            "count",
        ])
    }

    /// Counters `c-1` … `c-COUNT` stepping every 200 ms with their whole history,
    /// spread evenly: the robots most multi-process tests run. Insists it succeeded.
    pub fn create_counters(&self, count: u32) {
        let out = self.counters("c", count, 200);
        assert!(out.status.success(), "{out:?}");
    }

    /// `robot create NAME --kind exec --command COMMAND` and `extra`, insisting it
    /// succeeded.
    pub fn exec(&self, name: &str, command: &str, extra: &[&str]) {
        let mut args = vec![
            "robot",
            "create",
            "--name",
            name,
            "--kind",
            "exec",
            "--command",
            command,
        ];
        args.extend_from_slice(extra);
        self.cli_ok(&args);
    }

    /// How many slots each worker holds now, by the slots' owners.
    pub async fn held_per_worker(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for s in self.slots().await {
            if let Some(o) = owner(&s) {
                *out.entry(o).or_default() += 1;
            }
        }
        out
    }

    /// Two workers of a two-slot pool holding one slot each: `start(0)` claims the
    /// slots first; once `start(1)` runs, the first hands one back to it.
    pub async fn one_slot_each(
        &self,
        start: impl Fn(usize) -> WorkerProc,
    ) -> (WorkerProc, WorkerProc) {
        let first = start(0);
        wait_for(
            Duration::from_secs(30),
            "the first worker to hold a slot",
            || async {
                self.held_per_worker()
                    .await
                    .contains_key(&first.id)
                    .then_some(())
            },
        )
        .await;
        let second = start(1);
        wait_for(Duration::from_secs(60), "one slot per worker", || async {
            let held = self.held_per_worker().await;
            (held.get(&first.id) == Some(&1) && held.get(&second.id) == Some(&1)).then_some(())
        })
        .await;
        (first, second)
    }

    pub fn worker(&self, extra: &[&str]) -> WorkerProc {
        WorkerProc::start(&self.uri, &self.dir, extra)
    }

    /// A worker whose `exec` robots may run the commands in this test's directory
    /// (`exec` is off without `--exec-allow`).
    pub fn exec_worker(&self, extra: &[&str]) -> WorkerProc {
        let allow = self.exec_allow();
        let mut args = vec!["--exec-allow", &allow];
        args.extend_from_slice(extra);
        WorkerProc::start(&self.uri, &self.dir, &args)
    }

    /// Inserts an exec robot on slot-001 by hand, as someone with write access to
    /// the database would: none of the CLI's checks are in the way.
    pub async fn insert_exec_by_hand(&self, name: &str, spec: Document) {
        let now = bson::DateTime::now();
        self.store
            .robots()
            .insert_one(bson::doc! {
                "_id": bson::oid::ObjectId::new(), "name": name, "kind": "exec", "spec": spec,
                "slot_id": "slot-001", "epoch": 0_i64, "context": {}, "seq": 0_i64, "paused": false,
                "status": "pending", "error": bson::Bson::Null, "restarts": 0_i64,
                "worker": bson::Bson::Null, "created_at": now, "checkpointed_at": bson::Bson::Null,
            })
            .await
            .unwrap();
        self.store
            .slots()
            .update_one(
                bson::doc! {"_id": "slot-001"},
                bson::doc! {"$inc": {"rev": 1_i64, "robot_count": 1_i64}},
            )
            .await
            .unwrap();
    }

    /// An exec worker born inside the cgroup whose `cgroup.procs` is `procs` (it
    /// joins between fork and exec, so everything it starts is inside too).
    pub fn exec_worker_in(&self, procs: &Path, extra: &[&str]) -> WorkerProc {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let path = std::ffi::CString::new(procs.as_os_str().as_bytes()).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", &self.uri);
        // SAFETY: open, write and close are async-signal-safe; the path was made
        // before the fork. "0" moves the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        let allow = self.exec_allow();
        let mut args = vec!["--exec-allow", &allow];
        args.extend_from_slice(extra);
        WorkerProc::spawn(cmd, &self.dir, &args)
    }

    /// An exec robot running `command` on `schedule` (the JSON of `spec.schedule`).
    pub fn scheduled_exec(&self, name: &str, command: &str, schedule: &str) {
        let spec = format!(r#"{{"command": "{command}", "schedule": {schedule}}}"#);
        self.cli_ok(&[
            "robot", "create", "--name", name, "--kind", "exec", "--spec", &spec,
        ]);
    }

    /// `--exec-allow` for this test's directory.
    pub fn exec_allow(&self) -> String {
        format!("{}/", self.dir.display())
    }

    pub async fn slot(&self, id: &str) -> Document {
        self.store
            .slots()
            .find_one(doc! {"_id": id})
            .await
            .unwrap()
            .expect("slot exists")
    }

    pub async fn slots(&self) -> Vec<Document> {
        use futures::TryStreamExt;
        self.store
            .slots()
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }

    pub async fn robot(&self, name: &str) -> Document {
        self.store
            .robots()
            .find_one(doc! {"name": name})
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("robot {name} exists"))
    }

    /// The robot's `applied_limits`, once its shim reported them.
    pub async fn applied_limits(&self, name: &str) -> Document {
        wait_for(
            Duration::from_secs(60),
            "the shim's applied limits",
            || async {
                self.robot(name)
                    .await
                    .get_document("applied_limits")
                    .ok()
                    .cloned()
            },
        )
        .await
    }

    /// Waits until the robot's kept output (`robot logs`) contains `needle`: it is
    /// written a little after the robot printed it.
    pub async fn wait_output(&self, name: &str, needle: &str) {
        wait_for(
            Duration::from_secs(30),
            &format!("{needle:?} in {name}'s output"),
            || async {
                self.cli_ok(&["robot", "logs", name])
                    .contains(needle)
                    .then_some(())
            },
        )
        .await
    }

    /// Every robot's `(name, seq)`.
    pub async fn seqs(&self) -> Vec<(String, i64)> {
        self.robots()
            .await
            .iter()
            .map(|r| {
                (
                    r.get_str("name").unwrap().to_string(),
                    r.get_i64("seq").unwrap(),
                )
            })
            .collect()
    }

    pub async fn robots(&self) -> Vec<Document> {
        use futures::TryStreamExt;
        self.store
            .robots()
            .find(doc! {})
            .sort(doc! {"name": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    }
}

/// A free TCP port on loopback (bound and released; the worker binds it again).
/// Writes an executable bash script into the test's directory; returns its path.
/// A script line that allocates 500 MB: `tail -n 1` keeps a line whole in memory
/// until its end, and 500 MB of zeros hold no newline. Under a memory limit of
/// 100 MB it is killed (cgroups) or its allocation fails (`RLIMIT_AS`: `tail: memory
/// exhausted`).
pub const MEMORY_HOG: &str = "head -c 500000000 /dev/zero | tail -n 1 > /dev/null\n";

/// Whether `pid` exists and is neither a zombie waiting to be reaped nor dead,
/// judged from /proc.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|st| st[st.rfind(')')? + 2..].chars().next())
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Whether `pid` can run no more: gone, a zombie, stopped (SIGSTOP), or in a frozen
/// cgroup. A shim suspends its robot so at its deadline (the outage design), and
/// kills it once its worker says the lease is lost or `--suspend-for` runs out.
pub fn cannot_run(pid: i32) -> bool {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = st
        .rfind(')')
        .and_then(|i| st[i + 2..].chars().next())
        .unwrap_or('X');
    if matches!(state, 'Z' | 'X' | 'T' | 't') {
        return true;
    }
    // cgroup v2: "0::/path"; frozen when its cgroup.events says so.
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|c| {
            let path = c.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
            std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.events")).ok()
        })
        .is_some_and(|events| events.lines().any(|l| l == "frozen 1"))
}

/// For a test that steps a private server's clock forward by 10 s with libfaketime:
/// checks that the step has not come yet (the pool was set up in time), then waits
/// for it, and returns the server's time just after it. The server and this
/// machine share one clock but for the step.
pub async fn server_clock_step(db: &TestDb) -> i64 {
    let server_ms = || async { db.store.server_now().await.unwrap().timestamp_millis() };
    let ahead = |server: i64| server - chrono::Utc::now().timestamp_millis();
    assert!(
        ahead(server_ms().await) < 5_000,
        "the pool took longer to set up than the time before the step"
    );
    loop {
        let now = server_ms().await;
        if ahead(now) > 5_000 {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// libfaketime, as Debian's `faketime` package installs it (scripts/test.sh does):
/// tests skew a worker's clock or step the dev server's with it.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

pub fn script(db: &TestDb, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = db.dir.join(name);
    std::fs::write(&path, format!("#!/usr/bin/env bash\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_string_lossy().into_owned()
}

/// An exec robot that ignores SIGTERM (and so does its `sleep`) and records every
/// step in `steps` as `EPOCH PID NANOS` (wall clock) before it checkpoints it.
pub fn stubborn_robot(db: &TestDb) -> String {
    let dir = db.dir.display();
    script(
        db,
        "stubborn.sh",
        &format!(
            r#"trap '' TERM
n=$(printf '%s' "$SLOTPOOL_CONTEXT" | sed -n 's/.*"n": *\([0-9]*\).*/\1/p')
n=${{n:-0}}
while true; do
  n=$((n+1))
  echo "$SLOTPOOL_EPOCH $$ $(date +%s%N)" >> {dir}/steps
  echo "{{\"checkpoint\": {{\"n\": $n}}}}"
  sleep 0.2
done
"#
        ),
    )
}

/// `(epoch, pid, wall-clock ns)` of every step the stubborn robot took.
pub fn stubborn_steps(db: &TestDb) -> Vec<(i64, i32, u128)> {
    std::fs::read_to_string(db.dir.join("steps"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The stubborn robot's steps taken under `epoch`, in order.
pub fn stubborn_steps_under(db: &TestDb, epoch: i64) -> Vec<(i64, i32, u128)> {
    stubborn_steps(db)
        .into_iter()
        .filter(|s| s.0 == epoch)
        .collect()
}

/// The steps process `pid` of the stubborn robot took after `after_ns` (wall clock).
pub fn stubborn_steps_of(db: &TestDb, pid: i32, after_ns: u128) -> Vec<(i64, i32, u128)> {
    stubborn_steps(db)
        .into_iter()
        .filter(|s| s.1 == pid && s.2 > after_ns)
        .collect()
}

pub fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A port nothing listens on now, and one this test process has not handed out
/// before: the kernel may give the same free port to two callers in a row, and two
/// workers of one test then shared an identity and a log file (a CI run failed so:
/// five workers, four logs, one refused).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// A real `slotpool worker` process.
pub struct WorkerProc {
    pub child: Child,
    pub id: String,
    pub port: u16,
    pub log: PathBuf,
}

impl WorkerProc {
    pub fn start(uri: &str, dir: &Path, extra: &[&str]) -> WorkerProc {
        Self::start_with(uri, dir, extra, &[])
    }

    /// Like `start`, with extra environment (e.g. an LD_PRELOAD).
    pub fn start_with(uri: &str, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> WorkerProc {
        let mut cmd = Command::new(BIN);
        cmd.envs(env.iter().copied()).env("MONGODB_URI", uri);
        Self::spawn(cmd, dir, extra)
    }

    /// Like `start`, from another build's binary (a benchmark's baseline: the
    /// commit before a change).
    pub fn start_bin(bin: &str, uri: &str, dir: &Path, extra: &[&str]) -> WorkerProc {
        let mut cmd = Command::new(bin);
        cmd.env("MONGODB_URI", uri);
        Self::spawn(cmd, dir, extra)
    }

    /// Like `start`, with the URI on the command line (`--mongodb-uri URI`).
    pub fn start_uri_flag(uri: &str, dir: &Path, extra: &[&str]) -> WorkerProc {
        let mut cmd = Command::new(BIN);
        cmd.env_remove("MONGODB_URI").args(["--mongodb-uri", uri]);
        Self::spawn(cmd, dir, extra)
    }

    /// Like `start`, with at most `nofile` open descriptors (soft and hard limit).
    pub fn start_nofile(uri: &str, dir: &Path, extra: &[&str], nofile: u64) -> WorkerProc {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", uri);
        // SAFETY: setrlimit is async-signal-safe; it runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Self::spawn(cmd, dir, extra)
    }

    fn spawn(cmd: Command, dir: &Path, extra: &[&str]) -> WorkerProc {
        let port = free_port();
        Self::spawn_as(cmd, dir, &format!("127.0.0.1:{port}"), port, extra)
    }

    /// A worker on `port`, advertising `127.0.0.1:port`: started where a killed
    /// one was, it has that one's address (a restarted container, a pod that got a
    /// dead one's IP).
    pub fn start_on_port(uri: &str, dir: &Path, port: u16, extra: &[&str]) -> WorkerProc {
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", uri);
        Self::spawn_as(cmd, dir, &format!("127.0.0.1:{port}"), port, extra)
    }

    /// A worker that advertises `id` whatever port it serves HTTP on (a copied
    /// `SLOTPOOL_ADVERTISE`); its HTTP port is a fresh one.
    pub fn start_as(uri: &str, dir: &Path, id: &str, extra: &[&str]) -> WorkerProc {
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", uri);
        Self::spawn_as(cmd, dir, id, free_port(), extra)
    }

    fn spawn_as(mut cmd: Command, dir: &Path, id: &str, port: u16, extra: &[&str]) -> WorkerProc {
        let id = id.to_string();
        let listen = format!("127.0.0.1:{port}");
        // A second process on a port (a restart where a killed one was) keeps the
        // first one's log.
        let log = (1..)
            .map(|n| match n {
                1 => dir.join(format!("worker-{port}.log")),
                n => dir.join(format!("worker-{port}-{n}.log")),
            })
            .find(|p| !p.exists())
            .expect("a free log name");
        let file = File::create(&log).unwrap();
        let child = cmd
            .args(["worker", "--advertise", &id, "--listen", &listen])
            .args(extra)
            // SLOTPOOL_TEST_LOG overrides the filter, e.g. to trace one module.
            .env(
                "SLOTPOOL_LOG",
                std::env::var("SLOTPOOL_TEST_LOG")
                    .unwrap_or_else(|_| "info,slotpool=debug,mongodb=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn worker");
        WorkerProc {
            child,
            id,
            port,
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the worker's log contains `needle`.
    pub async fn wait_log(&self, needle: &str, limit: Duration) {
        wait_for(
            limit,
            &format!("{needle:?} in {}'s log", self.id),
            || async { self.log_text().contains(needle).then_some(()) },
        )
        .await
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// One metric from the worker's /metrics (None when it does not answer).
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.http_get("/metrics").map(|(_, m)| metric(&m, name))
    }

    /// Plain HTTP GET on the worker's port: (status code, body).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // A stopped process cannot die of SIGKILL until continued.
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns Some or `limit` passes; panics with `what` then.
pub async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn owner(slot: &Document) -> Option<String> {
    slot.get_str("owner").ok().map(str::to_string)
}

pub fn epoch(slot: &Document) -> i64 {
    slot.get_i64("epoch").unwrap()
}

/// The host:port of a mongodb:// URI (the first host).
pub fn uri_addr(uri: &str) -> std::net::SocketAddr {
    let rest = uri.split_once("://").unwrap().1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let end = rest.find(['/', '?', ',']).unwrap_or(rest.len());
    use std::net::ToSocketAddrs;
    rest[..end].to_socket_addrs().unwrap().next().unwrap()
}

impl TestDb {
    /// A worker whose database traffic goes through `proxy`.
    pub fn worker_via(&self, proxy: &proxy::Proxy, extra: &[&str]) -> WorkerProc {
        WorkerProc::start(&proxy.uri(&self.uri), &self.dir, extra)
    }
}

/// A dev server of a test's own (so it can be killed), on its own port and data.
pub struct PrivateServer {
    pub uri: String,
    port: u16,
    /// Environment for scripts/dev-mongo.sh itself (SLOTPOOL_DEV_SERVER_ARGS,
    /// SLOTPOOL_DEV_REPORT_VERSION, ...), kept for restarts.
    launcher: Vec<(String, String)>,
}

impl PrivateServer {
    fn script(&self, cmd: &str, server_env: &[(&str, &str)]) -> String {
        let root = env!("CARGO_MANIFEST_DIR");
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/dev-mongo.sh"))
            .arg(cmd)
            .env("SLOTPOOL_DEV_PORT", self.port.to_string())
            .env_remove("MONGODB_URI")
            .envs(self.launcher.iter().map(|(k, v)| (k, v)))
            // For the server alone, not the script and its helpers.
            .env(
                "SLOTPOOL_DEV_SERVER_ENV",
                server_env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dev-mongo.sh {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    pub fn start(_label: &str) -> PrivateServer {
        Self::start_with(&[])
    }

    /// Like `start`, with extra environment for the server (e.g. an LD_PRELOAD).
    pub fn start_with(env: &[(&str, &str)]) -> PrivateServer {
        Self::launch(&[], env)
    }

    /// A server started by scripts/dev-mongo.sh with `launcher` in its environment
    /// (SLOTPOOL_DEV_SERVER_ARGS="--auth", SLOTPOOL_DEV_REPORT_VERSION=5.0.0, ...)
    /// and `env` in the server's alone.
    pub fn launch(launcher: &[(&str, &str)], env: &[(&str, &str)]) -> PrivateServer {
        let mut server = PrivateServer {
            uri: String::new(),
            port: free_port(),
            launcher: launcher
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        server.uri = server.script("fresh", env);
        server
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where its front records what it saw (scripts/devdb/serve.py): shapes, read
    /// preferences, failpoint hits.
    pub fn records(&self) -> PathBuf {
        self.launcher
            .iter()
            .find(|(k, _)| k == "SLOTPOOL_DEV_SHAPES_DIR")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".state/shapes"))
    }

    /// Every command a `failCommand` failpoint failed so far: (command, appName,
    /// what it got: a code, `wce:CODE` or `closeConnection`).
    pub fn failpoint_hits(&self) -> Vec<(String, String, String)> {
        let file = self.records().join(format!("failpoints-{}.tsv", self.port));
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split('\t').map(str::to_string);
                Some((f.next()?, f.next()?, f.next()?))
            })
            .collect()
    }

    /// kill -9 the server process.
    pub fn kill9(&self) {
        let root = env!("CARGO_MANIFEST_DIR");
        let pid: i32 = std::fs::read_to_string(format!("{root}/.state/mongo-{}.pid", self.port))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: kill(2) on the server this test started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Starts it again on the same data.
    pub fn restart(&self) {
        self.script("start", &[]);
    }

    /// Starts it again on the same data, with extra environment (e.g. libfaketime,
    /// for a new primary whose clock differs).
    pub fn restart_with(&self, env: &[(&str, &str)]) {
        self.script("start", env);
    }

    /// Stops it, and starts it again on the same data with `launcher` instead (a
    /// server whose users were made without `--auth`, now with it).
    pub fn relaunch(&mut self, launcher: &[(&str, &str)]) -> String {
        self.script("stop", &[]);
        self.launcher = launcher
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.uri = self.script("start", &[]);
        self.uri.clone()
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.script("stop", &[]);
        let root = env!("CARGO_MANIFEST_DIR");
        let _ = std::fs::remove_dir_all(format!("{root}/.state/mongo-data-{}", self.port));
    }
}

/// Every robot steps on, and the invariant checker finds each of the `robots` ran
/// once throughout.
pub async fn runs_on_once(db: &TestDb, robots: usize) {
    let before = db.robots().await;
    wait_for(
        Duration::from_secs(20),
        "every robot to step on",
        || async {
            let now = db.robots().await;
            now.iter()
                .zip(&before)
                .all(|(a, b)| a.get_i64("seq").unwrap() > b.get_i64("seq").unwrap() + 1)
                .then_some(())
        },
    )
    .await;
    let report = invariants::check(db).await;
    assert_eq!(report.robots, robots);
    println!("{report:?}");
}

/// What must not change through an outage or an election: each slot's holder and
/// epoch, and each robot's generation.
#[derive(Debug, PartialEq)]
pub struct Held {
    pub slots: std::collections::BTreeMap<String, (Option<String>, i64)>,
    pub gens: std::collections::BTreeMap<String, i64>,
}

impl TestDb {
    /// Each slot's holder and epoch, and each robot's generation, now.
    pub async fn held(&self) -> Held {
        let slots = self
            .slots()
            .await
            .iter()
            .map(|s| {
                (
                    s.get_str("_id").unwrap().to_string(),
                    (owner(s), s.get_i64("epoch").unwrap_or(0)),
                )
            })
            .collect();
        let gens = self
            .robots()
            .await
            .iter()
            .map(|r| {
                (
                    r.get_str("name").unwrap().to_string(),
                    r.get_i64("gen").unwrap_or(0),
                )
            })
            .collect();
        Held { slots, gens }
    }
}
