//! Placement by load: 10 slots on 10 workers, 200 robots of skewed cost created one
//! at a time in a seeded random order (10 % burn CPU, the rest are counters that
//! step once a minute). Each holder's CPU is read from its own `/status` (its load's
//! CPU share of its allowance, over the last minute) after a minute of running:
//! placed by count, then after `rebalance --by load`, and, in a pool of its own,
//! placed by load with the burners' CPU declared (`--cpu`).

use super::*;

/// How many robots, how many of them burn, and how many slots and workers.
const ROBOTS: usize = 200;
const BURNERS: usize = 20;
const SLOTS: u32 = 10;

/// A robot that burns `cores` of CPU: busy 5 ms of every `5 / cores` ms.
fn burner(db: &TestDb, cores: f64) -> String {
    let rest = 0.005 / cores - 0.005;
    common::script(
        db,
        "burner.sh",
        &format!(
            "exec python3 -c 'import time\nwhile True:\n    t = time.monotonic()\n    while time.monotonic() - t < 0.005: pass\n    time.sleep({rest})'"
        ),
    )
}

/// Which of the robots burn: `BURNERS` positions of `ROBOTS`, from a fixed seed.
fn burning() -> Vec<bool> {
    let mut seed: u64 = 0x5107_9001;
    let mut burns = vec![false; ROBOTS];
    let mut n = 0;
    while n < BURNERS {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (seed >> 33) as usize % ROBOTS;
        if !burns[i] {
            burns[i] = true;
            n += 1;
        }
    }
    burns
}

/// Creates the robots one at a time, by `by`; a burner declares its CPU when
/// `declare`.
fn create_all(db: &TestDb, burner: &str, cores: f64, by: &str, declare: bool) {
    let cpu = format!("{cores}");
    for (i, burns) in burning().into_iter().enumerate() {
        let name = format!("r{i:03}");
        let mut args = vec!["robot", "create", "--name", &name, "--by", by];
        if burns {
            args.extend(["--kind", "exec", "--command", burner]);
            if declare {
                args.extend(["--cpu", &cpu]);
            }
        } else {
            args.extend(["--kind", "counter", "--interval-ms", "60000"]);
        }
        db.cli_ok(&args);
    }
}

/// Each worker's CPU over the last minute, in cores, from its `/status`.
fn holders_cpu(workers: &[WorkerProc]) -> Vec<f64> {
    let mut out: Vec<f64> = workers
        .iter()
        .filter_map(|w| {
            let (_, body) = w.http_get("/status")?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            Some(v["load"]["cpu"].as_f64()? * v["load"]["cores"].as_f64()?)
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// Burners per slot, as placed.
async fn burners_per_slot(db: &TestDb) -> Vec<usize> {
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for r in db.robots().await {
        let slot = r.get_str("slot_id").unwrap_or_default().to_string();
        let n = per.entry(slot).or_default();
        if r.get_str("kind") == Ok("exec") {
            *n += 1;
        }
    }
    let mut v: Vec<usize> = per.into_values().collect();
    v.sort();
    v
}

/// The figures of one placement: holders' CPU and burners per slot.
fn shown(cpu: &[f64], burners: &[usize]) -> (String, f64) {
    let ratio = cpu.last().copied().unwrap_or(0.0) / cpu.first().copied().unwrap_or(1.0).max(1e-3);
    let cores: Vec<String> = cpu.iter().map(|c| format!("{c:.3}")).collect();
    let b: Vec<String> = burners.iter().map(|n| n.to_string()).collect();
    (
        format!(
            "holders' CPU (cores) {}; busiest {ratio:.2} × the idlest; burners per slot {}",
            cores.join(" "),
            b.join("/")
        ),
        ratio,
    )
}

/// A pool of 10 workers holding a slot each, its robots created by `by`.
async fn pool(name: &str, by: &str, declare: bool, cores: f64) -> (TestDb, Vec<WorkerProc>) {
    fresh_server();
    let db = TestDb::new(name).await;
    db.init(SLOTS).await;
    let w: Vec<WorkerProc> = (0..SLOTS).map(|_| db.exec_worker(&[])).collect();
    one_slot_each(&db, SLOTS as usize).await;
    // A pool in its steady state: every holder's heartbeat carries its load (a
    // holder behind the watchers beats every 40 s, and says nothing before its CPU
    // has a rate). Until then, placement by load places by counts.
    common::wait_for(
        Duration::from_secs(120),
        "every worker's load in its heartbeat",
        || async {
            let n = db
                .store
                .workers()
                .count_documents(doc! {"load": {"$type": "object"}})
                .await
                .ok()?;
            (n == SLOTS as u64).then_some(())
        },
    )
    .await;
    let burner = burner(&db, cores);
    create_all(&db, &burner, cores, by, declare);
    (db, w)
}

/// Waits out a minute of the robots running: the CPU figure's window.
async fn a_minute() {
    tokio::time::sleep(Duration::from_secs(70)).await;
}

pub(super) async fn placement_rows() -> Vec<Row> {
    // 20 burners of 0.1 core would take the whole of a 2-core machine: the burn is
    // scaled to keep half of it free for the workers and the dev server.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let cores = (0.5 * cpus / BURNERS as f64).min(0.1);
    let mut rows = Vec::new();
    let setup = format!(
        "{SLOTS} slots on {SLOTS} workers, {ROBOTS} robots created one at a time in a fixed random order: {BURNERS} exec robots burning {cores:.2} core each, the rest counters stepping once a minute"
    );

    let (db, w) = pool("b_place_count", "count", false, cores).await;
    a_minute().await;
    let (count, count_ratio) = shown(&holders_cpu(&w), &burners_per_slot(&db).await);
    show(
        &mut rows,
        Row {
            name: format!("Placement by count: {setup}"),
            figures: count,
            goal: "-".into(),
        },
    );
    let out = db.cli_ok(&["rebalance", "--by", "load"]);
    let moved = out.lines().filter(|l| l.contains(" -> ")).count();
    a_minute().await;
    let (rebalanced, rebalanced_ratio) = shown(&holders_cpu(&w), &burners_per_slot(&db).await);
    show(
        &mut rows,
        Row {
            name: "Then `rebalance --by load` (default band), measured a minute later".into(),
            figures: format!("{moved} move(s); {rebalanced}"),
            goal: judged(
                "busiest within 1.5 × the idlest",
                rebalanced_ratio <= 1.5,
                format!("{rebalanced_ratio:.2}, by count {count_ratio:.2}"),
            ),
        },
    );
    drop(w);

    let (db, w) = pool("b_place_load", "load", true, cores).await;
    a_minute().await;
    let (load, load_ratio) = shown(&holders_cpu(&w), &burners_per_slot(&db).await);
    show(
        &mut rows,
        Row {
            name: format!(
                "Placement by load, the burners declaring their CPU (`--cpu {cores:.2}`): {setup}"
            ),
            figures: load,
            goal: judged(
                "busiest within 1.5 × the idlest",
                load_ratio <= 1.5,
                format!("{load_ratio:.2}, by count {count_ratio:.2}"),
            ),
        },
    );
    drop(w);
    rows
}
