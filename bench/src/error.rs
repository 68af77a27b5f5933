//! Errors of the benchmark harness. Each names the file, case or process involved.
use std::path::PathBuf;

use dflash_engine::model::error::ModelError;
use dflash_engine::train::optim::OptimError;
use dflash_engine::train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("case {path}: {detail}")]
    Case { path: PathBuf, detail: String },
    #[error("unknown {what} `{found}`; expected one of: {expected}")]
    Unknown {
        what: &'static str,
        found: String,
        expected: String,
    },
    #[error("{program}: {detail}")]
    Process { program: String, detail: String },
}

impl BenchError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
        move |source| BenchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn case(path: &std::path::Path, detail: impl Into<String>) -> BenchError {
        BenchError::Case {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}
