//! The command line: one module per command group.
//!
//! Everything printed for people goes through `say!` or [`print_table`], which
//! escape control characters: names, errors and contexts come from documents, and
//! documents are hostile input (see [`crate::printable`]).

/// `println!`, with control characters escaped.
macro_rules! say {
    ($($t:tt)*) => {
        println!("{}", $crate::printable::escape(&format!($($t)*)))
    };
}

mod create;
mod init;
mod logs;
mod rebalance;
mod robots;
mod slots;
mod status;
mod worker;

use anyhow::Context as _;
use bson::{doc, Document};
use clap::{Parser, Subcommand};

use crate::db::field::NAME;
use crate::db::store::Store;

const DEFAULT_URI: &str = "mongodb://127.0.0.1:27017/slotpool";

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
    pub mongodb_uri: Option<String>,

    /// Read the connection string from this file instead (the Docker-secrets
    /// convention); it never appears in a command line or an environment.
    #[arg(long, global = true, env = "MONGODB_URI_FILE", value_name = "PATH")]
    pub mongodb_uri_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
}

/// The connection string, from exactly one of the flag (or `MONGODB_URI`) and the
/// file (or `MONGODB_URI_FILE`), else the local default.
fn connection_string(cli: &Cli) -> anyhow::Result<String> {
    match (&cli.mongodb_uri, &cli.mongodb_uri_file) {
        (Some(_), Some(_)) => anyhow::bail!(
            "both a connection string (--mongodb-uri or MONGODB_URI) and a file \
             (--mongodb-uri-file or MONGODB_URI_FILE) are set; give only one"
        ),
        (Some(uri), None) => Ok(uri.clone()),
        (None, Some(path)) => read_uri_file(path).map_err(anyhow::Error::msg),
        (None, None) => Ok(DEFAULT_URI.to_string()),
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let uri = connection_string(&cli)?;
    crate::secrets::remember(&uri);
    crate::secrets::hide_from_other_processes(&uri);
    let store = match cli.command {
        Command::Worker(args) => return worker::run(&uri, args).await,
        Command::Web(args) => return crate::web::run(&uri, args).await,
        _ => connect(&uri).await?,
    };
    let result = match cli.command {
        Command::Init(args) => init::run(&store, args).await,
        Command::Slots(cmd) => slots::run(&store, cmd).await,
        Command::Robot(cmd) => robots::run(&store, cmd).await,
        Command::Status(args) => status::run(&store, args).await,
        Command::Rebalance(args) => rebalance::run(&store, args).await,
        Command::Worker(_) | Command::Web(_) => unreachable!("dispatched above"),
    };
    store.shutdown().await;
    result
}

async fn connect(uri: &str) -> anyhow::Result<Store> {
    Store::connect(uri)
        .await
        .context("connecting to MongoDB (set --mongodb-uri or MONGODB_URI)")
}

/// Prints rows as aligned columns under a header.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::printable::escape(c).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::printable::escape(c).into_owned())
                .collect()
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{:<w$}  ", c, w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Reads the connection string from a file (`--mongodb-uri-file`,
/// `MONGODB_URI_FILE`: the Docker-secrets convention). Surrounding whitespace, such
/// as the file's final newline, is not part of it.
pub fn read_uri_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the MongoDB URI file {}: {e}",
            crate::printable::escape(&path.display().to_string())
        )
    })?;
    let uri = text.trim();
    if uri.is_empty() {
        return Err(format!(
            "the MongoDB URI file {} is empty",
            crate::printable::escape(&path.display().to_string())
        ));
    }
    Ok(uri.to_string())
}

/// Prints a value as pretty JSON on stdout.
fn print_json(v: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    println!("{}", crate::printable::escape_json(&text));
}

pub(crate) use crate::pool::view::{age, int, text};

/// The robot named `name`, with `projection` (empty: the whole document), or an
/// error that says where to look.
async fn find_robot(store: &Store, name: &str, projection: Document) -> anyhow::Result<Document> {
    store
        .robots()
        .find_one(doc! {NAME: name})
        .projection(projection)
        .await?
        .with_context(|| format!("no robot named {name:?}: see `slotpool robot list`"))
}
