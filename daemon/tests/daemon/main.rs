//! The daemon's integration tests: one binary, so libtorch is linked once.
//!
//! - `control_*`: the control plane in-process on a real Unix socket
//!   ([`support::in_process`]).
//! - `metrics_endpoint`: the Prometheus `/metrics` server in-process on loopback;
//!   `prometheus_e2e`: the real binary scraped by a real Prometheus server
//!   ([`support::prometheus`]).
//! - `daemon_*`, `best_checkpoint`, `doctor`, `eval_online`, `resume`, `checkpoint_corrupt`, `checkpoint_recovery`,
//!   `target_parity`, `tensorboard_events`, `trained_artifacts`, `regenerate`, `warm_start`: the real `dflashd` binary as a
//!   child process in a temp dir ([`support::binary`]); `multi_node_launch` too (issue 23's
//!   launch flags and variables) and `multi_node_training` (two real nodes on loopback).
//! - `campaign_*`: issue 15's reliability campaign against the real binary (kill -9 rounds,
//!   a fuzzed socket, confirmation bypass attempts, many clients); sized by
//!   [`support::campaign`] (`DFLASH_CAMPAIGN=full` for the full size).
//!
//! systemd readiness is tested in `tests/notify.rs`, a binary of its own, because it sets
//! `NOTIFY_SOCKET` for the whole process.
#[path = "../support/mod.rs"]
mod support;

mod alloc_conf;
mod best_checkpoint;
mod campaign_clients;
mod campaign_confirm;
mod campaign_fuzz;
mod campaign_kill;
mod checkpoint_corrupt;
mod checkpoint_recovery;
mod control_actions;
mod control_audit;
mod control_daemon;
mod control_limits;
mod control_socket;
mod control_streams;
mod daemon_config;
mod daemon_config_setup;
mod daemon_control;
mod daemon_lifecycle;
mod daemon_privacy;
mod daemon_setup_errors;
mod doctor;
mod eval_online;
mod export_contract;
mod loaders;
mod memory_plan;
mod metrics_endpoint;
mod multi_node_launch;
mod multi_node_training;
mod prometheus_e2e;
mod regenerate;
mod resume;
mod target_parity;
mod tensorboard_events;
mod trained_artifacts;
mod tree_objective;
mod warm_start;
