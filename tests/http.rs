//! The worker's own HTTP port: `/healthz`, `/metrics` and `/status` are real, answer
//! what the worker knows, and refuse every write.

mod common;

use std::time::Duration;

use common::proxy::{Mode, Proxy};
use common::{owner, TestDb};

#[tokio::test(flavor = "multi_thread")]
async fn http_healthz_metrics_status_are_real_and_read_only() {
    let db = TestDb::new("http").await;
    db.init(1).await;
    let proxy = Proxy::start(common::uri_addr(&db.uri)).await;
    let w = db.worker_via(&proxy, &[]);
    common::wait_for(Duration::from_secs(15), "the slot to be held", || async {
        (owner(&db.slot("slot-001").await)? == w.id).then_some(())
    })
    .await;
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "h",
        "--kind",
        "counter",
        "--interval-ms",
        "100",
    ]);
    common::wait_for(Duration::from_secs(10), "a checkpoint", || async {
        (db.robot("h").await.get_i64("seq").ok()? > 2).then_some(())
    })
    .await;

    let (code, body) = w.http_get("/healthz").unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, metrics) = w.http_get("/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "slotpool_slot_held 1",
        "slotpool_epoch 1",
        "slotpool_claims_total 1",
        "slotpool_robots_running 1",
        "slotpool_self_fences_total 0",
        "slotpool_fenced_writes_total 0",
        "# TYPE slotpool_renew_latency_seconds histogram",
        "slotpool_renew_latency_seconds_bucket{le=\"+Inf\"}",
        "slotpool_lease_age_seconds",
        "slotpool_losses_total 0",
        "slotpool_robots_restarting 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in:\n{metrics}");
    }
    let checkpoints: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("slotpool_checkpoints_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(checkpoints >= 2);
    let (code, status) = w.http_get("/status").unwrap();
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["role"], "holder");
    assert_eq!(v["slot_id"], "slot-001");
    assert_eq!(v["worker"], w.id.as_str());
    assert_eq!(v["robots_running"], 1);
    assert_eq!(w.http_get("/nope").unwrap().0, 404);
    // Read-only: anything but GET/HEAD is refused.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("allow: get, head"),
        "{reply}"
    );
    // The one POST: a poke, which only asks for a survey; it takes no GET.
    let send = |request: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    let reply =
        send("POST /v1/poke HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 202"), "{reply}");
    let reply = send("GET /v1/poke HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("allow: post"),
        "{reply}"
    );
    // Kept alive: a second request on the same connection is answered too.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut first = Vec::new();
    while !first.ends_with(b"\r\n\r\nok\n") {
        let mut chunk = [0u8; 512];
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "closed after one request: {:?}",
            String::from_utf8_lossy(&first)
        );
        first.extend_from_slice(&chunk[..n]);
    }
    assert!(first.starts_with(b"HTTP/1.1 200"));
    write!(
        s,
        "HEAD /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut second = String::new();
    s.read_to_string(&mut second).unwrap();
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(!second.contains("\"worker\""), "HEAD has no body: {second}");
    // A request head over 8 KiB is refused, and the worker serves on.
    // The worker may answer and close before the client has written the whole
    // head: then the write fails (EPIPE) or the answer is lost to the reset. Either
    // way it was refused; it must never be served.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).unwrap();
    let big = "a".repeat(9000);
    let _ = write!(s, "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 431") || reply.is_empty(),
        "an oversized head is refused: {reply}"
    );
    assert_eq!(w.http_get("/healthz").unwrap().0, 200);
    assert_eq!(w.http_get("/livez").unwrap(), (200, "ok\n".to_string()));

    // Cut the database off: /healthz says so, the worker fences itself (its robots
    // suspended), and when the database is back within --suspend-for it resumes in
    // place: the same slot under the same epoch.
    proxy.set(Mode::Blackhole);
    common::wait_for(Duration::from_secs(20), "healthz 503", || async {
        (w.http_get("/healthz")?.0 == 503).then_some(())
    })
    .await;
    common::wait_for(Duration::from_secs(10), "a self-fence", || async {
        let m = w.http_get("/metrics")?.1;
        m.contains("slotpool_self_fences_total 1").then_some(())
    })
    .await;
    // The loop goes on without the database: /livez, the liveness probe's
    // question, stays 200, so an outage never has every worker restarted; and the
    // loop keeps finishing rounds, watched for 22 s of the outage: its age stays
    // under 20 s (a pause of at most a heartbeat period, 5 T, then a round whose
    // database calls each give up after 2 s), where /livez would call 30 s a hang.
    let until = std::time::Instant::now() + Duration::from_secs(22);
    let mut oldest = 0;
    while std::time::Instant::now() < until {
        let (code, body) = w.http_get("/livez").unwrap();
        assert_eq!(
            (code, body.as_str()),
            (200, "ok\n"),
            "/livez during the outage"
        );
        let status: serde_json::Value =
            serde_json::from_str(&w.http_get("/status").unwrap().1).unwrap();
        oldest = oldest.max(status["loop_age_ms"].as_u64().expect("loop_age_ms"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        oldest < 20_000,
        "the loop went {oldest} ms without a round during the outage"
    );
    proxy.set(Mode::Pass);
    common::wait_for(
        Duration::from_secs(30),
        "healthz 200 again and the slot kept",
        || async {
            let healthy = w.http_get("/healthz")?.0 == 200;
            let held = owner(&db.slot("slot-001").await)? == w.id
                && db.slot("slot-001").await.get_i64("epoch").ok()? == 1;
            (healthy && held).then_some(())
        },
    )
    .await;
}
