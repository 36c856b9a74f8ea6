//! The names of the fields that fence and place robots, one constant each, so that a
//! filter, the update it guards and the reader of its result cannot disagree on a
//! spelling. Aggregation paths (`"$seq"`) are written out beside their pipelines.

/// A robot's slot; also the slot named in `workers` and `events` documents.
pub const SLOT_ID: &str = "slot_id";
/// A slot's fencing token, raised by every claim; a robot's copy of its holder's.
pub const EPOCH: &str = "epoch";
/// A robot's own fencing token, raised by every adoption.
pub const GEN: &str = "gen";
/// How many checkpoints a robot has written; each is conditioned on the one before.
pub const SEQ: &str = "seq";
/// A slot's holder, `ip:port`, or null.
pub const OWNER: &str = "owner";
/// The token of the last group-commit write that landed on a robot.
pub const WRITE_ID: &str = "write_id";
/// How many robots a slot says it has (healed against the robots themselves).
pub const ROBOT_COUNT: &str = "robot_count";
/// A slot's revision: any change to its robots raises it.
pub const REV: &str = "rev";
