//! Helpers shared by the integration tests: the incident recording generator, a protocol-
//! speaking test daemon, and screen rendering with the snapshot redactions.
#![allow(dead_code)]

pub mod incident;
pub mod screen;
pub mod test_daemon;
