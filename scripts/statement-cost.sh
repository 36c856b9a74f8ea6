#!/usr/bin/env bash
# What one robot write costs the dev server, by its form (update operators or an
# update pipeline): 1,000 robots, 10 statements a command, three rounds each.
#   scripts/statement-cost.sh
# Runs against a fresh throwaway dev server unless MONGODB_URI is set.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -z "${MONGODB_URI:-}" ]]; then
  export SLOTPOOL_DEV_PORT="${SLOTPOOL_BENCH_PORT:-27779}"
  trap 'env -u MONGODB_URI scripts/dev-mongo.sh stop >/dev/null 2>&1 || true' EXIT
  MONGODB_URI="$(scripts/dev-mongo.sh fresh)"
fi
exec .venv/bin/python scripts/statement-cost.py "$MONGODB_URI"
