//! `slotpool web` over plain HTTP: what it shows, that it is read-only unless told
//! otherwise, that actions need the token and are recorded, and that bad input gets
//! clear answers with nothing changed. The browser tests are in tests/browser.rs.

mod common;

use std::time::Duration;

use bson::doc;
use common::web::{request, WebProc, TOKEN};
use common::{wait_for, TestDb};

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn paused(db: &TestDb, name: &str) -> bool {
    db.robot(name).await.get_bool("paused").unwrap_or(false)
}

#[tokio::test]
async fn read_only_dashboard_shows_the_pool_and_refuses_every_write() {
    let db = TestDb::new("web_ro").await;
    db.init(3).await;
    let worker = db.worker(&[]);
    wait_for(
        Duration::from_secs(20),
        "the worker to hold every slot",
        || async { (db.held_per_worker().await.get(&worker.id) == Some(&3)).then_some(()) },
    )
    .await;
    db.cli_ok(&[
        "robot", "create", "--name", "ro", "--kind", "counter", "--count", "3",
    ]);
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;

    // Every slot, its holder and epoch; the worker; the summary.
    let v = web.overview_with_robots().await;
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 3);
    for s in slots {
        assert_eq!(s["holder"], worker.id.as_str(), "{s}");
        assert_eq!(s["state"], "held");
        assert!(s["epoch"].as_i64().unwrap() >= 1);
        assert!(s["lease_left_ms"].as_i64().unwrap() <= s["lease_ms"].as_i64().unwrap());
    }
    assert_eq!(v["summary"]["held"], 3);
    assert_eq!(v["summary"]["robots"], 3);
    assert_eq!(v["workers"][0]["id"], worker.id.as_str());
    let page = web.get("/").unwrap();
    assert_eq!(page.status, 200);
    for s in ["slot-001", "slot-002", "slot-003", &worker.id] {
        assert!(page.body.contains(s), "{s} on the overview");
    }
    assert!(
        page.body.contains("read-only") && !page.body.contains("<form"),
        "no buttons when read-only"
    );
    assert!(page
        .header("content-security-policy")
        .unwrap()
        .contains("script-src 'self'"));
    let robots = web.json("/api/v1/robots?q=ro-2");
    assert_eq!(robots["matching"], 1);
    assert_eq!(robots["robots"][0]["name"], "ro-2");

    // Every write is refused, with or without the token; nothing changes.
    let auth = bearer();
    let with_token = [("Authorization", auth.as_str())];
    for (method, path, headers) in [
        ("POST", "/api/v1/robots/ro-1/pause", &with_token[..]),
        ("POST", "/api/v1/robots/ro-1/pause", &[][..]),
        ("DELETE", "/api/v1/robots/ro-1", &with_token[..]),
        ("PUT", "/api/v1/robots/ro-1", &with_token[..]),
        ("POST", "/api/v1/robots", &with_token[..]),
        ("POST", "/robots/ro-1/update", &[][..]),
        ("POST", "/api/v1/slots/slot-001/drain", &with_token[..]),
        ("POST", "/api/v1/rebalance", &with_token[..]),
        ("POST", "/robots/ro-1/pause", &[][..]),
        ("POST", "/slots/slot-001/drain", &[][..]),
        ("POST", "/rebalance", &[][..]),
        ("POST", "/login", &[][..]),
        ("POST", "/logout", &[][..]),
    ] {
        let r = request(web.port, method, path, headers, b"").unwrap();
        assert_eq!(r.status, 403, "{method} {path}: {}", r.body);
    }
    for (method, path) in [
        ("POST", "/"),
        ("PATCH", "/api/v1/robots/ro-1"),
        ("POST", "/api/v1/overview"),
        ("PATCH", "/nowhere"),
    ] {
        let r = request(web.port, method, path, &[], b"").unwrap();
        assert_eq!(r.status, 405, "{method} {path}: {}", r.body);
    }
    assert_eq!(web.get("/login").unwrap().status, 403);
    assert!(!paused(&db, "ro-1").await);
    assert_ne!(
        db.slot("slot-001").await.get_bool("draining").ok(),
        Some(true)
    );
    assert!(web.log_text().contains("read-only"));
}

#[tokio::test]
async fn actions_need_the_token_and_are_recorded_with_who_and_where() {
    let db = TestDb::new("web_act").await;
    db.init(2).await;
    db.cli_ok(&[
        "robot", "create", "--name", "act", "--kind", "counter", "--count", "2",
    ]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    let post = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        request(port, "POST", path, headers, body).unwrap()
    };

    // No token, a wrong one, another scheme: 401, nothing changed.
    for h in [
        vec![],
        vec![(
            "Authorization",
            "Bearer wrong-token-wrong-token-wrong-token",
        )],
        vec![("Authorization", "Basic dGVzdDp0ZXN0")],
    ] {
        let r = post("/api/v1/robots/act-1/pause", &h, b"");
        assert_eq!(r.status, 401, "{h:?}: {}", r.body);
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    }
    assert!(!paused(&db, "act-1").await);

    let auth = bearer();
    let ok = [
        ("Authorization", auth.as_str()),
        ("X-Slotpool-Actor", "ada"),
    ];
    let r = post("/api/v1/robots/act-1/pause", &ok, b"");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(paused(&db, "act-1").await);
    let event = db
        .store
        .events()
        .find_one(doc! {"kind": "pause", "robot": "act-1"})
        .await
        .unwrap()
        .expect("the pause is in events");
    assert_eq!(event.get_str("by").unwrap(), "web");
    assert_eq!(event.get_str("actor").unwrap(), "ada");
    assert!(event.get_str("from").unwrap().starts_with("127.0.0.1:"));

    let r = post("/api/v1/robots/act-1/resume", &ok, b"");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!paused(&db, "act-1").await);

    // A move names its destination; a bad one is refused and changes nothing.
    let from = db
        .robot("act-1")
        .await
        .get_str("slot_id")
        .unwrap()
        .to_string();
    let to = if from == "slot-001" {
        "slot-002"
    } else {
        "slot-001"
    };
    for (body, status) in [
        (&b"{\"to\": \"slot-999\"}"[..], 404),
        (&b"{}"[..], 400),
        (&b"not json"[..], 400),
        (&b"[\"slot-002\"]"[..], 400),
        (&b"{\"to\": \"slot-002\", \"x\": 1}"[..], 400),
    ] {
        let r = post("/api/v1/robots/act-1/move", &ok, body);
        assert_eq!(
            r.status,
            status,
            "{}: {}",
            String::from_utf8_lossy(body),
            r.body
        );
    }
    assert_eq!(db.robot("act-1").await.get_str("slot_id").unwrap(), from);
    let r = post(
        "/api/v1/robots/act-1/move",
        &ok,
        format!("{{\"to\": \"{to}\"}}").as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(db.robot("act-1").await.get_str("slot_id").unwrap(), to);

    // Slots drain and undrain; unknown things are 404 with a reason.
    assert_eq!(post("/api/v1/slots/slot-002/drain", &ok, b"").status, 200);
    assert!(db.slot("slot-002").await.get_bool("draining").unwrap());
    assert_eq!(post("/api/v1/slots/slot-002/undrain", &ok, b"").status, 200);
    assert!(!db.slot("slot-002").await.get_bool("draining").unwrap());
    let r = post("/api/v1/slots/slot-404/drain", &ok, b"");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("no slot"), "{}", r.body);
    assert_eq!(post("/api/v1/robots/ghost/pause", &ok, b"").status, 404);
    assert_eq!(post("/api/v1/robots/act-1/explode", &ok, b"").status, 404);

    let r = request(port, "DELETE", "/api/v1/robots/act-2", &ok, b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(db
        .store
        .robots()
        .find_one(doc! {"name": "act-2"})
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        db.store
            .events()
            .count_documents(doc! {"by": "web"})
            .await
            .unwrap(),
        6,
        "pause, resume, move, drain, undrain, delete"
    );
}

/// Logs in as a browser would; returns the session cookie and the CSRF token.
fn login(port: u16) -> (String, String) {
    let body = format!("token={TOKEN}&who=grace");
    let r = request(
        port,
        "POST",
        "/login",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &format!("http://127.0.0.1:{port}")),
        ],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 303, "{}", r.body);
    let cookie = r.header("set-cookie").unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let cookie = cookie.split(';').next().unwrap().to_string();
    let page = request(port, "GET", "/", &[("Cookie", &cookie)], b"").unwrap();
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the page's forms")
        .to_string();
    (cookie, csrf)
}

#[tokio::test]
async fn browser_forms_need_the_session_its_csrf_token_and_this_origin() {
    let db = TestDb::new("web_csrf").await;
    db.init(1).await;
    db.cli_ok(&["robot", "create", "--name", "form", "--kind", "counter"]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let r = request(
        port,
        "POST",
        "/login",
        &form,
        b"token=wrong-token-wrong-token-wrong-token&who=x",
    )
    .unwrap();
    assert_eq!(r.status, 401);
    assert!(r.header("set-cookie").is_none());

    let (cookie, csrf) = login(port);
    let ours = format!("http://127.0.0.1:{port}");
    let send = |cookie: &str, origin: &str, body: &str| {
        request(
            port,
            "POST",
            "/robots/form/pause",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Cookie", cookie),
                ("Origin", origin),
            ],
            body.as_bytes(),
        )
        .unwrap()
    };
    // Forged: no CSRF token, a wrong one, another site's origin, no session.
    assert_eq!(send(&cookie, &ours, "").status, 403);
    assert_eq!(send(&cookie, &ours, "csrf=0000").status, 403);
    assert_eq!(
        send(&cookie, "http://evil.example", &format!("csrf={csrf}")).status,
        403
    );
    assert_eq!(
        send("slotpool_session=forged", &ours, &format!("csrf={csrf}")).status,
        401
    );
    // The API never takes the cookie.
    let r = request(
        port,
        "POST",
        "/api/v1/robots/form/pause",
        &[("Cookie", &cookie)],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 401);
    assert!(!paused(&db, "form").await);

    let r = send(&cookie, &ours, &format!("csrf={csrf}"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/robots/form"));
    assert!(paused(&db, "form").await);
    let event = db
        .store
        .events()
        .find_one(doc! {"kind": "pause", "robot": "form"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.get_str("actor").unwrap(), "grace");
}

#[tokio::test]
async fn bad_input_gets_clear_answers_and_hostile_text_stays_text() {
    let db = TestDb::new("web_bad").await;
    db.init(1).await;
    let hostile = "<script>alert('name')</script>";
    db.insert_exec_by_hand(hostile, doc! {"command": "/bin/true"})
        .await;
    let id = db.robot(hostile).await.get_object_id("_id").unwrap();
    db.store
        .robots()
        .update_one(
            doc! {"_id": id},
            doc! {"$set": {
                "context": {"note": "</pre><img src=x onerror=alert(1)>"},
                // What a shim reports, hand-edited: shown, and as text.
                "applied_limits": {"mechanism": "rlimit", "memory": 100_000_000_i64, "note": "<i>cgroups</i>"},
            }},
        )
        .await
        .unwrap();
    db.store
        .outputs()
        .insert_one(doc! {"_id": id, "gen": 1_i64, "lines": [
            {"n": 1_i64, "at": bson::DateTime::now(), "stream": "stdout\" onmouseover=\"x", "text": "<b>bold</b>"},
        ]})
        .await
        .unwrap();
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;
    web.overview_with_robots().await;

    // Escaped everywhere it shows.
    let encoded = "%3Cscript%3Ealert('name')%3C%2Fscript%3E";
    let page = web.get(&format!("/robots/{encoded}")).unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    for raw in ["<script>alert", "<img src=x", "<b>bold", "onmouseover=\"x"] {
        assert!(
            !page.body.contains(raw),
            "{raw} unescaped in the robot page"
        );
    }
    assert!(page
        .body
        .contains("&lt;script&gt;alert('name')&lt;/script&gt;"));
    assert!(page.body.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(page.body.contains("&lt;b&gt;bold&lt;/b&gt;"));
    assert!(
        page.body
            .contains("rlimit: memory 100.0 MB; &lt;i&gt;cgroups&lt;/i&gt;"),
        "the applied limits on the robot page"
    );
    let list = web.get("/robots").unwrap();
    assert!(!list.body.contains("<script>alert"));
    assert!(list.body.contains("&lt;script&gt;"));
    let api = web.json(&format!("/api/v1/robots/{encoded}"));
    assert_eq!(
        api["robot"]["name"], hostile,
        "JSON carries the name as data"
    );

    // Unknown robot: a 404 page (HTML) and a 404 JSON error.
    let r = web.get("/robots/nobody").unwrap();
    assert_eq!(r.status, 404);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(r.body.contains("There is no robot named"));
    let r = web.get("/api/v1/robots/nobody").unwrap();
    assert_eq!(r.status, 404);
    assert!(r.body.contains("no robot named"));
    assert_eq!(web.get("/no/such/page").unwrap().status, 404);
    assert_eq!(web.get("/api/v1/nothing").unwrap().status, 404);

    // Malformed query parameters: 400 that says what is accepted.
    for q in [
        "page=0",
        "page=abc",
        "per_page=100000",
        "state=dead",
        "sort=%24where",
        "order=sideways",
        "q=a&q=b",
        "page%5B%24gt%5D=1",
    ] {
        let r = web.get(&format!("/api/v1/robots?{q}")).unwrap();
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.body.contains("\"error\""), "{q}: {}", r.body);
        let page = web.get(&format!("/robots?{q}")).unwrap();
        assert_eq!(page.status, 400, "{q}");
        assert!(page.body.contains("Bad search"));
    }

    // Oversized: a request head past 8 KiB, a body past 16 KiB.
    let long = format!("/robots?q={}", "x".repeat(10 * 1024));
    let r = request(web.port, "GET", &long, &[], b"").unwrap();
    assert_eq!(r.status, 431);
    let big = vec![b'a'; 64 * 1024];
    let auth = bearer();
    let r = request(
        web.port,
        "POST",
        "/api/v1/robots/x/move",
        &[("Authorization", &auth)],
        &big,
    );
    // Read-only: refused before the body matters, or refused for its size.
    assert!(matches!(r.map(|r| r.status), Some(403) | Some(413) | None));

    // The dashboard is still well.
    assert_eq!(web.get("/api/v1/overview").unwrap().status, 200);
}

#[tokio::test]
async fn an_oversized_action_body_is_refused_and_nothing_changes() {
    let db = TestDb::new("web_big").await;
    db.init(2).await;
    db.cli_ok(&["robot", "create", "--name", "big", "--kind", "counter"]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let auth = bearer();
    let mut body = b"{\"to\": \"slot-002\", \"pad\": \"".to_vec();
    body.extend(std::iter::repeat_n(b'a', 64 * 1024));
    body.extend(b"\"}");
    let before = db
        .robot("big")
        .await
        .get_str("slot_id")
        .unwrap()
        .to_string();
    let r = request(
        web.port,
        "POST",
        "/api/v1/robots/big/move",
        &[("Authorization", &auth)],
        &body,
    );
    if let Some(r) = r {
        assert_eq!(r.status, 413, "{}", r.body);
    }
    assert_eq!(db.robot("big").await.get_str("slot_id").unwrap(), before);
    assert_eq!(web.get("/api/v1/overview").unwrap().status, 200);
}

#[tokio::test]
async fn the_dashboard_says_when_the_database_is_gone_and_recovers() {
    let server = common::PrivateServer::start("web_down");
    let db = TestDb::on(&server.uri, "web_down").await;
    db.init(2).await;
    let web = WebProc::start(&db.uri, &db.dir, false, &[]).await;
    assert!(web.json("/api/v1/overview")["error"].is_null());

    server.kill9();
    // Every answer still comes promptly, saying the refresh failed; the last
    // known slots stay on show.
    let v = wait_for(
        Duration::from_secs(60),
        "the refresh failure on show",
        || async {
            let t = std::time::Instant::now();
            let v = web.json("/api/v1/overview");
            assert!(
                t.elapsed() < Duration::from_secs(8),
                "an answer took {:?}",
                t.elapsed()
            );
            (!v["error"].is_null()).then_some(v)
        },
    )
    .await;
    assert_eq!(v["slots"].as_array().unwrap().len(), 2);
    let page = web.get("/").unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("The last refresh failed"));

    server.restart();
    wait_for(
        Duration::from_secs(90),
        "the dashboard to recover",
        || async {
            web.json("/api/v1/overview")["error"]
                .is_null()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn rebalance_through_the_api_evens_the_slots_and_is_recorded() {
    let db = TestDb::new("web_rebal").await;
    db.init(2).await;
    db.cli_ok(&[
        "robot", "create", "--name", "rb", "--kind", "counter", "--count", "4",
    ]);
    for i in 1..=4 {
        db.cli_ok(&["robot", "move", &format!("rb-{i}"), "--to", "slot-001"]);
    }
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let auth = bearer();
    let ok = [("Authorization", auth.as_str())];
    let post = |body: &[u8]| request(web.port, "POST", "/api/v1/rebalance", &ok, body).unwrap();

    assert_eq!(
        request(web.port, "POST", "/api/v1/rebalance", &[], b"")
            .unwrap()
            .status,
        401
    );
    let r = post(b"{\"max_moves\": 0}");
    assert_eq!(r.status, 400, "{}", r.body);
    let r = post(b"{\"moves\": 3}");
    assert_eq!(r.status, 400, "unknown fields are refused: {}", r.body);

    let dry: serde_json::Value = serde_json::from_str(&post(b"{\"dry_run\": true}").body).unwrap();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["moved"], 0);
    assert_eq!(dry["before"]["slot-001"], 4);
    assert_eq!(dry["after"]["slot-002"], 2);
    let on_one = || async {
        db.robots()
            .await
            .iter()
            .filter(|r| r.get_str("slot_id") == Ok("slot-001"))
            .count()
    };
    assert_eq!(on_one().await, 4, "a dry run moves nothing");

    let r = post(b"");
    assert_eq!(r.status, 200, "{}", r.body);
    let done: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(done["moved"], 2);
    assert_eq!(done["after"]["slot-001"], 2);
    assert_eq!(on_one().await, 2);
    let event = db
        .store
        .events()
        .find_one(doc! {"kind": "rebalance"})
        .await
        .unwrap()
        .expect("the rebalance is in events");
    assert_eq!(event.get_str("by").unwrap(), "web");
    assert_eq!(event.get_str("detail").unwrap(), "2 robot(s) moved");
}

#[tokio::test]
async fn binding_beyond_this_machine_warns_and_the_default_is_loopback() {
    let db = TestDb::new("web_bind").await;
    db.init(1).await;
    let help = std::process::Command::new(common::BIN)
        .args(["web", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: 127.0.0.1:8080]"), "{help}");
    let port = common::free_port();
    let log = db.dir.join("web-wide.log");
    let mut child = std::process::Command::new(common::BIN)
        .env("MONGODB_URI", &db.uri)
        .args(["web", "--listen", &format!("0.0.0.0:{port}")])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(db.dir.join("web-wide.err")).unwrap())
        .spawn()
        .unwrap();
    let text = wait_for(Duration::from_secs(20), "the warning", || async {
        let t = std::fs::read_to_string(db.dir.join("web-wide.err")).unwrap_or_default();
        t.contains("serving").then_some(t)
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains("WARN") && text.contains("everyone who can reach it can read the pool"),
        "{text}"
    );
}

/// One request with the `Host` header given; returns the status.
fn status_with_host(port: u16, host: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    raw.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_rebound_host_name_is_refused_and_token_guessing_is_throttled() {
    let db = TestDb::new("web_host").await;
    db.init(1).await;
    let web = WebProc::start(
        &db.uri,
        &db.dir,
        true,
        &["--allowed-host", "dash.example.com"],
    )
    .await;
    let port = web.port;
    // A page whose own name was rebound to this address reads nothing.
    for path in ["/api/v1/robots", "/api/v1/overview", "/"] {
        assert_eq!(
            status_with_host(port, &format!("attacker.example:{port}"), path),
            421,
            "{path}"
        );
    }
    assert_eq!(
        status_with_host(port, &format!("localhost:{port}"), "/api/v1/slots"),
        200
    );
    assert_eq!(
        status_with_host(port, "dash.example.com", "/api/v1/slots"),
        200
    );
    assert_eq!(
        status_with_host(port, &format!("127.0.0.1:{port}"), "/api/v1/slots"),
        200
    );

    // Wrong tokens: the first ten are told so, then the address waits, even with
    // the right token.
    let pause = |auth: &str| {
        request(
            port,
            "POST",
            "/api/v1/robots/none/pause",
            &[("Authorization", auth)],
            b"",
        )
        .unwrap()
    };
    for _ in 0..10 {
        assert_eq!(pause("Bearer wrong-token").status, 401);
    }
    let throttled = pause(&bearer());
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    assert_eq!(throttled.header("retry-after"), Some("60"));
}

/// `POST /api/v1/robots` creates as `robot create` does: with the token only, with
/// the CLI's checks (a bad spec, a bad name, bad JSON: `400` with the reason, nothing
/// written), placed on the least-loaded slots, idempotent with the names given, and
/// recorded with who asked. A running worker starts what it created.
#[tokio::test(flavor = "multi_thread")]
async fn robots_are_created_through_the_api_as_the_cli_creates_them() {
    let db = TestDb::new("web_create").await;
    db.init(2).await;
    let _w = db.worker(&[]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    let auth = bearer();
    let with_token = [
        ("Authorization", auth.as_str()),
        ("X-Slotpool-Actor", "grace"),
        ("Content-Type", "application/json"),
    ];
    let create = |headers: &[(&str, &str)], body: &str| {
        request(port, "POST", "/api/v1/robots", headers, body.as_bytes()).unwrap()
    };
    let good = r#"{"name": "api", "kind": "counter", "spec": {"interval_ms": 100, "history": 100}, "count": 4}"#;

    // No token: refused, nothing written.
    let r = create(&[("Content-Type", "application/json")], good);
    assert_eq!(r.status, 401, "{}", r.body);
    // Bad input: 400 with the reason, nothing written.
    for (body, says) in [
        ("{not json", "create takes a JSON body"),
        (
            r#"{"name": "x", "kind": "counter", "colour": 1}"#,
            "unknown field",
        ),
        (
            r#"{"name": "x", "kind": "counter", "spec": {"interval_ms": "fast"}}"#,
            "interval_ms",
        ),
        (
            r#"{"name": "x", "kind": "counter", "spec": {"restart": {"within": "soon"}}}"#,
            "spec.restart.within",
        ),
        (r#"{"name": "x\u001b[31m", "kind": "counter"}"#, "name"),
        (r#"{"name": "x", "kind": "teleport"}"#, "unknown robot kind"),
        (
            r#"{"name": "x", "kind": "counter", "count": 0}"#,
            "count must be between",
        ),
    ] {
        let r = create(&with_token, body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    assert!(db.robots().await.is_empty(), "nothing was written");

    let r = create(&with_token, good);
    assert_eq!(r.status, 201, "{}", r.body);
    let answer: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let created = answer["created"].as_array().unwrap();
    assert_eq!(created.len(), 4);
    let on = |slot: &str| created.iter().filter(|c| c["slot"] == slot).count();
    assert_eq!(
        (on("slot-001"), on("slot-002")),
        (2, 2),
        "spread: {}",
        r.body
    );
    // The same request again: nothing new; another spec under those names: 409.
    let again = create(&with_token, good);
    assert_eq!(again.status, 200, "{}", again.body);
    assert!(again.body.contains(r#""existing":4"#), "{}", again.body);
    let clash = create(
        &with_token,
        r#"{"name": "api", "kind": "counter", "spec": {"interval_ms": 200}, "count": 4}"#,
    );
    assert_eq!(clash.status, 409, "{}", clash.body);
    assert_eq!(db.robots().await.len(), 4);

    let recorded = db
        .store
        .events()
        .find_one(doc! {"kind": "create", "by": "web", "actor": "grace"})
        .await
        .unwrap();
    assert!(recorded.is_some(), "the create is in events with who asked");
    wait_for(
        Duration::from_secs(30),
        "the created robots running",
        || async {
            let robots = db.robots().await;
            robots
                .iter()
                .all(|r| r.get_i64("seq").unwrap_or(0) >= 2)
                .then_some(())
        },
    )
    .await;
    common::invariants::check(&db).await;
}

/// `PUT /api/v1/robots/NAME` and the robot page's form change a robot in place as
/// `robot update` does: the API with the token only (`401` without), the form with
/// its session's CSRF token only (`403` without); bad JSON and a spec `create` would
/// refuse get `400` with the reason, and nothing changes; the holder's refusal is a
/// `409` with its reason; an applied update is in `events` with who asked.
#[tokio::test(flavor = "multi_thread")]
async fn robots_are_updated_through_the_api_and_the_form() {
    let db = TestDb::new("web_update").await;
    db.init(1).await;
    assert!(db.counters("u", 1, 100).status.success());
    let _w = db.worker(&[]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    wait_for(Duration::from_secs(30), "the counter running", || async {
        (db.robot("u").await.get_i64("seq").unwrap_or(0) >= 2).then_some(())
    })
    .await;
    let auth = bearer();
    let put = |headers: &[(&str, &str)], body: &str| {
        request(port, "PUT", "/api/v1/robots/u", headers, body.as_bytes()).unwrap()
    };
    let with_token = [
        ("Authorization", auth.as_str()),
        ("X-Slotpool-Actor", "ada"),
        ("Content-Type", "application/json"),
    ];
    let faster = r#"{"spec": {"interval_ms": 60, "history": 1000}}"#;
    assert_eq!(
        put(&[("Content-Type", "application/json")], faster).status,
        401
    );
    for (body, says) in [
        ("{oops", "update takes a JSON body"),
        (r#"{"spec": {"interval_ms": "fast"}}"#, "interval_ms"),
        (r#"{"spec": {}, "colour": 1}"#, "unknown field"),
    ] {
        let r = put(&with_token, body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    // A kind whose command this worker may not run: its holder refuses.
    let r = put(
        &with_token,
        r#"{"kind": "exec", "spec": {"command": "/bin/sh"}}"#,
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("nothing changed"), "{}", r.body);
    let u = db.robot("u").await;
    assert_eq!(u.get_str("kind"), Ok("counter"));
    assert_eq!(
        u.get_document("spec").unwrap().get_i64("interval_ms"),
        Ok(100)
    );

    let gen = u.get_i64("gen").unwrap();
    let r = put(&with_token, faster);
    assert_eq!(r.status, 200, "{}", r.body);
    let answer: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(answer["applied"], true, "{}", r.body);
    assert!(answer["changes"][0]
        .as_str()
        .unwrap()
        .contains("interval_ms"));
    wait_for(Duration::from_secs(30), "the new instance", || async {
        (db.robot("u").await.get_i64("gen").unwrap() > gen).then_some(())
    })
    .await;
    let asked = db
        .store
        .events()
        .find_one(doc! {"kind": "update", "robot": "u", "by": "web", "actor": "ada"})
        .await
        .unwrap();
    assert!(asked.is_some());

    // The form: refused without its CSRF token, applied with it.
    let (cookie, csrf) = login(port);
    let ours = format!("http://127.0.0.1:{port}");
    let send = |body: String| {
        request(
            port,
            "POST",
            "/robots/u/update",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Cookie", &cookie),
                ("Origin", &ours),
            ],
            body.as_bytes(),
        )
        .unwrap()
    };
    let spec = "spec=%7B%22interval_ms%22%3A+80%2C+%22history%22%3A+1000%7D";
    assert_eq!(send(spec.to_string()).status, 403, "no CSRF token");
    assert_eq!(
        db.robot("u")
            .await
            .get_document("spec")
            .unwrap()
            .get_i64("interval_ms"),
        Ok(60)
    );
    let r = send(format!("{spec}&csrf={csrf}"));
    assert_eq!(r.status, 303, "{}", r.body);
    wait_for(
        Duration::from_secs(30),
        "the form's update applied",
        || async {
            let u = db.robot("u").await;
            (u.get_document("spec").ok()?.get_i64("interval_ms").ok()? == 80).then_some(())
        },
    )
    .await;
    let page = request(port, "GET", "/robots/u", &[("Cookie", &cookie)], b"").unwrap();
    assert!(page.body.contains("update-state"), "{}", page.body);
    common::invariants::check(&db).await;
}

/// One request from the loopback address `from` (any of 127.0.0.0/8): its status.
async fn status_from(
    port: u16,
    from: std::net::Ipv4Addr,
    method: &str,
    path: &str,
    auth: &str,
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let mut s = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {auth}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// One wrong token from each of 10,500 addresses filled the throttle's table, and
/// then the right token from an address that had never failed got `429`, "too many
/// wrong tokens from this address": no token was needed to lock every operator
/// out. Now only an address's own failures throttle it.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_wrong_tokens_from_many_addresses_locks_no_one_else_out() {
    let db = TestDb::new("web_flood").await;
    db.init(1).await;
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    let addr = |i: u32| std::net::Ipv4Addr::from(0x7f01_0000 + i);
    let total = slotpool::web::auth::MAX_TRACKED as u32 + 500;
    let mut refused = 0;
    for batch in (0..total).collect::<Vec<_>>().chunks(16) {
        let answers = futures::future::join_all(batch.iter().map(|i| {
            status_from(
                port,
                addr(*i),
                "POST",
                "/api/v1/rebalance",
                "Bearer wrong-token",
            )
        }))
        .await;
        refused += answers.iter().filter(|s| **s == 401).count();
    }
    assert_eq!(refused, total as usize, "every wrong token is told so");
    let fresh = std::net::Ipv4Addr::new(127, 9, 9, 9);
    let right = status_from(port, fresh, "POST", "/api/v1/rebalance", &bearer()).await;
    assert_eq!(right, 200, "an address that never failed is not throttled");
    // One address's own failures still throttle it.
    let guesser = std::net::Ipv4Addr::new(127, 8, 8, 8);
    for _ in 0..slotpool::web::auth::MAX_FAILURES {
        assert_eq!(
            status_from(port, guesser, "POST", "/api/v1/rebalance", "Bearer wrong").await,
            401
        );
    }
    assert_eq!(
        status_from(port, guesser, "POST", "/api/v1/rebalance", &bearer()).await,
        429
    );
}

/// Connections that send a write's head and then its body a byte a second, held
/// open by the test. Returns them (dropping them closes them).
fn slow_writers(port: u16, n: usize, auth: Option<&str>) -> Vec<std::net::TcpStream> {
    use std::io::Write;
    (0..n)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            write!(
                s,
                "POST /api/v1/rebalance HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
            )
            .unwrap();
            s
        })
        .collect()
}

/// 64 connections each sending a `POST` head and then a byte a second took every
/// connection, and the dashboard answered 0 of 12 reads, even with actions off. A
/// write the head can refuse is refused before its body; at most 12 authenticated
/// bodies (and 4 of logins) are received at once, each within 5 s; reads and
/// probes stay answered.
#[tokio::test(flavor = "multi_thread")]
async fn slow_write_bodies_cannot_starve_reads() {
    use std::io::Read;
    let db = TestDb::new("web_slow").await;
    db.init(1).await;
    for actions in [false, true] {
        let web = WebProc::start(&db.uri, &db.dir, actions, &[]).await;
        let token = bearer();
        // With actions on, the writers hold the token: the worst case.
        let mut writers = slow_writers(web.port, 64, actions.then_some(token.as_str()));
        let drip = std::thread::spawn({
            let mut writers: Vec<_> = writers.iter().map(|s| s.try_clone().unwrap()).collect();
            move || {
                use std::io::Write;
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_millis(300));
                    for w in &mut writers {
                        let _ = w.write_all(b" ");
                    }
                }
            }
        });
        let mut answered = 0;
        for _ in 0..12 {
            if web.get("/api/v1/slots").is_some_and(|r| r.status == 200) {
                answered += 1;
            }
        }
        assert_eq!(
            answered, 12,
            "reads answered under slow writers (actions: {actions})"
        );
        assert_eq!(web.get("/api/v1/overview").map(|r| r.status), Some(200));
        drip.join().unwrap();
        // What the writers were told.
        let mut told = std::collections::BTreeMap::new();
        for w in &mut writers {
            w.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            let mut out = vec![0; 64];
            let n = w.read(&mut out).unwrap_or(0);
            let code: u16 = String::from_utf8_lossy(&out[..n])
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            *told.entry(code).or_insert(0) += 1;
        }
        // A writer whose head the server had not read yet when a read came is idle,
        // and the read may evict it (closed, told nothing: 0).
        let count = |code: u16| told.get(&code).copied().unwrap_or(0);
        if actions {
            assert_eq!(
                count(408),
                12,
                "12 bodies waited for, then timed out: {told:?}"
            );
            assert_eq!(
                count(503) + count(0),
                52,
                "the rest refused at once: {told:?}"
            );
        } else {
            assert_eq!(count(403) + count(0), 64, "refused from the head: {told:?}");
        }
        assert!(count(0) <= 12, "at most one evicted per read: {told:?}");
    }
}

/// A scheduled robot through the API and the pages: `POST /api/v1/robots` takes a
/// schedule (a bad one is a `400` with the reason, nothing written);
/// `POST /api/v1/robots/NAME/trigger` runs it once more now with the token only,
/// recorded with who asked; a daemon is refused with the reason; the robot's page
/// shows its schedule, next firing and runs; the list filters `only=scheduled` and
/// `only=late`.
#[tokio::test(flavor = "multi_thread")]
async fn scheduled_robots_through_the_api_and_the_pages() {
    let db = TestDb::new("web_sched").await;
    db.init(1).await;
    let _w = db.worker(&[]);
    let web = WebProc::start(&db.uri, &db.dir, true, &[]).await;
    let port = web.port;
    let auth = bearer();
    let with_token = [
        ("Authorization", auth.as_str()),
        ("X-Slotpool-Actor", "ada"),
        ("Content-Type", "application/json"),
    ];
    let post =
        |path: &str, body: &str| request(port, "POST", path, &with_token, body.as_bytes()).unwrap();
    for (body, says) in [
        (
            r#"{"name": "s", "kind": "counter", "spec": {"schedule": {"cron": "0 3 * * *", "timezone": "Mars/Base"}}}"#,
            "not a known IANA zone",
        ),
        (
            r#"{"name": "s", "kind": "counter", "spec": {"schedule": {"cron": "every day"}}}"#,
            "is not a cron pattern",
        ),
        (
            r#"{"name": "s", "kind": "counter", "spec": {"schedule": {"every": "1h", "catchup": "30d"}}}"#,
            "spec.schedule.catchup must be between",
        ),
    ] {
        let r = post("/api/v1/robots", body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body.contains(says), "{body}: {}", r.body);
    }
    assert!(db.robots().await.is_empty(), "nothing was written");
    let r = post(
        "/api/v1/robots",
        r#"{"name": "nightly", "kind": "counter", "spec": {"schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}}}"#,
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = post("/api/v1/robots", r#"{"name": "daemon", "kind": "counter"}"#);
    assert_eq!(r.status, 201, "{}", r.body);

    let refused = post("/api/v1/robots/daemon/trigger", "");
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body.contains("has no spec.schedule"),
        "{}",
        refused.body
    );
    let no_token = request(port, "POST", "/api/v1/robots/nightly/trigger", &[], b"").unwrap();
    assert_eq!(no_token.status, 401);
    let r = post("/api/v1/robots/nightly/trigger", "");
    assert!(
        r.status == 200 || r.status == 202,
        "{}: {}",
        r.status,
        r.body
    );
    let robot = wait_for(Duration::from_secs(30), "the run now", || async {
        let r = db.robot("nightly").await;
        let ran = r
            .get_array("runs")
            .ok()
            .and_then(|a| a.first().cloned())
            .and_then(|x| x.as_document().cloned())
            .filter(|x| x.get_str("outcome") == Ok("succeeded"));
        ran.map(|x| (r, x))
    })
    .await;
    assert_eq!(robot.1.get_str("by"), Ok("web:ada"), "{}", robot.1);
    let recorded = db
        .store
        .events()
        .find_one(doc! {"kind": "trigger", "by": "web", "actor": "ada", "robot": "nightly"})
        .await
        .unwrap();
    assert!(
        recorded.is_some(),
        "the request is in events with who asked"
    );

    let page = request(port, "GET", "/robots/nightly", &[], b"").unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("0 3 * * * (Europe/Berlin)"),
        "{}",
        page.body
    );
    assert!(page.body.contains(r#"id="next-firing""#), "{}", page.body);
    assert!(
        page.body.contains(r#"data-outcome="succeeded""#),
        "{}",
        page.body
    );
    let daemon_page = request(port, "GET", "/robots/daemon", &[], b"").unwrap();
    assert!(!daemon_page.body.contains(r#"id="runs""#));

    wait_for(Duration::from_secs(30), "the list to read both", || async {
        let list = request(port, "GET", "/robots?only=scheduled", &[], b"").unwrap();
        (list.body.contains("data-robot=\"nightly\"")
            && !list.body.contains("data-robot=\"daemon\""))
        .then_some(())
    })
    .await;
    // The overview's timeline marks the robot's latest firing.
    wait_for(
        Duration::from_secs(30),
        "the firing on the timeline",
        || async {
            let page = request(port, "GET", "/", &[], b"").unwrap();
            page.body.contains(r#"class="lane firings""#).then_some(())
        },
    )
    .await;
    let bad = request(port, "GET", "/robots?only=soon", &[], b"").unwrap();
    assert_eq!(bad.status, 400);
    assert!(bad
        .body
        .contains("only must be one of scheduled, completed, late"));
    let late = request(port, "GET", "/api/v1/robots", &[], b"").unwrap();
    assert!(
        late.body
            .contains(r#""schedule":"0 3 * * * (Europe/Berlin)""#),
        "{}",
        late.body
    );
}
