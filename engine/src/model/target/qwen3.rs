//! Qwen3 dense stack (`Qwen3ForCausalLM`): every layer is full attention with `w·x̂` norms.
use super::config::Qwen3Config;
use super::decoder::{self, DecoderLayer, LayerShape, Mixer, NormStyle};
use super::params::{ParamSpec, Params};
use super::self_attention::{AttentionSpec, SelfAttention};
use crate::model::error::ModelError;

fn shape(c: &Qwen3Config) -> LayerShape {
    LayerShape {
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        norm: NormStyle::Plain,
    }
}

pub fn layer_specs(c: &Qwen3Config, layer: usize, specs: &mut Vec<ParamSpec>) {
    decoder::layer_specs(shape(c), layer, specs, |p, specs| {
        SelfAttention::specs(&AttentionSpec::qwen3(c), &format!("{p}.self_attn"), specs)
    });
}

pub fn build_layer(
    c: &Qwen3Config,
    layer: usize,
    params: &mut Params,
) -> Result<DecoderLayer, ModelError> {
    decoder::build_layer(layer, params, |p, params| {
        let spec = AttentionSpec::qwen3(c);
        Ok(Mixer::Attention(SelfAttention::take(
            &spec,
            &format!("{p}.self_attn"),
            params,
        )?))
    })
}
