//! One snapshot of the pool, shared by every viewer of `slotpool web`: the database
//! sees the same few queries per interval whether one browser is open or fifty, and
//! none at all while nobody looks.
//!
//! The cheap **lease view** is refreshed every `refresh` (1 s), so a takeover shows
//! within a second; the costly **robot table** is read slot by slot, at most once per
//! `robots_every` (10 s), resting four times as long as each read took so renewals
//! never wait behind it. Robot states are derived from both at every lease refresh
//! ([`crate::pool::view::derive`]), so a dead holder's robots show `waiting` at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Document};
use serde::Serialize;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use super::timeline::{self, Moment};
use crate::db::event::Event;
use crate::db::listing;
use crate::db::robot_doc::{RobotDoc, RobotStatus};
use crate::db::store::Store;
use crate::pool::view::{self, int, text, RobotState, SlotRow, SlotState, SlotView, WorkerRole};

/// How many of the latest events the snapshot keeps.
pub(crate) const EVENTS_KEPT: i64 = 50;

/// How far back of the newest kept event each read of `events` looks.
pub(crate) const EVENTS_OVERLAP: Duration = Duration::from_secs(30);

/// How many lifecycle events one read for the timeline takes at most.
pub(crate) const MOMENTS_PER_READ: i64 = 5000;
/// How many lifecycle events the timeline keeps at most (the newest).
pub(crate) const MOMENTS_KEPT: usize = 20_000;

/// How far back the first read of `events` looks.
pub(crate) const EVENTS_FIRST: Duration = Duration::from_secs(15 * 60);

/// Nobody has asked for this long: stop reading until someone does.
pub(crate) const IDLE_AFTER: Duration = Duration::from_secs(60);

/// A slot as the dashboard shows it.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub(crate) struct SlotInfo {
    pub(crate) id: String,
    pub(crate) state: SlotState,
    /// The worker holding it while its lease is live.
    pub(crate) holder: Option<String>,
    pub(crate) epoch: Option<i64>,
    pub(crate) lease_ms: Option<i64>,
    /// Since the last renewal, on the server's clock.
    pub(crate) lease_age_ms: Option<i64>,
    /// What is left of the lease (0 once expired), on the server's clock.
    pub(crate) lease_left_ms: Option<i64>,
    /// Robots bound to it (the slot's own count).
    pub(crate) robots: i64,
    pub(crate) draining: bool,
    /// What its running robots cost, as its holder last recorded it.
    pub(crate) cost: Option<crate::load::SlotCost>,
}

/// A live worker.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub(crate) struct WorkerInfo {
    pub(crate) id: String,
    /// `holder` (holds a live slot), `standby`, or `overdue` (holds nothing and its
    /// last heartbeat is older than one beat: probably gone, not counted as a
    /// standby).
    pub(crate) role: WorkerRole,
    /// Its first held slot (a holder with room may hold more: see `held`).
    pub(crate) slot: Option<String>,
    /// How many slots it holds now.
    pub(crate) held: Option<i64>,
    pub(crate) last_seen_ms: Option<i64>,
    pub(crate) version: Option<String>,
    /// Its load score and parts, from its last heartbeat.
    pub(crate) load: Option<crate::load::LoadInfo>,
}

/// One entry of the `events` log: `at` (RFC 3339, server clock), `kind`, and the
/// rest of its fields as text.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub(crate) struct EventInfo {
    pub(crate) at: Option<String>,
    pub(crate) kind: String,
    pub(crate) fields: BTreeMap<String, String>,
}

/// A robot as the table shows it.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub(crate) struct RobotRow {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) slot: String,
    /// Derived now from its slot's lease.
    pub(crate) state: RobotState,
    pub(crate) holder: Option<String>,
    /// Why it is not running.
    pub(crate) why: Option<String>,
    /// What its last holder wrote.
    pub(crate) status: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) paused: bool,
    pub(crate) seq: Option<i64>,
    pub(crate) epoch: Option<i64>,
    pub(crate) restarts: Option<i64>,
    /// Server-clock milliseconds since the epoch of its last checkpoint.
    pub(crate) checkpointed_at_ms: Option<i64>,
    /// Its schedule in words (`every 30s`, `0 3 * * * (Europe/Berlin)`), for a
    /// scheduled robot.
    pub(crate) schedule: Option<String>,
    /// A scheduled robot whose last run started a second or more late, or whose
    /// last firing was missed or lost.
    pub(crate) late: bool,
    /// A scheduled robot's last recorded firing and its outcome (the timeline
    /// marks it).
    #[serde(skip)]
    pub(crate) last_firing: Option<(i64, crate::db::firing::Outcome)>,
    #[serde(skip)]
    worker: Option<String>,
}

impl RobotRow {
    /// A row with only a name, for tests.
    #[cfg(test)]
    pub(crate) fn named(name: &str) -> RobotRow {
        robot_row(&doc! {crate::db::field::NAME: name})
    }
}

/// The pool in numbers.
#[derive(Debug, Clone, Default, Serialize, PartialEq, utoipa::ToSchema)]
pub(crate) struct Summary {
    pub(crate) slots: usize,
    pub(crate) held: usize,
    /// Free or expired: waiting for a worker.
    pub(crate) unheld: usize,
    pub(crate) workers: usize,
    pub(crate) standbys: usize,
    /// Holder failures the pool can absorb now with a standby each.
    pub(crate) failures_absorbable: usize,
    /// Robots in the table, by derived state.
    pub(crate) robots: usize,
    #[schema(value_type = BTreeMap<String, usize>)]
    pub(crate) robots_by_state: BTreeMap<&'static str, usize>,
    /// Robots bound to no existing slot (hand-edited documents), found by count.
    pub(crate) robots_unplaced: i64,
}

/// Everything a page or an API call shows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// The server's clock when the lease view was read (ms since the epoch); 0
    /// before the first read.
    pub(crate) now_ms: i64,
    /// When this process took it, for its age.
    pub(crate) taken: Option<Instant>,
    /// When the last refresh was attempted, successful or not: a viewer waits for a
    /// fresh attempt after a quiet spell, not for a success the database may not
    /// give.
    pub(crate) attempted: Option<Instant>,
    pub(crate) slots: Vec<SlotInfo>,
    pub(crate) workers: Vec<WorkerInfo>,
    pub(crate) events: Vec<EventInfo>,
    /// The last hour's lifecycle events, oldest first (see [`timeline`]).
    pub(crate) timeline: Arc<Vec<Moment>>,
    /// None until the first pass over the robots is complete.
    pub(crate) robots: Option<Arc<Vec<RobotRow>>>,
    /// Server-clock ms when the robot table's pass began.
    pub(crate) robots_at_ms: Option<i64>,
    pub(crate) summary: Summary,
    /// The last refresh's failure, if it failed (the rest is then older).
    pub(crate) error: Option<String>,
}

/// When someone last asked, so reads stop while nobody looks.
#[derive(Default)]
pub(crate) struct Demand {
    last: Mutex<Option<Instant>>,
    wake: Notify,
}

impl Demand {
    /// A viewer wants data.
    pub(crate) fn touch(&self) {
        let was_idle = {
            let mut last = self.last.lock().expect("demand lock");
            let idle = last.is_none_or(|t| t.elapsed() > IDLE_AFTER);
            *last = Some(Instant::now());
            idle
        };
        if was_idle {
            self.wake.notify_waiters();
        }
    }

    fn wanted(&self) -> bool {
        self.last
            .lock()
            .expect("demand lock")
            .is_some_and(|t| t.elapsed() <= IDLE_AFTER)
    }

    /// Returns when someone wants data (at once if someone did lately).
    async fn until_wanted(&self) {
        loop {
            let woken = self.wake.notified();
            if self.wanted() {
                return;
            }
            woken.await;
        }
    }
}

/// The robot table as last read completely.
#[derive(Default)]
struct Table {
    rows: Option<Arc<Vec<RobotRow>>>,
    at_ms: Option<i64>,
    unplaced: i64,
}

/// Runs the two refresh loops and publishes each new snapshot.
pub(crate) struct Snapshotter {
    store: Store,
    refresh: Duration,
    robots_every: Duration,
    demand: Arc<Demand>,
    table: Mutex<Table>,
    table_changed: Notify,
    /// The latest events with their ids, newest first.
    events: Mutex<Vec<(ObjectId, EventInfo)>>,
    /// The last hour's lifecycle events, for the timeline, oldest first.
    moments: Mutex<Vec<(ObjectId, Moment)>>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Snapshotter {
    /// Starts both loops; they stop when `stop` is cancelled.
    pub(crate) fn spawn(
        store: Store,
        refresh: Duration,
        robots_every: Duration,
        stop: CancellationToken,
    ) -> (watch::Receiver<Arc<Snapshot>>, Arc<Demand>) {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let demand = Arc::new(Demand::default());
        let me = Arc::new(Snapshotter {
            store,
            refresh,
            robots_every,
            demand: demand.clone(),
            table: Mutex::new(Table::default()),
            table_changed: Notify::new(),
            events: Mutex::new(Vec::new()),
            moments: Mutex::new(Vec::new()),
            tx,
        });
        let (lease, robots) = (me.clone(), me);
        let stop2 = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = lease.lease_loop() => {}
            }
        });
        tokio::spawn(async move {
            tokio::select! {
                _ = stop2.cancelled() => {}
                _ = robots.robot_loop() => {}
            }
        });
        (rx, demand)
    }

    async fn lease_loop(&self) {
        loop {
            self.demand.until_wanted().await;
            let started = Instant::now();
            let previous = self.tx.borrow().clone();
            let next = match self.read_lease_view().await {
                Ok(mut s) => {
                    self.attach_robots(&mut s);
                    s
                }
                Err(e) => {
                    tracing::warn!("dashboard refresh failed: {e:#}");
                    let mut s = (*previous).clone();
                    s.error = Some(crate::secrets::scrub(&format!("{e:#}")).into_owned());
                    s
                }
            };
            let next = Snapshot {
                attempted: Some(Instant::now()),
                ..next
            };
            self.tx.send_replace(Arc::new(next));
            // Every `refresh`, but resting at least four times as long as the read
            // took: a pool of thousands of slots makes the read slow, and then the
            // dashboard slows down rather than keep the database busy.
            let took = started.elapsed();
            let rest = self.refresh.saturating_sub(took).max(took * 4);
            // Wake early when a robot pass completes, so its rows show at once.
            tokio::select! {
                _ = tokio::time::sleep(rest) => {}
                _ = self.table_changed.notified() => {}
            }
        }
    }

    async fn read_lease_view(&self) -> anyhow::Result<Snapshot> {
        let rows = view::slot_rows(&self.store).await?;
        let workers = view::live_workers(&self.store).await?;
        let now_ms = self.store.server_now().await?.timestamp_millis();
        let events = self.read_events(now_ms).await?;
        let timeline = self.read_moments(now_ms).await?;
        let slots: Vec<SlotInfo> = rows.iter().map(slot_info).collect();
        Ok(Snapshot {
            now_ms,
            taken: Some(Instant::now()),
            workers: workers.iter().map(|w| worker_info(w, &slots)).collect(),
            slots,
            events,
            timeline,
            ..Default::default()
        })
    }

    /// The last hour's lifecycle events ([`timeline::KINDS`]), read incrementally as
    /// [`Snapshotter::read_events`] reads: by `_id` from [`EVENTS_OVERLAP`] before the
    /// newest one kept, or from the whole window at first, at most
    /// [`MOMENTS_PER_READ`] a read. At most [`MOMENTS_KEPT`] are kept.
    async fn read_moments(&self, now_ms: i64) -> anyhow::Result<Arc<Vec<Moment>>> {
        let mut kept = self.moments.lock().expect("moments lock").clone();
        let since_s = match kept.last() {
            Some((id, _)) => {
                id.timestamp().timestamp_millis() / 1000 - EVENTS_OVERLAP.as_secs() as i64
            }
            None => (now_ms - timeline::WINDOW_MS) / 1000,
        }
        .min(now_ms / 1000 - EVENTS_OVERLAP.as_secs() as i64);
        let mut bound = [0u8; 12];
        bound[..4].copy_from_slice(&(since_s.clamp(0, u32::MAX as i64) as u32).to_be_bytes());
        let fresh = listing::events_after(
            &self.store,
            ObjectId::from_bytes(bound),
            Some(&timeline::KINDS),
            false,
            MOMENTS_PER_READ,
        )
        .await?;
        let known: std::collections::HashSet<ObjectId> = kept.iter().map(|(id, _)| *id).collect();
        for e in fresh.iter().map(Event::from_doc) {
            let (Some(id), Some(m)) = (e.id, moment(&e)) else {
                continue;
            };
            if !known.contains(&id) {
                kept.push((id, m));
            }
        }
        kept.sort_by_key(|(id, m)| (m.at_ms, *id));
        kept.retain(|(_, m)| m.at_ms >= now_ms - timeline::WINDOW_MS - 60_000);
        let over = kept.len().saturating_sub(MOMENTS_KEPT);
        kept.drain(..over);
        *self.moments.lock().expect("moments lock") = kept.clone();
        Ok(Arc::new(kept.into_iter().map(|(_, m)| m).collect()))
    }

    /// The latest [`EVENTS_KEPT`] events, read incrementally: only those whose `_id`
    /// (made by the writer, so its clock) is at most [`EVENTS_OVERLAP`] older than
    /// the newest one already kept, or, at first, from the last [`EVENTS_FIRST`].
    /// The dev server sorts a whole collection to answer "the newest 50" (and
    /// ignores `$natural` order); a range of `_id` stays small whatever the size of
    /// the capped log. An event from a writer whose clock is off by more than the
    /// overlap may be missed here (it is still in `events`).
    async fn read_events(&self, now_ms: i64) -> anyhow::Result<Vec<EventInfo>> {
        let mut kept = self.events.lock().expect("events lock").clone();
        let since_s = events_since(
            kept.iter()
                .map(|(id, _)| id.timestamp().timestamp_millis() / 1000)
                .max(),
            now_ms / 1000,
        );
        let mut bound = [0u8; 12];
        bound[..4].copy_from_slice(&(since_s.clamp(0, u32::MAX as i64) as u32).to_be_bytes());
        let fresh = listing::events_after(
            &self.store,
            ObjectId::from_bytes(bound),
            None,
            true,
            EVENTS_KEPT * 4,
        )
        .await?;
        for e in fresh.iter().map(Event::from_doc) {
            let Some(id) = e.id else {
                continue;
            };
            if !kept.iter().any(|(k, _)| *k == id) {
                kept.push((id, event_info(e)));
            }
        }
        // Newest first by the server's clock (`at`), then by id.
        kept.sort_by(|a, b| (&b.1.at, b.0).cmp(&(&a.1.at, a.0)));
        kept.truncate(EVENTS_KEPT as usize);
        *self.events.lock().expect("events lock") = kept.clone();
        Ok(kept.into_iter().map(|(_, e)| e).collect())
    }

    /// Adds the robot table, each row's state derived from the fresh slots, and the
    /// summary.
    fn attach_robots(&self, s: &mut Snapshot) {
        let (rows, at_ms, unplaced) = {
            let t = self.table.lock().expect("table lock");
            (t.rows.clone(), t.at_ms, t.unplaced)
        };
        let views: std::collections::HashMap<String, SlotView> = s
            .slots
            .iter()
            .map(|i| {
                (
                    i.id.clone(),
                    SlotView {
                        state: i.state,
                        holder: i.holder.clone(),
                    },
                )
            })
            .collect();
        s.robots = rows.map(|rows| {
            Arc::new(
                rows.iter()
                    .map(|r| {
                        let st = view::derive(
                            &r.slot,
                            r.status.as_deref().and_then(RobotStatus::parse),
                            r.paused,
                            r.worker.as_deref(),
                            views.get(&r.slot),
                        );
                        RobotRow {
                            state: st.state,
                            holder: st.holder,
                            why: st.why,
                            ..r.clone()
                        }
                    })
                    .collect(),
            )
        });
        s.robots_at_ms = at_ms;
        s.summary = summarize(s, unplaced);
    }

    async fn robot_loop(&self) {
        loop {
            self.demand.until_wanted().await;
            let started = Instant::now();
            match self.read_robots().await {
                Ok(()) => self.table_changed.notify_waiters(),
                Err(e) => tracing::warn!("dashboard robot refresh failed: {e:#}"),
            }
            tokio::time::sleep(self.robots_every.saturating_sub(started.elapsed())).await;
        }
    }

    /// One pass over every slot's robots, then the count that finds robots bound to
    /// no slot. The table is replaced only when the pass is complete.
    async fn read_robots(&self) -> anyhow::Result<()> {
        let at_ms = self.store.server_now().await?.timestamp_millis();
        let slot_ids = crate::db::schema::slot_ids(&self.store).await?;
        let mut rows = Vec::new();
        for id in &slot_ids {
            let t = Instant::now();
            let docs = listing::rows_on(&self.store, id).await?;
            rows.extend(docs.iter().map(robot_row));
            tokio::time::sleep((t.elapsed() * 4).max(Duration::from_millis(5))).await;
        }
        let total = listing::robots_about(&self.store).await? as i64;
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        let mut table = self.table.lock().expect("table lock");
        table.unplaced = (total - rows.len() as i64).max(0);
        table.rows = Some(Arc::new(rows));
        table.at_ms = Some(at_ms);
        Ok(())
    }
}

/// The second from which to read events again: [`EVENTS_OVERLAP`] before the newest
/// kept one, but never after the server's clock (a writer whose clock runs an hour
/// ahead must not hide everyone else's events for that hour); [`EVENTS_FIRST`] back
/// when none is kept.
fn events_since(newest_kept_s: Option<i64>, now_s: i64) -> i64 {
    match newest_kept_s {
        Some(newest) => newest.min(now_s) - EVENTS_OVERLAP.as_secs() as i64,
        None => now_s - EVENTS_FIRST.as_secs() as i64,
    }
}

fn slot_info(r: &SlotRow) -> SlotInfo {
    let lease_ms = r.slot.lease_ms;
    let held = r.state.is_live();
    SlotInfo {
        id: r.slot.id.clone(),
        state: r.state,
        holder: SlotView::of(r).holder,
        epoch: r.slot.epoch,
        lease_ms,
        lease_age_ms: r.lease_age_ms,
        lease_left_ms: match (held, lease_ms, r.lease_age_ms) {
            (true, Some(l), Some(a)) => Some((l - a).max(0)),
            (false, Some(_), _) => Some(0),
            _ => None,
        },
        robots: r.slot.robot_count,
        draining: r.slot.draining,
        cost: r.slot.cost.clone(),
    }
}

/// A live worker, its role judged by the slots it holds now (its own document may
/// still name a slot it lost: a killed worker cannot update it).
fn worker_info(d: &Document, slots: &[SlotInfo]) -> WorkerInfo {
    let id = text(d, "_id").unwrap_or_default();
    let held: Vec<&SlotInfo> = slots
        .iter()
        .filter(|s| s.holder.as_deref() == Some(id.as_str()))
        .collect();
    WorkerInfo {
        role: view::worker_role(d, !held.is_empty()),
        slot: held.first().map(|s| s.id.clone()),
        held: Some(held.len() as i64),
        id,
        last_seen_ms: int(d, "seen_ms"),
        version: text(d, "version"),
        load: crate::db::load::load_of(d).map(|l| (&l).into()),
    }
}

/// A lifecycle event as the timeline needs it; None without a date or of a kind
/// this version does not know.
fn moment(e: &Event) -> Option<Moment> {
    Some(Moment {
        at_ms: e.at_ms?,
        kind: e.kind?,
        worker: e.worker.clone(),
        slot: e.slot.clone(),
        robot: e.robot.clone(),
        overflow: e.overflow,
    })
}

fn event_info(e: Event) -> EventInfo {
    EventInfo {
        at: e.at_rfc3339(),
        kind: e.kind_text,
        fields: e.fields,
    }
}

fn robot_row(d: &Document) -> RobotRow {
    let r = RobotDoc::from_doc(d);
    RobotRow {
        name: r.name.unwrap_or_default(),
        kind: r.kind.unwrap_or_default(),
        slot: r.slot_id.unwrap_or_default(),
        state: RobotState::Waiting,
        holder: None,
        why: None,
        status: r.status_text,
        error: r.error,
        paused: r.paused,
        seq: r.seq,
        epoch: r.epoch,
        restarts: r.restarts,
        checkpointed_at_ms: r.checkpointed_at_ms,
        schedule: r.spec.as_ref().and_then(|s| {
            s.get(crate::robot::schedule::SPEC_FIELD)
                .filter(|v| !matches!(v, bson::Bson::Null))
                .map(|_| {
                    crate::robot::schedule::Schedule::from_spec(s, 0)
                        .ok()
                        .flatten()
                        .map_or("invalid".to_string(), |x| x.describe())
                })
        }),
        late: r.firings.late(),
        last_firing: r.firings.last_firing.zip(r.firings.last_outcome),
        worker: r.worker,
    }
}

/// The pool in numbers, from a snapshot's parts.
pub(crate) fn summarize(s: &Snapshot, unplaced: i64) -> Summary {
    let standbys = s
        .workers
        .iter()
        .filter(|w| w.role == WorkerRole::Standby)
        .count();
    let capacity = view::capacity(s.slots.iter().map(|x| x.state), standbys);
    let mut by_state = BTreeMap::new();
    for r in s.robots.iter().flat_map(|r| r.iter()) {
        *by_state.entry(r.state.as_str()).or_default() += 1;
    }
    Summary {
        slots: s.slots.len(),
        held: capacity.held,
        unheld: capacity.unheld,
        workers: s.workers.len(),
        standbys,
        failures_absorbable: capacity.failures_absorbable,
        robots: s.robots.as_ref().map_or(0, |r| r.len()),
        robots_by_state: by_state,
        robots_unplaced: unplaced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::slot_doc::SlotDoc;
    use bson::Bson;

    fn slot(id: &str, state: &str) -> SlotInfo {
        SlotInfo {
            id: id.into(),
            state: SlotState::parse(state).expect("a slot state"),
            holder: None,
            epoch: Some(1),
            lease_ms: Some(2000),
            lease_age_ms: Some(100),
            lease_left_ms: Some(1900),
            robots: 0,
            draining: false,
            cost: None,
        }
    }

    fn worker(id: &str, slot: Option<&str>) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            role: if slot.is_some() {
                WorkerRole::Holder
            } else {
                WorkerRole::Standby
            },
            slot: slot.map(str::to_string),
            held: None,
            last_seen_ms: Some(10),
            version: None,
            load: None,
        }
    }

    #[test]
    fn unheld_slots_use_up_standbys_before_failures_can_be_absorbed() {
        let mut s = Snapshot {
            slots: vec![slot("a", "held"), slot("b", "expired"), slot("c", "free")],
            workers: vec![worker("w1", Some("a")), worker("w2", None)],
            ..Default::default()
        };
        let sum = summarize(&s, 0);
        assert_eq!((sum.held, sum.unheld, sum.standbys), (1, 2, 1));
        assert_eq!(sum.failures_absorbable, 0);
        s.slots = vec![slot("a", "held"), slot("b", "draining")];
        s.workers.push(worker("w3", None));
        let sum = summarize(&s, 3);
        assert_eq!((sum.held, sum.unheld, sum.failures_absorbable), (2, 0, 2));
        assert_eq!(sum.robots_unplaced, 3);
    }

    #[test]
    fn a_dead_holders_slot_shows_no_holder_and_no_lease_left() {
        let d = doc! {"_id": "slot-1", "owner": "w:1", "epoch": 4_i64, "lease_ms": 2000_i64, "robot_count": 7_i64};
        let expired = slot_info(&SlotRow {
            slot: SlotDoc::from_doc(&d),
            lease_age_ms: Some(5000),
            state: SlotState::Expired,
        });
        assert_eq!(expired.holder, None);
        assert_eq!(expired.lease_left_ms, Some(0));
        assert_eq!((expired.epoch, expired.robots), (Some(4), 7));
        let held = slot_info(&SlotRow {
            slot: SlotDoc::from_doc(&d),
            lease_age_ms: Some(500),
            state: SlotState::Held,
        });
        assert_eq!(held.holder.as_deref(), Some("w:1"));
        assert_eq!(held.lease_left_ms, Some(1500));
    }

    #[test]
    fn a_workers_role_comes_from_the_slots_it_holds_and_its_last_heartbeat() {
        let mut held = slot("slot-1", "held");
        held.holder = Some("w:1".into());
        let slots = vec![held];
        // Its own document still names a slot; the slots say who holds it.
        let w = |id: &str, seen: i64| doc! {"_id": id, "slot_id": "slot-1", "tick_ms": 1000_i64, "seen_ms": seen};
        let holder = worker_info(&w("w:1", 20_000), &slots);
        assert_eq!((holder.role, holder.held), (WorkerRole::Holder, Some(1)));
        assert_eq!(holder.slot.as_deref(), Some("slot-1"));
        // w:2 said it held slot-1, which w:1 holds now: killed a moment ago.
        assert_eq!(
            worker_info(&w("w:2", 5_900), &slots).role,
            WorkerRole::Overdue
        );
        let standby = doc! {"_id": "w:4", "slot_id": null, "held": 0_i64, "tick_ms": 1000_i64, "seen_ms": 5_900_i64};
        assert_eq!(worker_info(&standby, &slots).role, WorkerRole::Standby);
        let gone = worker_info(&w("w:3", 6_100), &slots);
        assert_eq!(
            (gone.role, gone.slot, gone.held),
            (WorkerRole::Overdue, None, Some(0))
        );
    }

    #[test]
    fn events_are_read_from_just_before_the_newest_but_never_from_the_future() {
        let now = 1_000_000;
        assert_eq!(events_since(None, now), now - 900);
        assert_eq!(events_since(Some(now - 5), now), now - 35);
        assert_eq!(events_since(Some(now - 3600), now), now - 3630);
        // An event from a writer an hour ahead anchors nothing.
        assert_eq!(events_since(Some(now + 3600), now), now - 30);
    }

    #[test]
    fn event_fields_are_kept_as_text_without_id_and_nulls() {
        let e = event_info(Event::from_doc(&doc! {
            "_id": bson::oid::ObjectId::new(), "at": bson::DateTime::from_millis(0),
            "kind": "claim", "worker": "w:1", "epoch": 3_i64, "detail": Bson::Null,
        }));
        assert_eq!(e.kind, "claim");
        assert_eq!(e.at.as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(
            e.fields.into_iter().collect::<Vec<_>>(),
            vec![
                ("epoch".to_string(), "3".to_string()),
                ("worker".to_string(), "w:1".to_string())
            ]
        );
    }
}
