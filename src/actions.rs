//! What people may do to the pool, in one place for the CLI and `slotpool web`:
//! pause, resume, move and delete a robot, drain and undrain a slot. Every action is
//! recorded in `events` with who asked and from where ([`Actor`]), so the log shows
//! the operator's hand next to the workers' claims and losses.
//!
//! The writes themselves are the ones the workers expect: a pause or resume bumps the
//! slot's `rev` so its holder notices within a tick, a move is the fenced move of
//! [`crate::placement::move_robots`], a drain sets `draining` for the holder to act on.

use bson::{doc, Document};

use crate::placement::{self, MoveError};
use crate::store::Store;
use crate::view::text;

/// Who asked for an action, as recorded in its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// `cli` or `web`.
    pub by: &'static str,
    /// A person's or a token's name, as given (never a credential).
    pub who: String,
    /// The peer address, for the web.
    pub from: Option<String>,
}

impl Actor {
    /// The command line, as the user the process runs as.
    pub fn cli() -> Actor {
        Actor {
            by: "cli",
            who: std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
            from: None,
        }
    }

    fn fields(&self) -> Document {
        let mut d = doc! {"by": self.by, "actor": &self.who};
        if let Some(from) = &self.from {
            d.insert("from", from);
        }
        d
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no robot named {0:?}: see `slotpool robot list`")]
    NoRobot(String),
    #[error("no slot {0:?}: see `slotpool slots list`")]
    NoSlot(String),
    /// A hand-edited document the action cannot work on.
    #[error("{0}")]
    BadDocument(String),
    #[error("{0} changed while moving it; try again")]
    Changed(String),
    #[error(transparent)]
    Refused(MoveError),
    #[error("database error: {}", crate::store::brief(.0))]
    Db(#[from] mongodb::error::Error),
}

impl ActionError {
    /// Whether the action named something that does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ActionError::NoRobot(_) | ActionError::NoSlot(_))
    }
}

/// What an action did, for its caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The robot or slot acted on.
    pub name: String,
    /// The robot's slot (or the slot itself); for a move, the slot it left.
    pub slot: Option<String>,
    /// Whether anything changed (moving a robot to its own slot changes nothing).
    pub changed: bool,
}

async fn robot(store: &Store, name: &str) -> Result<Document, ActionError> {
    store
        .robots()
        .find_one(doc! {"name": name})
        .projection(doc! {"_id": 1, "slot_id": 1})
        .await?
        .ok_or_else(|| ActionError::NoRobot(name.to_string()))
}

fn slot_of(d: &Document) -> Result<String, ActionError> {
    text(d, "slot_id").ok_or_else(|| {
        ActionError::BadDocument(
            "this robot's slot_id is missing or not a string; fix it by hand".into(),
        )
    })
}

async fn record(store: &Store, kind: &str, actor: &Actor, mut fields: Document) {
    fields.extend(actor.fields());
    store.record_event(kind, fields).await;
}

/// Stops a robot after a last checkpoint and keeps it stopped (`paused`), or lets it
/// run again from its context.
pub async fn set_paused(
    store: &Store,
    name: &str,
    paused: bool,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let slot = slot_of(&d)?;
    let status = if paused { "paused" } else { "pending" };
    store
        .robots()
        .update_one(
            doc! {"_id": d.get("_id")},
            doc! {"$set": {"paused": paused, "status": status}},
        )
        .await?;
    placement::adjust(store, &slot, 0, true).await?;
    let kind = if paused { "pause" } else { "resume" };
    record(store, kind, actor, doc! {"robot": name, "slot_id": &slot}).await;
    Ok(Done {
        name: name.to_string(),
        slot: Some(slot),
        changed: true,
    })
}

/// Deletes a robot and its kept output; its holder stops it within a tick.
pub async fn delete(store: &Store, name: &str, actor: &Actor) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let slot = text(&d, "slot_id");
    let r = store
        .robots()
        .delete_one(doc! {"_id": d.get("_id")})
        .await?;
    if r.deleted_count == 1 {
        if let Some(s) = &slot {
            placement::adjust(store, s, -1, true).await?;
        }
        // Its kept output goes with it (a holder still stopping it may add a last
        // line or two: the output of a deleted robot is never shown).
        store
            .outputs()
            .delete_one(doc! {"_id": d.get("_id")})
            .await?;
        record(
            store,
            "delete",
            actor,
            doc! {"robot": name, "slot_id": slot.clone()},
        )
        .await;
    }
    Ok(Done {
        name: name.to_string(),
        slot,
        changed: r.deleted_count == 1,
    })
}

/// Binds a robot to slot `to` with a fenced move.
pub async fn move_to(
    store: &Store,
    name: &str,
    to: &str,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let d = robot(store, name).await?;
    let from = slot_of(&d)?;
    if from == to {
        return Ok(Done {
            name: name.to_string(),
            slot: Some(from),
            changed: false,
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
        "move",
        actor,
        doc! {"robot": name, "slot_id": to, "detail": format!("from {from}")},
    )
    .await;
    Ok(Done {
        name: name.to_string(),
        slot: Some(from),
        changed: true,
    })
}

/// Drains a slot (its holder stops the robots and releases it; no worker claims it)
/// or lets workers claim it again.
pub async fn set_draining(
    store: &Store,
    slot: &str,
    on: bool,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let r = store
        .slots()
        .update_one(doc! {"_id": slot}, doc! {"$set": {"draining": on}})
        .await?;
    if r.matched_count == 0 {
        return Err(ActionError::NoSlot(slot.to_string()));
    }
    let kind = if on { "drain" } else { "undrain" };
    record(store, kind, actor, doc! {"slot_id": slot}).await;
    Ok(Done {
        name: slot.to_string(),
        slot: Some(slot.to_string()),
        changed: r.modified_count == 1,
    })
}
