//! The DFlash drafter: `fc` + `hidden_norm` over concatenated target features, Qwen3-style
//! layers with KV injection, final norm (spec §1.5). No embedding and no LM head: the caller
//! embeds block tokens and applies the head with the target's frozen tables.
use tch::{nn, Device, Kind, Tensor};

use super::config::DrafterConfig;
use super::layer::{DecoderLayer, LayerContext, Linear, RmsNorm, RopeTables};
use crate::model::attention::{
    AttentionBackend, BlockOrder, BlockSparsePlan, DEFAULT_CHUNK_SCORE_ELEMENTS,
};
use crate::model::layers::Rotary;

pub struct Drafter {
    pub(super) config: DrafterConfig,
    pub(super) fc: Linear,
    pub(super) hidden_norm: RmsNorm,
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) norm: RmsNorm,
    pub(super) rotary: Rotary,
}

impl Drafter {
    /// Parameters named exactly as spec §1.3 relative to `vs` (`fc.weight`,
    /// `hidden_norm.weight`, `layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`), so a
    /// VarStore saves/loads the HF keys. Initialised as HF Qwen3 (linear `N(0, σ)`, norms 1).
    /// `cfg` must be valid ([`DrafterConfig::validate`]; `from_hf_json` already checks).
    /// Parameters take the VarStore's kind; call `VarStore::set_kind` (e.g. bf16) afterwards
    /// to change it: activations follow the parameters' dtype.
    pub fn new(vs: &nn::Path, cfg: &DrafterConfig) -> Self {
        if let Err(e) = cfg.validate("drafter config") {
            panic!("Drafter::new needs a valid config: {e}");
        }
        let h = cfg.hidden_size;
        let layers_path = vs / "layers";
        Self {
            config: cfg.clone(),
            fc: Linear::new(&(vs / "fc"), h, cfg.feature_size(), cfg.initializer_range),
            hidden_norm: RmsNorm::new(&(vs / "hidden_norm"), h, cfg.rms_norm_eps),
            layers: cfg
                .layer_types
                .iter()
                .enumerate()
                .map(|(i, &t)| DecoderLayer::new(&(&layers_path / i), cfg, t))
                .collect(),
            norm: RmsNorm::new(&(vs / "norm"), h, cfg.rms_norm_eps),
            rotary: Rotary::new(cfg.head_dim, cfg.rope_theta, vs.device()),
        }
    }

    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    /// Where the drafter's weights (and so its output) live.
    pub fn device(&self) -> Device {
        self.fc.weight.device()
    }

    /// The drafter's parameter dtype, which its activations follow.
    pub fn dtype(&self) -> Kind {
        self.fc.weight.kind()
    }

    /// Training forward. `target_features` `[B, S, n·Ht]`; `block_embeddings` `[B, N·bs, H]`
    /// (target embedding of `[anchor_token, MASK, ...]` per block); `anchors` `[B, N]` int64;
    /// `keep` `[B, N]` bool (false: padding slot; it sees only its own block and must get
    /// loss weight 0). Returns the final-normed hidden states `[B, N·bs, H]`.
    pub fn forward(
        &self,
        target_features: &Tensor,
        block_embeddings: &Tensor,
        anchors: &Tensor,
        keep: &Tensor,
        backend: AttentionBackend,
    ) -> Tensor {
        let cfg = &self.config;
        let bs = cfg.block_size;
        let (f, e, a) = (
            target_features.size(),
            block_embeddings.size(),
            anchors.size(),
        );
        assert!(
            f.len() == 3
                && f[2] == cfg.feature_size()
                && a.len() == 2
                && a[0] == f[0]
                && keep.size() == a
                && e == [f[0], a[1] * bs, cfg.hidden_size],
            "Drafter::forward: expected target_features [B, S, {}], block_embeddings [B, N*{bs}, {}], \
             anchors and keep [B, N]; got target_features {f:?}, block_embeddings {e:?}, anchors {a:?}, keep {:?}",
            cfg.feature_size(),
            cfg.hidden_size,
            keep.size()
        );
        let (dtype, device) = (self.dtype(), self.device());
        let anchors = anchors.to_device(device).to_kind(Kind::Int64);
        let keep = keep.to_device(device).to_kind(Kind::Bool);
        let plans_for = |anchors: &Tensor, keep: &Tensor| -> Vec<BlockSparsePlan> {
            let mut plans: Vec<BlockSparsePlan> = Vec::new();
            if backend == AttentionBackend::BlockSparse {
                for layer in &self.layers {
                    if plans.iter().all(|p| p.rule() != layer.rule()) {
                        plans.push(BlockSparsePlan::new(
                            layer.rule(),
                            anchors,
                            keep,
                            bs,
                            f[1],
                            cfg.num_attention_heads,
                            DEFAULT_CHUNK_SCORE_ELEMENTS,
                            (dtype, device),
                        ));
                    }
                }
            }
            plans
        };
        let mut plans = plans_for(&anchors, &keep);
        // Attention is the only op that mixes blocks, and it does not depend on their order.
        // When a plan chunks the blocks in anchor order, sorting them once here (and back at
        // the end) lets every layer run without gathering its queries, keys and values into
        // that order, and without autograd keeping those sorted copies per layer. The plans
        // are rebuilt on the sorted blocks, where they find nothing left to sort.
        let order = plans
            .iter()
            .any(|p| !p.keeps_given_order())
            .then(|| BlockOrder::by_anchor(&anchors, &keep))
            .flatten();
        let in_order = |t: Tensor| match &order {
            Some(order) => order.permute(&t),
            None => t,
        };
        let (anchors, keep) = (in_order(anchors), in_order(keep));
        if order.is_some() {
            plans = plans_for(&anchors, &keep);
        }
        let context = self.hidden_norm.forward(
            &self
                .fc
                // No copy when the caller passes the features already on this device in this
                // dtype, as training and evaluation do (evaluation places each group's features
                // once for all its anchor chunks).
                .forward(&target_features.to_device(device).to_kind(dtype)),
        );

        let offsets = Tensor::arange(bs, (Kind::Int64, device));
        let block_positions = (anchors.unsqueeze(-1) + offsets).view([a[0], a[1] * bs]);
        let context_positions = Tensor::arange(f[1], (Kind::Int64, device)).unsqueeze(0);
        let (context_cos, context_sin) = self.rotary.cos_sin(&context_positions);
        let (block_cos, block_sin) = self.rotary.cos_sin(&block_positions);
        let rope = RopeTables {
            context_cos,
            context_sin,
            block_cos,
            block_sin,
        };
        let layer_context = LayerContext {
            plans: &plans,
            context: &context,
            rope: &rope,
            anchors: &anchors,
            keep: &keep,
            block_size: bs,
            backend,
        };

        let mut hidden = in_order(block_embeddings.to_device(device).to_kind(dtype));
        for layer in &self.layers {
            hidden = layer.forward(&hidden, &layer_context);
        }
        let out = self.norm.forward(&hidden);
        match &order {
            Some(order) => order.restore(&out),
            None => out,
        }
    }

    /// Inference forward of ONE block at `anchor`, given the context features of positions
    /// `0..anchor-1` (`[B, anchor, n·Ht]`; longer inputs are cut to `anchor`). Returns
    /// `[B, bs, H]`. This is what a KV-cached decoding step computes (ZL `dflash_generate`):
    /// the block sees every context position before its anchor, windowed on sliding layers.
    pub fn forward_block(
        &self,
        context_features: &Tensor,
        block_embeddings: &Tensor,
        anchor: i64,
    ) -> Tensor {
        let size = context_features.size();
        assert!(
            size.len() == 3 && anchor >= 0 && size[1] >= anchor,
            "Drafter::forward_block: need context features [B, >= {anchor}, n*Ht], got {size:?}"
        );
        let device = self.device();
        let batch = size[0];
        let anchors = Tensor::full([batch, 1], anchor, (Kind::Int64, device));
        let keep = Tensor::ones([batch, 1], (Kind::Bool, device));
        self.forward(
            &context_features.narrow(1, 0, anchor),
            block_embeddings,
            &anchors,
            &keep,
            AttentionBackend::DenseMask,
        )
    }
}
