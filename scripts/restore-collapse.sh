#!/bin/bash
# A first start of many robots a slot on the dev server, without the bench's proxy:
# SLOTS slots, SLOTS + 2 release workers (one each, two standbys), then
# `robot create --count ROBOTS` at once. Every 5 s, for WATCH s (default 60), it
# prints how many checkpoints the workers have written (read from their own
# /metrics, not from the server being watched; a robot restored again after a
# fence counts again) and how many self-fences their logs show; then the events the
# pool recorded, by kind. With PROFILE=1, also the server's profile of the commands
# slower than 100 ms, by kind (each command's time includes its wait for its
# collection's write lock). The profile is a capped collection, and the dev server
# scans a capped collection whole on every insert into it: profiling loads the
# server it measures, more as it fills. LOG sets the workers' SLOTPOOL_LOG (default
# info,slotpool=debug; slotpool::db::group_commit=trace adds each robot write's
# size and time). Needs the dev server
# (scripts/dev-mongo.sh start) and a release build.
#
#   scripts/restore-collapse.sh [SLOTS [ROBOTS]]      (default 20 and 20000)
set -euo pipefail
SLOTS=${1:-20}
ROBOTS=${2:-20000}
WATCH=${WATCH:-60}
cd "$(dirname "$0")/.."
B=${BIN:-target/release/slotpool}
PORT=${SLOTPOOL_DEV_PORT:-27777}
DB=collapse$RANDOM
export MONGODB_URI="mongodb://127.0.0.1:$PORT/$DB?directConnection=true&retryWrites=false"
pidfile=.state/mongo-$PORT.pid
if ! server=$(cat "$pidfile" 2>/dev/null) || ! kill -0 "$server" 2>/dev/null; then
  echo "no dev server on port $PORT: start it with scripts/dev-mongo.sh start" >&2
  exit 1
fi
py() { .venv/bin/python -c "$1"; }
"$B" init --slots "$SLOTS" >/dev/null
if [ "${PROFILE:-0}" = 1 ]; then
  py "from pymongo import MongoClient; MongoClient('$MONGODB_URI')['$DB'].command('profile', 1, slowms=100)"
fi
logs=$(mktemp -d)
pids=()
cleanup() {
  if [ "${#pids[@]}" -gt 0 ]; then kill "${pids[@]}" 2>/dev/null || true; fi
  py "from pymongo import MongoClient; MongoClient('$MONGODB_URI').drop_database('$DB')" || true
}
trap cleanup EXIT
for i in $(seq 1 $((SLOTS + 2))); do
  p=$((41000 + i))
  SLOTPOOL_LOG=${LOG:-info,slotpool=debug} "$B" worker --advertise "127.0.0.1:$p" --listen "127.0.0.1:$p" \
    >"$logs/worker-$p.log" 2>&1 &
  pids+=($!)
done
held=0
for _ in $(seq 1 60); do
  held=$(py "from pymongo import MongoClient; print(MongoClient('$MONGODB_URI')['$DB'].slots.count_documents({'owner': {'\$ne': None}}))")
  [ "$held" = "$SLOTS" ] && break
  sleep 1
done
echo "$held of $SLOTS slots held; creating $ROBOTS robots"
t0=$(date +%s.%N)
"$B" robot create --name r --kind counter --count "$ROBOTS" \
  --spec '{"interval_ms": 600000, "eager": true}' >/dev/null
printf 'created in %.1f s\n' "$(echo "$(date +%s.%N) - $t0" | bc)"
end=$(( $(date +%s) + WATCH ))
while [ "$(date +%s)" -lt "$end" ]; do
  # Counted on the workers' own /metrics, not on the server being watched (a
  # count of 20,000 robots is a long read, and reads are what hold renewals up).
  n=$(.venv/bin/python - "$SLOTS" <<'PY'
import sys, urllib.request
total = 0
for i in range(1, int(sys.argv[1]) + 3):
    try:
        page = urllib.request.urlopen(f"http://127.0.0.1:{41000 + i}/metrics", timeout=2).read().decode()
    except OSError:
        continue
    for line in page.splitlines():
        if line.startswith("slotpool_checkpoints_total "):
            total += int(float(line.split()[1]))
print(total)
PY
)
  f=$(cat "$logs"/worker-*.log | grep -c "self-fenced" || true)
  printf '+%3.0f s: %6d checkpoints written (of %d robots); self-fences %d\n' \
    "$(echo "$(date +%s.%N) - $t0" | bc)" "$n" "$ROBOTS" "$f"
  sleep 5
done
kill "${pids[@]}" 2>/dev/null || true
pids=()
.venv/bin/python - "$MONGODB_URI" "$DB" <<'PY'
import collections, sys
from pymongo import MongoClient
db = MongoClient(sys.argv[1])[sys.argv[2]]
kinds = collections.defaultdict(list)
for p in db["system.profile"].find() if "system.profile" in db.list_collection_names() else []:
    kinds[(p.get("ns", "").split(".", 1)[-1], next(iter(p.get("command") or {}), "?"))].append(p.get("millis", 0))
if kinds:
    print("commands slower than 100 ms, by collection and command: count, median ms, slowest ms")
for (ns, cmd), ms in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
    ms.sort()
    print(f"  {ns:10} {cmd:15} {len(ms):5} {ms[len(ms) // 2]:6} {ms[-1]:6}")
shapes = collections.defaultdict(list)
for p in db["system.profile"].find({"ns": {"$regex": r"\.robots$"}, "command.update": {"$exists": True}}) if kinds else []:
    ups = p["command"].get("updates") or [{}]
    first = ups[0]
    u = first.get("u")
    u_keys = sorted((u[0] if isinstance(u, list) and u else u or {}).keys())
    shapes[(len(ups), tuple(sorted(first.get("q", {}).keys())), tuple(u_keys), bool(first.get("multi")))].append(p.get("millis", 0))
if shapes:
    print("robot updates slower than 100 ms, by shape (statements, filter fields, update, multi): count, median ms, slowest ms")
for shape, ms in sorted(shapes.items(), key=lambda kv: -len(kv[1]))[:12]:
    ms.sort()
    print(f"  {len(ms):5} {ms[len(ms) // 2]:6} {ms[-1]:6}  {shape}")
print("events recorded, by kind:", {e["_id"]: e["n"] for e in db.events.aggregate(
    [{"$group": {"_id": "$kind", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}])})
PY
echo "worker logs: $logs"
