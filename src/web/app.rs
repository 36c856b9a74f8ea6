//! What every handler of `slotpool web` shares: the [`App`] (the store, the shared
//! snapshot, the token), robot pages' reads, cached for a refresh interval and
//! bounded, and the actor a web action is recorded as.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bson::Document;
use tokio::sync::{watch, Semaphore};

use super::auth::{self, Auth};
use super::snapshot::{Demand, Snapshot};
use crate::db::robot_doc::RobotDoc;
use crate::db::store::Store;
use crate::pool::actions::Actor;

/// Robot pages read by name at once, at most; more wait.
const DETAIL_READS: usize = 2;

/// Robot pages remembered (each for one refresh interval).
const DETAIL_CACHE: usize = 256;

/// Runs an action that writes to its end, whatever becomes of the request: axum
/// drops a handler's future when its client hangs up, and a move dropped between
/// its writes would strand its robot. Spawned, the action finishes; the handler only
/// waits for its answer.
///
/// Tracked, so that a dashboard asked to stop lets the actions in flight finish first
/// (see [`in_flight`]).
pub(crate) async fn to_the_end<T: Send + 'static>(
    action: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match in_flight().spawn(action).await {
        Ok(done) => done,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The actions started by [`to_the_end`] and not finished yet.
pub(crate) fn in_flight() -> &'static tokio_util::task::TaskTracker {
    static TRACKER: std::sync::OnceLock<tokio_util::task::TaskTracker> = std::sync::OnceLock::new();
    TRACKER.get_or_init(tokio_util::task::TaskTracker::new)
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct App {
    pub(super) store: Store,
    pub(super) snapshot: watch::Receiver<Arc<Snapshot>>,
    pub(super) demand: Arc<Demand>,
    pub(super) auth: Arc<Auth>,
    pub(super) refresh: Duration,
    details: Arc<Details>,
    /// `--allowed-host` names (see [`auth::host_allowed`]).
    pub(super) hosts: Arc<Vec<String>>,
    /// Authenticated writes receiving their bodies now (see [`super::writes`]).
    pub(super) bodies: Arc<Semaphore>,
    /// `/login` and `/logout` receiving their bodies now.
    pub(super) login_bodies: Arc<Semaphore>,
}

/// One robot as its page shows it: the whole document and its kept output.
#[derive(Debug, Clone)]
pub(crate) struct RobotDetail {
    /// The whole document, shown as it is.
    pub(crate) doc: Document,
    /// The same, decoded, without the spec and the context (`doc` has them).
    pub(crate) robot: RobotDoc,
    pub(crate) output: Option<Document>,
}

/// A robot page's read, and when (None: no such robot).
type Remembered = (Instant, Option<Arc<RobotDetail>>);

/// Robot pages read lately, so a page open in many browsers costs one read per
/// refresh interval, and a flood of requests costs at most [`DETAIL_READS`] reads
/// at a time.
struct Details {
    recent: Mutex<HashMap<String, Remembered>>,
    reads: Semaphore,
}

impl App {
    /// The state of a dashboard reading `store` through `snapshot`.
    pub(super) fn new(
        store: Store,
        (snapshot, demand): (watch::Receiver<Arc<Snapshot>>, Arc<Demand>),
        auth: Auth,
        refresh: Duration,
        hosts: Vec<String>,
    ) -> App {
        App {
            store,
            snapshot,
            demand,
            auth: Arc::new(auth),
            refresh,
            details: Arc::new(Details {
                recent: Mutex::new(HashMap::new()),
                reads: Semaphore::new(DETAIL_READS),
            }),
            hosts: Arc::new(hosts),
            bodies: Arc::new(Semaphore::new(super::writes::MAX_BODIES)),
            login_bodies: Arc::new(Semaphore::new(super::writes::MAX_LOGIN_BODIES)),
        }
    }

    /// The shared snapshot; waits (up to 3 s) for a fresh one after a quiet spell.
    pub(crate) async fn snapshot(&self) -> Arc<Snapshot> {
        self.demand.touch();
        let limit = self.refresh * 3;
        let stale = |s: &Arc<Snapshot>| s.attempted.is_none_or(|t| t.elapsed() > limit);
        let mut rx = self.snapshot.clone();
        if stale(&rx.borrow()) {
            let _ = tokio::time::timeout(Duration::from_secs(3), rx.wait_for(|s| !stale(s))).await;
        }
        let s = rx.borrow().clone();
        s
    }

    /// The robot named `name` (None: no such robot), at most one refresh old.
    pub(crate) async fn robot(&self, name: &str) -> anyhow::Result<Option<Arc<RobotDetail>>> {
        let fresh = |recent: &HashMap<String, Remembered>| {
            recent
                .get(name)
                .filter(|(t, _)| t.elapsed() < self.refresh)
                .map(|(_, d)| d.clone())
        };
        if let Some(d) = fresh(&self.details.recent.lock().expect("details lock")) {
            return Ok(d);
        }
        let _permit = self.details.reads.acquire().await?;
        // Another request may have read it while this one waited.
        if let Some(d) = fresh(&self.details.recent.lock().expect("details lock")) {
            return Ok(d);
        }
        let found = crate::db::listing::robot_with_output(&self.store, name)
            .await
            .context("reading the robot and its output")?;
        let detail = match found {
            None => None,
            Some((doc, output)) => {
                // The page shows the spec and the context from the document
                // itself: the decoded copy keeps neither.
                let mut robot = RobotDoc::from_doc(&doc);
                robot.spec = None;
                robot.context = Ok(Document::new());
                Some(Arc::new(RobotDetail { robot, doc, output }))
            }
        };
        let mut recent = self.details.recent.lock().expect("details lock");
        if recent.len() >= DETAIL_CACHE {
            recent.retain(|_, (t, _)| t.elapsed() < self.refresh);
            if recent.len() >= DETAIL_CACHE {
                recent.clear();
            }
        }
        recent.insert(name.to_string(), (Instant::now(), detail.clone()));
        Ok(detail)
    }

    /// Forgets a robot's cached page after an action changed it.
    pub(super) fn forget(&self, name: &str) {
        self.details
            .recent
            .lock()
            .expect("details lock")
            .remove(name);
    }
}

/// The actor of a web action, for its event.
pub(super) fn web_actor(who: &str, peer: SocketAddr) -> Actor {
    Actor {
        by: "web",
        who: auth::clean_name(who),
        from: Some(peer.to_string()),
    }
}
