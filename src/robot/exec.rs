//! `exec`: an external command as a robot.
//!
//! The command gets its context as JSON in `SLOTPOOL_CONTEXT` (with `SLOTPOOL_ROBOT`,
//! `SLOTPOOL_EPOCH` and, on a schedule, `SLOTPOOL_FIRING`); a stdout line
//! `{"checkpoint": {...}}` persists a new context, other output is logged. It runs under
//! a [`shim`](super::shim), so it never outlives the lease, with an environment built
//! from scratch ([`policy::INHERITED`]) as the worker's [`ExecPolicy`] allows: never the
//! database's credentials. Stops are SIGTERM to its whole tree, then SIGKILL after the
//! grace. Spec: `{"command": "/path/or/name", "args": ["..."], "env": {"K": "V"}, "history": 0}`.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::{Bson, Document};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use super::limits::{self, Limits};
use super::line::{parse_line, Line};
use super::output::{self, Admit, BoundedLines, LogBudget};
use super::shim::{self, Control};
use super::{RobotError, RobotKind, RobotRun};

use super::policy;
pub use super::policy::ExecPolicy;

#[derive(Debug, Clone)]
pub(crate) struct Exec {
    policy: ExecPolicy,
    /// The program started as each robot's shim: this very binary, which must call
    /// [`shim::run_if_requested`] first thing in `main`.
    shim: std::path::PathBuf,
    /// What containment this worker last recorded for each robot instance.
    recorded: Recorded,
}

/// The containment report each robot instance (id, generation) last had recorded:
/// a scheduled robot's runs all report the same, so it is written once per
/// instance, not once per firing.
#[derive(Debug, Clone, Default)]
struct Recorded(Arc<std::sync::Mutex<HashMap<ObjectId, Instance>>>);

/// An instance's generation, and the applied limits recorded for it.
type Instance = (i64, Option<Document>);

/// Instances remembered before the memory is cleared (each is then written once more).
const RECORDED_MAX: usize = 100_000;

impl Recorded {
    fn is_current(&self, id: &ObjectId, gen: i64, applied: &Option<Document>) -> bool {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(id).is_some_and(|(g, a)| *g == gen && a == applied)
    }

    fn note(&self, id: ObjectId, gen: i64, applied: Option<Document>) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= RECORDED_MAX {
            map.clear();
        }
        map.insert(id, (gen, applied));
    }
}

impl Exec {
    pub(crate) fn new(policy: ExecPolicy) -> Self {
        let shim = std::env::current_exe().unwrap_or_else(|_| "slotpool".into());
        Exec {
            policy,
            shim,
            recorded: Recorded::default(),
        }
    }

    /// The shim's command for `run`: its arguments (grace, suspension, limits, user,
    /// the robot's command), and an environment built from scratch, with the
    /// context in `SLOTPOOL_CONTEXT` when it fits (`in_env`).
    fn shim_command(
        &self,
        run: &RobotRun,
        spec: &ExecSpec,
        context_json: &str,
        in_env: bool,
        limits: &Limits,
        via: limits::Via,
    ) -> Command {
        let mut cmd = Command::new(&self.shim);
        cmd.arg(shim::SHIM_ARG)
            // The shim's own SIGKILL comes a little after the worker's, as a backstop
            // for a worker that is stopped or dead, still inside the fence margin.
            .arg(run.backstop.as_millis().to_string())
            .arg(run.suspend_for.as_millis().to_string())
            .arg(via.as_str())
            .arg(limits.to_arg())
            .arg(super::run_as::RunAs::to_arg(self.policy.run_as()))
            .arg(&spec.command)
            .args(&spec.args)
            // From scratch: a few of the worker's variables, never its credentials.
            .env_clear()
            .envs(
                policy::INHERITED
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (*k, v))),
            )
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("SLOTPOOL_CONTEXT_FILE", CONTEXT_FILE)
            .env("SLOTPOOL_ROBOT", run.name())
            .env("SLOTPOOL_EPOCH", run.epoch().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Not killed on drop at once: see `ShimChild`.
            // Its own group: a signal meant for the worker's group (a terminal's
            // Ctrl-C, a SIGSTOP of the group) does not reach the shim.
            .process_group(0);
        if in_env {
            cmd.env("SLOTPOOL_CONTEXT", context_json);
        }
        if let Some(firing) = run.firing() {
            cmd.env("SLOTPOOL_FIRING", super::schedule::rfc3339(firing));
        }
        if let Some(attempt) = run.attempt() {
            cmd.env("SLOTPOOL_ATTEMPT", attempt.to_string());
        }
        cmd
    }
}

struct ExecSpec {
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The robot reads `SLOTPOOL_CONTEXT_FILE`, so its context may outgrow
    /// [`ENV_CONTEXT_MAX`].
    context_file: bool,
    /// How long the command may go without a checkpoint or a `{"heartbeat": true}`
    /// line before it counts as hung: stopped (SIGTERM, then SIGKILL after the grace)
    /// and started again. None: no such check.
    heartbeat_timeout: Option<Duration>,
    /// `spec.limits`: bounds on the command's processes (the worker's default fills
    /// the fields left unset).
    limits: Limits,
}

/// The largest context passed in `SLOTPOOL_CONTEXT`, as JSON bytes: Linux refuses
/// one environment string over 128 KiB at exec, so a robot whose context may grow
/// past this reads `SLOTPOOL_CONTEXT_FILE` and says so with `"context_file": true`.
pub(crate) const ENV_CONTEXT_MAX: usize = 64 * 1024;

/// Where a robot finds its context as a file: descriptor 3, an in-memory file
/// (nothing on disk, gone with the robot).
pub(crate) const CONTEXT_FILE: &str = "/proc/self/fd/3";

/// The spec fields only `exec` reads.
const EXEC_SPEC_FIELDS: &[&str] = &[
    "command",
    "args",
    "env",
    "context_file",
    "heartbeat_timeout",
    limits::SPEC_FIELD,
];

/// The shortest and longest `heartbeat_timeout`.
const HEARTBEAT_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(24 * 3600));

fn parse_spec(spec: &Document) -> Result<ExecSpec, String> {
    for key in spec.keys() {
        if !EXEC_SPEC_FIELDS.contains(&key.as_str())
            && !super::COMMON_SPEC_FIELDS.contains(&key.as_str())
        {
            return Err(format!(
                "unknown exec spec field {:?} (known: {}, {})",
                crate::printable::escape(key),
                EXEC_SPEC_FIELDS.join(", "),
                super::COMMON_SPEC_FIELDS.join(", ")
            ));
        }
    }
    let command = spec
        .get_str("command")
        .map_err(|_| "spec.command must be a string naming the program to run".to_string())?
        .to_string();
    if command.trim().is_empty() {
        return Err("spec.command is empty".into());
    }
    let args = match spec.get("args") {
        None => Vec::new(),
        Some(Bson::Array(a)) => a
            .iter()
            .map(|v| match v {
                Bson::String(s) => Ok(s.clone()),
                other => Err(format!("spec.args must hold strings, found {other}")),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "spec.args must be an array of strings, found {other}"
            ))
        }
    };
    let env = match spec.get("env") {
        None => Vec::new(),
        Some(Bson::Document(d)) => d
            .iter()
            .map(|(k, v)| match v {
                Bson::String(s) => {
                    policy::check_variable(k, s)?;
                    Ok((k.clone(), s.clone()))
                }
                other => Err(format!(
                    "spec.env.{} must be a string, found {other}",
                    crate::printable::escape(k)
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "spec.env must be a document of strings, found {other}"
            ))
        }
    };
    let context_file = match spec.get("context_file") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(other) => {
            return Err(format!(
                "spec.context_file must be true or false, found {other}"
            ))
        }
    };
    let heartbeat_timeout = match spec.get("heartbeat_timeout") {
        None | Some(Bson::Null) => None,
        Some(v) => {
            let (min, max) = HEARTBEAT_TIMEOUT_RANGE;
            Some(super::spec_duration("heartbeat_timeout", v, min, max)?)
        }
    };
    Ok(ExecSpec {
        command,
        args,
        env,
        context_file,
        heartbeat_timeout,
        limits: Limits::from_spec(spec)?,
    })
}

/// The worker's end of a robot's shim: control messages on its stdin.
struct ShimControl {
    stdin: Mutex<Option<ChildStdin>>,
}

impl ShimControl {
    /// Sends a message; a shim that is gone needs none.
    async fn send(&self, c: Control) {
        let mut stdin = self.stdin.lock().await;
        if let Some(pipe) = stdin.as_mut() {
            if pipe.write_all(c.line().as_bytes()).await.is_err() {
                *stdin = None;
            }
        }
    }

    /// Sends the lease deadline as `deadlines` says it now, read under the pipe's
    /// lock: every sender reads and writes in one step, so the last deadline the
    /// shim hears is the latest the worker set (a revocation included), whichever
    /// task sent it.
    async fn send_deadline(&self, deadlines: &watch::Receiver<Instant>) {
        let mut stdin = self.stdin.lock().await;
        let at = *deadlines.borrow();
        if let Some(pipe) = stdin.as_mut() {
            let line = Control::Deadline(monotonic(at)).line();
            if pipe.write_all(line.as_bytes()).await.is_err() {
                *stdin = None;
            }
        }
    }
}

/// A monotonic instant of this process as an absolute `CLOCK_MONOTONIC` reading.
fn monotonic(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    shim::monotonic_ns().saturating_add(left.as_nanos() as u64)
}

/// The shim's process, ended in order when a run is dropped without its end (a
/// suspended robot aborted when its lease is given up, a stop that waited the shim
/// out): the run's drop closes the shim's control pipe, and the shim, which sees it
/// close, kills the robot's whole tree, frozen or escaped from its group, then
/// exits. So the shim is first continued (a robot may have stopped it; only the
/// shim is signalled, a frozen tree stays frozen until killed), and killed only if
/// it is still there [`SHIM_GONE_WITHIN`] later: killed at once, it would leave a
/// tree that escaped its group running, or frozen, for good; never killed, a shim
/// a robot keeps stopped would leave the robot running unfenced.
struct ShimChild(Option<tokio::process::Child>);

/// How long a shim whose run was dropped has to kill its tree and exit before it
/// is killed (its own death then takes the robot's direct child with it).
const SHIM_GONE_WITHIN: Duration = Duration::from_secs(2);

impl std::ops::Deref for ShimChild {
    type Target = tokio::process::Child;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the shim's process")
    }
}

impl std::ops::DerefMut for ShimChild {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("the shim's process")
    }
}

impl Drop for ShimChild {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // Not reaped yet, so the pid is still the shim's.
        if let Some(pid) = child.id() {
            // SAFETY: kill(2) on this process's own child, not yet reaped.
            unsafe {
                libc::kill(pid as i32, libc::SIGCONT);
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if tokio::time::timeout(SHIM_GONE_WITHIN, child.wait())
                        .await
                        .is_err()
                    {
                        tracing::warn!(
                            "a robot's shim did not end within {} ms of its run's end; killing it",
                            SHIM_GONE_WITHIN.as_millis()
                        );
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                    }
                });
            }
            Err(_) => {
                let _ = child.start_kill();
            }
        }
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Passes every change of the lease deadline on to the shim, until the robot ends.
async fn forward_deadlines(
    mut deadlines: watch::Receiver<Instant>,
    control: std::sync::Arc<ShimControl>,
) {
    while deadlines.changed().await.is_ok() {
        deadlines.mark_unchanged();
        control.send_deadline(&deadlines).await;
    }
}

#[async_trait]
impl RobotKind for Exec {
    fn name(&self) -> &str {
        "exec"
    }

    fn suspends_itself(&self) -> bool {
        true
    }

    fn check_spec(&self, spec: &Document) -> Result<(), String> {
        parse_spec(spec).map(|_| ())
    }

    fn admits(&self, spec: &Document) -> Result<(), String> {
        let spec = parse_spec(spec)?;
        self.policy
            .check_command(&spec.command)
            .and_then(|()| self.policy.check_env(&spec.env))
    }

    fn check_context(&self, spec: &Document, context: &Document) -> Result<(), String> {
        let spec = parse_spec(spec)?;
        let bytes = Bson::Document(context.clone())
            .into_relaxed_extjson()
            .to_string()
            .len();
        if bytes > ENV_CONTEXT_MAX && !spec.context_file {
            return Err(too_big_for_env(bytes));
        }
        Ok(())
    }

    async fn run(&self, run: RobotRun) -> Result<(), RobotError> {
        let spec = parse_spec(run.spec()).map_err(RobotError::Invalid)?;
        self.policy
            .check_command(&spec.command)
            .and_then(|()| self.policy.check_env(&spec.env))
            .map_err(RobotError::Invalid)?;
        let context_json = Bson::Document(run.context().clone())
            .into_relaxed_extjson()
            .to_string();
        let in_env = context_json.len() <= ENV_CONTEXT_MAX;
        if !in_env && !spec.context_file {
            return Err(RobotError::Invalid(too_big_for_env(context_json.len())));
        }
        let deadlines = run.lease_deadline();
        let deadline = *deadlines.borrow();
        if deadline <= Instant::now() {
            return Err(RobotError::NotStarted(format!(
                "robot {}: not started, this worker's lease deadline had passed",
                run.name()
            )));
        }
        let context_fd = context_file(&context_json)
            .map_err(|e| RobotError::Crashed(format!("cannot pass the context: {e}")))?;
        let (report_rx, report_tx) = report_pipe()
            .map_err(|e| RobotError::Crashed(format!("cannot make the shim's report pipe: {e}")))?;
        let (limits, via) = self.policy.limits_for(spec.limits);
        let mut cmd = self.shim_command(&run, &spec, &context_json, in_env, &limits, via);
        let fd = context_fd.as_raw_fd();
        let report_fd = report_tx.as_raw_fd();
        // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and
        // exec, on descriptors this process owns until spawn returns (both numbered
        // above 4, so neither move overwrites the other; dup2 clears close-on-exec).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 || libc::dup2(report_fd, shim::REPORT_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        drop(context_fd);
        // Only the shim holds the write end now: the pipe ends when the shim does.
        drop(report_tx);
        let mut child = ShimChild(Some(spawned.map_err(|e| {
            RobotError::Crashed(format!("cannot start the robot shim {:?}: {e}", self.shim))
        })?));
        if let (Some(meter), Some(pid)) = (&run.meter, child.id()) {
            meter.track_process(pid as i32);
        }
        let control = std::sync::Arc::new(ShimControl {
            stdin: Mutex::new(child.stdin.take()),
        });
        // The first deadline before anything else: the shim starts the command only
        // once it has one.
        control.send(Control::Deadline(monotonic(deadline))).await;
        // Ended with the run, however it ends: dropped unpolled too (a suspended
        // robot's run aborted when its lease is given up), so that the shim's pipe
        // closes with it and the shim kills the tree, frozen or not.
        let forwarder = AbortOnDrop(tokio::spawn(forward_deadlines(deadlines, control.clone())));
        // The shim says what it applied before it starts the command: recorded
        // before any of the command's output is handled, as the run's first write.
        let mut reports = Reports {
            lines: tokio::io::AsyncBufReadExt::lines(BufReader::new(report_rx)),
            limits,
            seen: Reported::default(),
            recorded: self.recorded.clone(),
        };
        let first = tokio::time::timeout(Duration::from_secs(5), reports.next(&run)).await;
        let reports = match first {
            // The shim is gone already (it could not start the command).
            Ok(false) => None,
            Ok(true) | Err(_) => Some(tokio::spawn(reports.rest(run.clone()))),
        };
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let out = Output {
            run: &run,
            budget: std::sync::Arc::new(std::sync::Mutex::new(LogBudget::new(
                std::time::Instant::now(),
            ))),
            context_file: spec.context_file,
            heartbeat_timeout: spec.heartbeat_timeout,
            alive: std::sync::Mutex::new(Instant::now()),
            suspended: std::sync::Mutex::new(false),
        };
        let stderr_task = tokio::spawn(log_stderr(run.clone(), out.budget.clone(), stderr));
        let mut lines = BoundedLines::new(BufReader::new(stdout), output::MAX_STDOUT_LINE);
        let robot = Robot {
            child: &mut child,
            control: &control,
            stderr: Some(stderr_task),
            reports,
        };
        let result = supervise_child(&out, robot, &mut lines).await;
        if result.is_err() {
            control.send(Control::Kill).await;
            let _ = child.wait().await;
        }
        drop(forwarder);
        out.report_dropped();
        result
    }
}

/// The pipe on which the shim reports ([`shim::Report`]): the read end for this
/// process, the write end for the shim's descriptor 4. Both close-on-exec and
/// numbered from 10, clear of the descriptors the child's are moved to.
fn report_pipe() -> std::io::Result<(tokio::net::unix::pipe::Receiver, std::os::fd::OwnedFd)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into our array; each is owned once.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let read = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
    Ok((read, above_4(write)?))
}

/// The same open file on a descriptor numbered 10 or more, close-on-exec.
fn above_4(fd: std::os::fd::OwnedFd) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor we then own alone.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(new) })
}

/// What the shim said while the robot ran.
#[derive(Debug, Default)]
struct Reported {
    /// The kernel killed the robot at its memory limit (this many bytes).
    memory_killed: Option<u64>,
    /// The shim reported the limits it applied, which it does only once it has a
    /// live deadline, before it starts the command: the command may have run.
    applied: bool,
}

/// The shim's reports, read as they come: records the limits it applied in the
/// robot's document (for `robot show` and the dashboard), logs a limit hit, and
/// remembers a memory kill.
struct Reports {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::pipe::Receiver>>,
    limits: Limits,
    seen: Reported,
    recorded: Recorded,
}

impl Reports {
    /// Handles the next report; false once the shim is gone.
    async fn next(&mut self, run: &RobotRun) -> bool {
        let Ok(Some(line)) = self.lines.next_line().await else {
            return false;
        };
        match serde_json::from_str::<shim::Report>(&line) {
            Ok(shim::Report::Limits(applied)) => {
                self.seen.applied = true;
                let applied = applied.and_then(|a| bson::to_document(&a).ok());
                if !self.recorded.is_current(&run.id, run.gen, &applied) {
                    // A failure here is the next checkpoint's to report.
                    let written = run
                        .store
                        .set_containment(&run.id, run.gen, shim::CONTAINMENT, applied.clone())
                        .await;
                    if matches!(written, Ok(true)) {
                        self.recorded.note(run.id, run.gen, applied);
                    }
                }
            }
            Ok(shim::Report::PidsLimitHit) => {
                run.metrics().pids_limit_hits.inc();
                let why = format!(
                    "a fork failed at this robot's pids limit ({})",
                    self.limits.pids.unwrap_or_default()
                );
                run.keep_output(crate::db::output_log::Stream::Stderr, &why);
                tracing::warn!(robot = %run.name(), "{why}");
            }
            Ok(shim::Report::MemoryKilled) => {
                run.metrics().memory_kills.inc();
                self.seen.memory_killed = self.limits.memory;
            }
            Err(e) => tracing::debug!(robot = %run.name(), "unreadable shim report: {e}"),
        }
        true
    }

    /// Handles the rest until the shim exits; what they said.
    async fn rest(mut self, run: RobotRun) -> Reported {
        while self.next(&run).await {}
        self.seen
    }
}

/// Why a context cannot be passed in `SLOTPOOL_CONTEXT`, and what to do.
fn too_big_for_env(bytes: usize) -> String {
    format!(
        "its context is {bytes} bytes as JSON, more than SLOTPOOL_CONTEXT can carry ({ENV_CONTEXT_MAX}); \
         a robot that reads SLOTPOOL_CONTEXT_FILE instead says so with \"context_file\": true in its spec"
    )
}

/// The context as an in-memory file, read from the start: the robot gets it as
/// descriptor 3 (see [`CONTEXT_FILE`]). Close-on-exec here; only the shim's copy,
/// made between fork and exec, is passed on.
fn context_file(json: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::io::{Seek, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked and
    // owned exactly once.
    let fd = unsafe { libc::memfd_create(c"slotpool-context".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(owned);
    file.write_all(json.as_bytes())?;
    file.rewind()?;
    Ok(file.into())
}

/// Logs stderr (within the robot's log budget); returns the shim's own error, if it
/// could not start the command.
async fn log_stderr(
    run: RobotRun,
    budget: std::sync::Arc<std::sync::Mutex<LogBudget>>,
    stderr: tokio::process::ChildStderr,
) -> Option<String> {
    let mut lines = BoundedLines::new(BufReader::new(stderr), output::MAX_STDERR_LINE);
    let mut shim_error = None;
    while let Ok(Some(l)) = lines.next_line().await {
        if let Some(e) = l.text.strip_prefix(shim::ERROR_PREFIX) {
            shim_error.get_or_insert_with(|| e.to_string());
        }
        match admit(&budget, &run) {
            Ok(()) => {
                let shown = output::shown(&l.text, l.cut);
                run.keep_output(crate::db::output_log::Stream::Stderr, &shown);
                tracing::warn!(robot = %run.name(), stream = "stderr", "{}", shown)
            }
            Err(Some(pause)) => tokio::time::sleep(pause).await,
            Err(None) => {}
        }
    }
    shim_error
}

/// Whether one more output line may be logged (logging how many were dropped
/// first, when a report is due); when not, how long to pause reading, if at all.
fn admit(budget: &std::sync::Mutex<LogBudget>, run: &RobotRun) -> Result<(), Option<Duration>> {
    let verdict = budget
        .lock()
        .expect("log budget lock")
        .admit(std::time::Instant::now());
    match verdict {
        Admit::Log { dropped_before } => {
            if dropped_before > 0 {
                dropped(run, dropped_before);
            }
            Ok(())
        }
        Admit::Drop { pause } => {
            run.metrics().log_lines_dropped.inc();
            Err(pause)
        }
    }
}

fn dropped(run: &RobotRun, n: u64) {
    tracing::warn!(
        robot = %run.name(),
        "{n} output lines not logged: the robot wrote more than {} lines a second",
        output::LOG_LINES_PER_SEC
    );
}

/// What handling stdout needs: the run, its log budget, how its context travels.
struct Output<'a> {
    run: &'a RobotRun,
    budget: std::sync::Arc<std::sync::Mutex<LogBudget>>,
    context_file: bool,
    heartbeat_timeout: Option<Duration>,
    /// The command's last sign of life: its start, a checkpoint or a heartbeat line.
    alive: std::sync::Mutex<Instant>,
    /// Its lease was found past its deadline (suspended) since that sign of life.
    suspended: std::sync::Mutex<bool>,
}

impl Output<'_> {
    async fn handle(&self, line: output::RawLine) -> Result<(), RobotError> {
        match parse_line(&line.text, line.cut) {
            Line::Checkpoint(ctx) => {
                // Only a long line can hold a context too big for the environment.
                if !self.context_file && line.text.len() > ENV_CONTEXT_MAX / 2 {
                    let bytes = Bson::Document(ctx.clone())
                        .into_relaxed_extjson()
                        .to_string()
                        .len();
                    if bytes > ENV_CONTEXT_MAX {
                        return Err(self.refuse(too_big_for_env(bytes)));
                    }
                }
                self.run.checkpoint(ctx).await?;
                self.lived();
                Ok(())
            }
            Line::Heartbeat => {
                self.lived();
                Ok(())
            }
            Line::BadCheckpoint(why) => Err(self.refuse(why)),
            Line::Log(l) => {
                match admit(&self.budget, self.run) {
                    Ok(()) => {
                        let shown = output::shown(&l, line.cut);
                        self.run
                            .keep_output(crate::db::output_log::Stream::Stdout, &shown);
                        tracing::info!(robot = %self.run.name(), "{}", shown)
                    }
                    // Throttled, except while stopping: a last checkpoint may follow.
                    Err(Some(pause)) if !self.run.stop().is_cancelled() => {
                        tokio::time::sleep(pause).await
                    }
                    Err(_) => {}
                }
                Ok(())
            }
        }
    }

    fn lived(&self) {
        *self.alive.lock().expect("liveness lock") = Instant::now();
        *self.suspended.lock().expect("liveness lock") = false;
    }

    /// After a suspension, the command's heartbeat is judged afresh.
    fn lived_if_suspended(&self) {
        if *self.suspended.lock().expect("liveness lock") {
            self.lived();
        }
    }

    /// Whether the command counts as hung now.
    fn hung_now(&self) -> bool {
        self.hung_at().is_some_and(|at| at <= Instant::now())
    }

    /// When the command counts as hung unless it shows life first; None: never,
    /// and not while its lease is suspended (past its deadline: the shim froze it).
    fn hung_at(&self) -> Option<Instant> {
        if Instant::now() >= *self.run.lease_deadline().borrow() {
            *self.suspended.lock().expect("liveness lock") = true;
            return None;
        }
        let alive = *self.alive.lock().expect("liveness lock");
        self.heartbeat_timeout.map(|t| alive + t)
    }

    /// A checkpoint that cannot be stored stops the robot with an error: going on
    /// would lose its state at the next start.
    fn refuse(&self, why: String) -> RobotError {
        self.run.metrics().checkpoints_refused.inc();
        RobotError::Invalid(format!("checkpoint refused: {why}"))
    }

    fn report_dropped(&self) {
        let n = self.budget.lock().expect("log budget lock").take_dropped();
        if n > 0 {
            dropped(self.run, n);
        }
    }
}

/// The running command: its shim process and the shim's control pipe.
struct Robot<'a> {
    child: &'a mut Child,
    control: &'a ShimControl,
    /// Logs stderr; returns the shim's own error, if it could not start the command.
    stderr: Option<tokio::task::JoinHandle<Option<String>>>,
    /// Reads the shim's reports; returns what they said once the shim is gone.
    reports: Option<tokio::task::JoinHandle<Reported>>,
}

/// How often the worker looks at each robot's shim for a stop (see
/// [`Robot::turned_on_its_shim`]).
const SHIM_CHECK: Duration = Duration::from_secs(1);

/// Whether the process is stopped or stopped for tracing (`/proc/PID/stat` state
/// `T` or `t`).
fn shim_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| shim::parse_stat(&s))
        .is_some_and(|(state, _)| matches!(state, 'T' | 't'))
}

impl Robot<'_> {
    /// After a stop: `NotStarted` when the shim was stopped before it had a live
    /// deadline, so the command never ran; Ok otherwise.
    async fn stopped_before_start(&mut self) -> Result<(), RobotError> {
        let Ok(Some(status)) = self.child.try_wait() else {
            return Ok(());
        };
        let reported = self.reported().await;
        match self.refused(status, &reported).await {
            Some(not_started) => Err(not_started),
            None => Ok(()),
        }
    }

    /// The robot's shim is stopped: nothing else stops a robot's processes and the
    /// shim is out of reach of everyone but the worker and the robot itself (which
    /// shares the worker's user unless `--exec-user` says otherwise), so the robot
    /// turned on it. It would outlive the lease if this worker were stopped too: it
    /// is killed now, its whole tree from here, and the shim with it.
    async fn turned_on_its_shim(&mut self, run: &RobotRun) -> RobotError {
        let shim_pid = self.child.id().map(|p| p as i32);
        let give_up = std::time::Instant::now() + Duration::from_secs(5);
        if let Some(pid) = shim_pid {
            loop {
                let below = shim::descendants(pid);
                if below.is_empty() || std::time::Instant::now() > give_up {
                    break;
                }
                for p in below {
                    // SAFETY: kill(2) on processes of this robot's tree.
                    unsafe {
                        libc::kill(p, libc::SIGKILL);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        run.metrics().shims_stopped.inc();
        let why = "the robot stopped its own shim (SIGSTOP or a trace): killed with its whole tree; run robots as another user (--exec-user) so they cannot reach it".to_string();
        tracing::error!(robot = %run.name(), "{why}");
        RobotError::Crashed(why)
    }

    /// What the shim reported once it is gone (None: not within half a second).
    /// Nothing at all when it was gone before its first report.
    async fn reported(&mut self) -> Option<Reported> {
        match self.reports.take() {
            // The shim wrote its reports before it exited; the pipe ends with it.
            Some(task) => tokio::time::timeout(Duration::from_millis(500), task)
                .await
                .ok()
                .and_then(Result::ok),
            None => Some(Reported::default()),
        }
    }

    /// The shim's own error line, when it said one (it could not start the command).
    async fn shim_error(&mut self) -> Option<String> {
        let task = self.stderr.take()?;
        let waited = tokio::time::timeout(Duration::from_millis(500), task).await;
        waited.ok().and_then(Result::ok).flatten()
    }

    /// Whether an exit with `status` is the shim's refusal to start: its own code,
    /// its own word for it, and no sign that it got as far as the command (a robot
    /// may exit 125 too).
    async fn refused(
        &mut self,
        status: std::process::ExitStatus,
        reported: &Option<Reported>,
    ) -> Option<RobotError> {
        if status.code() != Some(shim::NOT_STARTED) || reported.as_ref().is_none_or(|r| r.applied) {
            return None;
        }
        let said = self.shim_error().await?;
        said.contains("not started")
            .then_some(RobotError::NotStarted(said))
    }

    /// Why the command ended by itself.
    async fn exited(&mut self, status: std::io::Result<std::process::ExitStatus>) -> RobotError {
        let status = match status {
            Ok(s) => s,
            Err(e) => return RobotError::Crashed(format!("command lost: {e}")),
        };
        let reported = self.reported().await;
        if let Some(bytes) = reported.as_ref().and_then(|r| r.memory_killed) {
            return RobotError::Crashed(format!("killed: memory limit ({})", limits::bytes(bytes)));
        }
        if let Some(refused) = self.refused(status, &reported).await {
            return refused;
        }
        if status.code() == Some(shim::CANNOT_START) {
            if let Some(why) = self.shim_error().await {
                return RobotError::Crashed(why);
            }
        }
        if status.success() {
            return RobotError::Finished;
        }
        RobotError::Crashed(format!("command exited: {status}"))
    }
}

type Lines = BoundedLines<BufReader<tokio::process::ChildStdout>>;

async fn supervise_child(
    out: &Output<'_>,
    mut robot: Robot<'_>,
    lines: &mut Lines,
) -> Result<(), RobotError> {
    let run = out.run;
    let mut guard_check = tokio::time::interval(SHIM_CHECK);
    guard_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lease = run.lease_deadline();
    let mut following = true;
    loop {
        tokio::select! {
            _ = run.stop().cancelled() => return stop_child(out, robot, lines).await,
            changed = lease.changed(), if following => {
                following = changed.is_ok();
                // Resumed after a suspension: frozen by its shim, the robot showed
                // no life for that reason; its heartbeat is judged from now.
                if following && *lease.borrow_and_update() > Instant::now() {
                    out.lived_if_suspended();
                }
            }
            line = lines.next_line() => match line {
                Ok(Some(l)) => out.handle(l).await?,
                Ok(None) | Err(_) => break,
            },
            _ = guard_check.tick() => {
                if robot.child.id().is_some_and(|pid| shim_stopped(pid as i32)) {
                    return Err(robot.turned_on_its_shim(run).await);
                }
            }
            // Judged again as it fires: a lease suspended meanwhile holds it off.
            () = until(out.hung_at()) => if out.hung_now() {
                return hung(out, robot, lines).await;
            },
            // The shim ended while something still holds the robot's stdout: a
            // descendant that escaped a shim killed with -9 (the shim ends by itself
            // only after the robot's whole tree is gone, and stdout with it). The
            // robot's own process is dead (PDEATHSIG); what it printed before is
            // still in the pipe.
            status = robot.child.wait() => {
                drain(out, lines).await;
                return Err(robot.exited(status).await);
            }
        }
    }
    // stdout closed: the command is exiting (or detached its output). No more
    // heartbeats can come, so the deadline stands. Its exit, when it came, goes
    // before a stop that came at the same moment: a run that ended by itself is
    // recorded as it ended.
    tokio::select! {
        biased;
        status = robot.child.wait() => Err(robot.exited(status).await),
        _ = run.stop().cancelled() => stop_child(out, robot, lines).await,
        () = until(out.hung_at()) => hung(out, robot, lines).await,
    }
}

/// Handles what is left in the robot's stdout once the robot is dead: until the
/// pipe ends, or for at most [`DRAIN`] when a stray descendant keeps it open.
///
/// Nothing writes any more, so the checkpoints are read to the end first and only
/// the last good one is written: each one replaces the context whole, so it holds
/// the robot's final state, and one write fits the little time left in a stop where
/// a queue of them, one round trip each, would not. A bad checkpoint after it (most
/// likely a line the SIGKILL cut in half) is reported, not stored, and does not
/// cost the good one. Output lines are kept as read.
async fn drain(out: &Output<'_>, lines: &mut Lines) {
    let (mut good, mut bad_after) = (None, None);
    let _ = tokio::time::timeout(DRAIN, async {
        while let Ok(Some(l)) = lines.next_line().await {
            match parse_line(&l.text, l.cut) {
                Line::Checkpoint(_) => (good, bad_after) = (Some(l), None),
                Line::BadCheckpoint(why) => bad_after = Some(why),
                _ => {
                    let _ = out.handle(l).await;
                }
            }
        }
    })
    .await;
    if let Some(l) = good {
        let _ = out.handle(l).await;
    }
    if let Some(why) = bad_after {
        out.run.metrics().checkpoints_refused.inc();
        tracing::warn!(robot = %out.run.name(), "the robot's last checkpoint line, read after it was stopped, was not stored ({why}); its last good one stands");
    }
}

/// How long [`drain`] reads: a dead writer's lines are all in the pipe already.
const DRAIN: Duration = Duration::from_secs(2);

/// Completes at `at`; never when None.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The command showed no life within its `heartbeat_timeout`: stops it as a stop
/// request would (SIGTERM, what it prints persisted, SIGKILL after the grace), and
/// reports it as an end, so the supervisor starts it again under its restart policy.
async fn hung(out: &Output<'_>, robot: Robot<'_>, lines: &mut Lines) -> Result<(), RobotError> {
    let run = out.run;
    let timeout = out.heartbeat_timeout.unwrap_or_default();
    let why = format!("no heartbeat for {}", humantime::format_duration(timeout));
    run.metrics().heartbeat_timeouts.inc();
    tracing::warn!(robot = %run.name(), "{why} (spec.heartbeat_timeout): stopping it to start it again");
    stop_child(out, robot, lines).await?;
    Err(RobotError::Crashed(why))
}

/// SIGTERM, keep persisting what it prints, SIGKILL at the end of the grace; then
/// what the robot printed before it died, to the end of its output.
///
/// A stop asked for only well after the lease's deadline passed (this worker was
/// frozen, and has just been thawed) gets no grace: a standby may be running the
/// robot already, so SIGKILL goes first, before anything else of this instance runs.
async fn stop_child(
    out: &Output<'_>,
    mut robot: Robot<'_>,
    lines: &mut Lines,
) -> Result<(), RobotError> {
    let run = out.run;
    // It may have ended by itself just before the stop: that end is its outcome.
    if let Ok(Some(status)) = robot.child.try_wait() {
        drain(out, lines).await;
        return Err(robot.exited(Ok(status)).await);
    }
    let lease = *run.lease_deadline().borrow();
    let overdue = Instant::now().saturating_duration_since(lease);
    if overdue >= shim::late_slack(run.grace()) {
        robot.control.send(Control::Kill).await;
        run.metrics().late_kills.inc();
        tracing::warn!(
            robot = %run.name(),
            overdue_ms = overdue.as_millis() as u64,
            "the lease's deadline passed long before this stop (the worker was frozen or starved): killed at once, no stop grace"
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), robot.child.wait()).await;
        // Its writes are refused now; what it printed is still logged.
        drain(out, lines).await;
        return robot.stopped_before_start().await;
    }
    // The lease is live: its deadline goes first, on the same pipe, so a shim that
    // froze its robot at a suspension and has not yet heard of the resume thaws it
    // before the TERM (which it would otherwise answer with a kill, as for a frozen
    // robot whose lease was given up). Read again as it is sent: a revocation since
    // the read above reaches the shim as the last word, and is never undone.
    robot.control.send_deadline(&run.lease_deadline()).await;
    let deadline = Instant::now() + run.grace();
    robot.control.send(Control::Term).await;
    // What it prints meanwhile is persisted until the deadline, and no longer even
    // when it prints faster than that can be written (a line is always ready then).
    let (mut ended, mut fenced) = (false, false);
    while !ended && !fenced && Instant::now() < deadline {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(l))) => fenced = matches!(out.handle(l).await, Err(RobotError::Fenced(_))),
            Ok(_) => ended = true,
            Err(_) => break,
        }
    }
    if tokio::time::timeout_at(deadline, robot.child.wait())
        .await
        .is_err()
    {
        tracing::warn!(robot = %run.name(), grace_ms = run.grace().as_millis() as u64, "did not exit after SIGTERM; sending SIGKILL");
        robot.control.send(Control::Kill).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), robot.child.wait()).await;
    }
    // The shim killed anything left of the robot's tree (its group, and every
    // descendant that left it) when the robot's own process exited. Checkpoints it
    // printed in its last moments may still wait in the pipe, unread when the grace
    // ran out: the last of them is its final state, and it is written like any
    // other, under the fence.
    if !ended && !fenced {
        drain(out, lines).await;
    }
    robot.stopped_before_start().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn specs() {
        assert!(parse_spec(&doc! {"command": "/bin/true"}).is_ok());
        assert!(parse_spec(&doc! {}).is_err());
        assert!(parse_spec(&doc! {"command": "x", "args": [1]}).is_err());
        assert!(parse_spec(&doc! {"command": "x", "bogus": 1}).is_err());
        assert!(
            parse_spec(&doc! {"command": "x", "context_file": true})
                .unwrap()
                .context_file
        );
        assert!(parse_spec(&doc! {"command": "x", "context_file": "yes"}).is_err());
        // Refused by every worker, so refused at create.
        for name in [
            "BASH_FUNC_echo%%",
            "BASH_ENV",
            "LD_PRELOAD",
            "PATH",
            "SLOTPOOL_EPOCH",
        ] {
            assert!(
                parse_spec(&doc! {"command": "x", "env": {name: "v"}}).is_err(),
                "{name}"
            );
        }
        assert!(parse_spec(&doc! {"command": "x", "env": {"GREETING": "hi"}}).is_ok());
    }

    #[test]
    fn heartbeat_timeouts_and_the_common_fields() {
        let spec = |extra: Document| {
            let mut d = doc! {"command": "x"};
            d.extend(extra);
            parse_spec(&d)
        };
        assert_eq!(spec(doc! {}).unwrap().heartbeat_timeout, None);
        assert_eq!(
            spec(doc! {"heartbeat_timeout": "2s"})
                .unwrap()
                .heartbeat_timeout,
            Some(Duration::from_secs(2))
        );
        for (bad, says) in [
            (doc! {"heartbeat_timeout": 2}, "a duration such as"),
            (doc! {"heartbeat_timeout": "soon"}, "spec.heartbeat_timeout"),
            (doc! {"heartbeat_timeout": "1ms"}, "between 100ms and"),
            (doc! {"heartbeat_timeout": "2days"}, "between 100ms and"),
        ] {
            let e = spec(bad.clone()).err().unwrap();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // The fields every kind reads pass exec's own check.
        assert!(spec(doc! {"history": 5, "restart": {"attempts": 3}}).is_ok());
    }
}
