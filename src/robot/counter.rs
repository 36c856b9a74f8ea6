//! `counter`: checkpoints `n + 1` every interval, so a lost or doubled step shows up
//! directly in `context.n` against `seq`; tests and demos rely on it.
//!
//! Spec: `{"interval_ms": 1000, "history": 0, "eager": false}` (all optional); with
//! `eager` the first step comes at once on every (re)start. On a schedule it takes one
//! step per firing, `{"n": n + 1, "firing": T}`, written with the run's end
//! ([`super::RobotRun::end_with`]), and skips a firing `T` its context already records,
//! so `n` counts each firing that ran once, even if runs come out of order.

use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, Document};

use super::{RobotError, RobotKind, RobotRun};

pub(crate) const DEFAULT_INTERVAL_MS: i64 = 1000;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counter;

fn interval(spec: &Document) -> Result<Duration, String> {
    let ms = match spec.get("interval_ms") {
        None => DEFAULT_INTERVAL_MS,
        Some(Bson::Int32(v)) => *v as i64,
        Some(Bson::Int64(v)) => *v,
        Some(other) => {
            return Err(format!(
                "spec.interval_ms must be an integer, found {other}"
            ))
        }
    };
    if !(10..=86_400_000).contains(&ms) {
        return Err(format!(
            "spec.interval_ms must be between 10 and 86400000, got {ms}"
        ));
    }
    Ok(Duration::from_millis(ms as u64))
}

fn check_known_fields(spec: &Document) -> Result<(), String> {
    for key in spec.keys() {
        if !["interval_ms", "eager"].contains(&key.as_str())
            && !super::COMMON_SPEC_FIELDS.contains(&key.as_str())
        {
            return Err(format!(
                "unknown counter spec field {:?} (known: interval_ms, eager, {})",
                crate::printable::escape(key),
                super::COMMON_SPEC_FIELDS.join(", ")
            ));
        }
    }
    if let Some(e) = spec.get("eager") {
        if !matches!(e, Bson::Boolean(_)) {
            return Err(format!("spec.eager must be true or false, found {e}"));
        }
    }
    Ok(())
}

#[async_trait]
impl RobotKind for Counter {
    fn name(&self) -> &str {
        "counter"
    }

    fn check_spec(&self, spec: &Document) -> Result<(), String> {
        check_known_fields(spec)?;
        interval(spec).map(|_| ())
    }

    fn check_context(&self, _spec: &Document, context: &Document) -> Result<(), String> {
        match context.get("n") {
            Some(other) if crate::db::store::int(context, "n").is_none() => Err(format!(
                "a counter counts in context.n, which here is {other}, not a whole number"
            )),
            _ => Ok(()),
        }
    }

    async fn run(&self, run: RobotRun) -> Result<(), RobotError> {
        let every = interval(run.spec()).map_err(RobotError::Invalid)?;
        let mut n = match (
            run.context().get("n"),
            crate::db::store::int(run.context(), "n"),
        ) {
            (None, _) => 0,
            (Some(_), Some(n)) => n,
            (Some(other), None) => {
                return Err(RobotError::Invalid(format!(
                    "context.n must be an integer, found {other}"
                )))
            }
        };
        if let Some(firing) = run.firing() {
            // On a schedule: one step per firing. A firing run again (its first run
            // was lost with its lease after the step landed) finds its step done.
            // Its step lands with the run's end, in one write (`end_with`): it ran
            // to its end, stop or not.
            let done = crate::db::store::int(run.context(), "firing") == Some(firing);
            if done {
                return Err(RobotError::Finished);
            }
            return Err(run.end_with(doc! {"n": n + 1, "firing": firing}).await);
        }
        let mut wait = if run.spec().get_bool("eager").unwrap_or(false) {
            std::time::Duration::ZERO
        } else {
            every
        };
        loop {
            tokio::select! {
                _ = run.stop().cancelled() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
            wait = every;
            // Do not start a step once asked to stop: the last checkpoint stands.
            if run.stop().is_cancelled() {
                return Ok(());
            }
            n += 1;
            run.checkpoint(doc! {"n": n}).await?;
        }
    }
}
