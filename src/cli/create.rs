//! `slotpool robot create`: the flags become a [`NewRobots`] request for
//! [`crate::pool::create`], which checks, places and inserts the robots and finishes
//! cleanly whatever happens half-way; this prints what it did.

use anyhow::{bail, Context as _};
use bson::Document;
use clap::Args;

use super::output::print_json;
use crate::db::store::Store;
use crate::pool::create::{self, CreateError, NewRobots, MAX_COUNT};

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// Robot name (unique). With --count C > 1: NAME-1 … NAME-C.
    #[arg(long)]
    name: String,
    /// Robot kind: `counter`, `exec`, or one registered by your own worker build
    /// (with --unchecked).
    #[arg(long)]
    kind: String,
    #[command(flatten)]
    spec: SpecArgs,
    /// How many robots to create. Rerun the same command after an interruption:
    /// robots that exist with this kind and spec are kept, the rest are created.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// How slots are chosen: `load` (the default) sends each robot to the slot whose
    /// holder has the lowest load score, counting what the slot's robots cost and
    /// what this robot's limits declare (--cpu, --memory); a slot with no live holder
    /// measuring its load makes it place by robot counts, as `count` always does.
    #[arg(long, value_enum, default_value_t = crate::pool::placement::PlaceBy::Load)]
    by: crate::pool::placement::PlaceBy,
    /// Accept a kind this CLI does not know (a custom kind of your own worker build).
    #[arg(long)]
    unchecked: bool,
    /// Print the robots created, and their slots, as JSON.
    #[arg(long)]
    json: bool,
}

/// A robot's spec from the command line: `--spec` whole, then the shorthands.
#[derive(Debug, Args)]
pub(crate) struct SpecArgs {
    /// The kind's settings as a JSON object, e.g. '{"interval_ms": 500}' or
    /// '{"command": "/opt/robots/poll.sh", "args": ["--fast"]}'. Every kind also
    /// reads "history" and "restart" ({"on": "always", "attempts": 10, "within":
    /// "10m", "max_backoff": "1m"}); exec reads "heartbeat_timeout" ("30s") and "limits"
    /// ({"memory": "256MB", "pids": 64, "cpu": 0.5}).
    #[arg(long)]
    spec: Option<String>,
    /// counter: milliseconds between steps (sets spec.interval_ms).
    #[arg(long)]
    interval_ms: Option<i64>,
    /// exec: the program to run (sets spec.command). Workers run it only if their
    /// --exec-allow names it or its directory.
    #[arg(long)]
    command: Option<String>,
    /// exec: one argument for the program; repeat for more (sets spec.args).
    #[arg(long = "arg", allow_hyphen_values = true)]
    args: Vec<String>,
    /// Keep the last N checkpoint records (seq, epoch, worker, time) in the robot's
    /// `history` (sets spec.history).
    #[arg(long)]
    history: Option<i64>,
    /// exec: the most memory its processes may use, e.g. 256MB or 1GiB (sets
    /// spec.limits.memory; see docs/robots.md on resource limits).
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// exec: the most processes it may have at once (sets spec.limits.pids).
    #[arg(long, value_name = "N")]
    pids: Option<i64>,
    /// exec: the most cores it may use, e.g. 0.5 (sets spec.limits.cpu).
    #[arg(long, value_name = "CORES")]
    cpu: Option<f64>,
    /// Which ends start the robot again (sets spec.restart.on): `always` (a daemon,
    /// the default), `failure` (an exit 0 completes it: it is never started again
    /// until `robot restart`), or `never` (its run ends it either way: a failure is final too).
    #[arg(long, value_name = "WHEN", value_parser = ["always", "failure", "never"])]
    restart_on: Option<String>,
    /// Run on a schedule: a cron pattern, 5 fields ("0 3 * * *"), 6 with seconds
    /// first, or @hourly, @daily, @weekly, @monthly, @yearly (sets
    /// spec.schedule.cron). Each firing runs once, to its end.
    #[arg(long, value_name = "CRON", conflicts_with = "every")]
    schedule: Option<String>,
    /// Run on a schedule every so long, aligned to the Unix epoch, e.g. 30s or 1h
    /// (sets spec.schedule.every).
    #[arg(long, value_name = "DURATION")]
    every: Option<String>,
    /// The IANA time zone of --schedule, e.g. Europe/Berlin (default UTC; sets
    /// spec.schedule.timezone).
    #[arg(long, value_name = "ZONE")]
    timezone: Option<String>,
    /// What a firing does while a run is in flight (sets spec.schedule.overlap):
    /// skip (the default), buffer_one, buffer_all, cancel_other, allow.
    #[arg(long, value_name = "POLICY", value_parser = ["skip", "buffer_one", "buffer_all", "cancel_other", "allow"])]
    overlap: Option<String>,
    /// How late a firing may still start after downtime, e.g. 10m (the default),
    /// up to 7d; older ones are recorded missed (sets spec.schedule.catchup).
    #[arg(long, value_name = "DURATION")]
    catchup: Option<String>,
    /// What a run cut off by its holder's lost lease becomes (sets
    /// spec.schedule.on_lost): retry (the default) or skip.
    #[arg(long, value_name = "WHAT", value_parser = ["retry", "skip"])]
    on_lost: Option<String>,
}

/// Sets `spec.FIELD.key`, keeping the rest of `spec.FIELD` (the whole spec is
/// checked afterwards).
fn set_within(spec: &mut Document, field: &str, key: &str, value: bson::Bson) {
    let mut current = match spec.get(field) {
        Some(bson::Bson::Document(d)) => d.clone(),
        _ => Document::new(),
    };
    current.insert(key, value);
    spec.insert(field, current);
}

impl SpecArgs {
    /// `--spec` if given, else `base`; then the shorthands on top.
    pub(crate) fn build(&self, base: Document) -> anyhow::Result<Document> {
        let mut spec = match &self.spec {
            None => base,
            Some(text) => {
                let v: serde_json::Value = serde_json::from_str(text)
                    .with_context(|| format!("--spec is not valid JSON: {text}"))?;
                if !v.is_object() {
                    bail!("--spec must be a JSON object, like '{{\"interval_ms\": 500}}'");
                }
                bson::to_document(&v).context("--spec cannot be stored")?
            }
        };
        if let Some(ms) = self.interval_ms {
            spec.insert("interval_ms", ms);
        }
        if let Some(c) = &self.command {
            spec.insert("command", c.as_str());
        }
        if !self.args.is_empty() {
            spec.insert("args", self.args.clone());
        }
        if let Some(h) = self.history {
            spec.insert("history", h);
        }
        let limits: [(&str, Option<bson::Bson>); 3] = [
            ("memory", self.memory.clone().map(Into::into)),
            ("pids", self.pids.map(Into::into)),
            ("cpu", self.cpu.map(Into::into)),
        ];
        for (field, value) in limits {
            if let Some(value) = value {
                set_within(&mut spec, crate::robot::limits::SPEC_FIELD, field, value);
            }
        }
        let schedule: [(&str, &Option<String>); 6] = [
            ("cron", &self.schedule),
            ("every", &self.every),
            ("timezone", &self.timezone),
            ("overlap", &self.overlap),
            ("catchup", &self.catchup),
            ("on_lost", &self.on_lost),
        ];
        // A new pattern replaces the other kind of pattern (an update from cron to
        // every, or back).
        let replaced: &[&str] = match (&self.schedule, &self.every) {
            (Some(_), _) => &["every"],
            (_, Some(_)) => &["cron", "timezone"],
            _ => &[],
        };
        if let Some(bson::Bson::Document(s)) = spec.get_mut(crate::robot::schedule::SPEC_FIELD) {
            for k in replaced {
                s.remove(*k);
            }
        }
        for (field, value) in schedule {
            if let Some(v) = value {
                set_within(
                    &mut spec,
                    crate::robot::schedule::SPEC_FIELD,
                    field,
                    v.as_str().into(),
                );
            }
        }
        if let Some(on) = &self.restart_on {
            set_within(
                &mut spec,
                crate::robot::restart::SPEC_FIELD,
                "on",
                on.as_str().into(),
            );
        }
        Ok(spec)
    }

    /// Whether any flag sets the spec.
    pub(crate) fn any(&self) -> bool {
        self.spec.is_some()
            || self.interval_ms.is_some()
            || self.command.is_some()
            || !self.args.is_empty()
            || self.history.is_some()
            || self.memory.is_some()
            || self.pids.is_some()
            || self.cpu.is_some()
            || self.restart_on.is_some()
            || self.schedule.is_some()
            || self.every.is_some()
            || self.timezone.is_some()
            || self.overlap.is_some()
            || self.catchup.is_some()
            || self.on_lost.is_some()
    }
}

pub(crate) async fn run(store: &Store, args: CreateArgs) -> anyhow::Result<()> {
    if args.count == 0 || args.count > MAX_COUNT {
        bail!(
            "--count must be between 1 and {MAX_COUNT}, got {}",
            args.count
        );
    }
    let req = NewRobots {
        names: NewRobots::names(&args.name, args.count),
        kind: args.kind.clone(),
        spec: args.spec.build(Document::new())?,
        unchecked: args.unchecked,
        by: args.by,
    };
    let total = req.names.len();
    let done = match create::create(store, &req, &crate::pool::actions::Actor::cli()).await {
        Ok(done) => done,
        Err(CreateError::Invalid(e)) if e.starts_with("name: ") => bail!("--{e}"),
        Err(e) if e.again() => bail!(
            "{e}. Rerun the same command (once the database is back): robots that exist are kept and the rest are created."
        ),
        Err(e) => return Err(e.into()),
    };
    if done.created.is_empty() {
        say!("all {total} robot(s) exist already with this kind and spec; nothing to do");
        return Ok(());
    }
    if done.existing > 0 {
        say!(
            "{} of {total} robot(s) exist already with this kind and spec; creating the other {}",
            done.existing,
            done.created.len()
        );
    }
    if done.no_worker {
        eprintln!("warning: no worker is alive; the robots start when one is (slotpool worker)");
    }
    let (names, slots): (Vec<String>, Vec<String>) = done.created.into_iter().unzip();
    report_created(&names, &slots, args.json);
    Ok(())
}

fn report_created(names: &[String], slots: &[String], as_json: bool) {
    if as_json {
        let created = names
            .iter()
            .zip(slots)
            .map(|(name, slot)| super::replies::CreatedRobot { name, slot })
            .collect();
        print_json(&super::replies::Created { created });
        return;
    }
    if names.len() <= 10 {
        for (n, s) in names.iter().zip(slots) {
            say!("created {n} on {s}");
        }
    } else {
        let mut per: std::collections::BTreeMap<&String, usize> = Default::default();
        for s in slots {
            *per.entry(s).or_default() += 1;
        }
        let spread: Vec<String> = per.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        say!("created {} robots ({})", names.len(), spread.join(", "));
    }
}
