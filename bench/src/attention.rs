//! The attention case: one drafter attention call (forward + backward) at the training shape
//! (spec §2.5: anchors × block queries over `context + anchors·block` keys), block-sparse vs the
//! dense mask, each in its own process so peak memory is per back-end.
//!
//! Case files (`attention.safetensors`): `query` `[1,Q,Hq,D]`, `context_key`/`context_value`
//! `[1,S,Hkv,D]`, `block_key`/`block_value` `[1,Q,Hkv,D]`, `anchors` `[1,N]` i64, `keep` `[1,N]`
//! u8, `probe` `[1,Q,Hq,D]` (backward runs on `Σ out·probe`); `attention.json` holds the shape.
//! The block-sparse run writes its forward output to `out-engine-block_sparse.safetensors`;
//! later runs (dense, the reference) report their difference from it.
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use super::presets::AttentionPreset;
use super::step::StepRun;
use super::timing::timed_loop;
use dflash_engine::model::attention::{
    block_attention, AttentionBackend, BlockAttentionInputs, LayerRule,
};
use dflash_engine::train::anchors::sample_anchors;
use dflash_engine::train::rng::{streams, Rng};

pub const ATTENTION_FILE: &str = "attention.safetensors";
pub const ATTENTION_META: &str = "attention.json";
pub const BLOCK_SPARSE_OUT: &str = "out-engine-block_sparse.safetensors";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionMeta {
    pub anchors: usize,
    pub block_size: i64,
    pub context_len: usize,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub window: Option<i64>,
    pub dense_grid_elements: i64,
}

pub fn backend_name(backend: AttentionBackend) -> &'static str {
    match backend {
        AttentionBackend::BlockSparse => "block_sparse",
        AttentionBackend::DenseMask => "dense_mask",
    }
}

pub fn prepare_attention_case(
    p: &AttentionPreset,
    dir: &Path,
) -> Result<AttentionMeta, BenchError> {
    fs::create_dir_all(dir).map_err(BenchError::io(dir))?;
    let mask = vec![1u8; p.context_len];
    let mut rng = Rng::stream(p.seed, streams::ANCHORS, 0);
    let anchors = sample_anchors(&[&mask], p.anchors, &mut rng);
    if anchors.width != p.anchors {
        return Err(BenchError::case(
            dir,
            format!(
                "context {} leaves only {} anchors, {} asked",
                p.context_len, anchors.width, p.anchors
            ),
        ));
    }
    let (anchor_t, keep_t) = anchors.to_tensors(Device::Cpu);
    let _rng = dflash_engine::device::global_rng::seeded(p.seed as i64);
    let opts = (Kind::Float, Device::Cpu);
    let (q, s) = (p.queries(), p.context_len as i64);
    let tensors = [
        ("query", Tensor::randn([1, q, p.heads, p.head_dim], opts)),
        (
            "context_key",
            Tensor::randn([1, s, p.kv_heads, p.head_dim], opts),
        ),
        (
            "context_value",
            Tensor::randn([1, s, p.kv_heads, p.head_dim], opts),
        ),
        (
            "block_key",
            Tensor::randn([1, q, p.kv_heads, p.head_dim], opts),
        ),
        (
            "block_value",
            Tensor::randn([1, q, p.kv_heads, p.head_dim], opts),
        ),
        ("anchors", anchor_t),
        ("keep", keep_t.to_kind(Kind::Uint8)),
        ("probe", Tensor::randn([1, q, p.heads, p.head_dim], opts)),
    ];
    Tensor::write_safetensors(&tensors, dir.join(ATTENTION_FILE))?;
    let meta = AttentionMeta {
        anchors: p.anchors,
        block_size: p.block_size,
        context_len: p.context_len,
        heads: p.heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
        window: p.window,
        dense_grid_elements: p.dense_grid_elements(),
    };
    let path = dir.join(ATTENTION_META);
    let text =
        serde_json::to_string_pretty(&meta).map_err(|e| BenchError::case(&path, e.to_string()))?;
    fs::write(&path, text + "\n").map_err(BenchError::io(&path))?;
    Ok(meta)
}

fn read_meta(dir: &Path) -> Result<AttentionMeta, BenchError> {
    let path = dir.join(ATTENTION_META);
    let text = fs::read_to_string(&path).map_err(BenchError::io(&path))?;
    serde_json::from_str(&text)
        .map_err(|e| BenchError::case(&path, format!("invalid metadata: {e}")))
}

fn take(
    tensors: &mut Vec<(String, Tensor)>,
    name: &str,
    path: &Path,
) -> Result<Tensor, BenchError> {
    let i = tensors
        .iter()
        .position(|(n, _)| n == name)
        .ok_or_else(|| BenchError::case(path, format!("tensor `{name}` is missing")))?;
    Ok(tensors.swap_remove(i).1)
}

/// Times `backend` on the case in `dir` (forward + backward of `Σ out·probe` per step).
pub fn run_engine_attention(
    dir: &Path,
    backend: AttentionBackend,
    warmup: usize,
    steps: usize,
) -> Result<StepRun, BenchError> {
    let meta = read_meta(dir)?;
    let path = dir.join(ATTENTION_FILE);
    let mut t = Tensor::read_safetensors(&path)?;
    let leaf = |x: Tensor| x.set_requires_grad(true);
    let query = leaf(take(&mut t, "query", &path)?);
    let context_key = leaf(take(&mut t, "context_key", &path)?);
    let context_value = leaf(take(&mut t, "context_value", &path)?);
    let block_key = leaf(take(&mut t, "block_key", &path)?);
    let block_value = leaf(take(&mut t, "block_value", &path)?);
    let anchors = take(&mut t, "anchors", &path)?;
    let keep = take(&mut t, "keep", &path)?.to_kind(Kind::Bool);
    let probe = take(&mut t, "probe", &path)?;
    let rule = match meta.window {
        None => LayerRule::Full,
        Some(window) => LayerRule::Sliding { window },
    };
    let inputs = BlockAttentionInputs {
        query: &query,
        context_key: &context_key,
        context_value: &context_value,
        block_key: &block_key,
        block_value: &block_value,
        anchors: &anchors,
        keep: &keep,
        block_size: meta.block_size,
        rule,
        scale: (meta.head_dim as f64).powf(-0.5),
    };
    let leaves = [
        &query,
        &context_key,
        &context_value,
        &block_key,
        &block_value,
    ];
    let mut first_output = None;
    let timed = timed_loop(warmup, steps, Device::Cpu, |i| {
        let out = block_attention(&inputs, backend);
        (&out * &probe).sum(Kind::Float).backward();
        for x in leaves {
            x.shallow_clone().zero_grad();
        }
        if i == 0 {
            first_output = Some(out.detach());
        }
        Ok(())
    })?;
    let mut run = StepRun {
        implementation: format!("engine-{}", backend_name(backend)),
        device: "cpu".into(),
        dtype: "f32".into(),
        threads: tch::get_num_threads() as i64,
        positions: Some(meta.anchors as i64 * meta.block_size),
        ..StepRun::default()
    };
    run.absorb(timed);
    if let Some(out) = first_output {
        let reference = dir.join(BLOCK_SPARSE_OUT);
        match backend {
            AttentionBackend::BlockSparse => {
                Tensor::write_safetensors(&[("out", out)], &reference)?
            }
            AttentionBackend::DenseMask => {
                if let Ok(saved) = Tensor::read_safetensors(&reference) {
                    let theirs = &saved[0].1;
                    run.max_abs_diff = Some((&out - theirs).abs().max().double_value(&[]));
                    run.rel_l2_diff = Some(
                        (&out - theirs).norm().double_value(&[])
                            / theirs.norm().double_value(&[]).max(1e-30),
                    );
                }
            }
        }
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_back_ends_agree_on_a_small_case_and_report_their_difference() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let preset = AttentionPreset {
            anchors: 8,
            block_size: 4,
            context_len: 64,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            window: None,
            seed: 1,
        };
        prepare_attention_case(&preset, dir.path()).unwrap();
        let sparse = run_engine_attention(dir.path(), AttentionBackend::BlockSparse, 0, 2).unwrap();
        assert_eq!(sparse.step_ms.len(), 2);
        assert!(dir.path().join(BLOCK_SPARSE_OUT).is_file());
        let dense = run_engine_attention(dir.path(), AttentionBackend::DenseMask, 0, 1).unwrap();
        assert!(
            dense.max_abs_diff.unwrap() < 1e-5,
            "{:?}",
            dense.max_abs_diff
        );
        assert_eq!(dense.implementation, "engine-dense_mask");
    }

    #[test]
    fn too_many_anchors_for_the_context_is_a_clear_error() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let preset = AttentionPreset {
            anchors: 100,
            block_size: 4,
            context_len: 16,
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            window: None,
            seed: 1,
        };
        let err = prepare_attention_case(&preset, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("leaves only 15 anchors, 100 asked"), "{err}");
    }
}
