//! A database outage costs no restart: at the self-fence deadline a holder suspends
//! its robots (exec trees frozen by their shims, in-process kinds not polled) and
//! renews late; a late renewal that still matches `{owner, epoch}` proves nobody
//! took the slot, and the same robots go on in place. Real worker processes against
//! a dev server of the test's own, killed with -9 and started again on its data, or
//! behind the chaos proxy; every case is checked by the invariant checker.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::Document;
use common::proxy::{Mode, Proxy};
use common::{invariants, owner, stubborn_robot, stubborn_steps, wait_for, TestDb, WorkerProc};

/// Two cases at a time, each pool on a server or a proxy of its own, whatever the
/// machine's cores: more at once would share its timing past what the cases allow.
static TWO_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

fn seqs(robots: &[Document]) -> BTreeMap<String, i64> {
    robots
        .iter()
        .map(|r| {
            (
                r.get_str("name").unwrap().to_string(),
                r.get_i64("seq").unwrap_or(0),
            )
        })
        .collect()
}

/// Waits until every robot has checkpointed `steps` more times than in `before`.
async fn every_robot_steps(db: &TestDb, before: &BTreeMap<String, i64>, steps: i64) {
    wait_for(
        Duration::from_secs(60),
        &format!("every robot {steps} steps further"),
        || async {
            let now = seqs(&db.robots().await);
            before
                .iter()
                .all(|(name, seq)| now.get(name).is_some_and(|n| *n >= seq + steps))
                .then_some(())
        },
    )
    .await;
}

/// The pids of the exec robots' steps so far.
fn exec_pids(db: &TestDb) -> std::collections::BTreeSet<i32> {
    stubborn_steps(db).iter().map(|(_, pid, _)| *pid).collect()
}

/// Two holders and a standby over two slots, eight counters and two exec robots,
/// all running; `via` puts every worker behind one proxy.
async fn pool(db: &TestDb, via: Option<&Proxy>) -> Vec<WorkerProc> {
    db.init(2).await;
    let allow = db.exec_allow();
    let w: Vec<WorkerProc> = (0..3)
        .map(|_| match via {
            Some(p) => db.worker_via(p, &["--exec-allow", &allow]),
            None => db.exec_worker(&[]),
        })
        .collect();
    wait_for(Duration::from_secs(30), "both slots held", || async {
        (db.slots().await.iter().filter_map(owner).count() == 2).then_some(())
    })
    .await;
    db.create_counters(8);
    let cmd = stubborn_robot(db);
    db.exec("x-1", &cmd, &[]);
    db.exec("x-2", &cmd, &[]);
    every_robot_steps(db, &seqs(&db.robots().await), 2).await;
    w
}

/// The server killed with -9 for `down`, then started again on its data: nothing
/// restarts, no slot moves, and every robot steps on.
async fn server_down_for(down: Duration) {
    server_back_after(down, &[]).await
}

/// [`server_down_for`], the server started again with `env` (libfaketime's, for a
/// new primary whose clock differs).
async fn server_back_after(down: Duration, env: &[(&str, &str)]) {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let server = common::PrivateServer::start("outage_kill");
    let db = TestDb::new_on(&server.uri, "outage_kill").await;
    let w = pool(&db, None).await;
    let before = db.held().await;
    let pids = exec_pids(&db);
    assert_eq!(pids.len(), 2, "two exec robots running: {pids:?}");
    server.kill9();
    // The outage itself: the time the database is away.
    tokio::time::sleep(down).await;
    server.restart_with(env);
    let db = TestDb::on(&server.uri, &db.name).await;
    let back = Instant::now();
    every_robot_steps(&db, &seqs(&db.robots().await), 2).await;
    println!(
        "[outage {down:?}] every robot stepped twice {:?} after the restart",
        back.elapsed()
    );
    assert_eq!(
        db.held().await,
        before,
        "no slot moved, no robot adopted again"
    );
    assert_eq!(exec_pids(&db), pids, "the same exec processes went on");
    let resumed = r#"slotpool_suspensions_total{outcome="resumed"}"#;
    let mut resumes = 0;
    for x in &w {
        resumes += x.metric(resumed).unwrap_or(0);
        assert_eq!(
            x.metric("slotpool_robot_restarts_total").unwrap_or(0),
            0,
            "no robot restarted on {}",
            x.id
        );
        for outcome in ["lost", "expired", "stopped"] {
            let name = format!(r#"slotpool_suspensions_total{{outcome="{outcome}"}}"#);
            assert_eq!(x.metric(&name).unwrap_or(0), 0, "{name} on {}", x.id);
        }
    }
    // Each holder suspended and resumed; one whose first renewals after the return
    // came late again (a restarted server is slow at first) may have done so twice.
    // What must not happen is above: a suspension lost, expired or stopped.
    assert!(resumes >= 2, "each holder suspended and resumed: {resumes}");
    let report = invariants::check(&db).await;
    // The counters' histories; the exec robots keep none, and their steps file was
    // checked above (the same two processes).
    assert_eq!(report.robots, 8, "{report:?}");
}

/// [`server_back_after`] 3 s, the server's clock moved by `offset` (libfaketime's
/// form, e.g. `+5s`), as a new primary's may be.
async fn server_back_with_clock(offset: &str) {
    assert!(
        std::path::Path::new(common::LIBFAKETIME).exists(),
        "this test steps the dev server's clock with libfaketime: install the `faketime` package (scripts/test.sh does)"
    );
    server_back_after(
        Duration::from_secs(3),
        &[
            ("LD_PRELOAD", common::LIBFAKETIME),
            ("FAKETIME", offset),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
    .await;
}

/// An election stands in as the server back after 3 s with a clock 5 s ahead (a
/// new primary's): every lease stamped before looks older than it is, yet the
/// holders renew late before any standby may claim (a standby that lost the
/// database waits a lease of contact, and sees the step besides). No two holders,
/// no robot run twice, and in fact nothing restarts or moves.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_back_with_its_clock_5_s_ahead_restarts_nothing() {
    server_back_with_clock("+5s").await;
}

/// The same with the new primary's clock 5 s behind: every lease looks younger.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_back_with_its_clock_5_s_behind_restarts_nothing() {
    server_back_with_clock("-5s").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_3_s_outage_of_the_database_restarts_nothing() {
    server_down_for(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_10_s_outage_of_the_database_restarts_nothing() {
    server_down_for(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_30_s_outage_of_the_database_restarts_nothing() {
    server_down_for(Duration::from_secs(30)).await;
}

/// Every worker's link blackholed for `down` (bytes held, connections open), then
/// passed again: the same as the server's kill, nothing restarts or moves.
async fn every_link_blackholed_for(down: Duration) {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let db = TestDb::new("outage_blackhole").await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let _w = pool(&db, Some(&proxy)).await;
    let before = db.held().await;
    let pids = exec_pids(&db);
    proxy.set(Mode::Blackhole);
    // The outage itself: the time every link is held.
    tokio::time::sleep(down).await;
    proxy.set(Mode::Pass);
    every_robot_steps(&db, &seqs(&db.robots().await), 2).await;
    assert_eq!(
        db.held().await,
        before,
        "no slot moved, no robot adopted again after a {down:?} blackhole"
    );
    assert_eq!(exec_pids(&db), pids, "the same exec processes went on");
    invariants::check(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_link_blackholed_for_3_s_restarts_nothing() {
    every_link_blackholed_for(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_link_blackholed_for_10_s_restarts_nothing() {
    every_link_blackholed_for(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_link_blackholed_for_30_s_restarts_nothing() {
    every_link_blackholed_for(Duration::from_secs(30)).await;
}

/// An outage longer than `--suspend-for`: the robots are stopped and restored
/// exactly as without suspension, and nothing runs twice.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_longer_than_suspend_for_stops_the_robots_as_before() {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let server = common::PrivateServer::start("outage_expired");
    let db = TestDb::new_on(&server.uri, "outage_expired").await;
    db.init(1).await;
    let _a = db.exec_worker(&["--suspend-for", "2s"]);
    wait_for(Duration::from_secs(30), "the slot held", || async {
        (db.slots().await.iter().filter_map(owner).count() == 1).then_some(())
    })
    .await;
    let cmd = stubborn_robot(&db);
    db.exec("x-1", &cmd, &[]);
    db.create_counters(4);
    every_robot_steps(&db, &seqs(&db.robots().await), 2).await;
    let pids = exec_pids(&db);
    server.kill9();
    tokio::time::sleep(Duration::from_secs(6)).await;
    server.restart();
    let db = TestDb::on(&server.uri, &db.name).await;
    every_robot_steps(&db, &seqs(&db.robots().await), 2).await;
    let now = exec_pids(&db);
    assert!(
        now.len() > pids.len(),
        "the exec robot was stopped and started again: {pids:?} then {now:?}"
    );
    invariants::check(&db).await;
}

/// How a holder is cut off from the database for 6 s, alone.
enum Cut {
    /// Its link blackholed by the proxy.
    Partitioned,
    /// The worker process SIGSTOPped (its robots' shims run on).
    Stopped,
    /// The worker and everything below it frozen by the cgroup freezer.
    Frozen,
}

/// The holder cut off alone for 6 s: the standby, which kept contact, claims at `L`
/// as ever. The old holder's frozen robot is killed when the holder learns, and
/// never steps again: every step its pid wrote came before the standby's claim.
async fn lose_alone(cut: Cut, label: &str) {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let db = TestDb::new(label).await;
    db.init(1).await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let allow = db.exec_allow();
    let freezer = matches!(cut, Cut::Frozen).then(|| common::freezer::Freezer::new(label));
    let old = match &freezer {
        Some(f) => db.exec_worker_in(&f.procs(), &[]),
        None => db.worker_via(&proxy, &["--exec-allow", &allow]),
    };
    wait_for(Duration::from_secs(30), "the slot held", || async {
        db.slots()
            .await
            .iter()
            .any(|s| owner(s).as_deref() == Some(old.id.as_str()))
            .then_some(())
    })
    .await;
    let cmd = stubborn_robot(&db);
    db.exec("x-1", &cmd, &[]);
    let _standby = db.exec_worker(&[]);
    every_robot_steps(&db, &seqs(&db.robots().await), 3).await;
    let old_pids = exec_pids(&db);
    let t0 = Instant::now();
    match (&cut, &freezer) {
        (Cut::Partitioned, _) => proxy.set(Mode::Blackhole),
        (Cut::Stopped, _) => old.signal(libc::SIGSTOP),
        (Cut::Frozen, Some(f)) => f.freeze(),
        (Cut::Frozen, None) => unreachable!(),
    }
    let claimed = wait_for(Duration::from_secs(30), "the standby's claim", || async {
        db.slots()
            .await
            .iter()
            .find(|s| owner(s).is_some_and(|o| o != old.id))
            .map(|_| common::wall_ns())
    })
    .await;
    // The rest of the 6 s the holder is cut off.
    if let Some(left) = Duration::from_secs(6).checked_sub(t0.elapsed()) {
        tokio::time::sleep(left).await;
    }
    match (&cut, &freezer) {
        (Cut::Partitioned, _) => proxy.set(Mode::Pass),
        (Cut::Stopped, _) => old.signal(libc::SIGCONT),
        (Cut::Frozen, Some(f)) => f.thaw(),
        (Cut::Frozen, None) => unreachable!(),
    }
    wait_for(
        Duration::from_secs(30),
        "the old holder to learn",
        || async { old.log_text().contains("while suspended").then_some(()) },
    )
    .await;
    every_robot_steps(&db, &seqs(&db.robots().await), 3).await;
    let late: Vec<_> = stubborn_steps(&db)
        .into_iter()
        .filter(|(_, pid, ns)| old_pids.contains(pid) && *ns > claimed)
        .collect();
    // Thawed together with its shim (the freezer), the robot may run for the
    // moment before the shim stops it again: one step at most, and none of it lands
    // (the invariant checker below). Otherwise none at all.
    let allowed = usize::from(matches!(cut, Cut::Frozen));
    assert!(
        late.len() <= allowed,
        "the old robot stepped after the takeover: {late:?}"
    );
    invariants::check(&db).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_partitioned_alone_loses_its_slot_and_its_frozen_robot_never_steps_again() {
    lose_alone(Cut::Partitioned, "outage_alone").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_stopped_for_6_s_loses_its_slot_and_its_frozen_robot_never_steps_again() {
    lose_alone(Cut::Stopped, "outage_sigstop").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_frozen_with_its_robots_for_6_s_loses_its_slot_and_they_never_step_again() {
    lose_alone(Cut::Frozen, "outage_freezer").await;
}

/// A late renewal that lands but whose answer is lost (the proxy closes the
/// connection before it comes back): the next late renewal matches too and resumes
/// the robots, with no restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_renewal_whose_answer_is_lost_is_followed_by_one_that_resumes() {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let db = TestDb::new("outage_lost_answer").await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let w = pool(&db, Some(&proxy)).await;
    let before = db.held().await;
    let pids = exec_pids(&db);
    // Cut (connections closed, new ones refused) rather than blackholed: bytes held
    // through a blackhole would pass later, and the first renewal after it could be
    // one the driver already gave up on.
    proxy.set(Mode::Cut);
    // Past every holder's deadline: suspended.
    wait_for(
        Duration::from_secs(30),
        "the holders to suspend",
        || async {
            (w.iter()
                .filter(|x| x.metric("slotpool_robots_suspended").unwrap_or(0) > 0)
                .count()
                == 2)
                .then_some(())
        },
    )
    .await;
    // The first renewal sent once the link passes lands; its answer is dropped.
    proxy.drop_answer_to_next("update slots");
    proxy.set(Mode::Pass);
    wait_for(
        Duration::from_secs(30),
        "a renewal's answer dropped",
        || async { (proxy.answers_dropped() >= 1).then_some(()) },
    )
    .await;
    every_robot_steps(&db, &seqs(&db.robots().await), 2).await;
    assert_eq!(
        db.held().await,
        before,
        "no slot moved, no robot adopted again"
    );
    assert_eq!(exec_pids(&db), pids, "the same exec processes went on");
    invariants::check(&db).await;
}

/// A scheduled exec robot whose run is in flight across a 5 s outage: the run is
/// frozen with its tree and finishes once after the resume; its firing has exactly
/// one record, and no firing starts twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_run_in_flight_across_an_outage_finishes_once() {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let server = common::PrivateServer::start("outage_sched");
    let db = TestDb::new_on(&server.uri, "outage_sched").await;
    db.init(1).await;
    let log = db.dir.join("runs.log");
    let cmd = common::script(
        &db,
        "job.sh",
        &format!(
            "echo \"start $SLOTPOOL_FIRING\" >> '{0}'\nsleep 3\necho \"end $SLOTPOOL_FIRING\" >> '{0}'\n",
            log.display()
        ),
    );
    db.scheduled_exec("job", &cmd, r#"{"every": "10s", "keep_runs": 1000}"#);
    let _a = db.exec_worker(&[]);
    let _b = db.exec_worker(&[]);
    let in_flight = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("start ").map(str::to_string))
    };
    let firing = wait_for(Duration::from_secs(60), "a run in flight", || async {
        in_flight()
    })
    .await;
    let before = db.held().await;
    server.kill9();
    tokio::time::sleep(Duration::from_secs(5)).await;
    server.restart();
    let db = TestDb::on(&server.uri, &db.name).await;
    let record = wait_for(Duration::from_secs(60), "the run's record", || async {
        let r = db.robot("job").await;
        r.get_array("runs").ok()?.iter().find_map(|x| {
            let x = x.as_document()?;
            let at = chrono::DateTime::from_timestamp_millis(x.get_i64("firing").ok()?)?;
            (at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true) == firing).then(|| x.clone())
        })
    })
    .await;
    assert_eq!(record.get_str("outcome"), Ok("succeeded"), "{record}");
    let text = std::fs::read_to_string(&log).unwrap();
    let starts = text
        .lines()
        .filter(|l| *l == format!("start {firing}"))
        .count();
    let ends = text
        .lines()
        .filter(|l| *l == format!("end {firing}"))
        .count();
    assert_eq!((starts, ends), (1, 1), "{text}");
    assert_eq!(db.held().await.slots, before.slots, "the slot did not move");
    invariants::check_firings(&db, false).await;
}
