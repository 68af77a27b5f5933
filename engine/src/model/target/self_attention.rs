//! Full causal self-attention of both target families, one module because they differ in two
//! switches only:
//! - Qwen3 (`Qwen3Attention`): `q_proj` yields q; per-head `w·x̂` RMSNorm on q and k; no gate.
//! - Qwen3.5 (`Qwen3_5Attention`, `full_attention` layers): `q_proj` yields q and an output gate
//!   interleaved per head (`[.., heads, 2·D]`: first D = q, last D = gate); zero-centred norms;
//!   RoPE on the first `rotary_dim` dims; the output is `o · sigmoid(gate)` before `o_proj`.
//!
//! Both: causal GQA with scale `D^-0.5`, optional q/k/v/o biases (`attention_bias`).
use tch::Tensor;

use super::attention::{causal_gqa_attention, masked_gqa_attention};
use super::cache::KvCache;
use super::config::{Qwen3Config, Qwen3_5TextConfig};
use super::mlp::Linear;
use super::norm::NormStyle;
use super::params::{ParamSpec, Params};
use crate::model::error::ModelError;
use crate::model::layers::apply_rotary;

/// The shape and conventions of one family's attention, read from its config.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSpec {
    pub hidden_size: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub bias: bool,
    pub eps: f64,
    pub norm: NormStyle,
    /// Qwen3.5's sigmoid output gate, carried in the second half of each head of `q_proj`.
    pub output_gate: bool,
}

impl AttentionSpec {
    pub fn qwen3(c: &Qwen3Config) -> Self {
        Self {
            hidden_size: c.hidden_size,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            bias: c.attention_bias,
            eps: c.rms_norm_eps,
            norm: NormStyle::Plain,
            output_gate: false,
        }
    }

    pub fn qwen3_5(c: &Qwen3_5TextConfig) -> Self {
        Self {
            hidden_size: c.hidden_size,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            bias: c.attention_bias,
            eps: c.rms_norm_eps,
            norm: NormStyle::ZeroCentered,
            output_gate: true,
        }
    }

    /// Rows of `q_proj` per head: q alone, or q then its gate.
    fn q_rows_per_head(&self) -> i64 {
        if self.output_gate {
            2 * self.head_dim
        } else {
            self.head_dim
        }
    }
}

struct Projected {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gate: Option<Tensor>,
}

pub struct SelfAttention {
    spec: AttentionSpec,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
}

impl SelfAttention {
    pub fn specs(s: &AttentionSpec, prefix: &str, specs: &mut Vec<ParamSpec>) {
        let (h, d) = (s.hidden_size, s.head_dim);
        let projections = [
            ("q_proj", s.num_heads * s.q_rows_per_head(), h),
            ("k_proj", s.num_kv_heads * d, h),
            ("v_proj", s.num_kv_heads * d, h),
            ("o_proj", h, s.num_heads * d),
        ];
        for (name, out_features, in_features) in projections {
            let name = format!("{prefix}.{name}");
            Linear::specs(&name, out_features, in_features, s.bias, specs);
        }
        for norm in ["q_norm", "k_norm"] {
            specs.push(ParamSpec::new(
                format!("{prefix}.{norm}.weight"),
                &[d],
                s.norm.init(),
            ));
        }
    }

    pub fn take(s: &AttentionSpec, prefix: &str, params: &mut Params) -> Result<Self, ModelError> {
        let linear = |name: &str, params: &mut Params| {
            Linear::take(&format!("{prefix}.{name}"), s.bias, params)
        };
        Ok(Self {
            spec: *s,
            q_proj: linear("q_proj", params)?,
            k_proj: linear("k_proj", params)?,
            v_proj: linear("v_proj", params)?,
            o_proj: linear("o_proj", params)?,
            q_norm: params.take(&format!("{prefix}.q_norm.weight"))?,
            k_norm: params.take(&format!("{prefix}.k_norm.weight"))?,
        })
    }

    /// `x`: `[B,T,H]` (input-normed); `cos`, `sin`: `[T, rotary_dim]` → `[B,T,H]`.
    pub fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let p = self.project(x, cos, sin);
        let attn = causal_gqa_attention(&p.q, &p.k, &p.v, self.scale());
        self.output(&attn, p.gate.as_ref())
    }

    /// As [`Self::forward`] for `T` new tokens after the `cache.len()` tokens `cache` holds
    /// (`cos`, `sin` at the new tokens' positions): appends their keys and values to `cache`.
    /// `visible` is the `[T, cache.len() + T]` boolean mask of the keys each new token attends
    /// to (`true` = attend): the causal offset mask for a chain (`chain`), a tree's
    /// ancestor mask otherwise.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
        visible: &Tensor,
        chain: bool,
    ) -> Tensor {
        let p = self.project(x, cos, sin);
        let empty = cache.is_empty();
        let (keys, values) = cache.append(&p.k, &p.v);
        // From an empty cache the causal kernel is the training forward's own, so a prefill
        // gives the training forward's numbers exactly.
        let attn = if empty && chain {
            causal_gqa_attention(&p.q, &keys, &values, self.scale())
        } else {
            masked_gqa_attention(&p.q, &keys, &values, visible, self.scale())
        };
        self.output(&attn, p.gate.as_ref())
    }

    fn scale(&self) -> f64 {
        (self.spec.head_dim as f64).powf(-0.5)
    }

    /// q and k normed and rotated `[B,T,heads,D]`, v, and the Qwen3.5 gate `[B,T,Hq·D]`.
    fn project(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Projected {
        let s = &self.spec;
        let size = x.size();
        let (batch, seq, d) = (size[0], size[1], s.head_dim);
        let heads = |t: Tensor, n: i64, width: i64| t.view([batch, seq, n, width]);

        let q_rows = heads(self.q_proj.forward(x), s.num_heads, s.q_rows_per_head());
        let q = q_rows.narrow(-1, 0, d);
        let k = heads(self.k_proj.forward(x), s.num_kv_heads, d);
        let v = heads(self.v_proj.forward(x), s.num_kv_heads, d);
        let q = apply_rotary(&s.norm.apply(&q, &self.q_norm, s.eps), cos, sin);
        let k = apply_rotary(&s.norm.apply(&k, &self.k_norm, s.eps), cos, sin);
        let gate = s.output_gate.then(|| {
            q_rows
                .narrow(-1, d, d)
                .reshape([batch, seq, s.num_heads * d])
        });
        Projected { q, k, v, gate }
    }

    /// `attn` `[B,T,Hq,D]` → gated (Qwen3.5) and projected `[B,T,H]`.
    fn output(&self, attn: &Tensor, gate: Option<&Tensor>) -> Tensor {
        let size = attn.size();
        let attn = attn.reshape([size[0], size[1], self.spec.num_heads * self.spec.head_dim]);
        let attn = match gate {
            Some(gate) => attn * gate.sigmoid(),
            None => attn,
        };
        self.o_proj.forward(&attn)
    }
}
