//! Qwen3.5 Gated DeltaNet mixer (`linear_attn.*`), prefill form.
//!
//! Follows transformers' `Qwen3_5GatedDeltaNet` (5.x): `in_proj_qkv` → causal depthwise conv
//! (kernel K, left pad K−1, no bias) → silu → split q|k|v; `beta = sigmoid(in_proj_b x)` in the
//! model dtype; `g = −exp(A_log)·softplus(in_proj_a x + dt_bias)` in fp32; chunked gated delta rule
//! (fp32 state, q/k L2-normalised, q·Dk^-0.5); gated RMSNorm with `z = in_proj_z x`; `out_proj`.
use tch::{Kind, Tensor};

use super::cache::{DeltaNetCache, RuleInputs};
use super::config::Qwen3_5TextConfig;
use super::delta_rule::{
    chunk_gated_delta_rule, recurrent_gated_delta_rule, DeltaRuleInputs, CHUNK_SIZE,
};
use super::mlp::Linear;
use super::params::{Init, ParamSpec, Params, INIT_STD};
use super::tree::TreeShape;
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
        let p = self.project(x);
        let mixed = causal_depthwise_conv_silu(&p.pre_conv, &self.conv1d);
        let rule = self.rule_inputs(&mixed, p.g, p.beta);
        let (core, _state) = chunk_gated_delta_rule(&rule.as_inputs(), CHUNK_SIZE, None);
        self.output(&core, &p.z)
    }

    /// As [`Self::forward`] for `T` new tokens continuing the sequence whose conv window and
    /// recurrent state `cache` holds; advances `cache` over them (keeping what a later
    /// [`DeltaNetCache::crop`] to a prefix of them needs).
    pub fn forward_cached(&self, x: &Tensor, cache: &mut DeltaNetCache) -> Tensor {
        let p = self.project(x);
        let size = p.pre_conv.size();
        let (batch, channels) = (size[0], size[2]);
        let kernel = self.conv1d.size()[2];
        let device = p.pre_conv.device();
        let window = cache.window([batch, kernel - 1, channels], (p.pre_conv.kind(), device));
        let mixed = windowed_depthwise_conv_silu(&window, &p.pre_conv, &self.conv1d);
        let rule = self.rule_inputs(&mixed, p.g, p.beta);
        let state = cache.state(
            [batch, self.num_v_heads, self.head_k_dim, self.head_v_dim],
            device,
        );
        // One token: the recurrent step (as transformers decodes); more: the chunked form.
        let (core, final_state) = if size[1] == 1 {
            recurrent_gated_delta_rule(&rule.as_inputs(), Some(&state))
        } else {
            chunk_gated_delta_rule(&rule.as_inputs(), CHUNK_SIZE, Some(&state))
        };
        cache.advance(p.pre_conv, rule, final_state);
        self.output(&core, &p.z)
    }

    /// As [`Self::forward_cached`] for new tokens that form a tree after the cached sequence
    /// (DDTree verification): each token's conv reads its ancestors' inputs (then the cached
    /// window), and its recurrent state is its parent's advanced by its own inputs, one depth
    /// at a time. Leaves `cache` awaiting the path to keep ([`DeltaNetCache::advance_tree`]).
    /// Batch 1.
    pub fn forward_tree(&self, x: &Tensor, cache: &mut DeltaNetCache, tree: &TreeShape) -> Tensor {
        let p = self.project(x);
        let size = p.pre_conv.size();
        let (batch, tokens, channels) = (size[0], size[1], size[2]);
        assert_eq!(batch, 1, "a tree forward runs one sequence");
        let kernel = self.conv1d.size()[2];
        let device = p.pre_conv.device();
        let window = cache.window([1, kernel - 1, channels], (p.pre_conv.kind(), device));
        let mixed = tree_depthwise_conv_silu(&window, &p.pre_conv, &self.conv1d, tree);
        let rule = self.rule_inputs(&mixed, p.g, p.beta);
        let root_state = cache.state(
            [1, self.num_v_heads, self.head_k_dim, self.head_v_dim],
            device,
        );
        let mut core = Tensor::zeros(
            [1, tokens, self.num_v_heads, self.head_v_dim],
            (p.pre_conv.kind(), device),
        );
        // Per level: its tokens as a batch of one-token sequences, each from its parent's state.
        let mut row_of = vec![0i64; tree.len()];
        let mut level_states = root_state;
        for level in tree.levels() {
            let index: Vec<i64> = level.iter().map(|&n| n as i64).collect();
            let index = Tensor::from_slice(&index).to_device(device);
            let parent_rows: Vec<i64> = level
                .iter()
                .map(|&n| tree.parents()[n].map_or(0, |p| row_of[p]))
                .collect();
            let parent_states =
                level_states.index_select(0, &Tensor::from_slice(&parent_rows).to_device(device));
            let pick = |t: &Tensor| t.index_select(1, &index).transpose(0, 1);
            let (q, k, v, g, beta) = (
                pick(&rule.q),
                pick(&rule.k),
                pick(&rule.v),
                pick(&rule.g),
                pick(&rule.beta),
            );
            let inputs = DeltaRuleInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            let (out, states) = recurrent_gated_delta_rule(&inputs, Some(&parent_states));
            core = core.index_copy(1, &index, &out.transpose(0, 1));
            for (row, &n) in level.iter().enumerate() {
                row_of[n] = row as i64;
            }
            level_states = states;
        }
        cache.advance_tree(p.pre_conv, rule);
        self.output(&core, &p.z)
    }

    /// The projections before the conv: conv input `[B,T,conv_dim]`, gate z `[B,T,Hv,Dv]`,
    /// β `[B,T,Hv]` and the log decay g `[B,T,Hv]` (fp32).
    fn project(&self, x: &Tensor) -> Projected {
        let size = x.size();
        let (batch, seq) = (size[0], size[1]);
        let z = self
            .in_proj_z
            .forward(x)
            .reshape([batch, seq, self.num_v_heads, self.head_v_dim]);
        let beta = self.in_proj_b.forward(x).sigmoid();
        // fp32 as in HF: in half precision exp(A_log) may overflow and softplus loses the small decays
        let a = self.in_proj_a.forward(x).to_kind(Kind::Float) + self.dt_bias.to_kind(Kind::Float);
        let g = -self.a_log.to_kind(Kind::Float).exp() * a.softplus();
        Projected {
            pre_conv: self.in_proj_qkv.forward(x),
            z,
            beta,
            g,
        }
    }

    /// Splits the conv output into q, k, v heads.
    fn rule_inputs(&self, mixed: &Tensor, g: Tensor, beta: Tensor) -> RuleInputs {
        let size = mixed.size();
        let (batch, seq) = (size[0], size[1]);
        let key_dim = self.num_k_heads * self.head_k_dim;
        let value_dim = self.num_v_heads * self.head_v_dim;
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
        RuleInputs { q, k, v, g, beta }
    }

    fn output(&self, core: &Tensor, z: &Tensor) -> Tensor {
        let size = core.size();
        let normed = rms_norm_gated(core, z, &self.norm, self.eps);
        self.out_proj.forward(&normed.reshape([
            size[0],
            size[1],
            self.num_v_heads * self.head_v_dim,
        ]))
    }
}

struct Projected {
    pre_conv: Tensor,
    z: Tensor,
    beta: Tensor,
    g: Tensor,
}

/// `x`: `[B,T,C]` after `window` `[B,K−1,C]` (the K−1 conv inputs before it), `weight`
/// `[C,1,K]` → `silu(conv)` `[B,T,C]`: output t sees inputs t−K+1..=t, reaching into the window.
fn windowed_depthwise_conv_silu(window: &Tensor, x: &Tensor, weight: &Tensor) -> Tensor {
    let channels = x.size()[2];
    Tensor::cat(&[window, &x.to_kind(window.kind())], 1)
        .transpose(1, 2)
        .conv1d(weight, None::<Tensor>, [1], [0], [1], channels)
        .silu()
        .transpose(1, 2)
}

/// As [`windowed_depthwise_conv_silu`] for a tree of new tokens (batch 1): token t's conv reads
/// the inputs of its `K` nearest ancestors-or-self, oldest first, reaching into `window` above
/// the tree's first token (`TreeShape::conv_taps`). Along a chain this is the windowed conv.
fn tree_depthwise_conv_silu(
    window: &Tensor,
    x: &Tensor,
    weight: &Tensor,
    tree: &TreeShape,
) -> Tensor {
    let size = x.size();
    let (tokens, channels) = (size[1], size[2]);
    let kernel = weight.size()[2];
    let taps = Tensor::from_slice(&tree.conv_taps(kernel as usize)).to_device(x.device());
    let joined = Tensor::cat(&[window, &x.to_kind(window.kind())], 1).squeeze_dim(0);
    // one kernel-wide sequence per token: [T, C, K] → conv → [T, C, 1]
    joined
        .index_select(0, &taps)
        .view([tokens, kernel, channels])
        .transpose(1, 2)
        .conv1d(weight, None::<Tensor>, [1], [0], [1], channels)
        .silu()
        .view([1, tokens, channels])
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
    fn windowed_conv_continues_the_causal_conv() {
        let _rng = crate::device::global_rng::seeded(4);
        let x = Tensor::randn([2, 9, 3], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([3, 1, 4], (Kind::Float, Device::Cpu));
        let whole = causal_depthwise_conv_silu(&x, &w);
        let tail = windowed_depthwise_conv_silu(&x.narrow(1, 3, 3), &x.narrow(1, 6, 3), &w);
        assert!(tail.allclose(&whole.narrow(1, 6, 3), 1e-5, 1e-6, false));
        let zeros = Tensor::zeros([2, 3, 3], (Kind::Float, Device::Cpu));
        let head = windowed_depthwise_conv_silu(&zeros, &x.narrow(1, 0, 5), &w);
        assert!(head.allclose(&whole.narrow(1, 0, 5), 1e-5, 1e-6, false));
    }

    #[test]
    fn the_tree_conv_of_a_chain_is_the_windowed_conv_and_a_branch_reads_its_own_path() {
        let _rng = crate::device::global_rng::seeded(5);
        let opts = (Kind::Float, Device::Cpu);
        let window = Tensor::randn([1, 3, 3], opts);
        let x = Tensor::randn([1, 5, 3], opts);
        let w = Tensor::randn([3, 1, 4], opts);
        let chain = tree_depthwise_conv_silu(&window, &x, &w, &TreeShape::chain(5));
        let windowed = windowed_depthwise_conv_silu(&window, &x, &w);
        assert!(chain.allclose(&windowed, 1e-6, 1e-6, false));
        // tokens 0 ─ 1, 0 ─ 2 ─ 3: token 3 sees window[2], x0, x2, x3 as a chain would
        let tree = TreeShape::new(vec![None, Some(0), Some(0), Some(2)]).unwrap();
        let branched = tree_depthwise_conv_silu(&window, &x.narrow(1, 0, 4), &w, &tree);
        let path = Tensor::cat(&[x.narrow(1, 0, 1), x.narrow(1, 2, 2)], 1);
        let along = windowed_depthwise_conv_silu(&window, &path, &w);
        assert!(branched
            .get(0)
            .get(3)
            .allclose(&along.get(0).get(2), 1e-6, 1e-6, false));
        assert!(branched
            .get(0)
            .get(1)
            .allclose(&windowed.get(0).get(1), 1e-6, 1e-6, false));
    }

    #[test]
    fn conv_is_causal_and_matches_a_direct_sum() {
        let _rng = crate::device::global_rng::seeded(3);
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
