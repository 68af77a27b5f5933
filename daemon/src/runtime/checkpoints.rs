//! The run's checkpoints as status lists them: step, directory, when it was written, size.
//! Read from each checkpoint's manifest, which already records every file's size. And the
//! run's best checkpoint, as the trainer holds it.
use std::path::Path;

use dflash_shared::best_checkpoint::{BestCheckpoint, NoBestCheckpoint};
use dflash_shared::status::CheckpointInfo;

use dflash_engine::train::best_checkpoint::no_best;
use dflash_engine::train::checkpoint::{self, Manifest, MANIFEST};
use dflash_engine::train::Trainer;

/// One published checkpoint directory, or `None` if its manifest cannot be read.
pub fn describe(dir: &Path) -> Option<CheckpointInfo> {
    let manifest: Manifest = checkpoint::read_json(dir, MANIFEST).ok()?;
    let written_ms = std::fs::metadata(dir.join(MANIFEST))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    Some(CheckpointInfo {
        step: manifest.step,
        path: dir.display().to_string(),
        written_ms,
        bytes: manifest.files.values().map(|f| f.bytes).sum(),
    })
}

/// Every published checkpoint under `root`, oldest first.
pub fn on_disk(root: &Path) -> Vec<CheckpointInfo> {
    checkpoint::list(root)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, dir)| describe(dir))
        .collect()
}

/// The trainer's best checkpoint under `root` as status names it, or why it has none.
pub fn best_standing(trainer: &Trainer, root: &Path) -> Result<BestCheckpoint, NoBestCheckpoint> {
    match trainer.best_checkpoint() {
        Some(best) => Ok(BestCheckpoint {
            step: best.step,
            tau_tree: best.tau_tree,
            budget: best.budget,
            path: best.dir(root).display().to_string(),
        }),
        None => Err(no_best(trainer.config(), trainer.step_count())),
    }
}
