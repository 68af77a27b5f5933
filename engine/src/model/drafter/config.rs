//! Drafter hyper-parameters and their validation.
pub use dflash_shared::config::MarkovHeadType;
use thiserror::Error;

use crate::model::target::FeatureRequest;

/// Attention kind of one drafter layer (`layer_types` in the HF config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// `"full_attention"`: whole context prefix, bidirectional inside the block.
    Full,
    /// `"sliding_attention"`: `sliding_window` tokens, causal inside the block.
    Sliding,
}

impl LayerType {
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerType::Full => "full_attention",
            LayerType::Sliding => "sliding_attention",
        }
    }

    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "full_attention" => Some(LayerType::Full),
            "sliding_attention" => Some(LayerType::Sliding),
            _ => None,
        }
    }
}

#[derive(Debug, Error)]
pub enum DrafterError {
    #[error("cannot read drafter config {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("drafter config {path} is not valid JSON: {cause}")]
    Json {
        path: String,
        cause: serde_json::Error,
    },
    #[error("drafter config {path}: missing key `{key}` ({hint})")]
    MissingField {
        path: String,
        key: String,
        hint: String,
    },
    #[error("drafter config {path}: key `{key}` expected {expected}, found {found}")]
    InvalidField {
        path: String,
        key: String,
        expected: String,
        found: String,
    },
    #[error("drafter config {path}: key `{key}` = {found} is not supported: {why}")]
    Unsupported {
        path: String,
        key: String,
        found: String,
        why: String,
    },
}

/// Hyper-parameters of a DFlash drafter (spec §1.2). Field names follow the HF `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterConfig {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub layer_types: Vec<LayerType>,
    /// Window of sliding layers in tokens (query included); required iff a layer is sliding.
    pub sliding_window: Option<i64>,
    pub block_size: i64,
    pub mask_token_id: i64,
    /// Target layers whose residual-stream outputs are concatenated as features (§1.4).
    pub target_layer_ids: Vec<usize>,
    /// Hidden size of the target; `fc` maps `len(target_layer_ids)·target_hidden_size -> hidden_size`.
    /// Published drafters have it equal to `hidden_size` (their loaders assume so).
    pub target_hidden_size: i64,
    pub vocab_size: i64,
    pub max_position_embeddings: i64,
    /// Layers of the target (written as `num_target_layers`; used for default layer ids).
    pub num_target_layers: Option<usize>,
    /// Std of the `N(0, σ)` init of every linear weight (HF `initializer_range`).
    pub initializer_range: f64,
    /// What turns the drafter's output into logits: the LM head alone, with Domino's
    /// correction (`dflash_config.projector_type = "domino"`), or DSpark's heads
    /// (`projector_type = "dspark"`).
    pub head: DrafterHead,
}

/// False for NaN as well as for non-positive values.
fn is_positive(x: f64) -> bool {
    x > 0.0
}

impl DrafterConfig {
    /// Default target layers (spec §1.4, ZL/SF `build_target_layer_ids`): one drafter layer →
    /// the middle layer; otherwise `round(1 + i·(n_target-4)/(n_draft-1))`, i.e. uniformly from
    /// layer 1 to layer `n_target-3`. Python's `round` is half-to-even; the values are rounded
    /// the same way here.
    pub fn build_target_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Vec<usize> {
        if num_draft_layers == 0 {
            return Vec::new();
        }
        if num_draft_layers == 1 {
            return vec![num_target_layers / 2];
        }
        let span = num_target_layers as f64 - 4.0;
        (0..num_draft_layers)
            .map(|i| {
                let value = 1.0 + i as f64 * span / (num_draft_layers - 1) as f64;
                value.round_ties_even().max(0.0) as usize
            })
            .collect()
    }

    /// Width of one feature row: `len(target_layer_ids) · target_hidden_size`.
    pub fn feature_size(&self) -> i64 {
        self.target_layer_ids.len() as i64 * self.target_hidden_size
    }

    /// What training asks of the target's pass: the tap layers, and the last hidden state
    /// when the head needs it ([`DrafterHead::needs_target_last_hidden`]).
    pub fn feature_request(&self) -> FeatureRequest {
        FeatureRequest {
            layer_ids: self.target_layer_ids.clone(),
            last_hidden: self.head.needs_target_last_hidden(),
        }
    }

    /// Checks the relations the model relies on. `source` names the config in the error
    /// (a file path, or e.g. `"built-in config"`).
    pub fn validate(&self, source: &str) -> Result<(), DrafterError> {
        self.validate_shape(source)?;
        self.validate_constants(source)?;
        self.validate_taps_and_head(source)
    }

    /// Sizes, heads, and one layer type per layer (with a window where a layer slides).
    fn validate_shape(&self, source: &str) -> Result<(), DrafterError> {
        let invalid =
            |key: &str, expected: &str, found: String| invalid_field(source, key, expected, found);
        for (key, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("block_size", self.block_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value <= 0 {
                return invalid(key, "a positive integer", value.to_string());
            }
        }
        if self.num_hidden_layers == 0 {
            return invalid("num_hidden_layers", "at least 1", "0".into());
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return invalid(
                "num_key_value_heads",
                &format!(
                    "a divisor of num_attention_heads ({})",
                    self.num_attention_heads
                ),
                self.num_key_value_heads.to_string(),
            );
        }
        if self.head_dim % 2 != 0 {
            return invalid(
                "head_dim",
                "an even number (rotary embedding)",
                self.head_dim.to_string(),
            );
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return invalid(
                "layer_types",
                &format!("{} entries (num_hidden_layers)", self.num_hidden_layers),
                format!("{} entries", self.layer_types.len()),
            );
        }
        let has_sliding = self.layer_types.contains(&LayerType::Sliding);
        match self.sliding_window {
            Some(w) if w <= 0 => {
                return invalid("sliding_window", "a positive integer", w.to_string())
            }
            None if has_sliding => {
                return invalid(
                    "sliding_window",
                    "a window size (layer_types has sliding layers)",
                    "null".into(),
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// The norm's ε, RoPE's θ and the initializer's range.
    fn validate_constants(&self, source: &str) -> Result<(), DrafterError> {
        let invalid =
            |key: &str, expected: &str, found: String| invalid_field(source, key, expected, found);
        if !is_positive(self.rms_norm_eps) {
            return invalid(
                "rms_norm_eps",
                "a positive number",
                self.rms_norm_eps.to_string(),
            );
        }
        if !is_positive(self.rope_theta) {
            return invalid(
                "rope_theta",
                "a positive number",
                self.rope_theta.to_string(),
            );
        }
        if !is_positive(self.initializer_range) {
            return invalid(
                "initializer_range",
                "a positive number",
                self.initializer_range.to_string(),
            );
        }
        Ok(())
    }

    /// The target's tapped layers and width, the Domino head's keys, and the mask token.
    fn validate_taps_and_head(&self, source: &str) -> Result<(), DrafterError> {
        let invalid =
            |key: &str, expected: &str, found: String| invalid_field(source, key, expected, found);
        if self.target_layer_ids.is_empty() {
            return invalid(
                "dflash_config.target_layer_ids",
                "at least one layer id",
                "[]".into(),
            );
        }
        if self.target_hidden_size <= 0 {
            return invalid(
                "target_hidden_size",
                "a positive integer",
                self.target_hidden_size.to_string(),
            );
        }
        if let Some(n) = self.num_target_layers {
            if let Some(&bad) = self.target_layer_ids.iter().find(|&&id| id >= n) {
                return invalid(
                    "dflash_config.target_layer_ids",
                    &format!("ids below num_target_layers ({n})"),
                    bad.to_string(),
                );
            }
        }
        if let Some(d) = self.head.domino() {
            for (key, value) in [
                ("dflash_config.emb_dim", d.emb_dim),
                ("dflash_config.gru_hidden_dim", d.gru_hidden_dim),
            ] {
                if value <= 0 {
                    return invalid(key, "a positive integer", value.to_string());
                }
            }
            if d.pure_draft_prefix_len < 0 || d.suffix_start() >= self.block_size {
                return invalid(
                    "dflash_config.pure_draft_prefix_len",
                    &format!(
                        "0..={} (block_size − 2: a slot after the anchor and the prefix must be \
                         corrected)",
                        self.block_size - 2
                    ),
                    d.pure_draft_prefix_len.to_string(),
                );
            }
        }
        if let Some(d) = self.head.dspark() {
            if d.markov_rank < 0 {
                return invalid(
                    "dflash_config.markov_rank",
                    "a non-negative integer (0: no Markov head)",
                    d.markov_rank.to_string(),
                );
            }
            if d.confidence_head_with_markov && !(d.confidence_head && d.markov_rank > 0) {
                return invalid(
                    "dflash_config.confidence_head_with_markov",
                    "false unless there are a confidence head and a Markov head (markov_rank > 0)",
                    "true".into(),
                );
            }
        }
        if let Some(d) = self.head.dflash2() {
            self.validate_dflash2(d, source)?;
        }
        if self.mask_token_id < 0 || self.mask_token_id >= self.vocab_size {
            return invalid(
                "dflash_config.mask_token_id",
                &format!("a token id in 0..{} (vocab_size)", self.vocab_size),
                self.mask_token_id.to_string(),
            );
        }
        Ok(())
    }
}

impl DrafterConfig {
    /// DFlash2's ranges, as SpecForge's `DFlashGroupedConv` and `CandidateSelector` check them.
    fn validate_dflash2(&self, d: &Dflash2Config, source: &str) -> Result<(), DrafterError> {
        let invalid =
            |key: &str, expected: &str, found: String| invalid_field(source, key, expected, found);
        if d.conv_kernel_size < 1 || d.conv_kernel_size > self.block_size {
            return invalid(
                "dflash_config.conv_kernel_size",
                &format!("1..={} (block_size)", self.block_size),
                d.conv_kernel_size.to_string(),
            );
        }
        if d.conv_group_size < 1 || self.hidden_size % d.conv_group_size != 0 {
            return invalid(
                "dflash_config.conv_group_size",
                &format!("a divisor of hidden_size ({})", self.hidden_size),
                d.conv_group_size.to_string(),
            );
        }
        if d.selector_rank < 1 {
            return invalid(
                "dflash_config.selector_rank",
                "at least 1",
                d.selector_rank.to_string(),
            );
        }
        if d.selector_top_k < 1 || d.selector_top_k > self.vocab_size {
            return invalid(
                "dflash_config.selector_top_k",
                &format!("1..={} (vocab_size)", self.vocab_size),
                d.selector_top_k.to_string(),
            );
        }
        if !(d.output_multiplier.is_finite() && d.output_multiplier > 0.0) {
            return invalid(
                "dflash_config.output_multiplier",
                "a positive number",
                d.output_multiplier.to_string(),
            );
        }
        if let Some(cap) = d.final_logit_softcapping {
            if !(cap.is_finite() && cap > 0.0) {
                return invalid(
                    "dflash_config.final_logit_softcapping",
                    "a positive number",
                    cap.to_string(),
                );
            }
        }
        Ok(())
    }
}

/// The refusal of one `config.json` field: where, which key, what was expected and found.
fn invalid_field(
    source: &str,
    key: &str,
    expected: &str,
    found: String,
) -> Result<(), DrafterError> {
    Err(DrafterError::InvalidField {
        path: source.to_string(),
        key: key.to_string(),
        expected: expected.to_string(),
        found,
    })
}

/// The Domino head's widths (SpecForge's `dflash_config` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DominoConfig {
    /// `emb_dim`: width of `embed_proj`'s middle layer.
    pub emb_dim: i64,
    /// `gru_hidden_dim`: the GRU's state size.
    pub gru_hidden_dim: i64,
    /// `pure_draft_prefix_len`: slots after the anchor that keep the base logits.
    pub pure_draft_prefix_len: i64,
}

impl DominoConfig {
    /// The first slot the correction applies to (SpecForge's `suffix_start` with
    /// `shift_label = false`).
    pub fn suffix_start(&self) -> i64 {
        1 + self.pure_draft_prefix_len
    }
}

/// DSpark's heads (SpecForge's `dflash_config` keys of `DSparkDraftModel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsparkConfig {
    /// `markov_rank`: rank of the Markov head's bigram table; 0: no Markov head.
    pub markov_rank: i64,
    /// `markov_head_type`.
    pub markov_head_type: MarkovHeadType,
    /// `enable_confidence_head`.
    pub confidence_head: bool,
    /// `confidence_head_with_markov`: the confidence head reads `[h ; W₁[prev]]`, not `h`.
    pub confidence_head_with_markov: bool,
}

impl DsparkConfig {
    /// Whether the drafter has a Markov head.
    pub fn has_markov_head(&self) -> bool {
        self.markov_rank > 0
    }
}

/// DFlash2's convolution and selector (SpecForge's `dflash_config` keys of
/// `DFlash2DraftModel`, `specforge/modeling/draft/dflash2.py` at 0dcf8859).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dflash2Config {
    /// `conv_kernel_size`: taps of the grouped dynamic convolution, in 1..=block_size.
    pub conv_kernel_size: i64,
    /// `conv_group_size`: channels sharing one dynamic coefficient; divides hidden_size.
    pub conv_group_size: i64,
    /// `selector_rank`: width of the selector's codebooks.
    pub selector_rank: i64,
    /// `selector_top_k`: candidates per slot, in 1..=vocab_size.
    pub selector_top_k: i64,
    /// `output_multiplier`: the unary logits are the LM head's times this.
    pub output_multiplier: f64,
    /// `final_logit_softcapping`: then `s·tanh(U/s)`, when set.
    pub final_logit_softcapping: Option<f64>,
}

impl Dflash2Config {
    /// Groups of channels of a `hidden_size`-wide state (`H / conv_group_size`).
    pub fn conv_groups(&self, hidden_size: i64) -> i64 {
        hidden_size / self.conv_group_size
    }
}

/// What turns the drafter's hidden states into logits.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum DrafterHead {
    /// The target's frozen LM head alone.
    #[default]
    Dflash,
    /// The LM head plus Domino's correction.
    Domino(DominoConfig),
    /// The LM head plus DSpark's Markov bias, beside its confidence head; slot `k` drafts the
    /// token after `anchor + k`.
    Dspark(DsparkConfig),
    /// The LM head's logits, transformed, as unary scores; a selector rescores their top-K by
    /// the previous token; every layer convolves its sublayers' inputs and outputs inside the
    /// block.
    Dflash2(Dflash2Config),
}

impl DrafterHead {
    pub fn domino(&self) -> Option<&DominoConfig> {
        match self {
            DrafterHead::Domino(c) => Some(c),
            DrafterHead::Dflash | DrafterHead::Dspark(_) | DrafterHead::Dflash2(_) => None,
        }
    }

    pub fn dspark(&self) -> Option<&DsparkConfig> {
        match self {
            DrafterHead::Dspark(c) => Some(c),
            DrafterHead::Dflash | DrafterHead::Domino(_) | DrafterHead::Dflash2(_) => None,
        }
    }

    pub fn dflash2(&self) -> Option<&Dflash2Config> {
        match self {
            DrafterHead::Dflash2(c) => Some(c),
            DrafterHead::Dflash | DrafterHead::Domino(_) | DrafterHead::Dspark(_) => None,
        }
    }

    /// Whether training needs the target's final-normed last hidden state beside the tap
    /// features: a head whose loss distils the target's own next-token distribution (its
    /// frozen LM head over that state). It decides what the target's pass returns, what the
    /// hidden-state queue carries, and what the memory plan and the FLOP model count.
    pub fn needs_target_last_hidden(&self) -> bool {
        match self {
            DrafterHead::Dflash | DrafterHead::Domino(_) | DrafterHead::Dflash2(_) => false,
            DrafterHead::Dspark(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_target_layers_match_the_published_drafters() {
        assert_eq!(
            DrafterConfig::build_target_layer_ids(64, 5),
            vec![1, 16, 31, 46, 61]
        );
        assert_eq!(
            DrafterConfig::build_target_layer_ids(36, 5),
            vec![1, 9, 17, 25, 33]
        );
        assert_eq!(DrafterConfig::build_target_layer_ids(36, 1), vec![18]);
        // 1 + i·24/3 → 1, 9, 17, 25 (exact); 1 + i·25/2 = 13.5 rounds half to even → 14.
        assert_eq!(
            DrafterConfig::build_target_layer_ids(28, 4),
            vec![1, 9, 17, 25]
        );
        assert_eq!(
            DrafterConfig::build_target_layer_ids(29, 3),
            vec![1, 14, 26]
        );
    }
}
