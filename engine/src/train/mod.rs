//! The DFlash training step and everything around it: anchors, labels, loss, optimizer,
//! schedule and cadences, checkpoints, resume, evaluation, the multi-device [`topology`] and
//! the [`trainer`] (the step and the one training loop).
pub mod anchors;
pub mod best_checkpoint;
pub mod block_objective;
pub mod cadence;
pub mod checkpoint;
pub mod config;
pub mod continuation_eval;
pub mod dflash2;
pub mod dflash2_sums;
pub mod domino;
pub mod dpace;
pub mod drafter_io;
pub mod dspark;
pub mod error;
pub mod eval;
pub mod labels;
pub mod loader;
pub mod loss;
pub mod micro;
pub mod online_prompts;
pub mod optim;
pub mod peak;
pub mod recovery;
pub mod replica;
pub mod resume;
pub mod rng;
pub mod run_config;
pub mod schedule;
pub mod sglang;
pub mod shard;
pub mod speculators;
pub mod throughput;
pub mod topology;
pub mod trainer;
pub mod tree_metrics;
pub mod tree_objective;
pub mod unlocked;
pub mod warm_start;

pub use config::TrainConfig;
pub use error::TrainError;
pub use trainer::{
    CollectLines, EvalLine, JobMembership, LoopEnd, LoopEvent, Next, RunHooks, RunOptions,
    RunSummary, Trainer, TrainerSpec,
};
