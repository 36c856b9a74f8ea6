#!/usr/bin/env bash
# The demo: the dev database, 3 slots, 5 workers, a few robots, the web dashboard
# (http://127.0.0.1:8080/, read-only) and a live status view. Ctrl-C stops every worker gracefully (robots checkpoint, slots released) and
# leaves nothing running but the dev database (stop it: scripts/dev-mongo.sh stop).
#
#   scripts/demo.sh            # on the embedded dev database
#   MONGODB_URI=... scripts/demo.sh
#   DEMO_WORKERS=7 DEMO_SLOTS=3 scripts/demo.sh
#   DEMO_WEB=127.0.0.1:9090 scripts/demo.sh    # the dashboard elsewhere
#   DEMO_BIN=target/release/slotpool scripts/demo.sh   # a binary already built (no build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORKERS="${DEMO_WORKERS:-5}"
SLOTS="${DEMO_SLOTS:-3}"
BASE_PORT="${DEMO_BASE_PORT:-7701}"
WEB="${DEMO_WEB:-127.0.0.1:8080}"
LOGS="$ROOT/.state/demo"
mkdir -p "$LOGS"

if [[ -n "${DEMO_BIN:-}" ]]; then
  BIN="$DEMO_BIN"
  [[ -x "$BIN" ]] || { echo "demo: DEMO_BIN=$BIN is not an executable file" >&2; exit 2; }
  echo "== using $BIN"
else
  echo "== building slotpool"
  cargo build --quiet
  BIN="$ROOT/target/debug/slotpool"
fi

export MONGODB_URI="${MONGODB_URI:-$(scripts/dev-mongo.sh start | sed 's#/slotpool?#/slotpool_demo?#')}"
echo "== database: $(echo "$MONGODB_URI" | sed -E 's#://([^:@/]+):[^@/]*@#://\1:****@#')"
"$BIN" init --slots "$SLOTS"

pids=()
cleanup() {
  trap - INT TERM EXIT
  # Stop the workers even if our output is gone (a closed pipe or terminal).
  trap '' PIPE
  set +e
  echo
  echo "== stopping $WORKERS workers and the dashboard (SIGTERM: robots checkpoint, slots are released)"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  echo "== all workers stopped; logs in $LOGS; the dev database keeps running (scripts/dev-mongo.sh stop)"
}
# Ctrl-C or SIGTERM at any point, setup included: stop everything and end here (a
# trap that only cleaned up would let the script carry on without its workers).
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT

for i in $(seq 0 $((WORKERS - 1))); do
  port=$((BASE_PORT + i))
  # Own session: Ctrl-C reaches only this script, which stops workers one by one.
  setsid "$BIN" worker --advertise "127.0.0.1:$port" --exec-allow "$ROOT/examples/robots/" >"$LOGS/worker-$port.log" 2>&1 &
  pids+=($!)
done
echo "== started $WORKERS workers on ports $BASE_PORT..$((BASE_PORT + WORKERS - 1)) (try: curl localhost:$BASE_PORT/metrics)"
setsid "$BIN" web --listen "$WEB" >"$LOGS/web.log" 2>&1 &
pids+=($!)
echo "== dashboard: http://$WEB/ (read-only; if it is not there, see $LOGS/web.log)"

# A few robots, unless they already exist from an earlier demo.
if ! "$BIN" robot show counter-1 >/dev/null 2>&1; then
  "$BIN" robot create --name counter --kind counter --interval-ms 500 --count 6
  "$BIN" robot create --name heartbeat --kind exec --command "$ROOT/examples/robots/heartbeat.sh" --count 2
fi

echo "== live status (Ctrl-C to stop); kill a holder from another shell to watch the takeover:"
echo "   kill -9 \$(pgrep -f 'advertise 127.0.0.1:$BASE_PORT')"
sleep 2
# The view keeps watching through a database outage, saying so on screen, while the
# holders ride it out. Should it end any other way, the workers are not stopped for
# it: only Ctrl-C stops them.
until "$BIN" status --watch 1; do
  echo "== the status view ended (above); the workers keep running. Ctrl-C stops them; the view starts again in 5 s"
  sleep 5
done
