//! Errors of the benchmark harness. Each names the file, case or process involved.
use std::path::PathBuf;

use dflash_engine::model::error::ModelError;
use dflash_engine::train::optim::OptimError;
use dflash_engine::train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error("libtorch: {0}")]
    Torch(tch::TchError),
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

/// By hand rather than `#[from]`, which would also make the libtorch error the `source()` of
/// a message that already prints it (an error chain would print it twice).
impl From<tch::TchError> for BenchError {
    fn from(e: tch::TchError) -> Self {
        Self::Torch(e)
    }
}

impl BenchError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
        move |source| BenchError::Io {
            path: path.to_path_buf(),
            cause: source,
        }
    }

    pub fn case(path: &std::path::Path, detail: impl Into<String>) -> BenchError {
        BenchError::Case {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22 part 7: a message that carries its cause does not also return it as `source()`,
    /// or `dflash-bench`'s `{e:#}` (anyhow's chain) prints the cause twice.
    #[test]
    fn bench_errors_print_their_cause_once_through_anyhow() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("case.toml");
        let read = || std::fs::read(&missing).unwrap_err();
        let os_error = read().to_string();
        let a = tch::Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
        let torch = a.f_matmul(&a).unwrap_err();
        let torch_text = torch.to_string();
        let cases = [
            (BenchError::io(&missing)(read()), os_error),
            (BenchError::from(torch), torch_text),
        ];
        for (err, cause) in cases {
            let shown = format!("{:#}", anyhow::Error::from(err));
            assert_eq!(shown.matches(cause.as_str()).count(), 1, "{shown}");
        }
    }
}
