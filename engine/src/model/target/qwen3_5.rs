//! Qwen3.5 / Qwen3.6 text stack: parameter list and layer construction. Layer `i` is a Gated
//! DeltaNet layer or a gated full-attention layer per `layer_types[i]`; all norms zero-centred.
use super::config::{Qwen3_5LayerKind, Qwen3_5TextConfig};
use super::decoder::{self, DecoderLayer, LayerShape, Mixer, NormStyle};
use super::gated_deltanet::GatedDeltaNet;
use super::params::{ParamSpec, Params};
use super::self_attention::{AttentionSpec, SelfAttention};
use crate::model::error::ModelError;

fn shape(c: &Qwen3_5TextConfig) -> LayerShape {
    LayerShape {
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        norm: NormStyle::ZeroCentered,
    }
}

pub fn layer_specs(c: &Qwen3_5TextConfig, layer: usize, specs: &mut Vec<ParamSpec>) {
    decoder::layer_specs(shape(c), layer, specs, |p, specs| {
        match c.layer_types[layer] {
            Qwen3_5LayerKind::LinearAttention => {
                GatedDeltaNet::specs(c, &format!("{p}.linear_attn"), specs)
            }
            Qwen3_5LayerKind::FullAttention => {
                SelfAttention::specs(&AttentionSpec::qwen3_5(c), &format!("{p}.self_attn"), specs)
            }
        }
    });
}

pub fn build_layer(
    c: &Qwen3_5TextConfig,
    layer: usize,
    params: &mut Params,
) -> Result<DecoderLayer, ModelError> {
    decoder::build_layer(layer, params, |p, params| {
        Ok(match c.layer_types[layer] {
            Qwen3_5LayerKind::LinearAttention => {
                Mixer::DeltaNet(GatedDeltaNet::take(c, &format!("{p}.linear_attn"), params)?)
            }
            Qwen3_5LayerKind::FullAttention => Mixer::Attention(SelfAttention::take(
                &AttentionSpec::qwen3_5(c),
                &format!("{p}.self_attn"),
                params,
            )?),
        })
    })
}
