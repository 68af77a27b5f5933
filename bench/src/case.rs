//! A drafter-step case on disk: what the engine and the PyTorch reference both load, so they run
//! the same weights on the same batch.
//!
//! Layout of a case directory:
//! - `drafter/`: `config.json` + `model.safetensors`, written by the engine's HF export
//!   ([`write_hf`]);
//! - `batch.safetensors`: `input_ids` `[B,S]` i64, `loss_mask` `[B,S]` u8, `anchors` `[B,N]`
//!   i64, `keep` `[B,N]` u8, `target_features` `[B,S,F]`, `embed_tokens` and `lm_head` `[V,H]`,
//!   and the engine's own `block_input_ids`, `targets` (i64) and `weights` (f32) `[B,N·bs]`,
//!   which the reference recomputes independently and checks;
//! - `meta.json`: [`StepMeta`].
use std::fs;
use std::path::{Path, PathBuf};

use rand::{Rng as _, SeedableRng};
use serde::{Deserialize, Serialize};
use tch::{nn::VarStore, Device, Kind, Tensor};

use super::error::BenchError;
use super::flops::{corrected_positions, head_positions, step_flops, teacher_positions, StepWork};
use super::presets::{FeatureSource, StepPreset, TokenSource};
use dflash_engine::data::Sample;
use dflash_engine::embedded::tiny_samples;
use dflash_engine::model::drafter::{Drafter, DrafterConfig};
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::anchors::{sample_anchors, AnchorBatch};
use dflash_engine::train::drafter_io::{named_parameters, write_hf};
use dflash_engine::train::labels::{block_input_ids, block_labels, default_gamma, LabelMaskRule};
use dflash_engine::train::loader::{collate, Batch};
use dflash_engine::train::optim::AdamWConfig;
use dflash_engine::train::rng::{streams, Rng};
use dflash_engine::train::trainer::PAD_ID;

pub const BATCH_FILE: &str = "batch.safetensors";
pub const META_FILE: &str = "meta.json";
pub const DRAFTER_DIR: &str = "drafter";

/// Everything about a case that is not a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMeta {
    pub config: String,
    pub batch: usize,
    pub seq_len: usize,
    pub num_blocks: usize,
    pub block_size: i64,
    /// Real (unpadded) tokens of the batch: what `tokens_per_s` counts, as the trainer does.
    pub tokens: usize,
    /// Block positions (`B·N·bs`) and those with a positive loss weight.
    pub positions: i64,
    pub weighted_positions: i64,
    pub vocab_size: i64,
    pub gamma: f64,
    /// Label masking rule (SpecForge's per-label mask).
    pub label_rule: String,
    /// Constant learning rate of the timed steps.
    pub lr: f64,
    pub adamw: AdamWConfig,
    pub loss_chunk_positions: i64,
    pub forward_flops: f64,
    pub backward_flops: f64,
    pub seed: u64,
}

fn random_rows(
    batch: usize,
    seq_len: usize,
    prompt_len: usize,
    vocab: i64,
    seed: u64,
) -> Vec<Sample> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..batch)
        .map(|_| Sample {
            // The mask token is the last row of the vocabulary; data never uses it.
            input_ids: (0..seq_len)
                .map(|_| rng.random_range(0..vocab - 1))
                .collect(),
            loss_mask: (0..seq_len).map(|p| u8::from(p >= prompt_len)).collect(),
        })
        .collect()
}

fn make_batch(preset: &StepPreset) -> Result<Batch, BenchError> {
    let samples = match preset.tokens {
        TokenSource::TinyDataset => tiny_samples(preset.vocab_size(), preset.seq_len)?
            .0
            .into_iter()
            .take(preset.batch)
            .collect(),
        TokenSource::Random { prompt_len } => random_rows(
            preset.batch,
            preset.seq_len,
            prompt_len,
            preset.vocab_size(),
            preset.seed,
        ),
    };
    let refs: Vec<&Sample> = samples.iter().collect();
    Ok(collate(&refs, PAD_ID, 0))
}

/// `(features [B,S,F], embed_tokens [V,H], lm_head [V,H])`, fp32 on the CPU.
fn features_and_tables(
    preset: &StepPreset,
    ids: &Tensor,
) -> Result<(Tensor, Tensor, Tensor), BenchError> {
    let d = &preset.drafter;
    match &preset.features {
        FeatureSource::Target(cfg) => {
            let target =
                TargetModel::random(cfg.clone(), Device::Cpu, Kind::Float, preset.seed as i64);
            let features = target.features(ids, &d.target_layer_ids)?;
            Ok((
                features,
                target.embed_tokens().shallow_clone(),
                target.lm_head().shallow_clone(),
            ))
        }
        FeatureSource::Random { vocab_size } => {
            let _rng = dflash_engine::device::global_rng::seeded(preset.seed as i64);
            let size = ids.size();
            let opts = (Kind::Float, Device::Cpu);
            let features = Tensor::randn([size[0], size[1], d.feature_size()], opts);
            let embed = Tensor::randn([*vocab_size, d.hidden_size], opts) * 0.02;
            let head = Tensor::randn([*vocab_size, d.hidden_size], opts) * 0.02;
            Ok((features, embed, head))
        }
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| BenchError::case(path, format!("cannot serialise: {e}")))?;
    fs::write(path, text + "\n").map_err(BenchError::io(path))
}

/// Builds the case for `preset` in `dir` (created) and returns its metadata.
pub fn prepare_step_case(preset: &StepPreset, dir: &Path) -> Result<StepMeta, BenchError> {
    fs::create_dir_all(dir).map_err(BenchError::io(dir))?;
    let d: &DrafterConfig = &preset.drafter;
    let bs = d.block_size as usize;
    let batch = make_batch(preset)?;
    let (b, s) = (batch.batch as i64, batch.seq_len as i64);
    let ids = Tensor::from_slice(&batch.input_ids).view([b, s]);
    let (features, embed, lm_head) = features_and_tables(preset, &ids)?;

    let mut rng = Rng::stream(preset.seed, streams::ANCHORS, 0);
    let anchors: AnchorBatch = sample_anchors(&batch.masks(), preset.num_anchors, &mut rng);
    let gamma = default_gamma(bs);
    let labels = block_labels(
        batch.rows(),
        &anchors,
        bs,
        Some(gamma),
        LabelMaskRule::Independent,
    );
    let block_ids = block_input_ids(batch.rows(), &anchors, bs, d.mask_token_id);
    let q = (anchors.width * bs) as i64;

    let _rng = dflash_engine::device::global_rng::seeded(preset.seed as i64);
    let vs = VarStore::new(Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), d);
    let file_kind = if preset.bf16_files {
        Kind::BFloat16
    } else {
        Kind::Float
    };
    write_hf(&dir.join(DRAFTER_DIR), d, &named_parameters(&vs), file_kind)?;

    let (anchor_t, keep_t) = anchors.to_tensors(Device::Cpu);
    let tensors: Vec<(&str, Tensor)> = vec![
        ("input_ids", ids),
        (
            "loss_mask",
            Tensor::from_slice(&batch.loss_mask).view([b, s]),
        ),
        ("anchors", anchor_t),
        ("keep", keep_t.to_kind(Kind::Uint8)),
        ("target_features", features.to_kind(file_kind)),
        ("embed_tokens", embed.to_kind(file_kind)),
        ("lm_head", lm_head.to_kind(file_kind)),
        (
            "block_input_ids",
            Tensor::from_slice(&block_ids).view([b, q]),
        ),
        ("targets", Tensor::from_slice(&labels.targets).view([b, q])),
        ("weights", Tensor::from_slice(&labels.weights).view([b, q])),
    ];
    let batch_path = dir.join(BATCH_FILE);
    let contiguous: Vec<(&str, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.contiguous()))
        .collect();
    Tensor::write_safetensors(&contiguous, &batch_path)?;

    let weighted_positions = labels.weights.iter().filter(|w| **w > 0.0).count() as i64;
    let flops = step_flops(&StepWork {
        drafter: d,
        batch: b,
        seq_len: s,
        anchors: &anchors.positions,
        keep: &anchors.keep,
        weighted_positions,
        corrected_positions: corrected_positions(d, &labels.weights),
        head_positions: head_positions(d, &labels.weights),
        teacher_positions: teacher_positions(d, weighted_positions),
        vocab_size: preset.vocab_size(),
    });
    let meta = StepMeta {
        config: preset.name.into(),
        batch: batch.batch,
        seq_len: batch.seq_len,
        num_blocks: anchors.width,
        block_size: d.block_size,
        tokens: batch.tokens,
        positions: b * q,
        weighted_positions,
        vocab_size: preset.vocab_size(),
        gamma,
        label_rule: "independent".into(),
        lr: preset.lr,
        adamw: AdamWConfig::default(),
        loss_chunk_positions: preset.loss_chunk_positions,
        forward_flops: flops.forward,
        backward_flops: flops.backward,
        seed: preset.seed,
    };
    write_json(&dir.join(META_FILE), &meta)?;
    Ok(meta)
}

pub fn read_meta(dir: &Path) -> Result<StepMeta, BenchError> {
    let path = dir.join(META_FILE);
    let text = fs::read_to_string(&path).map_err(BenchError::io(&path))?;
    serde_json::from_str(&text)
        .map_err(|e| BenchError::case(&path, format!("invalid metadata: {e}")))
}

/// The batch tensors of a case, by name, on `device`; float tensors in `kind`.
pub struct CaseTensors {
    tensors: Vec<(String, Tensor)>,
    path: PathBuf,
}

impl CaseTensors {
    pub fn read(dir: &Path, device: Device, kind: Kind) -> Result<Self, BenchError> {
        let path = dir.join(BATCH_FILE);
        let tensors = Tensor::read_safetensors(&path)?
            .into_iter()
            .map(|(n, t)| {
                let t = if t.is_floating_point() && n != "weights" {
                    t.to_kind(kind)
                } else {
                    t
                };
                (n, t.to_device(device))
            })
            .collect();
        Ok(Self { tensors, path })
    }

    pub fn get(&self, name: &str) -> Result<&Tensor, BenchError> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| BenchError::case(&self.path, format!("tensor `{name}` is missing")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::step_preset;

    #[test]
    fn random_rows_are_seeded_supervised_after_the_prompt_and_never_use_the_mask_token() {
        let _rng = dflash_engine::device::global_rng::lock();
        let a = random_rows(2, 50, 10, 32, 7);
        assert_eq!(a, random_rows(2, 50, 10, 32, 7));
        assert_ne!(a, random_rows(2, 50, 10, 32, 8));
        for row in &a {
            assert!(row.input_ids.iter().all(|&t| (0..31).contains(&t)));
            assert_eq!(row.loss_mask.iter().filter(|&&m| m == 1).count(), 40);
            assert!(row.loss_mask[..10].iter().all(|&m| m == 0));
        }
    }

    #[test]
    fn the_tiny_case_round_trips_through_disk() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let preset = step_preset("tiny").unwrap();
        let meta = prepare_step_case(&preset, dir.path()).unwrap();
        assert_eq!(read_meta(dir.path()).unwrap(), meta);
        assert_eq!(meta.batch, preset.batch);
        assert!(meta.weighted_positions > 0 && meta.weighted_positions < meta.positions);
        assert!(meta.forward_flops > 0.0 && meta.backward_flops > meta.forward_flops);
        let t = CaseTensors::read(dir.path(), Device::Cpu, Kind::Float).unwrap();
        let f = t.get("target_features").unwrap().size();
        assert_eq!(
            f,
            [
                meta.batch as i64,
                meta.seq_len as i64,
                preset.drafter.feature_size()
            ]
        );
        assert_eq!(
            t.get("weights").unwrap().size(),
            [meta.batch as i64, meta.positions / meta.batch as i64]
        );
        let err = t.get("nope").err().unwrap().to_string();
        assert!(
            err.contains("`nope` is missing") && err.contains(BATCH_FILE),
            "{err}"
        );
        assert!(dir.path().join(DRAFTER_DIR).join("config.json").is_file());
    }
}
