//! One pre-norm decoder layer: `h += mixer(norm₁(h)); h += mlp(norm₂(h))`.
use tch::Tensor;

use super::cache::{DeltaNetCache, KvCache, LayerCache};
use super::gated_deltanet::GatedDeltaNet;
use super::mlp::SwiGluMlp;
pub use super::norm::NormStyle;
use super::params::{ParamSpec, Params};
use super::self_attention::SelfAttention;
use super::tree::TreeShape;
use crate::model::error::ModelError;

pub enum Mixer {
    DeltaNet(GatedDeltaNet),
    Attention(SelfAttention),
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

/// The new tokens of an incremental forward: the keys each attends to over cache + new
/// (`[T, past + T]` bool, see [`SelfAttention::forward_cached`]), and their tree (`None`: a
/// chain, each token after the one before).
pub struct NewTokens<'a> {
    pub visible: &'a Tensor,
    pub tree: Option<&'a TreeShape>,
}

/// The sizes a layer's norms and MLP need, whatever its mixer.
#[derive(Debug, Clone, Copy)]
pub struct LayerShape {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub norm: NormStyle,
}

/// Parameters of layer `layer` in checkpoint order: the two norms, the mixer's (written by
/// `mixer_specs` under `layers.{layer}`), then the MLP.
pub fn layer_specs(
    shape: LayerShape,
    layer: usize,
    specs: &mut Vec<ParamSpec>,
    mixer_specs: impl FnOnce(&str, &mut Vec<ParamSpec>),
) {
    let p = format!("layers.{layer}");
    for norm in ["input_layernorm", "post_attention_layernorm"] {
        specs.push(ParamSpec::new(
            format!("{p}.{norm}.weight"),
            &[shape.hidden_size],
            shape.norm.init(),
        ));
    }
    mixer_specs(&p, specs);
    SwiGluMlp::specs(
        &format!("{p}.mlp"),
        shape.hidden_size,
        shape.intermediate_size,
        specs,
    );
}

/// Takes layer `layer`'s tensors out of `params`; `take_mixer` takes the mixer's under
/// `layers.{layer}`.
pub fn build_layer(
    layer: usize,
    params: &mut Params,
    take_mixer: impl FnOnce(&str, &mut Params) -> Result<Mixer, ModelError>,
) -> Result<DecoderLayer, ModelError> {
    let p = format!("layers.{layer}");
    Ok(DecoderLayer {
        input_norm: params.take(&format!("{p}.input_layernorm.weight"))?,
        post_attention_norm: params.take(&format!("{p}.post_attention_layernorm.weight"))?,
        mixer: take_mixer(&p, params)?,
        mlp: SwiGluMlp::take(&format!("{p}.mlp"), params)?,
    })
}

impl DecoderLayer {
    /// A cache for this layer's mixer, empty.
    pub fn new_cache(&self) -> LayerCache {
        match &self.mixer {
            Mixer::DeltaNet(_) => LayerCache::DeltaNet(DeltaNetCache::default()),
            Mixer::Attention(_) => LayerCache::Attention(KvCache::default()),
        }
    }

    /// As [`Self::forward`] over new tokens after those `cache` holds (`ctx` at their
    /// positions), a chain or a tree ([`NewTokens`]).
    pub fn forward_cached(
        &self,
        h: &Tensor,
        ctx: &LayerContext<'_>,
        cache: &mut LayerCache,
        new: &NewTokens<'_>,
    ) -> Tensor {
        let x = ctx.norm.apply(h, &self.input_norm, ctx.eps);
        let mixed = match (&self.mixer, cache) {
            (Mixer::DeltaNet(m), LayerCache::DeltaNet(c)) => match new.tree {
                None => m.forward_cached(&x, c),
                Some(tree) => m.forward_tree(&x, c, tree),
            },
            (Mixer::Attention(m), LayerCache::Attention(c)) => {
                m.forward_cached(&x, ctx.cos, ctx.sin, c, new.visible, new.tree.is_none())
            }
            _ => unreachable!("a layer's cache is made by that layer's new_cache"),
        };
        let h = h + mixed;
        let x = ctx.norm.apply(&h, &self.post_attention_norm, ctx.eps);
        &h + self.mlp.forward(&x)
    }

    pub fn forward(&self, h: &Tensor, ctx: &LayerContext<'_>) -> Tensor {
        let x = ctx.norm.apply(h, &self.input_norm, ctx.eps);
        let mixed = match &self.mixer {
            Mixer::DeltaNet(m) => m.forward(&x),
            Mixer::Attention(m) => m.forward(&x, ctx.cos, ctx.sin),
        };
        let h = h + mixed;
        let x = ctx.norm.apply(&h, &self.post_attention_norm, ctx.eps);
        &h + self.mlp.forward(&x)
    }
}
