//! Resource limits of exec robots (`spec.limits`, `--exec-default-limits`) on real
//! worker processes: a robot over its memory limit is killed alone, a fork bomb
//! under a pids limit is contained, a busy loop under a cpu limit gets no more than
//! its share, and the rlimit fallback says what it cannot enforce. Each time a
//! neighbour counter keeps stepping, the worker's memory stays flat and nothing
//! self-fences; the invariant checker reads every counter's history at the end.
//!
//! The cgroup tests need what `--exec-limits-via auto` picks on this project's
//! machines: root, and a writable cgroup hierarchy. Where that is missing they fail
//! and say so; they never skip.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bson::Document;
use common::{invariants, script, wait_for, TestDb, WorkerProc, MEMORY_HOG};

/// Held by each test that looks at robot cgroups: every worker of this binary is a
/// child of the test process, so their robots' cgroups share one parent directory.
static CGROUPS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn applied(r: &Document) -> Document {
    r.get_document("applied_limits")
        .cloned()
        .unwrap_or_default()
}

/// The worker's resident memory, in bytes.
fn rss(w: &WorkerProc) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// The neighbour counter's seq.
async fn seq(db: &TestDb, name: &str) -> i64 {
    db.robot(name).await.get_i64("seq").unwrap()
}

/// Waits until the counter `name` stepped `n` more times.
async fn steps(db: &TestDb, name: &str, n: i64, what: &str) {
    let from = seq(db, name).await;
    wait_for(Duration::from_secs(60), what, || async {
        (seq(db, name).await >= from + n).then_some(())
    })
    .await;
}

/// The slot's epoch: a self-fence and reclaim would raise it.
async fn epoch(db: &TestDb) -> i64 {
    db.slot("slot-001").await.get_i64("epoch").unwrap()
}

/// The worker's cgroup directories of robot runs under the `controller` hierarchy.
fn robot_cgroups(w: &WorkerProc, controller: &str) -> Vec<PathBuf> {
    cgroups_below(&cgroup_dir(w.pid(), controller))
}

/// The directory of process `pid`'s cgroup in the `controller` hierarchy.
fn cgroup_dir(pid: i32, controller: &str) -> PathBuf {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = own
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, cs, path) = (p.next()?, p.next()?, p.next()?);
            cs.split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no {controller} cgroup hierarchy on this machine"));
    PathBuf::from(format!("/sys/fs/cgroup/{controller}")).join(path.trim_start_matches('/'))
}

/// The robot runs' cgroups in `dir`.
fn cgroups_below(dir: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("slotpool-robot."))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn read_u64(path: PathBuf) -> u64 {
    std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// How many times the script behind `log` ran.
fn starts(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Creates an exec robot running `command` with `spec` (JSON).
fn exec(db: &TestDb, name: &str, command: &str, spec: &str) {
    db.exec(name, command, &["--spec", spec]);
}

/// A robot that allocates 500 MB under `memory: 100MB` is killed by the kernel, and
/// the shim kills the rest of it: its status says `killed: memory limit`. The
/// neighbour counter keeps stepping, the worker's memory stays flat, nothing
/// self-fences, and the robot's cgroup is gone after each run.
#[tokio::test(flavor = "multi_thread")]
async fn a_robot_over_its_memory_limit_is_killed_alone() {
    let _alone = CGROUPS.lock().await;
    let db = TestDb::new("memlimit").await;
    db.init(1).await;
    let log = db.dir.join("hog");
    let hog = script(
        &db,
        "hog.sh",
        &format!("echo started >> '{}'\n{MEMORY_HOG}", log.display()),
    );
    // The shorthand of create: spec.limits.memory.
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "hog",
        "--kind",
        "exec",
        "--command",
        &hog,
        "--memory",
        "100MB",
    ]);
    db.counters("neighbour", 1, 100);
    let w = db.exec_worker(&[]);

    let limits = db.applied_limits("hog").await;
    assert_eq!(
        limits.get_str("mechanism").unwrap_or(""),
        "cgroup v1",
        "this machine (root, cgroup v1 writable) gives each robot a cgroup: {limits}"
    );
    assert_eq!(limits.get_i64("memory").ok(), Some(100_000_000), "{limits}");
    steps(&db, "neighbour", 5, "the neighbour to run").await;
    let (rss_before, epoch_before) = (rss(&w), epoch(&db).await);

    let said = wait_for(
        Duration::from_secs(60),
        "the hog killed at its limit",
        || async {
            let r = db.robot("hog").await;
            r.get_str("error")
                .unwrap_or("")
                .contains("killed: memory limit")
                .then_some(r)
        },
    )
    .await;
    assert_eq!(said.get_str("status").unwrap_or(""), "restarting", "{said}");
    // Its restart runs into the same limit: killed again, still alone.
    wait_for(
        Duration::from_secs(60),
        "a second start of the hog",
        || async { (starts(&log) >= 2).then_some(()) },
    )
    .await;
    wait_for(Duration::from_secs(60), "a second memory kill", || async {
        (w.metric("slotpool_robot_memory_kills_total")? >= 2).then_some(())
    })
    .await;
    steps(&db, "neighbour", 10, "the neighbour to keep stepping").await;
    let grown = rss(&w).saturating_sub(rss_before);
    assert!(
        grown < 30_000_000,
        "the worker's memory grew by {grown} bytes while its robot was killed at 100 MB"
    );
    assert_eq!(epoch(&db).await, epoch_before, "the slot was never lost");
    assert!(!w.log_text().contains("self-fenced"));
    assert!(w.metric("slotpool_robot_memory_kills_total").unwrap() >= 2);

    db.cli_ok(&["robot", "delete", "hog"]);
    wait_for(
        Duration::from_secs(30),
        "the hog's cgroup removed",
        || async { robot_cgroups(&w, "memory").is_empty().then_some(()) },
    )
    .await;
    let report = invariants::check(&db).await;
    assert_eq!(
        report.robots, 1,
        "the neighbour, checked by the invariant checker"
    );
}

/// A fork bomb under `pids: 64` (and `cpu: 0.5`, so it cannot starve its
/// neighbours of processor either) never has more than 64 processes; its shim
/// reports the limit hit; the neighbour steps, nothing self-fences; and deleting
/// the robot ends every process of the bomb and removes its cgroup.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_under_a_pids_limit_is_contained() {
    let _alone = CGROUPS.lock().await;
    let db = TestDb::new("forkbomb").await;
    db.init(1).await;
    let bomb = script(&db, "bomb.sh", "bomb() { bomb | bomb & }\nbomb\n# The first process stays (bash retries a refused fork, sleeping).\nwhile :; do wait; sleep 1; done\n");
    exec(
        &db,
        "bomb",
        &bomb,
        r#"{"limits": {"pids": 64, "cpu": 0.5}}"#,
    );
    db.counters("neighbour", 1, 100);
    let w = db.exec_worker(&[]);

    let limits = db.applied_limits("bomb").await;
    assert_eq!(
        limits.get_str("mechanism").unwrap_or(""),
        "cgroup v1",
        "{limits}"
    );
    assert_eq!(limits.get_i64("pids").ok(), Some(64), "{limits}");
    let epoch_before = epoch(&db).await;
    // It runs into its limit (the kernel counts the refused forks, and the shim
    // reports them), and never has more than 64 processes. (How many it has at one
    // sample depends on how its processes come and go, so only the bound is exact.)
    let mut highest = 0;
    let end = Instant::now() + Duration::from_secs(5);
    let mut hit = false;
    while !hit || Instant::now() < end {
        for dir in robot_cgroups(&w, "pids") {
            let now = read_u64(dir.join("pids.current"));
            assert!(now <= 64, "{now} processes in {}", dir.display());
            highest = highest.max(now);
        }
        hit = hit
            || w.metric("slotpool_robot_pids_limit_hits_total")
                .unwrap_or(0)
                >= 1;
        assert!(
            Instant::now() < end + Duration::from_secs(60),
            "no fork refused at the limit within a minute (at most {highest} processes)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(highest > 1, "the bomb forked");
    wait_for(
        Duration::from_secs(30),
        "the limit hit in the bomb's output",
        || async {
            db.cli_ok(&["robot", "logs", "bomb"])
                .contains("a fork failed at this robot's pids limit (64)")
                .then_some(())
        },
    )
    .await;
    steps(
        &db,
        "neighbour",
        10,
        "the neighbour to step beside the bomb",
    )
    .await;
    assert_eq!(epoch(&db).await, epoch_before, "the slot was never lost");
    assert!(!w.log_text().contains("self-fenced"));

    db.cli_ok(&["robot", "delete", "bomb"]);
    wait_for(
        Duration::from_secs(30),
        "every process of the bomb gone",
        || async { robot_cgroups(&w, "pids").is_empty().then_some(()) },
    )
    .await;
    let left = std::process::Command::new("pgrep")
        .args(["-f", &bomb])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1);
}

/// A busy loop under `cpu: 0.2` uses about a fifth of a core: far below half of
/// one whatever the machine's load (load can only lower what it gets).
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_loop_gets_no_more_than_its_cpu_limit() {
    let db = TestDb::new("cpulimit").await;
    db.init(1).await;
    let busy = script(&db, "busy.sh", "while :; do :; done\n");
    exec(&db, "busy", &busy, r#"{"limits": {"cpu": 0.2}}"#);
    let w = db.exec_worker(&[]);
    let limits = db.applied_limits("busy").await;
    assert_eq!(
        limits.get_str("mechanism").unwrap_or(""),
        "cgroup v1",
        "{limits}"
    );
    let pid = wait_for(
        Duration::from_secs(30),
        "the busy loop's process",
        || async {
            let out = std::process::Command::new("pgrep")
                .args(["-f", &busy])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .find(|p| {
                    // The robot itself, not its shim (whose arguments name it too).
                    std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|c| !c.contains("__robot-shim"))
                })
        },
    )
    .await;
    let ticks = |pid: i32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    // SAFETY: sysconf has no failure mode for this name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (t0, c0) = (Instant::now(), ticks(pid));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = (ticks(pid) - c0) as f64 / hz / t0.elapsed().as_secs_f64();
    assert!(
        used < 0.5,
        "the busy loop used {used:.2} cores under a limit of 0.2"
    );
    // `robot update --cpu` changes that one limit; the next run is bound by it.
    db.cli_ok(&["robot", "update", "busy", "--cpu", "0.3"]);
    wait_for(Duration::from_secs(30), "the new limit applied", || async {
        let r = db.robot("busy").await;
        (applied(&r).get_f64("cpu").ok()? == 0.3).then_some(())
    })
    .await;
    let spec = db.robot("busy").await.get_document("spec").unwrap().clone();
    assert_eq!(
        spec.get_document("limits").unwrap().get_f64("cpu").ok(),
        Some(0.3)
    );
    assert!(
        spec.get_str("command").is_ok(),
        "the rest of the spec kept: {spec}"
    );
    drop(w);
}

/// Where cgroups are not used (here forced with `--exec-limits-via rlimit`, as a
/// container without a writable cgroup tree falls back by itself): memory is
/// `RLIMIT_AS`, so the hog's allocation fails inside it and it exits alone; the
/// robot's document says what rlimits cannot enforce (cpu, and pids for root). The
/// worker's `--exec-default-limits` fills what a spec leaves out; a bad limit is
/// refused at create with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn rlimits_bound_memory_and_say_what_they_cannot_enforce() {
    let db = TestDb::new("rlimits").await;
    db.init(1).await;
    let log = db.dir.join("hog");
    let hog = script(
        &db,
        "hog.sh",
        &format!("echo started >> '{}'\n{MEMORY_HOG}", log.display()),
    );
    exec(&db, "hog", &hog, r#"{"limits": {"pids": 4096, "cpu": 1}}"#);
    let quiet = script(&db, "quiet.sh", "exec sleep 100000\n");
    exec(&db, "quiet", &quiet, "{}");
    db.counters("neighbour", 1, 100);
    let refused = db.cli(&[
        "robot",
        "create",
        "--name",
        "bad",
        "--kind",
        "exec",
        "--command",
        &quiet,
        "--spec",
        r#"{"limits": {"memory": "lots"}}"#,
    ]);
    assert!(!refused.status.success());
    let says = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        says.contains("spec.limits.memory \"lots\" is not a size"),
        "{says}"
    );

    let w = db.exec_worker(&[
        "--exec-limits-via",
        "rlimit",
        "--exec-default-limits",
        r#"{"memory": "100MB"}"#,
    ]);
    let hog_limits = db.applied_limits("hog").await;
    assert_eq!(
        hog_limits.get_str("mechanism").unwrap_or(""),
        "rlimit",
        "{hog_limits}"
    );
    assert_eq!(
        hog_limits.get_i64("memory").ok(),
        Some(100_000_000),
        "the worker's default"
    );
    assert_eq!(
        hog_limits.get_i64("pids").ok(),
        Some(4096),
        "the robot's own"
    );
    let unenforced = hog_limits.get_document("unenforced").unwrap();
    assert!(unenforced.contains_key("cpu"), "{hog_limits}");
    assert!(
        unenforced.contains_key("pids"),
        "root is exempt: {hog_limits}"
    );
    assert!(hog_limits
        .get_str("note")
        .unwrap_or("")
        .contains("--exec-limits-via rlimit"));
    // Its own shim reports on its own time: wait for it, as for the hog's.
    let quiet_limits = db.applied_limits("quiet").await;
    assert_eq!(
        quiet_limits.get_i64("memory").ok(),
        Some(100_000_000),
        "{quiet_limits}"
    );

    steps(&db, "neighbour", 5, "the neighbour to run").await;
    let (rss_before, epoch_before) = (rss(&w), epoch(&db).await);
    // The error is read from the same document that says "restarting": the next
    // start clears it, and that start may come before a second read.
    let error = wait_for(
        Duration::from_secs(60),
        "the hog's allocation refused, twice",
        || async {
            let r = db.robot("hog").await;
            (starts(&log) >= 2 && r.get_str("status").ok()? == "restarting")
                .then(|| r.get_str("error").unwrap_or("").to_string())
        },
    )
    .await;
    assert!(error.contains("exit status: 1"), "{error}");
    // Its allocation failed inside it.
    db.wait_output("hog", "memory exhausted").await;
    steps(&db, "neighbour", 10, "the neighbour to keep stepping").await;
    assert!(rss(&w).saturating_sub(rss_before) < 30_000_000);
    assert_eq!(epoch(&db).await, epoch_before);
    assert_eq!(
        db.robot("quiet").await.get_str("status").unwrap_or(""),
        "running"
    );
    let shown = db.cli_ok(&["robot", "show", "hog"]);
    assert!(
        shown.contains(r#""limits": "rlimit: memory 100.0 MB, pids 4096, cpu 1; cpu not enforced"#),
        "{shown}"
    );
    drop(w);
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1);
}

/// The pids a robot script wrote to `file`, one a line.
fn pids_in(file: &std::path::Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A robot in a cgroup, with a child that left its session (`setsid`): kill -9 of
/// its worker ends the whole tree and removes the cgroup (the shim saw its pipe
/// close); kill -9 of the shim itself leaves the escaped child running in the dead
/// shim's cgroup, and the next shim to start (the robot's restart) kills it and
/// removes that cgroup.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_worker_or_the_shim_leaves_no_process_and_no_cgroup() {
    let _alone = CGROUPS.lock().await;
    let db = TestDb::new("limitkill").await;
    db.init(1).await;
    let escapees = db.dir.join("escapees");
    let robot = script(
        &db,
        "escaper.sh",
        &format!(
            "setsid bash -c 'echo $$ >> \"{}\"; exec sleep 100000' &\nwhile :; do sleep 1; done\n",
            escapees.display()
        ),
    );
    exec(&db, "esc", &robot, r#"{"limits": {"pids": 100}}"#);
    db.counters("neighbour", 1, 100);

    // kill -9 of the worker.
    let mut first = db.exec_worker(&[]);
    let dir = cgroup_dir(first.pid(), "pids");
    db.applied_limits("esc").await;
    let escaped = wait_for(Duration::from_secs(30), "the first escapee", || async {
        pids_in(&escapees).first().copied()
    })
    .await;
    assert!(common::alive(escaped));
    assert_eq!(cgroups_below(&dir).len(), 1, "one robot run, one cgroup");
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(10));
    wait_for(
        Duration::from_secs(30),
        "the escapee gone with its worker",
        || async { (!common::alive(escaped) && cgroups_below(&dir).is_empty()).then_some(()) },
    )
    .await;

    // kill -9 of the shim: the next shim sweeps what it left.
    let second = db.exec_worker(&[]);
    let escaped = wait_for(
        Duration::from_secs(60),
        "the second run's escapee",
        || async { pids_in(&escapees).get(1).copied() },
    )
    .await;
    let dir = cgroup_dir(second.pid(), "pids");
    let shim_cgroup = cgroups_below(&dir);
    assert_eq!(shim_cgroup.len(), 1);
    let shim: i32 = shim_cgroup[0]
        .file_name()
        .and_then(|n| n.to_str()?.strip_prefix("slotpool-robot.")?.parse().ok())
        .expect("the cgroup is named after its shim");
    // SAFETY: kill(2) on the shim's pid, a process of this test's worker.
    unsafe {
        libc::kill(shim, libc::SIGKILL);
    }
    wait_for(
        Duration::from_secs(60),
        "the third run's escapee",
        || async { pids_in(&escapees).get(2).copied() },
    )
    .await;
    wait_for(
        Duration::from_secs(30),
        "the dead shim's escapee swept",
        || async { (!common::alive(escaped) && !shim_cgroup[0].exists()).then_some(()) },
    )
    .await;
    assert_eq!(
        cgroups_below(&dir).len(),
        1,
        "only the running shim's cgroup"
    );
    drop(second);
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1, "the neighbour, across the kill -9");
}

/// The shim run by hand as an unprivileged user, who may not create cgroups:
/// `--exec-limits-via cgroup` refuses to start the command and says why (exit 127,
/// as the worker reports a command that could not start); `auto` falls back to
/// rlimits and runs it.
#[test]
fn the_shim_refuses_cgroup_only_limits_where_it_cannot_make_a_cgroup() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    // A copy the unprivileged user can run: the checkout may sit in a directory
    // only root can enter (a fresh clone in `mktemp -d`).
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("slotpool-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("slotpool");
    std::fs::copy(env!("CARGO_BIN_EXE_slotpool"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shim = |via: &str| {
        let mut child = std::process::Command::new(&bin)
            .args([
                "__robot-shim",
                "100",
                "0",
                via,
                "memory=100000000",
                "-",
                "/bin/true",
            ])
            .uid(65534)
            .gid(65534)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let deadline = (ts.tv_sec as u64 + 30) * 1_000_000_000;
        // The pipe stays open until the shim exits: a closed one means "kill".
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "D {deadline}").unwrap();
        let status = child.wait().unwrap();
        drop(stdin);
        let mut said = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
        (status.code(), said)
    };
    let (code, said) = shim("cgroup");
    assert_eq!(code, Some(127), "{said}");
    assert!(
        said.contains("--exec-limits-via cgroup: cannot create cgroup"),
        "{said}"
    );
    let (code, said) = shim("auto");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "rlimits, and the command ran: {said}");
}

/// The shim is sent a lease deadline that has already passed (a busy host: the
/// worker read it just before a renewal): it does not refuse the run, it waits for
/// the next deadline and starts the command then. Stopped before a live deadline
/// came, it starts nothing and says so with its own exit code (125), which the
/// worker takes for a run that never started rather than one that failed.
#[test]
fn the_shim_waits_for_a_live_deadline_and_starts_nothing_without_one() {
    use std::io::Write;
    let monotonic_ns = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let dir = std::env::temp_dir().join(format!("slotpool-deadline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shim = |mark: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_slotpool"))
            .args([
                "__robot-shim",
                "100",
                "0",
                "rlimit",
                "-",
                "-",
                "/bin/sh",
                "-c",
            ])
            .arg(format!("echo ran > {}", mark.display()))
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let said = |child: &mut std::process::Child| {
        let mut said = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
        said
    };

    // A stale deadline, then a live one: the command runs.
    let ran = dir.join("ran");
    let mut child = shim(&ran);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "D {}", monotonic_ns() - 1).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !ran.exists(),
        "the command started on a deadline already past"
    );
    writeln!(stdin, "D {}", monotonic_ns() + 30_000_000_000).unwrap();
    let status = child.wait().unwrap();
    drop(stdin);
    assert_eq!(status.code(), Some(0), "{}", said(&mut child));
    assert!(ran.exists(), "the command never ran");

    // A stale deadline, then a stop (or the worker gone): nothing starts.
    for stop in ["K\n", ""] {
        let never = dir.join("never");
        let mut child = shim(&never);
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "D {}", monotonic_ns() - 1).unwrap();
        stdin.write_all(stop.as_bytes()).unwrap();
        drop(stdin);
        let status = child.wait().unwrap();
        let said = said(&mut child);
        assert_eq!(status.code(), Some(125), "{said}");
        assert!(said.contains("not started"), "{said}");
        assert!(!never.exists(), "the command ran without a live deadline");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
