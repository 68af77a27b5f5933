//! The DFlash drafter: `fc` + `hidden_norm` over concatenated target features, Qwen3-style
//! layers with KV injection, final norm (spec §1.5). No embedding and no LM head: the caller
//! embeds block tokens and applies the head with the target's frozen tables.
use tch::{nn, Device, Kind, Tensor};

use super::config::DrafterConfig;
use super::dflash2::CandidateSelector;
use super::domino::DominoHead;
use super::dspark::DsparkHead;
use super::layer::{DecoderLayer, LayerContext, Linear, RmsNorm, RopeTables};
use crate::model::attention::{
    AttentionBackend, BlockOrder, ChunkSchedule, ScheduledBlocks, DEFAULT_CHUNK_SCORE_ELEMENTS,
};
use crate::model::layers::Rotary;

/// What one training pass of the drafter reads, as [`Drafter::forward`] describes each tensor:
/// the target's features, the blocks' embeddings, and the blocks' anchors and keep flags.
#[derive(Clone, Copy)]
pub struct DrafterInputs<'a> {
    /// `[B, S, n·Ht]`.
    pub target_features: &'a Tensor,
    /// `[B, N·bs, H]`.
    pub block_embeddings: &'a Tensor,
    /// `[B, N]` int64.
    pub anchors: &'a Tensor,
    /// `[B, N]` bool.
    pub keep: &'a Tensor,
}

pub struct Drafter {
    pub(super) config: DrafterConfig,
    pub(super) fc: Linear,
    pub(super) hidden_norm: RmsNorm,
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) norm: RmsNorm,
    pub(super) rotary: Rotary,
    /// Domino's GRU and `embed_proj` when `config.head` is Domino.
    pub(super) domino: Option<DominoHead>,
    /// DSpark's Markov and confidence heads when `config.head` is DSpark.
    pub(super) dspark: Option<DsparkHead>,
    /// DFlash2's candidate selector when `config.head` is DFlash2 (its convolutions live in
    /// the layers).
    pub(super) selector: Option<CandidateSelector>,
}

impl Drafter {
    /// Parameters named exactly as spec §1.3 relative to `vs` (`fc.weight`,
    /// `hidden_norm.weight`, `layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`; with a
    /// Domino head also `prefix_gru.*` and `embed_proj.*`, with a DSpark head `markov_head.*`
    /// and `confidence_head.*`, with DFlash2's `layers.{i}.{attention,mlp}_conv.*` and
    /// `candidate_selector.*`, SpecForge's names), so a VarStore saves/loads the HF keys.
    /// Initialised as HF Qwen3 (linear `N(0, σ)`, norms 1).
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
            // Drawn after the backbone, so a DFlash drafter's init is the same with or without
            // this head existing.
            domino: cfg
                .head
                .domino()
                .map(|d| DominoHead::new(vs, d, h, cfg.vocab_size, cfg.initializer_range)),
            // Likewise after the backbone (and Domino's slot: the heads are exclusive).
            dspark: cfg
                .head
                .dspark()
                .map(|d| DsparkHead::new(vs, d, h, cfg.vocab_size, cfg.initializer_range)),
            selector: cfg
                .head
                .dflash2()
                .map(|d| CandidateSelector::new(vs, d, h, cfg.vocab_size, cfg.initializer_range)),
        }
    }

    /// Domino's head, when the drafter has one.
    pub fn domino(&self) -> Option<&DominoHead> {
        self.domino.as_ref()
    }

    /// DSpark's heads, when the drafter has them.
    pub fn dspark(&self) -> Option<&DsparkHead> {
        self.dspark.as_ref()
    }

    /// DFlash2's candidate selector, when the drafter has one.
    pub fn selector(&self) -> Option<&CandidateSelector> {
        self.selector.as_ref()
    }

    /// Whether the drafter drafts from more than the LM head's logits over its output:
    /// Domino's correction, DSpark's Markov head, DFlash2's selector. Decoding from the LM head
    /// alone then measures what that part adds.
    pub fn corrects_lm_head(&self) -> bool {
        self.domino.is_some()
            || self.selector.is_some()
            || self.dspark.as_ref().is_some_and(|d| d.markov().is_some())
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
        let shared = self.prepare(target_features, block_embeddings, anchors, keep, backend);
        let context = self.context(target_features);
        let layer_context = shared.layer_context(&context, backend);
        let mut hidden = shared.blocks.shallow_clone();
        for layer in &self.layers {
            hidden = layer.forward(&hidden, &layer_context);
        }
        shared.in_given_order(self.norm.forward(&hidden))
    }

    /// Training forward and backward of one micro-batch: [`Self::forward`]'s output goes to
    /// `backward_from_output`, which must backpropagate the loss from it (as
    /// `train/loss.rs::weighted_ce_backward` does); its result is returned, and the gradients
    /// of every parameter (and of inputs that require them) are accumulated.
    ///
    /// With `activation_checkpointing`, the layers before the last keep only their inputs
    /// through the forward and run again, last to first, in the backward, each from its saved
    /// input and with the gradient its output received: the saved activations of all layers
    /// become those of one, for one more forward of the layers before the last. The gradients
    /// are the plain forward's: every layer's parameter gradients bit for bit (the recompute
    /// runs the same kernels on the same inputs), `fc` and `hidden_norm` up to float rounding,
    /// since the context's gradient is summed over the layers one layer at a time.
    pub fn forward_backward<R>(
        &self,
        inputs: &DrafterInputs<'_>,
        backend: AttentionBackend,
        activation_checkpointing: bool,
        backward_from_output: impl FnOnce(&Tensor) -> R,
    ) -> R {
        let DrafterInputs {
            target_features,
            block_embeddings,
            anchors,
            keep,
        } = *inputs;
        if !activation_checkpointing {
            let out = self.forward(target_features, block_embeddings, anchors, keep, backend);
            return backward_from_output(&out);
        }
        let shared = self.prepare(target_features, block_embeddings, anchors, keep, backend);
        let context = self.context(target_features);
        // Every layer reads the context through this leaf, so their gradients with respect to
        // it collect in its `.grad` and go back through `hidden_norm` and `fc` once, at the end.
        let context_leaf = context.detach().set_requires_grad(true);
        let layer_context = shared.layer_context(&context_leaf, backend);
        let (last, earlier) = self
            .layers
            .split_last()
            .expect("a validated drafter config has layers");

        // Forward: the layers before the last run without a graph; only their inputs are kept.
        let mut inputs = vec![shared.blocks.shallow_clone()];
        tch::no_grad(|| {
            for layer in earlier {
                let next = layer.forward(inputs.last().expect("starts non-empty"), &layer_context);
                inputs.push(next);
            }
        });
        // The last layer keeps its graph: its backward follows the loss's at once. Its input
        // is the first layer's (with whatever graph the block embeddings carry) or a leaf
        // that collects the gradient for the layer before it.
        let last_input = inputs.pop().expect("starts non-empty");
        let last_input = if earlier.is_empty() {
            last_input
        } else {
            last_input.set_requires_grad(true)
        };
        let out = shared.in_given_order(
            self.norm
                .forward(&last.forward(&last_input, &layer_context)),
        );
        let result = backward_from_output(&out);
        drop(out);

        // Backward, last to first: run each earlier layer again from its input, with its graph,
        // and backpropagate the gradient of its output (its successor's input gradient).
        let mut output_grad = if earlier.is_empty() {
            Tensor::new()
        } else {
            last_input.grad()
        };
        drop(last_input);
        for (i, (layer, input)) in earlier.iter().zip(inputs).enumerate().rev() {
            if !output_grad.defined() {
                break; // nothing flowed back (no weighted position): nothing to recompute
            }
            // Layer 0's input is the block embeddings themselves, graph included.
            let input = if i == 0 {
                input
            } else {
                input.set_requires_grad(true)
            };
            backpropagate(&layer.forward(&input, &layer_context), &output_grad);
            output_grad = if i == 0 { Tensor::new() } else { input.grad() };
        }
        let context_grad = context_leaf.grad();
        if context_grad.defined() {
            backpropagate(&context, &context_grad);
        }
        result
    }

    /// What every layer of one training forward shares, built once: the anchors and blocks in
    /// the order attention runs them, the block-sparse schedules and the RoPE tables.
    fn prepare(
        &self,
        target_features: &Tensor,
        block_embeddings: &Tensor,
        anchors: &Tensor,
        keep: &Tensor,
        backend: AttentionBackend,
    ) -> SharedInputs {
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
        let schedules_for = |anchors: &Tensor, keep: &Tensor| -> Vec<ChunkSchedule> {
            let mut schedules: Vec<ChunkSchedule> = Vec::new();
            if backend == AttentionBackend::BlockSparse {
                for layer in &self.layers {
                    if schedules.iter().all(|p| p.rule() != layer.rule()) {
                        let blocks = ScheduledBlocks {
                            rule: layer.rule(),
                            anchors,
                            keep,
                            block_size: bs,
                            context_len: f[1],
                            heads: cfg.num_attention_heads,
                        };
                        schedules.push(ChunkSchedule::new(
                            &blocks,
                            DEFAULT_CHUNK_SCORE_ELEMENTS,
                            (dtype, device),
                        ));
                    }
                }
            }
            schedules
        };
        let mut schedules = schedules_for(&anchors, &keep);
        // Attention is the only op that mixes blocks, and it does not depend on their order.
        // When a schedule chunks the blocks in anchor order, sorting them once here (and back at
        // the end) lets every layer run without gathering its queries, keys and values into
        // that order, and without autograd keeping those sorted copies per layer. The schedules
        // are rebuilt on the sorted blocks, where they find nothing left to sort.
        let order = schedules
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
            schedules = schedules_for(&anchors, &keep);
        }
        let offsets = Tensor::arange(bs, (Kind::Int64, device));
        let block_positions = (anchors.unsqueeze(-1) + offsets).view([a[0], a[1] * bs]);
        let context_positions = Tensor::arange(f[1], (Kind::Int64, device)).unsqueeze(0);
        let (context_cos, context_sin) = self.rotary.cos_sin(&context_positions);
        let (block_cos, block_sin) = self.rotary.cos_sin(&block_positions);
        let blocks = in_order(block_embeddings.to_device(device).to_kind(dtype));
        SharedInputs {
            rope: RopeTables {
                context_cos,
                context_sin,
                block_cos,
                block_sin,
            },
            schedules,
            anchors,
            keep,
            order,
            blocks,
            block_size: bs,
        }
    }

    /// `hidden_norm(fc(features))`, the context every layer's keys and values are made from.
    fn context(&self, target_features: &Tensor) -> Tensor {
        let (dtype, device) = (self.dtype(), self.device());
        // No copy when the caller passes the features already on this device in this dtype, as
        // training and evaluation do (evaluation places each group's features once for all its
        // anchor chunks).
        self.hidden_norm.forward(
            &self
                .fc
                .forward(&target_features.to_device(device).to_kind(dtype)),
        )
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

/// [`Drafter::prepare`]'s result.
struct SharedInputs {
    rope: RopeTables,
    schedules: Vec<ChunkSchedule>,
    anchors: Tensor,
    keep: Tensor,
    /// The blocks' order for attention, when it is not the given one.
    order: Option<BlockOrder>,
    /// The block embeddings, in that order, in the drafter's dtype and on its device.
    blocks: Tensor,
    block_size: i64,
}

impl SharedInputs {
    fn layer_context<'a>(
        &'a self,
        context: &'a Tensor,
        backend: AttentionBackend,
    ) -> LayerContext<'a> {
        LayerContext {
            schedules: &self.schedules,
            context,
            rope: &self.rope,
            anchors: &self.anchors,
            keep: &self.keep,
            block_size: self.block_size,
            backend,
        }
    }

    /// `t` (`[B, N·bs, ...]`, blocks in attention order) with its blocks in the given order.
    fn in_given_order(&self, t: Tensor) -> Tensor {
        match &self.order {
            Some(order) => order.restore(&t),
            None => t,
        }
    }
}

/// Backpropagates `grad` (the gradient of the loss with respect to `output`) through
/// `output`'s graph, accumulating into the leaves' `.grad`: `d/d(output) Σ(output · grad)` is
/// exactly `grad` (tch has no `backward(gradient)`).
fn backpropagate(output: &Tensor, grad: &Tensor) {
    if output.requires_grad() {
        (output * grad.detach()).sum(Kind::Float).backward();
    }
}
