//! dflash-engine: the DFlash math and its parallel execution, free of any daemon concern.
//!
//! - [`model`]: the frozen targets (Qwen3, Qwen3.5/3.6 hybrids), the drafter, attention and
//!   layers, weights by Hugging Face name.
//! - [`train`]: the training step and the one training loop ([`train::Trainer`]), anchors,
//!   labels, loss, optimizer, schedule and cadences, checkpoints, resume, evaluation, and
//!   [`train::topology`], the multi-device execution with its hidden-state queue.
//! - [`data`]: chat / pre-tokenized JSONL → samples with loss masks, shuffle, eval split.
//! - [`regenerate`]: chat data regenerated with the target's own replies (`dflashd regenerate`).
//! - [`device`]: the one device vocabulary; [`atomic_write`]: the one atomic file write;
//!   [`file_hash`]: the one file hasher; [`global_rng`]: the one lock over libtorch's
//!   process-wide random generator.
//!
//! Errors are `thiserror` enums whose messages carry their causes' text; a cause printed in a
//! message is never also the error's `source()`, so `anyhow`'s `{:#}` prints each cause once.
//!
//! The engine writes no run-dir files and depends on no process, socket or telemetry code: the
//! daemon drives [`train::Trainer::run`] through [`train::RunHooks`].
pub mod allreduce_bucket;
pub mod atomic_write;
pub mod data;
pub mod decode;
pub mod device;
pub mod dist;
pub mod file_hash;
pub mod global_rng;
pub mod model;
pub mod peak;
pub mod plan;
pub mod regenerate;
pub mod sdpa;
pub mod train;
