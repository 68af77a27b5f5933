//! One Qwen3-style drafter layer with KV injection (spec §1.5).
use tch::{nn, Tensor};

use super::config::{DrafterConfig, LayerType};
use super::dflash2::GroupedConv;
use crate::model::attention::{
    block_attention, block_sparse_attention_scheduled, AttentionBackend, BlockAttentionInputs,
    ChunkSchedule, LayerRule,
};
use crate::model::layers::{apply_rotary, rms_norm};

/// Bias-free linear layer, weight `[out, in]` named `<path>.weight`, HF init `N(0, σ)`.
pub(crate) struct Linear {
    pub weight: Tensor,
}

impl Linear {
    pub fn new(vs: &nn::Path, out_features: i64, in_features: i64, stdev: f64) -> Self {
        let weight = vs.var(
            "weight",
            &[out_features, in_features],
            nn::Init::Randn { mean: 0.0, stdev },
        );
        Self { weight }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.linear::<Tensor>(&self.weight, None)
    }
}

/// Qwen3 RMSNorm `w · x̂`, weight named `<path>.weight`, initialised to 1.
pub(crate) struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(vs: &nn::Path, size: i64, eps: f64) -> Self {
        Self {
            weight: vs.ones("weight", &[size]),
            eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        rms_norm(x, &self.weight, self.eps)
    }
}

/// RoPE tables of one forward, shared by all layers: context positions `0..S-1` and block
/// slot `k` of block `j` at `anchor_j + k`. `cos`/`sin` are `[B or 1, T, head_dim]` fp32.
pub(crate) struct RopeTables {
    pub context_cos: Tensor,
    pub context_sin: Tensor,
    pub block_cos: Tensor,
    pub block_sin: Tensor,
}

/// What a layer needs besides its own input.
pub(crate) struct LayerContext<'a> {
    /// `hidden_norm(fc(features))`, `[B, S, H]`: the same tensor for every layer.
    pub context: &'a Tensor,
    pub rope: &'a RopeTables,
    pub anchors: &'a Tensor,
    pub keep: &'a Tensor,
    pub block_size: i64,
    pub backend: AttentionBackend,
    /// Block-sparse schedules of this forward, one per distinct layer rule (empty for the dense
    /// back-end): the sort, chunking and masks depend only on the anchors and the rule.
    pub schedules: &'a [ChunkSchedule],
}

pub(crate) struct DecoderLayer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// DFlash2's convolutions around the attention and the MLP (`attention_conv`, `mlp_conv`).
    pub(crate) convs: Option<[GroupedConv; 2]>,
    rule: LayerRule,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl DecoderLayer {
    /// `vs` is `layers.{i}`.
    pub fn rule(&self) -> LayerRule {
        self.rule
    }

    pub fn new(vs: &nn::Path, cfg: &DrafterConfig, layer_type: LayerType) -> Self {
        let (h, hd, std) = (cfg.hidden_size, cfg.head_dim, cfg.initializer_range);
        let heads = cfg.num_attention_heads;
        let kv_heads = cfg.num_key_value_heads;
        let attn = vs / "self_attn";
        let mlp = vs / "mlp";
        let rule = match layer_type {
            LayerType::Full => LayerRule::Full,
            LayerType::Sliding => LayerRule::Sliding {
                window: cfg
                    .sliding_window
                    .expect("a validated config has a window for sliding layers"),
            },
        };
        Self {
            input_layernorm: RmsNorm::new(&(vs / "input_layernorm"), h, cfg.rms_norm_eps),
            q_proj: Linear::new(&(&attn / "q_proj"), heads * hd, h, std),
            k_proj: Linear::new(&(&attn / "k_proj"), kv_heads * hd, h, std),
            v_proj: Linear::new(&(&attn / "v_proj"), kv_heads * hd, h, std),
            o_proj: Linear::new(&(&attn / "o_proj"), h, heads * hd, std),
            q_norm: RmsNorm::new(&(&attn / "q_norm"), hd, cfg.rms_norm_eps),
            k_norm: RmsNorm::new(&(&attn / "k_norm"), hd, cfg.rms_norm_eps),
            post_attention_layernorm: RmsNorm::new(
                &(vs / "post_attention_layernorm"),
                h,
                cfg.rms_norm_eps,
            ),
            gate_proj: Linear::new(&(&mlp / "gate_proj"), cfg.intermediate_size, h, std),
            up_proj: Linear::new(&(&mlp / "up_proj"), cfg.intermediate_size, h, std),
            down_proj: Linear::new(&(&mlp / "down_proj"), h, cfg.intermediate_size, std),
            // Constant-initialised: the backbone's draws are the same with or without them.
            convs: cfg.head.dflash2().map(|d| {
                ["attention_conv", "mlp_conv"]
                    .map(|name| GroupedConv::new(&(vs / name), d, h, cfg.block_size))
            }),
            rule,
            heads,
            kv_heads,
            head_dim: hd,
        }
    }

    /// `hidden` `[B, Q, H]` (block tokens) -> `[B, Q, H]`.
    pub fn forward(&self, hidden: &Tensor, ctx: &LayerContext<'_>) -> Tensor {
        let rope = ctx.rope;
        let (context_key, context_value) =
            self.context_key_value(ctx.context, &rope.context_cos, &rope.context_sin);
        self.forward_with_context(hidden, &context_key, &context_value, ctx)
    }

    /// This layer's keys `[B, S, Hkv, D]` (k_norm, RoPE at the context's own positions given
    /// by `cos`/`sin`) and values of the shared `context` `[B, S, H]`. They depend on nothing
    /// but the context, which is what lets decoding cache them.
    pub fn context_key_value(
        &self,
        context: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor) {
        let size = context.size();
        let (b, s, hd) = (size[0], size[1], self.head_dim);
        let key =
            self.k_norm
                .forward(&self.k_proj.forward(context).view([b, s, self.kv_heads, hd]));
        let key = apply_rotary(&key, cos, sin);
        let value = self.v_proj.forward(context).view([b, s, self.kv_heads, hd]);
        (key, value)
    }

    /// [`Self::forward`] with the context keys and values already computed.
    pub fn forward_with_context(
        &self,
        hidden: &Tensor,
        context_key: &Tensor,
        context_value: &Tensor,
        ctx: &LayerContext<'_>,
    ) -> Tensor {
        let size = hidden.size();
        let (b, q_len) = (size[0], size[1]);
        let hd = self.head_dim;
        let x = self.input_layernorm.forward(hidden);
        let (x, attention_kernel) = match &self.convs {
            Some([attention_conv, _]) => {
                let (x, kernel) = attention_conv.prepare(&x);
                (x, Some(kernel))
            }
            None => (x, None),
        };
        let rope = ctx.rope;

        let q = self
            .q_norm
            .forward(&self.q_proj.forward(&x).view([b, q_len, self.heads, hd]));
        let q = apply_rotary(&q, &rope.block_cos, &rope.block_sin);
        let block_key =
            self.k_norm
                .forward(&self.k_proj.forward(&x).view([b, q_len, self.kv_heads, hd]));
        let block_key = apply_rotary(&block_key, &rope.block_cos, &rope.block_sin);
        let block_value = self.v_proj.forward(&x).view([b, q_len, self.kv_heads, hd]);

        let inputs = BlockAttentionInputs {
            query: &q,
            context_key,
            context_value,
            block_key: &block_key,
            block_value: &block_value,
            anchors: ctx.anchors,
            keep: ctx.keep,
            block_size: ctx.block_size,
            rule: self.rule,
            scale: (hd as f64).powf(-0.5),
        };
        let schedule = ctx.schedules.iter().find(|p| p.rule() == self.rule);
        let attended = match (ctx.backend, schedule) {
            (AttentionBackend::BlockSparse, Some(schedule)) => {
                block_sparse_attention_scheduled(&inputs, schedule)
            }
            _ => block_attention(&inputs, ctx.backend),
        };
        let attention = self
            .o_proj
            .forward(&attended.reshape([b, q_len, self.heads * hd]));
        let hidden = match (&self.convs, &attention_kernel) {
            (Some([attention_conv, _]), Some(kernel)) => {
                hidden + attention_conv.finish(&attention, kernel)
            }
            _ => hidden + attention,
        };
        let y = self.post_attention_layernorm.forward(&hidden);
        let (y, mlp_kernel) = match &self.convs {
            Some([_, mlp_conv]) => {
                let (y, kernel) = mlp_conv.prepare(&y);
                (y, Some(kernel))
            }
            None => (y, None),
        };
        let mlp = self
            .down_proj
            .forward(&(self.gate_proj.forward(&y).silu() * self.up_proj.forward(&y)));
        match (&self.convs, &mlp_kernel) {
            (Some([_, mlp_conv]), Some(kernel)) => hidden + mlp_conv.finish(&mlp, kernel),
            _ => hidden + mlp,
        }
    }
}
