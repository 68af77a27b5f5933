//! The built-in configuration `dflashd start` trains with when given no config: a tiny random
//! Qwen3.5-style hybrid target, a small drafter, and the synthetic dataset in `assets/tiny/`
//! (compiled into the binary, so it runs from any directory).
use std::path::Path;

use tch::Device;

use super::config::TrainConfig;
use super::error::TrainError;
use super::trainer::compute_kind;
use crate::data::{has_consecutive_supervised, parse_pretokenized_line, LoadReport, Sample};
use crate::engine::model::drafter::{DrafterConfig, LayerType};
use crate::engine::model::target::{TargetConfig, TargetModel};

/// `assets/tiny/train.jsonl`, written by `assets/tiny/make_tiny_dataset.py`.
pub const TINY_DATASET: &str = include_str!("../../../../assets/tiny/train.jsonl");
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

/// Two drafter layers (one sliding, one full) over two tapped target layers, block size 8.
pub fn tiny_drafter_config(target: &TargetConfig) -> DrafterConfig {
    let layers = 2;
    let hidden = target.hidden_size();
    DrafterConfig {
        hidden_size: hidden,
        intermediate_size: 3 * hidden,
        num_hidden_layers: layers,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: hidden / 4,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        layer_types: vec![LayerType::Sliding, LayerType::Full],
        sliding_window: Some(32),
        block_size: 8,
        mask_token_id: TINY_MASK_TOKEN_ID,
        target_layer_ids: DrafterConfig::build_target_layer_ids(target.num_layers(), layers),
        target_hidden_size: hidden,
        vocab_size: target.vocab_size(),
        max_position_embeddings: 4096,
        num_target_layers: Some(target.num_layers()),
        initializer_range: 0.02,
    }
}

/// Sized so six epochs take a few minutes on two CPU cores.
pub fn tiny_train_config() -> TrainConfig {
    TrainConfig {
        seed: 1,
        epochs: 6,
        batch_size: 8,
        num_anchors: 16,
        lr: 2e-3,
        held_out: 48,
        eval_every: 50,
        checkpoint_every: 100,
        keep_checkpoints: 3,
        max_len: 256,
        loss_chunk_positions: 1024,
        eval_anchors_per_forward: 64,
        ..TrainConfig::default()
    }
}

/// The embedded dataset as samples. It is part of the binary, so any line that does not parse
/// or fit is a build defect and an error, not a skipped line.
pub fn tiny_samples(vocab_size: i64, max_len: usize) -> Result<(Vec<Sample>, LoadReport), TrainError> {
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
        let mut sample =
            parse_pretokenized_line(text, Some(vocab_size as usize)).map_err(|why| defect(i + 1, why))?;
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
        assert_eq!(d.target_layer_ids, vec![1, 3]);
        tiny_train_config().validate().unwrap();
    }
}
