//! Qwen3.5 Gated DeltaNet mixer (`linear_attn.*`), prefill form.
//!
//! Follows transformers' `Qwen3_5GatedDeltaNet` (5.x): `in_proj_qkv` → causal depthwise conv
//! (kernel K, left pad K−1, no bias) → silu → split q|k|v; `beta = sigmoid(in_proj_b x)` in the
//! model dtype; `g = −exp(A_log)·softplus(in_proj_a x + dt_bias)` in fp32; chunked gated delta rule
//! (fp32 state, q/k L2-normalised, q·Dk^-0.5); gated RMSNorm with `z = in_proj_z x`; `out_proj`.
use tch::{Kind, Tensor};

use super::config::Qwen3_5TextConfig;
use super::delta_rule::{chunk_gated_delta_rule, DeltaRuleInputs, CHUNK_SIZE};
use super::mlp::Linear;
use super::params::{Init, ParamSpec, Params, INIT_STD};
use crate::model::error::ModelError;
use crate::model::layers::rms_norm_gated;

pub struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    /// `[conv_dim, 1, K]`, depthwise.
    conv1d: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    norm: Tensor,
    out_proj: Linear,
    num_k_heads: i64,
    num_v_heads: i64,
    head_k_dim: i64,
    head_v_dim: i64,
    eps: f64,
}

struct Dims {
    value_dim: i64,
    conv_dim: i64,
}

fn dims(c: &Qwen3_5TextConfig) -> Dims {
    let key_dim = c.linear_num_key_heads * c.linear_key_head_dim;
    let value_dim = c.linear_num_value_heads * c.linear_value_head_dim;
    Dims {
        value_dim,
        conv_dim: 2 * key_dim + value_dim,
    }
}

impl GatedDeltaNet {
    pub fn specs(c: &Qwen3_5TextConfig, prefix: &str, specs: &mut Vec<ParamSpec>) {
        let d = dims(c);
        let h = c.hidden_size;
        let nv = c.linear_num_value_heads;
        Linear::specs(
            &format!("{prefix}.in_proj_qkv"),
            d.conv_dim,
            h,
            false,
            specs,
        );
        Linear::specs(&format!("{prefix}.in_proj_z"), d.value_dim, h, false, specs);
        Linear::specs(&format!("{prefix}.in_proj_b"), nv, h, false, specs);
        Linear::specs(&format!("{prefix}.in_proj_a"), nv, h, false, specs);
        specs.push(ParamSpec::new(
            format!("{prefix}.conv1d.weight"),
            &[d.conv_dim, 1, c.linear_conv_kernel_dim],
            Init::Normal(INIT_STD),
        ));
        specs.push(ParamSpec::new(
            format!("{prefix}.dt_bias"),
            &[nv],
            Init::Ones,
        ));
        specs.push(ParamSpec::new(format!("{prefix}.A_log"), &[nv], Init::ALog));
        specs.push(ParamSpec::new(
            format!("{prefix}.norm.weight"),
            &[c.linear_value_head_dim],
            Init::UnitNorm,
        ));
        Linear::specs(&format!("{prefix}.out_proj"), h, d.value_dim, false, specs);
    }

    pub fn take(
        c: &Qwen3_5TextConfig,
        prefix: &str,
        params: &mut Params,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            in_proj_qkv: Linear::take(&format!("{prefix}.in_proj_qkv"), false, params)?,
            in_proj_z: Linear::take(&format!("{prefix}.in_proj_z"), false, params)?,
            in_proj_b: Linear::take(&format!("{prefix}.in_proj_b"), false, params)?,
            in_proj_a: Linear::take(&format!("{prefix}.in_proj_a"), false, params)?,
            conv1d: params.take(&format!("{prefix}.conv1d.weight"))?,
            a_log: params.take(&format!("{prefix}.A_log"))?,
            dt_bias: params.take(&format!("{prefix}.dt_bias"))?,
            norm: params.take(&format!("{prefix}.norm.weight"))?,
            out_proj: Linear::take(&format!("{prefix}.out_proj"), false, params)?,
            num_k_heads: c.linear_num_key_heads,
            num_v_heads: c.linear_num_value_heads,
            head_k_dim: c.linear_key_head_dim,
            head_v_dim: c.linear_value_head_dim,
            eps: c.rms_norm_eps,
        })
    }

    /// `x`: `[B,T,H]` (already input-normed) → `[B,T,H]`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let size = x.size();
        let (batch, seq) = (size[0], size[1]);
        let key_dim = self.num_k_heads * self.head_k_dim;
        let value_dim = self.num_v_heads * self.head_v_dim;

        let mixed = causal_depthwise_conv_silu(&self.in_proj_qkv.forward(x), &self.conv1d);
        let q =
            mixed
                .narrow(-1, 0, key_dim)
                .reshape([batch, seq, self.num_k_heads, self.head_k_dim]);
        let k = mixed.narrow(-1, key_dim, key_dim).reshape([
            batch,
            seq,
            self.num_k_heads,
            self.head_k_dim,
        ]);
        let v = mixed.narrow(-1, 2 * key_dim, value_dim).reshape([
            batch,
            seq,
            self.num_v_heads,
            self.head_v_dim,
        ]);
        let z = self
            .in_proj_z
            .forward(x)
            .reshape([batch, seq, self.num_v_heads, self.head_v_dim]);

        let beta = self.in_proj_b.forward(x).sigmoid();
        // fp32 as in HF: in half precision exp(A_log) may overflow and softplus loses the small decays
        let a = self.in_proj_a.forward(x).to_kind(Kind::Float) + self.dt_bias.to_kind(Kind::Float);
        let g = -self.a_log.to_kind(Kind::Float).exp() * a.softplus();

        let inputs = DeltaRuleInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let (core, _state) = chunk_gated_delta_rule(&inputs, CHUNK_SIZE, None);
        let normed = rms_norm_gated(&core, &z, &self.norm, self.eps);
        self.out_proj
            .forward(&normed.reshape([batch, seq, value_dim]))
    }
}

/// `x`: `[B,T,C]`, `weight`: `[C,1,K]` → `silu(conv)` `[B,T,C]`, where output t sees inputs
/// t−K+1..=t (zeros before the sequence start).
fn causal_depthwise_conv_silu(x: &Tensor, weight: &Tensor) -> Tensor {
    let size = x.size();
    let (seq, channels) = (size[1], size[2]);
    let kernel = weight.size()[2];
    let conv = x
        .transpose(1, 2)
        .conv1d(weight, None::<Tensor>, [1], [kernel - 1], [1], channels)
        .narrow(2, 0, seq);
    conv.silu().transpose(1, 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn conv_is_causal_and_matches_a_direct_sum() {
        tch::manual_seed(3);
        let x = Tensor::randn([1, 6, 3], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([3, 1, 4], (Kind::Float, Device::Cpu));
        let y = causal_depthwise_conv_silu(&x, &w);
        // output t, channel ch = silu(Σ_j w[ch,0,j] · x[t-3+j, ch])
        for t in 0..6i64 {
            for ch in 0..3i64 {
                let mut acc = 0.0;
                for j in 0..4i64 {
                    let src = t - 3 + j;
                    if src >= 0 {
                        acc += w.double_value(&[ch, 0, j]) * x.double_value(&[0, src, ch]);
                    }
                }
                let expected = acc / (1.0 + (-acc).exp());
                assert!((y.double_value(&[0, t, ch]) - expected).abs() < 1e-5);
            }
        }
    }
}
