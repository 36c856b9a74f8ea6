use anyhow::{bail, Context as _};
use bson::{doc, oid::ObjectId, Bson, Document};
use clap::{Args, Subcommand};
use futures::TryStreamExt;
use serde_json::json;

use std::collections::HashMap;

use super::slots::slot_rows;
use super::state::{self, RobotState, SlotView};
use super::{age, int, print_json, print_table, text};
use crate::placement;
use crate::robot::Registry;
use crate::store::{is_duplicate_key, Store};

/// At most this many robots per `create` call.
const MAX_COUNT: u32 = 100_000;

#[derive(Debug, Subcommand)]
pub enum RobotCommand {
    /// Create robots bound to the least-loaded live slot(s).
    Create(CreateArgs),
    /// All robots with slot, holder, status and last checkpoint age.
    List {
        /// Only this slot's robots.
        #[arg(long)]
        slot: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One robot's whole document (context included) and its holder.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a robot; its holder stops it within a tick. Its context is gone.
    Delete {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Bind a robot to another slot; the old holder stops it, the new one starts it
    /// from its last checkpoint.
    Move {
        name: String,
        /// Destination slot id, e.g. slot-002.
        #[arg(long)]
        to: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop a robot (after a last checkpoint) and keep it stopped.
    Pause {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Start a paused robot again from its context.
    Resume {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Robot name (unique). With --count C > 1: NAME-1 … NAME-C.
    #[arg(long)]
    name: String,
    /// Robot kind: `counter`, `exec`, or one registered by your own worker build
    /// (with --unchecked).
    #[arg(long)]
    kind: String,
    /// The kind's settings as a JSON object, e.g. '{"interval_ms": 500}' or
    /// '{"command": "/opt/robots/poll.sh", "args": ["--fast"]}'.
    #[arg(long)]
    spec: Option<String>,
    /// counter: milliseconds between steps (sets spec.interval_ms).
    #[arg(long)]
    interval_ms: Option<i64>,
    /// exec: the program to run (sets spec.command).
    #[arg(long)]
    command: Option<String>,
    /// exec: one argument for the program; repeat for more (sets spec.args).
    #[arg(long = "arg", allow_hyphen_values = true)]
    args: Vec<String>,
    /// Keep the last N checkpoint records (seq, epoch, worker, time) in the robot's
    /// `history` (sets spec.history).
    #[arg(long)]
    history: Option<i64>,
    /// How many robots to create.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Accept a kind this CLI does not know (a custom kind of your own worker build).
    #[arg(long)]
    unchecked: bool,
    #[arg(long)]
    json: bool,
}

pub async fn run(store: &Store, cmd: RobotCommand) -> anyhow::Result<()> {
    match cmd {
        RobotCommand::Create(args) => create(store, args).await,
        RobotCommand::List { slot, json } => list(store, slot, json).await,
        RobotCommand::Show { name, json } => show(store, &name, json).await,
        RobotCommand::Delete { name, json } => delete(store, &name, json).await,
        RobotCommand::Move { name, to, json } => move_to(store, &name, &to, json).await,
        RobotCommand::Pause { name, json } => set_paused(store, &name, true, json).await,
        RobotCommand::Resume { name, json } => set_paused(store, &name, false, json).await,
    }
}

fn build_spec(args: &CreateArgs) -> anyhow::Result<Document> {
    let mut spec = match &args.spec {
        None => Document::new(),
        Some(text) => {
            let v: serde_json::Value = serde_json::from_str(text)
                .with_context(|| format!("--spec is not valid JSON: {text}"))?;
            if !v.is_object() {
                bail!("--spec must be a JSON object, like '{{\"interval_ms\": 500}}'");
            }
            bson::to_document(&v).context("--spec cannot be stored")?
        }
    };
    if let Some(ms) = args.interval_ms {
        spec.insert("interval_ms", ms);
    }
    if let Some(c) = &args.command {
        spec.insert("command", c.as_str());
    }
    if !args.args.is_empty() {
        spec.insert("args", args.args.clone());
    }
    if let Some(h) = args.history {
        spec.insert("history", h);
    }
    Ok(spec)
}

fn names(base: &str, count: u32) -> Vec<String> {
    if count == 1 {
        vec![base.to_string()]
    } else {
        (1..=count).map(|i| format!("{base}-{i}")).collect()
    }
}

async fn create(store: &Store, args: CreateArgs) -> anyhow::Result<()> {
    if args.count == 0 || args.count > MAX_COUNT {
        bail!(
            "--count must be between 1 and {MAX_COUNT}, got {}",
            args.count
        );
    }
    let names = names(&args.name, args.count);
    for n in [names.first(), names.last()].into_iter().flatten() {
        crate::printable::check_name(n).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    }
    let spec = build_spec(&args)?;
    if let Err(e) = Registry::builtin().check(&args.kind, &spec) {
        let unknown = Registry::builtin().get(&args.kind).is_none();
        if !(unknown && args.unchecked) {
            if unknown {
                bail!("{e} (a kind registered by your own worker build: add --unchecked)");
            }
            bail!("invalid spec for kind {:?}: {e}", args.kind);
        }
    }
    // A rerun after an interrupted create finishes it: robots that exist with the
    // same kind and spec are kept, the rest are created. Any other robot of one
    // of these names is a conflict.
    let existing = existing_robots(store, &names).await?;
    let mut conflicts = Vec::new();
    for d in existing.values() {
        if text(d, "kind").as_deref() != Some(args.kind.as_str())
            || d.get_document("spec").ok() != Some(&spec)
        {
            conflicts.push(text(d, "name").unwrap_or_default());
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort();
        conflicts.truncate(10);
        bail!(
            "a robot named {} already exists with another kind or spec; names are unique",
            conflicts.join(", ")
        );
    }
    let todo: Vec<String> = names
        .iter()
        .filter(|n| !existing.contains_key(*n))
        .cloned()
        .collect();
    if todo.is_empty() {
        say!(
            "all {} robot(s) exist already with this kind and spec; nothing to do",
            names.len()
        );
        return Ok(());
    }
    if !existing.is_empty() {
        say!(
            "{} of {} robot(s) exist already with this kind and spec; creating the other {}",
            existing.len(),
            names.len(),
            todo.len()
        );
    }
    let placement = placement::reserve(store, todo.len()).await?;
    if super::slots::live_workers(store).await?.is_empty() {
        eprintln!("warning: no worker is alive; the robots start when one is (slotpool worker)");
    }
    let now = store.server_now().await?;
    let docs: Vec<Document> = todo
        .iter()
        .zip(&placement.slots)
        .map(|(name, slot)| {
            doc! {
                "_id": ObjectId::new(), "name": name, "kind": &args.kind, "spec": spec.clone(),
                "slot_id": slot, "epoch": 0_i64, "context": {}, "seq": 0_i64, "paused": false,
                "status": "pending", "error": Bson::Null, "restarts": 0_i64, "worker": Bson::Null,
                "created_at": now, "checkpointed_at": Bson::Null,
            }
        })
        .collect();
    let error = insert_all(store, &docs).await.err();
    let ids: Vec<ObjectId> = docs
        .iter()
        .filter_map(|d| d.get_object_id("_id").ok())
        .collect();
    let settled = settle(store, &ids, &placement.slots, error.is_none()).await;
    let inserted = match (&error, settled) {
        (None, Ok(n)) => n,
        (_, Err(e)) => bail!(
            "could not tell how many of {} robots were created: the database did not answer for {}s ({}). \
             Rerun the same command when it is back: robots that exist are kept and the rest are created. \
             The slots' robot counts may be too high meanwhile: ten minutes on, `slotpool init --slots N` \
             (N: the current slot count) makes them true again.",
            docs.len(),
            PATIENCE.as_secs(),
            crate::store::brief(&e)
        ),
        (Some(e), Ok(n)) => {
            let why = if is_duplicate_key(e) {
                "a robot of the same name was created by someone else meanwhile".to_string()
            } else if crate::store::is_network(e) {
                format!("the database became unreachable ({})", crate::store::brief(e))
            } else {
                crate::store::brief(e)
            };
            bail!(
                "created {n} of {} robots: {why}. Rerun the same command to create the rest \
                 (robots that exist are kept); the slots' robot counts are consistent.",
                docs.len()
            );
        }
    };
    debug_assert_eq!(inserted, docs.len());
    report_created(&todo, &placement.slots, args.json);
    Ok(())
}

/// How long a create keeps trying to put its bookkeeping right while the database
/// is unreachable (a restart, a failover).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `op` until it succeeds, retrying network errors for up to [`PATIENCE`].
async fn patiently<T, F, Fut>(what: &str, mut op: F) -> Result<T, mongodb::error::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, mongodb::error::Error>>,
{
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut pause = std::time::Duration::from_millis(250);
    let mut warned = false;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if crate::store::is_network(&e) && std::time::Instant::now() < deadline => {
                if !warned {
                    eprintln!(
                        "warning: the database is unreachable while {what}; retrying for up to {}s",
                        PATIENCE.as_secs()
                    );
                    warned = true;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// After the inserts, whatever happened to them: counts which robots landed, gives
/// back the reservations of those that did not, tells the holders, and re-places
/// any robot whose slot was retired meanwhile. Returns how many landed.
async fn settle(
    store: &Store,
    ids: &[ObjectId],
    slots: &[String],
    all_landed: bool,
) -> Result<usize, mongodb::error::Error> {
    // Only a failed insert leaves doubt about what landed (an `$in` over a
    // thousand ids costs the dev server about a second: not on the happy path).
    let landed: std::collections::HashSet<ObjectId> = if all_landed {
        ids.iter().copied().collect()
    } else {
        patiently("counting the robots created", || async {
            let mut found = std::collections::HashSet::new();
            for chunk in ids.chunks(1000) {
                let mut cursor = store
                    .robots()
                    .find(doc! {"_id": {"$in": chunk}})
                    .projection(doc! {"_id": 1})
                    .await?;
                while let Some(d) = cursor.try_next().await? {
                    if let Ok(id) = d.get_object_id("_id") {
                        found.insert(id);
                    }
                }
            }
            Ok(found)
        })
        .await?
    };
    let mut unused: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    let mut used: Vec<String> = Vec::new();
    for (id, slot) in ids.iter().zip(slots) {
        if landed.contains(id) {
            used.push(slot.clone());
        } else {
            *unused.entry(slot.as_str()).or_default() += 1;
        }
    }
    for (slot, n) in unused {
        patiently("releasing reserved room", || {
            placement::adjust(store, slot, -n, false)
        })
        .await?;
    }
    if !used.is_empty() {
        patiently("telling the holders", || placement::bump_revs(store, &used)).await?;
        let landed: Vec<ObjectId> = landed.into_iter().collect();
        patiently("checking the robots' slots", || {
            placement::rescue(store, &landed, &used)
        })
        .await?;
    }
    Ok(used.len())
}

/// The robots of these names that exist, by name.
async fn existing_robots(
    store: &Store,
    names: &[String],
) -> anyhow::Result<std::collections::HashMap<String, Document>> {
    let mut found = std::collections::HashMap::new();
    for chunk in names.chunks(1000) {
        let mut cursor = store
            .robots()
            .find(doc! {"name": {"$in": chunk}})
            .projection(doc! {"name": 1, "kind": 1, "spec": 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            if let Some(n) = text(&d, "name") {
                found.insert(n, d);
            }
        }
    }
    Ok(found)
}

/// Inserts in order, a thousand at a time; stops at the first failure.
async fn insert_all(store: &Store, docs: &[Document]) -> Result<(), mongodb::error::Error> {
    for chunk in docs.chunks(1000) {
        store
            .robots()
            .insert_many(chunk.to_vec())
            .ordered(true)
            .await?;
    }
    Ok(())
}

fn report_created(names: &[String], slots: &[String], as_json: bool) {
    if as_json {
        let v: Vec<_> = names
            .iter()
            .zip(slots)
            .map(|(n, s)| json!({"name": n, "slot": s}))
            .collect();
        print_json(&json!({"created": v}));
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

async fn find(store: &Store, name: &str) -> anyhow::Result<Document> {
    store
        .robots()
        .find_one(doc! {"name": name})
        .projection(doc! {"history": 0})
        .await?
        .with_context(|| format!("no robot named {name:?}: see `slotpool robot list`"))
}

fn slot_of(d: &Document) -> anyhow::Result<String> {
    text(d, "slot_id").context("this robot's slot_id is missing or not a string; fix it by hand")
}

/// A robot document's derived state (see [`super::state`]).
fn state_of(d: &Document, slots: &HashMap<String, SlotView>) -> RobotState {
    let slot_id = text(d, "slot_id").unwrap_or_default();
    state::derive(
        &slot_id,
        d.get_str("status").ok(),
        d.get_bool("paused").unwrap_or(false),
        d.get_str("worker").ok(),
        slots.get(&slot_id),
    )
}

async fn list(store: &Store, slot: Option<String>, as_json: bool) -> anyhow::Result<()> {
    let filter = match &slot {
        Some(s) => doc! {"slot_id": s},
        None => doc! {},
    };
    let pipeline = vec![
        doc! {"$match": filter},
        doc! {"$sort": {"name": 1}},
        doc! {"$project": {
            "name": 1, "kind": 1, "slot_id": 1, "status": 1, "error": 1, "seq": 1, "paused": 1,
            "epoch": 1, "gen": 1, "restarts": 1, "worker": 1,
            "checkpoint_age_ms": {"$cond": [
                {"$eq": [{"$type": "$checkpointed_at"}, "date"]},
                {"$subtract": [{"$toLong": "$$NOW"}, {"$toLong": "$checkpointed_at"}]},
                Bson::Null,
            ]},
        }},
    ];
    let slots = state::slot_views(&slot_rows(store).await?);
    let docs: Vec<Document> = store
        .robots()
        .aggregate(pipeline)
        .await?
        .try_collect()
        .await?;
    if as_json {
        let v: Vec<_> = docs
            .iter()
            .map(|d| {
                let st = state_of(d, &slots);
                json!({
                    "name": text(d, "name"), "kind": text(d, "kind"), "slot": text(d, "slot_id"),
                    "holder": st.holder, "state": st.state, "why": st.why,
                    "status": text(d, "status"), "error": text(d, "error"),
                    "paused": d.get_bool("paused").unwrap_or(false), "seq": int(d, "seq"),
                    "epoch": int(d, "epoch"), "gen": int(d, "gen"), "restarts": int(d, "restarts"),
                    "checkpoint_age_ms": int(d, "checkpoint_age_ms"),
                })
            })
            .collect();
        print_json(&json!({"robots": v}));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = docs
        .iter()
        .map(|d| {
            let st = state_of(d, &slots);
            let mut status = st.state.to_string();
            match (st.state, text(d, "error"), &st.why) {
                ("restarting" | "failed", Some(e), _) => status = format!("{status}: {e}"),
                ("waiting", _, Some(why)) => status = format!("{status}: {why}"),
                _ => {}
            }
            vec![
                text(d, "name").unwrap_or_default(),
                text(d, "kind").unwrap_or_default(),
                text(d, "slot_id").unwrap_or_default(),
                st.holder.unwrap_or_else(|| "-".into()),
                int(d, "seq").map_or("-".into(), |s| s.to_string()),
                age(int(d, "checkpoint_age_ms")),
                status,
            ]
        })
        .collect();
    if rows.is_empty() {
        say!(
            "no robots{}",
            slot.map(|s| format!(" on {s}")).unwrap_or_default()
        );
        return Ok(());
    }
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
    let full = store
        .robots()
        .find_one(doc! {"name": name})
        .await?
        .with_context(|| format!("no robot named {name:?}: see `slotpool robot list`"))?;
    let slots = state::slot_views(&slot_rows(store).await?);
    let st = state_of(&full, &slots);
    let mut v = Bson::Document(full).into_relaxed_extjson();
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
    let d = find(store, name).await?;
    let slot = text(&d, "slot_id");
    let r = store
        .robots()
        .delete_one(doc! {"_id": d.get("_id")})
        .await?;
    if r.deleted_count == 1 {
        if let Some(s) = &slot {
            placement::adjust(store, s, -1, true).await?;
        }
    }
    done(
        as_json,
        json!({"deleted": name, "slot": slot}),
        format!("deleted {name}"),
    );
    Ok(())
}

async fn move_to(store: &Store, name: &str, to: &str, as_json: bool) -> anyhow::Result<()> {
    let d = find(store, name).await?;
    let from = slot_of(&d)?;
    if from == to {
        done(
            as_json,
            json!({"moved": name, "from": from, "to": to}),
            format!("{name} is already on {to}"),
        );
        return Ok(());
    }
    let id = d
        .get_object_id("_id")
        .context("this robot's _id is not an ObjectId; fix it by hand")?;
    let moved = placement::move_robots(store, &[id], &from, to).await?;
    if moved == 0 {
        bail!("{name} changed while moving it; try again");
    }
    done(
        as_json,
        json!({"moved": name, "from": from, "to": to}),
        format!("moved {name} from {from} to {to}"),
    );
    Ok(())
}

async fn set_paused(store: &Store, name: &str, paused: bool, as_json: bool) -> anyhow::Result<()> {
    let d = find(store, name).await?;
    let slot = slot_of(&d)?;
    let mut set = doc! {"paused": paused};
    if paused {
        set.insert("status", "paused");
    } else {
        set.insert("status", "pending");
    }
    store
        .robots()
        .update_one(doc! {"_id": d.get("_id")}, doc! {"$set": set})
        .await?;
    placement::adjust(store, &slot, 0, true).await?;
    let word = if paused { "paused" } else { "resumed" };
    done(
        as_json,
        json!({word: name, "slot": slot}),
        format!("{word} {name}"),
    );
    Ok(())
}

fn done(as_json: bool, v: serde_json::Value, line: String) {
    if as_json {
        print_json(&v);
    } else {
        say!("{line}");
    }
}
