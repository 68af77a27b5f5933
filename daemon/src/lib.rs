//! dflashd: DFlash drafter training on libtorch, plus the runtime that guards a week-long run.
//!
//! Layout:
//! - [`engine`]: the math. `model/` (target models, drafter, attention) and `train/`
//!   (anchors, loss, optimizer, checkpoints, evaluation).
//! - [`data`]: chat / pre-tokenized JSONL → samples with loss masks, shuffle, eval split.
//! - [`runtime`]: workers, the hidden-state queue, the run lifecycle.
//! - [`telemetry`]: NVML/sysinfo samplers, cache inventory, environment fingerprint.
//! - [`control`]: the Unix-socket control plane, journal and pending actions.
pub mod bench;
pub mod cli;
pub mod control;
pub mod data;
pub mod engine;
pub mod runtime;
pub mod telemetry;
