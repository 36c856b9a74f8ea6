#!/usr/bin/env bash
# Benchmarks: takeover, handoff, orphan takeover without a standby, hand-back,
# rebalance, claim storm, per-tick database cost, restore rate,
# footprint, create rate, robot output at its worst, the web dashboard's cost and the leases under its load, an idle pool's requests, a tick sweep of takeovers with 1,000 robots, the adoption writes a takeover costs. Prints one table, writes it to docs/bench/runs/ and adds its line to BENCHMARKS.md.
#   scripts/bench.sh [--quick] [--only takeover,ctakeover,cpool,handoff,orphan,handback,rebalance,storm,cost,idle,sweep,adopt,standbys,create,output,restore,slots,web,webload,schedule,edge,scale,outage,placement,atscale]
#   scripts/bench.sh --statements   what one robot write costs the server, by its form
#                                   (update operators or a pipeline; scripts/statement-cost.py)
# Runs against a fresh throwaway dev server unless MONGODB_URI is set.
# The outage phase also runs a baseline given SLOTPOOL_BENCH_BASELINE_BIN, a release
# binary of the commit before suspension (SLOTPOOL_BENCH_BASELINE_LABEL names it):
#   git worktree add /tmp/base <commit> && (cd /tmp/base && cargo build --release)
#   SLOTPOOL_BENCH_BASELINE_BIN=/tmp/base/target/release/slotpool scripts/bench.sh --only outage
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${MONGODB_URI:-}" ]]; then
  export SLOTPOOL_DEV_PORT="${SLOTPOOL_BENCH_PORT:-27779}"
  # The scale phase's 200 workers keep about 850 connections open, near the dev
  # server's own limit of 1,000.
  export SLOTPOOL_DEV_MAX_CONNECTIONS="${SLOTPOOL_DEV_MAX_CONNECTIONS:-4000}"
  # mongod's test commands: the outage phase's step-down (replSetStepDown).
  export SLOTPOOL_DEV_TEST_COMMANDS=1
  # Its command shapes, apart from the tests' (reported at the end).
  export SLOTPOOL_DEV_SHAPES_DIR="$ROOT/.state/shapes-bench"
  rm -rf "$SLOTPOOL_DEV_SHAPES_DIR"
  trap 'env -u MONGODB_URI scripts/dev-mongo.sh stop >/dev/null 2>&1 || true' EXIT
  MONGODB_URI="$(scripts/dev-mongo.sh fresh)"
  export MONGODB_URI
  # The bench may restart this server of its own between phases.
  export SLOTPOOL_BENCH_OWN_SERVER=1
fi
if [[ "${1:-}" == "--statements" ]]; then
  .venv/bin/python scripts/statement-cost.py "$MONGODB_URI"
  exit
fi
cargo bench --bench pool -- "$@"
if [[ -n "${SLOTPOOL_DEV_SHAPES_DIR:-}" ]]; then
  # Every shape the phases sent, against docs/mongodb.md's audited table (the bench's
  # server records them, as the tests' does, but refuses none: SLOTPOOL_DEV_SHAPES
  # defaults to learn here).
  SLOTPOOL_SHAPES_SOFT=1 scripts/shapes.sh check
fi
