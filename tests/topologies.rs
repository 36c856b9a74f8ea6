//! The deployments users run (docs/mongodb.md, "Topologies"): a server below the
//! minimum version is refused; behind mongos a worker starts only on the operator's
//! word that the mongos clocks agree; a standalone server and TLS run the pool; a
//! URI's readPreference sends none of slotpool's reads away from the primary.
//!
//! Each runs a dev server of its own, started as the deployment it stands for.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{wait_for, PrivateServer, TestDb, WorkerProc};

/// One slot, one counter, one worker: the counter steps on, so the worker holds the
/// slot and its robot writes checkpoints.
async fn runs_a_robot(db: &TestDb, worker_args: &[&str]) -> WorkerProc {
    db.init(1).await;
    db.create_counters(1);
    let worker = db.worker(worker_args);
    wait_for(
        Duration::from_secs(30),
        "the counter to step three times",
        || async {
            let robots = db.robots().await;
            (robots.first()?.get_i64("seq").ok()? >= 3).then_some(())
        },
    )
    .await;
    worker
}

/// Waits for a worker to exit, and returns its log.
fn exits(worker: &mut WorkerProc) -> String {
    let status = worker
        .wait_exit(Duration::from_secs(30))
        .expect("the worker exits");
    assert!(!status.success(), "it exits with a failure: {status}");
    std::fs::read_to_string(&worker.log).unwrap()
}

#[tokio::test]
async fn a_server_older_than_the_minimum_is_refused_by_init_and_worker() {
    let server = PrivateServer::launch(&[("SLOTPOOL_DEV_REPORT_VERSION", "5.0.14")], &[]);
    let db = TestDb::new_on(&server.uri, "too_old").await;
    let out = db.cli(&["init", "--slots", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "init refuses: {err}");
    assert!(
        err.contains("MongoDB 5.0.14") && err.contains("needs 6.0 or later"),
        "{err}"
    );
    let mut worker = db.worker(&[]);
    let log = exits(&mut worker);
    assert!(log.contains("needs 6.0 or later"), "{log}");
    assert!(db.slots().await.is_empty(), "init wrote nothing");
}

#[tokio::test]
async fn behind_mongos_a_worker_starts_only_on_the_operators_word() {
    let server = PrivateServer::launch(&[("SLOTPOOL_DEV_REPORT_ROUTER", "1")], &[]);
    let db = TestDb::new_on(&server.uri, "mongos").await;
    db.cli_ok(&["init", "--slots", "1"]);
    let mut refused = db.worker(&[]);
    let log = exits(&mut refused);
    assert!(
        log.contains("is a mongos") && log.contains("--mongos-clocks-agree"),
        "{log}"
    );
    assert_eq!(common::owner(&db.slot("slot-001").await), None);

    let _worker = runs_a_robot(&db, &["--mongos-clocks-agree"]).await;
}

#[tokio::test]
async fn a_standalone_server_runs_the_pool_and_the_worker_says_what_it_risks() {
    let server = PrivateServer::launch(&[("SLOTPOOL_DEV_SERVER_ARGS", "--standalone")], &[]);
    let db = TestDb::new_on(&server.uri, "standalone").await;
    let worker = runs_a_robot(&db, &[]).await;
    worker
        .wait_log(
            "standalone server, not a replica set",
            Duration::from_secs(5),
        )
        .await;
    let report = common::invariants::check(&db).await;
    assert_eq!(report.robots, 1, "{report:?}");
}

/// A CA and a server certificate for 127.0.0.1 under it, made by openssl in `dir`.
fn certificates(dir: &Path) -> (String, String, String) {
    let at = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (scripts/test.sh installs it)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    std::fs::create_dir_all(dir).unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=slotpool test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]);
    (at("ca.pem"), at("server.pem"), at("server.key"))
}

#[tokio::test]
async fn over_tls_the_pool_runs() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tls-{}", std::process::id()));
    let (ca, cert, key) = certificates(&dir);
    let server = PrivateServer::launch(
        &[
            (
                "SLOTPOOL_DEV_SERVER_ARGS",
                &format!("--tls-cert-file {cert} --tls-key-file {key}"),
            ),
            (
                "SLOTPOOL_DEV_URI_OPTIONS",
                &format!("&tls=true&tlsCAFile={ca}"),
            ),
        ],
        &[],
    );
    assert!(server.uri.contains("tls=true"), "{}", server.uri);
    let db = TestDb::new_on(&server.uri, "tls").await;
    let _worker = runs_a_robot(&db, &[]).await;

    // Without TLS the server does not answer: the traffic above was encrypted.
    let plain = server.uri.replace("&tls=true", "&tls=false");
    let out = Command::new(common::BIN)
        .args(["status"])
        .env("MONGODB_URI", &plain)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a plain connection is refused");
}

/// Every read goes to the primary, whatever the URI says: the dev server records
/// each non-primary read preference a command carries (scripts/devdb/serve.py).
#[tokio::test]
async fn a_uris_read_preference_sends_no_read_away_from_the_primary() {
    let shapes =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("readpref-{}", std::process::id()));
    let server = PrivateServer::launch(
        &[("SLOTPOOL_DEV_SHAPES_DIR", shapes.to_str().unwrap())],
        &[],
    );
    let secondary = format!("{}&readPreference=secondary", server.uri);
    let db = TestDb::new_on(&secondary, "readpref").await;
    let worker = runs_a_robot(&db, &[]).await;
    worker
        .wait_log(
            "readPreference=secondary is ignored",
            Duration::from_secs(5),
        )
        .await;
    db.cli_ok(&["status"]);
    db.cli_ok(&["robot", "list"]);

    // The check can fail: a client that honours the URI is recorded.
    let probe = mongodb::Client::with_uri_str(&secondary).await.unwrap();
    probe
        .database(&db.name)
        .collection::<bson::Document>("robots")
        .find_one(bson::doc! {})
        .await
        .unwrap();
    let recorded = std::fs::read_to_string(shapes.join(format!("readprefs-{}.tsv", server.port())))
        .unwrap_or_default();
    let ours: Vec<&str> = recorded
        .lines()
        .filter(|l| {
            l.split('\t')
                .nth(2)
                .is_some_and(|app| app.starts_with("slotpool"))
        })
        .collect();
    assert!(
        ours.is_empty(),
        "slotpool read away from the primary: {ours:?}"
    );
    assert!(
        recorded.contains("find\tsecondary\t"),
        "the probe's read was recorded: {recorded:?}"
    );
    let _ = std::fs::remove_dir_all(&shapes);
}
