//! Scheduled robots: steady lateness, a takeover just before a firing, SIGSTOP in
//! the middle of a run, and 10,000 robots firing at one minute's edge. The figures
//! to beat are Agenda 5's on this machine kind and the same dev server, as the
//! scheduling issue records them.

use super::*;

/// A scheduled robot's run records.
fn runs_of(r: &bson::Document) -> Vec<bson::Document> {
    r.get_array("runs")
        .map(|a| a.iter().filter_map(Bson::as_document).cloned().collect())
        .unwrap_or_default()
}

fn int(d: &bson::Document, k: &str) -> Option<i64> {
    match d.get(k) {
        Some(Bson::Int64(v)) => Some(*v),
        Some(Bson::Int32(v)) => Some(*v as i64),
        _ => None,
    }
}

async fn succeeded(db: &TestDb, name: &str) -> usize {
    runs_of(&db.robot(name).await)
        .iter()
        .filter(|x| x.get_str("outcome") == Ok("succeeded"))
        .count()
}

async fn wait_succeeded(db: &TestDb, name: &str, n: usize, limit: Duration) {
    common::wait_for(limit, "scheduled runs", || async {
        (succeeded(db, name).await >= n).then_some(())
    })
    .await;
}

pub(super) async fn schedule_rows(quick: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    let (steady_n, trials) = if quick { (15, 3) } else { (60, 10) };
    let (a, b) = steady_and_takeover(steady_n, trials).await;
    rows.push(a);
    rows.push(b);
    rows.push(sigstop_mid_run(trials).await);
    rows
}

/// The minute edge alone (`--only edge`; `schedule` runs it too), at the tick in
/// `SLOTPOOL_BENCH_EDGE_TICK` (default 1s), with the number of robots in
/// `SLOTPOOL_BENCH_EDGE_ROBOTS` (default 10,000; 1,000 with `--quick`).
pub(super) async fn edge_row(quick: bool) -> Row {
    let tick = std::env::var("SLOTPOOL_BENCH_EDGE_TICK").unwrap_or_else(|_| "1s".into());
    let robots = match std::env::var("SLOTPOOL_BENCH_EDGE_ROBOTS") {
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("SLOTPOOL_BENCH_EDGE_ROBOTS={n:?} is not a whole number")),
        Err(_) if quick => 1_000,
        Err(_) => 10_000,
    };
    minute_edge(robots, &tick).await
}

/// An every-2-seconds counter on 3 workers at `--tick 1s`: the lateness of `n`
/// firings in the steady state, then `trials` kill -9s of the holder 200 ms before a
/// firing.
async fn steady_and_takeover(n: usize, trials: usize) -> (Row, Row) {
    fresh_server();
    let db = TestDb::new("b_sched").await;
    db.init(1).await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "s",
        "--kind",
        "counter",
        "--every",
        "2s",
        "--spec",
        r#"{"schedule": {"every": "2s", "keep_runs": 1000}}"#,
    ]);
    let mut w: Vec<WorkerProc> = (0..3).map(|_| db.worker(&[])).collect();
    // Two firings to settle, then n measured.
    wait_succeeded(&db, "s", 2, Duration::from_secs(60)).await;
    let from = succeeded(&db, "s").await;
    wait_succeeded(&db, "s", from + n, Duration::from_secs(4 * n as u64 + 60)).await;
    let mut steady: Vec<f64> = runs_of(&db.robot("s").await)
        .iter()
        .filter(|x| x.get_str("outcome") == Ok("succeeded"))
        .skip(from)
        .filter_map(|x| int(x, "lateness_ms"))
        .map(|l| l as f64)
        .collect();
    let p99_steady = p99(&steady);
    let steady_row = Row {
        name: "Scheduled firing, steady: every 2 s on 3 workers, tick 1 s; firing → run start (the holder's estimate of the server's clock)".into(),
        figures: format!("lateness {}", dist(&mut steady)),
        goal: judged(
            "p99 ≤ 8 ms (Agenda 5 here: p99 8 ms)",
            p99_steady <= 8.0,
            format!("p99 {p99_steady:.0} ms"),
        ),
    };

    let (mut after_claim, mut late, mut once) = (Vec::new(), Vec::new(), 0usize);
    for _ in 0..trials {
        let old = holder_of(&db, "slot-001", None).await;
        let i = w.iter().position(|x| x.id == old).unwrap();
        // The next firing at least 1.5 s away (the dev server is on this machine,
        // so its clock is this one's).
        let now = db.store.server_now().await.unwrap().timestamp_millis();
        let firing = (now + 1500).div_euclid(2000) * 2000 + 2000;
        let kill_at = firing - 200;
        // What each survivor had claimed and started before: the takeover is then
        // watched on their /metrics, which puts no load on the database while the
        // successor works (a read of the robot every 20 ms, its 1,000 runs kept,
        // slowed the successor's own reads several times over).
        let before: Vec<(u64, u64)> = w
            .iter()
            .map(|x| {
                (
                    x.metric("slotpool_claims_total").unwrap_or(0),
                    x.metric("slotpool_firings_started_total").unwrap_or(0),
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_millis((kill_at - wall_ms()).max(0) as u64)).await;
        w[i].kill9();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut successor = None;
        while successor.is_none() && Instant::now() < deadline {
            successor = (0..w.len()).find(|&j| {
                j != i && w[j].metric("slotpool_claims_total").unwrap_or(0) > before[j].0
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let j = successor.expect("a survivor claimed the slot");
        // The claim's own time on the server (the slot's `time` it wrote), read at
        // once: the holder's first renewal may come early, to reach the tick's edge.
        let claimed = claim_time(&db, "slot-001", &old).await;
        while w[j].metric("slotpool_firings_started_total").unwrap_or(0) <= before[j].1 {
            assert!(Instant::now() < deadline, "the successor started no firing");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let record = common::wait_for(Duration::from_secs(30), "the firing's run", || async {
            runs_of(&db.robot("s").await).into_iter().find(|x| {
                int(x, "firing") == Some(firing) && x.get_str("outcome") == Ok("succeeded")
            })
        })
        .await;
        let started = int(&record, "started").unwrap();
        after_claim.push((started - claimed) as f64);
        late.push(int(&record, "lateness_ms").unwrap() as f64);
        let starts = runs_of(&db.robot("s").await)
            .iter()
            .filter(|x| int(x, "firing") == Some(firing) && int(x, "started").is_some())
            .count();
        once += usize::from(starts == 1);
        w[i] = db.worker(&[]);
        // Two more firings before the next trial: the pool settles.
        let now_ok = succeeded(&db, "s").await;
        wait_succeeded(&db, "s", now_ok + 2, Duration::from_secs(30)).await;
    }
    let (claim99, late50) = (p99(&after_claim), {
        let mut l = late.clone();
        l.sort_by(f64::total_cmp);
        pct(&l, 0.5)
    });
    let takeover_row = Row {
        name: format!("Scheduled firing, takeover: kill -9 of the holder 200 ms before a firing (every 2 s, 3 workers, tick 1 s, L = 2 s), {trials} trials"),
        figures: format!(
            "successor's claim → that firing's start: {}; lateness: {}; exactly one run of it: {once} of {trials}",
            dist(&mut after_claim),
            dist(&mut late)
        ),
        goal: format!(
            "{}; {}; {}",
            judged("start ≤ 50 ms after the claim (p99)", claim99 <= 50.0, format!("p99 {claim99:.0} ms")),
            judged("lateness p50 ≤ 1.1 s (Agenda 5 here: 1.05–1.13 s)", late50 <= 1100.0, format!("p50 {late50:.0} ms")),
            judged("exactly one run each", once == trials, format!("{once} of {trials}")),
        ),
    };
    (steady_row, takeover_row)
}

/// An exec robot every 2 s whose run takes 1 s, on 3 workers: the holder stopped
/// with SIGSTOP for 5 s in the middle of a run, then let go, `trials` times. Counts
/// the firings that ran to success twice, and runs that overlapped.
async fn sigstop_mid_run(trials: usize) -> Row {
    fresh_server();
    let db = TestDb::new("b_sched_stop").await;
    db.init(1).await;
    let log = db.dir.join("runs.log");
    let cmd = common::script(
        &db,
        "job.sh",
        &format!(
            "echo start >> '{0}'\nsleep 1\necho end >> '{0}'\n",
            log.display()
        ),
    );
    db.scheduled_exec("j", &cmd, r#"{"every": "2s", "keep_runs": 1000}"#);
    let w: Vec<WorkerProc> = (0..3).map(|_| db.exec_worker(&[])).collect();
    wait_succeeded(&db, "j", 2, Duration::from_secs(60)).await;
    let in_flight = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().filter(|l| *l == "start").count()
            > text.lines().filter(|l| *l == "end").count()
    };
    for _ in 0..trials {
        common::wait_for(Duration::from_secs(30), "a run in flight", || async {
            in_flight().then_some(())
        })
        .await;
        let old = holder_of(&db, "slot-001", None).await;
        let i = w.iter().position(|x| x.id == old).unwrap();
        w[i].signal(libc::SIGSTOP);
        tokio::time::sleep(Duration::from_secs(5)).await;
        w[i].signal(libc::SIGCONT);
        let n = succeeded(&db, "j").await;
        wait_succeeded(&db, "j", n + 2, Duration::from_secs(30)).await;
    }
    let runs = runs_of(&db.robot("j").await);
    let mut by_firing: BTreeMap<i64, usize> = BTreeMap::new();
    for x in runs
        .iter()
        .filter(|x| x.get_str("outcome") == Ok("succeeded"))
    {
        *by_firing.entry(int(x, "firing").unwrap()).or_default() += 1;
    }
    let twice = by_firing.values().filter(|n| **n > 1).count();
    let mut iv: Vec<(i64, i64)> = runs
        .iter()
        .filter_map(|x| Some((int(x, "started")?, int(x, "ended")?)))
        .collect();
    iv.sort();
    let overlaps = iv.windows(2).filter(|p| p[1].0 < p[0].1).count();
    let lost = runs
        .iter()
        .filter(|x| x.get_str("outcome") == Ok("lost"))
        .count();
    Row {
        name: format!("Scheduled firing, SIGSTOP 5 s of the holder mid-run (every 2 s, 1 s runs, 3 workers), {trials} trials"),
        figures: format!(
            "firings that succeeded twice: {twice}; runs that overlapped: {overlaps}; runs recorded lost and retried: {lost}; firings that succeeded: {}",
            by_firing.len()
        ),
        goal: judged(
            "0 firings run twice (Agenda 5 here: 10 of 10 trials ran one again)",
            twice == 0 && overlaps == 0,
            format!("{twice} twice, {overlaps} overlaps"),
        ),
    }
}

/// `robots` counters on 10 slots (10 workers), every one firing each minute: two
/// minute edges measured.
async fn minute_edge(robots: u32, tick: &str) -> Row {
    fresh_server();
    let db = TestDb::new("b_sched_edge").await;
    db.init(10).await;
    let w: Vec<WorkerProc> = (0..10).map(|_| db.worker(&["--tick", tick])).collect();
    one_slot_each(&db, 10).await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "m",
        "--kind",
        "counter",
        "--count",
        &robots.to_string(),
        "--spec",
        r#"{"schedule": {"every": "1m", "keep_runs": 5}}"#,
    ]);
    let metric_sum = |name: &'static str| {
        let w = &w;
        async move { w.iter().map(|x| x.metric(name).unwrap_or(0)).sum::<u64>() }
    };
    // Wait for the edge after the next one, so every robot is adopted and claimed.
    let now = db.store.server_now().await.unwrap().timestamp_millis();
    let first_edge = now.div_euclid(60_000) * 60_000 + 120_000;
    tokio::time::sleep(Duration::from_millis(
        (first_edge - 30_000 - wall_ms()).max(0) as u64,
    ))
    .await;
    let fences0 = metric_sum("slotpool_self_fences_total").await;
    let started0 = metric_sum("slotpool_firings_started_total").await;
    let batched0 = metric_sum("slotpool_checkpoint_batched_total").await;
    let batches0 = metric_sum("slotpool_checkpoint_batches_total").await;
    let checkpoints0 = metric_sum("slotpool_checkpoints_total").await;
    let cpu0: f64 = w.iter().map(|x| cpu_s(x.pid())).sum();
    // The dev server's own CPU (None on a server not the bench's): what a firing
    // costs it, the floor under how many firings a minute it can take.
    let server = server_pid();
    let server0 = server.map(cpu_s);
    let t0 = Instant::now();
    // Two edges, and 30 s after the second for the ends to land.
    tokio::time::sleep(Duration::from_millis(
        (first_edge + 90_000 - wall_ms()).max(0) as u64,
    ))
    .await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (w.iter().map(|x| cpu_s(x.pid())).sum::<f64>() - cpu0) / secs;
    let server_cpu = server.zip(server0).map(|(p, a)| cpu_s(p) - a);
    let started = metric_sum("slotpool_firings_started_total").await - started0;
    let statements = metric_sum("slotpool_checkpoint_batched_total").await - batched0;
    let commands = metric_sum("slotpool_checkpoint_batches_total").await - batches0;
    let checkpoints = metric_sum("slotpool_checkpoints_total").await - checkpoints0;
    let fences = metric_sum("slotpool_self_fences_total").await - fences0;
    // Every robot write of the window, the counters' steps included: a step goes with
    // its run's end (and the next claim) in one statement.
    let per_firing = statements as f64 / started.max(1) as f64;
    let commands_per_firing = commands as f64 / started.max(1) as f64;
    // Lateness of the two edges' runs, from every robot's record; and what the
    // records say otherwise.
    let mut late = Vec::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for r in db.robots().await {
        for x in runs_of(&r) {
            *outcomes
                .entry(x.get_str("outcome").unwrap_or("?").to_string())
                .or_default() += 1;
            let f = int(&x, "firing").unwrap_or(0);
            if (f == first_edge || f == first_edge + 60_000)
                && x.get_str("outcome") == Ok("succeeded")
            {
                if let Some(l) = int(&x, "lateness_ms") {
                    late.push(l as f64);
                }
            }
        }
    }
    let ran = late.len();
    let p = p99(&late);
    let server_figure = match server_cpu {
        Some(c) => format!(
            "; the dev server's CPU {:.2} cores over the window, {:.1} ms a firing started",
            c / secs,
            c * 1000.0 / started.max(1) as f64
        ),
        None => String::new(),
    };
    Row {
        name: format!("Scheduled firing, the minute edge: {robots} counters on 10 slots (10 workers, --tick {tick}), all every minute; two edges"),
        figures: format!(
            "runs at the edges: {ran} of {}; lateness {}; robot writes per firing: {per_firing:.2} statements, the counters' steps included ({checkpoints} of them carried steps; {commands_per_firing:.3} commands); worker CPU {:.2} cores in all over {secs:.0} s; self-fences: {fences}; runs started in the window: {started}; the robots' records: {outcomes:?}{server_figure}",
            2 * robots,
            dist(&mut late),
            cpu
        ),
        goal: format!(
            "{}; {}; {}",
            judged("writes per firing ≤ 2 (Agenda 5 here: 3)", per_firing <= 2.0, format!("{per_firing:.2}")),
            judged("lateness p99 ≤ 1 s at the edge", p <= 1000.0, format!("p99 {p:.0} ms")),
            judged("0 self-fences", fences == 0, format!("{fences}")),
        ),
    }
}
