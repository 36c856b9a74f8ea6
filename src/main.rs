//! The `slotpool` command: parse arguments, set up logging, dispatch.

use clap::Parser;
use slotpool::cli::Cli;

fn main() {
    // `slotpool __robot-shim …`: the per-robot process that kills an exec robot when
    // its holder's lease lapses (see slotpool::robot::shim). It needs no runtime.
    slotpool::run_if_requested();
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let code = runtime.block_on(run());
    // The process ends here, the runtime with it, without dropping the runtime
    // first: dropping it drops every task still spawned while its threads may still
    // poll others, and a task waiting on one of the driver's connection pools then
    // panics when the pool's own task is dropped before it (the driver's known
    // shutdown race). Whatever had to finish has: a worker's robots stopped, its
    // slots released, its clients shut down; a command's output written.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

/// Runs the command; the process's exit code.
async fn run() -> i32 {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLOTPOOL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,mongodb=warn"));
    // Log records carry robot names and output, which are hostile: each record is
    // escaped as a whole (no raw escape sequences, no forged lines), so no colours.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(slotpool::printable::EscapingStderr)
        .with_target(false)
        .with_ansi(false)
        .init();
    if let Err(e) = slotpool::cli::run(cli).await {
        eprintln!(
            "error: {}",
            slotpool::printable::escape(&slotpool::db::store::explain(&e))
        );
        return 1;
    }
    0
}
