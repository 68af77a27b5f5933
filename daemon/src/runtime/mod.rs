//! The daemon process around the engine: [`launch`] assembles it (setup, guard rails, the
//! training thread), [`guard_rails`] holds the run-dir lock, journal, environment fingerprint and
//! resume decision, the control socket and the [`sampler`] thread, and [`run_loop`] drives the
//! engine's one training loop (publishing each line, answering operators, pausing on failure).
pub mod alloc_conf;
pub mod checkpoint_gate;
pub mod checkpoints;
pub mod detach;
pub mod device_peaks;
pub mod ending;
pub mod guard_rails;
pub mod health_feed;
pub mod healthy_record;
pub mod launch;
pub mod launch_nodes;
pub mod logging;
pub mod memory_plan;
pub mod metrics_out;
pub mod notify;
pub mod pace;
pub mod private_files;
pub mod probe;
pub mod refused;
pub mod run_dir_lock;
pub mod run_loop;
pub mod sampler;
pub mod setup;
pub mod signals;
pub mod telemetry_specs;
pub mod tensorboard;
