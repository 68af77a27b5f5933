//! Errors of model loading and model use. Every variant names the file, key or tensor involved and,
//! where it applies, what was expected and what was found: these messages reach users directly.
//! A variant's message carries its cause's text, so the cause is never also its `source()`
//! (the engine's rule: an `anyhow` chain prints each cause once).
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },

    #[error("{path}: invalid JSON: {cause}")]
    Json {
        path: PathBuf,
        cause: serde_json::Error,
    },

    #[error("{path}: key `{key}`: expected {expected}, found {found}")]
    ConfigValue {
        path: PathBuf,
        key: String,
        expected: String,
        found: String,
    },

    #[error("{path}: unknown architecture {found} (supported: {supported})")]
    UnknownArchitecture {
        path: PathBuf,
        found: String,
        supported: String,
    },

    #[error("{path}: unsupported configuration: {what}")]
    UnsupportedConfig { path: PathBuf, what: String },

    #[error("{dir}: no checkpoint found: expected `model.safetensors` or `model.safetensors.index.json`")]
    NoCheckpoint { dir: PathBuf },

    #[error("{index}: shard `{shard}` listed for tensor `{tensor}` is missing ({path})")]
    MissingShard {
        index: PathBuf,
        shard: String,
        tensor: String,
        path: PathBuf,
    },

    #[error("{file}: tensor `{tensor}` is missing")]
    MissingTensor { file: PathBuf, tensor: String },

    #[error("{file}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    WrongShape {
        file: PathBuf,
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },

    #[error("{file}: tensor `{tensor}` has dtype {found}, expected one of F32, BF16, F16")]
    BadDtype {
        file: PathBuf,
        tensor: String,
        found: String,
    },

    #[error("{file}: not a valid safetensors file: {reason}")]
    Safetensors { file: PathBuf, reason: String },

    #[error("unsupported dtype `{found}`: expected f32, bf16 or f16")]
    UnsupportedDtype { found: String },

    #[error("input_ids: {what}")]
    BadInput { what: String },

    #[error(
        "input_ids: token id {token} at position {position:?} is out of range for vocab_size {vocab_size} (expected 0..{vocab_size})"
    )]
    TokenOutOfRange {
        token: i64,
        position: Vec<i64>,
        vocab_size: i64,
    },

    #[error("layer id {layer} is out of range: the model has {available} decoder layers (ids 0..{available})")]
    LayerOutOfRange { layer: usize, available: usize },

    #[error(
        "cannot crop the target cache to {requested} tokens: it holds {held} and can return only to a length in {earliest}..={held} (the start of its last forward onwards; the Gated DeltaNet state before that is not kept). Crop once after each verification, before the next forward"
    )]
    CacheCrop {
        requested: i64,
        earliest: i64,
        held: i64,
    },

    #[error(
        "the target cache holds a tree forward of {tokens} tokens: keep one path of it (keep_path) before the next forward or crop"
    )]
    TreeUnresolved { tokens: usize },

    #[error(
        "cannot keep {path:?} of the last forward's {tokens} tokens: not a path from its first token down the tree"
    )]
    NotATreePath { path: Vec<usize>, tokens: usize },

    #[error("libtorch: {0}")]
    Torch(tch::TchError),
}

/// By hand rather than `#[from]`, which would also make the libtorch error the `source()` of
/// a message that already prints it (an error chain would print it twice).
impl From<tch::TchError> for ModelError {
    fn from(e: tch::TchError) -> Self {
        Self::Torch(e)
    }
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            cause: source,
        }
    }
}
