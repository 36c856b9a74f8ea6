//! What is stored: the database handle and its collections, the lease protocol, the
//! fenced context store and its write guard, group commit, robots' kept output, and
//! the pacer that keeps robot writes from starving the lease.

pub(crate) mod adoption;
pub mod context;
pub mod event;
pub(crate) mod field;
pub(crate) mod firing;
pub mod group_commit;
pub mod guard;
pub(crate) mod heartbeat;
pub mod indexed;
pub mod lease;
pub(crate) mod listing;
pub(crate) mod load;
pub mod output_log;
pub mod pacing;
pub(crate) mod placement;
pub(crate) mod robot_count;
pub mod robot_doc;
pub(crate) mod robots;
pub(crate) mod schema;
pub mod server;
pub mod slot_doc;
pub mod store;
pub mod version;
pub(crate) mod words;
pub mod write_concern;
