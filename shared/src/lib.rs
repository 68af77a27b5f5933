//! Types and pure logic shared by `dflashd` and `dflash-tui`.
//!
//! Nothing here touches libtorch or sockets, and nothing writes a file: the daemon and the
//! console do the I/O, this crate says what the bytes mean and judges the numbers. Four reads
//! of the outside, each small: [`clock::now_ms`] reads the wall clock, the one clock read both
//! programs share; [`run_dir::default_state_dirs`] and
//! [`socket_path::RuntimeDirVars::from_process`] read the XDG and home variables that place the
//! state dir and the socket; and [`invocation::spell_sibling`] looks up the running executable,
//! the working directory and `PATH` to print hints the operator can paste.
pub mod actions;
pub mod best_checkpoint;
pub mod clock;
pub mod config;
pub mod events;
pub mod format;
pub mod gpu_peaks;
pub mod health;
pub mod invocation;
pub mod job;
pub mod last_run;
pub mod launch;
pub mod metrics;
pub mod protocol;
pub mod recording;
pub mod run_dir;
pub mod run_end;
pub mod socket_path;
pub mod status;

mod serde_util;
