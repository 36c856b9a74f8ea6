//! The per-robot shim: a robot's process never outlives its holder's lease.
//!
//! A killed or SIGSTOPped worker cannot stop its robots, so every `exec` robot runs
//! under `slotpool __robot-shim GRACE_MS COMMAND ARGS…`. The worker sends the shim its
//! self-fence deadline after every renewal; when that passes unextended, or the pipe
//! closes, the shim kills the robot's whole tree before the lease can expire on the
//! server. It also applies the robot's limits ([`super::limits`], [`super::cgroup`]).
//! See docs/internals.md, "The exec robot's shim". An embedding program must call
//! [`run_if_requested`] first thing in `main`, so its own binary can serve as the shim.

use std::io::{BufRead, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::cgroup::Enforcement;

/// The hidden first argument that turns the binary into a shim.
pub(crate) const SHIM_ARG: &str = "__robot-shim";

/// How the shim's own error lines on stderr begin (before the robot ever ran).
pub(crate) const ERROR_PREFIX: &str = "slotpool robot shim: ";

/// The shim's exit code when it could not start the robot (as shells use 127).
pub(crate) const CANNOT_START: i32 = 127;

/// The shim's exit code when the lease ended (a stop, or the worker gone) before it
/// had a live deadline: nothing of the robot started.
pub(crate) const NOT_STARTED: i32 = 125;

/// Why the shim did not run the robot.
#[derive(Debug)]
enum Refused {
    /// The lease ended before the robot could start.
    NotStarted(String),
    /// It cannot start (bad arguments, limits, the command).
    Cannot(String),
}

impl From<String> for Refused {
    fn from(e: String) -> Self {
        Refused::Cannot(e)
    }
}

impl From<&str> for Refused {
    fn from(e: &str) -> Self {
        Refused::Cannot(e.to_string())
    }
}

/// The descriptor on which the shim reports to the worker ([`Report`] lines).
pub(crate) const REPORT_FD: i32 = 4;

/// What the shim tells the worker, one JSON line each on [`REPORT_FD`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Report {
    /// The limits it applied, and how, before the command starts (None: none
    /// asked).
    Limits(Option<super::limits::Applied>),
    /// A fork of the robot failed at its pids limit (at most once a second).
    PidsLimitHit,
    /// The kernel killed a process of the robot at its memory limit; the shim
    /// killed the rest.
    MemoryKilled,
}

/// The shim's end of the report pipe; reports are best effort (a worker that is
/// gone reads none).
struct Reporter(Option<std::fs::File>);

impl Reporter {
    /// Takes descriptor 4 if the worker passed one, and keeps it from the robot.
    fn take() -> Reporter {
        use std::os::fd::FromRawFd;
        // SAFETY: fcntl on a descriptor number; we own fd 4 only if it is open,
        // which F_GETFD tells, and nothing else in the shim uses it.
        unsafe {
            if libc::fcntl(REPORT_FD, libc::F_GETFD) < 0 {
                return Reporter(None);
            }
            libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
            Reporter(Some(std::fs::File::from_raw_fd(REPORT_FD)))
        }
    }

    fn send(&mut self, report: &Report) {
        if let (Some(f), Ok(mut line)) = (self.0.as_mut(), serde_json::to_string(report)) {
            line.push('\n');
            if f.write_all(line.as_bytes()).is_err() {
                self.0 = None;
            }
        }
    }
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the same clock in every process of the
/// machine (and the one `std::time::Instant` reads on Linux).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A control message from the worker, one per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// The lease is good until this `CLOCK_MONOTONIC` instant (ns).
    Deadline(u64),
    /// Stop gracefully: SIGTERM to the robot's group.
    Term,
    /// SIGKILL to the robot's group.
    Kill,
}

impl Control {
    pub(crate) fn line(self) -> String {
        match self {
            Control::Deadline(ns) => format!("D {ns}\n"),
            Control::Term => "T\n".into(),
            Control::Kill => "K\n".into(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Control> {
        let line = line.trim();
        match line {
            "T" => Some(Control::Term),
            "K" => Some(Control::Kill),
            _ => line
                .strip_prefix("D ")
                .and_then(|ns| ns.parse().ok())
                .map(Control::Deadline),
        }
    }
}

/// The longest a deadline may have passed, when it is first noticed, for the robot
/// still to get its stop grace: at most half the grace, and never more than 50 ms.
///
/// A deadline noticed later than that means the shim was frozen or starved, and a
/// standby may already run the robot, so the stop is a SIGKILL at once. 50 ms is far
/// above a busy machine's timer lateness and far below a lease.
pub(crate) fn late_slack(grace: Duration) -> Duration {
    (grace / 2).min(Duration::from_millis(50))
}

/// What the shim does next, decided from the time and what it was told: the shim's
/// whole policy, as a pure function.
///
/// - The deadline passes and the shim notices it in time: SIGTERM, and SIGKILL
///   `grace` after the *deadline* (or after an earlier stop request), however late
///   the SIGTERM went out.
/// - The shim notices the deadline only [`late_slack`] or more after it (it was
///   frozen with its robot and has just been thawed): SIGKILL at once, with no
///   SIGTERM first, whatever it is told next.
///
/// With a suspension (`suspend_ns` > 0, `--suspend-for`), the deadline freezes the
/// robot's tree instead, noticed late or not; a new deadline from the worker (a late
/// renewal proved the epoch) thaws it; the pipe closing, a stop, or `suspend_ns`
/// passing kills it frozen, never thawed. A stop asked for before the deadline keeps
/// its grace as without suspension.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Enforcer {
    /// The lease deadline (ns), as last extended.
    pub(crate) deadline: u64,
    /// When SIGTERM was sent (by request or at the deadline), if it was.
    pub(crate) termed_at: Option<u64>,
    pub(crate) killed: bool,
    pub(crate) grace_ns: u64,
    /// How long past the deadline a frozen robot may wait to be thawed (0: no
    /// suspension, the deadline stops it).
    pub(crate) suspend_ns: u64,
    /// The tree is frozen (suspended).
    pub(crate) frozen: bool,
}

/// A signal for the robot's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupSignal {
    Term,
    Kill,
    /// Freeze the whole tree (suspended).
    Freeze,
    /// Thaw it (resumed in place).
    Thaw,
}

impl Enforcer {
    pub(crate) fn new(deadline: u64, grace: Duration) -> Self {
        Enforcer {
            deadline,
            grace_ns: grace.as_nanos() as u64,
            ..Default::default()
        }
    }

    /// The same, freezing at the deadline for up to `suspend_for` (see the type).
    pub(crate) fn suspending(deadline: u64, grace: Duration, suspend_for: Duration) -> Self {
        Enforcer {
            suspend_ns: suspend_for.as_nanos() as u64,
            ..Enforcer::new(deadline, grace)
        }
    }

    /// Applies a message (None: the pipe closed) and returns the signal to send.
    pub(crate) fn on_message(&mut self, msg: Option<Control>, now: u64) -> Option<GroupSignal> {
        // Time first: a message read after a thaw must not buy a deadline long
        // past the SIGTERM-and-grace of a timely stop.
        match msg {
            Some(Control::Deadline(ns)) if self.frozen => {
                // Resumed: a late renewal proved the epoch. Only a live deadline
                // thaws, and only before the suspension ran out.
                if let Some(kill) = self.on_time(now) {
                    return Some(kill);
                }
                if ns > now && !self.killed {
                    self.deadline = ns;
                    self.frozen = false;
                    return Some(GroupSignal::Thaw);
                }
                None
            }
            Some(Control::Deadline(ns)) => {
                // The worker's latest word counts (a revocation moves it back),
                // but nothing revives a lease that already lapsed here; with a
                // suspension, a live deadline arriving just after the old one
                // passed (not yet frozen) is the renewal that keeps it going.
                let live = now < self.deadline || (self.suspend_ns > 0 && ns > now);
                if self.termed_at.is_none() && live {
                    self.deadline = ns;
                }
                self.on_time(now)
            }
            // A frozen robot asked to stop is killed, never thawed.
            Some(Control::Term) if self.frozen => self.kill(),
            Some(Control::Term) => self.on_time(now).or_else(|| self.term(now)),
            Some(Control::Kill) | None => self.kill(),
        }
    }

    /// What the passing of time demands.
    pub(crate) fn on_time(&mut self, now: u64) -> Option<GroupSignal> {
        if self.killed {
            return None;
        }
        if self.frozen {
            if now >= self.deadline.saturating_add(self.suspend_ns) {
                return self.kill();
            }
            return None;
        }
        if self.suspend_ns > 0 && self.termed_at.is_none() && now >= self.deadline {
            self.frozen = true;
            return Some(GroupSignal::Freeze);
        }
        if now >= self.kill_due() {
            return self.kill();
        }
        if self.termed_at.is_none() && now >= self.deadline {
            if now - self.deadline >= self.late_ns() {
                return self.kill();
            }
            return self.term(now);
        }
        None
    }

    /// How long until [`Enforcer::on_time`] may act.
    pub(crate) fn next_due(&self, now: u64) -> Duration {
        let due = match self.termed_at {
            _ if self.killed => u64::MAX,
            _ if self.frozen => self.deadline.saturating_add(self.suspend_ns),
            Some(_) => self.kill_due(),
            None => self.deadline,
        };
        Duration::from_nanos(due.saturating_sub(now))
    }

    /// When SIGKILL is due: the grace after the stop request or the deadline,
    /// whichever came first; never, before either.
    fn kill_due(&self) -> u64 {
        match self.termed_at {
            Some(t) => t.min(self.deadline).saturating_add(self.grace_ns),
            None => self.deadline.saturating_add(self.grace_ns),
        }
    }

    fn late_ns(&self) -> u64 {
        late_slack(Duration::from_nanos(self.grace_ns)).as_nanos() as u64
    }

    fn term(&mut self, now: u64) -> Option<GroupSignal> {
        if self.termed_at.is_some() || self.killed {
            return None;
        }
        self.termed_at = Some(now);
        Some(GroupSignal::Term)
    }

    fn kill(&mut self) -> Option<GroupSignal> {
        if self.killed {
            return None;
        }
        self.killed = true;
        Some(GroupSignal::Kill)
    }
}

enum Event {
    Control(Option<Control>),
    /// The robot's own process ended (its wait status, as `waitpid` gives it).
    Exited(ExitStatus),
}

/// What contains a robot's processes, as stored in its document.
pub(crate) const CONTAINMENT: &str = "subreaper";

/// The processes below `root` in `/proc` (children, grandchildren, …), leaving
/// out zombies (already dead, waiting to be reaped). Re-read on every call: the
/// tree changes under us.
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((state, ppid)) = parse_stat(&stat) {
            if state != 'Z' && state != 'X' {
                parent_of.push((pid, ppid));
            }
        }
    }
    tree_below(root, &parent_of)
}

/// The state and parent pid from a `/proc/PID/stat` line. The command name (field
/// 2) is in parentheses and may itself hold spaces and parentheses, so the fields
/// are read after its *last* `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Every pid whose chain of parents in `parent_of` leads to `root`.
pub(crate) fn tree_below(root: i32, parent_of: &[(i32, i32)]) -> Vec<i32> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in parent_of {
            if parent == p && child != root && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// Sends `sig` to the robot's group and to every process below the shim.
fn signal_tree(group: i32, sig: i32) {
    // SAFETY: kill(2) on pids and a group of our own tree; no memory involved.
    unsafe {
        libc::kill(-group, sig);
    }
    for pid in descendants(std::process::id() as i32) {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// SIGKILLs the shim's whole tree, round after round, until nothing is left below
/// it (the reaper thread collects the dead). A process forked during a round is
/// caught in the next: its parent died, so it now hangs below the shim.
fn kill_tree(group: i32) {
    let me = std::process::id() as i32;
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        signal_tree(group, libc::SIGKILL);
        if descendants(me).is_empty() || std::time::Instant::now() > give_up {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGSTOPs the shim's whole tree, round after round, until every process below it
/// is stopped: one forked during a round is caught in the next. Bounded, as a
/// process in uninterruptible sleep stops only when it wakes.
fn stop_tree(group: i32) {
    let me = std::process::id() as i32;
    let give_up = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        signal_tree(group, libc::SIGSTOP);
        let running = descendants(me).into_iter().any(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
                .is_some_and(|(state, _)| state != 'T' && state != 't')
        });
        if !running || std::time::Instant::now() > give_up {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reaps every child of the shim (the robot and any orphan re-parented to it) and
/// reports the robot's own end.
fn reap(robot: i32, tx: mpsc::Sender<Event>) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status into our local.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == robot {
            if tx
                .send(Event::Exited(ExitStatus::from_raw(status)))
                .is_err()
            {
                return;
            }
        } else if pid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // No child at all for now: look again shortly (an orphan may be
            // re-parented to us at any time while the robot's tree lives).
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `CAP_SYS_PTRACE` (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// Makes sure the robot about to be exec'd cannot hold `CAP_SYS_PTRACE`, even when
/// it runs as root: without it, the worker (which makes itself non-dumpable, see
/// [`crate::secrets::hide_from_other_processes`]) keeps its memory, environment and
/// file descriptors to itself. Drops the capability from the bounding, ambient and
/// inheritable sets, from which exec computes the new program's. Best effort: an
/// unprivileged robot never had it, and failures change nothing.
///
/// Runs between fork and exec: raw syscalls only, no allocation.
fn give_up_ptrace() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: prctl and capget/capset with properly sized, initialised structs.
    unsafe {
        libc::prctl(
            libc::PR_CAPBSET_DROP,
            CAP_SYS_PTRACE as libc::c_ulong,
            0,
            0,
            0,
        );
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
            CAP_SYS_PTRACE as libc::c_ulong,
            0,
            0,
        );
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) == 0 {
            data[0].inheritable &= !(1 << CAP_SYS_PTRACE);
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr());
        }
    }
}

/// The first live deadline: none, no robot. A deadline that passed on its way here
/// (a busy host: the worker sent it just before a renewal) is followed by the next
/// renewal's, so it is waited for. A stop, or the worker gone, first: the robot
/// never starts, and the worker is told so by [`NOT_STARTED`].
fn first_live_deadline(control: &mut impl std::io::BufRead) -> Result<u64, Refused> {
    loop {
        let mut line = String::new();
        match control.read_line(&mut line) {
            Ok(0) | Err(_) => {
                return Err(Refused::NotStarted(
                    "the worker went away before the lease gave a live deadline; not started"
                        .into(),
                ))
            }
            Ok(_) => match Control::parse(&line) {
                Some(Control::Deadline(ns)) if ns > monotonic_ns() => return Ok(ns),
                Some(Control::Deadline(_)) => {}
                Some(Control::Term | Control::Kill) | None => {
                    return Err(Refused::NotStarted(
                        "stopped before the lease gave a live deadline; not started".into(),
                    ))
                }
            },
        }
    }
}

/// If this process was started as a shim, runs it and never returns. Call first
/// thing in `main` of any binary that runs workers.
pub fn run_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(SHIM_ARG) {
        return;
    }
    let code = match run(&args[2..]) {
        Ok(status) => exit_like(status),
        Err(Refused::NotStarted(e)) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{e}");
            NOT_STARTED
        }
        Err(Refused::Cannot(e)) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{e}");
            CANNOT_START
        }
    };
    std::process::exit(code);
}

/// The shim's command line: `GRACE_MS SUSPEND_MS VIA LIMITS USER COMMAND [ARGS…]`.
struct ShimArgs<'a> {
    grace: Duration,
    suspend_for: Duration,
    via: super::limits::Via,
    limits: super::limits::Limits,
    run_as: Option<super::run_as::RunAs>,
    command: &'a str,
    rest: &'a [String],
}

impl<'a> ShimArgs<'a> {
    fn parse(args: &'a [String]) -> Result<ShimArgs<'a>, Refused> {
        let [grace_ms, suspend_ms, via, limits, user, command, rest @ ..] = args else {
            return Err(Refused::Cannot(format!(
                "usage: slotpool {SHIM_ARG} GRACE_MS SUSPEND_MS auto|cgroup|rlimit LIMITS UID:GID|- COMMAND [ARGS…]"
            )));
        };
        Ok(ShimArgs {
            run_as: super::run_as::RunAs::from_arg(user)?,
            grace: Duration::from_millis(grace_ms.parse().map_err(|_| "bad grace")?),
            suspend_for: Duration::from_millis(suspend_ms.parse().map_err(|_| "bad suspension")?),
            via: super::limits::Via::parse(via).ok_or("bad limits mechanism")?,
            limits: super::limits::Limits::from_arg(limits)?,
            command,
            rest,
        })
    }
}

fn run(args: &[String]) -> Result<ExitStatus, Refused> {
    let args = ShimArgs::parse(args)?;
    // Non-dumpable: /proc/<shim>/fd (its report pipe among them) and its memory are
    // closed to the robot, which runs as the same user. Without this, in a
    // container, where shim and robot share user and capabilities, the robot could
    // open the report pipe through /proc and speak for its shim. (The robot's own
    // exec makes it dumpable again; nothing of the shim passes on.)
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let mut reporter = Reporter::take();
    let (tx, rx) = mpsc::channel();
    let deadline = first_live_deadline(&mut std::io::stdin().lock())?;
    // Orphans of the robot's tree come to us, not to init (see the module docs).
    // SAFETY: prctl on this process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    let mut enforcement = Enforcement::prepare(args.via, &args.limits)?;
    reporter.send(&Report::Limits(enforcement.applied().cloned()));
    let group = spawn_robot(&args, &enforcement)?;
    listen(group, tx);
    let mut enforcer = Enforcer::suspending(deadline, args.grace, args.suspend_for);
    let mut tree = Tree {
        group,
        cgroup: match &mut enforcement {
            Enforcement::Cgroup(cg, _) => Some(cg),
            _ => None,
        },
        frozen_by_cgroup: false,
        memory_killed: false,
        pids_reported: None,
    };
    loop {
        let wait = enforcer.next_due(monotonic_ns()).min(tree.look());
        let event = rx.recv_timeout(wait);
        tree.check_limits(&mut reporter);
        let action = match event {
            Ok(Event::Exited(status)) => {
                // Whatever the robot left behind, in its group or not, goes with it.
                kill_tree(group);
                return Ok(status);
            }
            Ok(Event::Control(msg)) => enforcer.on_message(msg, monotonic_ns()),
            Err(mpsc::RecvTimeoutError::Timeout) => enforcer.on_time(monotonic_ns()),
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(GroupSignal::Kill),
        };
        if let Some(signal) = action {
            tree.signal(signal);
        }
    }
}

/// Starts the robot's command in a process group of its own, under the limits
/// `enforcement` made ready and as the user asked; returns the group.
fn spawn_robot(args: &ShimArgs, enforcement: &Enforcement) -> Result<i32, Refused> {
    let (join, rlimits) = match enforcement {
        Enforcement::None => (Vec::new(), Vec::new()),
        Enforcement::Cgroup(cg, _) => (cg.join_fds(), Vec::new()),
        Enforcement::Rlimit(r, _) => (Vec::new(), r.clone()),
    };
    let run_as = args.run_as;
    let mut cmd = Command::new(args.command);
    cmd.args(args.rest).stdin(Stdio::null()).process_group(0);
    let shim_pid = std::process::id() as libc::pid_t;
    // SAFETY: prctl, write, setrlimit and the set*id calls run in the child between
    // fork and exec, on descriptors and data the shim owns. glibc's set*id wrappers
    // are not async-signal-safe in general (they signal every thread); the shim has
    // no other thread yet when it forks (its threads start after the spawn).
    unsafe {
        cmd.pre_exec(move || {
            // Limits first: nothing the command does is outside them.
            super::cgroup::apply_in_child(&join, &rlimits)?;
            give_up_ptrace();
            // Then another user, if asked: out of reach of the shim and the worker.
            if let Some(user) = run_as {
                user.apply_in_child()?;
            }
            // After the switch, which clears it; and if the shim died before it was
            // set, the robot must not start as an orphan.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != shim_pid {
                return Err(std::io::Error::other(
                    "the shim died before the robot started",
                ));
            }
            // Nothing but stdin, stdout, stderr and its context (descriptor 3, see
            // exec::CONTEXT_FILE) passes on to the robot.
            crate::secrets::close_on_exec_from(4);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start command {:?}: {e}", args.command))?;
    let group = child.id() as i32;
    // The reaper (see `listen`) waits for every child, so the std handle must never
    // wait.
    std::mem::forget(child);
    Ok(group)
}

/// Starts the shim's two threads, after the robot (it forks with none): one reads
/// the worker's control lines, one reaps every child and tells when `group`'s
/// leader exited.
fn listen(group: i32, tx: mpsc::Sender<Event>) {
    let control = tx.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Some(c) = Control::parse(&line) {
                if control.send(Event::Control(Some(c))).is_err() {
                    return;
                }
            }
        }
        let _ = control.send(Event::Control(None));
    });
    std::thread::spawn(move || reap(group, tx));
}

/// The robot's process tree as the shim's loop acts on it.
struct Tree<'a> {
    group: i32,
    /// The run's cgroup, when limits are enforced by one.
    cgroup: Option<&'a mut super::cgroup::RobotCgroup>,
    /// Frozen by the cgroup (true) or by signals (false), while suspended.
    frozen_by_cgroup: bool,
    memory_killed: bool,
    pids_reported: Option<std::time::Instant>,
}

impl Tree<'_> {
    /// How often the loop looks at the tree: a cgroup's counters are read this often
    /// (a small file each), so an OOM kill of one of the robot's processes ends the
    /// rest of it promptly.
    fn look(&self) -> Duration {
        if self.cgroup.is_some() {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        }
    }

    /// An OOM kill of one process kills the whole tree (said once); a pids limit hit
    /// is said at most once a second.
    fn check_limits(&mut self, reporter: &mut Reporter) {
        let Some(cg) = self.cgroup.as_deref_mut() else {
            return;
        };
        if cg.has_memory() && !self.memory_killed && cg.oom_killed() {
            self.memory_killed = true;
            reporter.send(&Report::MemoryKilled);
            kill_tree(self.group);
        }
        if cg.pids_limit_hit()
            && self
                .pids_reported
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.pids_reported = Some(std::time::Instant::now());
            reporter.send(&Report::PidsLimitHit);
        }
    }

    /// Carries out what the enforcer decided.
    fn signal(&mut self, signal: GroupSignal) {
        let group = self.group;
        match signal {
            GroupSignal::Term => signal_tree(group, libc::SIGTERM),
            GroupSignal::Kill => {
                kill_tree(group);
                if self.frozen_by_cgroup {
                    // Killed while frozen: SIGKILL reaches frozen tasks, but thaw
                    // so that the reaper sees them go at once.
                    if let Some(cg) = self.cgroup.as_deref() {
                        cg.freeze(false);
                    }
                    self.frozen_by_cgroup = false;
                }
            }
            GroupSignal::Freeze => {
                self.frozen_by_cgroup = self.cgroup.as_deref().is_some_and(|cg| cg.freeze(true));
                if !self.frozen_by_cgroup {
                    stop_tree(group);
                }
            }
            GroupSignal::Thaw => {
                if self.frozen_by_cgroup {
                    if let Some(cg) = self.cgroup.as_deref() {
                        cg.freeze(false);
                    }
                    self.frozen_by_cgroup = false;
                } else {
                    signal_tree(group, libc::SIGCONT);
                }
            }
        }
    }
}

/// The shim's exit code for the robot's status; a robot killed by a signal makes
/// the shim die of the same signal, so the worker reports it as such.
fn exit_like(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    let sig = status.signal().unwrap_or(libc::SIGKILL);
    // SAFETY: restore the default action and raise the signal on ourselves.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    128 + sig
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis() {
        assert_eq!(parse_stat("42 (bash) S 7 42 42 0"), Some(('S', 7)));
        assert_eq!(
            parse_stat("43 (a) b) (c) Z 1 43 43 0"),
            Some(('Z', 1)),
            "a command name with spaces and parentheses"
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_tree_below_a_pid_follows_parents_through_every_generation() {
        // 10 → 11 → 12 → 13, 10 → 14; 20 → 21 is someone else's.
        let parents = [(11, 10), (12, 11), (13, 12), (14, 10), (21, 20), (10, 1)];
        let mut below = tree_below(10, &parents);
        below.sort();
        assert_eq!(below, vec![11, 12, 13, 14]);
        assert!(tree_below(13, &parents).is_empty());
    }

    #[test]
    fn control_lines_round_trip() {
        for c in [Control::Deadline(42), Control::Term, Control::Kill] {
            assert_eq!(Control::parse(&c.line()), Some(c));
        }
        assert_eq!(Control::parse("D x"), None);
        assert_eq!(Control::parse(""), None);
    }

    #[test]
    fn a_deadline_past_on_its_way_is_waited_out_and_a_stop_first_starts_nothing() {
        let live = monotonic_ns() + 10_000_000_000;
        let mut control = std::io::Cursor::new(format!("D 1\nD {live}\n"));
        assert_eq!(first_live_deadline(&mut control).unwrap(), live);
        for then in ["K\n", "T\n", "", "garbage\n"] {
            let mut control = std::io::Cursor::new(format!("D 1\n{then}"));
            assert!(matches!(
                first_live_deadline(&mut control),
                Err(Refused::NotStarted(_))
            ));
        }
    }

    #[test]
    fn extensions_keep_it_alive_then_term_at_the_deadline_and_kill_after_grace() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_time(9 * S), None);
        assert_eq!(e.on_message(Some(Control::Deadline(12 * S)), 9 * S), None);
        assert_eq!(e.on_time(11 * S), None, "extended");
        assert_eq!(e.next_due(11 * S), Duration::from_secs(1));
        assert_eq!(e.on_time(12 * S), Some(GroupSignal::Term));
        assert_eq!(e.on_time(12 * S + S / 2), None);
        assert_eq!(e.on_time(13 * S), Some(GroupSignal::Kill));
        assert_eq!(e.on_time(20 * S), None, "killed once");
    }

    #[test]
    fn a_late_extension_does_not_revive_a_lapsed_lease() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Deadline(30 * S)), 10 * S),
            Some(GroupSignal::Term)
        );
        assert_eq!(e.on_time(11 * S), Some(GroupSignal::Kill));
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_deadline_noticed_long_after_it_passed_is_a_kill_at_once() {
        // Frozen with its robot, thawed 3 s past the deadline: no SIGTERM, no grace.
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_time(13 * S), Some(GroupSignal::Kill));
        assert_eq!(e.on_time(14 * S), None, "killed once");
        // Whatever the thawed worker says first changes nothing of that.
        for msg in [Some(Control::Term), Some(Control::Deadline(20 * S)), None] {
            let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
            assert_eq!(
                e.on_message(msg, 13 * S),
                Some(GroupSignal::Kill),
                "{msg:?}"
            );
        }
        // The slack: 50 ms at most, half the grace at short graces.
        assert_eq!(
            late_slack(Duration::from_secs(1)),
            Duration::from_millis(50)
        );
        assert_eq!(
            late_slack(Duration::from_millis(30)),
            Duration::from_millis(15)
        );
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_time(10 * S + 49 * MS),
            Some(GroupSignal::Term),
            "in time"
        );
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_time(10 * S + 50 * MS), Some(GroupSignal::Kill), "late");
    }

    #[test]
    fn the_grace_runs_from_the_deadline_not_from_a_late_sigterm() {
        let mut e = Enforcer::new(10 * S, Duration::from_millis(100));
        assert_eq!(e.on_time(10 * S + 40 * MS), Some(GroupSignal::Term));
        assert_eq!(e.next_due(10 * S + 40 * MS), Duration::from_millis(60));
        assert_eq!(e.on_time(10 * S + 99 * MS), None);
        assert_eq!(e.on_time(10 * S + 100 * MS), Some(GroupSignal::Kill));
        // A stop asked for before the deadline keeps its whole grace.
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Term), 9 * S),
            Some(GroupSignal::Term)
        );
        assert_eq!(e.on_time(9 * S + 999 * MS), None);
        assert_eq!(e.on_time(10 * S), Some(GroupSignal::Kill));
        // ...and a thaw past it kills at once.
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Term), 9 * S),
            Some(GroupSignal::Term)
        );
        assert_eq!(e.on_time(30 * S), Some(GroupSignal::Kill));
    }

    #[test]
    fn a_revocation_moves_the_deadline_back() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Deadline(5 * S)), 5 * S),
            Some(GroupSignal::Term)
        );
    }

    #[test]
    fn a_suspension_freezes_at_the_deadline_and_a_late_renewal_thaws() {
        let grace = Duration::from_millis(300);
        let mut e = Enforcer::suspending(10 * S, grace, Duration::from_secs(60));
        assert_eq!(e.on_time(9 * S), None);
        assert_eq!(e.on_time(10 * S), Some(GroupSignal::Freeze));
        assert_eq!(e.next_due(10 * S), Duration::from_secs(60));
        // Frozen: time alone does nothing until the suspension runs out.
        assert_eq!(e.on_time(30 * S), None);
        // A deadline already past (a revocation's) thaws nothing.
        assert_eq!(e.on_message(Some(Control::Deadline(20 * S)), 30 * S), None);
        assert_eq!(
            e.on_message(Some(Control::Deadline(32 * S)), 30 * S),
            Some(GroupSignal::Thaw)
        );
        assert!(!e.frozen);
        // And the next deadline freezes again.
        assert_eq!(e.on_time(32 * S), Some(GroupSignal::Freeze));
    }

    #[test]
    fn a_suspended_robot_is_killed_frozen_when_it_runs_out_or_is_stopped() {
        let grace = Duration::from_millis(300);
        let suspended = || {
            let mut e = Enforcer::suspending(10 * S, grace, Duration::from_secs(60));
            assert_eq!(e.on_time(10 * S), Some(GroupSignal::Freeze));
            e
        };
        let mut e = suspended();
        assert_eq!(e.on_time(70 * S), Some(GroupSignal::Kill));
        assert_eq!(
            e.on_message(Some(Control::Deadline(80 * S)), 71 * S),
            None,
            "killed for good"
        );
        let mut e = suspended();
        assert_eq!(
            e.on_message(Some(Control::Deadline(75 * S)), 70 * S),
            Some(GroupSignal::Kill),
            "too late to thaw"
        );
        let mut e = suspended();
        assert_eq!(
            e.on_message(Some(Control::Term), 20 * S),
            Some(GroupSignal::Kill)
        );
        let mut e = suspended();
        assert_eq!(e.on_message(None, 20 * S), Some(GroupSignal::Kill));
    }

    #[test]
    fn a_stop_asked_before_the_deadline_keeps_its_grace_under_a_suspension() {
        let grace = Duration::from_millis(300);
        let mut e = Enforcer::suspending(10 * S, grace, Duration::from_secs(60));
        assert_eq!(
            e.on_message(Some(Control::Term), 9 * S),
            Some(GroupSignal::Term)
        );
        assert_eq!(e.on_time(9 * S + 200_000_000), None);
        // The grace runs from the stop, not from the deadline: killed, not frozen.
        assert_eq!(e.on_time(9 * S + 300_000_000), Some(GroupSignal::Kill));
    }

    #[test]
    fn without_a_suspension_the_deadline_stops_as_before() {
        let mut e = Enforcer::suspending(10 * S, Duration::from_secs(1), Duration::ZERO);
        assert_eq!(e.on_time(10 * S), Some(GroupSignal::Term));
    }

    #[test]
    fn a_closed_pipe_kills_at_once() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_message(None, S), Some(GroupSignal::Kill));
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Term), S),
            Some(GroupSignal::Term)
        );
        assert_eq!(e.on_message(Some(Control::Term), S), None);
        assert_eq!(
            e.on_message(Some(Control::Kill), S),
            Some(GroupSignal::Kill)
        );
    }
}
