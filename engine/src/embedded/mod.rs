//! The built-in configuration `dflashd start` trains with when given no config: a tiny
//! Qwen3.5-style hybrid target pre-trained on the synthetic language of `assets/tiny/`, a small
//! drafter, and that language's dataset and held-out prompts (all compiled into the binary, so it
//! runs from any directory).
pub mod tiny_chat;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use dflash_shared::config::Config;
use tch::Device;

use crate::data::{has_consecutive_supervised, parse_pretokenized_line, LoadReport, Sample};
use crate::device::compute_kind;
use crate::model::drafter::DrafterConfig;
use crate::model::target::{TargetConfig, TargetModel};
use crate::train::config::TrainConfig;
use crate::train::error::TrainError;
use crate::train::run_config;

/// `assets/tiny/train.jsonl`, written by `assets/tiny/make_tiny_dataset.py`.
pub const TINY_DATASET: &str = include_str!("../../../assets/tiny/train.jsonl");
pub const TINY_DATASET_NAME: &str = "embedded:assets/tiny/train.jsonl";
/// `assets/tiny/heldout_prompts.jsonl` (same script, its own seed): prompts for the online
/// evaluation, none of them a training prompt.
pub const TINY_HELDOUT_PROMPTS: &str = include_str!("../../../assets/tiny/heldout_prompts.jsonl");
/// The pre-trained tiny target, `assets/tiny/target/` as `assets/tiny/make_tiny_target.py`
/// wrote it (HF Qwen3.5 layout, bf16), with the tokenizer and chat template
/// `assets/tiny/make_tiny_tokenizer.py` wrote for its language: file name and bytes.
/// `config.json` comes last: a directory holding it is complete (see [`write_tiny_target`]).
pub const TINY_TARGET_FILES: [(&str, &[u8]); 5] = [
    (
        "model.safetensors",
        include_bytes!("../../../assets/tiny/target/model.safetensors"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../../assets/tiny/target/generation_config.json"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../../assets/tiny/target/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../../assets/tiny/target/tokenizer_config.json"),
    ),
    (
        "config.json",
        include_bytes!("../../../assets/tiny/target/config.json"),
    ),
];
/// The tiny language's end-of-turn token: where the target's responses stop.
pub const TINY_END_OF_TURN: i64 = 2;
/// Row 511 never occurs in the tiny dataset; the drafter uses it as its mask token.
pub const TINY_MASK_TOKEN_ID: i64 = 511;
/// Where a run directory keeps the target it trained against (HF layout, for `eval --target`).
pub const TARGET_SUBDIR: &str = dflash_shared::run_dir::TARGET_DIR_NAME;

pub fn tiny_target_config() -> TargetConfig {
    TargetConfig::tiny_default()
}

/// `configs/tiny-cpu.toml`, compiled in (`dflash_shared::config::EMBEDDED_DEFAULT_TOML`).
pub fn tiny_run_config() -> Config {
    Config::embedded_default()
}

/// Two drafter layers (one sliding, one full) over two tapped target layers, block size 8,
/// with the embedded default's Domino head.
pub fn tiny_drafter_config(target: &TargetConfig) -> DrafterConfig {
    run_config::drafter_config(&tiny_run_config().drafter, target)
}

/// The same drafter with DFlash's head (the target's LM head alone): the DFlash layout every
/// serving engine loads, and the embedded default before its head became Domino.
pub fn tiny_dflash_drafter_config(target: &TargetConfig) -> DrafterConfig {
    DrafterConfig {
        head: crate::model::drafter::DrafterHead::Dflash,
        ..tiny_drafter_config(target)
    }
}

/// Samples of the embedded dataset: one per non-blank line ([`tiny_samples`] refuses a line
/// that is not one), known without parsing, so `config validate` judges a config's batch size
/// and held-out count against the embedded data as `start` does.
pub fn tiny_sample_count() -> usize {
    TINY_DATASET
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Sized so six epochs take a few minutes on two CPU cores.
pub fn tiny_train_config() -> TrainConfig {
    run_config::train_config(&tiny_run_config(), tiny_sample_count())
}

/// The embedded dataset as samples. It is part of the binary, so any line that does not parse
/// or fit is a build defect and an error, not a skipped line.
pub fn tiny_samples(
    vocab_size: i64,
    max_len: usize,
) -> Result<(Vec<Sample>, LoadReport), TrainError> {
    let mut report = LoadReport::default();
    let mut samples = Vec::new();
    let defect = |line: usize, why: String| TrainError::Config {
        key: TINY_DATASET_NAME.into(),
        detail: format!("line {line}: {why}"),
    };
    for (i, text) in TINY_DATASET.lines().enumerate() {
        report.lines += 1;
        if text.trim().is_empty() {
            report.blank_lines += 1;
            continue;
        }
        let mut sample = parse_pretokenized_line(text, Some(vocab_size as usize))
            .map_err(|why| defect(i + 1, why))?;
        if sample.len() > max_len {
            sample.input_ids.truncate(max_len);
            sample.loss_mask.truncate(max_len);
            report.truncated += 1;
        }
        if !has_consecutive_supervised(&sample.loss_mask) {
            return Err(defect(i + 1, "no two consecutive supervised tokens".into()));
        }
        report.samples += 1;
        samples.push(sample);
    }
    Ok((samples, report))
}

/// The prompts of `assets/tiny/heldout_prompts.jsonl`, each BOS, earlier turns, a user turn and
/// the assistant header: everything up to where a response starts. The file is part of the
/// binary and checked by this module's tests, so a line that does not parse is a build defect.
pub fn tiny_heldout_prompts() -> Vec<Vec<i64>> {
    #[derive(serde::Deserialize)]
    struct Prompt {
        input_ids: Vec<i64>,
    }
    TINY_HELDOUT_PROMPTS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<Prompt>(line)
                .unwrap_or_else(|e| panic!("assets/tiny/heldout_prompts.jsonl line {}: {e}", i + 1))
                .input_ids
        })
        .collect()
}

/// The run's target: the one `<run_dir>/target` holds when a previous run saved it there (runs
/// made before the target was pre-trained keep their random one), otherwise the embedded
/// pre-trained target, written there first so `dflashd eval --target RUN/target` finds it.
/// Without a run dir the files go to a scratch directory that is removed once loaded.
pub fn tiny_target(run_dir: Option<&Path>, device: Device) -> Result<TargetModel, TrainError> {
    let kind = compute_kind(device);
    if let Some(dir) = run_dir.map(|d| d.join(TARGET_SUBDIR)) {
        if !dir.join("config.json").is_file() {
            write_tiny_target(&dir)?;
        }
        return Ok(TargetModel::load(&dir, device, Some(kind))?);
    }
    let scratch = ScratchDir::new()?;
    write_tiny_target(&scratch.0)?;
    Ok(TargetModel::load(&scratch.0, device, Some(kind))?)
}

/// Writes the embedded target's files into `dir` (created if missing), each atomically and
/// `config.json` last, so a crash never leaves a directory that looks complete.
pub fn write_tiny_target(dir: &Path) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
    for (name, bytes) in TINY_TARGET_FILES {
        let path = dir.join(name);
        crate::files::atomic_write::write_atomic(&path, bytes).map_err(TrainError::io(&path))?;
    }
    Ok(())
}

/// A fresh directory under the system temp dir, removed (with its files) when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Result<Self, TrainError> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("dflash-embedded-target-{}-{n}", std::process::id()));
        // A directory of that name can only be a leftover of a dead process with our pid.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(TrainError::io(&dir))?;
        Ok(Self(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_dataset_is_clean_and_fits_the_tiny_target() {
        let cfg = tiny_target_config();
        let (samples, report) =
            tiny_samples(cfg.vocab_size(), tiny_train_config().training.max_length).unwrap();
        assert!(report.is_balanced());
        assert_eq!(report.truncated, 0);
        assert!(samples.len() >= 500, "{}", samples.len());
        assert!(samples
            .iter()
            .all(|s| s.input_ids.iter().all(|&t| t != TINY_MASK_TOKEN_ID)));
    }

    #[test]
    fn the_tiny_drafter_config_is_valid() {
        let d = tiny_drafter_config(&tiny_target_config());
        d.validate("embedded").unwrap();
        assert_eq!(
            d.target_layer_ids,
            DrafterConfig::build_target_layer_ids(6, 2)
        );
        assert_eq!(d.mask_token_id, TINY_MASK_TOKEN_ID);
    }
}
