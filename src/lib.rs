//! slotpool keeps long-running, stateful tasks ("robots") alive on a pool of identical
//! workers, with MongoDB as the only coordinator.
//!
//! A fixed number of *slot* documents are the workstations. A worker claims an
//! expired slot with a compare-and-set, renews it every tick on the server's clock,
//! and runs every robot bound to it from the robot's persisted, epoch-fenced context.
//! When its claim lapses it stops them all, and a standby takes the slot over.
//!
//! The data flows one way: [`worker`] tick → [`lease`] → [`supervisor`] →
//! [`context`]. Robot kinds live in [`robot`]; a library user registers more through
//! [`robot::RobotKind`] and runs a [`worker::Worker`] with its own [`robot::Registry`].

pub mod actions;
pub mod cli;
pub mod clock;
pub mod commit;
pub mod config;
pub mod context;
pub mod held_slot;
pub mod holding;
pub mod http;
pub mod lease;
pub mod line;
pub mod metrics;
pub mod output_log;
pub mod pacing;
pub mod placement;
pub mod printable;
pub mod robot;
pub mod secrets;
pub mod store;
pub mod supervisor;
pub mod view;
pub mod web;
pub mod worker;

pub use config::{Identity, LeaseTiming};
pub use lease::{Lease, LeaseError, LeaseProtocol};
pub use robot::{Registry, RobotError, RobotKind, RobotRun};
pub use store::{Slot, Store};
pub use supervisor::Supervisor;
pub use worker::{Worker, WorkerSettings};
