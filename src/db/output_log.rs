//! Robot output kept per robot: the last [`KEEP_LINES`] lines an `exec` robot wrote,
//! in the `robot_output` collection as `{_id: robot, gen, lines: [{n, at, stream,
//! text}]}`, read by `slotpool robot logs`.
//!
//! Output must never cost a robot its lease or a checkpoint its turn: lines are
//! rate-limited ([`crate::robot::output`]) and cut to [`LINE_BYTES`], flushed per slot
//! every [`FLUSH_EVERY`] in one command under the slot's [`WritePacer`], capped at
//! [`MAX_QUEUED`], and never written once the write guard closed. Writes upsert on
//! `{_id, gen: {$lte: mine}}`, so an older instance's upsert collides and is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Bson, Document};
use mongodb::{Collection, Database};
use tokio::sync::mpsc;

use crate::db::field::{AT, DELETED, EXPIRE_AT, GEN, LINES, N, STREAM, TEXT};
use crate::db::guard::WriteGuard;
use crate::db::pacing::WritePacer;
use crate::db::store::{Store, ROBOTS};

/// Lines kept per robot.
pub(crate) const KEEP_LINES: i64 = 200;

/// Bytes of a line kept (a longer one is cut at a character boundary, marked `…`).
pub(crate) const LINE_BYTES: usize = 1024;

/// How often a held slot's new lines are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Lines waiting for the next write, over all robots of a held slot.
pub(crate) const MAX_QUEUED: usize = 10_000;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

#[derive(Debug)]
struct Pending {
    id: ObjectId,
    gen: i64,
    stream: Stream,
    at: bson::DateTime,
    text: String,
}

/// A held slot's output writer; clones share it, and its task ends with the last
/// clone (the lease ended).
#[derive(Debug, Clone)]
pub struct OutputLog {
    queue: mpsc::Sender<Pending>,
}

impl OutputLog {
    /// Starts the writer for one held slot.
    pub fn spawn(store: Store, pacer: Arc<WritePacer>, guard: WriteGuard) -> Self {
        let (queue, rx) = mpsc::channel(MAX_QUEUED);
        tokio::spawn(writer(rx, store, pacer, guard));
        OutputLog { queue }
    }

    /// Keeps one line of robot `id`'s instance `gen`; never waits. False when it was
    /// dropped (the queue is full or the lease ended).
    pub fn keep(&self, id: ObjectId, gen: i64, stream: Stream, text: &str) -> bool {
        self.queue
            .try_send(Pending {
                id,
                gen,
                stream,
                at: bson::DateTime::now(),
                text: cut(text, LINE_BYTES),
            })
            .is_ok()
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Every [`FLUSH_EVERY`]: what queued since, one statement per robot instance.
async fn writer(
    mut rx: mpsc::Receiver<Pending>,
    store: Store,
    pacer: Arc<WritePacer>,
    guard: WriteGuard,
) {
    // Each instance numbers its lines from 1, so a reader can follow them.
    let mut numbered: HashMap<(ObjectId, i64), i64> = HashMap::new();
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        tokio::time::sleep(FLUSH_EVERY).await;
        let mut batch = vec![first];
        while let Ok(p) = rx.try_recv() {
            batch.push(p);
        }
        if !guard.admit().await {
            continue;
        }
        let statements = statements(batch, &mut numbered);
        let _permit = pacer.acquire_owned().await;
        if let Err(e) = send(&store.outputs(), statements).await {
            tracing::debug!("robot output not kept: {}", crate::db::store::brief(&e));
        }
    }
}

/// One upsert per robot instance, its lines in order, numbered on.
fn statements(batch: Vec<Pending>, numbered: &mut HashMap<(ObjectId, i64), i64>) -> Vec<Document> {
    let mut order: Vec<(ObjectId, i64)> = Vec::new();
    let mut lines: HashMap<(ObjectId, i64), Vec<Document>> = HashMap::new();
    for p in batch {
        let key = (p.id, p.gen);
        let n = numbered.entry(key).or_insert(0);
        *n += 1;
        let line = doc! {N: *n, AT: p.at, STREAM: p.stream.name(), TEXT: p.text};
        lines
            .entry(key)
            .or_insert_with(|| {
                order.push(key);
                Vec::new()
            })
            .push(line);
    }
    order
        .into_iter()
        .map(|key| {
            let (id, gen) = key;
            let each = lines.remove(&key).unwrap_or_default();
            doc! {
                "q": {"_id": id, GEN: {"$lte": gen}},
                "u": {
                    "$set": {GEN: gen},
                    "$push": {LINES: {"$each": each, "$slice": -KEEP_LINES}},
                },
                "upsert": true,
            }
        })
        .collect()
}

async fn send(
    outputs: &Collection<Document>,
    statements: Vec<Document>,
) -> Result<(), mongodb::error::Error> {
    let db: Database = outputs.client().database(&outputs.namespace().db);
    // A chunk a majority did not take is reported once every chunk went: the rest
    // are sent all the same.
    let mut undurable = None;
    for chunk in statements.chunks(crate::db::group_commit::MAX_STATEMENTS) {
        // Unordered: a fenced instance's statement (its upsert collides with a newer
        // instance's document) fails alone.
        let reply = db
            .run_command(crate::db::write_concern::with_write_concern(
                doc! {
                    "update": outputs.name(),
                    "updates": chunk,
                    "ordered": false,
                },
                outputs,
            ))
            .await?;
        if let Some(e) = crate::db::store::write_concern_failure(&reply) {
            undurable.get_or_insert(e);
        }
    }
    undurable.map_or(Ok(()), Err)
}

/// Removes kept output whose robot no longer exists (left by versions that
/// deleted it while a holder could still write; tombstones are left to expire).
/// Returns how many went.
pub(crate) async fn remove_orphaned(store: &Store) -> Result<u64, mongodb::error::Error> {
    use futures::TryStreamExt;
    let orphans: Vec<Bson> = store
        .outputs()
        .aggregate(vec![
            doc! {"$match": {DELETED: {"$ne": true}}},
            doc! {"$lookup": {"from": ROBOTS, "localField": "_id", "foreignField": "_id", "as": "robot"}},
            doc! {"$match": {"robot": {"$size": 0}}},
            doc! {"$project": {"_id": 1}},
        ])
        .await?
        .try_collect::<Vec<Document>>()
        .await?
        .into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect();
    let mut removed = 0;
    for chunk in orphans.chunks(crate::db::store::CHUNK) {
        // Still no robot (and still not a tombstone) at the moment of removal.
        removed += store
            .outputs()
            .delete_many(doc! {"_id": {"$in": chunk}, DELETED: {"$ne": true}})
            .await?
            .deleted_count;
    }
    Ok(removed)
}

/// Robot `id`'s kept output document, if it has one.
pub(crate) async fn kept(
    store: &Store,
    id: &Bson,
) -> Result<Option<Document>, mongodb::error::Error> {
    store.outputs().find_one(doc! {"_id": id}).await
}

/// Marks a deleted robot's output as deleted, for an hour: a holder still
/// stopping the robot may flush a last line, and its upsert (fenced by
/// generation) now collides with the tombstone instead of re-creating the
/// document. The TTL index removes it.
pub(crate) async fn bury(store: &Store, id: &Bson) -> Result<(), mongodb::error::Error> {
    store
        .outputs()
        .update_one(
            doc! {"_id": id},
            vec![doc! {"$set": {
                GEN: i64::MAX, DELETED: true, LINES: [],
                EXPIRE_AT: {"$add": ["$$NOW", 3_600_000_i64]},
            }}],
        )
        .upsert(true)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(600); // 1,200 bytes
        let c = cut(&long, LINE_BYTES);
        assert!(c.len() <= LINE_BYTES, "{}", c.len());
        assert!(c.ends_with('…'));
    }

    /// The line numbers one statement carries.
    fn numbers(statement: &Document) -> Vec<i64> {
        let push = statement.get_document("u").unwrap().get_document("$push");
        let each = push
            .unwrap()
            .get_document("lines")
            .unwrap()
            .get_array("$each");
        each.unwrap()
            .iter()
            .map(|l| l.as_document().unwrap().get_i64("n").unwrap())
            .collect()
    }

    #[test]
    fn each_instance_numbers_its_lines_on_across_writes() {
        let (a, b) = (ObjectId::new(), ObjectId::new());
        let line = |id, gen, text: &str| Pending {
            id,
            gen,
            stream: Stream::Stdout,
            at: bson::DateTime::now(),
            text: text.into(),
        };
        let mut numbered = HashMap::new();
        let first = statements(
            vec![line(a, 1, "a1"), line(b, 4, "b1"), line(a, 1, "a2")],
            &mut numbered,
        );
        assert_eq!(first.len(), 2, "one statement per instance");
        assert_eq!(numbers(&first[0]), [1, 2]);
        assert_eq!(numbers(&first[1]), [1]);
        let q = first[0].get_document("q").unwrap();
        assert_eq!(q.get_document("gen").unwrap().get_i64("$lte").unwrap(), 1);
        // The next write goes on from 3; a new instance starts at 1.
        let next = statements(vec![line(a, 1, "a3"), line(a, 2, "new")], &mut numbered);
        assert_eq!(numbers(&next[0]), [3]);
        assert_eq!(numbers(&next[1]), [1]);
    }
}
