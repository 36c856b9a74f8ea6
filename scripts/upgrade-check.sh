#!/usr/bin/env bash
# The rolling upgrade README's "Upgrading" promises, from the previous release to
# this tree (tests/upgrade.rs): five old workers over three slots with counters,
# exec robots and a scheduled one; each replaced by a new worker, then SIGTERM; the
# new CLI creating and updating robots halfway; the new `init` at the end; the
# invariant and firing checkers after. Run it before each release and say in the
# CHANGELOG that it passed.
#
#   scripts/upgrade-check.sh           from the previous release: the newest release
#                                      tag behind HEAD (the one before it, when HEAD
#                                      is itself a release's commit)
#   scripts/upgrade-check.sh v0.2.0    from that tag
#
# The old release is built once, from `git archive` of its tag, into
# .state/upgrade/TAG (a release build of its own: several minutes the first time).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "upgrade-check: $*" >&2; }
previous() {
  local base=HEAD
  if git describe --tags --exact-match --match 'v*' HEAD >/dev/null 2>&1; then base=HEAD^; fi
  git describe --tags --abbrev=0 --match 'v*' "$base" 2>/dev/null || true
}
from="${1:-$(previous)}"
if [[ -z "$from" ]]; then
  say "no release tag behind HEAD to upgrade from (git tag -l 'v*': $(git tag --list 'v*' | tr '\n' ' '); a clone without tags: git fetch --tags)"
  exit 2
fi
if ! git rev-parse -q --verify "refs/tags/$from" >/dev/null; then
  say "no tag $from (git tag -l 'v*': $(git tag --list 'v*' | tr '\n' ' '))"
  exit 2
fi
dir="$ROOT/.state/upgrade/$from"
bin="$dir/target/release/slotpool"
if [[ ! -x "$bin" ]]; then
  say "building $from into $dir"
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git archive "$from" | tar -x -C "$dir/src"
  (cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo build --release --locked --bin slotpool)
fi
scripts/ensure-tools.sh
say "from $from ($("$bin" --version)) to this tree ($(git describe --tags --always --dirty))"
SLOTPOOL_UPGRADE_FROM="$bin" cargo test --test upgrade -- --ignored --nocapture
say "passed: a rolling upgrade from $from to $(git describe --tags --always --dirty)"
