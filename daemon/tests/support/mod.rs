//! Fixtures shared by the daemon's integration tests.
//! - [`in_process`]: a real control plane on a real Unix socket in a temp dir, and a blocking
//!   line client.
//! - [`binary`]: the real `dflashd` binary as a child process, isolated in a temp dir.
//! - [`prometheus`]: a real Prometheus server and `promtool`, and an HTTP client.
//! - [`campaign`]: the reliability campaign's sizes, seeded random source and readers.
#![allow(dead_code)] // Each test uses a different subset.
pub mod binary;
pub mod campaign;
pub mod in_process;
pub mod prometheus;
