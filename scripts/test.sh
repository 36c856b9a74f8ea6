#!/usr/bin/env bash
# The project's test command: formatting, lints, and every test against a real
# MongoDB-wire server (the dev server, started if needed; or MONGODB_URI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Each phase says when it began (seconds since the start), so a slow run shows where.
phase() { echo "== [${SECONDS}s] $*"; }

phase "test database"
# Every dev server the suite starts (this one, and each a test starts of its own)
# runs behind mongod's rules and the audited table (scripts/devdb/serve.py), with
# mongod's test commands on (failpoints, step-down). Each writes the command shapes
# it saw to .state/shapes/; the run fails at the end if any was not audited.
export SLOTPOOL_DEV_TEST_COMMANDS=1
export SLOTPOOL_DEV_SHAPES="${SLOTPOOL_DEV_SHAPES:-enforce}"
rm -rf .state/shapes
# A throwaway server of its own (port SLOTPOOL_TEST_PORT, default 27778), fresh each
# run: the dev server's latency creeps up over a long process life, and tests should
# not depend on what the demo left behind. With MONGODB_URI set, that server is used.
if [[ -z "${MONGODB_URI:-}" ]]; then
  export SLOTPOOL_DEV_PORT="${SLOTPOOL_TEST_PORT:-27778}"
  trap 'env -u MONGODB_URI scripts/dev-mongo.sh stop >/dev/null 2>&1 || true' EXIT
  URI="$(scripts/dev-mongo.sh fresh)"
else
  URI="$MONGODB_URI"
fi
export MONGODB_URI="$URI"
echo "using $(echo "$URI" | sed -E 's#://([^:@/]+):[^@/]*@#://\1:****@#')"

phase "tools: mongosh (inspection tests), faketime (clock-skew chaos test)"
scripts/mongosh.sh --install-only >/dev/null
scripts/ensure-tools.sh

phase "cargo fmt --check"
cargo fmt --all -- --check

phase "cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings

phase "cargo test: build, and the examples as programs (tests/custom_kind.rs runs one)"
cargo test --all-targets --no-run --quiet
cargo build --examples --quiet

phase "container images (scripts/images.sh: the engine, the base, slotpool:local from the tests' binary, the dev database)"
# tests/containers.rs runs five worker containers on them; it fails without them. The
# worker image takes the binary the tests run (not a release build of its own).
SLOTPOOL_IMAGE_BINARY=target/debug/slotpool scripts/images.sh

phase "cargo test, two binaries at a time (scripts/test-lanes.py)"
# One binary after another keeps two cores a third busy: most tests wait on what
# they test. SLOTPOOL_TEST_LANES=1 runs them one at a time, as cargo test would.
python3 scripts/test-lanes.py -- "$@"
cargo test --doc --quiet

phase "command shapes: every one the suite sent is in docs/mongodb.md's audited table"
scripts/shapes.sh check
phase "done"
