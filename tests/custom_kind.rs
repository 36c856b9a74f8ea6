//! The library's own example of a robot kind (`examples/custom_kind.rs`), built as a
//! worker of its own and run against the dev server: a library user's kind is
//! registered, its robots are created with `--unchecked`, run, checkpointed under
//! the fence, and stopped with a last checkpoint on SIGTERM.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{invariants, TestDb};

/// `target/<profile>/examples/custom_kind`, beside the tests (`target/<profile>/deps/`):
/// `cargo build --examples` builds it (`cargo test` builds examples only as tests).
fn example_binary() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let profile = deps.parent().and_then(|d| d.parent()).unwrap();
    let bin = profile.join("examples").join("custom_kind");
    assert!(
        bin.exists(),
        "{} is missing: `cargo build --examples` builds it (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// The example's process, killed if the test ends before it exits.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_library_users_own_kind_runs_on_its_own_worker_build() {
    let db = TestDb::new("custom_kind").await;
    db.init(1).await;
    // The stock CLI does not know the kind: refused without --unchecked, and says how.
    let refused = db.cli(&[
        "robot",
        "create",
        "--name",
        "hello",
        "--kind",
        "greeter",
        "--spec",
        r#"{"greeting": "hi", "every_ms": 200}"#,
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--unchecked"),
        "{refused:?}"
    );
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "hello",
        "--kind",
        "greeter",
        "--unchecked",
        "--spec",
        r#"{"greeting": "hi", "every_ms": 200, "history": 1000}"#,
    ]);
    let port = common::free_port();
    let log = db.dir.join("custom-kind.log");
    let mut worker = Running(
        Command::new(example_binary())
            .arg(format!("127.0.0.1:{port}"))
            .env("MONGODB_URI", &db.uri)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let count = |r: &bson::Document| {
        r.get_document("context")
            .ok()
            .and_then(|c| c.get_i64("count").ok())
            .unwrap_or(0)
    };
    common::wait_for(Duration::from_secs(30), "three greetings", || async {
        (count(&db.robot("hello").await) >= 3).then_some(())
    })
    .await;
    let r = db.robot("hello").await;
    assert_eq!(r.get_document("context").unwrap().get_str("last"), Ok("hi"));
    // SIGTERM: the robot stops, the slot is released, the worker exits cleanly.
    // SAFETY: kill with a pid we spawned and have not reaped.
    unsafe { libc::kill(worker.0.id() as i32, libc::SIGTERM) };
    let asked = std::time::Instant::now();
    let status = loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the worker did not exit within 30 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let after = db.robot("hello").await;
    assert_eq!(
        count(&after),
        after.get_i64("seq").unwrap(),
        "one checkpoint a greeting: {after}"
    );
    let slot = db.slot("slot-001").await;
    assert_eq!(common::owner(&slot), None, "released: {slot}");
    invariants::check(&db).await;
}
