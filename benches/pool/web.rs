//! The web dashboard: its cost to the database, and the leases under its load.

use super::*;

/// What `slotpool web` costs the database, and how fast it answers, over `n` robots
/// on 10 slots held by a ghost holder (renewed every second by the bench): the dev
/// server's CPU and operations with no dashboard, then with one viewer and with 20
/// viewers each polling the overview and a search once a second; then the latency of
/// a search over all `n` robots and of a page of the robot table.
pub(super) async fn web_cost(n: u32) -> Row {
    let name = format!("Dashboard (`slotpool web`, defaults) over {n} robots on 10 slots: the dev server's CPU and operations/s it adds (20 s windows), and its answer times");
    fresh_server();
    let db = TestDb::new("b_web").await;
    ghost_slots(&db, 10, 2000, false).await;
    let renewing = renew_ghosts(&db);
    for keys in [doc! {"name": 1}, doc! {"slot_id": 1}] {
        db.store
            .robots()
            .create_index(mongodb::IndexModel::builder().keys(keys).build())
            .await
            .unwrap();
    }
    let now = bson::DateTime::now();
    let docs: Vec<bson::Document> = (0..n)
        .map(|i| {
            doc! {
                "name": format!("bot-{i:05}"), "kind": "counter", "spec": {},
                "slot_id": format!("slot-{:05}", i % 10 + 1), "epoch": 0_i64,
                "context": {"n": 0_i64}, "seq": 0_i64, "paused": false, "status": "pending",
                "created_at": now,
            }
        })
        .collect();
    for chunk in docs.chunks(1000) {
        db.store.robots().insert_many(chunk.to_vec()).await.unwrap();
    }
    let window = Duration::from_secs(20);
    let pid = server_pid();
    let measure = |label: String| {
        let db = &db;
        async move {
            let ops = opcounters(db).await;
            let t = Instant::now();
            let cores = match pid {
                Some(pid) => server_cores(pid, window).await,
                None => {
                    tokio::time::sleep(window).await;
                    f64::NAN
                }
            };
            let rate = (opcounters(db).await - ops) as f64 / t.elapsed().as_secs_f64();
            (label, cores, rate)
        }
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let base = measure("no dashboard".into()).await;
    let web = common::web::WebProc::start(&db.uri, &db.dir, false, &[]).await;
    web.overview_with_robots().await;
    let mut figures = vec![format!(
        "no dashboard: {:.3} cores, {:.1} ops/s",
        base.1, base.2
    )];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut viewers = Vec::new();
    for viewers_wanted in [1usize, 20] {
        while viewers.len() < viewers_wanted {
            let (stop, port) = (stop.clone(), web.port);
            viewers.push(std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = common::web::request(port, "GET", "/api/v1/overview", &[], b"");
                    let _ = common::web::request(
                        port,
                        "GET",
                        "/api/v1/robots?q=bot-07&sort=seq",
                        &[],
                        b"",
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(12)).await;
        let (_, cores, rate) = measure(String::new()).await;
        figures.push(format!(
            "{viewers_wanted} viewer(s): +{:.3} cores, +{:.1} ops/s",
            cores - base.1,
            rate - base.2
        ));
    }
    let times = |path: &str| {
        let mut ms: Vec<f64> = (0..200)
            .map(|_| {
                let t = Instant::now();
                let r = common::web::request(web.port, "GET", path, &[], b"").unwrap();
                assert_eq!(r.status, 200, "{path}");
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        format!("p50 {:.1} ms, p99 {:.1} ms", pct(&ms, 0.5), pct(&ms, 0.99))
    };
    figures.push(format!(
        "search of all {n} (`/api/v1/robots?q=bot-07&sort=seq&order=desc`): {}",
        times("/api/v1/robots?q=bot-07&sort=seq&order=desc")
    ));
    figures.push(format!(
        "a page of the table (`/robots?page=40`): {}",
        times("/robots?page=40")
    ));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for v in viewers {
        let _ = v.join();
    }
    renewing.abort();
    Row {
        name,
        figures: figures.join("; "),
        goal: "issue 11: viewers share one snapshot; fast at 10,000 robots".into(),
    }
}

/// The leases under the dashboard's load: 20 clients hit `slotpool web` for 30 s
/// beside two workers holding a slot each with 30 counters each (tests/web_load.rs
/// asserts only what must always hold; these are the figures that depend on the
/// machine).
pub(super) async fn web_load() -> Row {
    fresh_server();
    let db = TestDb::new("b_webload").await;
    db.init(2).await;
    assert!(db.counters("lo", 60, 250).status.success());
    let (first, second) = db.one_slot_each(|_| db.worker(&[])).await;
    let web = common::web::WebProc::start(&db.uri, &db.dir, false, &[]).await;
    web.overview_with_robots().await;
    let sample = |w: &WorkerProc| {
        let page = w.http_get("/metrics").expect("worker metrics").1;
        [
            metric(&page, "slotpool_self_fences_total"),
            metric(&page, "slotpool_losses_total"),
            metric(&page, "slotpool_renew_latency_seconds_count"),
            metric(&page, "slotpool_renew_latency_seconds_bucket{le=\"0.25\"}"),
        ]
    };
    let before = [sample(&first), sample(&second)];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let paths = common::web::LOAD_PATHS;
    let t = Instant::now();
    let clients: Vec<_> = (0..20)
        .map(|i| {
            let (stop, served, port) = (stop.clone(), served.clone(), web.port);
            std::thread::spawn(move || {
                let mut n = i;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    if common::web::request(port, "GET", paths[n % paths.len()], &[], b"")
                        .is_some_and(|r| r.status == 200)
                    {
                        served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let secs = t.elapsed().as_secs_f64();
    let after = [sample(&first), sample(&second)];
    let d = |i: usize| -> u64 { (0..2).map(|w| after[w][i] - before[w][i]).sum() };
    Row {
        name: "Leases under the dashboard's load: 20 clients for 30 s, two workers holding a slot each, 60 counters".into(),
        figures: format!(
            "{:.0} answers/s; {} self-fences, {} losses; {} of {} renewals slower than 250 ms (fence margin 450 ms)",
            served.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs,
            d(0),
            d(1),
            d(2) - d(3),
            d(2)
        ),
        goal: judged(
            "no self-fence, every renewal under 250 ms",
            d(0) == 0 && d(2) == d(3),
            format!("{} self-fences, {} slow renewals", d(0), d(2) - d(3)),
        ),
    }
}
