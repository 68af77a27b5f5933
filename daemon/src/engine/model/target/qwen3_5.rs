//! Qwen3.5 / Qwen3.6 text stack: parameter list and layer construction. Layer `i` is a Gated
//! DeltaNet layer or a gated full-attention layer per `layer_types[i]`; all norms zero-centred.
use super::config::{Qwen3_5LayerKind, Qwen3_5TextConfig};
use super::decoder::{DecoderLayer, Mixer};
use super::gated_attention::GatedAttention;
use super::gated_deltanet::GatedDeltaNet;
use super::mlp::SwiGluMlp;
use super::params::{Init, ParamSpec, Params};
use crate::engine::model::error::ModelError;

pub fn layer_specs(c: &Qwen3_5TextConfig, layer: usize, specs: &mut Vec<ParamSpec>) {
    let p = format!("layers.{layer}");
    specs.push(ParamSpec::new(
        format!("{p}.input_layernorm.weight"),
        &[c.hidden_size],
        Init::ZeroCenteredNorm,
    ));
    specs.push(ParamSpec::new(
        format!("{p}.post_attention_layernorm.weight"),
        &[c.hidden_size],
        Init::ZeroCenteredNorm,
    ));
    match c.layer_types[layer] {
        Qwen3_5LayerKind::LinearAttention => {
            GatedDeltaNet::specs(c, &format!("{p}.linear_attn"), specs)
        }
        Qwen3_5LayerKind::FullAttention => {
            GatedAttention::specs(c, &format!("{p}.self_attn"), specs)
        }
    }
    SwiGluMlp::specs(
        &format!("{p}.mlp"),
        c.hidden_size,
        c.intermediate_size,
        specs,
    );
}

pub fn build_layer(
    c: &Qwen3_5TextConfig,
    layer: usize,
    params: &mut Params,
) -> Result<DecoderLayer, ModelError> {
    let p = format!("layers.{layer}");
    let mixer = match c.layer_types[layer] {
        Qwen3_5LayerKind::LinearAttention => {
            Mixer::DeltaNet(GatedDeltaNet::take(c, &format!("{p}.linear_attn"), params)?)
        }
        Qwen3_5LayerKind::FullAttention => {
            Mixer::GatedAttention(GatedAttention::take(c, &format!("{p}.self_attn"), params)?)
        }
    };
    Ok(DecoderLayer {
        input_norm: params.take(&format!("{p}.input_layernorm.weight"))?,
        post_attention_norm: params.take(&format!("{p}.post_attention_layernorm.weight"))?,
        mixer,
        mlp: SwiGluMlp::take(&format!("{p}.mlp"), params)?,
    })
}
