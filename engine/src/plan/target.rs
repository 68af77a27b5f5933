//! One target replica's memory: the weights it loads and the feature pass's working set.
//!
//! The weights follow the code exactly (`daemon/src/runtime/setup.rs::prepare` loads every
//! layer, the embedding and the LM head through `TargetModel::load`; replicas copy all of it,
//! `model/target/mod.rs::TargetModel::replicate`).
//! The forward's working set is an estimate from the shapes (the largest layer's transients
//! plus the residual stream and the taps), not checked against a measurement: the bench
//! case checks the drafter side only.
use super::shape::ActivationPrecision;
use super::Consumer;
use crate::model::target::{param_specs, Qwen3_5LayerKind, TargetConfig};

/// Consumers of one target replica for a `batch × seq_len` feature pass that keeps the
/// states of `taps` (the layers it reads, `FeatureRequest::layers_read`: the last hidden
/// state counts as one more).
pub fn target_memory(
    t: &TargetConfig,
    taps: &[usize],
    batch: i64,
    seq_len: i64,
    p: ActivationPrecision,
) -> Vec<Consumer> {
    let e = p.bytes();
    let weights: f64 = param_specs(t, t.num_layers())
        .iter()
        .map(|s| s.shape.iter().product::<i64>() as f64)
        .sum();
    let tokens = (batch * seq_len) as f64;
    let h = t.hidden_size() as f64;
    let i = t.intermediate_size() as f64;
    // The MLP holds gate, up and their product at once.
    let mlp = 3.0 * tokens * i * e;
    // A Gated DeltaNet layer works in fp32 on q, k, v expanded to the value heads, plus the
    // gates and the chunk-local matrices (64 × 64 per head and chunk).
    let deltanet = match t {
        TargetConfig::Qwen3_5(c) if c.layer_types.contains(&Qwen3_5LayerKind::LinearAttention) => {
            let hv = c.linear_num_value_heads as f64;
            let (dk, dv) = (c.linear_key_head_dim as f64, c.linear_value_head_dim as f64);
            tokens * hv * (2.0 * dk + 2.0 * dv) * 4.0 * 2.0 + tokens * hv * 64.0 * 4.0 * 2.0
        }
        _ => 0.0,
    };
    vec![
        Consumer::new("target weights", weights * e),
        Consumer::new("tapped hidden states", tokens * taps.len() as f64 * h * e),
        Consumer::new("residual stream", 2.0 * tokens * h * e),
        Consumer::new("largest layer's working set (estimate)", mlp.max(deltanet)),
    ]
}
