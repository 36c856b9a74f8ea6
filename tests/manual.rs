//! `slotpool completion` and `slotpool man`: every command and subcommand has a
//! manual page that groff renders without a warning, and each shell's completion
//! offers it. Runs the real binary and the real shells (bash, zsh, fish) and groff,
//! which scripts/ensure-tools.sh installs. No database: neither command reads one.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use slotpool::cli::manual::command_tree;

const BIN: &str = env!("CARGO_BIN_EXE_slotpool");

/// The binary run with an unreachable database: these commands must not need one.
fn slotpool(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env(
            "MONGODB_URI",
            "mongodb://127.0.0.1:9/none?serverSelectionTimeoutMS=200",
        )
        .env_remove("MONGODB_URI_FILE")
        .output()
        .expect("run slotpool")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = slotpool(args);
    assert!(
        out.status.success(),
        "slotpool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A tool the test needs, or a clear failure saying how to get it.
fn tool(name: &str) -> String {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .expect("run sh");
    assert!(
        found.status.success(),
        "{name} is not installed: scripts/ensure-tools.sh installs it (Debian: apt-get install {})",
        match name {
            "groff" => "groff-base",
            n => n,
        }
    );
    String::from_utf8_lossy(&found.stdout).trim().to_string()
}

/// Every visible command path below `slotpool`, parents before children, e.g.
/// `["robot"]`, `["robot", "create"]`.
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, at: &[String], out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            let mut path = at.to_vec();
            path.push(sub.get_name().to_string());
            out.push(path.clone());
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(&command_tree(), &[], &mut out);
    out
}

fn subcommand<'a>(tree: &'a clap::Command, path: &[String]) -> &'a clap::Command {
    path.iter().fold(tree, |cmd, word| {
        cmd.find_subcommand(word)
            .unwrap_or_else(|| panic!("no subcommand {word}"))
    })
}

/// The text of a roff page with its escapes for `-` and `'` undone, for plain
/// comparisons.
fn unroff(page: &str) -> String {
    page.replace("\\-", "-").replace("\\*(Aq", "'")
}

#[test]
fn every_command_has_a_manual_page_that_renders_cleanly() {
    let groff = tool("groff");
    let dir = tempdir();
    let listed = ok_stdout(&["man", "--out-dir", dir.to_str().unwrap()]);
    let mut expected: BTreeSet<String> = command_paths()
        .iter()
        .map(|p| format!("slotpool-{}.1", p.join("-")))
        .collect();
    expected.insert("slotpool.1".into());
    let written: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(written, expected, "one page per command, no other file");
    assert_eq!(
        listed.lines().count(),
        expected.len(),
        "it lists what it wrote:\n{listed}"
    );
    assert!(
        expected.len() > 20,
        "the tree looks too small: {expected:?}"
    );

    let tree = command_tree();
    for path in std::iter::once(Vec::new()).chain(command_paths()) {
        let file = if path.is_empty() {
            "slotpool.1".to_string()
        } else {
            format!("slotpool-{}.1", path.join("-"))
        };
        let page = std::fs::read_to_string(dir.join(&file)).unwrap();
        let plain = unroff(&page);
        let about = subcommand(&tree, &path)
            .get_about()
            .unwrap_or_else(|| panic!("slotpool {} has no description", path.join(" ")))
            .to_string();
        assert!(plain.contains(".SH NAME"), "{file}: no NAME section");
        assert!(plain.contains(".SH SYNOPSIS"), "{file}: no SYNOPSIS");
        assert!(
            plain.contains(&about),
            "{file} does not carry its command's description {about:?}"
        );
        assert!(
            plain.contains("slotpool 0.1.0") || plain.contains(env!("CARGO_PKG_VERSION")),
            "{file}: no version in its title line"
        );
        // The page printed for that command is the same page.
        let mut args = vec!["man"];
        args.extend(path.iter().map(String::as_str));
        assert_eq!(ok_stdout(&args), page, "slotpool {args:?}");
        // groff with every warning, UTF-8 input (-k): nothing to say.
        let rendered = Command::new(&groff)
            .args(["-k", "-man", "-Tutf8", "-ww", "-P-cbou"])
            .arg(dir.join(&file))
            .output()
            .unwrap();
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(
            rendered.status.success() && warnings.trim().is_empty(),
            "{file}: groff says:\n{warnings}"
        );
        let text = String::from_utf8_lossy(&rendered.stdout);
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{file} renders without its sections:\n{text}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_command_and_flag_says_what_it_is_for() {
    let tree = command_tree();
    let mut missing = Vec::new();
    for path in command_paths() {
        let cmd = subcommand(&tree, &path);
        let name = format!("slotpool {}", path.join(" "));
        if cmd.get_about().is_none() {
            missing.push(format!("{name}: no description"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if ["help", "version"].contains(&id) {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{name}: {id} has no help"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn bash_completes_every_command() {
    let bash = tool("bash");
    let script = ok_stdout(&["completion", "bash"]);
    let dir = tempdir();
    let file = dir.join("slotpool.bash");
    std::fs::write(&file, &script).unwrap();
    for path in command_paths() {
        let (word, parents) = path.split_last().unwrap();
        // What bash gives the function for `slotpool PARENTS PREFIX<TAB>`.
        let prefix = &word[..word.len().min(2)];
        let mut words = vec!["slotpool".to_string()];
        words.extend(parents.iter().cloned());
        words.push(prefix.to_string());
        let cword = words.len() - 1;
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let before = &words[cword - 1];
        let out = Command::new(&bash)
            .arg("-c")
            .arg(format!(
                "source '{}'; COMP_WORDS=({}); COMP_CWORD={cword}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; _slotpool slotpool '{prefix}' '{before}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                file.display(),
                quoted.join(" "),
                words.join(" "),
            ))
            .output()
            .unwrap();
        let offered = String::from_utf8_lossy(&out.stdout);
        assert!(
            offered.lines().any(|l| l.trim() == word),
            "bash does not complete `slotpool {} {prefix}` to {word}: offered {offered:?}, stderr {}",
            parents.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fish_completes_every_command() {
    let fish = tool("fish");
    let script = ok_stdout(&["completion", "fish"]);
    let dir = tempdir();
    let file = dir.join("slotpool.fish");
    std::fs::write(&file, &script).unwrap();
    for path in command_paths() {
        let (word, parents) = path.split_last().unwrap();
        let prefix = &word[..word.len().min(2)];
        let line = format!("slotpool {} {prefix}", parents.join(" "))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let out = Command::new(&fish)
            .arg("--no-config")
            .arg("-c")
            .arg(format!("source '{}'; complete -C '{line}'", file.display()))
            .output()
            .unwrap();
        let offered = String::from_utf8_lossy(&out.stdout);
        assert!(
            offered
                .lines()
                .any(|l| l.split('\t').next() == Some(word.as_str())),
            "fish does not complete `{line}` to {word}: offered {offered:?}, stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn zsh_completion_parses_and_names_every_command() {
    let zsh = tool("zsh");
    let script = ok_stdout(&["completion", "zsh"]);
    let dir = tempdir();
    let file = dir.join("_slotpool");
    std::fs::write(&file, &script).unwrap();
    let checked = Command::new(&zsh).arg("-n").arg(&file).output().unwrap();
    assert!(
        checked.status.success(),
        "zsh -n: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
    // Loaded into a zsh with its completion system, it defines the function.
    let loaded = Command::new(&zsh)
        .arg("-f")
        .arg("-c")
        .arg(format!(
            "autoload -Uz compinit && compinit -u -D && source '{}' && whence -w _slotpool",
            file.display()
        ))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&loaded.stdout).contains("_slotpool: function"),
        "zsh did not define _slotpool: {} {}",
        String::from_utf8_lossy(&loaded.stdout),
        String::from_utf8_lossy(&loaded.stderr)
    );
    for path in command_paths() {
        let word = path.last().unwrap();
        assert!(
            script.contains(&format!("'{word}:")),
            "the zsh completion does not offer {word} (slotpool {})",
            path.join(" ")
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_wrong_page_or_shell_is_refused_with_the_choices() {
    let out = slotpool(&["man", "robot", "nope"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing printed on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no subcommand \"nope\"") && err.contains("create"),
        "{err}"
    );
    let out = slotpool(&["man", "status", "extra"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no subcommands"));
    let out = slotpool(&["completion", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bash") && err.contains("zsh") && err.contains("fish"),
        "{err}"
    );
    let out = slotpool(&["man", "--out-dir", "/proc/no-such-dir/man"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot create /proc/no-such-dir/man"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "slotpool-manual-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(Path::new(&dir).is_dir());
    dir
}
