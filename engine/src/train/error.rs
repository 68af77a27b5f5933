//! Errors of the training engine. Each names the file, key or tensor and what was expected.
use std::path::PathBuf;

use super::checkpoint::CheckpointError;
use super::optim::OptimError;
use crate::data::DataError;
use crate::decode::DecodeError;
use crate::model::drafter::DrafterError;
use crate::model::error::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Drafter(#[from] DrafterError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("drafter weights {path}: {detail}")]
    DrafterWeights { path: PathBuf, detail: String },
    #[error("training config: `{key}` {detail}")]
    Config { key: String, detail: String },
    #[error("cannot resume from {checkpoint}: {detail}")]
    Incompatible { checkpoint: PathBuf, detail: String },
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("the target and the drafter do not fit together: {0}")]
    Mismatch(String),
    /// A worker thread failed (an error or a panic, e.g. out of memory on its device). The run
    /// does not continue on the remaining devices.
    #[error("{0}")]
    Worker(Box<WorkerFailed>),
    #[error("topology: {0}")]
    Topology(String),
    #[error("writing the checkpoint of step {step} failed: {cause}")]
    CheckpointWrite { step: u64, cause: Box<TrainError> },
    /// `drafter.init_from` cannot initialise this run's drafter; nothing was loaded. Each
    /// problem names the config key or the tensor and what to change.
    #[error("{}", init_from_refusal(dir, problems))]
    InitFrom { dir: PathBuf, problems: Vec<String> },
}

/// "drafter.init_from DIR: PROBLEM", or the problems one per line.
fn init_from_refusal(dir: &std::path::Path, problems: &[String]) -> String {
    let head = format!("drafter.init_from {}", dir.display());
    match problems {
        [one] => format!("{head}: {one}"),
        many => {
            let mut text = format!("{head}: {} problems:", many.len());
            for p in many {
                text.push_str("\n  - ");
                text.push_str(p);
            }
            text
        }
    }
}

/// Which worker failed, on which device, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{worker} failed: {detail}; training stopped (it never continues with fewer devices)")]
pub struct WorkerFailed {
    /// e.g. `target worker 1 on cuda:3`.
    pub worker: String,
    /// e.g. `cuda:3`.
    pub device: String,
    pub role: dflash_shared::metrics::DeviceRole,
    /// Its index among the workers of its role.
    pub rank: usize,
    pub detail: String,
}

impl TrainError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
        move |source| TrainError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
    }
}
