//! A TCP proxy between one worker and the database that can pass, delay, blackhole
//! (hold every byte, connections stay open) or cut (close everything, refuse new)
//! its traffic. Loopback only.

use std::net::SocketAddr;
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
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel((Mode::Pass, Duration::ZERO));
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
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, rx.clone()));
                    tokio::spawn(pump(sr, cw, rx));
                });
            }
        });
        Proxy { addr, tx, task }
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

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut rx: watch::Receiver<(Mode, Duration)>,
) {
    let mut buf = vec![0u8; 64 * 1024];
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
        let (mode, delay) = *rx.borrow();
        match mode {
            Mode::Cut => return,
            Mode::Blackhole => continue, // swallowed
            Mode::Pass => {}
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
