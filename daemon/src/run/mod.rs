//! The run's shared state and its run-dir records, below both the socket server
//! ([`crate::control`]) and the daemon process ([`crate::runtime`]), which both use it and never
//! each other through it.
//!
//! - [`handle`]: [`handle::RunHandle`], the hub: status store, journal, pending actions,
//!   unlocked keys, queue monitor, frame bus, recorder, command channel and shutdown.
//! - [`bus`]: live frames to subscribers; [`journal`]: the durable event history;
//!   [`recorder`]: the telemetry recording; [`pending`]: the pure logic of destructive actions;
//!   [`refusal_throttle`]: which refused operator requests get a journal line of their own;
//!   [`withdrawn_requests`]: which granted filings are journaled when filed, and which only
//!   once confirmed (request/cancel cycles);
//!   [`locked_keys`]: confirmed unlocks of locked config keys; [`paths`]: where the daemon's
//!   files and socket live.
pub mod bus;
pub mod handle;
pub mod journal;
pub mod locked_keys;
pub mod paths;
pub mod pending;
pub mod recorder;
pub mod refusal_throttle;
pub mod withdrawn_requests;
