//! Group commit: a holder's concurrent robot writes go to the database together, as
//! one multi-statement `update` command, each statement with its own fence filter.
//!
//! A restore of thousands of robots would otherwise pay one round trip per checkpoint.
//! Writes gather for at most [`WINDOW`] (or while a batch is in flight or the
//! [`WritePacer`] holds them) into up to [`MAX_STATEMENTS`] statements. Each stays
//! fenced on its own, a per-statement token (`write_id`) tells which landed, and the
//! lease's write guard is checked when a batch is sent. See docs/internals.md,
//! "Group commit".

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use futures::TryStreamExt;
use mongodb::{Collection, Database};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::db::field::WRITE_ID;
use crate::db::guard::WriteGuard;
use crate::db::pacing::{OwnedWritePermit, WritePacer};
use crate::db::store::Store;
use crate::metrics::Metrics;

/// How long the first write of a batch waits for others to join it. Small next to a
/// round trip to a real database across a network, and well under the 5 ms a single
/// checkpoint may be delayed.
pub(crate) const WINDOW: Duration = Duration::from_millis(2);

/// Statements per command at most: 100 point updates cost about as much as 10 single
/// ones (see docs/bench/2026-11-23-scale.md). Fewer go when 100 would keep the server
/// busy past the pacer's [`WritePacer::command_budget`] ([`next_batch_limit`]).
pub(crate) const MAX_STATEMENTS: usize = 100;

/// Statements per command at least, however slow the last one was: below this the
/// round trips, not the server's work, would set the pace.
pub(crate) const MIN_STATEMENTS: usize = 10;

/// Statements in the next command, from how long the last one took: as many as fit
/// in `budget` at the measured cost per statement, from [`MIN_STATEMENTS`] to
/// [`MAX_STATEMENTS`], so a renewal queued behind a command never waits past the
/// fence margin at short ticks (see
/// docs/bench/2026-11-24-requests-and-takeovers-issue-23.md).
pub(crate) fn next_batch_limit(took: Duration, statements: usize, budget: Duration) -> usize {
    crate::db::pacing::statements_within(budget, took, statements, MIN_STATEMENTS, MAX_STATEMENTS)
}

/// How long the last command's time stays a guide to the next one's size.
pub(crate) const MEASURE_HOLDS: Duration = Duration::from_secs(1);

/// The limit of the next command: `limit` while it was measured within
/// [`MEASURE_HOLDS`], else [`MIN_STATEMENTS`] (a slow start). After a quiet spell,
/// or a command that went unanswered, nothing says what the server can take now,
/// and many holders sending full commands at once would queue ahead of renewals.
pub(crate) fn limit_after(limit: usize, since_measured: Option<Duration>) -> usize {
    match since_measured {
        Some(d) if d <= MEASURE_HOLDS => limit,
        _ => MIN_STATEMENTS,
    }
}

/// Bytes of statements per command, well under the 16 MiB a command may be (a
/// context alone may be 1 MiB).
pub(crate) const MAX_BYTES: usize = 8 * 1024 * 1024;

/// How long a batch may go unanswered while the lease stays renewed before its writes
/// count as in doubt (each robot then reloads its context and goes on). The driver
/// has no socket timeout, so something must end a command stuck on a dead connection,
/// but a bound too short restarts robots whenever an overloaded server is merely slow
/// (see docs/bench/2026-11-24-a-pool-of-50-containers.md).
pub const IN_DOUBT_AFTER: Duration = Duration::from_secs(30);

/// One fenced single-document update.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    /// The document's `_id`; it is part of `filter` too.
    pub(crate) id: ObjectId,
    pub(crate) filter: Document,
    pub(crate) update: Update,
}

/// What a statement changes: update operators, or an update pipeline where the
/// change is computed from the document's own fields or the server's clock
/// (`$$NOW`). Operators cost the server several times less than a pipeline
/// (see docs/bench/2026-11-25-scheduled-robots.md).
#[derive(Debug, Clone)]
pub(crate) enum Update {
    Operators(Document),
    Pipeline(Vec<Document>),
}

impl Update {
    fn to_bson(&self) -> Bson {
        match self {
            Update::Operators(ops) => Bson::Document(ops.clone()),
            Update::Pipeline(stages) => stages.clone().into(),
        }
    }

    /// The same update, which also stamps `token` as the document's write id.
    fn stamped(&self, token: &ObjectId) -> Bson {
        match self {
            Update::Operators(ops) => {
                let mut ops = ops.clone();
                let mut set = ops.get_document("$set").cloned().unwrap_or_default();
                set.insert(WRITE_ID, *token);
                ops.insert("$set", set);
                Bson::Document(ops)
            }
            Update::Pipeline(stages) => {
                let mut stages = stages.clone();
                stages.push(doc! {"$set": {WRITE_ID: token}});
                stages.into()
            }
        }
    }
}

impl Statement {
    fn to_command(&self) -> Document {
        doc! {"q": &self.filter, "u": self.update.to_bson(), "multi": false, "upsert": false}
    }

    fn to_command_many(&self) -> Document {
        doc! {"q": &self.filter, "u": self.update.to_bson(), "multi": true, "upsert": false}
    }

    fn bytes(&self) -> usize {
        bson::to_vec(&self.to_command()).map_or(MAX_BYTES, |v| v.len())
    }
}

/// What became of one statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Written {
    /// The fence matched: the update landed.
    Applied,
    /// The fence did not match: nothing changed.
    Fenced,
    /// The lease's write guard closed before the batch was answered: unsent, or on
    /// the wire and fenced by the next holder's adoption; its robot is being stopped.
    Lapsed,
    /// The server refused this statement (e.g. the validator), with its message.
    Refused(String),
}

/// Sends `statements` as one unordered multi-statement `update` on `robots`, and
/// says which applied. Used by the batcher and by adoption alike.
///
/// A server may fail the whole command for one bad statement after applying those
/// before it, so the documents are read back by `_id` first: a statement whose token
/// landed is never sent again, and only the others are resent one by one. See
/// docs/internals.md, "Group commit". Network errors are the caller's.
pub(crate) async fn send(
    robots: &Collection<Document>,
    statements: &[Statement],
) -> Result<Vec<Written>, mongodb::error::Error> {
    let tokens: Vec<ObjectId> = statements.iter().map(|_| ObjectId::new()).collect();
    send_stamped(robots, statements, &tokens).await
}

/// [`send`], each statement stamping the token given: a batch dropped at a
/// suspended deadline is read back by these and sent again with them.
async fn send_stamped(
    robots: &Collection<Document>,
    statements: &[Statement],
    tokens: &[ObjectId],
) -> Result<Vec<Written>, mongodb::error::Error> {
    match send_together(robots, statements, tokens).await {
        Err(e) if statements.len() > 1 && !crate::db::store::is_transient(&e) => {
            let landed = read_tokens(robots, statements).await?;
            let mut out = Vec::with_capacity(statements.len());
            for (s, token) in statements.iter().zip(tokens) {
                if landed.get(&s.id).is_some_and(|d| landed_token(token, d)) {
                    out.push(Written::Applied);
                    continue;
                }
                let one = std::slice::from_ref(s);
                out.push(
                    match send_together(robots, one, std::slice::from_ref(token)).await {
                        Ok(mut w) => w.pop().unwrap_or(Written::Fenced),
                        Err(e) if !crate::db::store::is_transient(&e) => {
                            Written::Refused(crate::db::store::brief(&e))
                        }
                        Err(e) => return Err(e),
                    },
                );
            }
            Ok(out)
        }
        Err(e) if !crate::db::store::is_transient(&e) => {
            Ok(vec![
                Written::Refused(crate::db::store::brief(&e));
                statements.len()
            ])
        }
        other => other,
    }
}

/// Sends one statement that may change many documents (`multi`), as the same
/// `update` command; an error of the server (a refused document fails it as a whole
/// on the dev server, and on MongoDB reports it) is returned as is.
pub(crate) async fn send_many(
    robots: &Collection<Document>,
    statement: &Statement,
) -> Result<u64, mongodb::error::Error> {
    let db: Database = robots.client().database(&robots.namespace().db);
    let reply = db
        .run_command(crate::db::write_concern::with_write_concern(
            doc! {
                "update": robots.name(),
                "updates": [statement.to_command_many()],
                "ordered": false,
            },
            robots,
        ))
        .await?;
    if let Some(e) = crate::db::store::write_concern_failure(&reply) {
        return Err(e);
    }
    match reply.get_array("writeErrors").ok().and_then(|e| e.first()) {
        Some(e) => Err(mongodb::error::Error::custom(format!(
            "the database refused a document: {}",
            e.as_document()
                .and_then(|d| d.get_str("errmsg").ok())
                .unwrap_or("refused")
        ))),
        None => Ok(crate::db::store::int(&reply, "n").unwrap_or(0).max(0) as u64),
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
            c.insert("u", s.update.stamped(token));
            c
        })
        .collect();
    let db: Database = robots.client().database(&robots.namespace().db);
    let reply = db
        .run_command(crate::db::write_concern::with_write_concern(
            doc! {"update": robots.name(), "updates": updates, "ordered": false},
            robots,
        ))
        .await?;
    if let Some(e) = crate::db::store::write_concern_failure(&reply) {
        return Err(e);
    }
    let matched = crate::db::store::int(&reply, "n").map_or(0, |n| n.max(0) as usize);
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

/// The statements' documents as a majority holds them (`_id` and `write_id` only),
/// by `_id`. Read at majority: a token only the primary holds can still be rolled
/// back by a failover, and counting its write as landed would lose the checkpoint.
/// One a majority does not hold yet reads as not landed, and is sent again under its
/// own condition, which matches nothing if the first one stays. Under a weaker write
/// concern (`--unsafe-write-concern`) an answered write may not be in the majority's
/// snapshot yet, and reading there would call it fenced: read what the primary holds.
async fn read_tokens(
    robots: &Collection<Document>,
    statements: &[Statement],
) -> Result<HashMap<ObjectId, Document>, mongodb::error::Error> {
    let ids: Vec<ObjectId> = statements.iter().map(|s| s.id).collect();
    let mut cursor = robots
        .find(doc! {"_id": {"$in": &ids}})
        .projection(doc! {WRITE_ID: 1})
        .read_concern(read_back_concern(robots.write_concern()))
        .await?;
    let mut now: HashMap<ObjectId, Document> = HashMap::new();
    while let Some(d) = cursor.try_next().await? {
        if let Ok(id) = d.get_object_id("_id") {
            now.insert(id, d);
        }
    }
    Ok(now)
}

/// The read concern of a read-back after writes sent with `written`: majority when
/// they were acknowledged by a majority, else the primary's own (`local`).
fn read_back_concern(
    written: Option<&mongodb::options::WriteConcern>,
) -> mongodb::options::ReadConcern {
    use mongodb::options::{Acknowledgment, ReadConcern};
    match written.and_then(|w| w.w.as_ref()) {
        Some(Acknowledgment::Majority) => ReadConcern::majority(),
        _ => ReadConcern::local(),
    }
}

/// Whether the write stamped `token` is the one `doc` shows. A robot writes again only
/// after its previous write was answered, and no other instance can write past the
/// fence, so nothing else replaces the token before the read-back.
pub(crate) fn landed_token(token: &ObjectId, doc: &Document) -> bool {
    doc.get_object_id(WRITE_ID).is_ok_and(|t| t == *token)
}

struct Queued {
    statement: Statement,
    reply: oneshot::Sender<Result<Written, mongodb::error::Error>>,
}

/// The group-commit queue of one held slot. Cloned into every robot's writer; the
/// batcher task ends when the last clone is dropped (the lease ended).
#[derive(Debug, Clone)]
pub(crate) struct GroupCommit {
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
    pub(crate) fn spawn(
        store: Store,
        pacer: Arc<WritePacer>,
        guard: WriteGuard,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Unbounded is bounded here: every robot waits for its write's answer before
        // writing again, so the queue never holds more than one write per robot.
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(batcher(rx, store, pacer, guard, metrics));
        GroupCommit { queue }
    }

    /// Queues one fenced write and waits for what became of it.
    pub(crate) async fn write(
        &self,
        statement: Statement,
    ) -> Result<Written, mongodb::error::Error> {
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Queued { statement, reply }).is_err() {
            return Ok(Written::Lapsed);
        }
        answer.await.unwrap_or(Ok(Written::Lapsed))
    }
}

/// The writes of one command being gathered.
struct Batch {
    writes: Vec<Queued>,
    bytes: usize,
    robots: std::collections::HashSet<ObjectId>,
}

impl Batch {
    fn new(first: Queued) -> Batch {
        let mut b = Batch {
            writes: Vec::new(),
            bytes: 0,
            robots: Default::default(),
        };
        b.add(first);
        b
    }

    fn has_room(&self, limit: usize) -> bool {
        self.writes.len() < limit && self.bytes < MAX_BYTES
    }

    /// Adds `q`, unless its robot has a write here already: that one is given back,
    /// for the next command. One write per robot per command, because a short
    /// count is settled by reading each robot's `write_id` back, and a robot's
    /// second write would hide its first (a scheduled robot's run checkpoints
    /// while its instance writes the firing state).
    fn add(&mut self, q: Queued) -> Option<Queued> {
        if !self.robots.insert(q.statement.id) {
            return Some(q);
        }
        self.bytes += q.statement.bytes();
        self.writes.push(q);
        None
    }
}

/// Gathers writes into batches (the first waits at most [`WINDOW`] for company),
/// takes a pacer permit per batch, and sends one batch at a time.
async fn batcher(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    store: Store,
    pacer: Arc<WritePacer>,
    guard: WriteGuard,
    metrics: Arc<Metrics>,
) {
    // Sized from the last command's time (see `next_batch_limit`), while that is
    // recent.
    let mut limit = MIN_STATEMENTS;
    let mut measured_at: Option<Instant> = None;
    let budget = pacer.command_budget();
    // A write held back for the next batch: its robot already has one in this one.
    let mut held: Option<Queued> = None;
    loop {
        let first = match held.take() {
            Some(q) => q,
            None => match rx.recv().await {
                Some(q) => q,
                None => return,
            },
        };
        limit = limit_after(limit, measured_at.map(|at| at.elapsed()));
        let mut batch = Batch::new(first);
        let until = Instant::now() + WINDOW;
        while held.is_none() && batch.has_room(limit) {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(q)) => held = batch.add(q),
                Ok(None) | Err(_) => break,
            }
        }
        // Waiting here lets the next batch fill up behind this one.
        let permit = pacer.acquire_owned().await;
        // Writes queued meanwhile join this batch, up to its limits.
        while held.is_none() && batch.has_room(limit) {
            match rx.try_recv() {
                Ok(q) => held = batch.add(q),
                Err(_) => break,
            }
        }
        let batch = batch.writes;
        metrics.write_batches.inc();
        metrics.batched_writes.inc_by(batch.len() as u64);
        // One batch in flight: what queues meanwhile is the next batch. Batches in
        // flight together were several times slower in all than one at a time (see
        // docs/bench/2026-11-23-scale.md).
        let statements = batch.len();
        match commit(batch, &store, &guard, permit).await {
            Some(took) => {
                limit = next_batch_limit(took, statements, budget);
                measured_at = Some(Instant::now());
            }
            None => measured_at = None,
        }
    }
}

/// Sends one batch and answers its writers; returns how long the server took to
/// answer, when it did.
async fn commit(
    batch: Vec<Queued>,
    store: &Store,
    guard: &WriteGuard,
    _permit: OwnedWritePermit,
) -> Option<Duration> {
    if !guard.admit().await {
        for q in batch {
            let _ = q.reply.send(Ok(Written::Lapsed));
        }
        return None;
    }
    let statements: Vec<Statement> = batch.iter().map(|q| q.statement.clone()).collect();
    let tokens: Vec<ObjectId> = statements.iter().map(|_| ObjectId::new()).collect();
    let t = Instant::now();
    let r = match sent_through_suspensions(store, guard, &statements, &tokens).await {
        Some(r) => r,
        None => {
            for q in batch {
                let _ = q.reply.send(Ok(Written::Lapsed));
            }
            return None;
        }
    };
    let took = t.elapsed();
    tracing::trace!(
        writes = statements.len(),
        ms = took.as_millis() as u64,
        "group commit"
    );
    match r {
        Ok(written) => {
            for (q, w) in batch.into_iter().zip(written) {
                let _ = q.reply.send(Ok(w));
            }
            Some(took)
        }
        Err(e) => {
            for q in batch {
                let _ = q.reply.send(Err(e.clone()));
            }
            None
        }
    }
}

/// Sends `statements` under the lease, and what became of each; None once the lease
/// was given up. A batch in doubt (dropped at a suspended deadline, no answer, or a
/// failed connection) waits until the lease is open (at once, or once a late renewal
/// proved the epoch); then its tokens are read back and only what did not land is
/// sent again, with the same tokens, so nothing is applied twice and nothing is lost.
/// Each sending takes the collection from `store` anew: a resume replaces the
/// client, and the connections open across the outage may never answer.
async fn sent_through_suspensions(
    store: &Store,
    guard: &WriteGuard,
    statements: &[Statement],
    tokens: &[ObjectId],
) -> Option<Result<Vec<Written>, mongodb::error::Error>> {
    use crate::db::store::is_transient;
    let mut out: Vec<Option<Written>> = vec![None; statements.len()];
    loop {
        // Every sending, a resend included, only under an open lease.
        if !guard.admit().await {
            return None;
        }
        let left: Vec<usize> = (0..statements.len())
            .filter(|&i| out[i].is_none())
            .collect();
        let stmts: Vec<Statement> = left.iter().map(|&i| statements[i].clone()).collect();
        let toks: Vec<ObjectId> = left.iter().map(|&i| tokens[i]).collect();
        match while_open(
            guard,
            IN_DOUBT_AFTER,
            send_stamped(&store.robots(), &stmts, &toks),
        )
        .await
        {
            Answer::Sent(Ok(written)) => {
                for (i, w) in left.into_iter().zip(written) {
                    out[i] = Some(w);
                }
                return Some(Ok(out
                    .into_iter()
                    .map(|w| w.unwrap_or(Written::Fenced))
                    .collect()));
            }
            Answer::Sent(Err(e)) if !is_transient(&e) => return Some(Err(e)),
            // The connection failed under it: a server restarting, an election.
            Answer::Sent(Err(_)) => tokio::time::sleep(RETRY_AFTER).await,
            Answer::Lapsed => return None,
            Answer::InDoubt if guard.is_open() => {
                return Some(Err(mongodb::error::Error::custom(format!(
                    "no answer to {} robot write(s) within {} s; they may or may not have landed",
                    stmts.len(),
                    IN_DOUBT_AFTER.as_secs()
                ))));
            }
            Answer::InDoubt => {}
        }
        // In doubt: read back what landed once the lease is open, never before.
        let now = loop {
            if !guard.admit().await {
                return None;
            }
            match tokio::time::timeout(IN_DOUBT_AFTER, read_tokens(&store.robots(), &stmts)).await {
                Ok(Ok(now)) => break now,
                Ok(Err(e)) if !is_transient(&e) => return Some(Err(e)),
                _ => tokio::time::sleep(RETRY_AFTER).await,
            }
        };
        for (i, (s, token)) in left.iter().zip(stmts.iter().zip(&toks)) {
            if now.get(&s.id).is_some_and(|d| landed_token(token, d)) {
                out[*i] = Some(Written::Applied);
            }
        }
        if out.iter().all(Option::is_some) {
            return Some(Ok(out.into_iter().flatten().collect()));
        }
    }
}

/// How long a batch whose connection failed waits before it looks again: long enough
/// not to spin on a server that refuses connections, short beside a tick.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// What became of a command awaited under the lease.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer<T> {
    /// It answered while the lease was open.
    Sent(T),
    /// The lease's write guard closed first; the command was dropped (unsent, if the
    /// driver still held it).
    Lapsed,
    /// No answer within the bound, or the lease was suspended first (the command
    /// was dropped): it may or may not have landed.
    InDoubt,
}

/// Awaits `command` while `guard` stays open, following its deadline as renewals move
/// it on, for at most `limit`.
///
/// Dropped the moment the deadline passes, so a command the driver still holds can
/// never reach a restarted server before a late renewal proves the epoch (or ever,
/// once the lease is given up). One already on the wire
/// that lands later is harmless: every statement is fenced, and the next holder's
/// adoption raised the fence first.
pub(crate) async fn while_open<F: std::future::Future>(
    guard: &WriteGuard,
    limit: Duration,
    command: F,
) -> Answer<F::Output> {
    // Never polled, so never sent, under a lease that is not open.
    if guard.is_revoked() {
        return Answer::Lapsed;
    }
    if !guard.is_open() {
        return Answer::InDoubt;
    }
    let give_up = Instant::now() + limit;
    let mut deadline = guard.watch();
    let mut moving = true;
    tokio::pin!(command);
    loop {
        let at = *deadline.borrow_and_update();
        // Woken at the deadline to see whether it still holds; a guard on a clock of
        // its own (tests) that calls a passed deadline open waits for news instead.
        let wake = if Instant::now() < at {
            at.min(give_up)
        } else {
            give_up
        };
        tokio::select! {
            r = &mut command => return Answer::Sent(r),
            changed = deadline.changed(), if moving => moving = changed.is_ok(),
            () = tokio::time::sleep_until(wake) => {}
        }
        if guard.is_revoked() {
            return Answer::Lapsed;
        }
        if !guard.is_open() {
            // Suspended: dropped, and in doubt. Its writers re-read and resend what
            // did not land once a late renewal has proved the epoch, never before.
            return Answer::InDoubt;
        }
        if Instant::now() >= give_up {
            return Answer::InDoubt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::MonotonicClock;

    #[test]
    fn a_read_back_reads_what_the_writes_were_acknowledged_by() {
        use mongodb::options::{Acknowledgment, ReadConcern, WriteConcern};
        let majority = crate::db::write_concern::majority();
        assert_eq!(read_back_concern(Some(&majority)), ReadConcern::majority());
        // Under --unsafe-write-concern an answered write may not be in the
        // majority's snapshot yet: reading there would call it fenced.
        let one = WriteConcern::builder().w(Acknowledgment::Nodes(1)).build();
        assert_eq!(read_back_concern(Some(&one)), ReadConcern::local());
        assert_eq!(read_back_concern(None), ReadConcern::local());
    }

    #[test]
    fn each_form_of_update_stamps_the_write_id_beside_its_own_changes() {
        let token = ObjectId::new();
        let ops = Update::Operators(doc! {"$set": {"a": 1}, "$push": {"b": 2}});
        let Bson::Document(stamped) = ops.stamped(&token) else {
            panic!("operators stay a document");
        };
        assert_eq!(
            stamped,
            doc! {"$set": {"a": 1, WRITE_ID: token}, "$push": {"b": 2}}
        );
        let bare = Update::Operators(doc! {"$inc": {"n": 1}});
        assert_eq!(
            bare.stamped(&token),
            Bson::Document(doc! {"$inc": {"n": 1}, "$set": {WRITE_ID: token}})
        );
        let pipeline = Update::Pipeline(vec![doc! {"$set": {"a": "$$NOW"}}]);
        assert_eq!(
            pipeline.stamped(&token),
            Bson::Array(vec![
                Bson::Document(doc! {"$set": {"a": "$$NOW"}}),
                Bson::Document(doc! {"$set": {WRITE_ID: token}}),
            ])
        );
        assert_eq!(
            pipeline.to_bson(),
            Bson::Array(vec![Bson::Document(doc! {"$set": {"a": "$$NOW"}})])
        );
    }

    #[test]
    fn batches_are_sized_to_the_budget_at_the_measured_cost() {
        let ms = Duration::from_millis;
        // Nothing measured yet, or a fast server: the most.
        assert_eq!(next_batch_limit(Duration::ZERO, 0, ms(56)), MAX_STATEMENTS);
        assert_eq!(next_batch_limit(ms(69), 100, ms(225)), MAX_STATEMENTS);
        // History checkpoints at --tick 250ms (1.28 ms each, half of a 112 ms margin).
        assert_eq!(next_batch_limit(ms(128), 100, ms(56)), 43);
        // Plain ones there: 0.69 ms each.
        assert_eq!(next_batch_limit(ms(69), 100, ms(56)), 81);
        // However slow, a few still go together.
        assert_eq!(next_batch_limit(ms(2_000), 10, ms(22)), MIN_STATEMENTS);
        // A budget of half the margin, from the pacer.
        let pacer = WritePacer::new(ms(112));
        assert_eq!(pacer.command_budget(), ms(56));
    }

    #[test]
    fn a_stale_or_missing_measure_starts_small_again() {
        let ms = Duration::from_millis;
        assert_eq!(limit_after(80, Some(ms(200))), 80);
        assert_eq!(limit_after(80, Some(MEASURE_HOLDS)), 80);
        assert_eq!(limit_after(80, Some(ms(1_001))), MIN_STATEMENTS);
        assert_eq!(limit_after(80, None), MIN_STATEMENTS);
    }

    fn guard_for(d: Duration) -> WriteGuard {
        WriteGuard::new(Instant::now() + d, Arc::new(MonotonicClock))
    }

    /// Renews `guard` every `every` by `by`, as the lease does while the server answers.
    fn renewing(guard: &WriteGuard, every: Duration, by: Duration) -> tokio::task::JoinHandle<()> {
        let guard = guard.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                guard.extend(Instant::now() + by);
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_counts_while_renewals_keep_the_lease_open() {
        let guard = guard_for(Duration::from_millis(1500));
        let renewals = renewing(&guard, Duration::from_secs(1), Duration::from_millis(1550));
        let slow = tokio::time::sleep(Duration::from_secs(4));
        let t = Instant::now();
        let answer = while_open(&guard, IN_DOUBT_AFTER, async {
            slow.await;
            7
        })
        .await;
        assert_eq!(answer, Answer::Sent(7), "the first deadline was 1.5 s away");
        assert_eq!(t.elapsed(), Duration::from_secs(4));
        renewals.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_suspended_at_its_deadline_drops_the_command_in_doubt() {
        // Not given up: a late renewal may prove the epoch, and the writers then
        // re-read what landed and resend the rest.
        let guard = guard_for(Duration::from_millis(1500));
        let t = Instant::now();
        let answer = while_open(&guard, IN_DOUBT_AFTER, std::future::pending::<()>()).await;
        assert_eq!(answer, Answer::InDoubt);
        assert_eq!(t.elapsed(), Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_lease_drops_the_command_at_once() {
        let guard = guard_for(Duration::from_secs(2));
        let revoker = guard.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            revoker.revoke();
        });
        let t = Instant::now();
        let answer = while_open(&guard, IN_DOUBT_AFTER, std::future::pending::<()>()).await;
        assert_eq!(answer, Answer::Lapsed);
        assert_eq!(t.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_under_a_renewed_lease_is_in_doubt_after_the_bound() {
        let guard = guard_for(Duration::from_millis(1500));
        let renewals = renewing(&guard, Duration::from_secs(1), Duration::from_millis(1550));
        let t = Instant::now();
        let answer = while_open(&guard, IN_DOUBT_AFTER, std::future::pending::<()>()).await;
        assert_eq!(answer, Answer::InDoubt);
        assert_eq!(t.elapsed(), IN_DOUBT_AFTER);
        renewals.abort();
    }

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
