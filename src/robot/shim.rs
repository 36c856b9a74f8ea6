//! The per-robot shim: a robot's process never outlives its holder's lease.
//!
//! The worker cannot enforce its own lease on an `exec` robot by itself: after a
//! kill -9 or an OOM kill of the worker, or while it is SIGSTOPped, nothing in the
//! worker runs, and the robot would go on beside the new holder's copy. So every
//! `exec` robot runs under a shim, `slotpool` itself started in a hidden mode
//! (`slotpool __robot-shim GRACE_MS COMMAND ARGS…`), in a process group of its own:
//!
//! - the worker writes the lease's deadline (an absolute `CLOCK_MONOTONIC` instant,
//!   so a message delayed in the pipe cannot stretch it) on the shim's stdin, first
//!   before the robot starts and again after every renewal: `D <nanoseconds>`;
//! - the deadline passes with no extension (the worker is stopped or stuck): the shim
//!   sends SIGTERM to the robot's process group, then SIGKILL after its grace. That
//!   grace is the worker's stop grace plus half the room left before the fence
//!   margin, so it is still below the margin: the deadline is the holder's
//!   self-fence instant, so the robot is gone before the lease can expire on the
//!   server and anyone else start it. (After a `T` from a live worker, the worker's
//!   own SIGKILL at the stop grace comes first; the shim's is the backstop.)
//! - the pipe closes (the worker died, however): SIGKILL to the group at once;
//! - the worker stops the robot the normal way with `T` (SIGTERM) and `K` (SIGKILL);
//! - the robot runs with `PR_SET_PDEATHSIG`, so if the shim itself is killed the
//!   robot dies too;
//! - the robot never holds `CAP_SYS_PTRACE`, so even as root it cannot read the
//!   non-dumpable worker's memory or environment (see [`crate::secrets`]).
//!
//! The shim exits as its robot did (same code, or the same signal), after killing
//! whatever is left in the robot's group. Plain PDEATHSIG on the robot alone would
//! not cover a SIGSTOPped worker; this does.
//!
//! A program embedding the worker as a library must call [`run_if_requested`] first
//! thing in `main`, so that its own binary can serve as the shim.

use std::io::{BufRead, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The hidden first argument that turns the binary into a shim.
pub const SHIM_ARG: &str = "__robot-shim";

/// How the shim's own error lines on stderr begin (before the robot ever ran).
pub const ERROR_PREFIX: &str = "slotpool robot shim: ";

/// The shim's exit code when it could not start the robot (as shells use 127).
pub const CANNOT_START: i32 = 127;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the same clock in every process of the
/// machine (and the one `std::time::Instant` reads on Linux).
pub fn monotonic_ns() -> u64 {
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
pub enum Control {
    /// The lease is good until this `CLOCK_MONOTONIC` instant (ns).
    Deadline(u64),
    /// Stop gracefully: SIGTERM to the robot's group.
    Term,
    /// SIGKILL to the robot's group.
    Kill,
}

impl Control {
    pub fn line(self) -> String {
        match self {
            Control::Deadline(ns) => format!("D {ns}\n"),
            Control::Term => "T\n".into(),
            Control::Kill => "K\n".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Control> {
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

/// What the shim does next, decided from the time and what it was told: the shim's
/// whole policy, as a pure function.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Enforcer {
    /// The lease deadline (ns), as last extended.
    pub deadline: u64,
    /// When SIGTERM was sent (by request or at the deadline), if it was.
    pub termed_at: Option<u64>,
    pub killed: bool,
    pub grace_ns: u64,
}

/// A signal for the robot's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Term,
    Kill,
}

impl Enforcer {
    pub fn new(deadline: u64, grace: Duration) -> Self {
        Enforcer {
            deadline,
            grace_ns: grace.as_nanos() as u64,
            ..Default::default()
        }
    }

    /// Applies a message (None: the pipe closed) and returns the signal to send.
    pub fn on_message(&mut self, msg: Option<Control>, now: u64) -> Option<Action> {
        match msg {
            Some(Control::Deadline(ns)) => {
                // The worker's latest word counts (a revocation moves it back),
                // but nothing revives a lease that already lapsed here.
                if self.termed_at.is_none() && now < self.deadline {
                    self.deadline = ns;
                }
                self.on_time(now)
            }
            Some(Control::Term) => self.term(now),
            Some(Control::Kill) | None => self.kill(),
        }
    }

    /// What the passing of time demands.
    pub fn on_time(&mut self, now: u64) -> Option<Action> {
        match self.termed_at {
            _ if self.killed => None,
            Some(t) if now >= t + self.grace_ns => self.kill(),
            None if now >= self.deadline => self.term(now),
            _ => None,
        }
    }

    /// How long until [`Enforcer::on_time`] may act.
    pub fn next_due(&self, now: u64) -> Duration {
        let due = match self.termed_at {
            _ if self.killed => u64::MAX,
            Some(t) => t + self.grace_ns,
            None => self.deadline,
        };
        Duration::from_nanos(due.saturating_sub(now))
    }

    fn term(&mut self, now: u64) -> Option<Action> {
        if self.termed_at.is_some() || self.killed {
            return None;
        }
        self.termed_at = Some(now);
        Some(Action::Term)
    }

    fn kill(&mut self) -> Option<Action> {
        if self.killed {
            return None;
        }
        self.killed = true;
        Some(Action::Kill)
    }
}

enum Event {
    Control(Option<Control>),
    Exited(std::io::Result<ExitStatus>),
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

/// If this process was started as a shim, runs it and never returns. Call first
/// thing in `main` of any binary that runs workers.
pub fn run_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(SHIM_ARG) {
        return;
    }
    let code = match run(&args[2..]) {
        Ok(status) => exit_like(status),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{ERROR_PREFIX}{e}");
            CANNOT_START
        }
    };
    std::process::exit(code);
}

fn run(args: &[String]) -> Result<ExitStatus, String> {
    let [grace_ms, command, rest @ ..] = args else {
        return Err(format!(
            "usage: slotpool {SHIM_ARG} GRACE_MS COMMAND [ARGS…]"
        ));
    };
    let grace = Duration::from_millis(grace_ms.parse().map_err(|_| "bad grace")?);
    let (tx, rx) = mpsc::channel();
    // The first deadline comes before the robot starts; no deadline, no robot.
    let mut stdin = std::io::stdin().lock();
    let mut first = String::new();
    let deadline = match stdin
        .read_line(&mut first)
        .ok()
        .and_then(|_| Control::parse(&first))
    {
        Some(Control::Deadline(ns)) if ns > monotonic_ns() => ns,
        _ => return Err("no live lease deadline before start; not starting".into()),
    };
    drop(stdin);
    let mut cmd = Command::new(command);
    cmd.args(rest).stdin(Stdio::null()).process_group(0);
    // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            give_up_ptrace();
            // Nothing but stdin, stdout, stderr and its context (descriptor 3, see
            // exec::CONTEXT_FILE) passes on to the robot.
            crate::secrets::close_on_exec_from(4);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start command {command:?}: {e}"))?;
    let group = child.id() as i32;
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
    std::thread::spawn(move || {
        let _ = tx.send(Event::Exited(child.wait()));
    });
    let signal = |action: Action| {
        let sig = match action {
            Action::Term => libc::SIGTERM,
            Action::Kill => libc::SIGKILL,
        };
        // SAFETY: kill(2) on the robot's own process group; no memory involved.
        unsafe {
            libc::kill(-group, sig);
        }
    };
    let mut enforcer = Enforcer::new(deadline, grace);
    loop {
        let wait = enforcer
            .next_due(monotonic_ns())
            .min(Duration::from_secs(1));
        let action = match rx.recv_timeout(wait) {
            Ok(Event::Exited(status)) => {
                // Whatever the robot left behind in its group goes with it.
                signal(Action::Kill);
                return status.map_err(|e| format!("lost the robot process: {e}"));
            }
            Ok(Event::Control(msg)) => enforcer.on_message(msg, monotonic_ns()),
            Err(mpsc::RecvTimeoutError::Timeout) => enforcer.on_time(monotonic_ns()),
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Action::Kill),
        };
        if let Some(a) = action {
            signal(a);
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
    fn control_lines_round_trip() {
        for c in [Control::Deadline(42), Control::Term, Control::Kill] {
            assert_eq!(Control::parse(&c.line()), Some(c));
        }
        assert_eq!(Control::parse("D x"), None);
        assert_eq!(Control::parse(""), None);
    }

    #[test]
    fn extensions_keep_it_alive_then_term_at_the_deadline_and_kill_after_grace() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_time(9 * S), None);
        assert_eq!(e.on_message(Some(Control::Deadline(12 * S)), 9 * S), None);
        assert_eq!(e.on_time(11 * S), None, "extended");
        assert_eq!(e.next_due(11 * S), Duration::from_secs(1));
        assert_eq!(e.on_time(12 * S), Some(Action::Term));
        assert_eq!(e.on_time(12 * S + S / 2), None);
        assert_eq!(e.on_time(13 * S), Some(Action::Kill));
        assert_eq!(e.on_time(20 * S), None, "killed once");
    }

    #[test]
    fn a_late_extension_does_not_revive_a_lapsed_lease() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Deadline(30 * S)), 10 * S),
            Some(Action::Term)
        );
        assert_eq!(e.on_time(11 * S), Some(Action::Kill));
    }

    #[test]
    fn a_revocation_moves_the_deadline_back() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(
            e.on_message(Some(Control::Deadline(5 * S)), 5 * S),
            Some(Action::Term)
        );
    }

    #[test]
    fn a_closed_pipe_kills_at_once() {
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_message(None, S), Some(Action::Kill));
        let mut e = Enforcer::new(10 * S, Duration::from_secs(1));
        assert_eq!(e.on_message(Some(Control::Term), S), Some(Action::Term));
        assert_eq!(e.on_message(Some(Control::Term), S), None);
        assert_eq!(e.on_message(Some(Control::Kill), S), Some(Action::Kill));
    }
}
