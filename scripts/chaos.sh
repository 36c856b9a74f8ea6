#!/usr/bin/env bash
# The chaos suite on its own, against a fresh throwaway dev server.
#   scripts/chaos.sh            the default rounds (what CI runs, a few minutes)
#   scripts/chaos.sh --long     many more rounds (SLOTPOOL_CHAOS_ROUNDS, default 15)
# Each scenario prints its measured takeover times and the invariant checker's verdict.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ "${1:-}" == "--long" ]]; then export SLOTPOOL_CHAOS_ROUNDS="${SLOTPOOL_CHAOS_ROUNDS:-15}"; fi
scripts/ensure-tools.sh
if [[ -z "${MONGODB_URI:-}" ]]; then
  export SLOTPOOL_DEV_PORT="${SLOTPOOL_TEST_PORT:-27778}"
  trap 'env -u MONGODB_URI scripts/dev-mongo.sh stop >/dev/null 2>&1 || true' EXIT
  MONGODB_URI="$(scripts/dev-mongo.sh fresh)"
  export MONGODB_URI
fi
cargo test --test chaos -- --nocapture
