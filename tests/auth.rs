//! Least privilege (docs/security.md, "Database roles"), on a dev server with
//! `--auth` enforcing MongoDB's built-in roles: `init` runs under `readWrite` and
//! `dbAdmin`, workers and the CLI under `readWrite` alone, `slotpool web` and
//! `status` under `read`. A missing privilege gets a message that names the role.

mod common;

use std::time::Duration;

use bson::doc;
use common::web::WebProc;
use common::{wait_for, PrivateServer, TestDb, WorkerProc};

const PASSWORD: &str = "pw-for-the-auth-test";

/// `uri` (the dev server's, no credentials) as `user` of the admin database, on the
/// database `db`.
fn as_user(uri: &str, user: &str, db: &str) -> String {
    let with_db = common::with_database(uri, db);
    let with_user = with_db.replacen("://", &format!("://{user}:{PASSWORD}@"), 1);
    format!("{with_user}&authSource=admin")
}

#[tokio::test(flavor = "multi_thread")]
async fn each_process_runs_under_the_roles_the_docs_name() {
    let mut server = PrivateServer::launch(&[], &[]);
    let name = format!("t_auth_{}", std::process::id());
    let admin = mongodb::Client::with_uri_str(&server.uri).await.unwrap();
    let role = |r: &str| doc! {"role": r, "db": &name};
    for (user, roles) in [
        ("initer", vec![role("readWrite"), role("dbAdmin")]),
        ("writer", vec![role("readWrite")]),
        ("viewer", vec![role("read")]),
    ] {
        admin
            .database("admin")
            .run_command(doc! {"createUser": user, "pwd": PASSWORD, "roles": roles})
            .await
            .unwrap();
    }
    drop(admin);
    let uri = server.relaunch(&[("SLOTPOOL_DEV_SERVER_ARGS", "--auth")]);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let cli = |user: &str, args: &[&str]| {
        std::process::Command::new(common::BIN)
            .args(args)
            .env("MONGODB_URI", as_user(&uri, user, &name))
            .env("SLOTPOOL_LOG", "warn")
            .output()
            .unwrap()
    };

    // Without dbAdmin, init cannot set the validators, and says which role it needs.
    let out = cli("writer", &["init", "--slots", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("dbAdmin"), "names the role: {err}");
    assert!(
        !err.contains(PASSWORD),
        "never prints the credential: {err}"
    );

    let out = cli("initer", &["init", "--slots", "2"]);
    assert!(out.status.success(), "{out:?}");

    // Workers and the CLI under readWrite alone.
    let writer = as_user(&uri, "writer", &name);
    let _w = WorkerProc::start(&writer, &dir, &[]);
    let out = cli(
        "writer",
        &[
            "robot", "create", "--name", "c", "--kind", "counter", "--count", "3",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let db = TestDb::on(&writer, &name).await;
    wait_for(
        Duration::from_secs(30),
        "every counter to step three times",
        || async {
            let robots = db.robots().await;
            (robots.len() == 3 && robots.iter().all(|r| r.get_i64("seq").unwrap_or(0) >= 3))
                .then_some(())
        },
    )
    .await;

    // Reading needs read alone; writing is refused with the role it needs.
    let out = cli("viewer", &["status"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli("viewer", &["robot", "list"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(
        "viewer",
        &["robot", "create", "--name", "d", "--kind", "counter"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("readWrite"), "names the role: {err}");

    // The dashboard under read.
    let web = WebProc::start(&as_user(&uri, "viewer", &name), &dir, false, &[]).await;
    let overview = web.overview_with_robots().await;
    assert_eq!(overview["summary"]["robots"], 3, "{overview}");
    let log = web.log_text();
    assert!(!log.contains(PASSWORD), "{log}");
}
