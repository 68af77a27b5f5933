//! The product's reference shape, written once: the Qwen3.6-27B target and the drafter that
//! `configs/qwen3.6-27b-8gpu.toml` trains for it. The memory model's tests, the GPU check's
//! real-structure step and its target layers all start from these; a test holds the target
//! against `configs/targets/qwen3.6-27b.config.json`, the same figures in the HF layout.
use crate::model::drafter::{DrafterConfig, LayerType};
use crate::model::target::{Qwen3_5LayerKind, Qwen3_5TextConfig};

/// Qwen3.6-27B's text config as `gpu-readiness-review.md` §1a reads it from the checkpoint
/// (hidden 5120, 64 layers, intermediate 17408, 24/4 heads of 256, linear attention 16 k /
/// 48 v heads of 128, vocabulary 248,320, full attention every 4th layer).
pub fn qwen36_27b_text() -> Qwen3_5TextConfig {
    Qwen3_5TextConfig {
        vocab_size: 248_320,
        hidden_size: 5120,
        intermediate_size: 17408,
        num_hidden_layers: 64,
        num_attention_heads: 24,
        num_key_value_heads: 4,
        head_dim: 256,
        linear_conv_kernel_dim: 4,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        linear_num_key_heads: 16,
        linear_num_value_heads: 48,
        layer_types: Qwen3_5LayerKind::hybrid_stack(
            64,
            Qwen3_5LayerKind::DEFAULT_FULL_ATTENTION_INTERVAL,
        ),
        rms_norm_eps: 1e-6,
        rope_theta: 10_000_000.0,
        partial_rotary_factor: 0.25,
        attention_bias: false,
        tie_word_embeddings: false,
        max_position_embeddings: 262_144,
    }
}

/// The drafter of `configs/qwen3.6-27b-8gpu.toml`: hidden 5120, 5 layers (4 sliding + 1 full,
/// window 2048), 32/8 heads of 128, block 32, taps [1, 16, 31, 46, 61].
pub fn qwen36_27b_drafter() -> DrafterConfig {
    use LayerType::{Full, Sliding};
    DrafterConfig {
        hidden_size: 5120,
        intermediate_size: 17408,
        num_hidden_layers: 5,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        layer_types: vec![Sliding, Sliding, Sliding, Sliding, Full],
        sliding_window: Some(2048),
        block_size: 32,
        mask_token_id: 248_070,
        target_layer_ids: vec![1, 16, 31, 46, 61],
        target_hidden_size: 5120,
        vocab_size: 248_320,
        max_position_embeddings: 262_144,
        num_target_layers: Some(64),
        initializer_range: 0.02,
        head: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::target::TargetConfig;

    #[test]
    fn the_committed_27b_config_json_is_this_shape() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs/targets/qwen3.6-27b.config.json");
        let read = TargetConfig::from_hf_config_file(&path).unwrap();
        assert_eq!(read, TargetConfig::Qwen3_5(qwen36_27b_text()));
    }
}
