//! What an `exec` robot hands the worker, at its worst: contexts too big for the
//! environment, checkpoints that cannot be stored, lines without end and floods of
//! lines. Each gets a clear error or a bound, and the worker and the other robots
//! carry on. Real workers on the real dev server.

mod common;

use std::time::Duration;

use bson::Document;
use common::script;
use common::TestDb;

fn create_exec(db: &TestDb, name: &str, spec: serde_json::Value) {
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        name,
        "--kind",
        "exec",
        "--spec",
        &spec.to_string(),
    ]);
}

async fn robot_where<F: Fn(&Document) -> bool>(
    db: &TestDb,
    name: &str,
    what: &str,
    f: F,
) -> Document {
    common::wait_for(
        Duration::from_secs(30),
        &format!("{name}: {what}"),
        || async {
            let r = db.robot(name).await;
            f(&r).then_some(r)
        },
    )
    .await
}

fn status(r: &Document) -> &str {
    r.get_str("status").unwrap_or("")
}

fn error(r: &Document) -> &str {
    r.get_str("error").unwrap_or("")
}

fn seq(r: &Document) -> i64 {
    r.get_i64("seq").unwrap_or(0)
}

/// Checkpoints a context of `KIB` KiB plus a run count read back from wherever the
/// context arrives, then exits so that the next run must restore it.
const GROWER: &str = r#"
ctx=$(cat "$SLOTPOOL_CONTEXT_FILE")
runs=$(printf '%s' "$ctx" | sed -n 's/.*"runs"[^0-9]*\([0-9][0-9]*\).*/\1/p')
have=$(printf '%s' "$ctx" | wc -c)
runs=$(( ${runs:-0} + 1 ))
blob=$(head -c $((KIB * 1024)) /dev/zero | tr '\0' x)
echo "run $runs restored $have bytes"
echo "{\"checkpoint\": {\"runs\": $runs, \"restored\": $have, \"blob\": \"$blob\"}}"
sleep 0.2
[ "$runs" -ge 3 ] && exec sleep 60
exit 0
"#;

#[tokio::test(flavor = "multi_thread")]
async fn big_contexts_travel_by_file_and_oversized_checkpoints_are_refused() {
    let db = TestDb::new("bigctx").await;
    db.init(1).await;
    let grower = |kib: u32| {
        script(
            &db,
            &format!("grow{kib}.sh"),
            &format!("KIB={kib}\n{GROWER}"),
        )
    };
    // 200 KiB: more than one environment string may hold, fine through the file.
    create_exec(
        &db,
        "by-file",
        serde_json::json!({"command": grower(200), "context_file": true}),
    );
    // The same robot without saying it reads the file: refused at the checkpoint,
    // so its stored context never becomes one it cannot start with.
    create_exec(&db, "by-env", serde_json::json!({"command": grower(200)}));
    // Over the 1 MiB maximum of any context.
    create_exec(
        &db,
        "huge",
        serde_json::json!({"command": grower(1100), "context_file": true}),
    );
    create_exec(&db, "small", serde_json::json!({"command": grower(1)}));
    let w = db.exec_worker(&[]);

    let r = robot_where(&db, "by-file", "three runs", |r| {
        r.get_document("context").is_ok_and(|c| {
            c.get_i32("runs").unwrap_or(0) >= 3 || c.get_i64("runs").unwrap_or(0) >= 3
        })
    })
    .await;
    let ctx = r.get_document("context").unwrap();
    assert_eq!(ctx.get_str("blob").unwrap().len(), 200 * 1024);
    // Each run restored the whole context through the file.
    let restored = ctx
        .get_i32("restored")
        .map(i64::from)
        .or_else(|_| ctx.get_i64("restored"))
        .unwrap();
    assert!(restored > 200 * 1024, "{restored}");

    let r = robot_where(&db, "by-env", "refused", |r| status(r) == "failed").await;
    assert!(
        error(&r).contains("checkpoint refused") && error(&r).contains("\"context_file\": true"),
        "{r}"
    );
    assert_eq!(seq(&r), 0, "nothing was stored");
    let r = robot_where(&db, "huge", "refused", |r| status(r) == "failed").await;
    assert!(error(&r).contains("more than the 1048576"), "{r}");
    assert_eq!(seq(&r), 0);
    // Small contexts still travel in SLOTPOOL_CONTEXT and the file alike.
    robot_where(&db, "small", "three runs", |r| seq(r) >= 3).await;

    // Visible where people look.
    let show = db.cli_ok(&["robot", "show", "by-env"]);
    assert!(show.contains("checkpoint refused"), "{show}");
    let st = db.cli_ok(&["status"]);
    assert!(st.contains("failed: checkpoint refused"), "{st}");
    let refused = w.metric("slotpool_checkpoints_refused_total").unwrap_or(0);
    assert!(refused >= 2, "checkpoints_refused_total = {refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_that_cannot_be_stored_is_an_error_on_the_robot() {
    let db = TestDb::new("badckpt").await;
    db.init(1).await;
    for (name, value) in [
        ("huge-int", "99999999999999999999"),
        ("inf", "1e400"),
        ("u64", "18446744073709551615"),
    ] {
        let cmd = script(
            &db,
            &format!("{name}.sh"),
            &format!(
                "echo '{{\"checkpoint\": {{\"n\": 1}}}}'\necho '{{\"checkpoint\": {{\"n\": {value}}}}}'\nexec sleep 60\n"
            ),
        );
        create_exec(&db, name, serde_json::json!({"command": cmd}));
    }
    // One key too many: once kept as an output line, the checkpoint lost while the
    // robot showed `running`.
    let cmd = script(
        &db,
        "extra-key.sh",
        "echo '{\"checkpoint\": {\"n\": 1}}'\necho '{\"checkpoint\": {\"n\": 2}, \"at\": 1700000000}'\nexec sleep 60\n",
    );
    create_exec(&db, "extra-key", serde_json::json!({"command": cmd}));
    let w = db.exec_worker(&[]);
    for name in ["huge-int", "inf", "u64", "extra-key"] {
        let r = robot_where(&db, name, "refused", |r| status(r) == "failed").await;
        assert!(error(&r).contains("checkpoint refused"), "{r}");
        // The good checkpoint before it stands; the bad one moved nothing.
        assert_eq!(seq(&r), 1, "{r}");
    }
    assert!(w.metric("slotpool_checkpoints_refused_total").unwrap_or(0) >= 4);
    let show = db.cli_ok(&["robot", "show", "u64"]);
    assert!(show.contains("does not fit in 64 bits"), "{show}");
    let show = db.cli_ok(&["robot", "show", "extra-key"]);
    assert!(
        show.contains("nothing else") && show.contains("at"),
        "the refusal names the extra key: {show}"
    );
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn endless_lines_and_floods_cost_the_worker_neither_memory_nor_disk() {
    let db = TestDb::new("flood").await;
    db.init(1).await;
    // 300 MB without a newline on stdout, then on stderr; then a flood of lines.
    let endless = script(
        &db,
        "endless.sh",
        "head -c 300000000 /dev/zero | tr '\\0' x\necho\necho endless-stdout-done\nhead -c 100000000 /dev/zero | tr '\\0' y >&2\necho >&2\nexec sleep 60\n",
    );
    let flood = script(&db, "flood.sh", "exec yes flooding\n");
    create_exec(&db, "endless", serde_json::json!({"command": endless}));
    create_exec(&db, "flood", serde_json::json!({"command": flood}));
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "steady",
        "--kind",
        "counter",
        "--interval-ms",
        "100",
    ]);
    let w = db.exec_worker(&[]);
    common::wait_for(
        Duration::from_secs(120),
        "the endless line to be read",
        || async { w.log_text().contains("endless-stdout-done").then_some(()) },
    )
    .await;
    common::wait_for(
        Duration::from_secs(60),
        "200,000 flood lines dropped",
        || async {
            (w.metric("slotpool_robot_log_lines_dropped_total")
                .unwrap_or(0)
                > 200_000)
                .then_some(())
        },
    )
    .await;
    let rss = rss_kib(w.pid());
    assert!(rss < 150 * 1024, "worker RSS {rss} KiB after a 300 MB line");
    let log = std::fs::metadata(&w.log).unwrap().len();
    assert!(
        log < 20 * 1024 * 1024,
        "worker log is {log} bytes after a flood"
    );
    let text = w.log_text();
    assert!(
        text.contains("line cut: "),
        "the long line is logged cut, with a marker"
    );
    assert!(
        text.contains("output lines not logged"),
        "the drops are reported"
    );
    // The others carry on.
    let s0 = seq(&db.robot("steady").await);
    robot_where(&db, "steady", "keeps checkpointing", |r| seq(r) >= s0 + 5).await;
    assert_eq!(w.http_get("/healthz").map(|(c, _)| c), Some(200));
}

/// `robot logs`: the last 200 lines a robot wrote (checkpoints left out, stderr in),
/// escaped; `--follow` prints new ones as they are kept; a deleted robot's output
/// goes with it.
#[tokio::test(flavor = "multi_thread")]
async fn robot_logs_shows_the_last_lines_and_follows_new_ones() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let db = TestDb::new("logs").await;
    db.init(1).await;
    // 250 numbered lines, a checkpoint, then a tick every 0.3 s until stopped, and
    // at tick 3 a hostile line on stderr (well after the burst: the two streams are
    // read apart, so a stderr line written amid the burst may be kept before it).
    let talker = script(
        &db,
        "talker.sh",
        r#"i=1
while [ $i -le 250 ]; do echo "line $i"; i=$((i+1)); done
echo '{"checkpoint": {"said": 250}}'
t=1
while true; do
  echo "tick $t"
  if [ $t -eq 3 ]; then printf 'on stderr \033[31mred\033[0m\n' >&2; fi
  t=$((t+1)); sleep 0.3
done
"#,
    );
    create_exec(&db, "talker", serde_json::json!({"command": talker}));
    let _w = db.exec_worker(&[]);
    let shown = common::wait_for(Duration::from_secs(60), "ticks kept", || async {
        let out = db.cli_ok(&["robot", "logs", "talker"]);
        (out.contains("tick 5") && out.contains("on stderr")).then_some(out)
    })
    .await;
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 200, "the last 200 lines:\n{shown}");
    assert!(!shown.contains("checkpoint"), "{shown}");
    assert!(
        !shown.contains("\u{1b}"),
        "escape characters are escaped: {shown:?}"
    );
    assert!(shown.contains("stderr on stderr"), "{shown}");
    // In order: the numbered lines still kept are consecutive and end at 250.
    let numbered: Vec<u32> = lines
        .iter()
        .filter_map(|l| l.rsplit_once("line ").and_then(|(_, n)| n.parse().ok()))
        .collect();
    assert_eq!(numbered.last(), Some(&250));
    assert!(
        numbered.windows(2).all(|w| w[0] + 1 == w[1]),
        "{numbered:?}"
    );
    let json = db.cli_ok(&["robot", "logs", "talker", "--lines", "3", "--json"]);
    assert_eq!(json.lines().count(), 3);
    for l in json.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["n"].as_i64().unwrap() > 0 && v["text"].is_string(), "{v}");
    }

    // --follow prints ticks it has not printed before, in order.
    let mut follow = Command::new(common::BIN)
        .args(["robot", "logs", "talker", "--lines", "1", "--follow"])
        .env("MONGODB_URI", &db.uri)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut ticks = Vec::new();
    while ticks.len() < 6 {
        let line = out.next().expect("follow ended early").unwrap();
        if let Some((_, n)) = line.rsplit_once("tick ") {
            ticks.push(n.parse::<u32>().unwrap());
        }
    }
    assert!(ticks.windows(2).all(|w| w[0] + 1 == w[1]), "{ticks:?}");

    // Deleting the robot ends --follow and removes its output.
    db.cli_ok(&["robot", "delete", "talker"]);
    let follow = std::sync::Mutex::new(follow);
    let status = common::wait_for(Duration::from_secs(10), "follow to end", || async {
        follow.lock().unwrap().try_wait().unwrap()
    })
    .await;
    assert!(status.success());
    let gone = db.cli(&["robot", "logs", "talker"]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no robot named"));
}

/// Kept output is fenced like checkpoints, through real moves: the robot moves
/// X → Y → X → Y between two workers while it writes a line every 0.1 s tagged with
/// its process id, so each instance's lines are told apart. (Without the fence this
/// test fails: checked by replacing it with a match-all filter.) In the kept lines, an
/// instance's lines never come after a later instance's (a stopped copy's late
/// flush never lands behind its successor's), and the document carries the robot's
/// current generation.
#[tokio::test(flavor = "multi_thread")]
async fn kept_output_of_a_moved_robot_never_lands_behind_its_successor() {
    let db = TestDb::new("out_move").await;
    db.init(2).await;
    let chatter = script(
        &db,
        "chatter.sh",
        r#"i=1
while true; do echo "pid=$$ i=$i"; i=$((i+1)); sleep 0.1; done
"#,
    );
    // The first worker renews every 5 s, so after a move away from it the stopped
    // copy keeps writing for seconds while the second worker (tick 1 s) already
    // runs the new one: only the generation fence keeps those lines out.
    let _workers = db
        .one_slot_each(|i| {
            if i == 0 {
                db.exec_worker(&["--tick", "5s"])
            } else {
                db.exec_worker(&[])
            }
        })
        .await;
    create_exec(&db, "mover", serde_json::json!({"command": chatter}));
    let id = db.robot("mover").await.get_object_id("_id").unwrap();
    let kept_pids = || async {
        let doc = db
            .store
            .outputs()
            .find_one(bson::doc! {"_id": id})
            .await
            .unwrap()?;
        let pids: Vec<String> = doc
            .get_array("lines")
            .ok()?
            .iter()
            .filter_map(|l| l.as_document()?.get_str("text").ok())
            .filter_map(|t| t.split_whitespace().next().map(str::to_string))
            .collect();
        Some((doc, pids))
    };
    common::wait_for(Duration::from_secs(30), "its first lines kept", || async {
        kept_pids().await.filter(|(_, p)| p.len() >= 5).map(|_| ())
    })
    .await;
    for instances in 2..=4 {
        let on = db
            .robot("mover")
            .await
            .get_str("slot_id")
            .unwrap()
            .to_string();
        let to = if on == "slot-001" {
            "slot-002"
        } else {
            "slot-001"
        };
        db.cli_ok(&["robot", "move", "mover", "--to", to]);
        // The new instance's lines are kept before the next move.
        common::wait_for(
            Duration::from_secs(30),
            "the new instance's lines",
            || async {
                let (_, pids) = kept_pids().await?;
                let mut distinct = pids.clone();
                distinct.dedup();
                (distinct.len() >= instances).then_some(())
            },
        )
        .await;
    }
    // Let any stopped instance's last flush come (or be refused).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (doc, pids) = kept_pids().await.unwrap();
    let mut order: Vec<&String> = Vec::new();
    for p in &pids {
        if order.last() != Some(&p) {
            assert!(
                !order.contains(&p),
                "{p}'s lines came back after a later instance's: {order:?} then {p}"
            );
            order.push(p);
        }
    }
    assert_eq!(order.len(), 4, "four instances in order: {order:?}");
    let gen = db.robot("mover").await.get_i64("gen").unwrap();
    assert_eq!(
        doc.get_i64("gen").unwrap(),
        gen,
        "the output's generation is the robot's"
    );
}

/// A checkpoint line that reaches the robot's stdout after the worker's last read
/// of the stop grace, in the moment before the SIGKILL lands, was dropped: the
/// worker sent SIGKILL and never read the pipe again. A robot's descendant racing
/// the shim's kill does this now and then; here the test makes the moment certain.
/// It holds the robot's stdout through `/proc/PID/fd/1`, as a descendant would, and
/// writes the last checkpoint the instant the robot's own process is gone. The
/// worker reads the pipe to its end (bounded) before its last write, so the robot's
/// last checkpoint is what stays.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_printed_during_the_stop_grace_are_not_lost_to_the_sigkill() {
    use std::io::Write;
    let db = TestDb::new("lastckpt").await;
    db.init(1).await;
    let pid_file = db.dir.join("pid");
    let cmd = script(
        &db,
        "last-words.sh",
        &format!(
            r#"trap '' TERM
echo $$ > {pid}
echo '{{"checkpoint": {{"started": true}}}}'
while true; do sleep 0.05; done
"#,
            pid = pid_file.display()
        ),
    );
    create_exec(&db, "last-words", serde_json::json!({"command": cmd}));
    let _w = db.exec_worker(&["--stop-grace", "50ms"]);
    robot_where(&db, "last-words", "running", |r| {
        status(r) == "running" && seq(r) >= 1
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut stdout = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/fd/1"))
        .expect("the robot's stdout, a pipe to its worker");
    db.cli_ok(&["robot", "pause", "last-words"]);
    let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while proc.exists() {
        assert!(
            std::time::Instant::now() < end,
            "the robot was never killed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    stdout
        .write_all(b"{\"checkpoint\": {\"last\": true}}\n")
        .unwrap();
    let r = robot_where(&db, "last-words", "its last checkpoint stored", |r| {
        r.get_document("context")
            .is_ok_and(|c| c.get_bool("last") == Ok(true))
    })
    .await;
    drop(stdout);
    assert_eq!(status(&r), "paused", "{r}");
    assert_eq!(seq(&r), 2, "{r}");
}
