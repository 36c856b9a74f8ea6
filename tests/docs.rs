//! The docs hold together: every relative link and `#anchor` in README.md,
//! ARCHITECTURE.md, CHANGELOG.md, BENCHMARKS.md and docs/ resolves, nothing links
//! outside the repository by a relative path, and every subcommand and flag that
//! `--help` shows is in the CLI reference (docs/cli.md).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file the docs are made of.
fn doc_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CHANGELOG.md",
        "BENCHMARKS.md",
    ]
    .iter()
    .map(|f| root().join(f))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// GitHub's anchor for a heading's text: lower case, every character that is not a
/// letter, a digit, a space, `-` or `_` left out, and each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A file's links (outside code) and its headings' anchors, repeats numbered as
/// GitHub numbers them.
fn read(path: &Path) -> (Vec<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut links = Vec::new();
    let mut anchors = BTreeSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_default();
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            _ => {}
        }
    }
    (links, anchors)
}

#[test]
fn the_slug_rules_are_githubs() {
    assert_eq!(
        slug("Overflow, hand-back, and how many workers you need"),
        "overflow-hand-back-and-how-many-workers-you-need"
    );
    assert_eq!(
        slug("The web dashboard: slotpool web"),
        "the-web-dashboard-slotpool-web"
    );
    assert_eq!(slug("/api/v1"), "apiv1");
    assert_eq!(
        slug("The dev database's limits"),
        "the-dev-databases-limits"
    );
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let files = doc_files();
    let mut anchors_of: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    for f in &files {
        anchors_of.insert(f.canonicalize().unwrap(), read(f).1);
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for f in &files {
        let dir = f.parent().unwrap();
        for link in read(f).0 {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                f.clone()
            } else {
                dir.join(path)
            };
            let Ok(target) = target.canonicalize() else {
                broken.push(format!("{}: {link}: no such file", f.display()));
                continue;
            };
            if !target.starts_with(root().canonicalize().unwrap()) {
                broken.push(format!("{}: {link}: outside the repository", f.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let known = anchors_of.entry(target.clone()).or_insert_with(|| {
                    if target.extension().is_some_and(|x| x == "md") {
                        read(&target).1
                    } else {
                        BTreeSet::new()
                    }
                });
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{}: {link}: no heading with that anchor",
                        f.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 100,
        "only {checked} links checked: is the parser reading the files?"
    );
}

/// `slotpool ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_slotpool"))
        .args(args)
        .arg("--help")
        .output()
        .expect("slotpool runs");
    assert!(out.status.success(), "slotpool {args:?} --help failed");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The lines of one section of a help text (`Commands:`, `Options:`).
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| l.trim_end() != title)
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && l.starts_with(' '))
        .collect()
}

/// Every subcommand path under `path`, and every long flag each one takes.
fn walk(path: Vec<String>, out: &mut Vec<(Vec<String>, Vec<String>)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let flags = section(&text, "Options:")
        .iter()
        // The flag's own words, before the two spaces that begin its description.
        .map(|l| l.trim_start().split("  ").next().unwrap_or(""))
        .flat_map(|l| l.split([' ', ',', '=', '<', '[']))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .filter(|w| !matches!(*w, "--help" | "--version"))
        .map(str::to_string)
        .collect();
    out.push((path.clone(), flags));
    for line in section(&text, "Commands:") {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        // A description's continuation line is indented further.
        if name == "help" || line.len() - line.trim_start().len() > 4 {
            continue;
        }
        let mut sub = path.clone();
        sub.push(name.to_string());
        walk(sub, out);
    }
}

#[test]
fn every_subcommand_and_flag_is_in_the_cli_reference() {
    let reference = std::fs::read_to_string(root().join("docs/cli.md")).expect("docs/cli.md");
    let mut commands = Vec::new();
    walk(Vec::new(), &mut commands);
    assert!(
        commands.len() > 20,
        "only {} commands found",
        commands.len()
    );
    let mut missing = Vec::new();
    for (path, flags) in &commands {
        let name = format!("slotpool {}", path.join(" "));
        if !path.is_empty() && !reference.contains(&name) {
            missing.push(format!("`{name}`"));
        }
        for flag in flags {
            if !reference.contains(&format!("`{flag}")) {
                missing.push(format!("{flag} (of `{}`)", name.trim_end()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in docs/cli.md: {}",
        missing.join(", ")
    );
}
