//! What is stored: the database handle and its collections, the lease protocol, the
//! fenced context store and its write guard, group commit, robots' kept output, and
//! the pacer that keeps robot writes from starving the lease.

pub mod adoption;
pub mod context;
pub mod event;
pub mod field;
pub mod firing;
pub mod group_commit;
pub mod guard;
pub mod heartbeat;
pub mod lease;
pub mod listing;
pub mod output_log;
pub mod pacing;
pub mod placement;
pub mod robot_count;
pub mod robot_doc;
pub mod robots;
pub mod schema;
pub mod store;
pub mod words;
