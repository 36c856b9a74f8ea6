// slotpool inspection for mongosh. Read-only.
//
//   scripts/mongosh.sh "$MONGODB_URI" --quiet --file scripts/inspect.js
//   scripts/mongosh.sh "$MONGODB_URI" --quiet --eval 'var staleSeconds = 10' --file scripts/inspect.js
//
// Ages are measured against the server's clock (hello.localTime), like the leases.

const staleMs = (typeof staleSeconds === 'number' ? staleSeconds : 30) * 1000;
const eventCount = typeof events === 'number' ? events : 10;
const now = db.hello().localTime.getTime();

function age(date) {
  if (!(date instanceof Date)) return '-';
  const ms = now - date.getTime();
  return ms < 1000 ? ms + 'ms' : (ms / 1000).toFixed(1) + 's';
}

function table(header, rows) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cells) => cells.map((c, i) => String(c).padEnd(widths[i])).join('  ').trimEnd();
  print(line(header));
  rows.forEach((r) => print(line(r)));
}

const robotsPerSlot = {};
db.robots.aggregate([{ $group: { _id: '$slot_id', n: { $sum: 1 } } }]).forEach((g) => {
  robotsPerSlot[g._id] = g.n;
});

print('== slots (' + db.getName() + ')');
table(
  ['SLOT', 'STATE', 'HOLDER', 'EPOCH', 'LEASE AGE', 'ROBOTS'],
  db.slots.find().sort({ _id: 1 }).toArray().map((s) => {
    const lease = typeof s.lease_ms === 'number' ? s.lease_ms : Number(s.lease_ms || 0);
    const live = s.owner && s.time instanceof Date && now - s.time.getTime() <= lease;
    const state = s.draining ? (live ? 'draining' : 'drained') : live ? 'held' : s.owner ? 'expired' : 'free';
    return [s._id, state, s.owner || '-', String(s.epoch), age(s.time), robotsPerSlot[s._id] || 0];
  })
);

print('');
print('== workers');
table(
  ['WORKER', 'SLOT', 'LAST SEEN'],
  db.workers.find().sort({ _id: 1 }).toArray().map((w) => [w._id, w.slot_id || 'standby', age(w.last_seen)])
);

print('');
print('== stale robots (not running, or no checkpoint for ' + staleMs / 1000 + 's)');
const stale = db.robots
  .find({ paused: { $ne: true } }, { name: 1, slot_id: 1, status: 1, error: 1, checkpointed_at: 1 })
  .sort({ name: 1 })
  .toArray()
  .filter((r) => r.status !== 'running' || !(r.checkpointed_at instanceof Date) || now - r.checkpointed_at.getTime() > staleMs);
if (stale.length === 0) print('none');
else
  table(
    ['ROBOT', 'SLOT', 'STATUS', 'LAST CHECKPOINT', 'ERROR'],
    stale.map((r) => [r.name, r.slot_id, r.status, age(r.checkpointed_at), r.error || ''])
  );

print('');
print('== recent events');
const recent = db.events.find().sort({ $natural: -1 }).limit(eventCount).toArray().reverse();
if (recent.length === 0) print('none');
else
  table(
    ['AGE', 'KIND', 'WORKER', 'SLOT', 'EPOCH', 'ROBOT'],
    recent.map((e) => [age(e.at), e.kind, e.worker || '-', e.slot_id || '-', e.epoch == null ? '-' : String(e.epoch), e.robot || '-'])
  );
