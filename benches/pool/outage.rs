//! The outage phase: the whole database away for 8 s (the bench's own dev server
//! killed with -9 and started again on its data), as an election or a step-down
//! looks to the pool. Measured with the default suspension and with
//! `--suspend-for 0` (the behaviour before it): robots restarted, slots moved, how
//! long until every holder resumed and every robot checkpointed again, and the
//! server's CPU after its return against the same window without an outage.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::doc;
use futures::TryStreamExt;

use super::*;

/// Each slot's holder and epoch, and each robot's generation.
type Held = (
    BTreeMap<String, (Option<String>, i64)>,
    BTreeMap<String, i64>,
);

async fn held(db: &TestDb) -> Held {
    let slots = db
        .slots()
        .await
        .iter()
        .map(|s| {
            (
                s.get_str("_id").unwrap_or("").to_string(),
                (owner(s), s.get_i64("epoch").unwrap_or(0)),
            )
        })
        .collect();
    let mut gens = BTreeMap::new();
    let mut c = db
        .store
        .robots()
        .find(doc! {})
        .projection(doc! {"name": 1, "gen": 1})
        .await
        .unwrap();
    while let Some(r) = c.try_next().await.unwrap() {
        gens.insert(
            r.get_str("name").unwrap_or("").to_string(),
            r.get_i64("gen").unwrap_or(0),
        );
    }
    (slots, gens)
}

/// The server's clock now (ms), from `hello`. Asked again after a failure: the
/// first request after a restart may meet a connection the kill closed (the
/// driver then empties its pool).
async fn server_ms(db: &TestDb) -> i64 {
    let mut tries = 0;
    loop {
        match db.store.db().run_command(doc! {"hello": 1}).await {
            Ok(hello) => {
                return hello
                    .get_datetime("localTime")
                    .map(|t| t.timestamp_millis())
                    .unwrap_or_else(|_| chrono::Utc::now().timestamp_millis())
            }
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("[outage] hello failed ({e}); again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the server does not answer after its restart: {e}"),
        }
    }
}

/// The oldest `checkpointed_at` of all robots (ms), one aggregation.
async fn oldest_checkpoint_ms(db: &TestDb) -> Option<i64> {
    let pipeline = vec![doc! {"$group": {"_id": null, "oldest": {"$min": "$checkpointed_at"}}}];
    let mut c = db.store.robots().aggregate(pipeline).await.ok()?;
    let d = c.try_next().await.ok()??;
    d.get_datetime("oldest").ok().map(|t| t.timestamp_millis())
}

/// The oldest lease stamp of all slots (ms, server clock), or None while one is
/// unheld: after an outage, every slot renewed (or claimed again) since.
async fn oldest_lease_ms(db: &TestDb) -> Option<i64> {
    let slots = db.slots().await;
    slots
        .iter()
        .map(|s| s.get_datetime("time").ok().map(|t| t.timestamp_millis()))
        .collect::<Option<Vec<i64>>>()?
        .into_iter()
        .min()
}

/// One configuration's rounds.
struct Outcome {
    restarted: Vec<usize>,
    moved: Vec<usize>,
    /// From the server's return until every slot was renewed (resumed) or claimed
    /// again (ms).
    all_renewed: Vec<f64>,
    /// From the server's return until every robot checkpointed again (ms).
    all_checkpointed: Vec<f64>,
    /// The server's CPU in the 30 s after each return (cores).
    cpu_after: Vec<f64>,
    /// The same window without an outage (cores).
    cpu_quiet: f64,
}

async fn rounds(
    suspend_for: &str,
    slots: u32,
    robots: u32,
    workers: usize,
    rounds: usize,
    down: Duration,
) -> Option<Outcome> {
    fresh_server();
    let pid = server_pid()?;
    let db = TestDb::new("b_outage").await;
    db.init(slots).await;
    let w: Vec<WorkerProc> = (0..workers)
        .map(|_| db.worker(&["--suspend-for", suspend_for]))
        .collect();
    common::wait_for(Duration::from_secs(60), "every slot held", || async {
        (db.slots().await.iter().filter_map(owner).count() == slots as usize).then_some(())
    })
    .await;
    // Counters stepping every 10 s: 1,000 checkpoints a second at 10,000 robots,
    // what the dev server carries beside the pool's renewals.
    let out = db.counters("o", robots, 10_000);
    assert!(out.status.success(), "{out:?}");
    let started = server_ms(&db).await;
    common::wait_for(
        Duration::from_secs(120),
        "every robot's first checkpoint",
        || async {
            oldest_checkpoint_ms(&db)
                .await
                .filter(|t| *t >= started)
                .map(|_| ())
        },
    )
    .await;
    let window = Duration::from_secs(30);
    let cpu_quiet = server_cores(pid, window).await;
    let mut o = Outcome {
        restarted: Vec::new(),
        moved: Vec::new(),
        all_renewed: Vec::new(),
        all_checkpointed: Vec::new(),
        cpu_after: Vec::new(),
        cpu_quiet,
    };
    for _ in 0..rounds {
        let (slots_before, gens_before) = held(&db).await;
        let pid = server_pid()?;
        // SAFETY: kill(2) on the bench's own dev server.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        tokio::time::sleep(down).await;
        dev_server("start");
        let back = Instant::now();
        let back_ms = server_ms(&db).await;
        loop {
            if oldest_lease_ms(&db).await.is_some_and(|t| t >= back_ms) {
                break;
            }
            if back.elapsed() > Duration::from_secs(120) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        o.all_renewed.push(back.elapsed().as_secs_f64() * 1000.0);
        loop {
            if oldest_checkpoint_ms(&db)
                .await
                .is_some_and(|t| t >= back_ms)
            {
                break;
            }
            if back.elapsed() > Duration::from_secs(120) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        o.all_checkpointed
            .push(back.elapsed().as_secs_f64() * 1000.0);
        let (slots_after, gens_after) = held(&db).await;
        o.moved.push(
            slots_before
                .iter()
                .filter(|(id, was)| slots_after.get(*id) != Some(was))
                .count(),
        );
        o.restarted.push(
            gens_before
                .iter()
                .filter(|(name, gen)| gens_after.get(*name) != Some(gen))
                .count(),
        );
        o.cpu_after.push(server_cores(server_pid()?, window).await);
    }
    drop(w);
    Some(o)
}

pub(super) async fn outage_rows(quick: bool) -> Vec<Row> {
    let (slots, robots, workers, n) = if quick {
        (4, 800, 8, 2)
    } else {
        (10, 10_000, 20, 5)
    };
    let down = Duration::from_secs(8);
    let name = format!(
        "Database outage: {slots} slots, {robots} counters (a step every 10 s) on {workers} workers, tick 1 s; the dev server killed with -9 for {} s and started again on its data, {n} rounds",
        down.as_secs()
    );
    let (Some(with), Some(without)) = (
        rounds("60s", slots, robots, workers, n, down).await,
        rounds("0s", slots, robots, workers, n, down).await,
    ) else {
        return vec![Row {
            name,
            figures: "not measured: needs the bench's own dev server (run without MONGODB_URI)"
                .into(),
            goal: "-".into(),
        }];
    };
    let describe = |o: &Outcome| {
        let mut all = o.all_checkpointed.clone();
        let mut renewed = o.all_renewed.clone();
        let cpu = o.cpu_after.iter().sum::<f64>() / o.cpu_after.len().max(1) as f64;
        format!(
            "robots restarted per round {:?}, slots moved {:?}; from the return until every slot was renewed or claimed again: {}; until every robot checkpointed again (each steps every 10 s): {}; server CPU in the 30 s after: {cpu:.2} cores (without an outage: {:.2})",
            o.restarted,
            o.moved,
            dist(&mut renewed),
            dist(&mut all),
            o.cpu_quiet
        )
    };
    let restarted: usize = with.restarted.iter().sum();
    let moved: usize = with.moved.iter().sum();
    let slowest = with.all_renewed.iter().cloned().fold(0.0, f64::max);
    let within = 1000.0 + 500.0;
    vec![Row {
        name,
        figures: format!(
            "suspended (default, `--suspend-for 60s`): {}. Stopped at the deadline (`--suspend-for 0`, as before): {}",
            describe(&with),
            describe(&without)
        ),
        goal: judged(
            "0 robots restarted, 0 slots moved, every holder resumed within a tick + 500 ms of the return",
            restarted == 0 && moved == 0 && slowest <= within,
            format!(
                "{restarted} restarted, {moved} moved in {n} rounds; the slowest round's last resume {slowest:.0} ms"
            ),
        ),
    }]
}
