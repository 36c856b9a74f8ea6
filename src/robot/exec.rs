//! `exec`: an external command as a robot.
//!
//! The command gets its context as JSON in `SLOTPOOL_CONTEXT`, with `SLOTPOOL_ROBOT`
//! (its name) and `SLOTPOOL_EPOCH`. A stdout line `{"checkpoint": {...}}` persists a
//! new context; every other stdout or stderr line is logged, tagged with the robot.
//! To stop it the worker sends SIGTERM to its process group, keeps persisting
//! checkpoints it prints, and sends SIGKILL when the grace runs out. When it exits by
//! itself the supervisor restarts it with backoff.
//!
//! The child does not inherit `MONGODB_URI`: a robot gets its context, not the
//! database's credentials.
//!
//! Spec: `{"command": "/path/or/name", "args": ["..."], "env": {"K": "V"}, "history": 0}`.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{RobotError, RobotKind, RobotRun};

/// Which commands `exec` robots may run (the worker's `--exec-allow`).
#[derive(Debug, Clone, Default)]
pub struct ExecPolicy {
    /// None: anything. Some(list): an entry ending in `/` allows every command under
    /// that directory; any other entry allows exactly that command string.
    allow: Option<Vec<String>>,
}

impl ExecPolicy {
    pub fn allow_all() -> Self {
        ExecPolicy { allow: None }
    }

    pub fn only(entries: Vec<String>) -> Self {
        ExecPolicy {
            allow: Some(entries),
        }
    }

    pub fn permits(&self, command: &str) -> bool {
        let Some(list) = &self.allow else {
            return true;
        };
        let no_escape = !command.split('/').any(|part| part == "..");
        list.iter().any(|entry| {
            if entry.ends_with('/') {
                no_escape && command.starts_with(entry.as_str())
            } else {
                entry == command
            }
        })
    }

    pub fn describe(&self) -> String {
        match &self.allow {
            None => "any command".into(),
            Some(l) => l.join(", "),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Exec {
    policy: ExecPolicy,
}

impl Exec {
    pub fn new(policy: ExecPolicy) -> Self {
        Exec { policy }
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
                Bson::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("spec.env.{k} must be a string, found {other}")),
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

fn signal_group(child: &Child, signal: i32) {
    if let Some(pid) = child.id() {
        // The child leads its own process group, so shell children get it too.
        // SAFETY: kill(2) with a negative pid signals that group; no memory involved.
        unsafe {
            libc::kill(-(pid as i32), signal);
        }
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
        if !self.policy.permits(&spec.command) {
            return Err(RobotError::Invalid(format!(
                "command {:?} is not allowed by this worker's --exec-allow ({})",
                spec.command,
                self.policy.describe()
            )));
        }
        let context_json = Bson::Document(run.context().clone())
            .into_relaxed_extjson()
            .to_string();
        let mut cmd = Command::new(&spec.command);
        cmd.args(&spec.args)
            .env_remove("MONGODB_URI")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("SLOTPOOL_CONTEXT", context_json)
            .env("SLOTPOOL_ROBOT", run.name())
            .env("SLOTPOOL_EPOCH", run.epoch().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            RobotError::Crashed(format!("cannot start command {:?}: {e}", spec.command))
        })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let name = run.name().to_string();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                tracing::warn!(robot = %name, stream = "stderr", "{l}");
            }
        });
        let mut lines = BufReader::new(stdout).lines();
        let result = supervise_child(&run, &mut child, &mut lines).await;
        if result.is_err() {
            signal_group(&child, libc::SIGKILL);
            let _ = child.wait().await;
        }
        result
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
    child: &mut Child,
    lines: &mut Lines,
) -> Result<(), RobotError> {
    loop {
        tokio::select! {
            _ = run.stop().cancelled() => return stop_child(run, child, lines).await,
            line = lines.next_line() => match line {
                Ok(Some(l)) => handle_line(run, l).await?,
                Ok(None) | Err(_) => break,
            },
        }
    }
    // stdout closed: the command is exiting (or detached its output).
    tokio::select! {
        _ = run.stop().cancelled() => stop_child(run, child, lines).await,
        status = child.wait() => Err(RobotError::Crashed(match status {
            Ok(s) => format!("command exited: {s}"),
            Err(e) => format!("command lost: {e}"),
        })),
    }
}

/// SIGTERM, keep persisting what it prints, SIGKILL at the end of the grace.
async fn stop_child(
    run: &RobotRun,
    child: &mut Child,
    lines: &mut Lines,
) -> Result<(), RobotError> {
    let deadline = Instant::now() + run.grace();
    signal_group(child, libc::SIGTERM);
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
    match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            tracing::warn!(robot = %run.name(), grace_ms = run.grace().as_millis() as u64, "did not exit after SIGTERM; sending SIGKILL");
            signal_group(child, libc::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
    // Anything in the group still alive after its leader exited gets killed too.
    signal_group(child, libc::SIGKILL);
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
    }

    #[test]
    fn policy() {
        let p = ExecPolicy::only(vec!["/opt/robots/".into(), "/usr/bin/python3".into()]);
        assert!(p.permits("/opt/robots/a.sh"));
        assert!(p.permits("/usr/bin/python3"));
        assert!(!p.permits("/opt/robots/../../bin/sh"));
        assert!(!p.permits("/bin/sh"));
        assert!(ExecPolicy::allow_all().permits("anything"));
    }
}
