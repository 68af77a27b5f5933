//! The control socket: bind safely, accept with a connection cap, one task per client, shut
//! down by broadcast (mini-redis's shape).
//!
//! - [`server`] binds the socket and accepts; [`admission`] decides which connections it holds
//!   at its cap; [`connection`] runs one client; [`framing`] cuts
//!   newline-delimited frames with a size limit; [`cmd`] answers requests, one file per kind.
//! - [`actions`] carries out confirmed destructive actions.
//!
//! The state it serves is [`crate::run`]'s; it knows nothing of the daemon process.
pub mod actions;
pub mod admission;
pub mod cmd;
pub mod connection;
pub mod framing;
pub mod server;
