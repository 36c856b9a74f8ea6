//! `slotpool robot create`: place new robots on the least-loaded open slots, and
//! finish cleanly whatever happens half-way.
//!
//! Room is reserved first ([`placement::reserve`]), then the robots are inserted
//! in batches, then [`settle`] puts the bookkeeping right: it counts what landed
//! (only after a failed insert), gives back the room of the rest, tells the holders,
//! and re-places robots whose slot `init` retired meanwhile. A rerun of the same
//! command keeps what exists and creates the rest.

use anyhow::{bail, Context as _};
use bson::{doc, oid::ObjectId, Bson, Document};
use clap::Args;
use futures::TryStreamExt;
use serde_json::json;

use super::{print_json, text};
use crate::db::field::{
    CHECKPOINTED_AT, CONTEXT, CREATED_AT, EPOCH, ERROR, KIND, NAME, PAUSED, RESTARTS, SEQ, SLOT_ID,
    SPEC, STATUS, WORKER,
};
use crate::db::store::{is_duplicate_key, Store};
use crate::pool::placement;
use crate::robot::Registry;

/// At most this many robots per `create` call.
const MAX_COUNT: u32 = 100_000;

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
    /// How many robots to create. Rerun the same command after an interruption:
    /// robots that exist with this kind and spec are kept, the rest are created.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Accept a kind this CLI does not know (a custom kind of your own worker build).
    #[arg(long)]
    unchecked: bool,
    /// Print the robots created, and their slots, as JSON.
    #[arg(long)]
    json: bool,
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

pub async fn run(store: &Store, args: CreateArgs) -> anyhow::Result<()> {
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
        if text(d, KIND).as_deref() != Some(args.kind.as_str())
            || d.get_document(SPEC).ok() != Some(&spec)
        {
            conflicts.push(text(d, NAME).unwrap_or_default());
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
    if crate::pool::view::live_workers(store).await?.is_empty() {
        eprintln!("warning: no worker is alive; the robots start when one is (slotpool worker)");
    }
    let now = store.server_now().await?;
    let docs: Vec<Document> = todo
        .iter()
        .zip(&placement.slots)
        .map(|(name, slot)| {
            doc! {
                "_id": ObjectId::new(), NAME: name, KIND: &args.kind, SPEC: spec.clone(),
                SLOT_ID: slot, EPOCH: 0_i64, CONTEXT: {}, SEQ: 0_i64, PAUSED: false,
                STATUS: "pending", ERROR: Bson::Null, RESTARTS: 0_i64, WORKER: Bson::Null,
                CREATED_AT: now, CHECKPOINTED_AT: Bson::Null,
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
            crate::db::store::brief(&e)
        ),
        (Some(e), Ok(n)) => {
            let why = if is_duplicate_key(e) {
                "a robot of the same name was created by someone else meanwhile".to_string()
            } else if crate::db::store::is_network(e) {
                format!("the database became unreachable ({})", crate::db::store::brief(e))
            } else {
                crate::db::store::brief(e)
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
            Err(e) if crate::db::store::is_network(&e) && std::time::Instant::now() < deadline => {
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
            .find(doc! {NAME: {"$in": chunk}})
            .projection(doc! {NAME: 1, KIND: 1, SPEC: 1})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            if let Some(n) = text(&d, NAME) {
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
