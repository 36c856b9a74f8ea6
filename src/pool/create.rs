//! Creating robots, for `robot create` and `POST /api/v1/robots` alike: check them,
//! place them on the least-loaded open slots, and finish cleanly whatever happens
//! half-way.
//!
//! Room is reserved first ([`placement::reserve`]), then the robots are inserted
//! in batches, then [`settle`] puts the bookkeeping right: it counts what landed
//! (only after a failed insert), gives back the room of the rest, tells the holders,
//! and re-places robots whose slot `init` retired meanwhile. The same request again
//! keeps what exists (same kind and spec) and creates the rest, so a create with
//! client-given names is idempotent.

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::db::field::{
    CHECKPOINTED_AT, CONTEXT, CREATED_AT, DETAIL, EPOCH, ERROR, KIND, NAME, PAUSED, RESTARTS,
    ROBOT, SEQ, SLOT_ID, SPEC, STATUS, WORKER,
};
use crate::db::robot_doc::RobotStatus;
use crate::db::store::{is_duplicate_key, Store};
use crate::pool::actions::Actor;
use crate::pool::placement::{self, PlacementError};
use crate::pool::view::text;
use crate::robot::Registry;

/// At most this many robots per create.
pub(crate) const MAX_COUNT: u32 = 100_000;

/// Robots to create: `names` of one `kind` and `spec`.
#[derive(Debug, Clone)]
pub(crate) struct NewRobots {
    pub(crate) names: Vec<String>,
    pub(crate) kind: String,
    pub(crate) spec: Document,
    /// Accept a kind this build does not know (a custom kind of the user's own
    /// worker build); its spec is then not checked here.
    pub(crate) unchecked: bool,
    /// How the slots are chosen.
    pub(crate) by: placement::PlaceBy,
}

impl NewRobots {
    /// `base` alone, or `base-1` … `base-count`.
    pub(crate) fn names(base: &str, count: u32) -> Vec<String> {
        if count == 1 {
            vec![base.to_string()]
        } else {
            (1..=count).map(|i| format!("{base}-{i}")).collect()
        }
    }
}

/// Why a create did nothing, or not everything.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CreateError {
    /// A bad name, count, kind or spec: nothing was written.
    #[error("{0}")]
    Invalid(String),
    /// Robots of these names exist with another kind or spec: nothing was written.
    #[error("a robot named {0} already exists with another kind or spec; names are unique")]
    Conflict(String),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// Part landed; the bookkeeping is consistent and the same request again creates
    /// the rest (each caller says how to send it again: [`CreateError::again`]).
    #[error("created {created} of {total} robots: {why}; the slots' robot counts are consistent")]
    Partial {
        created: usize,
        total: usize,
        why: String,
    },
    /// The database stopped answering before the bookkeeping was done.
    #[error("could not tell how many of {total} robots were created: the database did not answer for {}s ({why}). \
             The slots' robot counts may be too high meanwhile: ten minutes on, `slotpool init --slots N` \
             (N: the current slot count) makes them true again", PATIENCE.as_secs())]
    Unknown { total: usize, why: String },
    #[error("database error: {}", crate::db::store::brief(.0))]
    Db(#[from] mongodb::error::Error),
}

impl CreateError {
    /// True when part may have landed and the same create again finishes it.
    pub(crate) fn again(&self) -> bool {
        matches!(
            self,
            CreateError::Partial { .. } | CreateError::Unknown { .. }
        )
    }
}

/// What a create did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Created {
    /// The robots created now, with their slots, in order.
    pub(crate) created: Vec<(String, String)>,
    /// How many of the names existed already with the same kind and spec.
    pub(crate) existing: usize,
    /// No worker was alive when they were created: they start when one is.
    pub(crate) no_worker: bool,
}

/// Checks names, kind and spec as every create does, before anything is written.
pub(crate) fn check(req: &NewRobots) -> Result<(), CreateError> {
    if req.names.is_empty() || req.names.len() > MAX_COUNT as usize {
        return Err(CreateError::Invalid(format!(
            "between 1 and {MAX_COUNT} robots per create, got {}",
            req.names.len()
        )));
    }
    for n in [req.names.first(), req.names.last()].into_iter().flatten() {
        crate::printable::check_name(n).map_err(|e| CreateError::Invalid(format!("name: {e}")))?;
    }
    if let Err(e) = Registry::builtin().check(&req.kind, &req.spec) {
        let unknown = Registry::builtin().get(&req.kind).is_none();
        if !(unknown && req.unchecked) {
            if unknown {
                return Err(CreateError::Invalid(format!(
                    "{e} (a kind registered by your own worker build: add --unchecked, or \"unchecked\": true over the API)"
                )));
            }
            return Err(CreateError::Invalid(format!(
                "invalid spec for kind {:?}: {e}",
                crate::printable::escape(&req.kind)
            )));
        }
    }
    Ok(())
}

/// The names of `req` not among `existing` (the robots of those names found): a
/// robot found with another kind or spec is a conflict (the first ten named).
fn still_to_create(
    req: &NewRobots,
    existing: &std::collections::HashMap<String, Document>,
) -> Result<Vec<String>, CreateError> {
    let mut conflicts = Vec::new();
    for d in existing.values() {
        if text(d, KIND).as_deref() != Some(req.kind.as_str())
            || d.get_document(SPEC).ok() != Some(&req.spec)
        {
            conflicts.push(text(d, NAME).unwrap_or_default());
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort();
        conflicts.truncate(10);
        return Err(CreateError::Conflict(conflicts.join(", ")));
    }
    Ok(req
        .names
        .iter()
        .filter(|n| !existing.contains_key(*n))
        .cloned()
        .collect())
}

/// Creates the robots of `req` that do not exist yet (see the module docs).
pub(crate) async fn create(
    store: &Store,
    req: &NewRobots,
    actor: &Actor,
) -> Result<Created, CreateError> {
    check(req)?;
    // A rerun after an interrupted create finishes it: robots that exist with the
    // same kind and spec are kept, the rest are created. Any other robot of one
    // of these names is a conflict.
    let existing = crate::db::robots::named(store, &req.names).await?;
    let todo = still_to_create(req, &existing)?;
    let mut done = Created {
        existing: existing.len(),
        ..Default::default()
    };
    if todo.is_empty() {
        return Ok(done);
    }
    // Each new robot weighs at least what its spec declares.
    let limits = crate::robot::limits::Limits::from_spec(&req.spec).unwrap_or_default();
    let each = crate::load::Cost {
        robots: 1,
        millicores: limits.cpu_millis.unwrap_or(0),
        memory_bytes: limits.memory.unwrap_or(0),
    };
    let placement = placement::reserve(store, todo.len(), each, req.by).await?;
    done.no_worker = crate::pool::view::live_workers(store).await?.is_empty();
    let now = store.server_now().await?;
    let docs: Vec<Document> = todo
        .iter()
        .zip(&placement.slots)
        .map(|(name, slot)| {
            doc! {
                "_id": ObjectId::new(), NAME: name, KIND: &req.kind, SPEC: req.spec.clone(),
                SLOT_ID: slot, EPOCH: 0_i64, CONTEXT: {}, SEQ: 0_i64, PAUSED: false,
                STATUS: RobotStatus::Pending, ERROR: Bson::Null, RESTARTS: 0_i64, WORKER: Bson::Null,
                CREATED_AT: now, CHECKPOINTED_AT: Bson::Null,
            }
        })
        .collect();
    let error = crate::db::robots::insert(store, &docs).await.err();
    let ids: Vec<ObjectId> = docs
        .iter()
        .filter_map(|d| d.get_object_id("_id").ok())
        .collect();
    let settled = settle(store, &ids, &placement.slots, error.is_none()).await;
    match (error, settled) {
        (None, Ok(n)) => {
            debug_assert_eq!(n, docs.len());
            done.created = todo.into_iter().zip(placement.slots).collect();
            let first = &done.created[0].0;
            let detail = match done.created.len() {
                1 => format!("kind {}", req.kind),
                n => format!("{n} robots of kind {} ({first} …)", req.kind),
            };
            crate::pool::actions::record(
                store,
                crate::db::event::EventKind::Create,
                actor,
                doc! {ROBOT: first, DETAIL: detail},
            )
            .await;
            Ok(done)
        }
        (_, Err(e)) => Err(CreateError::Unknown {
            total: docs.len(),
            why: crate::db::store::brief(&e),
        }),
        (Some(e), Ok(n)) => {
            let why = if is_duplicate_key(&e) {
                "a robot of the same name was created by someone else meanwhile".to_string()
            } else if crate::db::store::is_transient(&e) {
                format!(
                    "the database did not take the write: it was unreachable or \
                     changing primary ({})",
                    crate::db::store::brief(&e)
                )
            } else {
                crate::db::store::brief(&e)
            };
            Err(CreateError::Partial {
                created: n,
                total: docs.len(),
                why,
            })
        }
    }
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
            Err(e)
                if crate::db::store::is_transient(&e) && std::time::Instant::now() < deadline =>
            {
                if !warned {
                    tracing::warn!(
                        "the database is unreachable while {what}; retrying for up to {}s",
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
    // Only a failed insert leaves doubt about what landed (an `$in` over many ids
    // is costly on the dev server: not on the happy path).
    let landed: std::collections::HashSet<ObjectId> = if all_landed {
        ids.iter().copied().collect()
    } else {
        patiently("counting the robots created", || {
            crate::db::robots::existing_ids(store, ids)
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
