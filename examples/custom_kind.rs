//! A worker with a robot kind of your own: `greeter`, which counts its greetings and
//! checkpoints the count, so that a takeover on another worker goes on from where
//! this one stopped.
//!
//! ```sh
//! export MONGODB_URI='mongodb://127.0.0.1:27777/slotpool_demo?directConnection=true&retryWrites=false'
//! cargo run --example custom_kind -- 127.0.0.1:7801
//! # in another shell: a robot of the new kind (the stock CLI does not know the kind,
//! # hence --unchecked; this worker checks the spec before it starts the robot)
//! target/debug/slotpool robot create --name hello --kind greeter --unchecked \
//!     --spec '{"greeting": "hello", "every_ms": 500}'
//! target/debug/slotpool robot show hello
//! ```
//!
//! Every worker of a pool that may hold a `greeter` must be such a build: a stock
//! worker that holds the robot's slot reports the kind as unknown and retries slowly.

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Document};
use slotpool::{Identity, LeaseTiming, Registry, RobotError, RobotKind, RobotRun, Store};
use slotpool::{Worker, WorkerSettings};

/// Says its greeting every `every_ms`, and checkpoints how many times it has.
struct Greeter;

/// What a `greeter`'s spec says: its greeting, and how often.
fn parse(spec: &Document) -> Result<(String, Duration), String> {
    let greeting = match spec.get("greeting") {
        None => "hello".to_string(),
        Some(bson::Bson::String(s)) if !s.is_empty() && s.len() <= 100 => s.clone(),
        Some(other) => {
            return Err(format!(
                "spec.greeting must be 1 to 100 characters, found {other}"
            ))
        }
    };
    let every = match spec.get("every_ms") {
        None => 1_000,
        Some(v) => match v.as_i64().or_else(|| v.as_i32().map(i64::from)) {
            Some(ms) if (100..=3_600_000).contains(&ms) => ms,
            _ => return Err(format!("spec.every_ms must be 100 to 3600000, found {v}")),
        },
    };
    Ok((greeting, Duration::from_millis(every as u64)))
}

#[async_trait]
impl RobotKind for Greeter {
    fn name(&self) -> &str {
        "greeter"
    }

    fn check_spec(&self, spec: &Document) -> Result<(), String> {
        parse(spec).map(|_| ())
    }

    async fn run(&self, run: RobotRun) -> Result<(), RobotError> {
        let (greeting, every) = parse(run.spec()).map_err(RobotError::Invalid)?;
        // Restored from the last checkpoint, wherever that was written.
        let mut count = run.context().get_i64("count").unwrap_or(0);
        loop {
            tokio::select! {
                _ = run.stop().cancelled() => return Ok(()),
                _ = tokio::time::sleep(every) => {}
            }
            count += 1;
            tracing::info!(robot = run.name(), count, "{greeting}");
            // Fenced: a stale copy of this robot (after a takeover) cannot write, and
            // must stop when told so.
            run.checkpoint(doc! {"count": count, "last": &greeting})
                .await?;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Exec robots run under a shim that is this very binary: first thing in main.
    slotpool::run_if_requested();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLOTPOOL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7801".into());
    let identity: Identity = address.parse()?;
    let uri = std::env::var("MONGODB_URI")
        .map_err(|_| anyhow::anyhow!("set MONGODB_URI to the pool's database"))?;
    let store = Store::connect(&uri).await?;
    let timing = LeaseTiming::from_tick(Duration::from_secs(1));
    let settings = WorkerSettings {
        listen: SocketAddr::new(identity.ip, identity.port),
        identity,
        timing,
        hashing: true,
        release_poll: None,
        max_slots: None,
        overflow_after: timing.lease(),
        watchers: 3,
        load: Default::default(),
    };
    let mut registry = Registry::builtin();
    registry.register(Greeter);
    let worker = Worker::new(settings, store.clone(), registry);
    let shutdown = worker.shutdown_token();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        // Robots stopped (each may checkpoint), slots released.
        shutdown.cancel();
    });
    let ran = worker.run().await;
    // The worker closes only the clients it made; this one is ours to close, last,
    // so no request is left in flight when the process ends.
    store.close().await;
    ran?;
    Ok(())
}
