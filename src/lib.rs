//! slotpool keeps long-running, stateful tasks ("robots") alive on a pool of identical
//! workers, with MongoDB as the only coordinator.
//!
//! A fixed number of *slot* documents are the workstations. A worker claims an
//! expired slot with a compare-and-set, renews it every tick on the server's clock,
//! and runs every robot bound to it from the robot's persisted, epoch-fenced context.
//! When its claim lapses it stops them all, and a standby takes the slot over.
//!
//! The library's API is what this page lists. A library user registers kinds of its
//! own through [`RobotKind`] in a [`Registry`] and runs a [`Worker`] over a [`Store`];
//! the binary calls [`run_if_requested`] first thing in `main`, since it also serves
//! as the shim of `exec` robots. `examples/custom_kind.rs` is a whole worker so built.
//! Everything else is slotpool's insides, mapped in ARCHITECTURE.md.

// slotpool's insides. Some are reachable, hidden from the docs, because the
// `slotpool` binary, the integration tests and the benches use them; they carry no
// stability promise. Inside a module, what no other module needs is private and
// the rest is `pub(crate)`.
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod clock;
pub(crate) mod config;
#[doc(hidden)]
pub mod db;
#[doc(hidden)]
pub mod load;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod pool;
#[doc(hidden)]
pub mod printable;
pub(crate) mod random;
#[doc(hidden)]
pub mod robot;
pub(crate) mod secrets;
#[doc(hidden)]
pub mod serve;
#[doc(hidden)]
pub mod web;
pub(crate) mod worker;

// The library's API: everything a library user needs to run a worker with robot
// kinds of its own (see examples/custom_kind.rs).
pub use config::{ConfigError, Identity, LeaseTiming};
pub use db::heartbeat::{BeatError, Predecessor};
pub use db::lease::{Lease, LeaseError, LeaseProtocol};
pub use db::slot_doc::SlotDoc;
pub use db::store::Store;
pub use load::LoadWeights;
pub use robot::policy::ExecPolicy;
pub use robot::shim::run_if_requested;
pub use robot::{Registry, RobotError, RobotKind, RobotRun};
pub use worker::{LoadSettings, Worker, WorkerError, WorkerSettings};
