//! The environment fingerprint: taken at start, persisted in the run dir, compared on resume.
//!
//! The type and the field-by-field diff are shared (`dflash_shared::health::fingerprint`);
//! this module gathers the facts and decides whether a resume may proceed. A drift that
//! blocks resume (torch replaced by another install, a driver change, other GPUs) holds the
//! run until an operator accepts the new environment by its token, which is bound to the
//! exact environment found, so an old acceptance cannot wave through a later change.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dflash_shared::health::{diff_fingerprints, EnvironmentDrift, Fingerprint};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::{git, python_env, GpuSampler};

use dflash_shared::run_dir::FINGERPRINT_FILE_NAME;

#[derive(Debug, Error)]
pub enum FingerprintError {
    #[error("cannot read the {what} {path}: {cause}{}", hash_remedy(what))]
    Hash {
        what: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path} is not a valid fingerprint file: {cause}")]
    Parse {
        path: PathBuf,
        cause: serde_json::Error,
    },
}

fn hash_remedy(what: &str) -> &'static str {
    match what {
        "data file" => {
            ". Point data.train_file in the config at an existing chat or pre-tokenized JSONL \
             file, or set it to \"embedded\" for the built-in set"
        }
        "config" => ". Check the --config path",
        _ => "",
    }
}

/// Where the run's config came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    /// The embedded default; hashed from its text, no git commit.
    Embedded(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintInputs {
    pub config: ConfigSource,
    /// Training data files, in config order.
    pub data_files: Vec<PathBuf>,
    /// The Python environment in use, if known (else `$VIRTUAL_ENV`, else `./.venv`).
    pub python_env: Option<PathBuf>,
    /// The CUDA allocator configuration in effect (`runtime/alloc_conf.rs::in_effect`).
    pub cuda_alloc_conf: Option<String>,
}

/// Gathers the fingerprint. Hashes every data file in full (streamed), so it can take
/// seconds on large data; run it off the async runtime.
pub fn collect(
    inputs: &FingerprintInputs,
    gpus: &GpuSampler,
    now_ms: i64,
) -> Result<Fingerprint, FingerprintError> {
    let (config_hash, config_git_commit) = match &inputs.config {
        ConfigSource::File(path) => (
            Some(sha256_file(path, "config")?),
            git::head_commit_of(path),
        ),
        ConfigSource::Embedded(text) => (Some(hex::encode(Sha256::digest(text.as_bytes()))), None),
    };
    let data_hash = if inputs.data_files.is_empty() {
        None
    } else {
        Some(hash_data_files(&inputs.data_files)?)
    };
    let venv_env = std::env::var_os("VIRTUAL_ENV").map(PathBuf::from);
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let env = python_env::locate(inputs.python_env.as_deref(), venv_env.as_deref(), &cwd);
    let mut python_packages = BTreeMap::new();
    if let Some(env) = &env {
        for site in python_env::site_packages(env) {
            python_packages.extend(python_env::installed_packages(&site));
        }
    }
    let build_commit = env!("DFLASH_GIT_COMMIT");
    Ok(Fingerprint {
        captured_ms: now_ms,
        hostname: hostname(),
        dflashd_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        code_git_commit: (build_commit != "unknown").then(|| build_commit.to_string()),
        config_git_commit,
        config_hash,
        data_hash,
        libtorch_version: loaded_libtorch_version(),
        tch_version: Some(env!("DFLASH_TCH_VERSION").to_string()),
        cuda_runtime: cuda_runtime_version(),
        cuda_driver: match (gpus.driver_version(), gpus.cuda_driver_version()) {
            (Some(d), Some(c)) => Some(format!("{d} (CUDA {c})")),
            (Some(d), None) => Some(d),
            _ => None,
        },
        gpu_models: gpus.gpu_models(),
        python_executable: env.map(|e| e.join("bin/python").display().to_string()),
        cuda_alloc_conf: inputs.cuda_alloc_conf.clone(),
        python_packages,
    })
}

/// What resuming under `current` means, given the fingerprint of the previous start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeDecision {
    /// No previous fingerprint: a new run.
    FirstStart,
    /// Nothing differs.
    Unchanged,
    /// Differences that need no confirmation, or that an operator accepted by token.
    Proceed {
        drifts: Vec<EnvironmentDrift>,
        accepted: bool,
    },
    /// Differences that hold the run until `confirm_token` is given back by an operator.
    Blocked {
        drifts: Vec<EnvironmentDrift>,
        confirm_token: String,
    },
}

/// Pure: compares fingerprints and applies the operator's acceptance, if any.
pub fn resume_decision(
    previous: Option<&Fingerprint>,
    current: &Fingerprint,
    accepted_token: Option<&str>,
) -> ResumeDecision {
    let Some(previous) = previous else {
        return ResumeDecision::FirstStart;
    };
    let drifts = diff_fingerprints(previous, current);
    if drifts.is_empty() {
        return ResumeDecision::Unchanged;
    }
    if !drifts.iter().any(|d| d.blocks_resume) {
        return ResumeDecision::Proceed {
            drifts,
            accepted: false,
        };
    }
    let confirm_token = confirm_token(&drifts);
    if accepted_token == Some(confirm_token.as_str()) {
        ResumeDecision::Proceed {
            drifts,
            accepted: true,
        }
    } else {
        ResumeDecision::Blocked {
            drifts,
            confirm_token,
        }
    }
}

/// A short digest of the blocking drifts (field, before, after): an acceptance covers exactly
/// the changes the operator was shown, and a rebuild in between (an informational change)
/// does not void it.
pub fn confirm_token(drifts: &[EnvironmentDrift]) -> String {
    let mut h = Sha256::new();
    for d in drifts.iter().filter(|d| d.blocks_resume) {
        for part in [
            Some(d.field.as_str()),
            d.before.as_deref(),
            d.after.as_deref(),
        ] {
            h.update(part.unwrap_or("\u{0}absent").as_bytes());
            h.update([0x1f]);
        }
        h.update([b'\n']);
    }
    hex::encode(&h.finalize()[..8])
}

/// Full digest of the environment (ignores `captured_ms`); the warmup record stores it.
pub fn digest(fp: &Fingerprint) -> [u8; 32] {
    let mut canonical = fp.clone();
    canonical.captured_ms = 0;
    // serde_json writes struct fields in declaration order and BTreeMaps sorted: stable bytes.
    let bytes = serde_json::to_vec(&canonical).expect("a fingerprint always serializes");
    Sha256::digest(bytes).into()
}

pub fn load(run_dir: &Path) -> Result<Option<Fingerprint>, FingerprintError> {
    let path = run_dir.join(FINGERPRINT_FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| FingerprintError::Parse {
                    path,
                    cause: source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FingerprintError::Io {
            action: "reading",
            path,
            cause: source,
        }),
    }
}

/// Records `fp` as the accepted environment of the run (only once resume may proceed).
pub fn save(run_dir: &Path, fp: &Fingerprint) -> Result<(), FingerprintError> {
    let path = run_dir.join(FINGERPRINT_FILE_NAME);
    let bytes = serde_json::to_vec_pretty(fp).expect("a fingerprint always serializes");
    dflash_engine::files::atomic_write::write_atomic(&path, &bytes).map_err(|source| {
        FingerprintError::Io {
            action: "writing",
            path,
            cause: source,
        }
    })
}

/// Removes the recorded environment (a run that never trained has none).
pub fn remove(run_dir: &Path) -> Result<(), FingerprintError> {
    let path = run_dir.join(FINGERPRINT_FILE_NAME);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FingerprintError::Io {
            action: "removing",
            path,
            cause: e,
        }),
        _ => Ok(()),
    }
}

/// One digest over all data files: each file's name and content hash, in order.
pub fn hash_data_files(files: &[PathBuf]) -> Result<String, FingerprintError> {
    let mut all = Sha256::new();
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        all.update(name.as_bytes());
        all.update([0]);
        all.update(sha256_file(f, "data file")?.as_bytes());
        all.update([b'\n']);
    }
    Ok(hex::encode(all.finalize()))
}

fn sha256_file(path: &Path, what: &'static str) -> Result<String, FingerprintError> {
    dflash_engine::files::hash::sha256_file(path)
        .map(|digest| digest.sha256)
        .map_err(|source| FingerprintError::Hash {
            what,
            path: path.to_path_buf(),
            cause: source,
        })
}

/// The version of the libtorch this process actually loaded: find `libtorch_cpu.so` in
/// `/proc/self/maps` and read the wheel's `version.py` (or a libtorch zip's `build-version`)
/// next to it. A torch swapped under the same path shows up here.
pub fn loaded_libtorch_version() -> Option<String> {
    let lib_dir = dflash_engine::device::loaded_libtorch_dir()
        .or_else(|| option_env!("DFLASH_BUILD_LIBTORCH_LIB").map(PathBuf::from))?;
    libtorch_version_in(&lib_dir)
}

/// Reads the version recorded beside a libtorch lib dir.
pub fn libtorch_version_in(lib_dir: &Path) -> Option<String> {
    let root = lib_dir.parent()?;
    if let Ok(py) = std::fs::read_to_string(root.join("version.py")) {
        let found = py.lines().find_map(|l| {
            let v = l
                .strip_prefix("__version__")?
                .trim_start()
                .strip_prefix('=')?
                .trim();
            Some(v.trim_matches(|c| c == '\'' || c == '"').to_string())
        });
        if found.is_some() {
            return found;
        }
    }
    std::fs::read_to_string(root.join("build-version"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// CUDA runtime libtorch was built with (e.g. "13.0"), when it has CUDA at all.
pub fn cuda_runtime_version() -> Option<String> {
    // tch panics on a libtorch error; a CPU-only libtorch may refuse the query.
    let v = std::panic::catch_unwind(|| tch::utils::has_cudart().then(tch::utils::version_cudart))
        .ok()??;
    (v > 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// This machine's host name, as `gethostname(2)` gives it.
pub(crate) fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for writes of its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
#[path = "fingerprint_tests.rs"]
mod tests;
