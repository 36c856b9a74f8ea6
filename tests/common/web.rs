//! `slotpool web` as a real process, plain HTTP against it, and a real headless
//! Chromium driven through chromedriver (Debian's `chromium` and `chromium-driver`,
//! installed by scripts/ensure-tools.sh).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, wait_for, BIN};

/// A token for tests (at least 32 characters).
pub const TOKEN: &str = "test-token-0123456789abcdef0123456789";

/// What a loading client asks the dashboard for, in turn (tests/web_load.rs and the
/// `webload` benchmark): pages, searches, a robot's page, the API and a static file,
/// over counters named `lo-N`.
pub const LOAD_PATHS: [&str; 8] = [
    "/",
    "/api/v1/overview",
    "/robots?q=lo-1&sort=seq&order=desc",
    "/robots/lo-7",
    "/api/v1/robots?state=running&page=2&per_page=20",
    "/api/v1/robots/lo-33",
    "/robots?page=3&per_page=10",
    "/static/app.js",
];

/// A real `slotpool web` process.
pub struct WebProc {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl WebProc {
    /// Starts it on a free port; `allow_actions` adds `--allow-actions` and the
    /// token. Waits until it answers.
    pub async fn start(uri: &str, dir: &Path, allow_actions: bool, extra: &[&str]) -> WebProc {
        let port = free_port();
        let log = dir.join(format!("web-{port}.log"));
        let file = File::create(&log).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", uri)
            .env("SLOTPOOL_LOG", "info,mongodb=warn")
            .args(["web", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        if allow_actions {
            cmd.arg("--allow-actions").env("SLOTPOOL_WEB_TOKEN", TOKEN);
        } else {
            cmd.env_remove("SLOTPOOL_WEB_TOKEN");
        }
        let web = WebProc {
            child: cmd.spawn().expect("spawn slotpool web"),
            port,
            log,
        };
        wait_for(
            Duration::from_secs(20),
            "slotpool web to answer",
            || async {
                web.get("/api/v1/slots")
                    .filter(|r| r.status == 200)
                    .map(|_| ())
            },
        )
        .await;
        web
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<Reply> {
        request(self.port, "GET", path, &[], b"")
    }

    /// GET and parse the body as JSON, insisting on `200`.
    pub fn json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path).expect("an answer");
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body))
    }

    /// The overview's JSON, once the robot table has been read.
    pub async fn overview_with_robots(&self) -> serde_json::Value {
        wait_for(Duration::from_secs(30), "the robot table", || async {
            let v = self.json("/api/v1/overview");
            (!v["robots_at_ms"].is_null()).then_some(v)
        })
        .await
    }
}

impl Drop for WebProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Lowercased names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<Reply> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<Vec<_>>();
    // Bodies of chunked answers carry chunk sizes; pages are sent whole, with a
    // length, so only JSON errors might be chunked: strip sizes conservatively.
    let body = if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some(Reply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A headless Chromium under chromedriver, with a fresh profile.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: Child,
    _profile: PathBuf,
}

impl Browser {
    pub async fn start(dir: &Path) -> Browser {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: run scripts/ensure-tools.sh (Debian's chromium and chromium-driver)"
            );
        }
        let port = free_port();
        let log = File::create(dir.join(format!("chromedriver-{port}.log"))).unwrap();
        use std::os::unix::process::CommandExt;
        // Its own process group, so Chromium's processes go with it.
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start chromedriver");
        let profile = dir.join(format!("chromium-profile-{port}"));
        std::fs::create_dir_all(&profile).unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--no-first-run",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = wait_for(Duration::from_secs(30), "chromedriver and Chromium", || {
            let caps = caps.clone();
            let url = url.clone();
            async move {
                fantoccini::ClientBuilder::new(
                    hyper_util::client::legacy::connect::HttpConnector::new(),
                )
                .capabilities(caps)
                .connect(&url)
                .await
                .ok()
            }
        })
        .await;
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// The text of the first element matching `css`, or None.
    pub async fn text(&self, css: &str) -> Option<String> {
        let e = self.client.find(fantoccini::Locator::Css(css)).await.ok()?;
        e.text().await.ok()
    }

    /// Types `text` into the first element matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let e = self.client.find(fantoccini::Locator::Css(css)).await;
        let e = e.unwrap_or_else(|err| panic!("{css}: {err}"));
        e.send_keys(text).await.unwrap();
    }

    /// Clicks the element matching `css`, once it is there.
    pub async fn click(&self, css: &str) {
        let e = self
            .client
            .wait()
            .for_element(fantoccini::Locator::Css(css))
            .await;
        e.unwrap_or_else(|err| panic!("{css}: {err}"))
            .click()
            .await
            .unwrap();
    }

    /// Waits until the element matching `css` has text for which `ok` holds.
    pub async fn wait_text(&self, css: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        wait_for(limit, &format!("{css} in the page"), || async {
            self.text(css).await.filter(|t| ok(t))
        })
        .await
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group we made for chromedriver.
        unsafe {
            libc::kill(-(self.driver.id() as i32), libc::SIGKILL);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
