//! Analytic FLOP counts of one drafter training step and of one target forward, for
//! throughput as a fraction of a peak (`dflash-bench` and `dflashd plan` count with these).
//!
//! Conventions (the usual ones for MFU): a multiply-add is 2 FLOPs; only matmuls count
//! (norms, RoPE, softmax and the optimizer's elementwise work are left out); attention counts
//! the *useful* work, i.e. only the (query, key) pairs the visibility rule allows, whatever an
//! implementation computes and throws away. Backward is 2x forward for trainable matmuls
//! (input and weight gradients), 1x for the frozen LM head (input gradient only) and for `fc`
//! (its input, the target features, needs no gradient).
use crate::model::attention::visibility::LayerRule;
use crate::model::drafter::{DrafterConfig, LayerType};
use crate::model::target::{param_specs, TargetConfig};

/// Visible (query, key) pairs of one drafter layer over a batch of blocks: context keys plus
/// own-block keys, exactly as the rule in `attention::visibility` counts them.
pub fn visible_pairs(
    rule: LayerRule,
    anchors: &[i64],
    keep: &[bool],
    block_size: i64,
    context_len: i64,
) -> u64 {
    let mut pairs = 0u64;
    for (&anchor, &kept) in anchors.iter().zip(keep) {
        for off in 0..block_size {
            let context = if kept {
                let hi = anchor.min(context_len);
                let lo = match rule {
                    LayerRule::Full => 0,
                    LayerRule::Sliding { window } => (anchor + off - (window - 1)).max(0),
                };
                (hi - lo).max(0)
            } else {
                0
            };
            let own = match rule {
                LayerRule::Full => block_size,
                LayerRule::Sliding { .. } => off + 1,
            };
            pairs += (context + own) as u64;
        }
    }
    pairs
}

/// What one step processes.
#[derive(Debug, Clone)]
pub struct StepWork<'a> {
    pub drafter: &'a DrafterConfig,
    pub batch: i64,
    pub seq_len: i64,
    /// Row-major `[batch, blocks]`.
    pub anchors: &'a [i64],
    pub keep: &'a [bool],
    /// Positions projected through the LM head (weight > 0).
    pub weighted_positions: i64,
    pub vocab_size: i64,
}

/// Forward and backward FLOPs of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFlops {
    pub forward: f64,
    pub backward: f64,
}

impl StepFlops {
    pub fn total(&self) -> f64 {
        self.forward + self.backward
    }
}

pub fn drafter_step_flops(w: &StepWork<'_>) -> StepFlops {
    let d = w.drafter;
    let (b, s) = (w.batch as f64, w.seq_len as f64);
    let blocks = (w.anchors.len() as i64 / w.batch.max(1)) as f64;
    let q = b * blocks * d.block_size as f64;
    let h = d.hidden_size as f64;
    let (hq, hkv, hd) = (
        d.num_attention_heads as f64,
        d.num_key_value_heads as f64,
        d.head_dim as f64,
    );
    let inter = d.intermediate_size as f64;

    let fc = 2.0 * b * s * d.feature_size() as f64 * h;
    let mut layers_fwd = 0.0;
    let mut attention_fwd = 0.0;
    for &t in &d.layer_types {
        let projections = 2.0 * q * h * hq * hd        // q_proj
            + 2.0 * 2.0 * (b * s + q) * h * hkv * hd   // k_proj, v_proj over context and block
            + 2.0 * q * hq * hd * h                    // o_proj
            + 3.0 * 2.0 * q * h * inter; // gate, up, down
        layers_fwd += projections;
        let rule = match t {
            LayerType::Full => LayerRule::Full,
            LayerType::Sliding => LayerRule::Sliding {
                window: d.sliding_window.unwrap_or(i64::MAX / 4),
            },
        };
        let pairs = visible_pairs(rule, w.anchors, w.keep, d.block_size, w.seq_len) as f64;
        attention_fwd += 4.0 * hd * hq * pairs; // q·k and p·v
    }
    let head = 2.0 * w.weighted_positions as f64 * h * w.vocab_size as f64;
    StepFlops {
        forward: fc + layers_fwd + attention_fwd + head,
        backward: fc + 2.0 * layers_fwd + 2.0 * attention_fwd + head,
    }
}

/// Forward FLOPs of the target's feature pass over `batch × seq_len` tokens: the matmuls of
/// the layers it runs (`model/target/mod.rs::features` stops after the last tap layer, so
/// layers `0..=max(taps)`), 2 per weight per token, plus causal attention on its
/// full-attention layers (q·k and p·v over the `(S+1)/2` keys a token sees on average). The
/// Gated DeltaNet chunk recurrence (under 1 % at Qwen3.6-27B's shape) and the depthwise conv
/// are left out, as norms and elementwise work are.
pub fn target_forward_flops(t: &TargetConfig, taps: &[usize], batch: i64, seq_len: i64) -> f64 {
    let layers = taps.iter().max().map_or(0, |&m| m + 1).min(t.num_layers());
    let prefix = |name: &str| name.starts_with("layers.");
    let matmul_weights: f64 = param_specs(t, layers)
        .iter()
        .filter(|p| prefix(&p.name) && p.shape.len() == 2)
        .map(|p| p.shape.iter().product::<i64>() as f64)
        .sum();
    let (full_layers, heads, head_dim) = match t {
        TargetConfig::Qwen3(c) => (layers, c.num_attention_heads, c.head_dim),
        TargetConfig::Qwen3_5(c) => (
            c.layer_types[..layers]
                .iter()
                .filter(|k| **k == crate::model::target::Qwen3_5LayerKind::FullAttention)
                .count(),
            c.num_attention_heads,
            c.head_dim,
        ),
    };
    let tokens = (batch * seq_len) as f64;
    let attention =
        full_layers as f64 * 4.0 * (heads * head_dim) as f64 * (seq_len as f64 + 1.0) / 2.0;
    tokens * (2.0 * matmul_weights + attention)
}

/// FLOPs of one `[n, n] x [n, n]` matmul.
pub fn square_matmul_flops(n: i64) -> f64 {
    2.0 * (n as f64).powi(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::visibility::{context_visible, own_block_visible};

    fn brute_force(rule: LayerRule, anchors: &[i64], keep: &[bool], bs: i64, s: i64) -> u64 {
        let mut n = 0;
        for (&a, &k) in anchors.iter().zip(keep) {
            for off in 0..bs {
                n += (0..s)
                    .filter(|&j| context_visible(rule, a, k, off, j))
                    .count() as u64;
                n += (0..bs).filter(|&j| own_block_visible(rule, off, j)).count() as u64;
            }
        }
        n
    }

    #[test]
    fn visible_pairs_match_the_visibility_rule_key_by_key() {
        let anchors = [0, 1, 5, 9, 17, 30, 31];
        let keep = [true, true, false, true, true, true, true];
        for rule in [
            LayerRule::Full,
            LayerRule::Sliding { window: 1 },
            LayerRule::Sliding { window: 6 },
        ] {
            assert_eq!(
                visible_pairs(rule, &anchors, &keep, 4, 32),
                brute_force(rule, &anchors, &keep, 4, 32),
                "{rule:?}"
            );
        }
    }

    #[test]
    fn step_flops_by_hand_for_a_one_layer_drafter() {
        let d = DrafterConfig {
            hidden_size: 4,
            intermediate_size: 8,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 2,
            rms_norm_eps: 1e-6,
            rope_theta: 1e4,
            layer_types: vec![LayerType::Full],
            sliding_window: None,
            block_size: 2,
            mask_token_id: 0,
            target_layer_ids: vec![0, 1],
            target_hidden_size: 4,
            vocab_size: 10,
            max_position_embeddings: 64,
            num_target_layers: Some(4),
            initializer_range: 0.02,
        };
        // One row of 6 tokens, blocks at anchors 2 and 4: Q = 4 queries.
        let w = StepWork {
            drafter: &d,
            batch: 1,
            seq_len: 6,
            anchors: &[2, 4],
            keep: &[true, true],
            weighted_positions: 2,
            vocab_size: 10,
        };
        let fc = 2.0 * 6.0 * 8.0 * 4.0;
        let proj = 2.0 * 4.0 * 4.0 * 4.0
            + 4.0 * 10.0 * 4.0 * 2.0
            + 2.0 * 4.0 * 4.0 * 4.0
            + 6.0 * 4.0 * 4.0 * 8.0;
        let pairs = 2.0 * (2.0 + 2.0) + 2.0 * (4.0 + 2.0); // per query: context + own block
        let attn = 4.0 * 2.0 * 2.0 * pairs;
        let head = 2.0 * 2.0 * 4.0 * 10.0;
        let f = drafter_step_flops(&w);
        assert_eq!(f.forward, fc + proj + attn + head);
        assert_eq!(f.backward, fc + 2.0 * proj + 2.0 * attn + head);
    }
}
