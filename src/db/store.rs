//! MongoDB handles, collection names, slot names, and how database errors read.

use crate::db::event::EventKind;
use crate::db::field::{AT, KIND};
use std::future::IntoFuture;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};

pub(crate) const SLOTS: &str = "slots";
pub(crate) const ROBOTS: &str = "robots";
pub(crate) const WORKERS: &str = "workers";
pub(crate) const EVENTS: &str = "events";
/// Robots' kept output lines (see [`crate::db::output_log`]).
pub(crate) const OUTPUTS: &str = "robot_output";
pub(crate) const DEFAULT_DATABASE: &str = "slotpool";

/// Documents per command when a tool inserts, looks up or deletes many at once
/// (`robot create --count`, `init`, the output sweep): a command's cost grows faster
/// than its size, and a server that answers one command at a time holds every
/// renewal behind it (see docs/bench/2026-11-25-scheduled-robots.md).
pub(crate) const CHUNK: usize = 250;
/// The most slots `init` will create; slot ids are zero-padded to sort by `_id`.
/// The most slots `init` makes: far past what one database's renewals can carry (see
/// the scale model in BENCHMARKS.md), and names stay five digits wide at most.
pub(crate) const MAX_SLOTS: u32 = 99_999;

/// Digits in a slot name when a pool's first `init` asks for up to 999 slots
/// (`slot-001`); a first `init` for more uses as many digits as the count has.
pub(crate) const NARROWEST: usize = 3;

/// A whole-number field, read by the one rule every part of slotpool uses: a `long`
/// or an `int`, or a `double` with no fraction (what the mongo shell writes for a
/// hand-typed `5`). Anything else, missing, fractional, out of range or not a
/// number, is `None`, and each caller says what that means where it reads.
pub fn int(d: &Document, key: &str) -> Option<i64> {
    match d.get(key)? {
        Bson::Int64(v) => Some(*v),
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Double(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Some(*v as i64),
        _ => None,
    }
}

/// Errors a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid MongoDB URI {uri}: {why}")]
    BadUri { uri: String, why: String },
    #[error("cannot reach MongoDB at {uri}: {why}")]
    Unreachable { uri: String, why: String },
    #[error("refusing to shrink to {wanted} slots: {slot} still has {robots} robot(s); move or delete them first")]
    ShrinkWithRobots {
        wanted: u32,
        slot: String,
        robots: u64,
    },
    #[error("--slots must be between 1 and {MAX_SLOTS}, got {0}")]
    SlotCount(u32),
    #[error("this pool's slots are named with {width} digits (slot-{example}), so it can have at most {most} of them, not {wanted}: names must sort in numeric order, and renaming a slot would move its robots. Make the larger pool in a new database (MONGODB_URI ending in another database name) with `slotpool init --slots {wanted}`, where names get {need} digits, and recreate the robots there")]
    SlotWidth {
        width: usize,
        example: String,
        most: u32,
        wanted: u32,
        need: usize,
    },
    #[error(transparent)]
    WeakWriteConcern(#[from] crate::db::write_concern::WeakWriteConcern),
    #[error(transparent)]
    Db(#[from] mongodb::error::Error),
}

/// Which write concern a connection takes from its URI (see
/// [`crate::db::write_concern`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriteConcernPolicy {
    /// Majority and journaled; a URI asking for less is refused.
    #[default]
    Majority,
    /// Whatever the URI asks (`--unsafe-write-concern`).
    AsTheUriSays,
}

pub(crate) use crate::secrets::redact_uri;

fn scrub(message: &str) -> String {
    crate::secrets::scrub(message).into_owned()
}

/// How often the driver's server monitor checks each server for the robots' client
/// (and the CLI's and the dashboard's), unless the URI says (`heartbeatFrequencyMS`,
/// `serverMonitoringMode`): every 5 minutes rather than the driver's 10 s, since these
/// checks were a large share of an idle pool's requests. Errors make the driver check
/// at once anyway; only a primary that hangs silently is noticed late, which is why
/// the lease's client checks more often ([`LEASE_MONITOR_EVERY`]). A worker has two
/// clients ([`Store::dedicated`]); see docs/bench/2026-11-26-a-pool-of-200-workers.md.
pub(crate) const MONITOR_EVERY: Duration = Duration::from_secs(300);

/// How often the lease's client's monitor checks, unless the URI says: once a
/// minute, as before the robots' client went to [`MONITOR_EVERY`]. A primary that
/// hangs without an error is left within a minute and 3 s (the check's own wait);
/// set `heartbeatFrequencyMS` lower in the URI to leave it sooner.
pub(crate) const LEASE_MONITOR_EVERY: Duration = Duration::from_secs(60);

/// How long [`Store::close`] waits for the driver to shut a client down.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// The connection and the database every component works in.
#[derive(Clone)]
pub struct Store {
    /// Shared by every clone, so that a client replaced after an outage (see
    /// [`Store::reopen_after`]) serves every part that holds one.
    conn: Arc<RwLock<Conn>>,
    options: ClientOptions,
    /// The connection string with its secrets hidden: the only form kept (the
    /// secrets themselves are remembered by [`crate::secrets`] to scrub messages).
    shown_uri: String,
    /// Whether the URI set how often the driver's monitor checks
    /// (`heartbeatFrequencyMS`): then every client made from this one keeps it.
    monitor_from_uri: bool,
}

/// A store's client, the outages (a worker's count, see [`Store::reopen_after`])
/// that had begun when it was made, and how many clients came before it in the
/// cell (see [`Store::reopen_unless_replaced`]).
struct Conn {
    client: Client,
    db: Database,
    outages: u64,
    generation: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("uri", &self.shown_uri)
            .field("database", &self.db().name())
            .finish()
    }
}

/// Every read goes to the primary, whatever `readPreference` the URI names: the
/// survey, context loads and the group commit's read-back decide writes, and a
/// secondary behind the primary would read a landed write as fenced (and restart
/// the robot). docs/mongodb.md, "Topologies".
fn primary_only(options: &mut ClientOptions) {
    use mongodb::options::{ReadPreference, SelectionCriteria};
    let primary = SelectionCriteria::ReadPreference(ReadPreference::Primary);
    let named = match options.selection_criteria.replace(primary) {
        Some(SelectionCriteria::ReadPreference(pref)) => match pref {
            ReadPreference::Primary => return,
            ReadPreference::PrimaryPreferred { .. } => "primaryPreferred",
            ReadPreference::Secondary { .. } => "secondary",
            ReadPreference::SecondaryPreferred { .. } => "secondaryPreferred",
            ReadPreference::Nearest { .. } => "nearest",
            _ => "another mode",
        },
        Some(_) => "a predicate",
        None => return,
    };
    tracing::warn!(
        "the URI's readPreference={named} is ignored: slotpool reads from the primary \
         alone, since its reads decide its writes (docs/mongodb.md, \"Topologies\")"
    );
}

impl Store {
    /// Connects and pings, failing within a few seconds when the server is unreachable.
    /// The database is the URI's path (`mongodb://host/NAME`), else `slotpool`.
    pub async fn connect(uri: &str) -> Result<Store, StoreError> {
        Self::connect_with(uri, WriteConcernPolicy::Majority).await
    }

    /// [`Store::connect`], taking the URI's write concern as `policy` says. Every
    /// write of every client made from this store carries the write concern chosen.
    pub async fn connect_with(uri: &str, policy: WriteConcernPolicy) -> Result<Store, StoreError> {
        crate::secrets::remember(uri);
        let shown = redact_uri(uri);
        let mut options = ClientOptions::parse(uri)
            .await
            .map_err(|e| StoreError::BadUri {
                uri: shown.clone(),
                why: scrub(&e.to_string()),
            })?;
        options.write_concern = Some(crate::db::write_concern::choose(
            options.write_concern.as_ref(),
            policy == WriteConcernPolicy::AsTheUriSays,
        )?);
        options
            .server_selection_timeout
            .get_or_insert(Duration::from_secs(5));
        options
            .connect_timeout
            .get_or_insert(Duration::from_secs(3));
        options.app_name.get_or_insert_with(|| "slotpool".into());
        primary_only(&mut options);
        let monitor_from_uri = options.heartbeat_freq.is_some();
        options.heartbeat_freq.get_or_insert(MONITOR_EVERY);
        // Polled, not streamed: a streaming monitor opens a second connection per
        // client for its round-trip measurements, and asks as often.
        options
            .server_monitoring_mode
            .get_or_insert(mongodb::options::ServerMonitoringMode::Poll);
        let name = options
            .default_database
            .clone()
            .unwrap_or_else(|| DEFAULT_DATABASE.to_string());
        let client = Client::with_options(options.clone()).map_err(|e| StoreError::BadUri {
            uri: shown.clone(),
            why: scrub(&e.to_string()),
        })?;
        let db = client.database(&name);
        db.run_command(doc! {"ping": 1})
            .await
            .map_err(|e| StoreError::Unreachable {
                uri: shown.clone(),
                why: first_line(&scrub(&e.to_string())),
            })?;
        Ok(Store {
            conn: Arc::new(RwLock::new(Conn {
                client,
                db,
                outages: 0,
                generation: 0,
            })),
            options,
            shown_uri: shown,
            monitor_from_uri,
        })
    }

    /// The same database through a connection pool of its own, at most `pool`
    /// connections, `open` of them opened up front and kept open. The worker renews
    /// its lease through one, so robots' traffic (a restore burst of thousands of
    /// checkpoints) can never queue a renewal behind it in the driver.
    ///
    /// Kept-open connections spare a renewal the handshake on a slow link. A holder
    /// opens more with [`Store::warm`] as it takes slots; a standby keeps one, since
    /// every worker opening many at a cold start swamps the server.
    pub fn dedicated(&self, pool: u32, open: u32, name: &str) -> Result<Store, StoreError> {
        self.dedicated_monitored(pool, open, name, None)
    }

    /// A [`Store::dedicated`] pool for the lease's traffic (claims, renewals,
    /// heartbeats, the line), whose monitor checks every [`LEASE_MONITOR_EVERY`]
    /// unless the URI says otherwise: see there why more often than the robots'.
    pub fn for_leases(&self, pool: u32, open: u32) -> Result<Store, StoreError> {
        self.dedicated_monitored(pool, open, "lease", Some(LEASE_MONITOR_EVERY))
    }

    fn dedicated_monitored(
        &self,
        pool: u32,
        open: u32,
        name: &str,
        monitor: Option<Duration>,
    ) -> Result<Store, StoreError> {
        let mut options = self.options.clone();
        if let (Some(every), false) = (monitor, self.monitor_from_uri) {
            options.heartbeat_freq = Some(every);
        }
        options.max_pool_size = Some(pool);
        options.min_pool_size = Some(open.min(pool));
        options.app_name = Some(format!("slotpool-{name}"));
        self.client_with(options)
    }

    /// A new client on this store's database and URI, with `options`.
    fn client_with(&self, options: ClientOptions) -> Result<Store, StoreError> {
        let client = Client::with_options(options.clone()).map_err(|e| StoreError::BadUri {
            uri: self.shown_uri(),
            why: scrub(&e.to_string()),
        })?;
        Ok(Store {
            conn: Arc::new(RwLock::new(Conn {
                db: client.database(self.db().name()),
                client,
                outages: 0,
                generation: 0,
            })),
            options,
            shown_uri: self.shown_uri.clone(),
            monitor_from_uri: self.monitor_from_uri,
        })
    }

    /// Replaces the client, for every clone of this store, when `outages` (the
    /// worker's count of outages begun) moved since it was made: a new pool of no
    /// connections yet, and its own monitor. A connection that sat open in the pool
    /// through an outage may be dead without knowing it (a container reconnected
    /// under a new address, a NAT that lost its state). Nothing on it is ever
    /// answered or refused, and the driver, which clears its pool on an error, never
    /// saw one there: each request sent on it waits out its own bound (a robot's
    /// write, 30 s). The driver has no way to empty a pool from outside, so the
    /// client is replaced; a request already in flight on the old one ends on it.
    /// True when it was replaced.
    pub fn reopen_after(&self, outages: u64) -> Result<bool, StoreError> {
        if self.conn.read().expect("store lock").outages == outages {
            return Ok(false);
        }
        self.replace_when(outages, |conn| conn.outages != outages)
    }

    /// Which client this store's clones share now: a number that moves each time
    /// it is replaced.
    pub(crate) fn generation(&self) -> u64 {
        self.conn.read().expect("store lock").generation
    }

    /// Replaces the client, for every clone, unless it was replaced since it was
    /// generation `seen` (a request given up on went out on that one). The driver
    /// keeps a request given up on in its pool's queue and serves one queued request
    /// per event of the pool, so after an outage of many given-up requests a new one
    /// waits seconds behind them: a 30 s blackhole of every link kept a holder's
    /// late renewals from the server for 4 s after the link healed, and a standby
    /// took the slot. A new client has no queue. `outages` is the worker's count
    /// now, so that [`Store::reopen_after`] does not replace it again at the resume.
    /// True when it was replaced.
    pub(crate) fn reopen_unless_replaced(
        &self,
        seen: u64,
        outages: u64,
    ) -> Result<bool, StoreError> {
        if self.generation() != seen {
            return Ok(false);
        }
        self.replace_when(outages, |conn| conn.generation == seen)
    }

    /// Makes a new client and puts it in the cell if `still` holds for the one
    /// there once the new one is made (another part may have replaced it meanwhile).
    fn replace_when(
        &self,
        outages: u64,
        still: impl Fn(&Conn) -> bool,
    ) -> Result<bool, StoreError> {
        let fresh = self.client_with(self.options.clone())?;
        let (client, db) = (fresh.client(), fresh.db());
        let mut conn = self.conn.write().expect("store lock");
        if !still(&conn) {
            return Ok(false);
        }
        *conn = Conn {
            client,
            db,
            outages,
            generation: conn.generation + 1,
        };
        Ok(true)
    }

    /// Opens connections until `n` are open (never more than the pool's size), by
    /// sending `n` pings at once: each holds a connection while it waits for its
    /// answer, and every connection stays open in the pool afterwards. Bounded by
    /// `within`; a failure only means the next request opens its own. True when
    /// every ping was answered in time.
    pub async fn warm(&self, n: u32, within: Duration) -> bool {
        let db = self.db();
        let pings = (0..n).map(|_| db.run_command(doc! {"ping": 1}).into_future());
        match tokio::time::timeout(within, futures::future::join_all(pings)).await {
            Ok(answers) => answers.iter().all(Result::is_ok),
            Err(_) => false,
        }
    }

    /// Closes the connections in order, while the runtime still runs. A client left
    /// to be dropped as the runtime shuts down ends its sessions from a task that
    /// can no longer run, and the driver then panicked now and then at exit (about
    /// one `init` or `robot list` in 30). Bounded: an unanswering server cannot hold
    /// the exit up for long.
    pub async fn shutdown(self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.client().shutdown().immediate(true),
        )
        .await;
    }

    /// `message` with this connection string's secrets (and any URI) hidden.
    pub fn scrub(&self, message: &str) -> String {
        scrub(message)
    }

    /// The URI with its password replaced by `****`.
    pub fn shown_uri(&self) -> String {
        self.shown_uri.clone()
    }

    /// The write concern every write of this store carries, as the log says it.
    pub fn write_concern(&self) -> String {
        self.options.write_concern.as_ref().map_or_else(
            || "server default".into(),
            crate::db::write_concern::describe,
        )
    }

    pub fn client(&self) -> Client {
        self.conn.read().expect("store lock").client.clone()
    }

    /// Shuts this store's client down (every clone's, as they share it): its
    /// monitors stop and its connections close, without waiting for anything still
    /// pending (at a worker's exit, its robots and slots are done with by then).
    /// Bounded by [`CLOSE_WITHIN`]; any use after it fails with an error.
    pub async fn close(&self) {
        let client = self.client();
        if tokio::time::timeout(CLOSE_WITHIN, client.shutdown().immediate(true))
            .await
            .is_err()
        {
            tracing::warn!(
                "the database client did not shut down within {} ms",
                CLOSE_WITHIN.as_millis()
            );
        }
    }

    pub fn db(&self) -> Database {
        self.conn.read().expect("store lock").db.clone()
    }

    pub fn slots(&self) -> Collection<Document> {
        self.db().collection(SLOTS)
    }

    pub fn robots(&self) -> Collection<Document> {
        self.db().collection(ROBOTS)
    }

    /// Robots' kept output lines (see [`crate::db::output_log`]).
    pub fn outputs(&self) -> Collection<Document> {
        self.db().collection(OUTPUTS)
    }

    pub fn workers(&self) -> Collection<Document> {
        self.db().collection(WORKERS)
    }

    pub fn events(&self) -> Collection<Document> {
        self.db().collection(EVENTS)
    }

    /// The server's clock, for timestamps written by inserts (which cannot use
    /// `$$NOW`).
    pub async fn server_now(&self) -> Result<bson::DateTime, mongodb::error::Error> {
        let hello = self.db().run_command(doc! {"hello": 1}).await?;
        Ok(hello
            .get_datetime("localTime")
            .copied()
            .unwrap_or_else(|_| bson::DateTime::now()))
    }

    /// Appends to the capped `events` log. Inspection only: a failure is logged, never
    /// fatal. `at` is the server's clock.
    ///
    /// A write that fails on the connection (a stale pooled connection after the
    /// server restarted, a cut link) is tried again on a fresh one until
    /// [`EVENT_WRITE_BUDGET`] is spent: the driver's own retry is off (see
    /// DATABASE.md), and the claim that comes first after a database restart is the
    /// one most likely to meet a dead connection. The retry is an upsert on the same
    /// `_id` keeping the first `at`, so a write that landed unanswered is not doubled.
    pub async fn record_event(&self, kind: EventKind, fields: Document) {
        let event = self.event(kind, fields);
        match tokio::time::timeout(EVENT_WRITE_BUDGET, event.answered()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(kind = event.kind, "could not record event: {}", brief(&e))
            }
            Err(_) => tracing::warn!(
                kind = event.kind,
                "could not record event: no answer within {}s",
                EVENT_WRITE_BUDGET.as_secs()
            ),
        }
    }

    /// Appends to `events` as [`Store::record_event`] does, but never gives the write
    /// up for want of an answer: for an event that must be on record before what
    /// follows it (a claim, before its epoch's first write). The first three sends
    /// each wait [`EVENT_WRITE_BUDGET`] for an answer (several pooled connections may
    /// be dead at once, and each is closed when a send on it is given up), and each
    /// send after waits twice as long as the last, up to [`EVENT_WAIT_MOST`] (a
    /// server that is only slow). Returns when the event is written, or when the server
    /// refused it (named at WARN: a hand-made `events` that refuses writes must not
    /// stop the pool). The caller drops it once the event no longer matters.
    pub async fn record_event_patiently(&self, kind: EventKind, fields: Document) {
        let event = self.event(kind, fields);
        let mut waited = Duration::ZERO;
        for sent in 0.. {
            let wait = patient_wait(sent);
            match tokio::time::timeout(wait, event.answered()).await {
                Ok(Ok(())) => {
                    if !waited.is_zero() {
                        tracing::info!(
                            kind = event.kind,
                            waited_ms = waited.as_millis() as u64,
                            "recorded the event after all"
                        );
                    }
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(kind = event.kind, "could not record event: {}", brief(&e));
                    return;
                }
                Err(_) => {
                    if waited.is_zero() {
                        tracing::warn!(
                            kind = event.kind,
                            "no answer to the event's write within {}s: sending it again until one comes, and what waits for it waits",
                            wait.as_secs()
                        );
                    }
                    waited += wait;
                }
            }
        }
    }

    /// One event's write, the same document however often it is sent.
    fn event(&self, kind: EventKind, fields: Document) -> EventWrite {
        let kind = kind.as_str();
        let mut set = doc! {AT: {"$ifNull": ["$at", "$$NOW"]}, KIND: kind};
        // $literal: a robot name or error text starting with `$` is not a field
        // path; and no text of an event may carry a credential.
        set.extend(fields.into_iter().map(|(k, v)| {
            let v = match v {
                Bson::String(s) => Bson::String(crate::secrets::scrub(&s).into_owned()),
                other => other,
            };
            (k, Bson::Document(doc! {"$literal": v}))
        }));
        EventWrite {
            store: self.clone(),
            id: bson::oid::ObjectId::new(),
            set,
            kind,
        }
    }
}

/// An event's document as written to `events`: an upsert on its own `_id` that keeps
/// the first `at`, so that sending it again never doubles it.
struct EventWrite {
    /// Each sending takes the collection anew: a client replaced meanwhile (see
    /// [`Store::reopen_after`]) carries the next.
    store: Store,
    id: bson::oid::ObjectId,
    set: Document,
    kind: &'static str,
}

impl EventWrite {
    /// Sends the event until the server answers: after a failure on the connection,
    /// again on a fresh one (the driver clears its pool on such an error).
    async fn answered(&self) -> Result<(), mongodb::error::Error> {
        let mut pause = Duration::from_millis(25);
        loop {
            let events = self.store.events();
            let write = events
                .update_one(doc! {"_id": self.id}, vec![doc! {"$set": self.set.clone()}])
                .upsert(true);
            match write.await {
                Err(e) if is_transient(&e) => {
                    tracing::debug!(kind = self.kind, "recording the event again: {}", brief(&e));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                }
                done => return done.map(|_| ()),
            }
        }
    }
}

/// How long [`Store::record_event`] keeps trying before it gives the event up, and
/// how long [`Store::record_event_patiently`] first waits for an answer.
pub const EVENT_WRITE_BUDGET: Duration = Duration::from_secs(2);

/// How many sends [`Store::record_event_patiently`] gives [`EVENT_WRITE_BUDGET`]
/// each before it waits longer.
const PATIENT_SENDS_AT_FIRST: u32 = 3;

/// How long [`Store::record_event_patiently`] waits for the answer to its send
/// after `sent` earlier ones: [`EVENT_WRITE_BUDGET`] for the first
/// [`PATIENT_SENDS_AT_FIRST`], then twice the last wait, up to [`EVENT_WAIT_MOST`].
fn patient_wait(sent: u32) -> Duration {
    let doublings = sent
        .saturating_add(1)
        .saturating_sub(PATIENT_SENDS_AT_FIRST)
        .min(8);
    (EVENT_WRITE_BUDGET * 2u32.pow(doublings)).min(EVENT_WAIT_MOST)
}

/// The longest [`Store::record_event_patiently`] waits for one answer before it
/// sends the event again: as long as a robot's write may wait before it is in doubt
/// ([`crate::db::group_commit::IN_DOUBT_AFTER`]).
pub(crate) const EVENT_WAIT_MOST: Duration = Duration::from_secs(30);

/// `slot-001`, `slot-002`, …: zero-padded so `_id` order is numeric order. For a
/// pool of more than 999 slots, see [`slot_name`].
#[cfg(test)]
pub(crate) fn slot_id(n: u32) -> String {
    slot_name(n, NARROWEST)
}

/// Slot `n` of a pool whose names have `width` digits.
pub(crate) fn slot_name(n: u32, width: usize) -> String {
    format!("slot-{n:0width$}")
}

/// How many digits a pool's slot names have: as many as its existing `slot-N`
/// slots have (the narrowest, if a hand edit mixed them), or for a new pool
/// [`NARROWEST`] or the digits of `count`, whichever is more. An existing pool
/// too narrow for `count` is refused: its names would stop sorting in order.
pub(crate) fn slot_width(present: &[String], count: u32) -> Result<usize, StoreError> {
    let digits = |n: u32| n.to_string().len();
    let existing = present
        .iter()
        .filter_map(|id| id.strip_prefix("slot-"))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map(str::len)
        .min();
    let Some(width) = existing else {
        return Ok(NARROWEST.max(digits(count)));
    };
    if digits(count) > width {
        return Err(StoreError::SlotWidth {
            width,
            example: "0".repeat(width - 1) + "1",
            most: 10_u32.pow(width as u32) - 1,
            wanted: count,
            need: digits(count),
        });
    }
    Ok(width)
}

pub(crate) fn is_namespace_exists(e: &mongodb::error::Error) -> bool {
    matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 48)
}

/// The server's codes for "not now, ask again": a primary stepping down, shutting
/// down, or no longer primary, and a host not reached. The retryable-writes
/// specification's list, and 134 (`ReadConcernMajorityNotAvailableYet`, which the
/// retryable-reads specification adds: a whole replica set restarted has no majority
/// snapshot for a moment). A write refused with one of these did not happen, or may
/// have, and is never a refusal of the document.
const TRANSIENT_CODES: [i32; 13] = [
    6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// What the server said when it refused a request outright: an answer that is not
/// "not now" ([`is_transient`]), so sending it again gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub code_name: String,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.code_name.is_empty() {
            String::new()
        } else {
            format!(" {}", self.code_name)
        };
        write!(f, "{} (code {}{name})", self.message, self.code)?;
        match self.code {
            13 => write!(
                f,
                ": the user lacks a privilege; a worker and the CLI need the readWrite role \
                 on slotpool's database, slotpool web needs read, and init also dbAdmin \
                 (docs/security.md)"
            ),
            18 => write!(f, ": check the user and password in the connection string"),
            _ => write!(
                f,
                ": the server does not take a command slotpool sends; slotpool needs \
                 MongoDB {} or later (docs/mongodb.md)",
                crate::db::version::MINIMUM_VERSION
            ),
        }
    }
}

/// The server's refusal in `e`, when the server answered and refused: a command
/// error or a write error whose code is not transient. None for a network error, a
/// transient code, a duplicate key (which callers read as an answer) and a
/// validator's refusal of one document (code 121, which callers handle).
pub fn refusal(e: &mongodb::error::Error) -> Option<Refusal> {
    use mongodb::error::{ErrorKind, WriteFailure};
    if is_transient(e) || is_duplicate_key(e) {
        return None;
    }
    let (code, code_name, message) = match e.kind.as_ref() {
        ErrorKind::Command(c) => (c.code, c.code_name.clone(), c.message.clone()),
        ErrorKind::Write(WriteFailure::WriteError(w)) => (
            w.code,
            w.code_name.clone().unwrap_or_default(),
            w.message.clone(),
        ),
        _ => return None,
    };
    (code != 121).then(|| Refusal {
        code,
        code_name,
        message: first_line(&scrub(&message)),
    })
}

/// True when the database could not be reached, answered nothing usable, or could
/// not make a write durable (a step-down, an election, a majority not reached): the
/// caller should retry later or read back what landed, never skip. As opposed to
/// refusing one document.
pub(crate) fn is_transient(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    let transient = match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::ConnectionPoolCleared { .. }
        // Applied on the primary, not (yet) by a majority: in doubt.
        | ErrorKind::Write(WriteFailure::WriteConcernError(_)) => true,
        ErrorKind::Command(c) => TRANSIENT_CODES.contains(&c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => TRANSIENT_CODES.contains(&w.code),
        _ => false,
    };
    transient || e.contains_label("RetryableWriteError")
}

/// The `writeConcernError` of a command's reply, as the driver's own write helpers
/// raise it: a command run by hand (the group commit's `update`) answers `ok: 1`
/// with the statements applied on the primary and this beside them when a majority
/// did not acknowledge them. Such a write is in doubt, not done.
pub(crate) fn write_concern_failure(reply: &Document) -> Option<mongodb::error::Error> {
    use mongodb::error::{ErrorKind, WriteConcernError, WriteFailure};
    let failure = reply.get_document("writeConcernError").ok()?;
    // Code 64 is WriteConcernFailed, for a reply too malformed to say its own.
    let failure = bson::from_document::<WriteConcernError>(failure.clone()).or_else(|_| {
        bson::from_document(doc! {
            "code": 64,
            "codeName": "WriteConcernFailed",
            "errmsg": format!("the write was not acknowledged by a majority: {failure}"),
        })
    });
    Some(match failure {
        Ok(w) => ErrorKind::Write(WriteFailure::WriteConcernError(w)).into(),
        Err(e) => mongodb::error::Error::custom(format!("unreadable writeConcernError: {e}")),
    })
}

/// True for a duplicate-key error (code 11000).
pub(crate) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    e.contains_label("DuplicateKey")
        || match e.kind.as_ref() {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
                w.code == 11000
            }
            mongodb::error::ErrorKind::Command(c) => c.code == 11000,
            mongodb::error::ErrorKind::InsertMany(m) => m
                .write_errors
                .as_ref()
                .is_some_and(|ws| ws.iter().any(|w| w.code == 11000)),
            _ => false,
        }
}

/// A one-line summary of a driver error, for logs and robot status (the full error
/// carries the server's whole reply).
pub(crate) fn brief(e: &mongodb::error::Error) -> String {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => format!("{} (code {})", w.message, w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            format!("{} (code {})", w.message, w.code)
        }
        ErrorKind::Command(c) => format!("{} (code {})", c.message, c.code),
        ErrorKind::Io(io) => format!("the connection to the database failed: {io}"),
        ErrorKind::ServerSelection { message, .. } => {
            format!("no database server answered: {}", first_line(message))
        }
        ErrorKind::Authentication { message, .. } => {
            format!(
                "the database refused the credentials: {}",
                first_line(message)
            )
        }
        _ => first_line(&e.to_string()),
    }
}

/// What a person reads of an error whose cause is the database's: the contexts,
/// then the server's refusal with what to do ([`Refusal`]) or a one-line summary
/// ([`brief`]), never the driver's whole error.
pub fn explain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        if let Some(d) = driver_error(cause) {
            parts.push(match refusal(d) {
                Some(r) => r.to_string(),
                None => scrub(&brief(d)),
            });
            return parts.join(": ");
        }
        parts.push(cause.to_string());
    }
    format!("{e:#}")
}

/// True when `e` comes of the database not answering, or not answering usably
/// ([`is_transient`]): worth another try later, unlike a refusal.
pub fn is_unreachable(e: &anyhow::Error) -> bool {
    e.chain().filter_map(driver_error).any(is_transient)
}

/// The driver's error in one link of an error chain, bare or in a [`StoreError`].
fn driver_error<'a>(
    cause: &'a (dyn std::error::Error + 'static),
) -> Option<&'a mongodb::error::Error> {
    cause.downcast_ref::<mongodb::error::Error>().or_else(|| {
        match cause.downcast_ref::<StoreError>() {
            Some(StoreError::Db(d)) => Some(d),
            _ => None,
        }
    })
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(400).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patient_event_gives_three_sends_two_seconds_then_doubles_up_to_thirty() {
        let waits: Vec<u64> = (0..8).map(|n| patient_wait(n).as_secs()).collect();
        assert_eq!(waits, [2, 2, 2, 4, 8, 16, 30, 30]);
        assert_eq!(patient_wait(u32::MAX), EVENT_WAIT_MOST);
    }

    #[test]
    fn a_write_a_majority_did_not_acknowledge_is_in_doubt_not_done() {
        let reply = doc! {"ok": 1, "n": 3, "writeConcernError": {
            "code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out"
        }};
        let e = write_concern_failure(&reply).expect("a failure");
        assert!(is_transient(&e), "{e}");
        assert!(brief(&e).contains("replication timed out"), "{}", brief(&e));
        // A reply too malformed to say its own code still counts.
        let odd = doc! {"ok": 1, "writeConcernError": {"errmsg": 5}};
        assert!(is_transient(&write_concern_failure(&odd).unwrap()));
        assert!(write_concern_failure(&doc! {"ok": 1, "n": 3}).is_none());
    }

    #[test]
    fn a_primary_stepping_down_is_transient_and_a_refused_document_is_not() {
        let command = |code: i32| -> mongodb::error::Error {
            mongodb::error::ErrorKind::Command(
                bson::from_document(doc! {"code": code, "codeName": "X", "errmsg": "x"}).unwrap(),
            )
            .into()
        };
        // NotWritablePrimary, PrimarySteppedDown, InterruptedDueToReplStateChange,
        // ShutdownInProgress.
        for code in [10107, 189, 11602, 91] {
            assert!(is_transient(&command(code)), "code {code}");
        }
        // DocumentValidationFailure, DuplicateKey: the document's, not the server's.
        for code in [121, 11000] {
            assert!(!is_transient(&command(code)), "code {code}");
        }
    }

    #[test]
    fn whole_numbers_read_by_one_rule() {
        let d = doc! {
            "long": 7_i64, "int": 7_i32, "typed": 7.0, "half": 7.5, "huge": 1e300,
            "text": "7", "null": Bson::Null,
        };
        for key in ["long", "int", "typed"] {
            assert_eq!(int(&d, key), Some(7), "{key}");
        }
        for key in ["half", "huge", "text", "null", "missing"] {
            assert_eq!(int(&d, key), None, "{key}");
        }
    }

    #[test]
    fn slot_ids_sort_numerically() {
        let mut ids: Vec<String> = (1..=12).map(slot_id).collect();
        let sorted = ids.clone();
        ids.sort();
        assert_eq!(ids, sorted);
        let mut wide: Vec<String> = (1..=10_000).map(|n| slot_name(n, 5)).collect();
        let sorted = wide.clone();
        wide.sort();
        assert_eq!(wide, sorted, "slot-10000 sorts after slot-09999");
    }

    #[test]
    fn a_pool_keeps_its_width_and_a_new_one_fits_its_count() {
        let none: Vec<String> = Vec::new();
        assert_eq!(slot_width(&none, 3).unwrap(), 3);
        assert_eq!(slot_width(&none, 999).unwrap(), 3);
        assert_eq!(slot_width(&none, 1000).unwrap(), 4);
        assert_eq!(slot_width(&none, 10_000).unwrap(), 5);
        let narrow: Vec<String> = (1..=5).map(slot_id).collect();
        assert_eq!(slot_width(&narrow, 999).unwrap(), 3);
        let e = slot_width(&narrow, 1000).unwrap_err().to_string();
        assert!(
            e.contains("at most 999") && e.contains("slot-001") && e.contains("4 digits"),
            "{e}"
        );
        let wide: Vec<String> = (1..=5).map(|n| slot_name(n, 5)).collect();
        assert_eq!(
            slot_width(&wide, 3).unwrap(),
            5,
            "shrinking keeps the width"
        );
        let odd = vec!["slot-A".to_string(), "other".to_string()];
        assert_eq!(slot_width(&odd, 10).unwrap(), 3, "no slot-N: a new pool");
    }
}
