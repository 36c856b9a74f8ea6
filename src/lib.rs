//! slotpool keeps long-running, stateful tasks ("robots") alive on a pool of identical
//! workers, with MongoDB as the only coordinator.
//!
//! A fixed number of *slot* documents are the workstations. A worker claims an
//! expired slot with a compare-and-set, renews it every tick on the server's clock,
//! and runs every robot bound to it from the robot's persisted, epoch-fenced context.
//! When its claim lapses it stops them all, and a standby takes the slot over.
//!
//! The data flows one way: [`worker`] tick → [`db::lease`] → [`worker::supervisor`] →
//! [`db::context`]. The folders show the architecture: [`worker`] is what runs,
//! [`db`] what is stored, [`pool`] what people do to the pool, [`robot`] the kinds of
//! robot, and [`cli`] and [`web`] are thin layers over [`pool`] and [`db`]. A library
//! user registers more kinds through [`robot::RobotKind`] and runs a
//! [`worker::Worker`] with its own [`robot::Registry`].

pub mod cli;
pub mod clock;
pub mod config;
pub mod db;
pub mod metrics;
pub mod pool;
pub mod printable;
pub mod robot;
pub mod secrets;
pub mod serve;
pub mod web;
pub mod worker;

pub use config::{Identity, LeaseTiming};
pub use db::lease::{Lease, LeaseError, LeaseProtocol};
pub use db::store::{SlotDoc, Store};
pub use robot::{Registry, RobotError, RobotKind, RobotRun};
pub use worker::supervisor::Supervisor;
pub use worker::{Worker, WorkerSettings};
