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
PACKAGE="schemathesis==4.32.5"
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/schemathesis.sh BASE_URL [schemathesis run options…]" >&2
  exit 2
fi
BASE="$1"
shift

source "$ROOT/scripts/py-tool.sh"
BIN="$(py_tool schemathesis "$PACKAGE")"

exec "$BIN/schemathesis" run "$BASE/api/v1/openapi.json" \
  --url "$BASE" \
  --no-color \
  --generation-database none \
  "$@"
