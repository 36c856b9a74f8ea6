use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio::net::TcpListener;

use crate::config::{parse_duration, ConfigError, Identity, LeaseTiming};
use crate::db::store::Store;
use crate::robot::exec::ExecPolicy;
use crate::robot::limits::{Limits, Via};
use crate::robot::Registry;
use crate::worker::http::{self, HttpState};
use crate::worker::{Worker, WorkerSettings};

pub(crate) const DEFAULT_PORT: u16 = 7700;

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// This worker's identity, IP:PORT, as other machines reach it. Written into
    /// `slots.owner`; the port also serves /healthz, /metrics and /status.
    /// Default: this host's address and port 7700.
    #[arg(long, env = "SLOTPOOL_ADVERTISE", value_parser = parse_identity)]
    advertise: Option<Identity>,

    /// Address to bind the HTTP port to. Default: 0.0.0.0 on the advertised port.
    #[arg(long, env = "SLOTPOOL_LISTEN")]
    listen: Option<SocketAddr>,

    /// Renewal period T. The lease is L = 2 × T: a dead holder's slot is taken over
    /// about L after its last renewal.
    #[arg(long, env = "SLOTPOOL_TICK", default_value = "1s", value_parser = parse_duration_arg, allow_hyphen_values = true)]
    tick: Duration,

    /// How long before the lease could expire the holder stops its robots if it
    /// cannot renew. Default 0.45 × T; must exceed --stop-grace and be below T.
    #[arg(long, env = "SLOTPOOL_FENCE_MARGIN", value_parser = parse_duration_arg, allow_hyphen_values = true)]
    fence_margin: Option<Duration>,

    /// How long a robot gets to stop (exec: SIGTERM, then SIGKILL). Default 0.3 × T.
    #[arg(long, env = "SLOTPOOL_STOP_GRACE", value_parser = parse_duration_arg, allow_hyphen_values = true)]
    stop_grace: Option<Duration>,

    /// How long a holder that cannot renew keeps its robots suspended (exec trees
    /// frozen, other kinds not polled) before it stops them. A late renewal that
    /// still matches its epoch proves nobody took the slot, and the same robots go
    /// on in place: a database outage or a replica set's election shorter than
    /// this restarts nothing. Size it above your set's longest election (about
    /// 10-12 s by default). 0 stops robots at the self-fence, as before 0.3.
    #[arg(long, env = "SLOTPOOL_SUSPEND_FOR", default_value = "60s", value_parser = parse_suspend_for, allow_hyphen_values = true)]
    suspend_for: Duration,

    /// The most slots this worker holds at once. Default: no cap, so every robot runs
    /// while one worker lives. To survive n worker failures with W workers and S
    /// slots, each worker must be able to carry ceil(S / (W - n)) slots.
    #[arg(long, env = "SLOTPOOL_MAX_SLOTS", value_parser = parse_max_slots, allow_hyphen_values = true)]
    max_slots: Option<usize>,

    /// How long past its expiry a slot stays unheld before a worker that already
    /// holds a slot takes it too (overflow). Standbys claim at expiry, so this is
    /// their head start. Default: one lease, L = 2 × tick.
    #[arg(long, env = "SLOTPOOL_OVERFLOW_AFTER", value_parser = parse_duration_arg, allow_hyphen_values = true)]
    overflow_after: Option<Duration>,

    /// How many workers at the front of the line (standbys first, then the holders
    /// with the fewest slots) watch the leases and claim a slot at its expiry (a
    /// standby) or when it may overflow (a holder); the rest look every 5 ticks, so
    /// standbys cost the database almost nothing.
    /// Set it to at least the number of workers that can die together (e.g. all the
    /// workers of one machine): that many expired slots are claimed at once, any
    /// further ones within 5 ticks. Every worker should use the same value.
    #[arg(long, env = "SLOTPOOL_WATCHERS", default_value_t = crate::worker::standby_line::FRONT, value_parser = parse_watchers, allow_hyphen_values = true)]
    watchers: u64,

    /// How many robots this worker runs before the executors' part of its load score
    /// is full. The score (0 idle to 100 full) rides on every heartbeat and sends new
    /// robots, the standbys' line and `rebalance --by load` to the idlest worker.
    /// Set it to what one worker should carry; the default suits a pool of workers
    /// alike, which is then ranked mostly by CPU.
    #[arg(long, env = "SLOTPOOL_CAPACITY", default_value_t = crate::load::DEFAULT_CAPACITY, value_parser = parse_capacity)]
    capacity: u64,

    /// The weights of the load score's parts, CPU,EXECUTORS,MEMORY: CPU used over the
    /// last minute against the cgroup's quota or the host's cores, robots run against
    /// --capacity, and memory used against the cgroup's limit or the host's memory.
    /// The default is Keeper's. Every worker should use the same weights.
    #[arg(long, env = "SLOTPOOL_LOAD_WEIGHTS", default_value = "64,32,4", value_parser = parse_load_weights)]
    load_weights: crate::load::LoadWeights,

    /// Commands `exec` robots may run (repeat, or comma-separate). An entry ending in
    /// `/` allows every command under that directory; any other entry allows exactly
    /// that command. Paths must be absolute (a relative one is refused: it would
    /// depend on the directory the worker started in); a bare name is looked up in
    /// PATH. Default: none, so no `exec` robot runs (its status says why). Anyone who
    /// can write to the database can start any allowed command.
    #[arg(
        long = "exec-allow",
        env = "SLOTPOOL_EXEC_ALLOW",
        value_delimiter = ',',
        value_name = "COMMAND|DIR/"
    )]
    exec_allow: Vec<String>,

    /// Environment variables an `exec` robot's `spec.env` may set (repeat, or
    /// comma-separate; `APP_*` allows a prefix, `*` any name). Default: none.
    /// Variables that change how programs load or interpret code (PATH, HOME, ENV,
    /// BASH_ENV, BASH_FUNC_*, LD_*, PYTHON*, NODE_OPTIONS, …) are refused whatever
    /// this says, and so is SLOTPOOL_*.
    #[arg(
        long = "exec-env-allow",
        env = "SLOTPOOL_EXEC_ENV_ALLOW",
        value_delimiter = ',',
        value_name = "NAME|PREFIX*"
    )]
    exec_env_allow: Vec<String>,

    /// Resource limits for `exec` robots whose spec leaves them unset (field by
    /// field): JSON such as '{"memory": "512MB", "pids": 256, "cpu": 1}'. memory is
    /// a size ("256MB", "1GiB"), pids a process count, cpu a number of cores.
    /// Default: none. See --exec-limits-via for how they are enforced.
    #[arg(
        long = "exec-default-limits",
        env = "SLOTPOOL_EXEC_DEFAULT_LIMITS",
        value_name = "JSON",
        value_parser = parse_default_limits
    )]
    exec_default_limits: Option<Limits>,

    /// How an `exec` robot's limits are enforced. auto: a cgroup per robot where
    /// this worker may create one (root, writable cgroup v1 or v2), rlimits
    /// otherwise (RLIMIT_AS for memory; RLIMIT_NPROC for pids, which counts every
    /// process of the robot's user and never applies to root; no cpu rate). The
    /// robot's document says which applied (`applied_limits`).
    #[arg(
        long = "exec-limits-via",
        env = "SLOTPOOL_EXEC_LIMITS_VIA",
        value_enum,
        default_value_t = Via::Auto
    )]
    exec_limits_via: Via,

    /// Run `exec` robots as this user (USER, USER:GROUP, UID or UID:GID; no
    /// supplementary groups), not as the worker's own. Then a robot cannot signal,
    /// trace or freeze its shim or this worker: without it, a robot that stops both
    /// can outlive its lease. Needs a worker that may switch users (root, or
    /// CAP_SETUID and CAP_SETGID); the robot's command and files must be readable
    /// by that user. Default: the worker's own user (a warning at start when that
    /// is root).
    #[arg(
        long = "exec-user",
        env = "SLOTPOOL_EXEC_USER",
        value_name = "USER[:GROUP]"
    )]
    exec_user: Option<String>,

    /// Off by default: a worker that releases a slot pokes the first standbys in
    /// line over HTTP (POST /v1/poke on their advertised ip:port), and they survey at
    /// once. Where pokes cannot reach the standbys (a firewall between workers),
    /// this makes the first standby ask the database this often whether a slot was
    /// released or added (one indexed read each time), so a released slot is
    /// claimed within this much instead of at the next survey, a tick later. `0`:
    /// no poll. Must be below the tick.
    #[arg(long, env = "SLOTPOOL_RELEASE_POLL", default_value = "0", value_parser = parse_release_poll, allow_hyphen_values = true)]
    release_poll: Duration,

    /// Deprecated: standbys no longer open change streams (on the dev server every
    /// write woke every stream). Accepted for old scripts; means `--release-poll 0`.
    #[arg(long, env = "SLOTPOOL_NO_CHANGE_STREAM", hide = true)]
    no_change_stream: bool,

    /// Behind mongos only: every mongos this pool's workers reach keeps its host's
    /// clock in step with the others (NTP, well within --fence-margin). Each mongos
    /// evaluates `$$NOW`, the clock every lease is judged by, with its own host's
    /// clock, so a worker whose mongos runs ahead by more than the margin could claim
    /// a slot whose holder still runs its robots. Without this flag a worker refuses
    /// to start behind mongos (one mongos for the whole pool needs no flag only if
    /// you are sure every worker reaches the same one; say so with this flag).
    #[arg(long, env = "SLOTPOOL_MONGOS_CLOCKS_AGREE")]
    mongos_clocks_agree: bool,

    /// Benchmarks only: every worker tries the first expired slot first.
    #[arg(long, hide = true)]
    no_hash: bool,
}

fn parse_identity(s: &str) -> Result<Identity, ConfigError> {
    s.parse()
}

fn parse_capacity(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=10_000_000).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?}: --capacity takes a whole number of robots from 1 to 10000000 (default {})",
            crate::load::DEFAULT_CAPACITY
        )),
    }
}

fn parse_load_weights(s: &str) -> Result<crate::load::LoadWeights, String> {
    s.parse()
}

fn parse_duration_arg(s: &str) -> Result<Duration, ConfigError> {
    parse_duration(s)
}

/// `--suspend-for`: a duration, or 0 (`0s`) for no suspension.
fn parse_suspend_for(s: &str) -> Result<Duration, String> {
    if matches!(s.trim(), "0" | "0s" | "0ms") {
        return Ok(Duration::ZERO);
    }
    parse_duration(s).map_err(|e| format!("{e} (or 0 to stop robots at the deadline)"))
}

fn parse_release_poll(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) {
        return Err(format!(
            "{s}: poll at most every 10ms (or 0 for no release poll)"
        ));
    }
    Ok(d)
}

fn parse_default_limits(s: &str) -> Result<Limits, String> {
    // clap says which flag; the parser's own prefix would repeat it.
    Limits::from_json(s).map_err(|e| e.replacen("--exec-default-limits", "limits", 1))
}

fn parse_watchers(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n as u64),
        Ok(n) => Err(format!("{n} watchers: use 1 to 1000")),
        Err(_) => Err(format!("{s:?} is not a whole number of watchers")),
    }
}

fn parse_max_slots(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(n as usize),
        Ok(n) => Err(format!(
            "{n} is not a slot count: use 1 or more (leave --max-slots out for no cap)"
        )),
        Err(_) => Err(format!("{s:?} is not a whole number of slots")),
    }
}

/// Raises the soft limit on open descriptors to the hard one (as Go's runtime
/// does): each `exec` robot holds three pipes in the worker, and the common soft
/// default of 1,024 is low for a worker running hundreds. Returns the limit now.
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a properly initialised struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

pub(crate) async fn run(
    uri: &str,
    policy: crate::db::store::WriteConcernPolicy,
    args: WorkerArgs,
) -> anyhow::Result<()> {
    let defaults = LeaseTiming::from_tick(args.tick);
    let timing = LeaseTiming {
        tick: args.tick,
        margin: args.fence_margin.unwrap_or(defaults.margin),
        stop_grace: args.stop_grace.unwrap_or(defaults.stop_grace),
        suspend_for: args.suspend_for,
    };
    timing.validate()?;
    let release_poll = if args.no_change_stream {
        tracing::warn!("--no-change-stream is deprecated (standbys no longer open change streams); it now means --release-poll 0");
        None
    } else {
        Some(args.release_poll).filter(|p| !p.is_zero())
    };
    if let Some(p) = release_poll.filter(|p| *p >= args.tick) {
        anyhow::bail!(
            "--release-poll {} is not below --tick {}: the first standby surveys every tick anyway (use 0 for no release poll)",
            humantime::format_duration(p),
            humantime::format_duration(args.tick)
        );
    }
    let exec_policy = ExecPolicy::commands(args.exec_allow.clone())
        .and_then(|p| p.with_env(args.exec_env_allow.clone()))
        .map_err(anyhow::Error::msg)?
        .with_limits(
            args.exec_default_limits.unwrap_or_default(),
            args.exec_limits_via,
        )
        .with_user(exec_user(
            args.exec_user.as_deref(),
            !args.exec_allow.is_empty(),
        )?);
    let identity = match args.advertise {
        Some(id) => id,
        None => default_identity().await,
    };
    let listen = args
        .listen
        .unwrap_or_else(|| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), identity.port));
    let listener = TcpListener::bind(listen).await.with_context(|| {
        format!(
            "cannot listen on {listen} (is another worker already using port {}?)",
            listen.port()
        )
    })?;
    let store = Store::connect_with(uri, policy)
        .await
        .context("connecting to MongoDB (set --mongodb-uri or MONGODB_URI)")?;
    let deployment = store
        .deployment()
        .await
        .context("reading what the database server is (hello)")?;
    deployment.holds_leases(args.mongos_clocks_agree)?;
    for warning in deployment.topology.warnings() {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        worker = %identity, listen = %listen, database = %store.db().name(), uri = %store.shown_uri(), write_concern = %store.write_concern(),
        server = %deployment.version, lease_ms = timing.lease_ms(), max_slots = ?args.max_slots, watchers = args.watchers,
        capacity = args.capacity, load_weights = %args.load_weights,
        release_poll_ms = release_poll.map_or(0, |p| p.as_millis() as u64),
        overflow_after_ms = args.overflow_after.unwrap_or(timing.lease()).as_millis() as u64, margin_ms = timing.margin.as_millis() as u64,
        stop_grace_ms = timing.stop_grace.as_millis() as u64, exec_allow = %exec_policy.describe(),
        exec_env = %exec_policy.describe_env(), exec_default_limits = %exec_policy.describe_limits(), open_files = raise_fd_limit(),
        "starting worker"
    );
    let settings = WorkerSettings {
        identity,
        listen,
        timing,
        hashing: !args.no_hash,
        release_poll,
        max_slots: args.max_slots,
        overflow_after: args.overflow_after.unwrap_or(timing.lease()),
        watchers: args.watchers,
        load: crate::worker::LoadSettings {
            weights: args.load_weights,
            capacity: args.capacity,
        },
    };
    let worker = Worker::new(settings, store.clone(), Registry::builtin_with(exec_policy));
    let shutdown = worker.shutdown_token();
    let state = HttpState {
        metrics: worker.metrics(),
        status: worker.status(),
        poke: Some(worker.poke_gate()),
    };
    tokio::spawn(http::serve(listener, state, shutdown.child_token()));
    tokio::spawn(on_signals(shutdown));
    let ran = worker.run().await;
    // The process ends next: the robots' client last (see main.rs).
    store.close().await;
    ran?;
    Ok(())
}

/// SIGTERM or SIGINT: graceful stop (robots stopped, slot released). A second signal
/// more than a second later exits at once; one sooner is the same request arriving
/// twice (a terminal's Ctrl-C reaches the whole process group, and a supervisor may
/// send its own SIGTERM too).
async fn on_signals(shutdown: tokio_util::sync::CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping robots and releasing the slot"),
        _ = int.recv() => tracing::info!("SIGINT: stopping robots and releasing the slot"),
    }
    shutdown.cancel();
    let first = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if first.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    tracing::warn!("second signal: exiting now without waiting for robots");
    std::process::exit(130);
}

/// This host's address as its name resolves (in a container: the container's
/// address), else loopback.
async fn default_identity() -> Identity {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let mut ip = None;
    if !host.is_empty() {
        if let Ok(addrs) = tokio::net::lookup_host((host.as_str(), DEFAULT_PORT)).await {
            ip = addrs
                .map(|a| a.ip())
                .find(|ip| !ip.is_loopback() && !ip.is_unspecified());
        }
    }
    let ip = ip.unwrap_or_else(|| {
        tracing::warn!(
            "could not find this host's address; advertising 127.0.0.1 (set --advertise)"
        );
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    });
    Identity {
        ip,
        port: DEFAULT_PORT,
    }
}

/// The user exec robots run as: `--exec-user`, checked here so a worker that
/// cannot switch users says so at start, not with every robot.
fn exec_user(
    spec: Option<&str>,
    exec_on: bool,
) -> anyhow::Result<Option<crate::robot::run_as::RunAs>> {
    use crate::robot::run_as::RunAs;
    let Some(spec) = spec.filter(|s| !s.is_empty()) else {
        // SAFETY: geteuid has no preconditions.
        if exec_on && unsafe { libc::geteuid() } == 0 {
            tracing::warn!("exec robots run as root, this worker's own user: a robot can signal or freeze its shim and this worker, and one that stops both can outlive its lease; run them as another user with --exec-user (docs/guarantees.md)");
        }
        return Ok(None);
    };
    let run_as = RunAs::parse(spec).map_err(anyhow::Error::msg)?;
    if !RunAs::may_switch() {
        anyhow::bail!(
            "--exec-user {}: this worker cannot switch users (it needs root, or CAP_SETUID and CAP_SETGID); drop the flag, or start the worker as root",
            crate::printable::escape(spec)
        );
    }
    Ok(Some(run_as))
}
