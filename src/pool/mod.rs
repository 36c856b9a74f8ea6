//! What people do to the pool: placement, the actions shared by the CLI and the
//! dashboard, and the view (derived states) they both show.

pub mod actions;
pub mod create;
pub mod init;
pub mod placement;
pub mod view;
