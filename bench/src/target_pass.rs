//! The target feature-pass case: a random Qwen3.5 hybrid target saved in the HF layout, token
//! ids, and the tap layers; the engine's [`TargetModel::features`] and `transformers` (the
//! reference script `benches/reference/bench_target.py`) run the same checkpoint on the same ids.
//! The engine writes its features to `features-engine.safetensors`; the reference reports its
//! difference from them.
use std::fs;
use std::path::Path;

use rand::{Rng as _, SeedableRng};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use super::presets::TargetPreset;
use super::step::StepRun;
use super::timing::timed_loop;
use dflash_engine::model::target::TargetModel;

pub const TARGET_DIR: &str = "target";
pub const IDS_FILE: &str = "input_ids.safetensors";
pub const TARGET_META: &str = "target_case.json";
pub const ENGINE_FEATURES: &str = "features-engine.safetensors";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetMeta {
    pub batch: usize,
    pub seq_len: usize,
    pub layer_ids: Vec<usize>,
    pub hidden_size: i64,
    pub num_layers: usize,
    pub vocab_size: i64,
}

pub fn prepare_target_case(p: &TargetPreset, dir: &Path) -> Result<TargetMeta, BenchError> {
    fs::create_dir_all(dir).map_err(BenchError::io(dir))?;
    let target = TargetModel::random(p.target.clone(), Device::Cpu, Kind::Float, p.seed as i64);
    target.save_hf(&dir.join(TARGET_DIR))?;
    let vocab = p.target.vocab_size();
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed);
    let ids: Vec<i64> = (0..p.batch * p.seq_len)
        .map(|_| rng.random_range(0..vocab))
        .collect();
    let ids = Tensor::from_slice(&ids).view([p.batch as i64, p.seq_len as i64]);
    let layers: Vec<i64> = p.layer_ids.iter().map(|&l| l as i64).collect();
    Tensor::write_safetensors(
        &[
            ("input_ids", ids),
            ("layer_ids", Tensor::from_slice(&layers)),
        ],
        dir.join(IDS_FILE),
    )?;
    let meta = TargetMeta {
        batch: p.batch,
        seq_len: p.seq_len,
        layer_ids: p.layer_ids.clone(),
        hidden_size: p.target.hidden_size(),
        num_layers: p.target.num_layers(),
        vocab_size: vocab,
    };
    let path = dir.join(TARGET_META);
    let text =
        serde_json::to_string_pretty(&meta).map_err(|e| BenchError::case(&path, e.to_string()))?;
    fs::write(&path, text + "\n").map_err(BenchError::io(&path))?;
    Ok(meta)
}

/// Times [`TargetModel::features`] on the case in `dir` and writes the first result.
pub fn run_engine_target(dir: &Path, warmup: usize, steps: usize) -> Result<StepRun, BenchError> {
    let path = dir.join(TARGET_META);
    let text = fs::read_to_string(&path).map_err(BenchError::io(&path))?;
    let meta: TargetMeta = serde_json::from_str(&text)
        .map_err(|e| BenchError::case(&path, format!("invalid metadata: {e}")))?;
    let target = TargetModel::load(&dir.join(TARGET_DIR), Device::Cpu, Some(Kind::Float))?;
    let ids_path = dir.join(IDS_FILE);
    let ids = Tensor::read_safetensors(&ids_path)?
        .into_iter()
        .find(|(n, _)| n == "input_ids")
        .map(|(_, t)| t)
        .ok_or_else(|| BenchError::case(&ids_path, "tensor `input_ids` is missing"))?;
    let mut first = None;
    let timed = timed_loop(warmup, steps, Device::Cpu, |i| {
        let features = target.features(&ids, &meta.layer_ids)?;
        if i == 0 {
            first = Some(features);
        }
        Ok(())
    })?;
    if let Some(features) = first {
        Tensor::write_safetensors(&[("hidden_states", features)], dir.join(ENGINE_FEATURES))?;
    }
    let mut run = StepRun {
        implementation: "engine".into(),
        device: "cpu".into(),
        dtype: "f32".into(),
        threads: tch::get_num_threads() as i64,
        tokens: Some(meta.batch * meta.seq_len),
        ..StepRun::default()
    };
    run.absorb(timed);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::target_preset;
    use dflash_engine::model::target::TargetConfig;

    #[test]
    fn the_engine_target_case_writes_features_of_every_tap() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let mut p = target_preset(true);
        p.target = TargetConfig::tiny_default();
        p.layer_ids = vec![1, 2];
        p.seq_len = 70;
        let meta = prepare_target_case(&p, dir.path()).unwrap();
        let run = run_engine_target(dir.path(), 0, 1).unwrap();
        assert_eq!(run.step_ms.len(), 1);
        let saved = Tensor::read_safetensors(dir.path().join(ENGINE_FEATURES)).unwrap();
        assert_eq!(saved[0].1.size(), [1, 70, 2 * meta.hidden_size]);
    }
}
