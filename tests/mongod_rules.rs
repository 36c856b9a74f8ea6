//! mongod's rules, as the suite's dev server enforces them (scripts/devdb/rules.py):
//! each rule's bad shape, sent as a client sends it, gets mongod's own code and
//! message, and what mongod takes still runs. docs/mongodb.md cites each rule.
//!
//! Against a user's MongoDB (MONGODB_URI) these check mongod itself.

mod common;

use bson::{doc, Bson, Document};
use common::TestDb;

/// A command's error: (code, message), from a command error or its first write error.
async fn refused(db: &TestDb, command: Document) -> (i32, String) {
    match db.store.db().run_command(command.clone()).await {
        Ok(reply) => {
            let errors = reply
                .get_array("writeErrors")
                .unwrap_or_else(|_| panic!("mongod refuses {command}, and it ran: {reply}"));
            let first = errors[0].as_document().unwrap();
            (
                first.get_i32("code").unwrap(),
                first.get_str("errmsg").unwrap().to_string(),
            )
        }
        Err(e) => match *e.kind {
            mongodb::error::ErrorKind::Command(c) => (c.code, c.message),
            other => panic!("{command}: not a command error: {other:?}"),
        },
    }
}

fn upsert_with_expr() -> Document {
    doc! {"_id": "w1", "$expr": {"$lt": ["$alive_until_ms", 5]}}
}

/// mongod parses an upsert's query without the `$expr` feature, in every version:
/// src/mongo/db/query/write_ops/canonical_update.cpp (DOCS-14158, SERVER-59704).
#[tokio::test]
async fn expr_in_an_upserts_filter_is_refused_224() {
    let db = TestDb::new("rules_expr_upsert").await;
    let (code, msg) = refused(
        &db,
        doc! {"update": "rules", "updates": [
            {"q": upsert_with_expr(), "u": {"$set": {"a": 1}}, "upsert": true},
        ]},
    )
    .await;
    assert_eq!(code, 224, "{msg}");
    assert_eq!(
        msg,
        "$expr is not allowed in the query predicate for an upsert"
    );

    let (code, msg) = refused(
        &db,
        doc! {"findAndModify": "rules", "query": upsert_with_expr(),
        "update": {"$set": {"a": 1}}, "upsert": true},
    )
    .await;
    assert_eq!(code, 224, "{msg}");
    assert_eq!(
        db.store
            .db()
            .collection::<Document>("rules")
            .count_documents(doc! {})
            .await
            .unwrap(),
        0,
        "nothing was written"
    );
}

/// src/mongo/db/update/pipeline_executor.cpp: only the stages marked
/// `isAllowedWithinUpdatePipeline` ($addFields, $set, $project, $unset,
/// $replaceRoot, $replaceWith) may stand in an update pipeline.
#[tokio::test]
async fn a_stage_outside_the_update_six_is_refused_72() {
    let db = TestDb::new("rules_update_stage").await;
    for stage in [
        doc! {"$match": {"a": 1}},
        doc! {"$group": {"_id": "$a"}},
        doc! {"$sort": {"a": 1}},
    ] {
        let name = stage.keys().next().unwrap().clone();
        let (code, msg) = refused(
            &db,
            doc! {"update": "rules", "updates": [{"q": {"_id": 1}, "u": [stage]}]},
        )
        .await;
        assert_eq!(code, 72, "{msg}");
        assert_eq!(
            msg,
            format!("{name} is not allowed to be used within an update")
        );
    }
}

/// src/mongo/db/query/write_ops/parsed_update.cpp: arrayFilters go with modifier
/// updates alone.
#[tokio::test]
async fn array_filters_with_a_pipeline_are_refused_9() {
    let db = TestDb::new("rules_array_filters").await;
    let (code, msg) = refused(
        &db,
        doc! {"update": "rules", "updates": [{
            "q": {"_id": 1}, "u": [{"$set": {"a": 1}}], "arrayFilters": [{"x.y": 1}],
        }]},
    )
    .await;
    assert_eq!(code, 9, "{msg}");
    assert_eq!(
        msg,
        "arrayFilters may not be specified for pipeline-style updates"
    );
}

/// What came after MongoDB 6.0, slotpool's minimum, is answered as 6.0 answers a
/// word it does not know (the manual's "New in version" of each).
#[tokio::test]
async fn what_came_after_the_minimum_is_unknown() {
    let db = TestDb::new("rules_later").await;
    let info = db
        .store
        .db()
        .run_command(doc! {"buildInfo": 1})
        .await
        .unwrap();
    let version = info.get_str("version").unwrap_or("?").to_string();
    if !info.contains_key("slotpoolRulesFront") && !version.starts_with("6.0.") {
        // A user's own MongoDB (MONGODB_URI), newer than 6.0: it knows these words.
        println!("skipped: MongoDB {version} is newer than 6.0 and knows these operators");
        return;
    }
    let cases: [(Document, i32, &str); 4] = [
        (
            doc! {"aggregate": "rules", "cursor": {}, "pipeline": [
                {"$group": {"_id": null, "m": {"$median": {"input": "$a", "method": "approximate"}}}},
            ]},
            15952,
            "unknown group operator '$median'",
        ),
        (
            doc! {"find": "rules", "filter": {"$expr": {"$eq": [{"$bitAnd": ["$a", 1]}, 1]}}},
            168,
            "Unrecognized expression '$bitAnd'",
        ),
        (
            doc! {"aggregate": "rules", "cursor": {}, "pipeline": [
                {"$set": {"r": "$$USER_ROLES"}},
            ]},
            17276,
            "Use of undefined variable: USER_ROLES",
        ),
        (
            doc! {"aggregate": "rules", "cursor": {}, "pipeline": [
                {"$queryStats": {}},
            ]},
            40324,
            "Unrecognized pipeline stage name: '$queryStats'",
        ),
    ];
    for (command, code, message) in cases {
        let (got, msg) = refused(&db, command.clone()).await;
        assert_eq!((got, msg.as_str()), (code, message), "{command}");
    }
    // In an update pipeline too, where the stage is parsed before it is vetted.
    let (code, msg) = refused(
        &db,
        doc! {"update": "rules", "updates": [
            {"q": {"_id": 1}, "u": [{"$set": {"t": {"$toUUID": "$a"}}}]},
        ]},
    )
    .await;
    assert_eq!(
        (code, msg.as_str()),
        (168, "Unrecognized expression '$toUUID'")
    );
}

/// mongod refuses an update statement by statement: in an ordered batch those
/// before the refused one are applied and the rest are not; unordered, all others
/// are. The reply is `ok: 1` with write errors, as from mongod.
#[tokio::test]
async fn a_refused_statement_leaves_the_others_as_mongod_does() {
    let db = TestDb::new("rules_batch").await;
    let rules = db.store.db().collection::<Document>("rules");
    rules
        .insert_many([doc! {"_id": 1}, doc! {"_id": 2}, doc! {"_id": 3}])
        .await
        .unwrap();
    let statements = |tag: &str| {
        vec![
            Bson::Document(doc! {"q": {"_id": 1}, "u": {"$set": {"by": tag}}}),
            Bson::Document(doc! {"q": upsert_with_expr(), "u": {"$set": {"a": 1}}, "upsert": true}),
            Bson::Document(doc! {"q": {"_id": 3}, "u": {"$set": {"by": tag}}}),
        ]
    };
    for (ordered, tag) in [(true, "ordered"), (false, "unordered")] {
        let reply = db
            .store
            .db()
            .run_command(doc! {"update": "rules", "updates": statements(tag), "ordered": ordered})
            .await
            .unwrap();
        let errors = reply.get_array("writeErrors").unwrap();
        assert_eq!(errors.len(), 1, "{reply}");
        let error = errors[0].as_document().unwrap();
        assert_eq!(error.get_i32("index").unwrap(), 1);
        assert_eq!(error.get_i32("code").unwrap(), 224);
        let by = |id: i32| {
            let rules = rules.clone();
            async move {
                rules
                    .find_one(doc! {"_id": id})
                    .await
                    .unwrap()
                    .unwrap()
                    .get_str("by")
                    .ok()
                    .map(str::to_string)
            }
        };
        assert_eq!(by(1).await.as_deref(), Some(tag));
        let third = by(3).await;
        if ordered {
            assert_eq!(
                third, None,
                "an ordered batch stops at the refused statement"
            );
        } else {
            assert_eq!(third.as_deref(), Some(tag), "unordered, the rest run");
        }
    }
}

/// A command shape missing from docs/mongodb.md's audited table is refused, with a
/// message that says where to add it, and recorded as unaudited. On a server of
/// its own, so that its record stays out of the run's (scripts/shapes.sh check).
#[tokio::test]
async fn an_unaudited_shape_is_refused_and_recorded() {
    let shapes = std::env::temp_dir().join(format!("slotpool-shapes-{}", std::process::id()));
    let dir = shapes.to_str().unwrap();
    let server = common::PrivateServer::launch(
        &[
            ("SLOTPOOL_DEV_SHAPES", "enforce"),
            ("SLOTPOOL_DEV_SHAPES_DIR", dir),
        ],
        &[],
    );
    let db = TestDb::new_on(&server.uri, "rules_unaudited").await;
    let (code, msg) = refused(
        &db,
        doc! {"find": "rules", "filter": {"a": {"$mod": [4, 0]}}},
    )
    .await;
    assert_eq!(code, 2, "{msg}");
    assert!(
        msg.contains("find rules q=$mod") && msg.contains("docs/mongodb.md"),
        "{msg}"
    );
    let unaudited =
        std::fs::read_to_string(shapes.join(format!("unaudited-{}.tsv", server.port()))).unwrap();
    assert!(unaudited.contains("find rules q=$mod\t"), "{unaudited}");
    // An audited one runs (the one every worker's heartbeat sends).
    db.store
        .db()
        .collection::<Document>("workers")
        .find_one(doc! {"_id": "w1"})
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&shapes);
}

/// src/mongo/db/query/projection_parser.cpp: a projection includes or excludes
/// (`_id` aside); the first field says which, and a field of the other kind is
/// refused, in `find` and in `$project` alike.
#[tokio::test]
async fn a_projection_that_both_includes_and_excludes_is_refused() {
    let db = TestDb::new("rules_projection").await;
    let (code, msg) = refused(
        &db,
        doc! {"find": "rules", "filter": {}, "projection": {"_id": 0, "a": 1, "b": 0}},
    )
    .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            31254,
            "Cannot do exclusion on field b in inclusion projection"
        )
    );
    let (code, msg) = refused(
        &db,
        doc! {"aggregate": "rules", "cursor": {}, "pipeline": [{"$project": {"a": 0, "b": 1}}]},
    )
    .await;
    assert_eq!(
        (code, msg.as_str()),
        (
            31253,
            "Cannot do inclusion on field b in exclusion projection"
        )
    );
}

/// src/mongo/db/update/update_object_node.cpp: one update may not name a path
/// twice, nor a path and a field inside it.
#[tokio::test]
async fn an_update_naming_a_path_twice_is_refused_40() {
    let db = TestDb::new("rules_conflict").await;
    let (code, msg) = refused(
        &db,
        doc! {"update": "rules", "updates": [
            {"q": {"_id": 1}, "u": {"$set": {"a": 1}, "$unset": {"a.b": ""}}},
        ]},
    )
    .await;
    assert_eq!(
        (code, msg.as_str()),
        (40, "Updating the path 'a.b' would create a conflict at 'a'")
    );
    let (code, _) = refused(
        &db,
        doc! {"findAndModify": "rules", "query": {"_id": 1},
        "update": {"$set": {"a": 1}, "$inc": {"a": 1}}},
    )
    .await;
    assert_eq!(code, 40);
}
