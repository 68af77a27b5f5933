//! The daemon runtime around the training engine: paths and the run-dir lock, the shared
//! [`handle::RunHandle`], the frame bus, the hidden-state queue, the multi-device topology, logging and systemd readiness.
pub mod bus;
pub mod daemon;
pub mod handle;
pub mod lock;
pub mod logging;
pub mod notify;
pub mod paths;
pub mod queue;
pub mod topology;
