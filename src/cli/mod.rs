//! The command line: one module per command group; this one only parses and
//! dispatches. What is printed goes through [`output`], the connection through
//! [`connect`].
//!
//! Everything printed for people goes through `say!` or [`print_table`], which
//! escape control characters: names, errors and contexts come from documents, and
//! documents are hostile input (see [`crate::printable`]).

#[macro_use]
mod output;

mod connect;
mod create;
mod init;
mod logs;
pub mod manual;
mod rebalance;
mod replies;
mod robots;
mod runs;
mod slots;
mod status;
mod worker;

use clap::{Parser, Subcommand};

use crate::db::store::WriteConcernPolicy;
use connect::{connect, connection_string};

/// Keeps stateful robots alive on a pool of identical workers, coordinated through
/// MongoDB slot leases.
///
/// Typical start: `slotpool init --slots 3`, then one `slotpool worker` per container
/// (more workers than slots: the extra ones are hot standbys), then
/// `slotpool robot create --name r1 --kind counter`. Inspect with `slotpool status`.
#[derive(Debug, Parser)]
#[command(name = "slotpool", version, propagate_version = true)]
pub struct Cli {
    /// MongoDB connection string. Its path names the database (default `slotpool`).
    /// Default: mongodb://127.0.0.1:27017/slotpool. Credentials in it are hidden from
    /// every output and from other processes' view of this one.
    #[arg(long, global = true, env = "MONGODB_URI", hide_env_values = true)]
    pub(crate) mongodb_uri: Option<String>,

    /// Read the connection string from this file instead (the Docker-secrets
    /// convention); it never appears in a command line or an environment.
    #[arg(long, global = true, env = "MONGODB_URI_FILE", value_name = "PATH")]
    pub(crate) mongodb_uri_file: Option<std::path::PathBuf>,

    /// Accept the connection string's write concern even when it is weaker than
    /// `w=majority` with `journal=true`. Without this, such a URI is refused: on a
    /// replica set, a claim or checkpoint acknowledged by fewer members can be
    /// rolled back by a failover, and two workers could then both run a robot.
    #[arg(long, global = true, env = "SLOTPOOL_UNSAFE_WRITE_CONCERN")]
    pub(crate) unsafe_write_concern: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a worker: stand by, claim a slot, run its robots, hand it over on exit.
    Worker(worker::WorkerArgs),
    /// Create or update collections, validators, indexes and exactly N slots.
    Init(init::InitArgs),
    /// Inspect and drain slots.
    #[command(subcommand)]
    Slots(slots::SlotsCommand),
    /// Create, list, move, pause and delete robots.
    #[command(subcommand)]
    Robot(robots::RobotCommand),
    /// Even out robots over the non-draining slots with fenced moves (most loaded
    /// to least loaded, until counts differ by at most one).
    Rebalance(rebalance::RebalanceArgs),
    /// The pool at a glance: slots, holders, robots, standbys, failures it can absorb.
    Status(status::StatusArgs),
    /// Serve a live dashboard of the pool (and its JSON API) to browsers: read-only
    /// unless --allow-actions with SLOTPOOL_WEB_TOKEN. Binds 127.0.0.1:8080 by default.
    Web(crate::web::WebArgs),
    /// Print a completion script for bash, zsh, fish, elvish or PowerShell (see
    /// `slotpool completion --help` for where to put it).
    Completion(manual::CompletionArgs),
    /// Print a command's manual page, or write every page into a directory.
    Man(manual::ManArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // These read nothing but the command line's own definitions: no URI needed.
    match cli.command {
        Command::Completion(args) => return manual::completion(args),
        Command::Man(args) => return manual::man(args),
        _ => {}
    }
    let uri = connection_string(&cli)?;
    crate::secrets::remember(&uri);
    crate::secrets::hide_from_other_processes(&uri);
    let policy = if cli.unsafe_write_concern {
        WriteConcernPolicy::AsTheUriSays
    } else {
        WriteConcernPolicy::Majority
    };
    let store = match cli.command {
        Command::Worker(args) => return worker::run(&uri, policy, args).await,
        Command::Web(args) => return crate::web::run(&uri, policy, args).await,
        _ => connect(&uri, policy).await?,
    };
    let result = match cli.command {
        Command::Init(args) => init::run(&store, args).await,
        Command::Slots(cmd) => slots::run(&store, cmd).await,
        Command::Robot(cmd) => robots::run(&store, cmd).await,
        Command::Status(args) => status::run(&store, args).await,
        Command::Rebalance(args) => rebalance::run(&store, args).await,
        Command::Worker(_) | Command::Web(_) | Command::Completion(_) | Command::Man(_) => {
            unreachable!("dispatched above")
        }
    };
    store.shutdown().await;
    result
}
