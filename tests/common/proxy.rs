//! A TCP proxy between one worker and the database that can pass, delay, blackhole
//! (hold every byte, connections stay open) or cut (close everything, refuse new)
//! its traffic, strand the connections open at a moment (their bytes held for good,
//! new ones passing), drop the answer to one request it passed, and counts the
//! requests it passes by command. Loopback only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    Cut,
}

pub struct Proxy {
    pub addr: SocketAddr,
    tx: watch::Sender<(Mode, Duration)>,
    task: tokio::task::JoinHandle<()>,
    tally: Tally,
    /// Pumps still moving bytes, two per connection.
    pumps: Arc<AtomicUsize>,
    /// Connections are numbered as accepted; those numbered below this are stranded.
    stranded: Stranded,
    answers: DropAnswer,
}

/// The request whose answer is to be dropped (see [`Proxy::drop_answer_to_next`]),
/// and how many were.
#[derive(Clone, Default)]
struct DropAnswer {
    next: Arc<Mutex<Option<String>>>,
    dropped: Arc<AtomicU64>,
}

/// The connections numbered below the count are stranded (see [`Proxy::strand_open`]).
#[derive(Clone, Default)]
struct Stranded {
    accepted: Arc<AtomicU64>,
    below: Arc<AtomicU64>,
}

impl Stranded {
    fn is(&self, connection: u64) -> bool {
        connection < self.below.load(Ordering::SeqCst)
    }
}

/// Counts a pump as running until it ends.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn new(pumps: &Arc<AtomicUsize>) -> Running {
        pumps.fetch_add(1, Ordering::SeqCst);
        Running(pumps.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Requests passed to the server, by what they asked: `"update workers"`, `"hello"`.
#[derive(Debug, Clone, Default)]
pub struct Tally(Arc<Mutex<BTreeMap<String, u64>>>, Concerns);

/// The write concerns requests carried, by request (see [`Tally::write_concerns`]).
#[derive(Debug, Clone, Default)]
struct Concerns(Arc<Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>>);

impl Tally {
    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap().clone()
    }

    /// What was asked since `before` (a snapshot), leaving out what was not.
    pub fn since(&self, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        self.snapshot()
            .into_iter()
            .map(|(k, n)| {
                let was = before.get(&k).copied().unwrap_or(0);
                (k, n - was)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn count(&self, what: String) {
        *self.0.lock().unwrap().entry(what).or_default() += 1;
    }

    /// Every write concern each request carried, as relaxed extended JSON
    /// (`{"w":"majority","j":true}`), or `none` for a request without one.
    pub fn write_concerns(&self) -> BTreeMap<String, std::collections::BTreeSet<String>> {
        self.1 .0.lock().unwrap().clone()
    }

    fn concern(&self, what: &str, concern: Option<&bson::Document>) {
        let shown = concern.map_or_else(
            || "none".to_string(),
            |c| {
                bson::Bson::Document(c.clone())
                    .into_relaxed_extjson()
                    .to_string()
            },
        );
        self.1
             .0
            .lock()
            .unwrap()
            .entry(what.to_string())
            .or_default()
            .insert(shown);
    }
}

/// The command document of one request, from the wire: OP_MSG (every command of a
/// current driver) and OP_QUERY (the legacy handshake).
fn command_of(frame: &[u8]) -> Option<bson::Document> {
    const OP_QUERY: i32 = 2004;
    const OP_MSG: i32 = 2013;
    let op = i32::from_le_bytes(frame.get(12..16)?.try_into().ok()?);
    let body = match op {
        // flagBits, then the sections: kind 0 is the command itself.
        OP_MSG => {
            let mut at = 20;
            loop {
                let kind = *frame.get(at)?;
                let len = i32::from_le_bytes(frame.get(at + 1..at + 5)?.try_into().ok()?);
                if kind == 0 {
                    break frame.get(at + 1..at + 1 + len as usize)?;
                }
                at += 1 + len as usize;
            }
        }
        // flags, the full collection name, skip, return: then the query.
        OP_QUERY => {
            let name_end = 20 + frame.get(20..)?.iter().position(|b| *b == 0)?;
            frame.get(name_end + 9..)?
        }
        _ => return None,
    };
    bson::Document::from_reader(body).ok()
}

/// What one request asks, from the wire: its command and the collection it names
/// (`"find slots"`, `"hello"`). OP_MSG (every command of a current driver) and
/// OP_QUERY (an old handshake); None for anything else or a broken frame.
pub fn request_of(frame: &[u8]) -> Option<String> {
    let doc = command_of(frame)?;
    let (command, arg) = doc.iter().next()?;
    let collection = match (command.as_str(), arg) {
        ("getMore", _) => doc.get_str("collection").ok(),
        (_, bson::Bson::String(c)) => Some(c.as_str()),
        _ => None,
    };
    // A connection's first request names the client's pool (`appname`).
    let app = doc
        .get_document("client")
        .and_then(|c| c.get_document("application"))
        .and_then(|a| a.get_str("name"))
        .ok();
    Some(match (collection, app) {
        (Some(c), _) => format!("{command} {c}"),
        (None, Some(app)) => format!("{command} (handshake, {app})"),
        (None, None) => command.clone(),
    })
}

/// Cuts the client's byte stream into frames and counts each request.
#[derive(Default)]
struct Frames {
    pending: Vec<u8>,
}

impl Frames {
    /// Counts the requests `bytes` completes, and returns what they asked.
    fn feed(&mut self, bytes: &[u8], tally: &Tally) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut asked = Vec::new();
        loop {
            let Some(len) = self.pending.get(..4) else {
                return asked;
            };
            let len = i32::from_le_bytes(len.try_into().unwrap()).max(16) as usize;
            if self.pending.len() < len {
                return asked;
            }
            let frame: Vec<u8> = self.pending.drain(..len).collect();
            let what = request_of(&frame).unwrap_or_else(|| "(unparsed)".into());
            tally.count(what.clone());
            if let Some(command) = command_of(&frame) {
                tally.concern(&what, command.get_document("writeConcern").ok());
            }
            asked.push(what);
        }
    }
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel((Mode::Pass, Duration::ZERO));
        let tally = Tally::default();
        let counted = tally.clone();
        let pumps = Arc::new(AtomicUsize::new(0));
        let running = pumps.clone();
        let stranded = Stranded::default();
        let numbered = stranded.clone();
        let answers = DropAnswer::default();
        let dropping = answers.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if rx.borrow().0 == Mode::Cut {
                    drop(client);
                    continue;
                }
                let rx = rx.clone();
                let counted = counted.clone();
                let running = running.clone();
                let stranded = numbered.clone();
                let answers = dropping.clone();
                let n = stranded.accepted.fetch_add(1, Ordering::SeqCst);
                counted.count("(connection)".into());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    // As the driver and the server do: a message written in two
                    // pieces must not wait for the peer's delayed acknowledgement.
                    let _ = server.set_nodelay(true);
                    let _ = client.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let (up, down) = (Running::new(&running), Running::new(&running));
                    let severed = Arc::new(AtomicBool::new(false));
                    let up_link = Link {
                        n,
                        stranded: stranded.clone(),
                        tally: Some(counted),
                        answers: Some(answers),
                        severed: severed.clone(),
                    };
                    let down_link = Link {
                        n,
                        stranded,
                        tally: None,
                        answers: None,
                        severed,
                    };
                    tokio::spawn(pump(cr, sw, rx.clone(), up_link, up));
                    tokio::spawn(pump(sr, cw, rx, down_link, down));
                });
            }
        });
        Proxy {
            addr,
            tx,
            task,
            tally,
            pumps,
            stranded,
            answers,
        }
    }

    /// The next request asking `what` (as [`request_of`] names it: `"update
    /// robots"`) reaches the server, and its connection is closed before the answer
    /// comes back: a write that landed, which its client sees fail on the network.
    pub fn drop_answer_to_next(&self, what: &str) {
        *self.answers.next.lock().unwrap() = Some(what.to_string());
    }

    /// How many answers were dropped so far (see [`Proxy::drop_answer_to_next`]).
    pub fn answers_dropped(&self) -> u64 {
        self.answers.dropped.load(Ordering::SeqCst)
    }

    /// Strands every connection open now: whatever either end sends on one is held
    /// for good, and nothing on it is answered or refused, as on a connection whose
    /// packets go nowhere (a client reconnected under a new address, a NAT that lost
    /// its state, a blackholed route). Connections opened from now on pass as the
    /// mode says.
    pub fn strand_open(&self) {
        let open = self.stranded.accepted.load(Ordering::SeqCst);
        self.stranded.below.store(open, Ordering::SeqCst);
    }

    /// True while any connection through the proxy still moves bytes.
    pub fn carrying(&self) -> bool {
        self.pumps.load(Ordering::SeqCst) > 0
    }

    /// The requests passed so far, by command (see [`request_of`]).
    pub fn tally(&self) -> Tally {
        self.tally.clone()
    }

    pub fn set(&self, mode: Mode) {
        self.tx.send_modify(|m| m.0 = mode);
    }

    pub fn delay(&self, d: Duration) {
        self.tx.send_modify(|m| m.1 = d);
    }

    /// `uri` with its host:port replaced by this proxy's, and a direct connection
    /// forced: without `directConnection=true` the driver would discover the
    /// replica set's members from the server and connect to them directly,
    /// around the proxy. Credentials and other options are kept; `replicaSet` is
    /// dropped, as it would contradict the direct connection.
    pub fn uri(&self, uri: &str) -> String {
        let (scheme, rest) = uri.split_once("://").unwrap();
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((u, r)) => (format!("{u}@"), r),
            None => (String::new(), rest),
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let tail = &rest[end..];
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let mut options: Vec<&str> = query
            .split('&')
            .filter(|o| {
                let key = o.split('=').next().unwrap_or("").to_ascii_lowercase();
                !o.is_empty() && key != "directconnection" && key != "replicaset"
            })
            .collect();
        options.push("directConnection=true");
        let path = if path.is_empty() { "/" } else { path };
        format!(
            "{scheme}://{userinfo}{}{path}?{}",
            self.addr,
            options.join("&")
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Mode::Cut);
        self.task.abort();
    }
}

/// One direction of a connection, as a pump sees it.
struct Link {
    /// The connection's number, in the order accepted.
    n: u64,
    stranded: Stranded,
    /// Counts the requests (the client's direction only).
    tally: Option<Tally>,
    /// The answer to drop (the client's direction only).
    answers: Option<DropAnswer>,
    /// Set when the connection's next answer is to be dropped: the server's
    /// direction then closes instead of passing it.
    severed: Arc<AtomicBool>,
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut rx: watch::Receiver<(Mode, Duration)>,
    link: Link,
    _running: Running,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut frames = Frames::default();
    let tally = link.tally.clone();
    loop {
        // Hold while blackholed; end on cut.
        loop {
            let mode = rx.borrow().0;
            match mode {
                Mode::Pass => break,
                Mode::Cut => return,
                Mode::Blackhole => {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = rx.changed() => {
                if changed.is_err() { return; }
                continue;
            }
        };
        if link.stranded.is(link.n) {
            // Held for good: the connection stays open until the proxy cuts it.
            while rx.borrow().0 != Mode::Cut {
                if rx.changed().await.is_err() {
                    return;
                }
            }
            return;
        }
        let (mode, delay) = *rx.borrow();
        match mode {
            Mode::Cut => return,
            Mode::Blackhole => continue, // swallowed
            Mode::Pass => {}
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if link.severed.load(Ordering::SeqCst) {
            if link.answers.is_some() {
                // The client's direction stays open, and passes nothing more: the
                // server must not see the connection end before it has answered.
                continue;
            }
            // The answer: the client's connection closes instead.
            return;
        }
        let mut sever = false;
        if let Some(t) = &tally {
            let asked = frames.feed(&buf[..n], t);
            if let Some(answers) = &link.answers {
                let mut next = answers.next.lock().unwrap();
                if next.as_ref().is_some_and(|w| asked.contains(w)) {
                    *next = None;
                    // Before the request goes: its answer cannot come back sooner.
                    link.severed.store(true, Ordering::SeqCst);
                    sever = true;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if sever {
            if let Some(answers) = &link.answers {
                answers.dropped.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}
