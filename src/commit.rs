//! Group commit: a holder's concurrent robot writes go to the database together, as
//! one multi-statement `update` command, each statement with its own fence filter.
//!
//! Why: a checkpoint is one small update, and its cost is the round trip. When a
//! standby takes over a slot of thousands of robots, each of them writes its first
//! checkpoint at once; one round trip per robot made the restore rate the inverse of
//! the database's latency. Now the writes that arrive while one batch is being
//! gathered (at most [`WINDOW`]), while the previous batch is in flight, or while the
//! pacer holds them back go out in one command of up to [`MAX_STATEMENTS`]
//! statements.
//!
//! What stays as before:
//! - Each statement is an ordinary single-document update whose filter is the
//!   robot's fence (`_id`, `slot_id`, `epoch`, `gen`), so a fenced write changes
//!   nothing, exactly as it did alone. `ordered: false`: one refused statement (a
//!   hand-edited document failing the validator) does not hold back the others.
//! - The server reports only how many statements matched in all. Each statement also
//!   stamps a token of its own (`write_id`); when the count is short, the documents
//!   are read back by `_id`, and each write whose token is not there is reported
//!   fenced, and its robot is stopped as before. (Reading the fence back instead would
//!   be wrong: a robot moved X → Y → X between the write and the read-back holds its
//!   fence again without this write having landed.)
//! - The [`WritePacer`] still paces robot writes by the lease's renewal latency: a
//!   batch takes one permit, and writes queue (and batch up) while none is free.
//! - The lease's write guard is checked when a batch is sent, not only when a write
//!   was queued, so a paused process still never writes after its deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use futures::TryStreamExt;
use mongodb::{Collection, Database};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::context::WriteGuard;
use crate::metrics::Metrics;
use crate::pacing::{OwnedWritePermit, WritePacer};

/// How long the first write of a batch waits for others to join it. Small next to a
/// round trip to a real database across a network, and well under the 5 ms a single
/// checkpoint may be delayed.
pub const WINDOW: Duration = Duration::from_millis(2);

/// Statements per command. Measured on the dev server with 10,000 robots in the
/// collection: 100 point updates by `_id` take about the time of 10 single ones, and
/// a batch this size stays far below a renewal's fence margin.
pub const MAX_STATEMENTS: usize = 100;

/// Bytes of statements per command, well under the 16 MiB a command may be (a
/// context alone may be 1 MiB).
pub const MAX_BYTES: usize = 8 * 1024 * 1024;

/// One fenced single-document update.
#[derive(Debug, Clone)]
pub struct Statement {
    /// The document's `_id`; it is part of `filter` too.
    pub id: ObjectId,
    pub filter: Document,
    /// An update pipeline.
    pub update: Vec<Document>,
}

impl Statement {
    fn to_command(&self) -> Document {
        doc! {"q": &self.filter, "u": &self.update, "multi": false, "upsert": false}
    }

    fn to_command_many(&self) -> Document {
        doc! {"q": &self.filter, "u": &self.update, "multi": true, "upsert": false}
    }

    fn bytes(&self) -> usize {
        bson::to_vec(&self.to_command()).map_or(MAX_BYTES, |v| v.len())
    }
}

/// What became of one statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The fence matched: the update landed.
    Applied,
    /// The fence did not match: nothing changed.
    Fenced,
    /// The lease's write guard closed before the batch was sent: nothing sent.
    Lapsed,
    /// The server refused this statement (e.g. the validator), with its message.
    Refused(String),
}

/// Sends `statements` as one unordered multi-statement `update` on `robots`, and
/// says which applied. Used by the batcher and by adoption alike.
///
/// A server that fails the whole command for one bad statement (the dev server does,
/// e.g. for `$concatArrays` on a hand-edited `history`, where MongoDB reports that
/// statement alone) may already have applied the statements before it. So the
/// documents are read back by `_id` first: a statement whose token landed is
/// reported applied and never sent again, and only the others go again, one by one
/// with their own tokens, so one broken robot holds back no other. (Each checkpoint
/// is also conditioned on the `seq` it follows, so even a resend of one that landed
/// would match nothing; the read-back keeps it from being reported fenced.)
/// Network errors are the caller's.
pub async fn send(
    robots: &Collection<Document>,
    statements: &[Statement],
) -> Result<Vec<Written>, mongodb::error::Error> {
    let tokens: Vec<ObjectId> = statements.iter().map(|_| ObjectId::new()).collect();
    match send_together(robots, statements, &tokens).await {
        Err(e) if statements.len() > 1 && !crate::store::is_network(&e) => {
            let landed = read_tokens(robots, statements).await?;
            let mut out = Vec::with_capacity(statements.len());
            for (s, token) in statements.iter().zip(&tokens) {
                if landed.get(&s.id).is_some_and(|d| landed_token(token, d)) {
                    out.push(Written::Applied);
                    continue;
                }
                let one = std::slice::from_ref(s);
                out.push(
                    match send_together(robots, one, std::slice::from_ref(token)).await {
                        Ok(mut w) => w.pop().unwrap_or(Written::Fenced),
                        Err(e) if !crate::store::is_network(&e) => {
                            Written::Refused(crate::store::brief(&e))
                        }
                        Err(e) => return Err(e),
                    },
                );
            }
            Ok(out)
        }
        Err(e) if !crate::store::is_network(&e) => {
            Ok(vec![
                Written::Refused(crate::store::brief(&e));
                statements.len()
            ])
        }
        other => other,
    }
}

/// Sends one statement that may change many documents (`multi`), as the same
/// `update` command; an error of the server (a refused document fails it as a whole
/// on the dev server, and on MongoDB reports it) is returned as is.
pub async fn send_many(
    robots: &Collection<Document>,
    statement: &Statement,
) -> Result<(), mongodb::error::Error> {
    let db: Database = robots.client().database(&robots.namespace().db);
    let reply = db
        .run_command(doc! {
            "update": robots.name(),
            "updates": [statement.to_command_many()],
            "ordered": false,
        })
        .await?;
    match reply.get_array("writeErrors").ok().and_then(|e| e.first()) {
        Some(e) => Err(mongodb::error::Error::custom(format!(
            "the database refused a document: {}",
            e.as_document()
                .and_then(|d| d.get_str("errmsg").ok())
                .unwrap_or("refused")
        ))),
        None => Ok(()),
    }
}

/// Sends the statements as one command, each stamping its own token.
async fn send_together(
    robots: &Collection<Document>,
    statements: &[Statement],
    tokens: &[ObjectId],
) -> Result<Vec<Written>, mongodb::error::Error> {
    if statements.is_empty() {
        return Ok(Vec::new());
    }
    // Each statement also stamps a token of its own, so a short count is resolved
    // by what landed, not by whether the fence holds at read-back time (a robot moved
    // X → Y → X between the two would hold its fence again without this write).
    let updates: Vec<Document> = statements
        .iter()
        .zip(tokens)
        .map(|(s, token)| {
            let mut c = s.to_command();
            let mut u = s.update.clone();
            u.push(doc! {"$set": {"write_id": token}});
            c.insert("u", u);
            c
        })
        .collect();
    let db: Database = robots.client().database(&robots.namespace().db);
    let reply = db
        .run_command(doc! {"update": robots.name(), "updates": updates, "ordered": false})
        .await?;
    let matched = match reply.get("n") {
        Some(Bson::Int32(n)) => *n as usize,
        Some(Bson::Int64(n)) => *n as usize,
        _ => 0,
    };
    let mut out = vec![Written::Applied; statements.len()];
    let mut refused = 0;
    if let Ok(errors) = reply.get_array("writeErrors") {
        for e in errors.iter().filter_map(Bson::as_document) {
            let index = match e.get("index") {
                Some(Bson::Int32(i)) => *i as usize,
                Some(Bson::Int64(i)) => *i as usize,
                _ => continue,
            };
            if let Some(slot) = out.get_mut(index) {
                *slot = Written::Refused(e.get_str("errmsg").unwrap_or("refused").to_string());
                refused += 1;
            }
        }
    }
    if matched + refused >= statements.len() {
        return Ok(out);
    }
    // Short: read the tokens back to find which did not land.
    let now = read_tokens(robots, statements).await?;
    for ((s, token), w) in statements.iter().zip(tokens).zip(out.iter_mut()) {
        if *w == Written::Applied && !now.get(&s.id).is_some_and(|d| landed_token(token, d)) {
            *w = Written::Fenced;
        }
    }
    Ok(out)
}

/// The statements' documents as they are now (`_id` and `write_id` only), by `_id`.
async fn read_tokens(
    robots: &Collection<Document>,
    statements: &[Statement],
) -> Result<HashMap<ObjectId, Document>, mongodb::error::Error> {
    let ids: Vec<ObjectId> = statements.iter().map(|s| s.id).collect();
    let mut cursor = robots
        .find(doc! {"_id": {"$in": &ids}})
        .projection(doc! {"write_id": 1})
        .await?;
    let mut now: HashMap<ObjectId, Document> = HashMap::new();
    while let Some(d) = cursor.try_next().await? {
        if let Ok(id) = d.get_object_id("_id") {
            now.insert(id, d);
        }
    }
    Ok(now)
}

/// Whether the write stamped `token` is the one `doc` shows. A robot writes again only
/// after its previous write was answered, and no other instance can write past the
/// fence, so nothing else replaces the token before the read-back.
pub fn landed_token(token: &ObjectId, doc: &Document) -> bool {
    doc.get_object_id("write_id").is_ok_and(|t| t == *token)
}

struct Queued {
    statement: Statement,
    reply: oneshot::Sender<Result<Written, mongodb::error::Error>>,
}

/// The group-commit queue of one held slot. Cloned into every robot's writer; the
/// batcher task ends when the last clone is dropped (the lease ended).
#[derive(Debug, Clone)]
pub struct GroupCommit {
    queue: mpsc::UnboundedSender<Queued>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued")
            .field("id", &self.statement.id)
            .finish()
    }
}

impl GroupCommit {
    /// Starts the batcher for one lease's robot writes.
    pub fn spawn(
        robots: Collection<Document>,
        pacer: Arc<WritePacer>,
        guard: WriteGuard,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Unbounded is bounded here: every robot waits for its write's answer before
        // writing again, so the queue never holds more than one write per robot.
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(rx, robots, pacer, guard, metrics));
        GroupCommit { queue }
    }

    /// Queues one fenced write and waits for what became of it.
    pub async fn write(&self, statement: Statement) -> Result<Written, mongodb::error::Error> {
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Queued { statement, reply }).is_err() {
            return Ok(Written::Lapsed);
        }
        answer.await.unwrap_or(Ok(Written::Lapsed))
    }
}

/// Gathers writes into batches (the first waits at most [`WINDOW`] for company),
/// takes a pacer permit per batch, and sends one batch at a time.
async fn batcher(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    robots: Collection<Document>,
    pacer: Arc<WritePacer>,
    guard: WriteGuard,
    metrics: Arc<Metrics>,
) {
    while let Some(first) = rx.recv().await {
        let mut bytes = first.statement.bytes();
        let mut batch = vec![first];
        let until = Instant::now() + WINDOW;
        while batch.len() < MAX_STATEMENTS && bytes < MAX_BYTES {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(q)) => {
                    bytes += q.statement.bytes();
                    batch.push(q);
                }
                Ok(None) | Err(_) => break,
            }
        }
        // Waiting here lets the next batch fill up behind this one.
        let permit = pacer.acquire_owned().await;
        // Writes queued meanwhile join this batch, up to its limits.
        while batch.len() < MAX_STATEMENTS && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(q) => {
                    bytes += q.statement.bytes();
                    batch.push(q);
                }
                Err(_) => break,
            }
        }
        metrics.write_batches.inc();
        metrics.batched_writes.inc_by(batch.len() as u64);
        // One batch in flight: what queues meanwhile is the next batch. Measured on
        // the dev server, eight batches of 100 in flight at once took 0.5–2.5 s each
        // (about 570 writes/s in all); one at a time, 40 ms each (2,500 writes/s).
        commit(batch, &robots, &guard, permit).await;
    }
}

async fn commit(
    batch: Vec<Queued>,
    robots: &Collection<Document>,
    guard: &WriteGuard,
    _permit: OwnedWritePermit,
) {
    if !guard.is_open() {
        for q in batch {
            let _ = q.reply.send(Ok(Written::Lapsed));
        }
        return;
    }
    let statements: Vec<Statement> = batch.iter().map(|q| q.statement.clone()).collect();
    let t = Instant::now();
    // Bounded by the lease deadline: a command the driver still holds (waiting for a
    // server that went away, say) is dropped unsent at the deadline, so it can never
    // reach a restarted server after this holder fenced itself. (The chaos suite's
    // database restart failed once without it: a counter's `n` one ahead of its
    // `seq`, as when a batch held through the outage lands on a server that lost
    // the write before it.)
    let r = match tokio::time::timeout_at(guard.deadline(), send(robots, &statements)).await {
        Ok(r) => r,
        // Past the deadline it was read at: lapsed, unless renewals moved it on
        // meanwhile, when the write is merely in doubt (the robot reloads its
        // context from the database and goes on).
        Err(_) if !guard.is_open() => {
            for q in batch {
                let _ = q.reply.send(Ok(Written::Lapsed));
            }
            return;
        }
        Err(_) => Err(mongodb::error::Error::custom(format!(
            "no answer to {} robot write(s) within the lease; they may or may not have landed",
            statements.len()
        ))),
    };
    tracing::trace!(
        writes = statements.len(),
        ms = t.elapsed().as_millis() as u64,
        "group commit"
    );
    match r {
        Ok(written) => {
            for (q, w) in batch.into_iter().zip(written) {
                let _ = q.reply.send(Ok(w));
            }
        }
        Err(e) => {
            for q in batch {
                let _ = q.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_landed_only_if_its_own_token_is_there() {
        let mine = ObjectId::new();
        assert!(landed_token(&mine, &doc! {"write_id": mine}));
        assert!(
            !landed_token(&mine, &doc! {"write_id": ObjectId::new()}),
            "another write's"
        );
        assert!(!landed_token(&mine, &doc! {}), "none yet");
        assert!(
            !landed_token(&mine, &doc! {"write_id": mine.to_hex()}),
            "not an ObjectId"
        );
    }
}
