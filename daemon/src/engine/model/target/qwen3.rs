//! Qwen3 dense attention (`Qwen3Attention`): per-head `w·x̂` RMSNorm on q and k, full RoPE,
//! causal GQA with scale `D^-0.5`, optional q/k/v/o biases (`attention_bias`), no output gate.
use tch::Tensor;

use super::attention::causal_gqa_attention;
use super::config::Qwen3Config;
use super::decoder::{DecoderLayer, Mixer};
use super::mlp::{Linear, SwiGluMlp};
use super::params::{Init, ParamSpec, Params};
use crate::engine::model::error::ModelError;
use crate::engine::model::layers::{apply_rotary, rms_norm};

pub struct Qwen3Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
    eps: f64,
}

impl Qwen3Attention {
    pub fn specs(c: &Qwen3Config, prefix: &str, specs: &mut Vec<ParamSpec>) {
        let (h, d, bias) = (c.hidden_size, c.head_dim, c.attention_bias);
        Linear::specs(
            &format!("{prefix}.q_proj"),
            c.num_attention_heads * d,
            h,
            bias,
            specs,
        );
        Linear::specs(
            &format!("{prefix}.k_proj"),
            c.num_key_value_heads * d,
            h,
            bias,
            specs,
        );
        Linear::specs(
            &format!("{prefix}.v_proj"),
            c.num_key_value_heads * d,
            h,
            bias,
            specs,
        );
        Linear::specs(
            &format!("{prefix}.o_proj"),
            h,
            c.num_attention_heads * d,
            bias,
            specs,
        );
        specs.push(ParamSpec::new(
            format!("{prefix}.q_norm.weight"),
            &[d],
            Init::UnitNorm,
        ));
        specs.push(ParamSpec::new(
            format!("{prefix}.k_norm.weight"),
            &[d],
            Init::UnitNorm,
        ));
    }

    pub fn take(c: &Qwen3Config, prefix: &str, params: &mut Params) -> Result<Self, ModelError> {
        let bias = c.attention_bias;
        Ok(Self {
            q_proj: Linear::take(&format!("{prefix}.q_proj"), bias, params)?,
            k_proj: Linear::take(&format!("{prefix}.k_proj"), bias, params)?,
            v_proj: Linear::take(&format!("{prefix}.v_proj"), bias, params)?,
            o_proj: Linear::take(&format!("{prefix}.o_proj"), bias, params)?,
            q_norm: params.take(&format!("{prefix}.q_norm.weight"))?,
            k_norm: params.take(&format!("{prefix}.k_norm.weight"))?,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps,
        })
    }

    /// `x`: `[B,T,H]` (input-normed); `cos`, `sin`: `[T, head_dim]` → `[B,T,H]`.
    pub fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let size = x.size();
        let (batch, seq) = (size[0], size[1]);
        let d = self.head_dim;
        let q = self.q_proj.forward(x).view([batch, seq, self.num_heads, d]);
        let k = self
            .k_proj
            .forward(x)
            .view([batch, seq, self.num_kv_heads, d]);
        let v = self
            .v_proj
            .forward(x)
            .view([batch, seq, self.num_kv_heads, d]);
        let q = apply_rotary(&rms_norm(&q, &self.q_norm, self.eps), cos, sin);
        let k = apply_rotary(&rms_norm(&k, &self.k_norm, self.eps), cos, sin);
        let attn = causal_gqa_attention(&q, &k, &v, (d as f64).powf(-0.5));
        self.o_proj
            .forward(&attn.reshape([batch, seq, self.num_heads * d]))
    }
}

pub fn layer_specs(c: &Qwen3Config, layer: usize, specs: &mut Vec<ParamSpec>) {
    let p = format!("layers.{layer}");
    specs.push(ParamSpec::new(
        format!("{p}.input_layernorm.weight"),
        &[c.hidden_size],
        Init::UnitNorm,
    ));
    specs.push(ParamSpec::new(
        format!("{p}.post_attention_layernorm.weight"),
        &[c.hidden_size],
        Init::UnitNorm,
    ));
    Qwen3Attention::specs(c, &format!("{p}.self_attn"), specs);
    SwiGluMlp::specs(
        &format!("{p}.mlp"),
        c.hidden_size,
        c.intermediate_size,
        specs,
    );
}

pub fn build_layer(
    c: &Qwen3Config,
    layer: usize,
    params: &mut Params,
) -> Result<DecoderLayer, ModelError> {
    let p = format!("layers.{layer}");
    Ok(DecoderLayer {
        input_norm: params.take(&format!("{p}.input_layernorm.weight"))?,
        post_attention_norm: params.take(&format!("{p}.post_attention_layernorm.weight"))?,
        mixer: Mixer::Attention(Qwen3Attention::take(c, &format!("{p}.self_attn"), params)?),
        mlp: SwiGluMlp::take(&format!("{p}.mlp"), params)?,
    })
}
