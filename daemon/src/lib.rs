//! dflashd: the daemon that runs and guards a week-long DFlash training run. The math is
//! [`dflash_engine`]'s; this crate is the process around it.
//!
//! Floors, top to bottom (each imports only from below it):
//! - [`cli`]: one file per subcommand; nothing imports it.
//! - [`runtime`]: the daemon process: launch, guard rails, the driver of the training loop,
//!   the telemetry sampler thread, logging, signals, systemd.
//! - [`control`]: the Unix-socket server and its requests; beside it [`exporter`], the
//!   Prometheus `/metrics` endpoint. Neither imports the other.
//! - [`run`]: the run's shared state ([`run::handle::RunHandle`]) and run-dir records.
//! - [`telemetry`]: pure measurement (NVML, allocator, host, caches, fingerprint); returns data.
//! - then `dflash_engine` and `dflash_shared`.
//!
//! Errors are `thiserror` enums whose messages carry their causes' text; a cause printed in a
//! message is never also the error's `source()`, so `anyhow`'s `{:#}` prints each cause once.
pub mod cli;
pub mod control;
pub mod exporter;
pub mod run;
pub mod runtime;
pub mod telemetry;
