use anyhow::Context;
use clap::Args;

use crate::db::store::Store;

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// How many slots the pool has (1 to 99999). Run again to grow; shrinking removes
    /// the highest-numbered slots and refuses while any of them has robots. Names
    /// are zero-padded so they sort in order: slot-001… for up to 999 slots, and for
    /// a new pool of more, as many digits as the count has (slot-00001…slot-10000).
    /// A pool keeps its first width: growing past it is refused with what to do.
    #[arg(long)]
    slots: u32,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(store: &Store, args: InitArgs) -> anyhow::Result<()> {
    store
        .deployment()
        .await
        .context("reading what the database server is (hello)")?
        .supported()?;
    let report = crate::pool::init::init(store, args.slots).await?;
    if args.json {
        super::output::print_json(&serde_json::to_value(&report)?);
        return Ok(());
    }
    say!(
        "initialised database {:?}: {} slot(s){}{}",
        store.db().name(),
        report.total,
        if report.added.is_empty() {
            String::new()
        } else {
            format!(", added {}", report.added.join(" "))
        },
        if report.removed.is_empty() {
            String::new()
        } else {
            format!(", removed {}", report.removed.join(" "))
        },
    );
    if report.orphaned_output > 0 {
        say!(
            "removed the kept output of {} robot(s) that no longer exist",
            report.orphaned_output
        );
    }
    if report.rescued > 0 {
        say!(
            "re-placed {} robot(s) that were bound to slots that no longer exist",
            report.rescued
        );
    }
    Ok(())
}
