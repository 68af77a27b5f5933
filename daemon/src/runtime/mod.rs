//! The daemon runtime around the training engine: paths and the run-dir lock, the shared
//! [`handle::RunHandle`], the frame bus, the hidden-state queue, the multi-device
//! [`topology`], logging and systemd readiness, and the daemon itself: [`launch`] assembles
//! the process, [`run_loop`] drives training.
pub mod bus;
pub mod checkpoints;
pub mod daemon;
pub mod detach;
pub mod ending;
pub mod handle;
pub mod health_feed;
pub mod launch;
pub mod lock;
pub mod locked;
pub mod logging;
pub mod metrics_out;
pub mod notify;
pub mod pace;
pub mod paths;
pub mod probe;
pub mod queue;
pub mod refused;
pub mod run_loop;
pub mod setup;
pub mod signals;
pub mod telemetry_specs;
pub mod topology;
