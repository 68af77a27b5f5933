//! Performance harness: the engine measured side by side with the PyTorch reference in
//! `benches/reference/` on the same weights and batches (the `dflash-bench` binary).
//! A client of `dflash-engine` and of `dflashd`'s public API; nothing of it ships in `dflashd`.
//!
//! - [`presets`]: the named configurations (pure data).
//! - [`case`], [`attention`], [`target_pass`]: case files on disk and the engine's timed runs.
//! - [`step`], [`timing`], [`memory`], [`matmul`]: what one engine process measures.
//! - [`flops`], [`stats`], [`compare`]: pure arithmetic over the results.
//! - [`process`], [`harness`]: child processes (one per implementation and case, so peak memory
//!   is per process) and the side-by-side orchestration.
//! - [`overhead`], [`queue`]: the daemon around the engine (clients, telemetry, the queue).
//! - [`plan_check`]: the memory model of a run (`dflash_engine::plan`) against the memory pass.
//! - [`report`]: the machine, the summary line and the Markdown tables.
pub mod attention;
pub mod case;
pub mod compare;
pub mod error;
pub mod flops;
pub mod harness;
pub mod matmul;
pub mod memory;
pub mod overhead;
pub mod plan_check;
pub mod presets;
pub mod process;
pub mod queue;
pub mod report;
pub mod stats;
pub mod step;
pub mod target_pass;
pub mod timing;

pub use error::BenchError;
