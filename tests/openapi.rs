//! `/api/v1`'s OpenAPI document: the one `slotpool web` serves is the one the code
//! generates and the one checked into docs/openapi.json; and Schemathesis (PyPI),
//! driving a live `slotpool web` from that document, finds no answer the document
//! does not describe, no server error, and no write a refused request made (a wrong
//! token, or data the document rules out).
//!
//! To write docs/openapi.json again after changing the API:
//! `SLOTPOOL_WRITE_OPENAPI=1 cargo test --test openapi`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bson::doc;
use common::web::{WebProc, TOKEN};
use common::{wait_for, TestDb, WorkerProc};
use futures::TryStreamExt;

const CHECKED_IN: &str = "docs/openapi.json";

#[tokio::test(flavor = "multi_thread")]
async fn the_served_document_is_the_generated_one_and_the_checked_in_one() {
    let generated = slotpool::web::openapi::text();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(CHECKED_IN);
    if std::env::var("SLOTPOOL_WRITE_OPENAPI").as_deref() == Ok("1") {
        std::fs::write(&file, generated).unwrap();
    }
    let db = TestDb::new("openapi_doc").await;
    db.init(1).await;
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;
    let served = web.get("/api/v1/openapi.json").expect("an answer");
    assert_eq!(served.status, 200);
    assert_eq!(served.header("content-type"), Some("application/json"));
    assert!(
        served.body == generated,
        "the served document is not the code's"
    );
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{CHECKED_IN} is not the document the code generates: run `SLOTPOOL_WRITE_OPENAPI=1 cargo test --test openapi` and commit it"
    );
}

/// What a write could change: every robot's and slot's fields that an action sets.
async fn writable_state(db: &TestDb) -> Vec<bson::Document> {
    let mut out = Vec::new();
    let robots: Vec<bson::Document> = db
        .store
        .robots()
        .find(doc! {})
        .projection(
            doc! {"name": 1, "kind": 1, "spec": 1, "slot_id": 1, "paused": 1,
            "start_rev": 1, "update": 1, "firings.triggers": 1},
        )
        .sort(doc! {"name": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    out.extend(robots);
    for s in db.slots().await {
        out.push(doc! {"slot": s.get_str("_id").unwrap_or("?"), "draining": s.get_bool("draining").unwrap_or(false)});
    }
    out
}

/// Schemathesis against `web`, with `args` (seed 1, one worker); its output,
/// insisting it passed.
fn schemathesis(web: &WebProc, args: &[&str], report: &Path) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/scripts/schemathesis.sh"))
        .arg(web.url(""))
        .args(args)
        // Reproducible, and one request at a time (two cores, one dev server).
        .args(["--seed", "1", "--workers", "1"])
        .args(["--report", "ndjson", "--report-ndjson-path"])
        .arg(report)
        .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
        .env("PYTHONPATH", format!("{root}/tests/fixtures"))
        // Its cache, and Python's compiled hooks, go to the test's own directory.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(report.parent().expect("the report's directory"))
        .output()
        .expect("run scripts/schemathesis.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{text}\n--- web log ---\n{}",
        web.log_text()
    );
    text
}

/// How many requests a Schemathesis run sent, from its ndjson report.
fn requests_sent(report: &Path) -> usize {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    text.matches("\"response\":").count()
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_every_answer_documented_and_no_write_from_a_refused_request() {
    let db = TestDb::new("openapi_fuzz").await;
    db.init(1).await;
    // A holder, so that updates are answered and robots run.
    let worker = WorkerProc::start(&db.uri, &db.dir, &[]);
    wait_for(Duration::from_secs(30), "the slot held", || async {
        common::owner(&db.slot("slot-001").await).map(|_| ())
    })
    .await;
    db.cli_ok(&[
        "robot", "create", "--name", "seed", "--kind", "counter", "--count", "2",
    ]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;

    // With the token: every operation, every check but two. positive_data_acceptance:
    // a spec's fields depend on its kind, so a spec the schema allows may still be
    // refused (400, as documented). ignored_auth: it sends wrong tokens, and past 10
    // a minute the address is refused even the right one (429), which would leave
    // the writes untested; the run with a wrong token below covers it.
    let report = db.dir.join("schemathesis.ndjson");
    let text = schemathesis(
        &web,
        &[
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance,ignored_auth",
            "--max-examples",
            "30",
        ],
        &report,
    );
    let sent = requests_sent(&report);
    // First the holder settles what the run left pending (updates to judge, run-now
    // requests), so that only a request could change the state from here. The run
    // may have left the slot drained, as it may: undrained, the worker takes it back.
    db.cli_ok(&["slots", "undrain", "slot-001"]);
    wait_for(
        Duration::from_secs(30),
        "the worker holding its slot",
        || async { (common::owner(&db.slot("slot-001").await)? == worker.id).then_some(()) },
    )
    .await;
    wait_for(Duration::from_secs(60), "nothing pending", || async {
        let pending = db
            .store
            .robots()
            .count_documents(doc! {"$or": [
                {"update": {"$exists": true}},
                {"firings.triggers.0": {"$exists": true}},
            ]})
            .await
            .ok()?;
        (pending == 0).then_some(())
    })
    .await;
    let before = writable_state(&db).await;

    // Refused: invalid requests with the right token. Only data the document rules
    // out is sent; every write must be refused, and again nothing changes.
    // (Before the wrong tokens below: past 10 a minute they have the address
    // refused even the right token.)
    let invalid_report = db.dir.join("schemathesis-invalid.ndjson");
    let invalid_text = schemathesis(
        &web,
        &[
            "-H",
            &format!("Authorization: Bearer {TOKEN}"),
            "--include-tag",
            "actions",
            "--mode",
            "negative",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection",
            "--phases",
            "coverage,fuzzing",
            "--max-examples",
            "20",
        ],
        &invalid_report,
    );
    let invalid = requests_sent(&invalid_report);
    assert!(invalid > 0, "no invalid request was sent:\n{invalid_text}");
    assert_eq!(
        writable_state(&db).await,
        before,
        "an invalid request wrote"
    );

    // Refused: a wrong token. Every write is refused (401, then 429 once the address
    // has tried too many), and nothing changes.
    let refused_report = db.dir.join("schemathesis-refused.ndjson");
    schemathesis(
        &web,
        &[
            "-H",
            "Authorization: Bearer wrong-token-0000000000000000000000000",
            "--include-tag",
            "actions",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            "20",
        ],
        &refused_report,
    );
    let refused = requests_sent(&refused_report);
    assert_eq!(writable_state(&db).await, before, "a refused request wrote");

    println!(
        "schemathesis: {sent} requests with the token, {refused} with a wrong one, {invalid} invalid ones\n{text}"
    );
    assert!(sent >= 300, "only {sent} requests were sent:\n{text}");
    // The dashboard still serves, and the worker still holds its slot.
    assert_eq!(web.get("/").expect("the dashboard").status, 200);
    assert_eq!(web.get("/api/v1/slots").expect("the API").status, 200);
    assert_eq!(
        common::owner(&db.slot("slot-001").await).as_deref(),
        Some(worker.id.as_str())
    );
    // A foreign Host is refused with the API's JSON error, as the document says.
    let (status, body) = foreign_host(web.port, "/api/v1/slots");
    assert_eq!(status, 421, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    assert!(e["error"].is_string(), "{body}");
}

/// GET `path` with `Host: evil.example`: the status and body.
fn foreign_host(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
