//! The dashboard must never disturb the leases: 20 HTTP clients load `slotpool web`
//! for 30 s while two workers hold the slots and run their robots, and no worker
//! self-fences, loses a slot or sees a renewal slower than its fence margin.
//! (Its own binary: the load must not overlap other timing tests.)

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::web::{request, WebProc};
use common::{metric, wait_for, TestDb};

const CLIENTS: usize = 20;
const LOAD: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_clients_for_thirty_seconds_do_not_disturb_the_leases() {
    let db = TestDb::new("web_load").await;
    db.init(2).await;
    let out = db.counters("lo", 60, 250);
    assert!(out.status.success());
    let (first, second) = db.one_slot_each(|_| db.worker(&[])).await;
    wait_for(Duration::from_secs(30), "every robot running", || async {
        let running: u64 = [&first, &second]
            .iter()
            .map(|w| w.metric("slotpool_robots_running").unwrap_or(0))
            .sum();
        (running == 60).then_some(())
    })
    .await;
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;
    web.overview_with_robots().await;

    let metrics = |w: &common::WorkerProc| {
        let page = w.http_get("/metrics").expect("worker metrics").1;
        (
            metric(&page, "slotpool_self_fences_total"),
            metric(&page, "slotpool_losses_total"),
            metric(&page, "slotpool_renew_latency_seconds_count"),
            metric(&page, "slotpool_renew_latency_seconds_bucket{le=\"0.25\"}"),
        )
    };
    let before = [metrics(&first), metrics(&second)];

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let paths = [
        "/",
        "/api/v1/overview",
        "/robots?q=lo-1&sort=seq&order=desc",
        "/robots/lo-7",
        "/api/v1/robots?state=running&page=2&per_page=20",
        "/api/v1/robots/lo-33",
        "/robots?page=3&per_page=10",
        "/static/app.js",
    ];
    let port = web.port;
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    let path = paths[n % paths.len()];
                    n += 1;
                    match request(port, "GET", path, &[], b"") {
                        Some(r) if r.status == 200 => served.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(LOAD).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let elapsed = started.elapsed();
    let after = [metrics(&first), metrics(&second)];
    let served = served.load(Ordering::Relaxed);
    println!(
        "{CLIENTS} clients for {elapsed:?}: {served} answers ({:.0}/s), {} failed",
        served as f64 / elapsed.as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "every request answered 200"
    );
    assert!(served > 1000, "the dashboard kept answering: {served}");
    for (w, (b, a)) in [&first, &second]
        .iter()
        .zip(before.iter().zip(after.iter()))
    {
        assert_eq!(a.0, b.0, "{} self-fenced under the dashboard's load", w.id);
        assert_eq!(a.1, b.1, "{} lost a slot under the dashboard's load", w.id);
        let renewals = a.2 - b.2;
        let fast = a.3 - b.3;
        assert!(renewals >= 20, "{} renewed {renewals} times in 30 s", w.id);
        assert_eq!(
            fast,
            renewals,
            "{}: {} of {renewals} renewals took longer than 250 ms (the fence margin is 450 ms)",
            w.id,
            renewals - fast
        );
    }
    let held = db.held_per_worker().await;
    assert_eq!(held.get(&first.id), Some(&1));
    assert_eq!(held.get(&second.id), Some(&1));
}
