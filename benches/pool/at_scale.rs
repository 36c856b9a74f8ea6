//! The reads that grow with the pool, at 100,000 robots: `robot create`'s placement
//! (by load, the default) and `status`, timed through the indexes `init` makes
//! (docs/mongodb.md, "Indexes"), then on the same data with those indexes dropped,
//! which is how the release before them read (a scan of every robot). No worker
//! runs: the figures are the reads' own.

use bson::{doc, Document};

use super::*;

/// How many robots the phase seeds, and how many of them declare limits.
const ROBOTS: u32 = 100_000;
const WITH_LIMITS: u32 = 1_000;
/// Each robot's context, as a counter's grows after some steps (bytes).
const CONTEXT_BYTES: usize = 1024;

/// Seeds `ROBOTS` robots over the pool's slots as `robot create` would store them,
/// in chunks of 1,000, then lets `init` put the slots' counts right.
async fn seed(db: &TestDb, slots: u32) {
    let filler = "x".repeat(CONTEXT_BYTES);
    let now = bson::DateTime::now();
    let mut chunk: Vec<Document> = Vec::with_capacity(1000);
    for i in 0..ROBOTS {
        let spec = if i % (ROBOTS / WITH_LIMITS) == 0 {
            doc! {"interval_ms": 1000_i64, "limits": {"cpu": 0.5, "memory": "64MB"}}
        } else {
            doc! {"interval_ms": 1000_i64}
        };
        chunk.push(doc! {
            "name": format!("seed-{i:06}"), "kind": "counter", "spec": spec,
            "slot_id": format!("slot-{:03}", i % slots + 1), "epoch": 0_i64,
            "context": {"n": i as i64, "pad": &filler}, "seq": 0_i64, "paused": false,
            "status": if i % 997 == 0 { "failed" } else { "pending" },
            "error": if i % 997 == 0 { bson::Bson::String("broke".into()) } else { bson::Bson::Null },
            "restarts": 0_i64, "worker": bson::Bson::Null, "created_at": now,
            "checkpointed_at": bson::Bson::Null,
        });
        if chunk.len() == 1000 {
            db.store
                .robots()
                .insert_many(std::mem::take(&mut chunk))
                .await
                .expect("seed robots");
        }
    }
    db.cli_ok(&["init", "--slots", &slots.to_string()]);
}

/// The median of `runs` timings of the CLI with `args` (s).
fn timed(db: &TestDb, runs: usize, args: impl Fn(usize) -> Vec<String>) -> f64 {
    let mut took: Vec<f64> = (0..runs)
        .map(|i| {
            let a = args(i);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let t = Instant::now();
            db.cli_ok(&a);
            t.elapsed().as_secs_f64()
        })
        .collect();
    took.sort_by(|a, b| a.total_cmp(b));
    took[took.len() / 2]
}

/// (create, status) medians on `db` as it stands; `tag` keeps robot names apart.
fn measure(db: &TestDb, runs: usize, tag: &str) -> (f64, f64) {
    let create = timed(db, runs, |i| {
        [
            "robot",
            "create",
            "--name",
            &format!("{tag}{i}"),
            "--kind",
            "counter",
            "--count",
            "10",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    });
    let status = timed(db, runs, |_| vec!["status".to_string()]);
    (create, status)
}

pub(super) async fn at_scale(quick: bool) -> Row {
    let runs = if quick { 3 } else { 7 };
    let slots = 20;
    let name = format!(
        "Reads at {ROBOTS} robots ({CONTEXT_BYTES}-byte contexts, {WITH_LIMITS} declaring limits, {slots} slots, no worker): `robot create --count 10` by load and `status`, median of {runs}, through the indexes, then with them dropped (as the release before read: a scan)"
    );
    fresh_server();
    let db = TestDb::new("b_at_scale").await;
    db.init(slots).await;
    let t = Instant::now();
    seed(&db, slots).await;
    let seeded = t.elapsed().as_secs_f64();
    let (create_indexed, status_indexed) = measure(&db, runs, "i");
    for index in [
        slotpool::db::indexed::SLOT_STATE,
        slotpool::db::indexed::DECLARES_LIMITS,
        slotpool::db::indexed::FAILED,
    ] {
        db.store
            .robots()
            .drop_index(index)
            .await
            .expect("drop an index");
    }
    let (create_scan, status_scan) = measure(&db, runs, "s");
    Row {
        name,
        figures: format!(
            "through the indexes: create {create_indexed:.2} s, status {status_indexed:.2} s; without them: create {create_scan:.2} s, status {status_scan:.2} s (seeding took {seeded:.0} s). The dev server fetches every document even for a group over an index's own fields, which mongod answers from the index alone: its status figure is the dev server's, not mongod's"
        ),
        goal: "-".into(),
    }
}
