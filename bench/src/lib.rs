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
//! - [`real_step`], [`target_layers`]: the GPU check's drafter step at the real structure (fresh
//!   shapes every step) and the target's layer kinds at the real dimensions; [`multi_gpu`]: the
//!   all-reduce bandwidth and the 2-rank step against 1 rank.
//! - [`overhead`], [`queue`]: the daemon around the engine (clients, telemetry, the queue).
//! - [`plan_check`]: the memory and FLOP model of a run (`dflash_engine::plan`) against the
//!   memory pass and [`flop_counter`], libtorch's executed FLOPs counted op by op.
//! - [`objectives`]: the objective tournament (DFlash, D-PACE, Domino trained by real
//!   `dflashd start` runs on the embedded default, scored by `dflashd eval`, across seeds).
//! - [`report`]: the machine, the summary line and the Markdown tables.
//!
//! Errors are `thiserror` enums whose messages carry their causes' text; a cause printed in a
//! message is never also the error's `source()`, so `anyhow`'s `{:#}` prints each cause once.
pub mod attention;
pub mod case;
pub mod compare;
pub mod error;
pub mod flop_counter;
pub mod flops;
pub mod harness;
pub mod matmul;
pub mod memory;
pub mod multi_gpu;
pub mod objectives;
pub mod overhead;
pub mod plan_check;
pub mod presets;
pub mod process;
pub mod queue;
pub mod real_step;
pub mod report;
pub mod stats;
pub mod step;
pub mod target_layers;
pub mod target_pass;
pub mod timing;

pub use error::BenchError;
