//! No full scan of `robots` on the paths that grow with the pool: `robot create`'s
//! placement, `status`, the counts of `init` and `rebalance`, and the dashboard's
//! snapshot. With the server's profiler on, each of those runs as a person runs it;
//! then every read of `robots` the profiler recorded is explained, as sent, and
//! none may plan a `COLLSCAN` (docs/mongodb.md, "Indexes").

mod common;

use bson::{doc, Bson, Document};
use common::{web::WebProc, TestDb};
use futures::TryStreamExt;

/// The command as the profiler recorded it, without what only its session carried
/// and the concerns `explain` does not take (its plan is the same).
fn as_sent(command: &Document) -> Document {
    command
        .iter()
        .filter(|(k, _)| {
            !k.starts_with('$')
                && !matches!(
                    k.as_str(),
                    "lsid" | "txnNumber" | "writeConcern" | "readConcern"
                )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Every plan stage named in an explain's answer.
fn stages(v: &Bson, out: &mut Vec<String>) {
    match v {
        Bson::Document(d) => {
            for (k, v) in d {
                if k == "stage" {
                    if let Bson::String(s) = v {
                        out.push(s.clone());
                    }
                }
                if k != "command" {
                    stages(v, out);
                }
            }
        }
        Bson::Array(a) => a.iter().for_each(|v| stages(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_read_of_robots_that_grows_with_the_pool_scans_them() {
    let db = TestDb::new("indexed_reads").await;
    db.init(4).await;
    db.create_counters(40);
    let limits = r#"{"limits": {"cpu": 0.5, "memory": "64MB"}}"#;
    for name in ["heavy-1", "heavy-2", "heavy-3"] {
        db.exec(name, "/bin/true", &["--spec", limits]);
    }
    // One failed robot, so that status reads a failed one's error.
    db.store
        .robots()
        .update_one(
            doc! {"name": "c-1"},
            doc! {"$set": {"status": "failed", "error": "broke on purpose"}},
        )
        .await
        .unwrap();

    let database = db.store.db();
    database.run_command(doc! {"profile": 2}).await.unwrap();
    // Placement by load (the default), status, the counts, the dashboard.
    db.cli_ok(&[
        "robot", "create", "--name", "later", "--kind", "counter", "--count", "5",
    ]);
    db.cli_ok(&["status"]);
    db.cli_ok(&["status", "--json"]);
    db.cli_ok(&["rebalance", "--dry-run"]);
    db.cli_ok(&["init", "--slots", "4"]);
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;
    let overview = web.overview_with_robots().await;
    assert_eq!(overview["summary"]["robots"], 48, "{overview}");
    drop(web);
    database.run_command(doc! {"profile": 0}).await.unwrap();

    let robots = format!("{}.robots", db.name);
    let profiled: Vec<Document> = database
        .collection::<Document>("system.profile")
        .find(doc! {"ns": &robots})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut explained = Vec::new();
    for entry in &profiled {
        let Ok(command) = entry.get_document("command") else {
            continue;
        };
        let sent = as_sent(command);
        let Some((name, _)) = sent.iter().next() else {
            continue;
        };
        if !matches!(name.as_str(), "find" | "aggregate" | "count" | "distinct") {
            continue;
        }
        // A count of the whole collection (the dashboard's estimate) is answered
        // from its metadata: mongod's RECORD_STORE_FAST_COUNT, no document read.
        if name == "count" && sent.get_document("query").map_or(true, |q| q.is_empty()) {
            continue;
        }
        let answer = database
            .run_command(doc! {"explain": sent.clone(), "verbosity": "queryPlanner"})
            .await
            .unwrap_or_else(|e| panic!("explain {sent}: {e}"));
        let mut found = Vec::new();
        stages(&Bson::Document(answer), &mut found);
        println!("{found:?} {sent}");
        assert!(
            !found.iter().any(|s| s == "COLLSCAN"),
            "a read of robots scans them all: {sent}"
        );
        explained.push(sent);
    }
    // The reads this is about were seen: the grouped counts, the failed robots, the
    // robots that declare limits, and a slot's robots.
    let seen = |needle: &str| explained.iter().any(|c| c.to_string().contains(needle));
    for needle in ["$group", "\"failed\"", "spec.limits", "slot_id"] {
        assert!(seen(needle), "no read of robots with {needle} was profiled");
    }
    // On a database an older init set up, the index is missing: status still
    // answers, and says to run init.
    db.store
        .robots()
        .drop_index(slotpool::db::indexed::SLOT_STATE)
        .await
        .unwrap();
    let out = db.cli(&["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("slot_state") && err.contains("slotpool init"),
        "says what is missing and what to run: {err}"
    );
    db.cli_ok(&["init", "--slots", "4"]);
    let out = db.cli(&["status"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    // A read that has no index to name still scans, and this test would say so.
    let scan = database
        .run_command(doc! {"explain": {"find": "robots", "filter": {"kind": "counter"}}})
        .await
        .unwrap();
    let mut found = Vec::new();
    stages(&Bson::Document(scan), &mut found);
    assert!(found.iter().any(|s| s == "COLLSCAN"), "{found:?}");
}
