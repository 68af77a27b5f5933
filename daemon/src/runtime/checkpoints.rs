//! The run's checkpoints as status lists them: step, directory, when it was written, size.
//! Read from each checkpoint's manifest, which already records every file's size.
use std::path::Path;

use dflash_shared::status::CheckpointInfo;

use dflash_engine::train::checkpoint::{self, Manifest, MANIFEST};

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
