//! The built-in configuration `dflashd start` trains with when given no config: a tiny random
//! Qwen3.5-style hybrid target, a small drafter, and the synthetic dataset in `assets/tiny/`
//! (compiled into the binary, so it runs from any directory).
use std::path::Path;

use dflash_shared::config::Config;
use tch::Device;

use super::config::TrainConfig;
use super::error::TrainError;
use super::run_config;
use crate::data::{has_consecutive_supervised, parse_pretokenized_line, LoadReport, Sample};
use crate::device::compute_kind;
use crate::model::drafter::DrafterConfig;
use crate::model::target::{TargetConfig, TargetModel};

/// `assets/tiny/train.jsonl`, written by `assets/tiny/make_tiny_dataset.py`.
pub const TINY_DATASET: &str = include_str!("../../../assets/tiny/train.jsonl");
pub const TINY_DATASET_NAME: &str = "embedded:assets/tiny/train.jsonl";
/// Seed of the random target's weights (fixed: every run of the default sees the same target).
pub const TINY_TARGET_SEED: i64 = 20_260_601;
/// Row 511 never occurs in the tiny dataset; the drafter uses it as its mask token.
pub const TINY_MASK_TOKEN_ID: i64 = 511;
/// Where a run directory keeps the target it trained against (HF layout, for `eval --target`).
pub const TARGET_SUBDIR: &str = "target";

pub fn tiny_target_config() -> TargetConfig {
    TargetConfig::tiny_default()
}

/// `configs/tiny-cpu.toml`, compiled in (`dflash_shared::config::EMBEDDED_DEFAULT_TOML`).
pub fn tiny_run_config() -> Config {
    Config::embedded_default()
}

/// Two drafter layers (one sliding, one full) over two tapped target layers, block size 8.
pub fn tiny_drafter_config(target: &TargetConfig) -> DrafterConfig {
    run_config::drafter_config(&tiny_run_config().drafter, target)
}

/// Sized so six epochs take a few minutes on two CPU cores.
pub fn tiny_train_config() -> TrainConfig {
    let samples = TINY_DATASET
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    run_config::train_config(&tiny_run_config(), samples)
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

/// The run's target: loaded from `<run_dir>/target` when a previous run saved it there,
/// otherwise created from the fixed seed and saved there.
pub fn tiny_target(run_dir: Option<&Path>, device: Device) -> Result<TargetModel, TrainError> {
    let kind = compute_kind(device);
    if let Some(dir) = run_dir.map(|d| d.join(TARGET_SUBDIR)) {
        if dir.join("config.json").is_file() {
            return Ok(TargetModel::load(&dir, device, Some(kind))?);
        }
        let target = TargetModel::random(tiny_target_config(), device, kind, TINY_TARGET_SEED);
        target.save_hf(&dir)?;
        return Ok(target);
    }
    Ok(TargetModel::random(
        tiny_target_config(),
        device,
        kind,
        TINY_TARGET_SEED,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_dataset_is_clean_and_fits_the_tiny_target() {
        let cfg = tiny_target_config();
        let (samples, report) =
            tiny_samples(cfg.vocab_size(), tiny_train_config().max_len).unwrap();
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
        tiny_train_config().validate().unwrap();
    }
}
