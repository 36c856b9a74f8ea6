//! What people do to the pool: placement, the actions shared by the CLI and the
//! dashboard, and the view (derived states) they both show.

pub(crate) mod actions;
pub(crate) mod create;
pub mod init;
pub(crate) mod load_plan;
pub(crate) mod placement;
pub(crate) mod view;
