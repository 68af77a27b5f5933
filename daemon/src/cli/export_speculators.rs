//! `dflashd export --format speculators`: the drafter in vLLM speculators' own format, for a
//! named target (speculators' verifier), and what serving it needs.
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use dflash_engine::model::drafter::DrafterConfig;
use dflash_engine::train::speculators::{
    read_verifier, write_speculators, Verifier, SPECULATORS_VERSION,
};
use dflash_shared::run_dir::{CHECKPOINTS_DIR_NAME, TARGET_DIR_NAME};
use tch::{Kind, Tensor};

/// Writes the export into `out` for the target `target` (or, without one, the `target/` of
/// the run dir the checkpoint `checkpoint` lies in) and returns what to tell the user.
pub fn export(
    checkpoint: &Path,
    target: Option<&Path>,
    out: &Path,
    config: &DrafterConfig,
    weights: &[(String, Tensor)],
    dtype: Kind,
) -> Result<String> {
    let Some(target) = target
        .map(Path::to_path_buf)
        .or_else(|| run_target(checkpoint))
    else {
        bail!(
            "--format speculators needs the drafter's target: speculators stores no embeddings, \
             LM head or final norm and loads them from the target when it loads the drafter. \
             Give --target DIR (the target's Hugging Face directory: config.json and \
             model.safetensors)"
        );
    };
    let verifier = read_verifier(&target)?;
    write_speculators(out, config, weights, dtype, &verifier)?;
    Ok(hints(config, out, &verifier))
}

/// `<run dir>/target` when `checkpoint` is `<run dir>/checkpoints/<step>` and that directory
/// holds a config (the embedded default writes its target there).
fn run_target(checkpoint: &Path) -> Option<PathBuf> {
    let checkpoints = checkpoint.parent()?;
    if checkpoints.file_name()? != CHECKPOINTS_DIR_NAME {
        return None;
    }
    let target = checkpoints.parent()?.join(TARGET_DIR_NAME);
    target.join("config.json").is_file().then_some(target)
}

/// What was written and what loading it needs.
fn hints(config: &DrafterConfig, out: &Path, verifier: &Verifier) -> String {
    let model = if config.head.dspark().is_some() {
        "DSparkDraftModel"
    } else if config.head.dflash2().is_some() {
        "DFlash2DraftModel"
    } else {
        "DFlashDraftModel"
    };
    format!(
        "written in vLLM speculators {SPECULATORS_VERSION}'s own format: \
         speculators.models {model}.from_pretrained(\"{dir}\") loads it (`make soak` checks its \
         logits against ours), reading the embeddings, LM head and final norm from the target \
         {target}, which must stay there (or edit speculators_config.verifier.name_or_path).\n",
        dir = out.display(),
        target = verifier.name_or_path,
    )
}
