//! Exactly once under partial failure: what a process tree, a half-applied batch, an
//! interrupted move or a deleted robot's last output could otherwise do twice or
//! leave behind. Each test runs real workers on the real dev server and ends with
//! the invariant checker where counters ran.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use common::{invariants, script, wait_for, TestDb};

/// The pids an escaping robot wrote for one epoch: `{kind: pid}`.
fn pids(db: &TestDb, epoch: i64) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for kind in ["setsid", "double", "stubborn"] {
        let path = db.dir.join(format!("pid-{epoch}-{kind}"));
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            out.insert(kind.to_string(), pid);
        }
    }
    out
}

/// An exec robot whose work escapes its process group three ways: a `setsid` child,
/// a double fork (re-parented away from the robot), and a child in the group that
/// ignores SIGTERM. Each writes its pid, by epoch, and keeps running.
fn escaping_robot(db: &TestDb) -> String {
    let dir = db.dir.display();
    script(
        db,
        "escape.sh",
        &format!(
            r#"e=$SLOTPOOL_EPOCH
setsid bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-setsid.tmp; mv {dir}/pid-'$e'-setsid.tmp {dir}/pid-'$e'-setsid; while true; do sleep 0.05; done' </dev/null >/dev/null 2>&1 &
( bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-double.tmp; mv {dir}/pid-'$e'-double.tmp {dir}/pid-'$e'-double; while true; do sleep 0.05; done' </dev/null >/dev/null 2>&1 & ) &
bash -c 'trap "" TERM; echo $$ > {dir}/pid-'$e'-stubborn.tmp; mv {dir}/pid-'$e'-stubborn.tmp {dir}/pid-'$e'-stubborn; while true; do sleep 0.05; done' &
while true; do sleep 1; done
"#
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_robots_whole_process_tree_is_gone_before_the_lease_can_lapse() {
    let db = TestDb::new("tree").await;
    db.init(1).await;
    let cmd = escaping_robot(&db);
    let flags = ["--tick", "500ms", "--stop-grace", "100ms"];
    let mut first = db.exec_worker(&flags);
    wait_for(
        Duration::from_secs(20),
        "the first worker to hold the slot",
        || async {
            (common::owner(&db.slot("slot-001").await).as_deref() == Some(first.id.as_str()))
                .then_some(())
        },
    )
    .await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "esc",
        "--kind",
        "exec",
        "--command",
        &cmd,
    ]);
    let first_epoch = common::epoch(&db.slot("slot-001").await);
    let old = wait_for(
        Duration::from_secs(20),
        "the first copy's three escapees",
        || async {
            let p = pids(&db, first_epoch);
            (p.len() == 3).then_some(p)
        },
    )
    .await;
    assert!(old.values().all(|p| common::alive(*p)), "{old:?}");
    let robot = db.robot("esc").await;
    assert_eq!(
        robot.get_str("containment").ok(),
        Some("subreaper"),
        "{robot}"
    );

    // 1. The holder freezes: the shim's deadline passes, SIGTERM to the whole tree is
    // ignored by all three, SIGKILL follows inside the fence margin. A standby that
    // takes over must find none of them running when its own copy starts.
    let mut second = db.exec_worker(&flags);
    first.signal(libc::SIGSTOP);
    let new = wait_for(
        Duration::from_secs(30),
        "the standby's copy to start",
        || async {
            let epoch = common::epoch(&db.slot("slot-001").await);
            let p = pids(&db, epoch);
            (epoch > first_epoch && p.len() == 3).then_some((epoch, p))
        },
    )
    .await;
    // Suspended by the shim at its deadline (stopped or frozen), never running.
    let survivors: Vec<_> = old
        .iter()
        .filter(|(_, p)| !common::cannot_run(**p))
        .collect();
    assert!(
        survivors.is_empty(),
        "the frozen holder's escapees could still run beside the new copy (epoch {}): {survivors:?}",
        new.0
    );

    // 2. kill -9 of the holder: its shim sees the pipe close and kills the whole tree
    // at once, well before the lease could lapse.
    let t0 = Instant::now();
    second.kill9();
    wait_for(
        Duration::from_secs(5),
        "the killed holder's escapees to die",
        || async { new.1.values().all(|p| !common::alive(*p)).then_some(()) },
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The first holder, running again, finds its slot taken: its suspended tree is
    // killed, never thawed.
    first.signal(libc::SIGCONT);
    wait_for(
        Duration::from_secs(10),
        "the first holder's suspended escapees killed",
        || async { old.values().all(|p| !common::alive(*p)).then_some(()) },
    )
    .await;
    let _ = first.child.kill();
}

/// The `seq` of a robot document.
fn seq(r: &Document) -> i64 {
    r.get_i64("seq").unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_poisoned_robot_document_doubles_no_neighbours_step() {
    let db = TestDb::new("poison").await;
    db.init(1).await;
    assert!(db.counters("c", 13, 20).status.success());
    // A `history` that is not an array (the validator refuses it now; written around
    // it, as a pool from before could hold one). The dev server applies the
    // statements of a batch before it and fails the whole command.
    db.store
        .robots()
        .update_one(doc! {"name": "c-7"}, doc! {"$set": {"history": "x"}})
        .bypass_document_validation(true)
        .await
        .unwrap();
    let refused = db
        .store
        .robots()
        .update_one(doc! {"name": "c-8"}, doc! {"$set": {"history": "x"}})
        .await;
    assert!(
        refused.is_err(),
        "the validator refuses a history that is not an array"
    );

    let _w = db.worker(&[]);
    wait_for(
        Duration::from_secs(60),
        "every healthy counter to take 40 steps",
        || async {
            let robots = db.robots().await;
            robots
                .iter()
                .filter(|r| r.get_str("name") != Ok("c-7"))
                .all(|r| seq(r) >= 40)
                .then_some(())
        },
    )
    .await;
    let poisoned = wait_for(
        Duration::from_secs(20),
        "the poisoned robot to be failed",
        || async {
            let r = db.robot("c-7").await;
            (r.get_str("status") == Ok("failed")).then_some(r)
        },
    )
    .await;
    let why = poisoned.get_str("error").unwrap_or_default();
    assert!(why.contains("refused"), "the reason is its status: {why}");
    assert_eq!(seq(&poisoned), 0, "none of its checkpoints landed");
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 12, "{report:?}");
}

/// What the first write of `robot move` does to a robot, alone: the state a move
/// cut off right after it leaves (no slot's `rev` bumped).
async fn move_first_write_only(db: &TestDb, name: &str, to: &str) {
    db.store
        .robots()
        .update_one(
            doc! {"name": name},
            vec![doc! {"$set": {
                "slot_id": to, "epoch": 0_i64, "worker": bson::Bson::Null,
                "status": {"$cond": [{"$eq": ["$paused", true]}, "paused", "pending"]},
            }}],
        )
        .await
        .unwrap();
}

fn rev(slot: &Document) -> i64 {
    slot.get_i64("rev").unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_cut_off_after_its_first_write_strands_no_robot() {
    let db = TestDb::new("cutmove").await;
    db.init(2).await;
    let (a, b) = db.one_slot_each(|_| db.worker(&[])).await;
    assert!(db.counters("m", 2, 50).status.success());
    wait_for(Duration::from_secs(30), "both counters to run", || async {
        db.robots().await.iter().all(|r| seq(r) >= 5).then_some(())
    })
    .await;
    let robot = db.robot("m-1").await;
    let from = robot.get_str("slot_id").unwrap().to_string();
    let to = if from == "slot-001" {
        "slot-002"
    } else {
        "slot-001"
    };
    let to_holder = common::owner(&db.slot(to).await).unwrap();
    let rev_before = rev(&db.slot(to).await);
    move_first_write_only(&db, "m-1", to).await;

    // Nobody tells the holder: it finds the robot by itself (its probe), well
    // before the 60 s full re-read.
    let t0 = Instant::now();
    let moved = wait_for(
        Duration::from_secs(20),
        "the moved robot to run on its new slot",
        || async {
            let r = db.robot("m-1").await;
            (r.get_str("worker") == Ok(to_holder.as_str())
                && r.get_str("status") == Ok("running")
                && seq(&r) > seq(&robot) + 5)
                .then_some(r)
        },
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(20), "{moved}");
    assert_eq!(
        rev(&db.slot(to).await),
        rev_before,
        "no rev bump was needed"
    );
    let holder = if to_holder == a.id { &a } else { &b };
    assert!(
        holder
            .metric("slotpool_unbumped_robot_changes_total")
            .unwrap_or(0)
            >= 1,
        "the probe found it"
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 2, "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_of_a_cut_off_move_repairs_it() {
    let db = TestDb::new("rerunmove").await;
    db.init(2).await;
    assert!(db.counters("r", 1, 50).status.success());
    let from = db.robot("r").await.get_str("slot_id").unwrap().to_string();
    let to = if from == "slot-001" {
        "slot-002"
    } else {
        "slot-001"
    };
    move_first_write_only(&db, "r", to).await;
    let rev_before = rev(&db.slot(to).await);
    let out = db.cli_ok(&["robot", "move", "r", "--to", to]);
    assert!(out.contains("never started there"), "{out}");
    assert!(rev(&db.slot(to).await) > rev_before, "the holder is told");
    // A second rerun finds nothing wrong to report, and says so plainly.
    let paused = db.cli_ok(&["robot", "pause", "r"]);
    assert!(paused.contains("paused"), "{paused}");
    let out = db.cli_ok(&["robot", "move", "r", "--to", to]);
    assert!(
        out.contains("already on") && !out.contains("never started"),
        "{out}"
    );
    db.cli_ok(&["robot", "resume", "r"]);
    let _w = db.worker(&[]);
    wait_for(
        Duration::from_secs(30),
        "the robot to run on its slot",
        || async {
            let r = db.robot("r").await;
            (r.get_str("slot_id") == Ok(to) && seq(&r) >= 5).then_some(())
        },
    )
    .await;
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_web_move_runs_to_its_end_when_the_client_hangs_up() {
    use std::io::Write;
    let db = TestDb::new("webmove").await;
    db.init(2).await;
    assert!(db.counters("w", 1, 50).status.success());
    let from = db.robot("w").await.get_str("slot_id").unwrap().to_string();
    let to = if from == "slot-001" {
        "slot-002"
    } else {
        "slot-001"
    };
    // Every database round trip of the dashboard takes a while, so the client can
    // hang up in the middle of the move's writes.
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let web = common::web::WebProc::start(&proxy.uri(&db.uri), &db.dir, true, &[]).await;
    proxy.delay(Duration::from_millis(150));
    let body = format!("{{\"to\": \"{to}\"}}");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", web.port)).unwrap();
    // Read before the request: the move's signal to the holder may land any time
    // after its first write.
    let rev_before = rev(&db.slot(to).await);
    write!(
        s,
        "POST /api/v1/robots/w/move HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        web.port,
        common::web::TOKEN,
        body.len()
    )
    .unwrap();
    // Hang up right after the move's first write landed.
    wait_for(
        Duration::from_secs(30),
        "the move's first write",
        || async { (db.robot("w").await.get_str("slot_id") == Ok(to)).then_some(()) },
    )
    .await;
    drop(s);
    // The action goes on to its end: the holder is told, the counts move, and the
    // event is recorded.
    wait_for(
        Duration::from_secs(30),
        "the move to finish without its client",
        || async {
            let moved = db
                .store
                .events()
                .count_documents(doc! {"kind": "move", "robot": "w"})
                .await
                .unwrap();
            (moved == 1 && rev(&db.slot(to).await) > rev_before).then_some(())
        },
    )
    .await;
    let counts: Vec<i64> = db
        .slots()
        .await
        .iter()
        .map(|s| s.get_i64("robot_count").unwrap_or(0))
        .collect();
    let on_to = if to == "slot-001" {
        counts[0]
    } else {
        counts[1]
    };
    assert_eq!(on_to, 1, "{counts:?}");
    assert_eq!(counts.iter().sum::<i64>(), 1, "{counts:?}");
}

/// Opens `n` kept-alive connections to `port`, each of which sends one request for
/// `path` and reads its whole answer, then stays open for the next.
fn kept_alive_clients(port: u16, path: &str, n: usize) -> Vec<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
        // Read the head, then the body by its length: the connection stays open.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0, "the server closed a kept-alive connection early");
            got.extend_from_slice(&buf[..k]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .expect("a length");
                if body.len() >= len {
                    break;
                }
            }
        }
        out.push(s);
    }
    out
}

/// Sends 12 probes, each on a fresh connection; returns how many were answered 200.
fn probes(port: u16, path: &str) -> usize {
    (0..12)
        .filter(|_| {
            common::web::request(port, "GET", path, &[], b"").is_some_and(|r| r.status == 200)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_alive_clients_never_lock_out_a_probe() {
    let db = TestDb::new("keepalive").await;
    db.init(1).await;
    let w = db.worker(&[]);
    wait_for(Duration::from_secs(20), "the worker to answer", || async {
        w.http_get("/healthz")
            .filter(|(s, _)| *s == 200)
            .map(|_| ())
    })
    .await;
    // As many kept-alive clients as the worker serves connections, each between
    // two requests: only a request in flight may protect a connection.
    let clients = kept_alive_clients(w.port, "/metrics", slotpool::serve::MAX_CONNECTIONS);
    assert_eq!(probes(w.port, "/healthz"), 12, "the worker's health probes");
    drop(clients);

    let web = common::web::WebProc::start(&db.uri, &db.dir, false, &[]).await;
    let clients = kept_alive_clients(web.port, "/api/v1/slots", slotpool::serve::MAX_CONNECTIONS);
    assert_eq!(probes(web.port, "/api/v1/slots"), 12, "the dashboard's");
    drop(clients);
}

/// Kept-output documents that are not tombstones and whose robot is gone.
async fn orphaned_output(db: &TestDb) -> Vec<Document> {
    use futures::TryStreamExt;
    let robots: Vec<bson::Bson> = db
        .robots()
        .await
        .iter()
        .filter_map(|r| r.get("_id").cloned())
        .collect();
    db.store
        .outputs()
        .find(doc! {"_id": {"$nin": robots}, "deleted": {"$ne": true}})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_robots_output_never_comes_back() {
    let db = TestDb::new("noresurrect").await;
    db.init(1).await;
    let chatty = script(
        &db,
        "chatty.sh",
        "while true; do echo \"line $RANDOM\"; sleep 0.02; done\n",
    );
    let w = db.exec_worker(&[]);
    for round in 0..3 {
        let name = format!("chat{round}");
        db.cli_ok(&[
            "robot",
            "create",
            "--name",
            &name,
            "--kind",
            "exec",
            "--command",
            &chatty,
            "--count",
            "10",
        ]);
        wait_for(
            Duration::from_secs(30),
            "every chatty robot's output to be kept",
            || async {
                let kept = db
                    .store
                    .outputs()
                    .count_documents(doc! {"deleted": {"$ne": true}})
                    .await
                    .unwrap();
                (kept == 10).then_some(())
            },
        )
        .await;
        for i in 1..=10 {
            db.cli_ok(&["robot", "delete", &format!("{name}-{i}")]);
        }
        wait_for(
            Duration::from_secs(30),
            "the holder to stop every robot",
            || async { (w.metric("slotpool_robots_running") == Some(0)).then_some(()) },
        )
        .await;
    }
    // The holder flushes output every second; watch for three, every 100 ms: no
    // deleted robot's output may ever come back.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let orphans: Vec<_> = orphaned_output(&db)
            .await
            .iter()
            .map(|d| d.get("_id").cloned())
            .collect();
        assert!(
            orphans.is_empty(),
            "deleted robots' output came back: {orphans:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        db.store
            .outputs()
            .count_documents(doc! {"deleted": true, "expire_at": {"$type": "date"}})
            .await
            .unwrap(),
        30,
        "each deleted robot leaves a tombstone that expires"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn init_removes_orphaned_output_and_dead_heartbeats_expire() {
    let db = TestDb::new("leftovers").await;
    db.init(1).await;
    // Orphans an older version left: output of robots that are gone.
    for _ in 0..3 {
        db.store
            .outputs()
            .insert_one(doc! {"_id": bson::oid::ObjectId::new(), "gen": 1_i64, "lines": []})
            .await
            .unwrap();
    }
    assert!(db.counters("kept", 1, 1000).status.success());
    let kept = db.robot("kept").await.get_object_id("_id").unwrap();
    db.store
        .outputs()
        .insert_one(doc! {"_id": kept, "gen": 1_i64, "lines": []})
        .await
        .unwrap();
    let out = db.cli_ok(&["init", "--slots", "1"]);
    assert!(
        out.contains("removed the kept output of 3 robot(s)"),
        "{out}"
    );
    assert_eq!(
        db.store.outputs().count_documents(doc! {}).await.unwrap(),
        1
    );

    // A live worker's heartbeat carries its expiry; a dead one's document leaves
    // by itself (the TTL index), with nobody cleaning up.
    let w = db.worker(&[]);
    let beat = wait_for(
        Duration::from_secs(20),
        "the worker's heartbeat",
        || async {
            db.store
                .workers()
                .find_one(doc! {"_id": &w.id})
                .await
                .unwrap()
        },
    )
    .await;
    let seen = beat.get_datetime("last_seen").unwrap().timestamp_millis();
    let expires = beat.get_datetime("expire_at").unwrap().timestamp_millis();
    assert!(expires - seen >= 600_000, "{beat}");
    let long_ago = bson::DateTime::from_millis(seen - 3_600_000);
    db.store
        .workers()
        .insert_one(doc! {"_id": "10.9.9.9:7700", "last_seen": long_ago, "expire_at": long_ago})
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(150),
        "the dead worker's heartbeat to expire",
        || async {
            let left = db
                .store
                .workers()
                .count_documents(doc! {"_id": "10.9.9.9:7700"})
                .await
                .unwrap();
            (left == 0).then_some(())
        },
    )
    .await;
    assert!(
        db.store
            .workers()
            .count_documents(doc! {"_id": &w.id})
            .await
            .unwrap()
            == 1,
        "the live worker's stays"
    );
}

fn robot_count(slot: &Document) -> i64 {
    slot.get_i64("robot_count")
        .or_else(|_| slot.get_i32("robot_count").map(i64::from))
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reservation_left_by_a_cut_off_create_heals_without_an_operator() {
    let db = TestDb::new("healcount").await;
    db.init(1).await;
    assert!(db.counters("h", 3, 100).status.success());
    // A create that reserved room for 5,000 and wrote 3 before the database went
    // away for good: its reservation is fresh, so it may still be writing.
    let now = bson::DateTime::now();
    db.store
        .slots()
        .update_one(
            doc! {"_id": "slot-001"},
            doc! {"$set": {"robot_count": 5000_i64, "reserved_at": now}},
        )
        .await
        .unwrap();
    let _w = db.worker(&[]);
    wait_for(Duration::from_secs(30), "the robots to run", || async {
        db.robots().await.iter().all(|r| seq(r) >= 3).then_some(())
    })
    .await;
    assert_eq!(
        robot_count(&db.slot("slot-001").await),
        5000,
        "a fresh reservation is left alone"
    );
    // Ten minutes on, nobody finished it: the holder's next read of its robots
    // makes the count true (a rev bump stands in for the minute-long wait).
    let stale = bson::DateTime::from_millis(now.timestamp_millis() - 11 * 60 * 1000);
    db.store
        .slots()
        .update_one(
            doc! {"_id": "slot-001"},
            doc! {"$set": {"reserved_at": stale}, "$inc": {"rev": 1_i64}},
        )
        .await
        .unwrap();
    wait_for(Duration::from_secs(30), "robot_count to heal", || async {
        (robot_count(&db.slot("slot-001").await) == 3).then_some(())
    })
    .await;
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 3, "{report:?}");
}

/// Releases of a slot `worker` recorded (hand-backs, drains, shutdowns).
async fn releases_by(db: &TestDb, worker: &str) -> u64 {
    db.store
        .events()
        .count_documents(doc! {"kind": "release", "worker": worker})
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slot_is_handed_to_a_frozen_standby_once_not_bounced() {
    let db = TestDb::new("nobounce").await;
    db.init(2).await;
    let (a, mut b) = db.one_slot_each(|_| db.worker(&[])).await;
    let c = db.worker(&[]);
    wait_for(
        Duration::from_secs(20),
        "the third worker's heartbeat",
        || async {
            db.store
                .workers()
                .find_one(doc! {"_id": &c.id})
                .await
                .unwrap()
                .map(|_| ())
        },
    )
    .await;
    // The standby freezes (its heartbeat is still believed for two beats), then a
    // holder dies: the survivor overflows onto the orphan and, seeing a "live"
    // standby, hands it back. Nobody takes it.
    c.signal(libc::SIGSTOP);
    let released_before = releases_by(&db, &a.id).await;
    b.kill9();
    wait_for(
        Duration::from_secs(30),
        "the frozen standby's heartbeat to run out",
        || async {
            let d = db
                .store
                .workers()
                .find_one(doc! {"_id": &c.id})
                .await
                .unwrap()?;
            let until = d.get_i64("alive_until_ms").ok()?;
            (until < bson::DateTime::now().timestamp_millis() - 500).then_some(())
        },
    )
    .await;
    let bounced = releases_by(&db, &a.id).await - released_before;
    assert!(
        bounced <= 1,
        "the slot was handed to the frozen standby {bounced} times"
    );
    // Thawed, it beats again and gets a slot.
    c.signal(libc::SIGCONT);
    wait_for(
        Duration::from_secs(60),
        "the thawed standby to hold a slot",
        || async {
            let held = db.held_per_worker().await;
            (held.get(&c.id) == Some(&1) && held.get(&a.id) == Some(&1)).then_some(())
        },
    )
    .await;
}

/// The `claim` events of `epoch`.
async fn claim_events(db: &TestDb, epoch: i64) -> Vec<Document> {
    use futures::TryStreamExt;
    db.store
        .events()
        .find(doc! {"kind": "claim", "epoch": epoch})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// A claim's event is written on a fresh connection when every pooled one died
/// under it (a database restart, a cut link): the first claim after a restart met
/// a dead connection, and its event was lost, so the invariant checker found
/// checkpoints of an epoch nobody had claimed.
#[tokio::test(flavor = "multi_thread")]
async fn an_event_outlives_the_pooled_connections_dying_under_it() {
    let db = TestDb::new("event_dead_pool").await;
    db.init(1).await;
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let store = slotpool::db::store::Store::connect(&proxy.uri(&db.uri))
        .await
        .unwrap();
    // Four connections in the pool, each opened through the proxy.
    let pooled = store.dedicated(4, 4, "events").unwrap();
    pooled.warm(4, Duration::from_secs(10)).await;
    let before = proxy.tally().snapshot();
    // Every one of them is cut; then new ones may open.
    proxy.set(common::proxy::Mode::Cut);
    wait_for(Duration::from_secs(10), "every connection cut", || async {
        (!proxy.carrying()).then_some(())
    })
    .await;
    proxy.set(common::proxy::Mode::Pass);
    pooled
        .record_event(
            slotpool::db::event::EventKind::Claim,
            doc! {"worker": "w:1", "slot_id": "slot-001", "epoch": 7_i64},
        )
        .await;
    let events = claim_events(&db, 7).await;
    assert_eq!(events.len(), 1, "the claim is recorded once: {events:?}");
    let opened = proxy.tally().since(&before);
    assert!(
        opened.get("(connection)").copied().unwrap_or(0) >= 1,
        "the event went out on a new connection: {opened:?}"
    );
}

/// A claim's event is sent again, never given up, when the connection it went out on
/// never answers (one left open across a cut, whose far end forgot it): no robot of
/// the new epoch may write before its claim is on record. Given up after 2 s, as
/// other events are, it let robots checkpoint under an epoch nobody had claimed.
#[tokio::test(flavor = "multi_thread")]
async fn a_claims_event_outwaits_a_connection_that_never_answers() {
    let db = TestDb::new("event_stranded").await;
    db.init(1).await;
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let store = slotpool::db::store::Store::connect(&proxy.uri(&db.uri))
        .await
        .unwrap();
    // One connection in the pool, open when the link strands it.
    let pooled = store.dedicated(1, 1, "events").unwrap();
    assert!(pooled.warm(1, Duration::from_secs(10)).await);
    let before = proxy.tally().snapshot();
    proxy.strand_open();
    let write = pooled.record_event_patiently(
        slotpool::db::event::EventKind::Claim,
        doc! {"worker": "w:1", "slot_id": "slot-001", "epoch": 9_i64},
    );
    let sent = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the claim's event written on a new connection");
    assert!(
        sent.elapsed() >= slotpool::db::store::EVENT_WRITE_BUDGET,
        "the first send, on the stranded connection, was waited out"
    );
    let events = claim_events(&db, 9).await;
    assert_eq!(events.len(), 1, "the claim is recorded once: {events:?}");
    let opened = proxy.tally().since(&before);
    assert!(
        opened.get("(connection)").copied().unwrap_or(0) >= 1,
        "the event went out again on a new connection: {opened:?}"
    );
}

/// Every robot's `seq` has moved past `before` (a [`TestDb::seqs`]).
async fn all_past(db: &TestDb, before: &[(String, i64)]) -> bool {
    let now: BTreeMap<String, i64> = db.seqs().await.into_iter().collect();
    before
        .iter()
        .all(|(name, seq)| now.get(name).is_some_and(|s| s > seq))
}

/// One slot held by a worker whose database traffic goes through a test proxy, with
/// `robots` counters stepping on it.
async fn proxied_holder(
    label: &str,
    robots: u32,
    flags: &[&str],
) -> (TestDb, common::proxy::Proxy, common::WorkerProc) {
    let db = TestDb::new(label).await;
    db.init(1).await;
    let proxy = common::proxy::Proxy::start(common::uri_addr(&db.uri)).await;
    let worker = db.worker_via(&proxy, flags);
    wait_for(Duration::from_secs(15), "the slot held", || async {
        (common::owner(&db.slot("slot-001").await)? == worker.id).then_some(())
    })
    .await;
    db.create_counters(robots);
    let created = db.seqs().await;
    wait_for(Duration::from_secs(15), "every robot stepping", || async {
        all_past(&db, &created).await.then_some(())
    })
    .await;
    (db, proxy, worker)
}

/// With `--suspend-for 0` (robots stopped at the deadline, as before suspension):
/// a worker back from a cut long enough to fence itself claims its slot again and
/// runs its robots, though every connection it had open across the cut is dead when
/// the link returns (as for a container reconnected under a new address: nothing on
/// them is ever answered or refused). The containers test found it: the claim's
/// event was given up after 2 s on such a connection, and the robots' first read
/// waited 30 s on another; a robot then checkpointed under an epoch with no claim on
/// record, and all of them stood still for half a minute.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_back_from_a_cut_trusts_no_connection_it_left_open() {
    let (db, proxy, worker) = proxied_holder("stranded_links", 3, &["--suspend-for", "0"]).await;
    let epoch = common::epoch(&db.slot("slot-001").await);
    // The link goes silent until the worker fences itself; then every connection
    // open across it stays dead, and new ones pass.
    proxy.set(common::proxy::Mode::Blackhole);
    wait_for(
        Duration::from_secs(30),
        "the worker to fence itself",
        || async { worker.log_text().contains("self-fenced").then_some(()) },
    )
    .await;
    proxy.strand_open();
    proxy.set(common::proxy::Mode::Pass);
    let reclaimed = wait_for(
        Duration::from_secs(60),
        "the slot claimed again",
        || async {
            let slot = db.slot("slot-001").await;
            (common::owner(&slot)? == worker.id && common::epoch(&slot) > epoch)
                .then(|| common::epoch(&slot))
        },
    )
    .await;
    // Its robots step again at once, not after the 30 s a read on a dead
    // connection waits for its answer.
    let before = db.seqs().await;
    wait_for(
        Duration::from_secs(20),
        "every robot stepping after the claim",
        || async { all_past(&db, &before).await.then_some(()) },
    )
    .await;
    assert!(
        worker.log_text().contains("opening new ones"),
        "the worker opened a new client for its robots"
    );
    // No robot wrote under the new epoch before its claim was on record.
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 3, "{report:?}");
    assert!(
        db.robots()
            .await
            .iter()
            .all(|r| r.get_i64("epoch").ok() == Some(reclaimed)),
        "every robot adopted under epoch {reclaimed}"
    );
}

/// The same cut with suspension (the default): the holder resumes its robots in
/// place when the link returns, and every connection it had open across the cut is
/// dead. Its renewals and its robots' writes must not meet one: first seen, a
/// resumed holder's next renewal went out on such a connection, hung, and it fenced
/// itself again two seconds later, twice over.
#[tokio::test(flavor = "multi_thread")]
async fn a_holder_resumed_after_a_cut_trusts_no_connection_it_left_open() {
    let (db, proxy, worker) = proxied_holder("stranded_resume", 3, &[]).await;
    let epoch = common::epoch(&db.slot("slot-001").await);
    let gens = |robots: Vec<Document>| -> Vec<i64> {
        robots
            .iter()
            .map(|r| r.get_i64("gen").unwrap_or(0))
            .collect()
    };
    let generations = gens(db.robots().await);
    proxy.set(common::proxy::Mode::Blackhole);
    wait_for(
        Duration::from_secs(30),
        "the worker to fence itself",
        || async { worker.log_text().contains("self-fenced").then_some(()) },
    )
    .await;
    proxy.strand_open();
    proxy.set(common::proxy::Mode::Pass);
    wait_for(
        Duration::from_secs(30),
        "the robots resumed in place",
        || async { worker.log_text().contains("resumed in place").then_some(()) },
    )
    .await;
    // Its robots step on, under the same epoch, and keep stepping for several
    // leases with no second suspension.
    for _ in 0..4 {
        let before = db.seqs().await;
        wait_for(
            Duration::from_secs(20),
            "every robot stepping on",
            || async { all_past(&db, &before).await.then_some(()) },
        )
        .await;
    }
    let log = worker.log_text();
    assert_eq!(
        log.matches("self-fenced").count(),
        1,
        "one suspension, no flap after the resume"
    );
    assert_eq!(
        common::epoch(&db.slot("slot-001").await),
        epoch,
        "the slot kept"
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 3, "{report:?}");
    assert_eq!(gens(db.robots().await), generations, "no robot restarted");
}

/// Whether a worker's `/status` lists `slot` as held and not suspended (None when
/// it does not answer).
fn holds_unsuspended(port: u16, slot: &str) -> Option<bool> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let body = out.split_once("\r\n\r\n")?.1;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(
        v["slots"]
            .as_array()?
            .iter()
            .any(|h| h["slot_id"] == slot && h["suspended"] == serde_json::Value::Bool(false)),
    )
}

/// What [`poll_holders`] saw: (when, the first worker listed the slot as held and
/// not suspended, the second did).
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(Instant, bool, bool)>>>;

/// `/status` of two workers every 100 ms until told to stop, into the [`Seen`] it
/// returns.
fn poll_holders(
    ports: [u16; 2],
    slot: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Seen, std::thread::JoinHandle<()>) {
    let seen: Seen = Default::default();
    let into = seen.clone();
    let poller = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let at = Instant::now();
            let a = holds_unsuspended(ports[0], slot).unwrap_or(false);
            let b = holds_unsuspended(ports[1], slot).unwrap_or(false);
            into.lock().unwrap().push((at, a, b));
            std::thread::sleep(Duration::from_millis(100).saturating_sub(at.elapsed()));
        }
    });
    (seen, poller)
}

/// The longest run of polls in which both workers said they held the slot, from the
/// first such poll to the last.
fn longest_overlap(seen: &[(Instant, bool, bool)]) -> Duration {
    let mut longest = Duration::ZERO;
    let mut since: Option<Instant> = None;
    for &(at, a, b) in seen {
        if a && b {
            let first = *since.get_or_insert(at);
            longest = longest.max(at - first);
        } else {
            since = None;
        }
    }
    longest
}

/// A holder cut off (its link blackholed) long enough for the standby to claim its
/// slot, then healed. Both workers' `/status` polled every 100 ms throughout: never
/// do both list the slot as held and not suspended for 200 ms or more, and the cut
/// holder stops its robots without waiting out the stop grace (suspended robots are
/// aborted at once: they are not polled, so they cannot stop themselves). First
/// seen: the cut holder listed the slot as held, no longer suspended, for 0.4-0.6 s
/// after it learnt the slot lost (1.6 s with `--suspend-for 0`), while the new
/// holder listed it too.
async fn a_cut_holder_stops_listing_a_slot_taken_over(label: &str, flags: &[&str]) {
    let (db, proxy, cut) = proxied_holder(label, 3, flags).await;
    let standby = db.worker(&[]);
    wait_for(Duration::from_secs(15), "the standby answering", || async {
        standby.http_get("/status").map(|_| ())
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (seen, poller) = poll_holders([cut.port, standby.port], "slot-001", stop.clone());
    wait_for(
        Duration::from_secs(15),
        "the holder seen holding",
        || async { seen.lock().unwrap().iter().any(|s| s.1).then_some(()) },
    )
    .await;
    proxy.set(common::proxy::Mode::Blackhole);
    wait_for(
        Duration::from_secs(60),
        "the standby to claim the slot",
        || async { (common::owner(&db.slot("slot-001").await)? == standby.id).then_some(()) },
    )
    .await;
    proxy.set(common::proxy::Mode::Pass);
    // The cut holder learns the slot is gone, and its robots stop.
    wait_for(
        Duration::from_secs(60),
        "the cut holder to list no slot, held or leaving",
        || async {
            let (_, body) = cut.http_get("/status")?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            (v["slots"].as_array()?.is_empty() && v["leaving"].as_array()?.is_empty()).then_some(())
        },
    )
    .await;
    wait_for(
        Duration::from_secs(15),
        "the new holder seen holding",
        || async { seen.lock().unwrap().iter().any(|s| s.2).then_some(()) },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    poller.join().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|s| s.1) && seen.iter().any(|s| s.2),
        "each worker was seen holding the slot in turn ({} polls)",
        seen.len()
    );
    let overlap = longest_overlap(&seen);
    assert!(
        overlap < Duration::from_millis(200),
        "both workers listed slot-001 as held and not suspended for {overlap:?}"
    );
    let log = cut.log_text();
    assert!(
        !log.contains("after the stop grace"),
        "the cut holder's robots were stopped without waiting out the grace:\n{log}"
    );
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_suspended_holder_that_learns_its_slot_taken_stops_listing_it_at_once() {
    a_cut_holder_stops_listing_a_slot_taken_over("lost_listing", &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_self_fenced_holder_stops_listing_its_slot_at_once() {
    a_cut_holder_stops_listing_a_slot_taken_over("fenced_listing", &["--suspend-for", "0"]).await;
}

/// A holder whose renewal came back slow lets it go by before it reads a changed
/// slot's robots, and reads after a fast one: other holders are reading, and on a
/// server that answers one command at a time its read would add to the queue every
/// renewal waits in (20 holders reading a create of 20,000 robots at once fenced 9 of
/// them). Tried to break: every round trip made slow for good, so no renewal ever
/// comes back fast; a robot created then must still run, the read going after its
/// most of five renewals, with no self-fence and no write out of order. (The
/// worker's debug log says when a read waits: a `SLOTPOOL_TEST_LOG` without
/// `slotpool=debug` hides it.)
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_slots_read_waits_for_a_fast_renewal_but_never_for_ever() {
    let (db, proxy, worker) = proxied_holder("read_admission", 2, &[]).await;
    // 75 ms each way: every renewal takes over 150 ms, slow against the 112 ms
    // threshold (a quarter of the 450 ms margin at tick 1 s), yet inside the 550 ms
    // it may take, even the one that sees the change (two round trips: its update
    // matches nothing once `rev` moved, and a `findAndModify` reads the new one).
    proxy.delay(Duration::from_millis(75));
    let out = db.counters("late", 1, 200);
    assert!(out.status.success(), "{out:?}");
    // Five renewals waited out, then the read, the adoption and a first step: a few
    // seconds; a read starved for want of a fast renewal would never come.
    wait_for(
        Duration::from_secs(20),
        "the late robot stepping",
        || async { (seq(&db.robot("late").await) >= 1).then_some(()) },
    )
    .await;
    let log = worker.log_text();
    assert!(
        log.contains("waits for a faster one"),
        "the changed slot's read waited for a fast renewal"
    );
    assert!(!log.contains("self-fenced"), "no self-fence");
    proxy.delay(Duration::ZERO);
    let before = db.seqs().await;
    wait_for(
        Duration::from_secs(15),
        "every robot stepping on",
        || async { all_past(&db, &before).await.then_some(()) },
    )
    .await;
    let report = invariants::check(&db).await;
    assert_eq!(report.robots, 3, "{report:?}");
}
