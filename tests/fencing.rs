//! Fencing that survives moves and dead processes, on real worker processes: a robot
//! moved X → Y → X inside one tick never has two writers, and an `exec` robot's
//! process never outlives its holder's lease (kill -9, SIGSTOP).

mod common;

use std::time::{Duration, Instant};

use bson::Document;
use common::{invariants, owner, TestDb};

fn seq(r: &Document) -> i64 {
    r.get_i64("seq").unwrap_or(0)
}

async fn all_held(db: &TestDb, slots: usize) -> Vec<String> {
    common::wait_for(Duration::from_secs(30), "every slot held", || async {
        let owners: Vec<String> = db.slots().await.iter().filter_map(owner).collect();
        (owners.len() == slots).then_some(owners)
    })
    .await
}

async fn seq_beyond(db: &TestDb, name: &str, at_least: i64) {
    common::wait_for(
        Duration::from_secs(20),
        &format!("{name} at seq > {at_least}"),
        || async { (seq(&db.robot(name).await) > at_least).then_some(()) },
    )
    .await
}

/// The last history entry's slot.
async fn last_slot(db: &TestDb, name: &str) -> Option<String> {
    let r = db.robot(name).await;
    invariants::entries(&r).last().map(|e| e.slot.clone())
}

async fn last_on(db: &TestDb, name: &str, slot: &str) {
    common::wait_for(
        Duration::from_secs(20),
        &format!("{name} to checkpoint on {slot}"),
        || async { (last_slot(db, name).await.as_deref() == Some(slot)).then_some(()) },
    )
    .await
}

/// `robot move NAME --to TO`, except that the old slot's `rev` is not bumped: its
/// holder does not notice the robot left, exactly as when the move and the move
/// back both fall between two of its renewals.
async fn move_unseen_by(db: &TestDb, name: &str, to: &str) {
    use bson::doc;
    let r = db.robot(name).await;
    let moved = db
        .store
        .robots()
        .update_one(
            doc! {"_id": r.get_object_id("_id").unwrap()},
            doc! {"$set": {"slot_id": to, "epoch": 0_i64, "status": "pending"}},
        )
        .await
        .unwrap();
    assert_eq!(moved.modified_count, 1);
    let from = r.get_str("slot_id").unwrap();
    for (slot, delta, rev) in [(from, -1_i64, 0_i64), (to, 1, 1)] {
        db.store
            .slots()
            .update_one(
                doc! {"_id": slot},
                doc! {"$inc": {"robot_count": delta, "rev": rev}},
            )
            .await
            .unwrap();
    }
}

/// The move of the issue: `robot move r --to Y` then `--to X` before X's holder
/// renews. X's holder used to re-adopt a robot it never stopped, under X's same
/// epoch, and its old instance overwrote what Y's copy had checkpointed (`n` fell
/// behind `seq`). The robot steps every 3 s and eagerly on each start, so X's old
/// instance stays quiet across both moves while Y's copy writes once: exactly the
/// window of the bug. Now the re-adoption raises the robot's generation: the old
/// instance is fenced and stopped, and a new one starts from Y's checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn moved_there_and_back_inside_a_tick_never_has_two_writers() {
    let db = TestDb::new("xyx").await;
    db.init(2).await;
    let _w = [db.worker(&[]), db.worker(&[])];
    all_held(&db, 2).await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "m",
        "--kind",
        "counter",
        "--spec",
        r#"{"interval_ms": 3000, "eager": true, "history": 1000}"#,
    ]);
    seq_beyond(&db, "m", 0).await;
    let rounds = 4;
    for round in 0..rounds {
        let x = db.robot("m").await.get_str("slot_id").unwrap().to_string();
        let y = if x == "slot-001" {
            "slot-002"
        } else {
            "slot-001"
        };
        // Right after X's instance stepped, so its next step is 3 s away.
        let before = seq(&db.robot("m").await);
        seq_beyond(&db, "m", before).await;
        let t0 = Instant::now();
        if round % 2 == 0 {
            db.cli_ok(&["robot", "move", "m", "--to", y]);
        } else {
            move_unseen_by(&db, "m", y).await;
        }
        last_on(&db, "m", y).await;
        db.cli_ok(&["robot", "move", "m", "--to", &x]);
        println!("round {round}: {x} -> {y} -> {x} in {:?}", t0.elapsed());
        last_on(&db, "m", &x).await;
        // Past the moment X's old instance would have stepped again.
        let back = seq(&db.robot("m").await);
        seq_beyond(&db, "m", back).await;
        invariants::check(&db).await;
    }
    let gen = db.robot("m").await.get_i64("gen").unwrap();
    assert!(
        gen > 2 * rounds,
        "every adoption raised the generation: {gen}"
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1);
    println!("{report:?}");
}

/// An exec robot that proves no two copies ever live at once: at start it looks in
/// /proc for every earlier copy's pid and records any still alive (not a zombie),
/// then appends its own pid, and checkpoints a step every 100 ms.
fn lone_robot(db: &TestDb) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dir = db.dir.display();
    let body = format!(
        r#"#!/usr/bin/env bash
for p in $(cat {dir}/pids 2>/dev/null); do
  if [ -r /proc/$p/stat ]; then
    state=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f1)
    # Suspended by its shim (stopped, or in a frozen cgroup) cannot run: no overlap.
    cg=$(sed -n 's/^0:://p' /proc/$p/cgroup 2>/dev/null)
    if grep -qx 'frozen 1' "/sys/fs/cgroup$cg/cgroup.events" 2>/dev/null; then state=frozen; fi
    case "$state" in Z|T|t|frozen) ;; *) echo "$$ started while $p could run ($state)" >> {dir}/overlaps ;; esac
  fi
done
echo $$ >> {dir}/pids
n=$(printf '%s' "$SLOTPOOL_CONTEXT" | sed -n 's/.*"n": *\([0-9]*\).*/\1/p')
n=${{n:-0}}
while true; do n=$((n+1)); echo "{{\"checkpoint\": {{\"n\": $n}}}}"; sleep 0.1; done
"#
    );
    let path = db.dir.join("lone.sh");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_string_lossy().into_owned()
}

fn pids(db: &TestDb) -> Vec<i32> {
    std::fs::read_to_string(db.dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The old holder's robot process is gone before the new holder's copy starts, after
/// kill -9 of the holder and while the holder is SIGSTOPped.
#[tokio::test(flavor = "multi_thread")]
async fn an_exec_robot_never_outlives_its_holders_lease() {
    let db = TestDb::new("execlease").await;
    db.init(1).await;
    let mut workers = vec![db.exec_worker(&[]), db.exec_worker(&[])];
    all_held(&db, 1).await;
    let script = lone_robot(&db);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "lone",
        "--kind",
        "exec",
        "--command",
        &script,
        "--history",
        "1000",
    ]);
    seq_beyond(&db, "lone", 3).await;
    for (round, how) in ["kill -9", "SIGSTOP", "kill -9", "SIGSTOP"]
        .iter()
        .enumerate()
    {
        let holder = owner(&db.slot("slot-001").await).unwrap();
        let i = workers.iter().position(|w| w.id == holder).unwrap();
        let old = *pids(&db).last().unwrap();
        assert!(common::alive(old), "the running copy {old} is alive");
        let t0 = Instant::now();
        if *how == "kill -9" {
            workers[i].kill9();
        } else {
            workers[i].signal(libc::SIGSTOP);
        }
        // Killed at once when its worker dies; frozen by its shim at the deadline
        // when its worker is stopped (killed once the worker learns the slot is lost).
        let gone = common::wait_for(
            Duration::from_secs(10),
            "the old copy to die or be frozen",
            || async { common::cannot_run(old).then(|| t0.elapsed()) },
        )
        .await;
        common::wait_for(Duration::from_secs(20), "a new copy", || async {
            (pids(&db).len() > round + 1).then_some(())
        })
        .await;
        let started = t0.elapsed();
        println!("round {round} ({how}): old copy gone after {gone:?}, new copy started after {started:?}");
        assert!(
            gone < started,
            "the old copy died or was frozen before the new one started"
        );
        let before = seq(&db.robot("lone").await);
        seq_beyond(&db, "lone", before + 3).await;
        // The stopped or killed worker is replaced, so a standby is there again.
        if *how == "SIGSTOP" {
            workers[i].signal(libc::SIGCONT);
            workers[i]
                .wait_log("stopping its robots", Duration::from_secs(10))
                .await;
            common::wait_for(
                Duration::from_secs(10),
                "the frozen copy killed",
                || async { (!common::alive(old)).then_some(()) },
            )
            .await;
        }
        workers.remove(i);
        workers.push(db.exec_worker(&[]));
    }
    let overlaps = std::fs::read_to_string(db.dir.join("overlaps")).unwrap_or_default();
    assert!(
        overlaps.is_empty(),
        "two copies were alive at once:\n{overlaps}"
    );
    invariants::check(&db).await;
}

/// The holder's worker, shim and robot are frozen together by the cgroup freezer
/// (what `docker pause` does) until a standby has taken the slot over and runs its
/// own copy; then thawed. The old copy ignores SIGTERM, and a stop grace would let
/// it work on beside the new one (at `--tick 2s`, 0.6 s: six steps): its deadline is
/// long past, so it is killed at once, and takes at most the one step it may already
/// have been scheduled into when the thaw woke everything.
#[tokio::test(flavor = "multi_thread")]
async fn a_holder_frozen_past_its_lease_and_thawed_lets_its_robot_take_no_more_steps() {
    let db = TestDb::new("thaw").await;
    db.init(1).await;
    let script = common::stubborn_robot(&db);
    db.exec("stubborn", &script, &["--history", "1000"]);
    let freezer = common::freezer::Freezer::new("thaw");
    let flags = ["--tick", "2s"];
    let first = db.exec_worker(&flags);
    freezer.add(first.pid());
    all_held(&db, 1).await;
    let first_epoch = common::epoch(&db.slot("slot-001").await);
    let old = common::wait_for(Duration::from_secs(20), "three steps", || async {
        let mine = common::stubborn_steps_under(&db, first_epoch);
        (mine.len() >= 3).then(|| mine.last().unwrap().1)
    })
    .await;
    assert!(
        freezer.holds(old),
        "the robot {old} was born in the freezer's cgroup"
    );
    let _standby = db.exec_worker(&flags);

    freezer.freeze();
    let frozen_at = common::wall_ns();
    let new_epoch = common::wait_for(
        Duration::from_secs(30),
        "the standby's copy to take three steps",
        || async {
            let s = common::stubborn_steps(&db);
            let newest = s.iter().map(|s| s.0).max()?;
            (newest > first_epoch && s.iter().filter(|s| s.0 == newest).count() >= 3)
                .then_some(newest)
        },
    )
    .await;
    assert!(
        common::alive(old),
        "frozen, not dead: the thaw is what this test is about"
    );
    freezer.thaw();
    common::wait_for(Duration::from_secs(10), "the old copy to die", || async {
        (!common::alive(old)).then_some(())
    })
    .await;
    let late = common::stubborn_steps_of(&db, old, frozen_at);
    assert!(
        late.len() <= 1,
        "the thawed copy (epoch {first_epoch}) took {} steps beside the new one (epoch {new_epoch}): {late:?}",
        late.len()
    );
    first
        .wait_log("stopping its robots", Duration::from_secs(10))
        .await;
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1, "{report:?}");
}

/// A directory any user may write, outside the checkout (whose parents may be
/// closed to other users), for robots that run as another user.
fn open_dir(label: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("slotpool-{label}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The uid a process runs as, from /proc.
fn uid_of(pid: i32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A robot turns on its guards: it sends SIGSTOP to its shim (`$PPID`) and to the
/// worker that holds it, then works on, a step every 100 ms. As the worker's own
/// user it could (30 steps beside the standby's copy once its holder was stopped
/// too). Run as another user (`--exec-user nobody`), the kernel refuses both
/// signals; when the holder is then stopped, its shim ends the robot at the
/// deadline, before the standby's copy starts.
#[tokio::test(flavor = "multi_thread")]
async fn a_robot_run_as_another_user_cannot_stop_its_shim_or_its_worker() {
    let db = TestDb::new("runas").await;
    db.init(1).await;
    let dir = open_dir("runas");
    let flags = |dir: &std::path::Path| {
        vec![
            "--exec-allow".to_string(),
            format!("{}/", dir.display()),
            "--exec-user".to_string(),
            "nobody".to_string(),
        ]
    };
    let args = flags(&dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let holder = db.worker(&args);
    all_held(&db, 1).await;
    let script = dir.join("turn.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/bash
d={dir}
kill -STOP $PPID 2>/dev/null && echo "stopped its shim" >> $d/said || echo "could not stop its shim" >> $d/said
kill -STOP {worker} 2>/dev/null && echo "stopped its worker" >> $d/said || echo "could not stop its worker" >> $d/said
while true; do echo "$SLOTPOOL_EPOCH $$ $(date +%s%N)" >> $d/steps; sleep 0.1; done
"#,
            dir = dir.display(),
            worker = holder.pid()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    db.exec("turn", &script.display().to_string(), &[]);
    let steps = |dir: &std::path::Path| -> Vec<(i64, i32)> {
        std::fs::read_to_string(dir.join("steps"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .collect()
    };
    let first_epoch = common::epoch(&db.slot("slot-001").await);
    let old = common::wait_for(Duration::from_secs(20), "three steps", || async {
        let s = steps(&dir);
        (s.len() >= 3).then(|| s.last().unwrap().1)
    })
    .await;
    let said = std::fs::read_to_string(dir.join("said")).unwrap();
    assert!(
        said.contains("could not stop its shim") && said.contains("could not stop its worker"),
        "{said}"
    );
    assert_eq!(uid_of(old), Some(65534), "the robot runs as nobody");
    assert_eq!(uid_of(holder.pid()), Some(0), "the worker as root");

    // The holder stops (as a whole, by the test): its shim is still free to act.
    let _standby = db.worker(&args);
    holder.signal(libc::SIGSTOP);
    let new_epoch = common::wait_for(Duration::from_secs(30), "the standby's copy", || async {
        let s = steps(&dir);
        s.iter().map(|s| s.0).max().filter(|e| *e > first_epoch)
    })
    .await;
    assert!(
        common::cannot_run(old),
        "the old copy was suspended (frozen) or ended before the new one's first step"
    );
    assert!(new_epoch > first_epoch);
    holder.signal(libc::SIGCONT);
    // Its worker, running again, finds the slot taken: the frozen copy is killed.
    common::wait_for(Duration::from_secs(10), "the old copy killed", || async {
        (!common::alive(old)).then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exec_user_is_refused_clearly_where_it_cannot_work() {
    for (user, expect) in [("root", "must not share"), ("no-such-user-here", "no user")] {
        let out = std::process::Command::new(common::BIN)
            .args([
                "worker",
                "--advertise",
                "127.0.0.1:7700",
                "--exec-allow",
                "/opt/",
                "--exec-user",
                user,
            ])
            .env("MONGODB_URI", "mongodb://127.0.0.1:1/x")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{user}");
        assert!(text.contains(expect), "{user}: {text}");
    }
}

/// The same robot run as the worker's own user: it can stop its shim. The worker
/// looks at each shim every second; a stopped one means the robot turned on it, so
/// the robot is killed with its whole tree at once, and says why. (A robot that
/// stops its worker too at the same moment is beyond this: docs/guarantees.md.)
#[tokio::test(flavor = "multi_thread")]
async fn a_robot_that_stops_its_own_shim_is_killed_by_its_worker() {
    let db = TestDb::new("stopshim").await;
    db.init(1).await;
    let dir = db.dir.display().to_string();
    let script = common::script(
        &db,
        "stopshim.sh",
        &format!("kill -STOP $PPID\nwhile true; do echo \"$$\" >> {dir}/steps; sleep 0.1; done\n"),
    );
    db.exec("turn", &script, &[]);
    let w = db.exec_worker(&[]);
    let first = common::wait_for(
        Duration::from_secs(20),
        "the robot's first steps",
        || async {
            let steps = std::fs::read_to_string(db.dir.join("steps")).unwrap_or_default();
            steps
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<i32>().ok())
        },
    )
    .await;
    common::wait_for(Duration::from_secs(10), "the robot killed", || async {
        (!common::alive(first)).then_some(())
    })
    .await;
    let r = common::wait_for(Duration::from_secs(10), "the reason recorded", || async {
        let r = db.robot("turn").await;
        r.get_str("error")
            .is_ok_and(|e| e.contains("stopped its own shim"))
            .then_some(r)
    })
    .await;
    assert!(
        r.get_str("error").unwrap().contains("--exec-user"),
        "the reason says what to do: {r}"
    );
    assert!(w.metric("slotpool_robot_shims_stopped_total").unwrap_or(0) >= 1);
}
