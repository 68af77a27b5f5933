//! The daemon's integration tests: one binary, so libtorch is linked once.
//!
//! - `control_*`: the control plane in-process on a real Unix socket
//!   ([`support::in_process`]).
//! - `daemon_*`, `doctor`, `resume`, `checkpoint_corrupt`, `checkpoint_recovery`, `target_parity`,
//!   `trained_artifacts`: the real `dflashd` binary as a child process in a temp dir
//!   ([`support::binary`]).
//!
//! systemd readiness is tested in `tests/notify.rs`, a binary of its own, because it sets
//! `NOTIFY_SOCKET` for the whole process.
#[path = "../support/mod.rs"]
mod support;

mod alloc_conf;
mod checkpoint_corrupt;
mod checkpoint_recovery;
mod control_actions;
mod control_audit;
mod control_daemon;
mod control_limits;
mod control_socket;
mod control_streams;
mod daemon_config;
mod daemon_control;
mod daemon_lifecycle;
mod daemon_privacy;
mod daemon_setup_errors;
mod doctor;
mod export_contract;
mod memory_plan;
mod resume;
mod target_parity;
mod trained_artifacts;
