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

// A slot is live while its lease runs, on the server's clock; a robot's stored status is
// what its last holder wrote, so it is believed only while that holder's lease is live.
const slotState = {};
const slots = db.slots.find().sort({ _id: 1 }).toArray();
slots.forEach((s) => {
  const lease = typeof s.lease_ms === 'number' ? s.lease_ms : Number(s.lease_ms || 0);
  const live = s.owner && s.time instanceof Date && now - s.time.getTime() <= lease;
  const state = s.draining ? (live ? 'draining' : 'drained') : live ? 'held' : s.owner ? 'expired' : 'free';
  slotState[s._id] = { state: state, holder: live ? s.owner : null };
});

function robotState(r) {
  // Given up on by its restart policy: held like a paused robot (robot resume NAME).
  if (r.paused === true && r.status === 'failed') return 'failed';
  if (r.paused === true) return 'paused';
  const s = slotState[r.slot_id];
  if (!s) return 'waiting (no slot ' + r.slot_id + ')';
  if (!s.holder) return 'waiting (' + r.slot_id + ' ' + s.state + ')';
  if (r.worker !== s.holder) return 'starting';
  return r.status;
}

print('== slots (' + db.getName() + ')');
table(
  ['SLOT', 'STATE', 'HOLDER', 'EPOCH', 'LEASE AGE', 'ROBOTS'],
  slots.map((s) => [s._id, slotState[s._id].state, slotState[s._id].holder || '-', String(s.epoch), age(s.time), robotsPerSlot[s._id] || 0])
);

print('');
print('== workers');
table(
  ['WORKER', 'SLOTS', 'LAST SEEN'],
  db.workers
    .find()
    .sort({ _id: 1 })
    .toArray()
    .map((w) => [w._id, (Array.isArray(w.slots) && w.slots.length ? w.slots.join(',') : w.slot_id) || 'standby', age(w.last_seen)])
);

print('');
print('== stale robots (not running, or no checkpoint for ' + staleMs / 1000 + 's)');
const stale = db.robots
  .find({ $or: [{ paused: { $ne: true } }, { status: 'failed' }] }, { name: 1, slot_id: 1, status: 1, error: 1, worker: 1, paused: 1, checkpointed_at: 1 })
  .sort({ name: 1 })
  .toArray()
  .filter((r) => robotState(r) !== 'running' || !(r.checkpointed_at instanceof Date) || now - r.checkpointed_at.getTime() > staleMs);
if (stale.length === 0) print('none');
else
  table(
    ['ROBOT', 'SLOT', 'STATE', 'LAST CHECKPOINT', 'ERROR'],
    stale.map((r) => [r.name, r.slot_id, robotState(r), age(r.checkpointed_at), r.error || ''])
  );

print('');
print('== updates waiting for their holder (robot update)');
const waiting = db.robots.find({ update: { $type: 'object' } }, { name: 1, slot_id: 1, update: 1 }).sort({ name: 1 }).toArray();
if (waiting.length === 0) print('none');
else table(['ROBOT', 'SLOT', 'NEW KIND'], waiting.map((r) => [r.name, r.slot_id, String(r.update.kind)]));

print('');
print('== recent events');
const recent = db.events.find().sort({ $natural: -1 }).limit(eventCount).toArray().reverse();
if (recent.length === 0) print('none');
else
  table(
    ['AGE', 'KIND', 'WORKER', 'SLOT', 'EPOCH', 'ROBOT'],
    recent.map((e) => [age(e.at), e.kind, e.worker || '-', e.slot_id || '-', e.epoch == null ? '-' : String(e.epoch), e.robot || '-'])
  );
