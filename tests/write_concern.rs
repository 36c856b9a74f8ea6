//! The write concern on the wire: every write a worker and the CLI send carries
//! `w: "majority"` and `j: true`, set explicitly (on a primary–secondary–arbiter set
//! the server's default is `w: 1`), and a connection string asking for less is
//! refused unless the operator says `--unsafe-write-concern`. Checked from the
//! commands themselves, through the test proxy.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::proxy::Proxy;
use common::{owner, wait_for, TestDb};

const MAJORITY: &str = r#"{"w":"majority","j":true}"#;

#[tokio::test(flavor = "multi_thread")]
async fn every_write_of_a_worker_carries_majority_and_journal() {
    let db = TestDb::new("wc_every_write").await;
    db.init(1).await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let _w = db.worker_via(&proxy, &[]);
    wait_for(Duration::from_secs(30), "the slot held", || async {
        (db.slots().await.iter().filter_map(owner).count() == 1).then_some(())
    })
    .await;
    db.create_counters(2);
    wait_for(Duration::from_secs(30), "checkpoints", || async {
        db.robots()
            .await
            .iter()
            .all(|r| r.get_i64("seq").unwrap_or(0) >= 3)
            .then_some(())
    })
    .await;
    let concerns = proxy.tally().write_concerns();
    let writes: Vec<_> = concerns
        .iter()
        .filter(|(what, _)| {
            ["update ", "findAndModify ", "insert ", "delete "]
                .iter()
                .any(|w| what.starts_with(w))
        })
        .collect();
    for name in ["update slots", "update robots", "update workers"] {
        assert!(
            writes.iter().any(|(what, _)| what.as_str() == name),
            "no {name} seen: {concerns:?}"
        );
    }
    for (what, seen) in writes {
        assert_eq!(
            seen,
            &BTreeSet::from([MAJORITY.to_string()]),
            "{what} carried another write concern"
        );
    }
}

#[test]
fn a_connection_string_asking_for_w_1_is_refused_unless_unsafe() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::new("wc_refused"));
    rt.block_on(db.init(1));
    let weak = format!("{}&w=1", db.uri);
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_slotpool"))
            .args(extra)
            .args(["slots", "list"])
            .env("MONGODB_URI", &weak)
            .output()
            .unwrap()
    };
    let refused = run(&[]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("w=1") && said.contains("--unsafe-write-concern"),
        "{said}"
    );
    let accepted = run(&["--unsafe-write-concern"]);
    assert!(accepted.status.success(), "{accepted:?}");
}
