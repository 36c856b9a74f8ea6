//! What people may do to the pool, in one place for the CLI and `slotpool web`:
//! pause, resume, restart, update, move and delete a robot, drain and undrain a slot,
//! rebalance. Every action is
//! recorded in `events` with who asked and from where ([`Actor`]), so the log shows
//! the operator's hand next to the workers' claims and losses.
//!
//! The writes themselves are the ones the workers expect: a pause or resume bumps the
//! slot's `rev` so its holder notices within a tick, a move is the fenced move of
//! [`crate::pool::placement::move_robots`], a drain sets `draining` for the holder to act on.

use bson::{doc, oid::ObjectId, Bson, Document};

use crate::db::event::EventKind;
use crate::db::field::{
    ACTOR, BY, CONTEXT, DETAIL, FROM, KIND, PAUSED, ROBOT, SLOT_ID, SPEC, STATUS, UPDATE,
    UPDATE_RESULT, WORKER,
};
use crate::db::robot_doc::RobotStatus;
use crate::db::robots;
use crate::db::store::Store;
use crate::pool::placement::{self, MoveError};
use crate::pool::view::text;

/// Who asked for an action, as recorded in its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Actor {
    /// `cli` or `web`.
    pub(crate) by: &'static str,
    /// A person's or a token's name, as given (never a credential).
    pub(crate) who: String,
    /// The peer address, for the web.
    pub(crate) from: Option<String>,
}

impl Actor {
    /// The command line, as the user the process runs as.
    pub(crate) fn cli() -> Actor {
        Actor {
            by: "cli",
            who: login_name(),
            from: None,
        }
    }

    fn fields(&self) -> Document {
        let mut d = doc! {BY: self.by, ACTOR: &self.who};
        if let Some(from) = &self.from {
            d.insert(FROM, from);
        }
        d
    }
}

/// Who runs this process: `$USER` as a login shell sets it, else the name of the
/// process's user id (a cron job, a container or `env -i` has no `$USER`), else
/// that id itself.
fn login_name() -> String {
    if let Some(user) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return user;
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    crate::robot::run_as::user_name(uid).unwrap_or_else(|| format!("uid {uid}"))
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ActionError {
    #[error("no robot named {0:?}: see `slotpool robot list`")]
    NoRobot(String),
    #[error("no slot {0:?}: see `slotpool slots list`")]
    NoSlot(String),
    /// A hand-edited document the action cannot work on.
    #[error("{0}")]
    BadDocument(String),
    #[error("{0} changed meanwhile; try again")]
    Changed(String),
    /// An earlier update still waits for the robot's holder: updates apply one at a
    /// time, in the order asked, and a second one never replaces the first.
    #[error("{robot} already has an update waiting for the holder of {slot} ({pending}); updates apply one at a time, in order: ask again once it has applied or been refused (`slotpool robot show {robot}` shows it while it waits)")]
    UpdatePending {
        robot: String,
        slot: String,
        /// What the waiting update changes.
        pending: String,
    },
    /// A bad kind or spec: nothing was written.
    #[error("{0}")]
    Invalid(String),
    #[error("no slots to rebalance over: run `slotpool init --slots N` first (draining slots are not used)")]
    NoSlots,
    /// A rebalance by load needs every slot's holder's load.
    #[error("cannot rebalance by load: {0}")]
    LoadUnknown(String),
    #[error(transparent)]
    Refused(MoveError),
    #[error("database error: {}", crate::db::store::brief(.0))]
    Db(#[from] mongodb::error::Error),
}

/// What an action did, for its caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Done {
    /// The robot or slot acted on.
    pub(crate) name: String,
    /// The robot's slot (or the slot itself); for a move, the slot it left.
    pub(crate) slot: Option<String>,
    /// Whether anything changed (moving a robot to its own slot changes nothing).
    pub(crate) changed: bool,
    /// A move found the robot already on its destination but never started there
    /// (an earlier move was cut off before it told the holder), and told it now.
    pub(crate) repaired: bool,
}

async fn robot(store: &Store, name: &str) -> Result<Document, ActionError> {
    robots::by_name(store, name, &[SLOT_ID, STATUS, PAUSED, SPEC])
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))
}

fn slot_of(d: &Document) -> Result<String, ActionError> {
    text(d, SLOT_ID).ok_or_else(|| {
        ActionError::BadDocument(
            "this robot's slot_id is missing or not a string; fix it by hand".into(),
        )
    })
}

/// Records an action in `events`, with who asked.
pub(crate) async fn record(store: &Store, kind: EventKind, actor: &Actor, mut fields: Document) {
    fields.extend(actor.fields());
    store.record_event(kind, fields).await;
}

/// Starts a robot afresh from its context: a running instance stops after a last
/// checkpoint and a new one starts under a new generation (the same fenced step as a
/// takeover, on the same holder), with a fresh restart budget. A paused or failed
/// robot runs again.
pub(crate) async fn restart(store: &Store, name: &str, actor: &Actor) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let slot = slot_of(&d)?;
    robots::restart(store, d.get("_id").unwrap_or(&Bson::Null)).await?;
    told(store, name, slot, EventKind::Restart, actor).await
}

/// Asks a scheduled robot's holder for one extra run now ("run now"), under the
/// robot's overlap policy and fence, recorded as triggered and by whom. The request
/// waits in the robot's `firings.triggers` until its holder takes it; its `rev`
/// goes up, so the holder's instance sees it at once. A robot without a schedule is
/// refused: `robot restart` starts a daemon again.
pub(crate) async fn trigger(store: &Store, name: &str, actor: &Actor) -> Result<Done, ActionError> {
    let d = robots::by_name(store, name, &[SLOT_ID, SPEC, crate::db::firing::FIRINGS])
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))?;
    let slot = slot_of(&d)?;
    let scheduled = d.get_document(SPEC).ok().is_some_and(|s| {
        matches!(
            s.get(crate::robot::schedule::SPEC_FIELD),
            Some(Bson::Document(_))
        )
    });
    if !scheduled {
        return Err(ActionError::Invalid(format!(
            "{name} has no spec.schedule: a run-now request is for scheduled robots (`robot restart {name}` starts any robot again)"
        )));
    }
    if matches!(d.get(crate::db::firing::FIRINGS), Some(f) if !matches!(f, Bson::Document(_))) {
        return Err(ActionError::BadDocument(format!(
            "{name}'s firings is not a document (a hand edit?); fix it by hand, e.g. db.robots.updateOne({{name: \"{name}\"}}, {{$unset: {{firings: 1}}}})"
        )));
    }
    let who = format!("{}:{}", actor.by, actor.who);
    let id = d.get("_id").cloned().unwrap_or(Bson::Null);
    if !crate::db::firing::request_run_now(store, &id, &slot, &who).await? {
        return Err(ActionError::Changed(name.to_string()));
    }
    told(store, name, slot, EventKind::Trigger, actor).await
}

/// Bumps the `rev` of `slot`, where robot `name` was read, so its holder reads it
/// again; and, if the robot was moved meanwhile, of its new slot too (each side checks
/// after its own write, as moves do).
/// The end of an action that changed robot `name` on `slot`: its holders are told,
/// the event recorded, and the change reported.
async fn told(
    store: &Store,
    name: &str,
    slot: String,
    kind: EventKind,
    actor: &Actor,
) -> Result<Done, ActionError> {
    tell_holders(store, name, &slot).await?;
    record(store, kind, actor, doc! {ROBOT: name, SLOT_ID: &slot}).await;
    Ok(Done {
        name: name.to_string(),
        slot: Some(slot),
        changed: true,
        repaired: false,
    })
}

async fn tell_holders(store: &Store, name: &str, slot: &str) -> Result<(), ActionError> {
    placement::adjust(store, slot, 0, true).await?;
    if let Some(now) = robot(store, name).await.ok().and_then(|d| slot_of(&d).ok()) {
        if now != slot {
            placement::adjust(store, &now, 0, true).await?;
        }
    }
    Ok(())
}

/// An update asked for, or (dry run) what it would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpdateAsked {
    /// Its id, which the holder's answer names (see [`update_answer`]); None for a
    /// dry run or when nothing would change.
    pub(crate) id: Option<ObjectId>,
    pub(crate) slot: String,
    /// The differences, one line each: `kind: counter → exec`, `spec.args: ["a"] → ["b"]`.
    pub(crate) changes: Vec<String>,
}

/// The holder's answer to an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpdateAnswer {
    pub(crate) applied: bool,
    /// Why it was refused.
    pub(crate) why: Option<String>,
    pub(crate) worker: Option<String>,
}

/// Asks for a robot's kind (None: unchanged) and spec to become these, keeping its
/// context. Checked here as `robot create` checks (a bad spec, or a kind the context
/// cannot carry over to, writes nothing), then judged by the robot's holder, which
/// knows what it may run (its exec allow-lists): it applies the update in one fenced
/// write that also makes the running instance stop after a last checkpoint and start
/// again with the new spec under a new generation, or refuses it and changes nothing.
/// The request is recorded in `events` with who asked. With `dry_run`, only says what
/// would change.
pub(crate) async fn update(
    store: &Store,
    name: &str,
    kind: Option<&str>,
    spec: Document,
    dry_run: bool,
    actor: &Actor,
) -> Result<UpdateAsked, ActionError> {
    let d = robots::by_name(store, name, &robots::UPDATE_FIELDS)
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))?;
    let slot = slot_of(&d)?;
    let (Some(old_kind), Ok(old_spec)) = (text(&d, KIND), d.get_document(SPEC)) else {
        return Err(ActionError::BadDocument(
            "this robot's kind or spec is missing or malformed; fix it by hand".into(),
        ));
    };
    // A hand-edited `update` that cannot be one is left alone by the holder and
    // replaced here, as before.
    if waiting_update(&d).is_some() && !dry_run {
        return Err(pending(name, &slot, &old_kind, old_spec, &d));
    }
    let new_kind = kind.unwrap_or(&old_kind).to_string();
    let registry = crate::robot::Registry::builtin();
    if let Some(k) = registry.get(&new_kind) {
        registry.check(&new_kind, &spec).map_err(|e| {
            ActionError::Invalid(format!("invalid spec for kind {new_kind:?}: {e}"))
        })?;
        if new_kind != old_kind {
            let empty = Document::new();
            let context = d.get_document(CONTEXT).unwrap_or(&empty);
            k.check_context(&spec, context).map_err(|e| {
                ActionError::Invalid(format!(
                    "its context does not carry over to kind {new_kind:?}: {e}"
                ))
            })?;
        }
    } else if new_kind != old_kind {
        return Err(ActionError::Invalid(format!(
            "unknown robot kind {new_kind:?}; known kinds: {} (a kind of your own worker build keeps its kind; update its spec only)",
            registry.names().join(", ")
        )));
    }
    let changes = differences(&old_kind, old_spec, &new_kind, &spec);
    if dry_run || changes.is_empty() {
        return Ok(UpdateAsked {
            id: None,
            slot,
            changes,
        });
    }
    let id = ObjectId::new();
    // Only over no waiting update: two asked at once, one waits and the other is
    // refused, never silently replaced.
    let robot_id = d.get("_id").unwrap_or(&Bson::Null);
    let asked = robots::ask_update(
        store,
        robot_id,
        (&old_kind, old_spec),
        id,
        (&new_kind, spec),
    )
    .await?;
    if !asked {
        let now = robots::by_id(store, robot_id, &[KIND, SPEC, UPDATE]).await?;
        return Err(match now {
            Some(now) if waiting_update(&now).is_some() => {
                pending(name, &slot, &old_kind, old_spec, &now)
            }
            _ => ActionError::Changed(name.to_string()),
        });
    }
    tell_holders(store, name, &slot).await?;
    let mut detail = changes.join("; ");
    if detail.len() > 1000 {
        detail = format!("{} …", detail.chars().take(1000).collect::<String>());
    }
    record(
        store,
        EventKind::Update,
        actor,
        doc! {ROBOT: name, SLOT_ID: &slot, DETAIL: detail},
    )
    .await;
    Ok(UpdateAsked {
        id: Some(id),
        slot,
        changes,
    })
}

/// The update waiting in robot document `d` for its holder, as the holder reads one
/// (an `id`, a `kind` and a `spec`): its kind and spec. None when there is none, or
/// only a hand edit the holder leaves alone.
fn waiting_update(d: &Document) -> Option<(&str, &Document)> {
    let u = d.get_document(UPDATE).ok()?;
    u.get_object_id("id").ok()?;
    Some((u.get_str(KIND).ok()?, u.get_document(SPEC).ok()?))
}

/// The refusal of an update while `d`'s earlier one waits, saying what that one
/// changes.
fn pending(name: &str, slot: &str, kind: &str, spec: &Document, d: &Document) -> ActionError {
    let changes = waiting_update(d)
        .map(|(new_kind, new_spec)| differences(kind, spec, new_kind, new_spec).join("; "))
        .unwrap_or_default();
    let mut pending = if changes.is_empty() {
        "no change".to_string()
    } else {
        changes
    };
    if pending.len() > 500 {
        pending = format!("{} …", pending.chars().take(500).collect::<String>());
    }
    ActionError::UpdatePending {
        robot: name.to_string(),
        slot: slot.to_string(),
        pending,
    }
}

/// The holder's answer to update `id` of robot `name`, once there is one.
pub(crate) async fn update_answer(
    store: &Store,
    name: &str,
    id: ObjectId,
) -> Result<Option<UpdateAnswer>, ActionError> {
    let d = robots::by_name(store, name, &robots::ANSWER_FIELDS)
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))?;
    let Ok(r) = d.get_document(UPDATE_RESULT) else {
        return Ok(None);
    };
    if r.get_object_id("id") != Ok(id) {
        return Ok(None);
    }
    Ok(Some(UpdateAnswer {
        applied: r.get_bool("applied").unwrap_or(false),
        why: text(r, "why"),
        worker: text(r, WORKER),
    }))
}

/// One line per difference between two kinds and specs, field by field.
pub(crate) fn differences(
    old_kind: &str,
    old: &Document,
    new_kind: &str,
    new: &Document,
) -> Vec<String> {
    let show = |v: Option<&bson::Bson>| {
        v.map_or("(none)".to_string(), |v| {
            crate::printable::escape(&v.clone().into_relaxed_extjson().to_string()).into_owned()
        })
    };
    let mut out = Vec::new();
    if old_kind != new_kind {
        out.push(format!(
            "kind: {} → {}",
            crate::printable::escape(old_kind),
            crate::printable::escape(new_kind)
        ));
    }
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let (a, b) = (old.get(k), new.get(k));
        if a != b {
            out.push(format!(
                "spec.{}: {} → {}",
                crate::printable::escape(k),
                show(a),
                show(b)
            ));
        }
    }
    out
}

/// Stops a robot after a last checkpoint and keeps it stopped (`paused`), or lets it
/// run again from its context.
pub(crate) async fn set_paused(
    store: &Store,
    name: &str,
    paused: bool,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let slot = slot_of(&d)?;
    // A resumed robot gets a fresh restart budget: its recorded ends go. A
    // scheduled robot's pause is marked in its firing state, so the instance that
    // runs it after the resume records the firings of the pause as skipped.
    let scheduled = d.get_document(SPEC).ok().is_some_and(|s| {
        matches!(
            s.get(crate::robot::schedule::SPEC_FIELD),
            Some(Bson::Document(_))
        )
    });
    robots::set_paused(
        store,
        d.get("_id").unwrap_or(&Bson::Null),
        paused,
        scheduled,
    )
    .await?;
    placement::adjust(store, &slot, 0, true).await?;
    let kind = if paused {
        EventKind::Pause
    } else {
        EventKind::Resume
    };
    record(store, kind, actor, doc! {ROBOT: name, SLOT_ID: &slot}).await;
    Ok(Done {
        name: name.to_string(),
        slot: Some(slot),
        changed: true,
        repaired: false,
    })
}

/// Deletes a robot and its kept output; its holder stops it within a tick.
pub(crate) async fn delete(store: &Store, name: &str, actor: &Actor) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let slot = text(&d, SLOT_ID);
    let deleted = robots::delete(store, d.get("_id").unwrap_or(&Bson::Null)).await?;
    if deleted {
        if let Some(s) = &slot {
            placement::adjust(store, s, -1, true).await?;
        }
        // Its kept output goes with it, as a tombstone: a holder still stopping
        // the robot may flush a last line or two, and must not re-create it.
        if let Some(id) = d.get("_id") {
            crate::db::output_log::bury(store, id).await?;
        }
        record(
            store,
            EventKind::Delete,
            actor,
            doc! {ROBOT: name, SLOT_ID: slot.clone()},
        )
        .await;
    }
    Ok(Done {
        name: name.to_string(),
        slot,
        changed: deleted,
        repaired: false,
    })
}

/// Binds a robot to slot `to` with a fenced move.
pub(crate) async fn move_to(
    store: &Store,
    name: &str,
    to: &str,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let from = slot_of(&d)?;
    if from == to {
        // A rerun of a move may find the robot moved but its holder never told (the
        // first run was cut off between the two writes): tell it again. Harmless
        // when nothing was wrong: the holder reads its robots once more.
        let waiting = text(&d, STATUS).as_deref() == Some(RobotStatus::Pending.as_str())
            && d.get_bool(PAUSED) != Ok(true);
        placement::adjust(store, to, 0, true).await?;
        if waiting {
            record(
                store,
                EventKind::Move,
                actor,
                doc! {ROBOT: name, SLOT_ID: to, DETAIL: "repaired: the robot was on its slot but never started there"},
            )
            .await;
        }
        return Ok(Done {
            name: name.to_string(),
            slot: Some(from),
            changed: false,
            repaired: waiting,
        });
    }
    let id = d.get_object_id("_id").map_err(|_| {
        ActionError::BadDocument("this robot's _id is not an ObjectId; fix it by hand".into())
    })?;
    let moved = placement::move_robots(store, &[id], &from, to)
        .await
        .map_err(|e| match e {
            MoveError::Db(e) => ActionError::Db(e),
            MoveError::NoSuchSlot(s) => ActionError::NoSlot(s),
            other => ActionError::Refused(other),
        })?;
    if moved == 0 {
        return Err(ActionError::Changed(name.to_string()));
    }
    record(
        store,
        EventKind::Move,
        actor,
        doc! {ROBOT: name, SLOT_ID: to, DETAIL: format!("from {from}")},
    )
    .await;
    Ok(Done {
        name: name.to_string(),
        slot: Some(from),
        changed: true,
        repaired: false,
    })
}

/// Drains a slot (its holder stops the robots and releases it; no worker claims it)
/// or lets workers claim it again.
pub(crate) async fn set_draining(
    store: &Store,
    slot: &str,
    on: bool,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let Some(changed) = crate::db::placement::set_draining(store, slot, on).await? else {
        return Err(ActionError::NoSlot(slot.to_string()));
    };
    let kind = if on {
        EventKind::Drain
    } else {
        EventKind::Undrain
    };
    record(store, kind, actor, doc! {SLOT_ID: slot}).await;
    Ok(Done {
        name: slot.to_string(),
        slot: Some(slot.to_string()),
        changed,
        repaired: false,
    })
}

/// One planned move of robots from one slot to another, and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedMove {
    pub(crate) from: String,
    pub(crate) to: String,
    /// Ids and names, by name.
    pub(crate) robots: Vec<(ObjectId, String)>,
    pub(crate) moved: u64,
    /// Why the destination refused (drained meanwhile, say).
    pub(crate) refused: Option<String>,
}

/// A rebalance: the counts it started from and its moves.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rebalance {
    pub(crate) dry_run: bool,
    /// Robots per non-draining slot, counted from the robots themselves.
    pub(crate) before: Vec<(String, i64)>,
    pub(crate) moves: Vec<PlannedMove>,
    /// For a rebalance by load: each holder's score before, and as planned after.
    pub(crate) scores: Vec<(String, f64, f64)>,
}

impl Rebalance {
    /// Robots per slot after the moves (planned ones, for a dry run).
    pub(crate) fn after(&self) -> Vec<(String, i64)> {
        let mut after = self.before.clone();
        for p in &self.moves {
            let n = if self.dry_run {
                p.robots.len() as i64
            } else {
                p.moved as i64
            };
            for (slot, delta) in [(&p.from, -n), (&p.to, n)] {
                if let Some(c) = after.iter_mut().find(|c| &c.0 == slot) {
                    c.1 += delta;
                }
            }
        }
        after
    }

    pub(crate) fn moved(&self) -> u64 {
        self.moves.iter().map(|p| p.moved).sum()
    }
}

/// How a rebalance evens robots out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Evening {
    /// Robot counts, to within one.
    Count,
    /// The holders' load scores, to within this many points (see
    /// [`placement::plan_load_rebalance`]).
    Load { band: f64 },
}

/// Evens robots out over the non-draining slots with fenced moves, most loaded to
/// least loaded: by counts until they differ by at most one, or by the holders'
/// load scores until they are within the band, or until `max_moves` robots moved.
/// A destination that refuses is reported in its move, not as an error.
pub(crate) async fn rebalance(
    store: &Store,
    max_moves: Option<u32>,
    dry_run: bool,
    by: Evening,
    actor: &Actor,
) -> Result<Rebalance, ActionError> {
    let slots = placement::loads(store).await.map_err(|e| match e {
        placement::PlacementError::Db(e) => ActionError::Db(e),
        other => ActionError::BadDocument(other.to_string()),
    })?;
    if slots.is_empty() {
        return Err(ActionError::NoSlots);
    }
    let counts = crate::db::robot_count::true_counts(store).await?;
    let before: Vec<(String, i64)> = slots
        .iter()
        .map(|s| (s.id.clone(), counts.get(&s.id).copied().unwrap_or(0)))
        .collect();
    let max = max_moves.map_or(usize::MAX, |m| m as usize);
    let mut moves: Vec<PlannedMove> = Vec::new();
    let mut scores = Vec::new();
    let by_count = match by {
        Evening::Count => placement::rebalance_plan(&before, max),
        Evening::Load { band } => {
            let holders = placement::holder_loads(store).await.map_err(|e| match e {
                placement::PlacementError::Db(e) => ActionError::Db(e),
                other => ActionError::BadDocument(other.to_string()),
            })?;
            let declared = placement::declared_by_slot(store)
                .await
                .map_err(|e| match e {
                    placement::PlacementError::Db(e) => ActionError::Db(e),
                    other => ActionError::BadDocument(other.to_string()),
                })?;
            let mut slots = slots.clone();
            placement::with_declared(&mut slots, &declared);
            let plan = placement::plan_load_rebalance(&slots, &holders, band, max)
                .map_err(|e| ActionError::LoadUnknown(e.to_string()))?;
            scores = plan.scores;
            // One move per pair of slots, its robots by name.
            for m in plan.moves {
                let names = vec![m.robot];
                let robots = crate::db::placement::named_on(store, &m.from, &names).await?;
                match moves.iter_mut().find(|p| p.from == m.from && p.to == m.to) {
                    Some(p) => p.robots.extend(robots),
                    None => moves.push(PlannedMove {
                        from: m.from,
                        to: m.to,
                        robots,
                        moved: 0,
                        refused: None,
                    }),
                }
            }
            moves.retain(|p| !p.robots.is_empty());
            Vec::new()
        }
    };
    for (from, to, k) in by_count {
        // Several moves may leave one slot: each takes robots none before it took.
        let taken: Vec<ObjectId> = moves
            .iter()
            .filter(|p| p.from == from)
            .flat_map(|p| p.robots.iter().map(|(id, _)| *id))
            .collect();
        let robots = crate::db::placement::pick(store, &from, k, &taken).await?;
        moves.push(PlannedMove {
            from,
            to,
            robots,
            moved: 0,
            refused: None,
        });
    }
    if !dry_run {
        for p in &mut moves {
            let ids: Vec<ObjectId> = p.robots.iter().map(|(id, _)| *id).collect();
            match placement::move_robots(store, &ids, &p.from, &p.to).await {
                Ok(n) => p.moved = n,
                Err(MoveError::Db(e)) => return Err(e.into()),
                Err(e) => p.refused = Some(e.to_string()),
            }
        }
        let moved: u64 = moves.iter().map(|p| p.moved).sum();
        // By count, as the event always said; by load, it says so.
        let detail = match by {
            Evening::Count => format!("{moved} robot(s) moved"),
            Evening::Load { .. } => format!("{moved} robot(s) moved by load"),
        };
        record(store, EventKind::Rebalance, actor, doc! {DETAIL: detail}).await;
    }
    Ok(Rebalance {
        dry_run,
        before,
        moves,
        scores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_changed_field_once() {
        let old = doc! {"command": "/opt/a", "args": ["x"], "history": 5_i64};
        let new = doc! {"command": "/opt/a", "args": ["y"], "env": {"K": "v"}};
        assert_eq!(
            differences("exec", &old, "exec", &new),
            [
                r#"spec.args: ["x"] → ["y"]"#,
                r#"spec.env: (none) → {"K":"v"}"#,
                "spec.history: 5 → (none)",
            ]
        );
        assert_eq!(
            differences("counter", &doc! {}, "exec", &doc! {}),
            ["kind: counter → exec"]
        );
        assert!(differences("exec", &old, "exec", &old.clone()).is_empty());
        // Hostile text stays text.
        let d = differences("exec", &doc! {}, "exec", &doc! {"\u{1b}[2J": 1_i64});
        assert!(!d[0].contains('\u{1b}'), "{d:?}");
    }
}
