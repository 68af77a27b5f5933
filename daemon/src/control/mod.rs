//! The control plane: Unix-socket server, request dispatch, pending destructive actions and
//! the run journal.
//!
//! - [`server`] binds the socket and accepts; [`connection`] runs one client; [`framing`] cuts
//!   newline-delimited frames with a size limit; [`dispatch`] answers requests.
//! - [`pending`] is the pure logic of destructive actions; [`actions`] carries them out.
//! - [`journal`] is the durable event history; [`recorder`] the telemetry recording.
pub mod actions;
pub mod connection;
pub mod dispatch;
pub mod framing;
pub mod journal;
pub mod pending;
pub mod recorder;
pub mod server;
