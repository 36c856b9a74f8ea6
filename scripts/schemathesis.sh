#!/usr/bin/env bash
# Drives a live `slotpool web` with Schemathesis (PyPI), from the OpenAPI document
# it serves: generated valid and invalid requests to every operation, then stateful
# sequences along the document's links (create a robot, then read, act on, update
# and delete it). Every answer is checked against the document: a documented status,
# a documented body and content type, no server error, refused invalid input.
#
#   scripts/schemathesis.sh BASE_URL [schemathesis run options…]
#       e.g. scripts/schemathesis.sh http://127.0.0.1:8080 -H "Authorization: Bearer $T"
#
# Installs schemathesis into .state/schemathesis/ (a venv of its own) on first use.
# tests/openapi.rs runs it in CI; its figures are in BENCHMARKS.md's security notes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.state/schemathesis"
PACKAGE="schemathesis==4.32.5"
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/schemathesis.sh BASE_URL [schemathesis run options…]" >&2
  exit 2
fi
BASE="$1"
shift

# One install at a time: tests run in parallel, and two at once would each remove
# the other's half-made venv.
mkdir -p "$ROOT/.state"
exec 9>"$ROOT/.state/schemathesis.lock"
flock 9
if [[ ! -x "$VENV/bin/schemathesis" ]]; then
  echo "schemathesis: installing $PACKAGE into $VENV (once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  source "$ROOT/scripts/retry.sh"
  retry "schemathesis: pip install" \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$PACKAGE"
fi
flock -u 9

exec "$VENV/bin/schemathesis" run "$BASE/api/v1/openapi.json" \
  --url "$BASE" \
  --no-color \
  --generation-database none \
  "$@"
