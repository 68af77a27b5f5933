//! Qwen3.5 gated full attention (`self_attn.*` on `full_attention` layers).
//!
//! As transformers' `Qwen3_5Attention`: `q_proj` yields q and an output gate interleaved per head
//! (`[.., heads, 2·D]`: first D = q, last D = gate); zero-centred RMSNorm on q and k per head;
//! RoPE on the first `rotary_dim` dims; causal GQA with scale `D^-0.5`; `o · sigmoid(gate)`; `o_proj`.
use tch::Tensor;

use super::attention::causal_gqa_attention;
use super::config::Qwen3_5TextConfig;
use super::mlp::Linear;
use super::params::{Init, ParamSpec, Params};
use crate::engine::model::error::ModelError;
use crate::engine::model::layers::{apply_rotary, rms_norm_zero_centered};

pub struct GatedAttention {
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

impl GatedAttention {
    pub fn specs(c: &Qwen3_5TextConfig, prefix: &str, specs: &mut Vec<ParamSpec>) {
        let (h, d, bias) = (c.hidden_size, c.head_dim, c.attention_bias);
        Linear::specs(
            &format!("{prefix}.q_proj"),
            c.num_attention_heads * d * 2,
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
            Init::ZeroCenteredNorm,
        ));
        specs.push(ParamSpec::new(
            format!("{prefix}.k_norm.weight"),
            &[d],
            Init::ZeroCenteredNorm,
        ));
    }

    pub fn take(
        c: &Qwen3_5TextConfig,
        prefix: &str,
        params: &mut Params,
    ) -> Result<Self, ModelError> {
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

    /// `x`: `[B,T,H]` (input-normed); `cos`, `sin`: `[T, rotary_dim]` → `[B,T,H]`.
    pub fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let size = x.size();
        let (batch, seq) = (size[0], size[1]);
        let d = self.head_dim;
        let q_and_gate = self
            .q_proj
            .forward(x)
            .view([batch, seq, self.num_heads, 2 * d]);
        let q = q_and_gate.narrow(-1, 0, d);
        let gate = q_and_gate
            .narrow(-1, d, d)
            .reshape([batch, seq, self.num_heads * d]);

        let q = rms_norm_zero_centered(&q, &self.q_norm, self.eps);
        let k = self
            .k_proj
            .forward(x)
            .view([batch, seq, self.num_kv_heads, d]);
        let k = rms_norm_zero_centered(&k, &self.k_norm, self.eps);
        let v = self
            .v_proj
            .forward(x)
            .view([batch, seq, self.num_kv_heads, d]);
        let q = apply_rotary(&q, cos, sin);
        let k = apply_rotary(&k, cos, sin);

        let attn = causal_gqa_attention(&q, &k, &v, (d as f64).powf(-0.5));
        let attn = attn.reshape([batch, seq, self.num_heads * d]) * gate.sigmoid();
        self.o_proj.forward(&attn)
    }
}
