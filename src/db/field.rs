//! The names of stored fields, one constant each, so that a filter, the update it
//! guards and every reader of the result (the worker, the CLI, the dashboard) cannot
//! disagree on a spelling. Aggregation paths (`"$seq"`) are written out beside their
//! pipelines; the names of JSON answers (`--json`, `/api/v1`) are the answers' own.
//! The collections' shapes are in `schemas/` and docs/protocol.md.

// Fencing and placement.

/// A robot's slot; also the slot named in `workers` and `events` documents.
pub(crate) const SLOT_ID: &str = "slot_id";
/// A slot's fencing token, raised by every claim; a robot's copy of its holder's.
pub(crate) const EPOCH: &str = "epoch";
/// A robot's own fencing token, raised by every adoption.
pub(crate) const GEN: &str = "gen";
/// How many checkpoints a robot has written; each is conditioned on the one before.
pub(crate) const SEQ: &str = "seq";
/// A slot's holder, `ip:port`, or null.
pub(crate) const OWNER: &str = "owner";
/// The token of the last group-commit write that landed on a robot.
pub(crate) const WRITE_ID: &str = "write_id";
/// How many robots a slot says it has (healed against the robots themselves).
pub(crate) const ROBOT_COUNT: &str = "robot_count";
/// A slot's revision: any change to its robots raises it.
pub(crate) const REV: &str = "rev";

// Slots.
/// The holder's address, split for the survey's hash (`owner` is `ip:port`).
pub(crate) const IP: &str = "ip";
pub(crate) const PORT: &str = "port";
/// When a slot was last released (server clock).
pub(crate) const RELEASED_AT: &str = "released_at";
/// True on a slot that `init` is removing (a pool shrinking): no new robot.
pub(crate) const RETIRING: &str = "retiring";
/// When a slot was last claimed or renewed (server clock), or null once released.
pub(crate) const TIME: &str = "time";
/// `time + L` in server-clock milliseconds: what the survey's index orders by.
pub(crate) const EXPIRES_MS: &str = "expires_ms";
/// The holder's lease `L` in milliseconds, written at its claim.
pub(crate) const LEASE_MS: &str = "lease_ms";
/// The holder's `--suspend-for` (ms), written at its claim.
pub(crate) const SUSPEND_MS: &str = "suspend_ms";
/// True while an operator drains a slot: no claim, no new robot.
pub(crate) const DRAINING: &str = "draining";

// Robots.
/// A robot's unique name.
pub(crate) const NAME: &str = "name";
/// A robot's kind (`counter`, `exec`, a library's own); also an event's kind.
pub(crate) const KIND: &str = "kind";
/// A robot's configuration, as its kind reads it.
pub(crate) const SPEC: &str = "spec";
/// The schedule in a robot's spec (`spec.schedule`; see `robot::schedule`).
pub(crate) const SPEC_SCHEDULE: &str = "spec.schedule";
/// A robot's persisted state: the last checkpoint.
pub(crate) const CONTEXT: &str = "context";
/// `pending`, `running`, `restarting`, `failed`, `paused`.
pub(crate) const STATUS: &str = "status";
/// Why a robot last failed or restarted, or null.
pub(crate) const ERROR: &str = "error";
/// True while an operator paused a robot.
pub(crate) const PAUSED: &str = "paused";
/// How many times a robot restarted on its current holder.
pub(crate) const RESTARTS: &str = "restarts";
/// When the robot's last runs ended by themselves (server milliseconds, oldest
/// first, at most [`crate::db::robot_doc::ENDS_KEPT`]): its restart budget's
/// window, kept with the robot so a takeover or a move does not reset it.
pub(crate) const RECENT_ENDS: &str = "recent_ends";
/// Raised by every `robot restart` (and update): an instance started under another
/// value stops after a last checkpoint, and a new one starts under a new generation.
pub(crate) const START_REV: &str = "start_rev";
/// An update asked for and not yet judged by the robot's holder: `{id, kind, spec}`.
pub(crate) const UPDATE: &str = "update";
/// The holder's answer to the last update: `{id, applied, why, worker, at}`.
pub(crate) const UPDATE_RESULT: &str = "update_result";
/// The worker (`ip:port`) running a robot; also the worker named in an event.
pub(crate) const WORKER: &str = "worker";
/// The resource limits an exec robot's shim applied, and how
/// ([`crate::robot::limits::Applied`]); absent when none.
pub(crate) const APPLIED_LIMITS: &str = "applied_limits";
/// When a robot was created (server clock).
pub(crate) const CREATED_AT: &str = "created_at";
/// When a robot's last checkpoint landed (server clock).
pub(crate) const CHECKPOINTED_AT: &str = "checkpointed_at";

/// A robot's checkpoint records, when its spec asks for them: each
/// `{seq, epoch, gen, worker, slot, at}`.
pub(crate) const HISTORY: &str = "history";
/// The slot a checkpoint record was written on.
pub(crate) const SLOT: &str = "slot";
/// When a robot's status was last written (server clock).
pub(crate) const STATUS_AT: &str = "status_at";
/// How an exec robot's process tree is contained (a cgroup, a PID namespace …).
pub(crate) const CONTAINMENT: &str = "containment";

// Workers.
/// A worker process's random id: two processes with one identity never share it.
pub(crate) const INSTANCE: &str = "instance";
pub(crate) const NETNS: &str = "netns";
/// Every slot a worker holds.
pub(crate) const SLOTS: &str = "slots";
/// How many slots a worker holds.
pub(crate) const HELD: &str = "held";
/// True while a worker may take another slot.
pub(crate) const ROOM: &str = "room";
/// A worker's `--max-slots`.
pub(crate) const MAX_SLOTS: &str = "max_slots";
/// A worker's tick, and how far apart its heartbeats are, in milliseconds.
pub(crate) const TICK_MS: &str = "tick_ms";
pub(crate) const BEAT_MS: &str = "beat_ms";
/// Until when (server-clock milliseconds) a heartbeat is believed.
pub(crate) const ALIVE_UNTIL_MS: &str = "alive_until_ms";
/// Server-clock ms from which a new worker claims slots vacant since before it began.
pub(crate) const SETTLES_AT_MS: &str = "settles_at_ms";
/// When the TTL index removes a document nobody renews (a heartbeat, a deleted
/// robot's output).
pub(crate) const EXPIRE_AT: &str = "expire_at";
/// The slotpool version a worker runs.
pub(crate) const VERSION: &str = "version";

// Robots' output.
/// The kept lines, each `{n, at, stream, text}`.
pub(crate) const LINES: &str = "lines";
/// A line's number, its stream (`stdout`, `stderr`) and its text.
pub(crate) const N: &str = "n";
pub(crate) const STREAM: &str = "stream";
pub(crate) const TEXT: &str = "text";
/// True on a deleted robot's kept output, until its TTL removes it.
pub(crate) const DELETED: &str = "deleted";
/// A worker's last heartbeat (server clock).
pub(crate) const LAST_SEEN: &str = "last_seen";

// Events.
/// When an event happened (server clock).
pub(crate) const AT: &str = "at";
/// The robot an event is about (its name).
pub(crate) const ROBOT: &str = "robot";
/// What happened, in words.
pub(crate) const DETAIL: &str = "detail";
/// How many writes an adoption took.
pub(crate) const WRITES: &str = "writes";
/// True on a claim by a worker that already held a slot.
pub(crate) const OVERFLOW: &str = "overflow";
/// Who asked for an operator's action: `cli` or `web`.
pub(crate) const BY: &str = "by";
/// The operator's name (the OS user, or the web's token holder).
pub(crate) const ACTOR: &str = "actor";
/// The address a web action came from.
pub(crate) const FROM: &str = "from";

// Load (see crate::load).
/// A worker's load in its heartbeat: `{score, cpu, executors, memory, robots,
/// capacity, cores, memory_bytes, weights}`.
pub(crate) const LOAD: &str = "load";
/// A held slot's measured cost, written with a renewal: `{robots, millicores,
/// memory_bytes, top: [{name, millicores, memory_bytes}], at}`.
pub(crate) const COST: &str = "cost";
