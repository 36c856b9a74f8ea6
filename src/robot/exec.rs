//! `exec`: an external command as a robot.
//!
//! The command gets its context as JSON in `SLOTPOOL_CONTEXT`, with `SLOTPOOL_ROBOT`
//! (its name) and `SLOTPOOL_EPOCH`. A stdout line `{"checkpoint": {...}}` persists a
//! new context; every other stdout or stderr line is logged, tagged with the robot.
//! To stop it the worker sends SIGTERM to its process group, keeps persisting
//! checkpoints it prints, and sends SIGKILL when the grace runs out. When it exits by
//! itself the supervisor restarts it with backoff.
//!
//! The command runs under a [`shim`](super::shim) that holds the holder's lease
//! deadline: the command never outlives the lease, even when the worker is killed
//! with -9 or stopped with SIGSTOP. Signals to the command go through the shim.
//!
//! A robot gets its context, not the database's credentials: its environment is
//! built from scratch ([`policy::INHERITED`], then the spec's allowed variables),
//! and which commands and variables a spec may use is the worker's
//! [`ExecPolicy`] (`--exec-allow`, `--exec-env-allow`; no `exec` robot runs without
//! the first).
//!
//! Spec: `{"command": "/path/or/name", "args": ["..."], "env": {"K": "V"}, "history": 0}`.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use super::shim::{self, Control};
use super::{RobotError, RobotKind, RobotRun};

use super::policy;
pub use super::policy::ExecPolicy;

#[derive(Debug, Clone)]
pub struct Exec {
    policy: ExecPolicy,
    /// The program started as each robot's shim: this very binary, which must call
    /// [`shim::run_if_requested`] first thing in `main`.
    shim: std::path::PathBuf,
}

impl Exec {
    pub fn new(policy: ExecPolicy) -> Self {
        let shim = std::env::current_exe().unwrap_or_else(|_| "slotpool".into());
        Exec { policy, shim }
    }

    /// Uses another program as the shim (one that calls
    /// [`shim::run_if_requested`]), e.g. the `slotpool` binary from a test.
    pub fn with_shim(mut self, program: impl Into<std::path::PathBuf>) -> Self {
        self.shim = program.into();
        self
    }
}

struct ExecSpec {
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

fn parse_spec(spec: &Document) -> Result<ExecSpec, String> {
    for key in spec.keys() {
        if !["command", "args", "env", "history"].contains(&key.as_str()) {
            return Err(format!(
                "unknown exec spec field {key:?} (known: command, args, env, history)"
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
    Ok(ExecSpec { command, args, env })
}

/// What one stdout line means.
#[derive(Debug, PartialEq)]
pub enum Line {
    Checkpoint(Document),
    Log(String),
}

/// Parses a stdout line: `{"checkpoint": {...}}` and nothing else is a checkpoint.
pub fn parse_line(line: &str) -> Line {
    let trimmed = line.trim();
    if trimmed.starts_with('{') {
        if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str(trimmed) {
            if m.len() == 1 {
                if let Some(v @ serde_json::Value::Object(_)) = m.remove("checkpoint") {
                    if let Ok(d) = bson::to_document(&v) {
                        return Line::Checkpoint(d);
                    }
                }
            }
        }
    }
    Line::Log(line.to_string())
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
}

/// A monotonic instant of this process as an absolute `CLOCK_MONOTONIC` reading.
fn monotonic(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    shim::monotonic_ns().saturating_add(left.as_nanos() as u64)
}

/// Passes every change of the lease deadline on to the shim, until the robot ends.
async fn forward_deadlines(
    mut deadlines: watch::Receiver<Instant>,
    control: std::sync::Arc<ShimControl>,
) {
    while deadlines.changed().await.is_ok() {
        let at = *deadlines.borrow_and_update();
        control.send(Control::Deadline(monotonic(at))).await;
    }
}

#[async_trait]
impl RobotKind for Exec {
    fn name(&self) -> &str {
        "exec"
    }

    fn check_spec(&self, spec: &Document) -> Result<(), String> {
        parse_spec(spec).map(|_| ())
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
        let deadlines = run.lease_deadline();
        let deadline = *deadlines.borrow();
        if deadline <= Instant::now() {
            return Err(RobotError::Fenced(format!(
                "robot {}: not started, this worker's lease lapsed",
                run.name()
            )));
        }
        let mut cmd = Command::new(&self.shim);
        cmd.arg(shim::SHIM_ARG)
            // The shim's own SIGKILL comes a little after the worker's, as a backstop
            // for a worker that is stopped or dead, still inside the fence margin.
            .arg(run.backstop.as_millis().to_string())
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
            .env("SLOTPOOL_CONTEXT", context_json)
            .env("SLOTPOOL_ROBOT", run.name())
            .env("SLOTPOOL_EPOCH", run.epoch().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Its own group: a signal meant for the worker's group (a terminal's
            // Ctrl-C, a SIGSTOP of the group) does not reach the shim.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            RobotError::Crashed(format!("cannot start the robot shim {:?}: {e}", self.shim))
        })?;
        let control = std::sync::Arc::new(ShimControl {
            stdin: Mutex::new(child.stdin.take()),
        });
        // The first deadline before anything else: the shim starts the command only
        // once it has one.
        control.send(Control::Deadline(monotonic(deadline))).await;
        let forwarder = tokio::spawn(forward_deadlines(deadlines, control.clone()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let name = run.name().to_string();
        let stderr_task = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut shim_error = None;
            while let Ok(Some(l)) = lines.next_line().await {
                tracing::warn!(robot = %name, stream = "stderr", "{l}");
                if let Some(e) = l.strip_prefix(shim::ERROR_PREFIX) {
                    shim_error.get_or_insert_with(|| e.to_string());
                }
            }
            shim_error
        });
        let mut lines = BufReader::new(stdout).lines();
        let robot = Robot {
            child: &mut child,
            control: &control,
            stderr: Some(stderr_task),
        };
        let result = supervise_child(&run, robot, &mut lines).await;
        if result.is_err() {
            control.send(Control::Kill).await;
            let _ = child.wait().await;
        }
        forwarder.abort();
        result
    }
}

/// The running command: its shim process and the shim's control pipe.
struct Robot<'a> {
    child: &'a mut Child,
    control: &'a ShimControl,
    /// Logs stderr; returns the shim's own error, if it could not start the command.
    stderr: Option<tokio::task::JoinHandle<Option<String>>>,
}

impl Robot<'_> {
    /// Why the command ended by itself.
    async fn exited(&mut self, status: std::io::Result<std::process::ExitStatus>) -> RobotError {
        let status = match status {
            Ok(s) => s,
            Err(e) => return RobotError::Crashed(format!("command lost: {e}")),
        };
        if status.code() == Some(shim::CANNOT_START) {
            if let Some(task) = self.stderr.take() {
                let waited = tokio::time::timeout(Duration::from_millis(500), task).await;
                if let Ok(Ok(Some(why))) = waited {
                    return RobotError::Crashed(why);
                }
            }
        }
        RobotError::Crashed(format!("command exited: {status}"))
    }
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

async fn handle_line(run: &RobotRun, line: String) -> Result<(), RobotError> {
    match parse_line(&line) {
        Line::Checkpoint(ctx) => run.checkpoint(ctx).await,
        Line::Log(l) => {
            tracing::info!(robot = %run.name(), "{l}");
            Ok(())
        }
    }
}

async fn supervise_child(
    run: &RobotRun,
    mut robot: Robot<'_>,
    lines: &mut Lines,
) -> Result<(), RobotError> {
    loop {
        tokio::select! {
            _ = run.stop().cancelled() => return stop_child(run, robot, lines).await,
            line = lines.next_line() => match line {
                Ok(Some(l)) => handle_line(run, l).await?,
                Ok(None) | Err(_) => break,
            },
        }
    }
    // stdout closed: the command is exiting (or detached its output).
    tokio::select! {
        _ = run.stop().cancelled() => stop_child(run, robot, lines).await,
        status = robot.child.wait() => Err(robot.exited(status).await),
    }
}

/// SIGTERM, keep persisting what it prints, SIGKILL at the end of the grace.
async fn stop_child(run: &RobotRun, robot: Robot<'_>, lines: &mut Lines) -> Result<(), RobotError> {
    let deadline = Instant::now() + run.grace();
    robot.control.send(Control::Term).await;
    let mut open = true;
    while open {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(l))) => {
                if let Err(e) = handle_line(run, l).await {
                    if matches!(e, RobotError::Fenced(_)) {
                        break;
                    }
                }
            }
            Ok(_) => open = false,
            Err(_) => break,
        }
    }
    match tokio::time::timeout_at(deadline, robot.child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            tracing::warn!(robot = %run.name(), grace_ms = run.grace().as_millis() as u64, "did not exit after SIGTERM; sending SIGKILL");
            robot.control.send(Control::Kill).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), robot.child.wait()).await;
        }
    }
    // The shim killed anything left in the robot's group when its leader exited.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn lines() {
        assert_eq!(
            parse_line(r#"{"checkpoint": {"n": 3}}"#),
            Line::Checkpoint(doc! {"n": 3_i64})
        );
        assert!(matches!(parse_line("hello"), Line::Log(_)));
        assert!(matches!(parse_line(r#"{"checkpoint": 3}"#), Line::Log(_)));
        assert!(matches!(
            parse_line(r#"{"checkpoint": {}, "x": 1}"#),
            Line::Log(_)
        ));
    }

    #[test]
    fn specs() {
        assert!(parse_spec(&doc! {"command": "/bin/true"}).is_ok());
        assert!(parse_spec(&doc! {}).is_err());
        assert!(parse_spec(&doc! {"command": "x", "args": [1]}).is_err());
        assert!(parse_spec(&doc! {"command": "x", "bogus": 1}).is_err());
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
}
