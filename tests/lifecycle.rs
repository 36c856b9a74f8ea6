//! A robot's life past its first start, on real worker processes: a restart asked
//! for, a crash loop that its restart policy stops and what brings it back, a hung
//! robot caught by its heartbeat timeout.

mod common;

use std::time::Duration;

use bson::Document;
use common::{script, wait_for, TestDb};

fn status(r: &Document) -> &str {
    r.get_str("status").unwrap_or("")
}

/// How many times the script behind `starts` ran.
fn starts(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// A robot that exits at once under `restart: {attempts: 3, within: "1m"}` is `failed`
/// after exactly three starts, with the last end's reason, and stays stopped: across a
/// takeover by another worker too. `robot resume` gives it a fresh budget, three
/// starts more. A healthy neighbour never notices.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_loop_stops_after_its_attempts_and_resume_gives_a_fresh_budget() {
    let db = TestDb::new("crash_loop").await;
    db.init(1).await;
    let log = db.dir.join("starts");
    let cmd = script(
        &db,
        "crash.sh",
        &format!(
            "echo started >> '{}'\necho 'cannot reach the upstream' >&2\nexit 3\n",
            log.display()
        ),
    );
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "loop",
        "--kind",
        "exec",
        "--command",
        &cmd,
        "--spec",
        r#"{"restart": {"attempts": 3, "within": "1m"}}"#,
    ]);
    assert!(db.counters("ok", 1, 100).status.success());
    let mut first = db.exec_worker(&[]);

    let failed = wait_for(Duration::from_secs(60), "the robot to fail", || async {
        let r = db.robot("loop").await;
        (status(&r) == "failed").then_some(r)
    })
    .await;
    assert_eq!(starts(&log), 3, "exactly three starts");
    assert_eq!(failed.get_bool("paused"), Ok(true), "held: {failed}");
    let why = failed.get_str("error").unwrap();
    assert!(
        why.contains("gave up after 3 ends within 1m") && why.contains("exit"),
        "the last end's reason: {why}"
    );
    let listed = db.cli_ok(&["robot", "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("loop") && l.contains("failed")),
        "{listed}"
    );
    let events = db
        .store
        .events()
        .count_documents(bson::doc! {"kind": "robot_failed", "robot": "loop"})
        .await
        .unwrap();
    assert_eq!(events, 1);
    let metrics = first.http_get("/metrics").unwrap().1;
    assert_eq!(common::metric(&metrics, "slotpool_robot_failures_total"), 1);

    // A new holder does not start it again: failed is stored, not a worker's memory.
    first.kill9();
    let _second = db.exec_worker(&[]);
    let ok_seq = db.robot("ok").await.get_i64("seq").unwrap();
    wait_for(Duration::from_secs(30), "the takeover", || async {
        (db.robot("ok").await.get_i64("seq").unwrap() > ok_seq + 3).then_some(())
    })
    .await;
    assert_eq!(starts(&log), 3, "failed survives a takeover");

    // resume: a fresh budget, three more starts, failed again.
    db.cli_ok(&["robot", "resume", "loop"]);
    wait_for(Duration::from_secs(60), "the second budget", || async {
        let r = db.robot("loop").await;
        (starts(&log) == 6 && status(&r) == "failed").then_some(())
    })
    .await;
    assert_eq!(starts(&log), 6);
    // restart does the same for a failed robot.
    db.cli_ok(&["robot", "restart", "loop"]);
    wait_for(Duration::from_secs(60), "the third budget", || async {
        let r = db.robot("loop").await;
        (starts(&log) == 9 && status(&r) == "failed").then_some(())
    })
    .await;
    let report = common::invariants::check(&db).await;
    assert_eq!(
        report.robots, 1,
        "the counter, checked by the invariant checker"
    );
}

/// An exec robot that checkpoints once and then hangs, under `heartbeat_timeout: 2s`,
/// is stopped and started again, its status saying why; one that prints
/// `{"heartbeat": true}` every half second under the same timeout is never touched.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_robot_is_restarted_and_a_beating_one_is_left_alone() {
    let db = TestDb::new("hang").await;
    db.init(1).await;
    let (hung_log, beat_log) = (db.dir.join("hung"), db.dir.join("beat"));
    let hung = script(
        &db,
        "hung.sh",
        &format!(
            "echo started >> '{}'\necho '{{\"checkpoint\": {{\"up\": true}}}}'\nexec sleep 100000\n",
            hung_log.display()
        ),
    );
    let beating = script(
        &db,
        "beating.sh",
        &format!(
            "echo started >> '{}'\nwhile true; do echo '{{\"heartbeat\": true}}'; sleep 0.5; done\n",
            beat_log.display()
        ),
    );
    for (name, cmd) in [("hung", &hung), ("beating", &beating)] {
        db.cli_ok(&[
            "robot",
            "create",
            "--name",
            name,
            "--kind",
            "exec",
            "--command",
            cmd,
            "--spec",
            r#"{"heartbeat_timeout": "2s"}"#,
        ]);
    }
    let w = db.exec_worker(&[]);

    let said = wait_for(
        Duration::from_secs(60),
        "the hung robot's restart",
        || async {
            let r = db.robot("hung").await;
            let error = r.get_str("error").unwrap_or("").to_string();
            (starts(&hung_log) >= 2 && error.contains("no heartbeat for 2s")).then_some(r)
        },
    )
    .await;
    assert_eq!(status(&said), "restarting", "{said}");
    // Two restarts of the hung one take at least twice its timeout: the beating one
    // ran all that time on its first start.
    wait_for(Duration::from_secs(60), "a second restart", || async {
        (starts(&hung_log) >= 3).then_some(())
    })
    .await;
    assert_eq!(
        starts(&beat_log),
        1,
        "a robot that beats is never restarted"
    );
    let beating = db.robot("beating").await;
    assert_eq!(status(&beating), "running", "{beating}");
    let metrics = w.http_get("/metrics").unwrap().1;
    assert!(common::metric(&metrics, "slotpool_robot_heartbeat_timeouts_total") >= 2);
}

/// `robot restart` on a running counter, five times: each time its instance stops
/// after a last checkpoint and a new one starts under a higher generation, from the
/// stored context. Nothing is lost or done twice (the invariant checker reads every
/// checkpoint's generation), and each restart is in `events`.
#[tokio::test(flavor = "multi_thread")]
async fn restart_stops_the_running_instance_and_starts_it_afresh() {
    let db = TestDb::new("restart").await;
    db.init(1).await;
    assert!(db.counters("c", 1, 50).status.success());
    let _w = db.worker(&[]);
    let gen_seq = |r: &Document| (r.get_i64("gen").unwrap_or(0), r.get_i64("seq").unwrap_or(0));
    let (mut gen, _) = wait_for(Duration::from_secs(30), "the counter running", || async {
        let r = db.robot("c").await;
        (gen_seq(&r).1 >= 3).then(|| gen_seq(&r))
    })
    .await;
    for round in 1..=5 {
        let (_, seq) = gen_seq(&db.robot("c").await);
        db.cli_ok(&["robot", "restart", "c"]);
        gen = wait_for(
            Duration::from_secs(30),
            &format!("restart {round} under a new generation"),
            || async {
                let (g, s) = gen_seq(&db.robot("c").await);
                (g > gen && s > seq + 2).then_some(g)
            },
        )
        .await;
    }
    let report = common::invariants::check(&db).await;
    assert_eq!(report.robots, 1);
    let restarts = db
        .store
        .events()
        .count_documents(bson::doc! {"kind": "restart", "robot": "c"})
        .await
        .unwrap();
    assert_eq!(restarts, 5);
    assert_eq!(status(&db.robot("c").await), "running");
}
