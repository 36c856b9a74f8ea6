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

/// How many events of `kind` the `events` collection holds for `robot`.
async fn events_about(db: &TestDb, kind: &str, robot: &str) -> u64 {
    db.store
        .events()
        .count_documents(bson::doc! {"kind": kind, "robot": robot})
        .await
        .unwrap()
}

/// Waits for `n` events of `kind` about `robot` and checks there are no more: the
/// worker writes a robot's status first and its event after, so an event may land
/// just after the status that announced it.
async fn wait_events(db: &TestDb, kind: &str, robot: &str, n: u64) {
    let seen = wait_for(
        Duration::from_secs(15),
        &format!("{n} {kind} event(s) about {robot}"),
        || async {
            let seen = events_about(db, kind, robot).await;
            (seen >= n).then_some(seen)
        },
    )
    .await;
    assert_eq!(seen, n, "{kind} events about {robot}");
}

/// Whether `robot list` shows `name` with `status`.
fn listed_as(db: &TestDb, name: &str, status: &str) -> bool {
    db.cli_ok(&["robot", "list"])
        .lines()
        .any(|l| l.contains(name) && l.contains(status))
}

/// A robot that exits at once under `restart: {attempts: 3, within: "1m"}` is `failed`
/// after exactly three starts, with the last end's reason, and stays stopped: across a
/// takeover by another worker too. `robot resume` gives it a fresh budget, three
/// starts more. A healthy neighbour never notices.
/// An exec robot `loop` that notes each start in a file, runs `then`, and exits 3,
/// under `spec`. Returns the file and the command.
fn crash_loop(db: &TestDb, then: &str, spec: &str) -> (std::path::PathBuf, String) {
    let log = db.dir.join("starts");
    let cmd = script(
        db,
        "crash.sh",
        &format!("echo started >> '{}'\n{then}\nexit 3\n", log.display()),
    );
    db.exec("loop", &cmd, &["--spec", spec]);
    (log, cmd)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_loop_stops_after_its_attempts_and_resume_gives_a_fresh_budget() {
    let db = TestDb::new("crash_loop").await;
    db.init(1).await;
    let (log, cmd) = crash_loop(
        &db,
        "echo 'cannot reach the upstream' >&2",
        r#"{"restart": {"attempts": 3, "within": "1m"}}"#,
    );
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
    assert!(
        listed_as(&db, "loop", "failed"),
        "{}",
        db.cli_ok(&["robot", "list"])
    );
    wait_events(&db, "robot_failed", "loop", 1).await;
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
    // An update runs a failed robot again, under its new policy: two more starts.
    db.cli_ok(&[
        "robot",
        "update",
        "loop",
        "--spec",
        &format!(r#"{{"command": "{cmd}", "restart": {{"attempts": 2, "within": "1m"}}}}"#),
    ]);
    wait_for(Duration::from_secs(60), "the updated budget", || async {
        let r = db.robot("loop").await;
        (starts(&log) == 11 && status(&r) == "failed").then_some(())
    })
    .await;
    assert!(db
        .robot("loop")
        .await
        .get_str("error")
        .unwrap()
        .contains("gave up after 2 ends"));
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
        db.exec(name, cmd, &["--spec", r#"{"heartbeat_timeout": "2s"}"#]);
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
    let restarts = events_about(&db, "restart", "c").await;
    assert_eq!(restarts, 5);
    assert_eq!(status(&db.robot("c").await), "running");
}

/// An exec robot's program that counts on from its stored context's `n`, one
/// checkpoint `{n, arg}` every `pause` seconds, `arg` being its first argument.
fn looper(db: &TestDb, pause: &str) -> String {
    script(
        db,
        "looper.sh",
        &format!(
            "n=$(printf '%s' \"$SLOTPOOL_CONTEXT\" | grep -o '\"n\": *[0-9]*' | grep -o '[0-9]*$')\n\
             n=${{n:-0}}\n\
             while true; do n=$((n+1)); echo \"{{\\\"checkpoint\\\": {{\\\"n\\\": $n, \\\"arg\\\": \\\"$1\\\"}}}}\"; sleep {pause}; done\n"
        ),
    )
}

fn context_of(r: &Document) -> Document {
    r.get_document("context").cloned().unwrap_or_default()
}

/// `robot update` in place, on a running counter and a running exec robot: each stops
/// after a last checkpoint and starts again with its new spec under a new generation,
/// its context kept (the counter's `n` still equals its `seq`). What would change
/// nothing is refused and changes nothing: an exec command outside the worker's
/// allow-list (judged by the holder), a spec `create` would refuse (judged by the
/// CLI). `--dry-run` shows the difference only.
#[tokio::test(flavor = "multi_thread")]
async fn update_changes_a_running_robot_in_place_and_refusals_change_nothing() {
    let db = TestDb::new("update").await;
    db.init(1).await;
    assert!(db.counters("c", 1, 100).status.success());
    let looper = looper(&db, "0.1");
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "e",
        "--kind",
        "exec",
        "--command",
        &looper,
        "--arg",
        "first",
        "--history",
        "1000",
    ]);
    let _w = db.exec_worker(&[]);
    let gen_seq = |r: &Document| (r.get_i64("gen").unwrap_or(0), r.get_i64("seq").unwrap_or(0));
    for name in ["c", "e"] {
        wait_for(Duration::from_secs(30), "both running", || async {
            (gen_seq(&db.robot(name).await).1 >= 3).then_some(())
        })
        .await;
    }

    // The counter, faster.
    let (gen, seq) = gen_seq(&db.robot("c").await);
    let out = db.cli_ok(&["robot", "update", "c", "--interval-ms", "50"]);
    assert!(
        out.contains("updated c") && out.contains("spec.interval_ms: 100 → 50"),
        "{out}"
    );
    wait_for(
        Duration::from_secs(30),
        "the counter's new instance",
        || async {
            let r = db.robot("c").await;
            let (g, s) = gen_seq(&r);
            (g > gen && s > seq + 3).then_some(())
        },
    )
    .await;
    let c = db.robot("c").await;
    assert_eq!(
        c.get_document("spec").unwrap().get_i64("interval_ms"),
        Ok(50)
    );
    assert_eq!(
        context_of(&c).get_i64("n").unwrap(),
        c.get_i64("seq").unwrap(),
        "the context carried over: nothing lost or done twice"
    );

    // The exec robot, with another argument.
    let (gen, _) = gen_seq(&db.robot("e").await);
    db.cli_ok(&["robot", "update", "e", "--arg", "second"]);
    wait_for(
        Duration::from_secs(30),
        "the exec robot's new args",
        || async {
            let r = db.robot("e").await;
            (gen_seq(&r).0 > gen && context_of(&r).get_str("arg") == Ok("second")).then_some(())
        },
    )
    .await;
    let e = db.robot("e").await;
    let n = context_of(&e).get_i64("n").unwrap();
    assert!(
        n >= e.get_i64("seq").unwrap() - 1,
        "counting on from its context: {e}"
    );

    // Refused by the holder: a command outside its allow-list. Nothing changes.
    let (gen, seq) = gen_seq(&db.robot("e").await);
    let spec_before = db.robot("e").await.get_document("spec").unwrap().clone();
    let refused = db.cli(&["robot", "update", "e", "--command", "/bin/sh"]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("refused by") && err.contains("nothing changed"),
        "{err}"
    );
    let e = db.robot("e").await;
    assert_eq!(e.get_document("spec").unwrap(), &spec_before);
    assert_eq!(gen_seq(&e).0, gen, "the running instance was not touched");
    wait_for(
        Duration::from_secs(10),
        "the exec robot still running",
        || async { (gen_seq(&db.robot("e").await).1 > seq + 3).then_some(()) },
    )
    .await;

    // A hand-written `update` that cannot be one is left alone; the robot runs on,
    // and the next real update replaces it.
    db.store
        .robots()
        .update_one(
            bson::doc! {"name": "c"},
            bson::doc! {"$set": {"update": {"spec": "faster please"}}},
        )
        .bypass_document_validation(true)
        .await
        .unwrap();
    let seq = gen_seq(&db.robot("c").await).1;
    wait_for(
        Duration::from_secs(10),
        "the counter running on",
        || async { (gen_seq(&db.robot("c").await).1 > seq + 3).then_some(()) },
    )
    .await;
    db.cli_ok(&["robot", "update", "c", "--interval-ms", "55"]);
    let out = db.cli_ok(&["robot", "update", "c", "--interval-ms", "50"]);
    assert!(out.contains("updated c"), "{out}");

    // Refused by the CLI: a spec create would refuse.
    let bad = db.cli(&[
        "robot",
        "update",
        "c",
        "--spec",
        r#"{"interval_ms": "fast"}"#,
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("interval_ms"));
    // A dry run shows, and changes nothing.
    let dry = db.cli_ok(&["robot", "update", "c", "--interval-ms", "70", "--dry-run"]);
    assert!(dry.contains("spec.interval_ms: 50 → 70"), "{dry}");
    let c = db.robot("c").await;
    assert_eq!(
        c.get_document("spec").unwrap().get_i64("interval_ms"),
        Ok(50)
    );
    assert!(c.get("update").is_none(), "{c}");

    let asked = db
        .store
        .events()
        .count_documents(bson::doc! {"kind": "update"})
        .await
        .unwrap();
    assert_eq!(asked, 5, "four applied and one refused, each asked once");
    let report = common::invariants::check(&db).await;
    assert_eq!(report.robots, 2);
}

/// An update racing a move, five times over two slots and two workers: whichever
/// holder judges it, the update lands once, the robot ends up moved, and nothing is
/// lost or run twice.
#[tokio::test(flavor = "multi_thread")]
async fn an_update_racing_a_move_loses_nothing() {
    let db = TestDb::new("update_move").await;
    db.init(2).await;
    assert!(db.counters("r", 1, 100).status.success());
    let _a = db.worker(&[]);
    let _b = db.worker(&[]);
    wait_for(Duration::from_secs(30), "running", || async {
        (db.robot("r").await.get_i64("seq").unwrap_or(0) >= 3).then_some(())
    })
    .await;
    for round in 0..5_i64 {
        let r = db.robot("r").await;
        let from = r.get_str("slot_id").unwrap().to_string();
        let to = if from == "slot-001" {
            "slot-002"
        } else {
            "slot-001"
        };
        let interval = (200 + round * 10).to_string();
        let update = db.cli_child(&["robot", "update", "r", "--interval-ms", &interval]);
        let moved = db.cli(&["robot", "move", "r", "--to", to]);
        assert!(
            moved.status.success(),
            "{}",
            String::from_utf8_lossy(&moved.stderr)
        );
        let updated = update.wait_with_output().unwrap();
        assert!(
            updated.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&updated.stderr)
        );
        let seq = db.robot("r").await.get_i64("seq").unwrap();
        wait_for(
            Duration::from_secs(30),
            "the robot on its new slot, updated",
            || async {
                let r = db.robot("r").await;
                let spec = r.get_document("spec").ok()?.get_i64("interval_ms").ok()?;
                (r.get_str("slot_id").ok()? == to
                    && spec.to_string() == interval
                    && r.get_i64("seq").ok()? > seq + 1)
                    .then_some(())
            },
        )
        .await;
    }
    let report = common::invariants::check(&db).await;
    assert_eq!(report.robots, 1);
}

/// A running counter and a running exec robot, each updated 100 times in a loop while
/// the holder of the counter's slot is killed with -9 every 25 rounds: every update is
/// applied (by whichever holder reads it), each robot's count equals its `seq` (no step
/// lost or done twice), and the invariant checker finds every generation starting
/// after the previous one's last checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_updates_beside_kill_9_lose_and_double_nothing() {
    let db = TestDb::new("update_chaos").await;
    db.init(2).await;
    let flags = ["--tick", "500ms"];
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "count",
        "--kind",
        "counter",
        "--interval-ms",
        "300",
        "--history",
        "5000",
    ]);
    let looper = looper(&db, "0.3");
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "loop",
        "--kind",
        "exec",
        "--command",
        &looper,
        "--arg",
        "a",
        "--history",
        "5000",
    ]);
    let mut workers: Vec<_> = (0..3).map(|_| db.exec_worker(&flags)).collect();
    for name in ["count", "loop"] {
        wait_for(Duration::from_secs(30), "both running", || async {
            (db.robot(name).await.get_i64("seq").unwrap_or(0) >= 2).then_some(())
        })
        .await;
    }
    for round in 1..=100_u32 {
        let interval = if round % 2 == 0 { "300" } else { "310" };
        let arg = if round % 2 == 0 { "a" } else { "b" };
        let counter = db.cli_child(&[
            "robot",
            "update",
            "count",
            "--interval-ms",
            interval,
            "--wait",
            "30s",
        ]);
        let exec = db.cli_child(&["robot", "update", "loop", "--arg", arg, "--wait", "30s"]);
        for (what, child) in [("count", counter), ("loop", exec)] {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}, {what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if round % 25 == 0 {
            let slot = db
                .robot("count")
                .await
                .get_str("slot_id")
                .unwrap()
                .to_string();
            let holder = common::owner(&db.slot(&slot).await).unwrap();
            let i = workers.iter().position(|w| w.id == holder).unwrap();
            workers[i].kill9();
            workers[i] = db.exec_worker(&flags);
        }
    }
    // Both running again after the last update, then checked.
    for name in ["count", "loop"] {
        let seq = db.robot(name).await.get_i64("seq").unwrap();
        wait_for(
            Duration::from_secs(30),
            "running after the last update",
            || async { (db.robot(name).await.get_i64("seq").unwrap() > seq + 2).then_some(()) },
        )
        .await;
    }
    let looped = db.robot("loop").await;
    assert_eq!(
        context_of(&looped).get_i64("n").unwrap(),
        looped.get_i64("seq").unwrap(),
        "the exec robot counted on from its stored context: nothing lost or done twice"
    );
    let report = common::invariants::check(&db).await;
    assert_eq!(report.robots, 2);
    // Every update applied once: each raises start_rev by one. (Two that land while
    // the robot is between instances share one new generation.)
    for name in ["count", "loop"] {
        let r = db.robot(name).await;
        assert_eq!(r.get_i64("start_rev"), Ok(100), "{name}");
    }
}

/// The interval a counter's spec says now.
async fn interval(db: &TestDb, name: &str) -> i64 {
    let r = db.robot(name).await;
    let spec = r.get_document("spec").unwrap();
    spec.get_i64("interval_ms")
        .or_else(|_| spec.get_i32("interval_ms").map(i64::from))
        .unwrap()
}

/// With no live holder, an update waits in the robot's document; a second one
/// replaced it silently, and the first change never applied. Now the second is
/// refused with the reason, the first applies when a holder comes, and then the
/// second may be asked again. With a live holder, two updates asked at once each
/// get a definite answer (applied, or refused because the other waits), never "no
/// holder answered".
#[tokio::test(flavor = "multi_thread")]
async fn updates_apply_in_order_or_are_refused_never_replaced() {
    let db = TestDb::new("updorder").await;
    db.init(1).await;
    assert!(db.counters("c", 1, 100).status.success());
    let first = db.cli(&[
        "robot",
        "update",
        "c",
        "--interval-ms",
        "200",
        "--wait",
        "1s",
    ]);
    assert!(!first.status.success());
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(said.contains("waits in the robot's document"), "{said}");
    let second = db.cli(&[
        "robot",
        "update",
        "c",
        "--interval-ms",
        "300",
        "--wait",
        "1s",
    ]);
    assert!(
        !second.status.success(),
        "the second must not replace the first"
    );
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        said.contains("already has an update waiting")
            && said.contains("spec.interval_ms: 100 → 200"),
        "{said}"
    );
    let waiting = db.robot("c").await;
    assert_eq!(
        waiting
            .get_document("update")
            .unwrap()
            .get_document("spec")
            .unwrap()
            .get_i64("interval_ms")
            .ok(),
        Some(200),
        "the first update still waits: {waiting}"
    );

    let _w = db.worker(&[]);
    wait_for(
        Duration::from_secs(30),
        "the first update applied",
        || async { (interval(&db, "c").await == 200).then_some(()) },
    )
    .await;
    db.cli_ok(&["robot", "update", "c", "--interval-ms", "300"]);
    assert_eq!(interval(&db, "c").await, 300);

    // Two at once on a live holder.
    let a = db.cli_child(&["robot", "update", "c", "--interval-ms", "400"]);
    let b = db.cli_child(&["robot", "update", "c", "--interval-ms", "500"]);
    let mut applied = Vec::new();
    for (ms, child) in [(400, a), (500, b)] {
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains("no holder answered"), "{ms}: {text}");
        if out.status.success() {
            assert!(text.contains("updated c"), "{ms}: {text}");
            applied.push(ms);
        } else {
            // Refused because the other waits, or because the other applied between
            // this one's read and its write.
            assert!(
                text.contains("already has an update waiting")
                    || text.contains("changed meanwhile"),
                "{ms}: {text}"
            );
        }
    }
    assert!(!applied.is_empty(), "one of the two applied");
    let now = interval(&db, "c").await;
    assert!(
        applied.contains(&now),
        "the spec is one that applied: {now}, {applied:?}"
    );
    common::invariants::check(&db).await;
}

/// A crash loop on a slot that changes hands: the robot ends twice on its first
/// holder, which is then killed; its restart budget (4 ends within 10 minutes) went
/// with the holder, and the standby started counting from zero, so a loop on a slot
/// that keeps changing hands never reached `failed`. The ends are kept with the
/// robot: the new holder gives up after the ends left, and `robot resume` still
/// gives a fresh budget.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_loop_keeps_its_restart_budget_across_a_takeover() {
    let db = TestDb::new("crash_takeover").await;
    db.init(1).await;
    let (log, _) = crash_loop(
        &db,
        "sleep 0.3",
        r#"{"restart": {"attempts": 4, "within": "10m"}}"#,
    );
    let mut workers = [db.exec_worker(&[]), db.exec_worker(&[])];
    let holder = wait_for(
        Duration::from_secs(30),
        "two ends on the first holder",
        || async {
            let r = db.robot("loop").await;
            let ends = r.get_array("recent_ends").map_or(0, |a| a.len());
            (ends >= 2).then(|| r.get_str("worker").unwrap().to_string())
        },
    )
    .await;
    let i = workers.iter().position(|w| w.id == holder).unwrap();
    workers[i].kill9();
    let failed = wait_for(Duration::from_secs(60), "the robot to fail", || async {
        let r = db.robot("loop").await;
        (status(&r) == "failed").then_some(r)
    })
    .await;
    assert_ne!(
        failed.get_str("worker").ok(),
        Some(holder.as_str()),
        "failed on the new holder: {failed}"
    );
    // Two or three runs there (one may have been cut by the kill), two here.
    let n = starts(&log);
    assert!(
        (4..=5).contains(&n),
        "{n} starts for a budget of 4 ends: {failed}"
    );
    assert!(
        failed
            .get_str("error")
            .unwrap_or("")
            .contains("4 ends within 10m"),
        "{failed}"
    );
    // resume: a fresh budget of 4 more ends.
    db.cli_ok(&["robot", "resume", "loop"]);
    let again = wait_for(Duration::from_secs(60), "failed again", || async {
        let r = db.robot("loop").await;
        (status(&r) == "failed" && starts(&log) >= n + 4).then_some(r)
    })
    .await;
    assert_eq!(starts(&log), n + 4, "{again}");
}

/// An exec robot `once` that notes each start in a file and exits with `code`, under
/// `spec`. Returns the file.
fn one_shot(db: &TestDb, code: i32, spec: &str) -> std::path::PathBuf {
    let log = db.dir.join("once-starts");
    let cmd = script(
        db,
        "once.sh",
        &format!("echo started >> '{}'\nexit {code}\n", log.display()),
    );
    db.exec("once", &cmd, &["--spec", spec]);
    log
}

/// `restart.on: failure` and an exit 0: the robot is `completed`, held as a paused
/// robot is, and never started again, not by a new holder after a kill -9 either.
/// `robot restart` runs it once more.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_to_completion_is_never_started_again_until_restarted() {
    let db = TestDb::new("run_to_completion").await;
    db.init(1).await;
    let log = one_shot(&db, 0, r#"{"restart": {"on": "failure"}}"#);
    assert!(db.counters("ok", 1, 100).status.success());
    let mut first = db.exec_worker(&[]);
    let done = wait_for(Duration::from_secs(60), "the robot to complete", || async {
        let r = db.robot("once").await;
        (status(&r) == "completed").then_some(r)
    })
    .await;
    assert_eq!(starts(&log), 1);
    assert_eq!(done.get_bool("paused"), Ok(true), "held: {done}");
    assert!(
        listed_as(&db, "once", "completed"),
        "{}",
        db.cli_ok(&["robot", "list"])
    );
    wait_events(&db, "robot_completed", "once", 1).await;

    first.kill9();
    let _second = db.exec_worker(&[]);
    let ok_seq = db.robot("ok").await.get_i64("seq").unwrap();
    wait_for(Duration::from_secs(30), "the takeover", || async {
        (db.robot("ok").await.get_i64("seq").unwrap() > ok_seq + 3).then_some(())
    })
    .await;
    assert_eq!(starts(&log), 1, "completed survives a takeover");
    assert_eq!(status(&db.robot("once").await), "completed");

    db.cli_ok(&["robot", "restart", "once"]);
    wait_for(Duration::from_secs(60), "the second run", || async {
        let r = db.robot("once").await;
        (starts(&log) == 2 && status(&r) == "completed").then_some(())
    })
    .await;
}

/// `restart.on: failure` restarts a failing run under its budget; `restart.on:
/// never` runs it once, and a failure is final: `failed`, held, with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn restart_on_failure_retries_and_never_runs_once() {
    let db = TestDb::new("restart_on").await;
    db.init(1).await;
    let log = one_shot(
        &db,
        3,
        r#"{"restart": {"on": "failure", "attempts": 2, "within": "1m"}}"#,
    );
    let never_log = db.dir.join("never-starts");
    let cmd = script(
        &db,
        "never.sh",
        &format!("echo started >> '{}'\nexit 4\n", never_log.display()),
    );
    db.exec(
        "never",
        &cmd,
        &["--spec", r#"{"restart": {"on": "never"}}"#],
    );
    let _w = db.exec_worker(&[]);
    let failed = wait_for(
        Duration::from_secs(60),
        "the retries to give up",
        || async {
            let r = db.robot("once").await;
            (status(&r) == "failed").then_some(r)
        },
    )
    .await;
    assert_eq!(starts(&log), 2, "two attempts: {failed}");
    let never = wait_for(Duration::from_secs(60), "the one run to fail", || async {
        let r = db.robot("never").await;
        (status(&r) == "failed").then_some(r)
    })
    .await;
    assert_eq!(starts(&never_log), 1);
    assert_eq!(never.get_bool("paused"), Ok(true));
    let why = never.get_str("error").unwrap();
    assert!(
        why.contains("spec.restart.on is never") && why.contains("exit"),
        "{why}"
    );
}
