#!/usr/bin/env bash
# Runs the real mongosh (installed from npm into .state/mongosh once).
#   scripts/mongosh.sh --install-only     install and print its path
#   scripts/mongosh.sh [mongosh args...]  e.g. scripts/mongosh.sh "$MONGODB_URI" --file scripts/inspect.js
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.state/mongosh"
BIN="$PREFIX/node_modules/.bin/mongosh"
VERSION="2.12.0"
source "$ROOT/scripts/retry.sh"
if [[ ! -x "$BIN" ]]; then
  echo "mongosh: installing mongosh@$VERSION from npm into $PREFIX (once)" >&2
  mkdir -p "$PREFIX"
  # --loglevel=error, not --silent: a failed fetch must say why (a CI run once
  # failed here with no message; the same install succeeded a minute later).
  retry "mongosh: npm install" npm install --loglevel=error --no-audit --no-fund \
    --prefix "$PREFIX" "mongosh@$VERSION" >&2
fi
if [[ "${1:-}" == "--install-only" ]]; then echo "$BIN"; exit 0; fi
exec "$BIN" "$@"
