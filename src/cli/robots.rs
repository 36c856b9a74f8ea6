use bson::{doc, Bson};
use clap::Subcommand;
use serde::Serialize;
use serde_json::json;

use super::output::{age, int, print_json, print_table};
use super::replies;
use crate::db::robot_doc::RobotDoc;
use crate::db::store::Store;
use crate::pool::actions::{self, Actor};
use crate::pool::view::{self as state, slot_rows, RobotNow, RobotState};

use super::create::{CreateArgs, SpecArgs};

#[derive(Debug, clap::Args)]
pub(crate) struct UpdateArgs {
    /// The robot's name.
    name: String,
    /// A new kind; refused unless the robot's context carries over to it.
    #[arg(long)]
    kind: Option<String>,
    #[command(flatten)]
    spec: SpecArgs,
    /// Show what would change, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// How long to wait for the holder's answer.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    wait: std::time::Duration,
    /// Print the outcome as JSON: the changes, and whether and where it applied.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RobotCommand {
    /// Create robots bound to the least-loaded live slot(s).
    Create(CreateArgs),
    /// Change a robot's spec (and kind, where its context carries over) in place,
    /// keeping its context. Its holder checks the change against what it may run;
    /// if it applies it, the running instance stops after a last checkpoint and
    /// starts again with the new spec under a new generation. Without --spec, the
    /// shorthand flags change the current spec field by field.
    Update(UpdateArgs),
    /// All robots with slot, holder, status and last checkpoint age.
    List {
        /// Only this slot's robots.
        #[arg(long)]
        slot: Option<String>,
        /// Print the list as JSON: {"robots": [one object per robot]}.
        #[arg(long)]
        json: bool,
    },
    /// One robot's whole document (context included) and its holder.
    Show {
        /// The robot's name.
        name: String,
        /// Print the whole document as JSON (relaxed extended JSON), with its state and holder.
        #[arg(long)]
        json: bool,
    },
    /// A robot's latest output: the last lines (up to 200) its program wrote that were
    /// not checkpoints, stdout and stderr, as kept by its holder about once a second.
    /// Only `exec` robots write output.
    Logs {
        /// The robot's name.
        name: String,
        /// Show at most this many of the kept lines.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=200))]
        lines: u32,
        /// Keep printing new lines as they are kept (Ctrl-C to stop); ends when the
        /// robot is deleted.
        #[arg(long, short)]
        follow: bool,
        /// One JSON object per line: {"gen", "n", "at", "stream", "text"}.
        #[arg(long)]
        json: bool,
    },
    /// Delete a robot; its holder stops it within a tick (a few more while the
    /// database is busy). Its context is gone.
    Delete {
        /// The robot's name.
        name: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Bind a robot to another slot; the old holder stops it, the new one starts it
    /// from its last checkpoint.
    Move {
        /// The robot's name.
        name: String,
        /// Destination slot id, e.g. slot-002.
        #[arg(long)]
        to: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a robot (after a last checkpoint) and keep it stopped.
    Pause {
        /// The robot's name.
        name: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a paused or failed robot again from its context, with a fresh restart
    /// budget.
    Resume {
        /// The robot's name.
        name: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a robot afresh from its context: a running one stops after a last
    /// checkpoint and starts again (new generation, fresh restart budget); a paused or
    /// failed one runs again.
    Restart {
        /// The robot's name.
        name: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a scheduled robot once more now ("run now"), under its overlap policy and
    /// fence; its run is recorded as triggered, with who asked.
    Trigger {
        /// The robot's name.
        name: String,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A scheduled robot's last runs, newest first: firing, attempt, outcome
    /// (succeeded, failed, lost, stopped, cancelled, skipped, missed), lateness,
    /// worker and why; with its next firing and what is in flight.
    Runs {
        /// The robot's name.
        name: String,
        /// Show at most this many runs.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Print the runs, the next firing and what is in flight as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(store: &Store, cmd: RobotCommand) -> anyhow::Result<()> {
    match cmd {
        RobotCommand::Create(args) => super::create::run(store, args).await,
        RobotCommand::Update(args) => update(store, args).await,
        RobotCommand::List { slot, json } => list(store, slot, json).await,
        RobotCommand::Show { name, json } => show(store, &name, json).await,
        RobotCommand::Logs {
            name,
            lines,
            follow,
            json,
        } => super::logs::run(store, &name, lines as usize, follow, json).await,
        RobotCommand::Delete { name, json } => delete(store, &name, json).await,
        RobotCommand::Move { name, to, json } => move_to(store, &name, &to, json).await,
        RobotCommand::Pause { name, json } => set_paused(store, &name, true, json).await,
        RobotCommand::Resume { name, json } => set_paused(store, &name, false, json).await,
        RobotCommand::Restart { name, json } => restart(store, &name, json).await,
        RobotCommand::Trigger { name, json } => super::runs::trigger(store, &name, json).await,
        RobotCommand::Runs { name, limit, json } => {
            super::runs::runs(store, &name, limit as usize, json).await
        }
    }
}

/// One robot in `robot list --json`. The field names are the CLI's promise to
/// scripts, pinned by `robot_list_json_keeps_its_field_names` below.
#[derive(Debug, Serialize)]
struct ListedRobot {
    name: Option<String>,
    kind: Option<String>,
    slot: Option<String>,
    holder: Option<String>,
    state: RobotState,
    why: Option<String>,
    /// What its last holder wrote.
    status: Option<String>,
    error: Option<String>,
    paused: bool,
    seq: Option<i64>,
    epoch: Option<i64>,
    gen: Option<i64>,
    restarts: Option<i64>,
    /// Since its last checkpoint, on the server's clock.
    checkpoint_age_ms: Option<i64>,
}

/// `robot list --json`.
#[derive(Debug, Serialize)]
struct RobotList {
    robots: Vec<ListedRobot>,
}

impl ListedRobot {
    fn new(robot: RobotDoc, now: RobotNow, checkpoint_age_ms: Option<i64>) -> ListedRobot {
        ListedRobot {
            name: robot.name,
            kind: robot.kind,
            slot: robot.slot_id,
            holder: now.holder,
            state: now.state,
            why: now.why,
            status: robot.status_text,
            error: robot.error,
            paused: robot.paused,
            seq: robot.seq,
            epoch: robot.epoch,
            gen: robot.gen,
            restarts: robot.restarts,
            checkpoint_age_ms,
        }
    }

    /// Its row in the table: the state, with the reason where it is not running.
    fn row(&self) -> Vec<String> {
        let mut state = self.state.to_string();
        match (self.state, &self.error, &self.why) {
            (RobotState::Restarting | RobotState::Failed, Some(e), _) => {
                state = format!("{state}: {e}")
            }
            (RobotState::Waiting, _, Some(why)) => state = format!("{state}: {why}"),
            _ => {}
        }
        vec![
            self.name.clone().unwrap_or_default(),
            self.kind.clone().unwrap_or_default(),
            self.slot.clone().unwrap_or_default(),
            self.holder.clone().unwrap_or_else(|| "-".into()),
            self.seq.map_or("-".into(), |s| s.to_string()),
            age(self.checkpoint_age_ms),
            state,
        ]
    }
}

async fn list(store: &Store, slot: Option<String>, as_json: bool) -> anyhow::Result<()> {
    let slots = state::slot_views(&slot_rows(store).await?);
    let docs = crate::db::listing::robots_listed(store, slot.as_deref()).await?;
    let robots: Vec<ListedRobot> = docs
        .iter()
        .map(|d| {
            let robot = RobotDoc::from_doc(d);
            let now = RobotNow::of(&robot, &slots);
            ListedRobot::new(robot, now, int(d, "checkpoint_age_ms"))
        })
        .collect();
    if as_json {
        print_json(&RobotList { robots });
        return Ok(());
    }
    if robots.is_empty() {
        say!(
            "no robots{}",
            slot.map(|s| format!(" on {s}")).unwrap_or_default()
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = robots.iter().map(ListedRobot::row).collect();
    print_table(
        &[
            "NAME",
            "KIND",
            "SLOT",
            "HOLDER",
            "SEQ",
            "CHECKPOINT",
            "STATE",
        ],
        &rows,
    );
    Ok(())
}

async fn show(store: &Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    let full = super::connect::find_robot(store, name, &[]).await?;
    let slots = state::slot_views(&slot_rows(store).await?);
    let st = RobotNow::of(&RobotDoc::from_doc(&full), &slots);
    let limits = crate::robot::limits::describe_stored(&full);
    // A scheduled robot: its schedule in words and its next firing (its last runs
    // are in the document's `runs`).
    let now = store.server_now().await?.timestamp_millis();
    let scheduled = full
        .get_document(crate::db::field::SPEC)
        .ok()
        .filter(|s| s.get_document(crate::robot::schedule::SPEC_FIELD).is_ok())
        .map(
            |spec| match crate::robot::schedule::Schedule::from_spec(spec, now) {
                Ok(Some(s)) => {
                    let st = crate::db::firing::FiringState::from_robot(&full);
                    let next = s.next_shown(st.claimed, st.running.iter().map(|e| e.firing), now);
                    (s.describe(), next.map(crate::robot::schedule::rfc3339))
                }
                Ok(None) => (String::new(), None),
                Err(e) => (format!("invalid: {e}"), None),
            },
        );
    let mut v = Bson::Document(full).into_relaxed_extjson();
    if let Some((words, next)) = scheduled {
        v["schedule"] = json!(words);
        v["next_firing"] = json!(next);
    }
    if let Some(limits) = limits {
        v["limits"] = json!(limits);
    }
    v["holder"] = json!(st.holder);
    v["state"] = json!(st.state);
    v["why"] = json!(st.why);
    if as_json {
        print_json(&v);
    } else {
        println!(
            "{}",
            crate::printable::escape_json(&serde_json::to_string_pretty(&v)?)
        );
    }
    Ok(())
}

async fn delete(store: &Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    let d = actions::delete(store, name, &Actor::cli()).await?;
    done(
        as_json,
        &replies::Deleted {
            deleted: name,
            slot: d.slot,
        },
        format!("deleted {name}"),
    );
    Ok(())
}

async fn move_to(store: &Store, name: &str, to: &str, as_json: bool) -> anyhow::Result<()> {
    let d = actions::move_to(store, name, to, &Actor::cli()).await?;
    let from = d.slot.unwrap_or_default();
    let line = if d.changed {
        format!("moved {name} from {from} to {to}")
    } else if d.repaired {
        format!("{name} is already on {to} but was never started there (an earlier move was cut off); its holder was told to start it")
    } else {
        format!("{name} is already on {to}")
    };
    done(
        as_json,
        &replies::Moved {
            moved: name,
            from: from.clone(),
            to,
            changed: d.changed,
            repaired: d.repaired,
        },
        line,
    );
    Ok(())
}

async fn set_paused(store: &Store, name: &str, paused: bool, as_json: bool) -> anyhow::Result<()> {
    let d = actions::set_paused(store, name, paused, &Actor::cli()).await?;
    let word = if paused { "paused" } else { "resumed" };
    let line = format!("{word} {name}");
    if paused {
        let reply = replies::Paused {
            paused: name,
            slot: d.slot,
        };
        done(as_json, &reply, line);
    } else {
        let reply = replies::Resumed {
            resumed: name,
            slot: d.slot,
        };
        done(as_json, &reply, line);
    }
    Ok(())
}

async fn restart(store: &Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    let d = actions::restart(store, name, &Actor::cli()).await?;
    let slot = d.slot.clone().unwrap_or_default();
    done(
        as_json,
        &replies::Restarted {
            restarted: name,
            slot: d.slot,
        },
        format!("restarting {name}: its holder on {slot} stops it after a last checkpoint and starts it again within a tick or two (a few more while the database is busy)"),
    );
    Ok(())
}

async fn update(store: &Store, args: UpdateArgs) -> anyhow::Result<()> {
    if !args.spec.any() && args.kind.is_none() {
        anyhow::bail!("nothing to change: give --spec JSON, a shorthand (--interval-ms, --command, --arg, --history) or --kind");
    }
    let current = crate::db::robots::by_name(store, &args.name, &[crate::db::field::SPEC])
        .await?
        .ok_or_else(|| actions::ActionError::NoRobot(args.name.clone()))?;
    let base = current
        .get_document(crate::db::field::SPEC)
        .cloned()
        .unwrap_or_default();
    let spec = args.spec.build(base)?;
    let asked = actions::update(
        store,
        &args.name,
        args.kind.as_deref(),
        spec,
        args.dry_run,
        &Actor::cli(),
    )
    .await?;
    let name = &args.name;
    if asked.changes.is_empty() {
        done(
            args.json,
            &replies::Updated {
                updated: name,
                changes: &[],
                applied: false,
                worker: None,
            },
            format!("{name}: nothing would change"),
        );
        return Ok(());
    }
    let Some(id) = asked.id else {
        if args.json {
            print_json(&replies::DryRun {
                dry_run: true,
                robot: name,
                changes: &asked.changes,
            });
        } else {
            say!("{name} (dry run; nothing changed):");
            for c in &asked.changes {
                say!("  {c}");
            }
        }
        return Ok(());
    };
    let until = std::time::Instant::now() + args.wait;
    let answer = loop {
        if let Some(a) = actions::update_answer(store, name, id).await? {
            break Some(a);
        }
        if std::time::Instant::now() >= until {
            break None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    match answer {
        Some(a) if a.applied => done(
            args.json,
            &replies::Updated {
                updated: name,
                changes: &asked.changes,
                applied: true,
                worker: Some(a.worker.clone()),
            },
            format!(
                "updated {name} ({}); {} restarts it with the new spec after a last checkpoint",
                asked.changes.join("; "),
                a.worker.as_deref().unwrap_or("its holder")
            ),
        ),
        Some(a) => anyhow::bail!(
            "update of {name} refused by {}: {}; nothing changed",
            a.worker.as_deref().unwrap_or("its holder"),
            a.why.as_deref().unwrap_or("no reason given")
        ),
        None => anyhow::bail!(
            "asked to update {name} on {}, but no holder answered within {}: is a worker alive (slotpool slots list)? \
             The update waits in the robot's document and applies when its slot's holder reads it",
            asked.slot,
            humantime::format_duration(args.wait)
        ),
    }
    Ok(())
}

fn done(as_json: bool, v: &impl serde::Serialize, line: String) {
    if as_json {
        print_json(v);
    } else {
        say!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a JSON object, sorted.
    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
        k.sort();
        k
    }

    /// Scripts read `robot list --json` by these names: a rename must fail here first.
    #[test]
    fn robot_list_json_keeps_its_field_names() {
        let robot = RobotDoc::from_doc(&doc! {"name": "r1", "slot_id": "slot-001"});
        let now = RobotNow {
            state: RobotState::Waiting,
            holder: None,
            why: Some("no live worker holds slot-001".into()),
        };
        let v = serde_json::to_value(RobotList {
            robots: vec![ListedRobot::new(robot, now, Some(5))],
        })
        .unwrap();
        assert_eq!(keys(&v), ["robots"]);
        let row = &v["robots"][0];
        assert_eq!(
            keys(row),
            [
                "checkpoint_age_ms",
                "epoch",
                "error",
                "gen",
                "holder",
                "kind",
                "name",
                "paused",
                "restarts",
                "seq",
                "slot",
                "state",
                "status",
                "why",
            ]
        );
        assert_eq!(row["state"], "waiting");
        assert_eq!(
            (row["name"].as_str(), row["slot"].as_str()),
            (Some("r1"), Some("slot-001"))
        );
    }
}
