#!/usr/bin/env bash
# The dev MongoDB-wire server (SecantusDB, a single-node replica set on WiredTiger).
#
#   scripts/dev-mongo.sh [start]   install if needed, start if not running, print the URI
#   scripts/dev-mongo.sh stop      stop the server this script started
#   scripts/dev-mongo.sh status    say whether it answers
#   scripts/dev-mongo.sh uri       print the URI only
#   scripts/dev-mongo.sh fresh     stop, wipe its data, start again (what scripts/test.sh uses)
#
# With MONGODB_URI set, every command uses that server instead and starts nothing.
# Port: SLOTPOOL_DEV_PORT (default 27777). Data: .state/mongo-data (git-ignored).
#
# The server runs behind mongod's rules (scripts/devdb/serve.py): what mongod refuses
# and the dev server would take is refused as mongod refuses it. Every command shape
# seen goes to .state/shapes/; SLOTPOOL_DEV_SHAPES=enforce (what scripts/test.sh sets)
# also refuses one missing from docs/mongodb.md's audited table, the default `learn`
# only records (the demo's users type their own queries into mongosh), `off` skips it.
#
# SLOTPOOL_DEV_MAX_CONNECTIONS raises the server's limit of open connections (1,000,
# which its command line cannot change): a pool of 200 workers keeps about 850.
# SLOTPOOL_DEV_TEST_COMMANDS=1 turns on mongod's test commands (configureFailPoint),
# as the test suite does; SLOTPOOL_DEV_SERVER_ARGS adds the server's own flags
# (--auth, --standalone, --tls-cert-file ...); SLOTPOOL_DEV_REPORT_VERSION makes it
# name another MongoDB version (the suite's check of the minimum version), and
# SLOTPOOL_DEV_REPORT_ROUTER=1 makes it answer `hello` as mongos does.
# SLOTPOOL_DEV_RULES=off lets through what mongod refuses: only for a release older
# than 0.3 (its heartbeat is one), as scripts/upgrade-check.sh runs it.
# SLOTPOOL_DEV_URI_OPTIONS is appended to the URI printed (e.g. "&tls=true&tlsCAFile=
# ..." for a server started with --tls-*), SLOTPOOL_DEV_SHAPES_DIR moves the record
# of shapes (a test that sends an unaudited one on purpose keeps it out of the run's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.state"
VENV="$ROOT/.venv"
PORT="${SLOTPOOL_DEV_PORT:-27777}"
PIDFILE="$STATE/mongo-$PORT.pid"
LOG="$STATE/mongo-$PORT.log"
DATA="$STATE/mongo-data-$PORT"
PACKAGE="SecantusDB==0.7.0b3"
# retryWrites=false: this server keeps every retryable write's reply for 30 min and,
# past 10,000 of them, sorts all 10,000 on every write (secantus/transactions.py,
# _prune_retryable_locked): measured here, 0.65 ms per update flat without retryable
# writes, and with them 0.8 ms rising to 5 ms by the 9,000th and 15-20 ms past the
# 10,000th. A pool of 50 workers crosses that in minutes and then cannot renew in
# time. Every slotpool write is fenced and idempotent and is read back rather than
# resent, so nothing relies on the driver's one retry; on MongoDB, keep the default.
DEV_URI="mongodb://127.0.0.1:$PORT/slotpool?directConnection=true&retryWrites=false${SLOTPOOL_DEV_URI_OPTIONS:-}"

say() { echo "dev-mongo: $*" >&2; }

install() {
  if [[ -x "$VENV/bin/secantusd-py" ]]; then return; fi
  say "installing $PACKAGE into $VENV (once)"
  python3 -m venv "$VENV"
  source "$ROOT/scripts/retry.sh"
  retry "dev-mongo: pip install" \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --pre "$PACKAGE"
}

answers() {
  local uri="$1"
  "$VENV/bin/python" - "$uri" <<'PY' >/dev/null 2>&1
import sys, pymongo, pymongo.errors
try:
    pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=500).admin.command("ping")
except pymongo.errors.OperationFailure:
    pass  # it answers: a server with --auth refuses an unauthenticated ping
PY
}

running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

start() {
  if [[ -n "${MONGODB_URI:-}" ]]; then echo "$MONGODB_URI"; return; fi
  install
  mkdir -p "$STATE"
  if running_pid >/dev/null && answers "$DEV_URI"; then echo "$DEV_URI"; return; fi
  if answers "$DEV_URI"; then
    say "something already answers on port $PORT; using it"
    echo "$DEV_URI"; return
  fi
  say "starting SecantusDB on 127.0.0.1:$PORT (data: $DATA, log: $LOG)"
  # A session of its own: a terminal's Ctrl-C (SIGINT to the caller's whole process
  # group, e.g. the demo's) must not take the database down under the workers.
  local server=("$VENV/bin/python" "$ROOT/scripts/devdb/serve.py"
    --shapes "${SLOTPOOL_DEV_SHAPES:-learn}" --shapes-dir "${SLOTPOOL_DEV_SHAPES_DIR:-$STATE/shapes}"
    --audited "$ROOT/docs/mongodb.md")
  if [[ -n "${SLOTPOOL_DEV_MAX_CONNECTIONS:-}" ]]; then
    server+=(--max-connections "$SLOTPOOL_DEV_MAX_CONNECTIONS")
  fi
  if [[ -n "${SLOTPOOL_DEV_REPORT_VERSION:-}" ]]; then
    server+=(--report-version "$SLOTPOOL_DEV_REPORT_VERSION")
  fi
  if [[ "${SLOTPOOL_DEV_REPORT_ROUTER:-}" == 1 ]]; then server+=(--report-router); fi
  if [[ "${SLOTPOOL_DEV_RULES:-mongod}" == off ]]; then server+=(--rules off); fi
  local flags=()
  if [[ "${SLOTPOOL_DEV_TEST_COMMANDS:-}" == 1 ]]; then flags+=(--enable-test-commands); fi
  if [[ -n "${SLOTPOOL_DEV_SERVER_ARGS:-}" ]]; then
    local more
    read -ra more <<<"$SLOTPOOL_DEV_SERVER_ARGS"
    flags+=("${more[@]}")
  fi
  # SLOTPOOL_DEV_SERVER_ENV: space-separated NAME=VALUE pairs for the server process
  # alone (tests put it under libfaketime this way: preloaded into this script, it
  # made every helper process share, and sometimes lose, its semaphore).
  if [[ -n "${SLOTPOOL_DEV_SERVER_ENV:-}" ]]; then
    local extra
    read -ra extra <<<"$SLOTPOOL_DEV_SERVER_ENV"
    server=(env "${extra[@]}" "${server[@]}")
  fi
  setsid nohup "${server[@]}" -- --host 127.0.0.1 --port "$PORT" --storage-path "$DATA" \
    --log-level WARNING "${flags[@]}" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 120); do
    if answers "$DEV_URI"; then echo "$DEV_URI"; return; fi
    if ! running_pid >/dev/null; then
      say "the server exited; last lines of $LOG:"; tail -n 20 "$LOG" >&2; exit 1
    fi
    sleep 0.5
  done
  say "the server did not answer within 60 s; see $LOG"; exit 1
}

stop() {
  if [[ -n "${MONGODB_URI:-}" ]]; then say "MONGODB_URI is set: not stopping a server this script did not start"; return; fi
  local pid
  if pid="$(running_pid)"; then
    kill "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    say "stopped (pid $pid)"
  else
    say "not running"
  fi
  rm -f "$PIDFILE"
}

status() {
  local uri="${MONGODB_URI:-$DEV_URI}"
  install
  if answers "$uri"; then say "up: $uri"; else say "down: nothing answers at $uri"; exit 1; fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  uri) echo "${MONGODB_URI:-$DEV_URI}" ;;
  fresh)
    if [[ -n "${MONGODB_URI:-}" ]]; then echo "$MONGODB_URI"; exit 0; fi
    stop 2>/dev/null; rm -rf "$DATA"; start ;;
  *) say "usage: $0 [start|stop|status|uri|fresh]"; exit 2 ;;
esac
