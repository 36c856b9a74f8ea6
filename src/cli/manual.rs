//! What shells and `man` need, generated from the same definitions that parse the
//! command line: `slotpool completion SHELL` and `slotpool man`. Neither reads the
//! database.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;

#[derive(Debug, Args)]
#[command(after_long_help = COMPLETION_HELP)]
pub(crate) struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

const COMPLETION_HELP: &str = "\
Install (the completion follows the binary's version; regenerate after an upgrade):
  bash   slotpool completion bash > ~/.local/share/bash-completion/completions/slotpool
         (system-wide: /usr/share/bash-completion/completions/slotpool)
  zsh    slotpool completion zsh > \"${fpath[1]}/_slotpool\"   (then: compinit)
  fish   slotpool completion fish > ~/.config/fish/completions/slotpool.fish
For the current bash session only: source <(slotpool completion bash)";

#[derive(Debug, Args)]
#[command(after_long_help = MAN_HELP)]
pub(crate) struct ManArgs {
    /// Write every page (slotpool.1, slotpool-worker.1, slotpool-robot-create.1, …)
    /// into this directory, creating it if needed, and list them. Without it, the
    /// page of COMMAND is printed.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// The command whose page to print, e.g. `robot create`; none: `slotpool` itself.
    #[arg(value_name = "COMMAND", conflicts_with = "out_dir")]
    command: Vec<String>,
}

const MAN_HELP: &str = "\
Read one page now:      slotpool man robot create | man -l -
Install every page:     slotpool man --out-dir ~/.local/share/man/man1
                        (system-wide: /usr/local/share/man/man1; then `mandb` where it is used)
Then:                   man slotpool-robot-create";

/// The command tree as `man` and the shells see it: built, so that each subcommand
/// carries its full name (`slotpool-robot-create`), and without the `help`
/// subcommands, which clap answers itself.
pub fn command_tree() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

pub(crate) fn completion(args: CompletionArgs) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "slotpool", &mut out);
    out.flush()?;
    Ok(())
}

pub(crate) fn man(args: ManArgs) -> anyhow::Result<()> {
    let tree = command_tree();
    if let Some(dir) = args.out_dir {
        for path in write_pages(&tree, &dir)? {
            say!("{}", path.display());
        }
        return Ok(());
    }
    let cmd = find(&tree, &args.command)?;
    let mut page = Vec::new();
    man_page(cmd).render(&mut page)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&page)?;
    out.flush()?;
    Ok(())
}

/// One command's page, in section 1, named for the whole tool's version.
fn man_page(cmd: &clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd.clone())
        .source(format!("slotpool {}", env!("CARGO_PKG_VERSION")))
        .manual("slotpool manual")
}

/// The subcommand at `path` (e.g. `["robot", "create"]`), or why there is none.
fn find<'a>(tree: &'a clap::Command, path: &[String]) -> anyhow::Result<&'a clap::Command> {
    let mut cmd = tree;
    for (i, word) in path.iter().enumerate() {
        cmd = cmd
            .get_subcommands()
            .find(|c| {
                !c.is_hide_set() && (c.get_name() == word || c.get_all_aliases().any(|a| a == word))
            })
            .ok_or_else(|| {
                let at = std::iter::once("slotpool")
                    .chain(path[..i].iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                let known: Vec<&str> = cmd
                    .get_subcommands()
                    .filter(|c| !c.is_hide_set())
                    .map(|c| c.get_name())
                    .collect();
                if known.is_empty() {
                    anyhow::anyhow!("`{at}` has no subcommands, so no page for {word:?}")
                } else {
                    anyhow::anyhow!(
                        "`{at}` has no subcommand {word:?}; it has: {}",
                        known.join(", ")
                    )
                }
            })?;
    }
    Ok(cmd)
}

/// Writes one page per command and subcommand into `dir`; returns their paths,
/// the top page first.
pub(crate) fn write_pages(tree: &clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut stack = vec![tree];
    while let Some(cmd) = stack.pop() {
        let page = man_page(cmd);
        let path = page.generate_to(dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot write {}: {e}",
                dir.join(page.get_filename()).display()
            )
        })?;
        written.push(path);
        let mut subs: Vec<&clap::Command> =
            cmd.get_subcommands().filter(|c| !c.is_hide_set()).collect();
        subs.reverse();
        stack.extend(subs);
    }
    Ok(written)
}
