//! One pre-norm decoder layer: `h += mixer(norm₁(h)); h += mlp(norm₂(h))`.
use tch::Tensor;

use super::gated_attention::GatedAttention;
use super::gated_deltanet::GatedDeltaNet;
use super::mlp::SwiGluMlp;
use super::qwen3::Qwen3Attention;
use crate::engine::model::layers::{rms_norm, rms_norm_zero_centered};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormStyle {
    /// Qwen3.5: `x̂·(1+w)`.
    ZeroCentered,
    /// Qwen3: `w·x̂`.
    Plain,
}

impl NormStyle {
    pub fn apply(self, x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
        match self {
            Self::ZeroCentered => rms_norm_zero_centered(x, weight, eps),
            Self::Plain => rms_norm(x, weight, eps),
        }
    }
}

pub enum Mixer {
    DeltaNet(GatedDeltaNet),
    GatedAttention(GatedAttention),
    Attention(Qwen3Attention),
}

pub struct DecoderLayer {
    pub input_norm: Tensor,
    pub post_attention_norm: Tensor,
    pub mixer: Mixer,
    pub mlp: SwiGluMlp,
}

/// What every layer of one forward shares: norm convention, eps and the RoPE table.
pub struct LayerContext<'a> {
    pub norm: NormStyle,
    pub eps: f64,
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

impl DecoderLayer {
    pub fn forward(&self, h: &Tensor, ctx: &LayerContext<'_>) -> Tensor {
        let x = ctx.norm.apply(h, &self.input_norm, ctx.eps);
        let mixed = match &self.mixer {
            Mixer::DeltaNet(m) => m.forward(&x),
            Mixer::GatedAttention(m) => m.forward(&x, ctx.cos, ctx.sin),
            Mixer::Attention(m) => m.forward(&x, ctx.cos, ctx.sin),
        };
        let h = h + mixed;
        let x = ctx.norm.apply(&h, &self.post_attention_norm, ctx.eps);
        &h + self.mlp.forward(&x)
    }
}
