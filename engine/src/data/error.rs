//! Errors that stop a data load. Per-line problems are not errors: they become
//! [`BadLine`](super::BadLine)s in the [`LoadReport`](super::LoadReport).
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{what} {path} does not exist; check the path in the config (`data` / `model` keys)")]
    MissingFile { what: &'static str, path: PathBuf },

    #[error("cannot read {what} {path}: {cause}")]
    Io {
        what: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },

    #[error(
        "cannot load tokenizer {path}: {reason}; expected a Hugging Face `tokenizer.json` \
         (the one shipped with the target model)"
    )]
    UnreadableTokenizer { path: PathBuf, reason: String },

    #[error(
        "no chat template for {model_dir}: neither `chat_template.jinja` nor a `chat_template` \
         key in `tokenizer_config.json`; point `data.chat_template` at a .jinja file or use \
         pre-tokenized data"
    )]
    MissingChatTemplate { model_dir: PathBuf },

    #[error("bad chat template in {path}: {reason}; fix the template or point `data.chat_template` at a working one")]
    BadTemplate { path: PathBuf, reason: String },

    #[error("bad {path}: {reason}")]
    BadConfigFile { path: PathBuf, reason: String },

    #[error("invalid data option `{key}`: expected {expected}, found {found}")]
    BadOption {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error(
        "{path} has no usable sample: {lines} lines, {bad} bad, {too_short} without two \
         consecutive supervised tokens{first_bad}; fix the data (or its format option) and retry"
    )]
    NoUsableSamples {
        path: PathBuf,
        lines: u64,
        bad: usize,
        too_short: usize,
        /// `"; first bad line: file:line: reason"` when there is one, else empty.
        first_bad: String,
    },

    #[error(
        "{path}: {count} bad prompt {noun}: {lines}; fix or remove {pronoun} and retry",
        noun = if *count == 1 { "line" } else { "lines" },
        pronoun = if *count == 1 { "it" } else { "them" }
    )]
    BadPrompts {
        path: PathBuf,
        count: usize,
        /// `file:line: reason` of the first few, `; `-separated.
        lines: String,
    },

    #[error("{path} holds no prompt (only blank lines); give one JSON object a line")]
    NoPrompts { path: PathBuf },
}
