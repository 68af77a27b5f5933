//! Target configurations (parsed from `config.json` in `hf_config`), validated so that a model
//! built from them cannot fail on a shape mismatch later, and written back as HF JSON.
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qwen3_5LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    LinearAttention,
    /// Gated full attention (`full_attention`).
    FullAttention,
}

impl Qwen3_5LayerKind {
    /// Qwen3.5's and Qwen3.6's pattern, HF's default `full_attention_interval`: full attention
    /// on every 4th layer.
    pub const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

    /// The hybrid stack of `layers` layers as HF derives it from `full_attention_interval`: full
    /// attention on every `full_attention_interval`-th layer (counting from 1), Gated DeltaNet
    /// on the others.
    pub fn hybrid_stack(layers: usize, full_attention_interval: usize) -> Vec<Self> {
        (1..=layers)
            .map(|layer| {
                if layer % full_attention_interval == 0 {
                    Self::FullAttention
                } else {
                    Self::LinearAttention
                }
            })
            .collect()
    }

    pub fn hf_name(self) -> &'static str {
        match self {
            Self::LinearAttention => "linear_attention",
            Self::FullAttention => "full_attention",
        }
    }
}

/// The text part of a Qwen3.5 / Qwen3.6 checkpoint (`text_config`, model type `qwen3_5_text`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3_5TextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub linear_conv_kernel_dim: i64,
    pub linear_key_head_dim: i64,
    pub linear_value_head_dim: i64,
    pub linear_num_key_heads: i64,
    pub linear_num_value_heads: i64,
    pub layer_types: Vec<Qwen3_5LayerKind>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i64,
}

impl Qwen3_5TextConfig {
    /// Rotated dims per full-attention head (`int(head_dim * partial_rotary_factor)`, as HF).
    pub fn rotary_dim(&self) -> i64 {
        (self.head_dim as f64 * self.partial_rotary_factor) as i64
    }
}

/// A plain Qwen3 dense model (`Qwen3ForCausalLM`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TargetConfig {
    Qwen3_5(Qwen3_5TextConfig),
    Qwen3(Qwen3Config),
}

/// How tensor names are laid out in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointLayout {
    /// `Qwen3_5ForConditionalGeneration`: text weights under `model.language_model.`, vision
    /// tower under `model.visual.` (ignored), optional `mtp.*` (ignored), `lm_head.weight`.
    Qwen3_5Multimodal,
    /// `Qwen3_5ForCausalLM`: text weights under `model.`.
    Qwen3_5Text,
    /// `Qwen3ForCausalLM`: weights under `model.`.
    Qwen3CausalLm,
}

impl CheckpointLayout {
    pub fn body_prefix(self) -> &'static str {
        match self {
            Self::Qwen3_5Multimodal => "model.language_model.",
            Self::Qwen3_5Text | Self::Qwen3CausalLm => "model.",
        }
    }

    pub fn default_for(config: &TargetConfig) -> Self {
        match config {
            TargetConfig::Qwen3_5(_) => Self::Qwen3_5Multimodal,
            TargetConfig::Qwen3(_) => Self::Qwen3CausalLm,
        }
    }
}

impl TargetConfig {
    /// Embedded tiny default: a Qwen3.5-style hybrid with both layer kinds (6 layers, full
    /// attention every 3rd), hidden 128, vocab 512, small heads; cheap on 2 CPU cores.
    pub fn tiny_default() -> Self {
        let layer_types = Qwen3_5LayerKind::hybrid_stack(6, 3);
        Self::Qwen3_5(Qwen3_5TextConfig {
            vocab_size: 512,
            hidden_size: 128,
            intermediate_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            linear_conv_kernel_dim: 4,
            linear_key_head_dim: 32,
            linear_value_head_dim: 32,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            layer_types,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000_000.0,
            partial_rotary_factor: 0.25,
            attention_bias: false,
            tie_word_embeddings: false,
            max_position_embeddings: 4096,
        })
    }

    /// Structural consistency (what the model code relies on); parsing from `config.json` reports
    /// the same problems with the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: i64| {
            if v > 0 {
                Ok(())
            } else {
                Err(format!("{name} must be > 0, is {v}"))
            }
        };
        let divides = |a: &str, x: i64, b: &str, y: i64| {
            if x % y == 0 {
                Ok(())
            } else {
                Err(format!("{a} ({x}) must be a multiple of {b} ({y})"))
            }
        };
        // Both families share the embedding, MLP and attention-head sizes and the GQA rule.
        let attention_dims = |dims: [i64; 6]| {
            let names = [
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
            ];
            for (n, v) in names.into_iter().zip(dims) {
                positive(n, v)?;
            }
            divides(names[3], dims[3], names[4], dims[4])
        };
        match self {
            Self::Qwen3_5(c) => {
                attention_dims([
                    c.vocab_size,
                    c.hidden_size,
                    c.intermediate_size,
                    c.num_attention_heads,
                    c.num_key_value_heads,
                    c.head_dim,
                ])?;
                for (n, v) in [
                    ("linear_conv_kernel_dim", c.linear_conv_kernel_dim),
                    ("linear_key_head_dim", c.linear_key_head_dim),
                    ("linear_value_head_dim", c.linear_value_head_dim),
                    ("linear_num_key_heads", c.linear_num_key_heads),
                    ("linear_num_value_heads", c.linear_num_value_heads),
                ] {
                    positive(n, v)?;
                }
                if c.layer_types.len() != c.num_hidden_layers {
                    return Err(format!(
                        "layer_types has {} entries, num_hidden_layers is {}",
                        c.layer_types.len(),
                        c.num_hidden_layers
                    ));
                }
                divides(
                    "linear_num_value_heads",
                    c.linear_num_value_heads,
                    "linear_num_key_heads",
                    c.linear_num_key_heads,
                )?;
                let rotary = c.rotary_dim();
                if rotary < 2 || rotary % 2 != 0 || rotary > c.head_dim {
                    return Err(format!(
                        "rotary dim {rotary} must be even and in 2..={}",
                        c.head_dim
                    ));
                }
            }
            Self::Qwen3(c) => {
                attention_dims([
                    c.vocab_size,
                    c.hidden_size,
                    c.intermediate_size,
                    c.num_attention_heads,
                    c.num_key_value_heads,
                    c.head_dim,
                ])?;
                if c.head_dim % 2 != 0 {
                    return Err(format!("head_dim {} must be even", c.head_dim));
                }
            }
        }
        Ok(())
    }

    pub fn hidden_size(&self) -> i64 {
        match self {
            Self::Qwen3_5(c) => c.hidden_size,
            Self::Qwen3(c) => c.hidden_size,
        }
    }

    pub fn num_layers(&self) -> usize {
        match self {
            Self::Qwen3_5(c) => c.num_hidden_layers,
            Self::Qwen3(c) => c.num_hidden_layers,
        }
    }

    pub fn vocab_size(&self) -> i64 {
        match self {
            Self::Qwen3_5(c) => c.vocab_size,
            Self::Qwen3(c) => c.vocab_size,
        }
    }

    pub fn max_position_embeddings(&self) -> i64 {
        match self {
            Self::Qwen3_5(c) => c.max_position_embeddings,
            Self::Qwen3(c) => c.max_position_embeddings,
        }
    }

    pub fn intermediate_size(&self) -> i64 {
        match self {
            Self::Qwen3_5(c) => c.intermediate_size,
            Self::Qwen3(c) => c.intermediate_size,
        }
    }

    pub fn rms_norm_eps(&self) -> f64 {
        match self {
            Self::Qwen3_5(c) => c.rms_norm_eps,
            Self::Qwen3(c) => c.rms_norm_eps,
        }
    }

    pub fn tie_word_embeddings(&self) -> bool {
        match self {
            Self::Qwen3_5(c) => c.tie_word_embeddings,
            Self::Qwen3(c) => c.tie_word_embeddings,
        }
    }

    /// The HF `config.json` for this config in `layout`.
    pub fn to_hf_json(&self, layout: CheckpointLayout, torch_dtype: &str) -> Value {
        match (self, layout) {
            (Self::Qwen3_5(c), CheckpointLayout::Qwen3_5Multimodal) => {
                let mut text = qwen3_5_text_json(c);
                text["dtype"] = json!(torch_dtype);
                json!({
                    "architectures": ["Qwen3_5ForConditionalGeneration"],
                    "model_type": "qwen3_5",
                    "dtype": torch_dtype,
                    "tie_word_embeddings": c.tie_word_embeddings,
                    "text_config": text,
                    // The target has no vision weights; this minimal tower only keeps HF's loader
                    // from building the 400M-parameter default one when it opens the checkpoint.
                    "vision_config": {
                        "model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16,
                        "intermediate_size": 16, "num_heads": 2, "patch_size": 4,
                        "spatial_merge_size": 2, "temporal_patch_size": 2,
                        "out_hidden_size": c.hidden_size, "num_position_embeddings": 16
                    }
                })
            }
            (Self::Qwen3_5(c), _) => {
                let mut text = qwen3_5_text_json(c);
                text["architectures"] = json!(["Qwen3_5ForCausalLM"]);
                text["dtype"] = json!(torch_dtype);
                text
            }
            (Self::Qwen3(c), _) => json!({
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "dtype": torch_dtype,
                "vocab_size": c.vocab_size,
                "hidden_size": c.hidden_size,
                "intermediate_size": c.intermediate_size,
                "num_hidden_layers": c.num_hidden_layers,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": c.num_key_value_heads,
                "head_dim": c.head_dim,
                "hidden_act": "silu",
                "rms_norm_eps": c.rms_norm_eps,
                "attention_bias": c.attention_bias,
                "tie_word_embeddings": c.tie_word_embeddings,
                "max_position_embeddings": c.max_position_embeddings,
                "use_sliding_window": false,
                "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
            }),
        }
    }
}

fn qwen3_5_text_json(c: &Qwen3_5TextConfig) -> Value {
    json!({
        "model_type": "qwen3_5_text",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "linear_key_head_dim": c.linear_key_head_dim,
        "linear_value_head_dim": c.linear_value_head_dim,
        "linear_num_key_heads": c.linear_num_key_heads,
        "linear_num_value_heads": c.linear_num_value_heads,
        "layer_types": c.layer_types.iter().map(|k| k.hf_name()).collect::<Vec<_>>(),
        "rms_norm_eps": c.rms_norm_eps,
        "attention_bias": c.attention_bias,
        "tie_word_embeddings": c.tie_word_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": c.rope_theta,
            "partial_rotary_factor": c.partial_rotary_factor,
            // text-only positions are equal in all three rows, so the sections do not matter
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": true
        }
    })
}
