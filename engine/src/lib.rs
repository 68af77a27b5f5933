//! dflash-engine: the DFlash math and its parallel execution, free of any daemon concern.
//!
//! - [`model`]: the frozen targets (Qwen3, Qwen3.5/3.6 hybrids), the drafter, attention and
//!   layers, weights by Hugging Face name.
//! - [`train`]: the training step and the one training loop ([`train::Trainer`]), anchors,
//!   labels, loss, optimizer, schedule and cadences, checkpoints, resume, evaluation, and
//!   [`train::topology`], the multi-device execution with its hidden-state queue.
//! - [`data`]: chat / pre-tokenized JSONL → samples with loss masks, shuffle, eval split.
//! - [`regenerate`]: chat data regenerated with the target's own replies (`dflashd regenerate`):
//!   which turns, the resume scan of earlier output, and the worker pool.
//! - [`embedded`]: the built-in default `dflashd start` trains without a config: the tiny target,
//!   its dataset and prompts, and that dataset as chat rows.
//! - [`collective`]: the all-reduce contract ([`collective::allreduce::AllReduce`], its abort and
//!   errors, the gradient bucket) and its in-process endpoints (CPU threads, NCCL), beneath both
//!   [`train::topology`] and [`dist`], which adds the cross-process ones.
//! - [`device`]: the one device vocabulary and the facts of this process's libtorch: its one
//!   random generator, and its panics' text without the C++ stack trace.
//! - [`files`]: the one atomic file write and the one file hasher.
//!
//! Errors are `thiserror` enums whose messages carry their causes' text; a cause printed in a
//! message is never also the error's `source()`, so `anyhow`'s `{:#}` prints each cause once.
//!
//! The engine writes no run-dir files and depends on no process, socket or telemetry code: the
//! daemon drives [`train::Trainer::run`] through [`train::RunHooks`].
pub mod collective;
pub mod data;
pub mod decode;
pub mod device;
pub mod dist;
pub mod embedded;
pub mod files;
pub mod model;
pub mod plan;
pub mod regenerate;
pub mod train;
