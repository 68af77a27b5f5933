//! `dflashd export --format speculators`: the drafter in vLLM speculators' own format
//! (`config.rs`), read by speculators' `from_pretrained` for DFlash, DSpark and DFlash2.
//!
//! The weights are the drafter's own, under the names speculators' models give them (the
//! same as SpecForge's: `fc`, `hidden_norm`, `layers.*`, `norm`, `markov_head.*`,
//! `confidence_head.proj.*`, `candidate_selector.*`). speculators does not store what it
//! takes from the target: on loading it reads `embed_tokens`, `lm_head` and the final norm
//! from the verifier the config names, so the export needs the target's directory and checks
//! that those tensors are there.
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::Kind;

use super::drafter_io::{dtype_name, write_layout};
use super::error::TrainError;
use crate::model::drafter::DrafterConfig;
use crate::model::weights::CheckpointIndex;

mod config;
#[cfg(test)]
mod tests;

pub use config::{refusal, speculators_json, Verifier, SPECULATORS_VERSION};

#[derive(Debug, thiserror::Error)]
pub enum SpeculatorsError {
    #[error("--format speculators: {0}")]
    Refused(String),
    #[error("--format speculators: the target {path}: {detail}")]
    Target { path: PathBuf, detail: String },
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// Writes `config.json` (speculators' format) and `model.safetensors` (the drafter's weights
/// in `dtype`) into `dir`, for `verifier`.
pub fn write_speculators(
    dir: &Path,
    cfg: &DrafterConfig,
    weights: &[(String, tch::Tensor)],
    dtype: Kind,
    verifier: &Verifier,
) -> Result<(), SpeculatorsError> {
    if let Some(why) = refusal(cfg, verifier) {
        return Err(SpeculatorsError::Refused(why));
    }
    let config = speculators_json(cfg, verifier, dtype_name(dtype));
    Ok(write_layout(dir, &config, weights, dtype)?)
}

/// What speculators needs of the target in `dir` (a Hugging Face directory: `config.json`,
/// `model.safetensors` or its index): its architectures and sizes (a multimodal config's
/// `text_config` read for them), and a tensor named `…embed_tokens.weight`; the LM head falls
/// back to the embeddings, as in speculators' loader. `dir` is written made absolute.
pub fn read_verifier(dir: &Path) -> Result<Verifier, SpeculatorsError> {
    let fail = |detail: String| SpeculatorsError::Target {
        path: dir.to_path_buf(),
        detail,
    };
    let config_path = dir.join("config.json");
    let text = fs::read_to_string(&config_path).map_err(|e| {
        fail(format!(
            "cannot read {}: {e}; --target takes the target's Hugging Face directory",
            config_path.display()
        ))
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| fail(format!("config.json: {e}")))?;
    let text_config = json.get("text_config").unwrap_or(&json);
    let size = |key: &str| {
        text_config
            .get(key)
            .or_else(|| json.get(key))
            .and_then(Value::as_i64)
            .ok_or_else(|| fail(format!("config.json has no integer `{key}`")))
    };
    let architectures = json
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let index = CheckpointIndex::open(dir).map_err(|e| {
        fail(format!(
            "{e}: speculators reads the embeddings, LM head and final norm from the target's \
             safetensors"
        ))
    })?;
    if !index.names().any(|n| n.ends_with("embed_tokens.weight")) {
        return Err(fail(
            "has no `embed_tokens.weight` tensor, which speculators loads the drafter's \
             embeddings from"
                .into(),
        ));
    }
    let absolute = fs::canonicalize(dir).map_err(|e| fail(e.to_string()))?;
    Ok(Verifier {
        name_or_path: absolute.display().to_string(),
        architectures,
        num_layers: size("num_hidden_layers")? as usize,
        hidden_size: size("hidden_size")?,
        vocab_size: size("vocab_size")?,
    })
}
