//! Elections and replication failures as MongoDB's own fault injection makes them
//! (`replSetStepDown`, the `failCommand` failpoint): a dev server of each test's own,
//! with mongod's test commands on, under a pool of two holders and a standby running
//! counters, an exec robot, and a scheduled counter and exec robot.
//!
//! What must hold (docs/guarantees.md, "Elections"):
//! - a step-down of 5 s or 15 s is an outage of writes: holders suspend their robots
//!   and renew late; no slot moves, no robot restarts, every robot steps on;
//! - a write refused with 10107, 189, 11602 or 91 is a transient failure: a renewal
//!   is sent again at its next tick, robots' checkpoints and firing records are
//!   retried or read back, a claim is tried again, and `robot create` answers with
//!   what happened and never makes a robot twice;
//! - a `writeConcernError` (64, 100) leaves a write in doubt, settled by reading it
//!   back: a checkpoint is not lost, a claim that landed is held or lapses;
//! - a renewal whose connection closed before the reply is renewed again.
//!
//! Each case ends with the invariant checker (no robot ran twice, no checkpoint was
//! lost) and the firings' checker (no firing started twice, none without a record).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use common::{invariants, owner, stubborn_robot, wait_for, PrivateServer, TestDb, WorkerProc};

/// Two cases at a time, each on a server of its own, whatever the machine's cores.
static TWO_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The codes of an election, as a client meets them.
const ELECTION_CODES: [i32; 4] = [10107, 189, 11602, 91];

struct Pool {
    server: PrivateServer,
    db: TestDb,
    admin: mongodb::Client,
    workers: Vec<WorkerProc>,
}

/// How many times each robot has stepped (checkpoints) and fired (succeeded runs).
async fn progress(db: &TestDb) -> BTreeMap<String, i64> {
    db.robots()
        .await
        .iter()
        .map(|r| {
            let runs = r.get_array("runs").map_or(0, |runs| {
                runs.iter()
                    .filter(|x| {
                        x.as_document()
                            .is_some_and(|x| x.get_str("outcome") == Ok("succeeded"))
                    })
                    .count() as i64
            });
            (
                r.get_str("name").unwrap().to_string(),
                r.get_i64("seq").unwrap_or(0) + runs,
            )
        })
        .collect()
}

impl Pool {
    /// `retry_writes`: the driver's own retry of a write, as on MongoDB by default
    /// (the dev server's URI turns it off; docs/dev-database.md says why).
    async fn start(label: &str, retry_writes: bool) -> Pool {
        let server = PrivateServer::launch(&[("SLOTPOOL_DEV_TEST_COMMANDS", "1")], &[]);
        let uri = if retry_writes {
            server.uri.replace("retryWrites=false", "retryWrites=true")
        } else {
            server.uri.clone()
        };
        let db = TestDb::new_on(&uri, label).await;
        let admin = mongodb::Client::with_uri_str(&server.uri).await.unwrap();
        db.init(2).await;
        let mut pool = Pool {
            server,
            db,
            admin,
            workers: Vec::new(),
        };
        for _ in 0..3 {
            pool.add_worker();
        }
        wait_for(Duration::from_secs(30), "both slots held", || async {
            (pool.db.slots().await.iter().filter_map(owner).count() == 2).then_some(())
        })
        .await;
        let db = &pool.db;
        db.create_counters(4);
        db.exec("x-1", &stubborn_robot(db), &[]);
        let spec = r#"{"schedule": {"every": "1s", "keep_runs": 1000}, "history": 1000}"#;
        db.cli_ok(&[
            "robot", "create", "--name", "tick", "--kind", "counter", "--spec", spec,
        ]);
        let job = common::script(db, "job.sh", "sleep 0.3\n");
        db.scheduled_exec("job", &job, r#"{"every": "2s", "keep_runs": 1000}"#);
        pool.every_robot_moves_on().await;
        pool
    }

    fn add_worker(&mut self) {
        self.workers.push(self.db.exec_worker(&[]));
    }

    /// Every robot checkpoints or fires twice more than now.
    async fn every_robot_moves_on(&self) {
        let before = progress(&self.db).await;
        wait_for(
            Duration::from_secs(60),
            "every robot to step or fire twice more",
            || async {
                let now = progress(&self.db).await;
                before
                    .iter()
                    .all(|(name, n)| now.get(name).is_some_and(|m| *m >= n + 2))
                    .then_some(())
            },
        )
        .await;
    }

    async fn admin(&self, command: Document) -> Document {
        self.admin
            .database("admin")
            .run_command(command.clone())
            .await
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    }

    /// Sets the `failCommand` failpoint to fail the next `times` of `commands` sent
    /// by the client named `app` as `data` says, and waits until it has fired
    /// `times` times (the dev server's front records each).
    async fn fail(
        &self,
        commands: &[&str],
        app: &str,
        data: Document,
        times: usize,
    ) -> Vec<String> {
        let before = self.server.failpoint_hits().len();
        let mut spec = doc! {"failCommands": commands, "appName": app};
        spec.extend(data);
        self.admin(doc! {
            "configureFailPoint": "failCommand",
            "mode": {"times": times as i64},
            "data": spec,
        })
        .await;
        let hits = wait_for(
            Duration::from_secs(60),
            &format!("the failpoint on {commands:?} from {app} to fire {times} times"),
            || async {
                let hits = self.server.failpoint_hits();
                (hits.len() >= before + times).then(|| hits[before..].to_vec())
            },
        )
        .await;
        hits.into_iter()
            .map(|(cmd, app, what)| format!("{cmd} {app} {what}"))
            .collect()
    }

    fn restarts(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.metric("slotpool_robot_restarts_total").unwrap_or(0))
            .sum()
    }

    /// The checkers, once every robot has moved on.
    async fn still_true(&self) {
        self.every_robot_moves_on().await;
        let report = invariants::check(&self.db).await;
        println!("{report:?}");
        let firings = invariants::check_firings(&self.db, false).await;
        println!("{firings:?}");
    }
}

/// `replSetStepDown`: the server is a secondary for `secs`, and every write fails
/// with 10107 while reads go on.
async fn step_down(pool: &Pool, secs: i64) {
    let before = pool.db.held().await;
    let restarts = pool.restarts();
    pool.admin(doc! {"replSetStepDown": secs, "force": true})
        .await;
    // Writes fail until the server is primary again; then every robot moves on.
    wait_for(
        Duration::from_secs(secs as u64 + 30),
        "the server to be primary again",
        || async {
            let hello = pool.admin(doc! {"hello": 1}).await;
            hello.get_bool("isWritablePrimary").ok().filter(|p| *p)
        },
    )
    .await;
    pool.every_robot_moves_on().await;
    assert_eq!(
        pool.db.held().await,
        before,
        "through a {secs} s step-down no slot moved and no robot started again"
    );
    assert_eq!(pool.restarts(), restarts, "no robot restarted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_down_for_5_s_and_then_for_15_s_restarts_nothing() {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let pool = Pool::start("stepdown", false).await;
    step_down(&pool, 5).await;
    step_down(&pool, 15).await;
    let resumed = r#"slotpool_suspensions_total{outcome="resumed"}"#;
    let resumes: u64 = pool
        .workers
        .iter()
        .map(|w| w.metric(resumed).unwrap_or(0))
        .sum();
    assert!(resumes >= 2, "the holders suspended and resumed: {resumes}");
    pool.still_true().await;
}

/// Where a failpoint aims: the command and the client that sends it.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Renewals: `update` of `slots` by the lease's client.
    Renewals,
    /// Claims: `findAndModify` of `slots` by the lease's client, at a hand-over.
    Claims,
    /// The group commit's checkpoints and the firings' records: `update` of
    /// `robots` by the robots' client.
    RobotWrites,
    /// `robot create`: `insert` of `robots` by the CLI.
    Create,
}

const TARGETS: [Target; 4] = [
    Target::Renewals,
    Target::Claims,
    Target::RobotWrites,
    Target::Create,
];

/// One failpoint on `target`, `data` its effect; then what must hold of it.
async fn fail_on(pool: &mut Pool, target: Target, data: Document, label: &str) {
    let before = pool.db.held().await;
    let restarts = pool.restarts();
    match target {
        Target::Renewals => {
            let hits = pool.fail(&["update"], "slotpool-lease", data, 2).await;
            println!("[{label}] renewals: {hits:?}");
        }
        Target::RobotWrites => {
            let hits = pool.fail(&["update"], "slotpool", data, 3).await;
            println!("[{label}] robots' writes: {hits:?}");
        }
        Target::Claims => {
            // Set before the hand-over: the claim meets it.
            let shared: &Pool = pool;
            let failing = shared.fail(&["findAndModify"], "slotpool-lease", data, 2);
            let (hits, by) = tokio::join!(failing, async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                shared.hand_over("slot-001").await
            });
            println!("[{label}] claims: {hits:?}; slot-001 went to {by}");
            pool.settle_hand_over().await;
            pool.still_true().await;
            return;
        }
        Target::Create => {
            let name = format!("new-{}", label.replace(' ', "-"));
            let shared: &Pool = pool;
            let failing = shared.fail(&["insert"], "slotpool", data, 1);
            let (hits, out) = tokio::join!(failing, async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                shared.db.counters(&name, 1, 200)
            });
            println!("[{label}] create: {hits:?}; {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            let made = pool
                .db
                .robots()
                .await
                .iter()
                .filter(|r| r.get_str("name") == Ok(name.as_str()))
                .count();
            if out.status.success() {
                assert_eq!(made, 1, "created once: {err}");
            } else {
                assert!(made <= 1, "never twice");
                assert!(
                    err.contains("Rerun the same command") && !err.contains("Kind:"),
                    "a failed create says what failed in words: {err}"
                );
            }
            pool.still_true().await;
            return;
        }
    }
    pool.every_robot_moves_on().await;
    assert_eq!(
        pool.db.held().await,
        before,
        "[{label}] nothing moved or restarted"
    );
    assert_eq!(pool.restarts(), restarts, "[{label}] no robot restarted");
}

impl Pool {
    /// Stops the holder of `slot` with SIGTERM (it hands the slot over) and returns
    /// who took the slot. Through a shared reference, to run beside a failpoint's
    /// wait; [`Pool::settle_hand_over`] then brings the workers' list up to date.
    async fn hand_over(&self, slot: &str) -> String {
        let holder = owner(&self.db.slot(slot).await).expect("a holder");
        let gone = self.workers.iter().find(|w| w.id == holder).unwrap();
        gone.signal(libc::SIGTERM);
        wait_for(
            Duration::from_secs(60),
            "another worker to take the slot",
            || async { owner(&self.db.slot(slot).await).filter(|o| *o != holder) },
        )
        .await
    }

    /// Drops the workers that exited and starts a standby for each.
    async fn settle_hand_over(&mut self) {
        let mut kept = Vec::new();
        for mut w in self.workers.drain(..) {
            if w.wait_exit(Duration::from_millis(10)).is_none() {
                kept.push(w);
            }
        }
        self.workers = kept;
        while self.workers.len() < 3 {
            self.add_worker();
        }
    }
}

/// The four codes of an election over the four targets, as a Latin square: the
/// case for codes `first` and `first + 1` runs each over every target, starting
/// each code at another target. With `retry_writes` the driver retries each failed
/// write once itself, as on MongoDB by default.
async fn election_codes(first: usize, retry_writes: bool) {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let mut pool = Pool::start(&format!("failcommand{first}"), retry_writes).await;
    for code in [first, first + 1] {
        for step in 0..TARGETS.len() {
            let target = TARGETS[(code + step) % TARGETS.len()];
            let errcode = ELECTION_CODES[code];
            fail_on(
                &mut pool,
                target,
                doc! {"errorCode": errcode},
                &format!("{errcode} {target:?}"),
            )
            .await;
        }
    }
    pool.still_true().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn not_primary_and_stepped_down_on_every_write_path_lose_nothing() {
    election_codes(0, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupted_and_shutting_down_on_every_write_path_lose_nothing_with_the_drivers_retry() {
    election_codes(2, true).await;
}

/// `writeConcernError` 64 (WriteConcernFailed) and 100 (UnsatisfiableWriteConcern)
/// on checkpoints and on claims; then a renewal whose connection closes before
/// its reply.
#[tokio::test(flavor = "multi_thread")]
async fn write_concern_errors_and_a_lost_reply_lose_nothing() {
    let _turn = TWO_AT_A_TIME.acquire().await.expect("open");
    let mut pool = Pool::start("wce", false).await;
    let wce = |code: i32| {
        doc! {"writeConcernError": {
            "code": code,
            "errmsg": "waiting for replication timed out (slotpool's election test)",
        }}
    };
    for (code, target) in [
        (64, Target::RobotWrites),
        (100, Target::Claims),
        (100, Target::RobotWrites),
        (64, Target::Claims),
    ] {
        fail_on(
            &mut pool,
            target,
            wce(code),
            &format!("wce {code} {target:?}"),
        )
        .await;
    }
    fail_on(
        &mut pool,
        Target::Renewals,
        doc! {"closeConnection": true},
        "closeConnection Renewals",
    )
    .await;
    pool.still_true().await;
}
