//! The GPU check's target side (`scripts/gpu-check.sh`, step 4): a few layers of the real
//! Qwen3.6-27B dimensions (random weights), one model per layer kind (Gated DeltaNet, gated
//! full attention), forward through [`TargetModel::features`] at S tokens in the device's
//! compute dtype. Per kind: time per layer, tokens/s per layer and MFU against a datasheet
//! peak, with the analytic FLOPs of `plan::flops::target_forward_flops`.
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use super::stats::median;
use super::timing::sync;
use dflash_engine::model::target::{
    Qwen3_5LayerKind, Qwen3_5TextConfig, TargetConfig, TargetModel,
};
use dflash_engine::plan::flops::target_forward_flops;

/// Qwen3.6-27B's text config (`dflash_engine::plan::reference`) with `layers` layers of one
/// kind.
pub fn qwen36_27b_layers(kind: Qwen3_5LayerKind, layers: usize) -> Qwen3_5TextConfig {
    Qwen3_5TextConfig {
        num_hidden_layers: layers,
        layer_types: vec![kind; layers],
        ..dflash_engine::plan::reference::qwen36_27b_text()
    }
}

/// The CPU self-test's dimensions: the same two layer kinds, GQA and the linear-attention
/// head split, small.
pub fn reduced_layers(kind: Qwen3_5LayerKind, layers: usize) -> Qwen3_5TextConfig {
    let mut c = qwen36_27b_layers(kind, layers);
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.linear_key_head_dim = 16;
    c.linear_value_head_dim = 16;
    c.linear_num_key_heads = 2;
    c.linear_num_value_heads = 4;
    c
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerKindResult {
    pub kind: String,
    pub layers: usize,
    pub seq_len: i64,
    pub forward_ms: Vec<f64>,
    pub median_ms_per_layer: Option<f64>,
    /// Tokens through one layer per second.
    pub tokens_per_s_per_layer: Option<f64>,
    pub flops_per_layer: f64,
    pub mfu: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetLayersSummary {
    pub device: String,
    pub dtype: String,
    pub hidden: i64,
    pub kinds: Vec<LayerKindResult>,
}

pub struct TargetLayersOptions {
    pub device: Device,
    pub reduced: bool,
    pub layers_per_kind: usize,
    pub seq_len: i64,
    pub warmup: usize,
    pub steps: usize,
    pub peak_flops: Option<f64>,
}

fn kind_name(k: Qwen3_5LayerKind) -> &'static str {
    match k {
        Qwen3_5LayerKind::LinearAttention => "gated_deltanet",
        Qwen3_5LayerKind::FullAttention => "gated_attention",
    }
}

/// Per-layer figures of `layers` layers that took `ms` for `seq_len` tokens.
pub fn per_layer(result: &mut LayerKindResult, median_ms: Option<f64>, peak_flops: Option<f64>) {
    let n = result.layers.max(1) as f64;
    result.median_ms_per_layer = median_ms.map(|m| m / n);
    result.tokens_per_s_per_layer = result
        .median_ms_per_layer
        .map(|m| result.seq_len as f64 / (m / 1e3));
    result.mfu = match (result.median_ms_per_layer, peak_flops) {
        (Some(m), Some(p)) => Some(result.flops_per_layer / (m / 1e3) / p),
        _ => None,
    };
}

pub fn run_target_layers(opts: &TargetLayersOptions) -> Result<TargetLayersSummary, BenchError> {
    let _rng = dflash_engine::device::global_rng::lock();
    let kind = dflash_engine::device::compute_kind(opts.device);
    let mut summary = TargetLayersSummary {
        device: dflash_engine::device::name(opts.device),
        dtype: super::step::kind_name(kind).into(),
        ..TargetLayersSummary::default()
    };
    for layer_kind in [
        Qwen3_5LayerKind::LinearAttention,
        Qwen3_5LayerKind::FullAttention,
    ] {
        let n = opts.layers_per_kind.max(1);
        let cfg = if opts.reduced {
            reduced_layers(layer_kind, n)
        } else {
            qwen36_27b_layers(layer_kind, n)
        };
        summary.hidden = cfg.hidden_size;
        let vocab = cfg.vocab_size;
        let cfg = TargetConfig::Qwen3_5(cfg);
        let taps = [n - 1];
        let flops = target_forward_flops(&cfg, &taps, 1, opts.seq_len);
        let model = TargetModel::random(cfg, opts.device, kind, 7);
        let ids = Tensor::randint(vocab, [1, opts.seq_len], (Kind::Int64, opts.device));
        let mut times = Vec::new();
        for i in 0..opts.warmup + opts.steps {
            sync(opts.device);
            let t = Instant::now();
            let out = tch::no_grad(|| model.features(&ids, &taps))?;
            sync(opts.device);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(out);
            if i >= opts.warmup {
                times.push(ms);
            }
        }
        let mut r = LayerKindResult {
            kind: kind_name(layer_kind).into(),
            layers: n,
            seq_len: opts.seq_len,
            flops_per_layer: flops / n as f64,
            ..LayerKindResult::default()
        };
        per_layer(&mut r, median(&times), opts.peak_flops);
        r.forward_ms = times;
        eprintln!("[target-layers] {}", serde_json::json!(r));
        summary.kinds.push(r);
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_layer_figures_divide_by_the_layer_count() {
        let mut r = LayerKindResult {
            layers: 4,
            seq_len: 4096,
            flops_per_layer: 1e12,
            ..LayerKindResult::default()
        };
        per_layer(&mut r, Some(400.0), Some(1e13));
        assert_eq!(r.median_ms_per_layer, Some(100.0));
        assert_eq!(r.tokens_per_s_per_layer, Some(40960.0));
        assert_eq!(r.mfu, Some(1.0));
    }

    #[test]
    fn both_layer_kinds_run_at_reduced_shapes() {
        let _rng = dflash_engine::device::global_rng::lock();
        let s = run_target_layers(&TargetLayersOptions {
            device: Device::Cpu,
            reduced: true,
            layers_per_kind: 2,
            seq_len: 64,
            warmup: 0,
            steps: 2,
            peak_flops: None,
        })
        .unwrap();
        let kinds: Vec<&str> = s.kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(kinds, ["gated_deltanet", "gated_attention"]);
        assert!(s
            .kinds
            .iter()
            .all(|k| k.forward_ms.len() == 2 && k.flops_per_layer > 0.0));
    }
}
