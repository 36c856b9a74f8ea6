#!/bin/bash
# Starts N release workers at once (default 200) straight at the dev server (no
# proxy), over 20 slots of a fresh database, and prints each worker's and the
# server's CPU as the start goes on, then how many workers fenced themselves in the
# first 15 s, and when every slot was first held. A/B comparisons: BIN=path/to/an/older/slotpool scripts/cold-start-fences.sh
# Needs the dev server (scripts/dev-mongo.sh start) and a release build.
#
#   scripts/cold-start-fences.sh [N]
set -euo pipefail
N=${1:-200}
cd "$(dirname "$0")/.."
B=${BIN:-target/release/slotpool}
PORT=${SLOTPOOL_DEV_PORT:-27777}
export MONGODB_URI="mongodb://127.0.0.1:$PORT/coldstart$RANDOM?directConnection=true&retryWrites=false"
pidfile=.state/mongo-$PORT.pid
if ! server=$(cat "$pidfile" 2>/dev/null) || ! kill -0 "$server" 2>/dev/null; then
  echo "no dev server on port $PORT: start it with scripts/dev-mongo.sh start" >&2
  exit 1
fi
"$B" init --slots 20 >/dev/null
cpu() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
logs=$(mktemp -d)
s0=$(cpu "$server")
t0=$(date +%s.%N)
pids=()
for i in $(seq 1 "$N"); do
  p=$((40000 + i))
  SLOTPOOL_LOG=info,slotpool=debug "$B" worker --advertise "127.0.0.1:$p" --listen "127.0.0.1:$p" \
    >"$logs/worker-$p.log" 2>&1 &
  pids+=($!)
done
for s in 1 2 4 6 8 10 15; do
  left=$(echo "$t0 + $s - $(date +%s.%N)" | bc)
  [[ $left == -* ]] || sleep "$left"
  w=0
  for p in "${pids[@]}"; do w=$((w + $(cpu "$p"))); done
  echo "t=${s}s workers' CPU $(echo "scale=2; $w/100" | bc) s, server's $(echo "scale=2; ($(cpu "$server") - $s0)/100" | bc) s"
done
{
  kill -9 "${pids[@]}" || true
  wait "${pids[@]}" || true
} 2>/dev/null
echo "workers that fenced themselves: $(grep -l "self-fenced" "$logs"/*.log | wc -l) of $N (logs: $logs)"
# When each slot was first claimed, from the workers' own log times (UTC, within
# one day).
start=$(date -u -d "@$t0" +%H:%M:%S.%N)
grep -h "claimed slot slot=" "$logs"/*.log | awk -v start="$start" '
  function secs(hms,  p) { split(hms, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
  BEGIN { t0 = secs(start) }
  { ts = substr($1, 12); sub(/Z$/, "", ts); t = secs(ts)
    match($0, /slot=slot-[0-9]+/); s = substr($0, RSTART + 5, RLENGTH - 5)
    if (!(s in first) || t < first[s]) first[s] = t }
  END { n = 0; last = 0; for (s in first) { n++; if (first[s] - t0 > last) last = first[s] - t0 }
        printf "slots claimed: %d; every one first held %.2f s after the first start\n", n, last }'
echo "claims in all: $(grep -h "claimed slot slot=" "$logs"/*.log | wc -l)"
