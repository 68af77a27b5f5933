//! Drafter inference for decoding (z-lab `dflash_generate`): a cache of each layer's context
//! keys and values, grown by the tap features of the tokens the target accepts, and one block
//! drafted at a time at the anchor right after them.
//!
//! The reference keeps the block's own keys and values in its cache during the call and crops
//! them away after it. Here they are never put in the cache: the cache holds context only, the
//! same state the reference's crop returns to.
use tch::{Kind, Tensor};

use super::layer::{LayerContext, RopeTables};
use super::model::Drafter;
use crate::model::attention::AttentionBackend;

/// Per drafter layer the context keys `[B, S, Hkv, D]` (normed, rotated at positions `0..S`)
/// and values, for `S` = the tokens whose tap features were given.
#[derive(Default)]
pub struct DrafterCache {
    layers: Vec<(Tensor, Tensor)>,
    len: i64,
}

impl DrafterCache {
    /// Context positions held: the anchor of the next block.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drafter {
    pub fn new_cache(&self) -> DrafterCache {
        DrafterCache::default()
    }

    /// Adds the target's tap features `[B, n, n_taps·Ht]` of the next `n` context positions
    /// (`cache.len()..cache.len()+n`): the tokens the target accepted since the last call.
    pub fn extend_context(&self, cache: &mut DrafterCache, features: &Tensor) {
        let size = features.size();
        assert!(
            size.len() == 3 && size[2] == self.config.feature_size(),
            "Drafter::extend_context: expected features [B, n, {}], got {size:?}",
            self.config.feature_size()
        );
        tch::no_grad(|| {
            let (dtype, device) = (self.dtype(), self.device());
            let context = self
                .hidden_norm
                .forward(&self.fc.forward(&features.to_device(device).to_kind(dtype)));
            let positions =
                Tensor::arange_start(cache.len, cache.len + size[1], (Kind::Int64, device))
                    .unsqueeze(0);
            let (cos, sin) = self.rotary.cos_sin(&positions);
            let fresh = cache.layers.is_empty();
            for (index, layer) in self.layers.iter().enumerate() {
                let (key, value) = layer.context_key_value(&context, &cos, &sin);
                if fresh {
                    cache.layers.push((key, value));
                } else {
                    let (old_key, old_value) = &cache.layers[index];
                    cache.layers[index] = (
                        Tensor::cat(&[old_key, &key], 1),
                        Tensor::cat(&[old_value, &value], 1),
                    );
                }
            }
            cache.len += size[1];
        });
    }

    /// The block at anchor `cache.len()`: `block_embeddings` `[B, bs, H]` (the target's
    /// embedding of `[last accepted token, MASK × (bs−1)]`) → final-normed `[B, bs, H]`, the
    /// same as [`Drafter::forward_block`] on all the context features given so far. Position
    /// `k ≥ 1` of the output, through the target's LM head, is the draft for anchor + k.
    pub fn draft_block(&self, cache: &DrafterCache, block_embeddings: &Tensor) -> Tensor {
        let cfg = &self.config;
        let bs = cfg.block_size;
        let size = block_embeddings.size();
        assert!(
            size.len() == 3 && size[1] == bs && size[2] == cfg.hidden_size,
            "Drafter::draft_block: expected block embeddings [B, {bs}, {}], got {size:?}",
            cfg.hidden_size
        );
        let (dtype, device) = (self.dtype(), self.device());
        tch::no_grad(|| {
            let batch = size[0];
            let anchor = cache.len;
            let anchors = Tensor::full([batch, 1], anchor, (Kind::Int64, device));
            let keep = Tensor::ones([batch, 1], (Kind::Bool, device));
            let positions =
                Tensor::arange_start(anchor, anchor + bs, (Kind::Int64, device)).unsqueeze(0);
            let (block_cos, block_sin) = self.rotary.cos_sin(&positions);
            // The context's own tables and tensor are read only by `DecoderLayer::forward`,
            // which computes the context keys; `forward_with_context` takes them cached.
            let unused = Tensor::zeros([batch, 0, cfg.hidden_size], (dtype, device));
            let rope = RopeTables {
                context_cos: unused.shallow_clone(),
                context_sin: unused.shallow_clone(),
                block_cos,
                block_sin,
            };
            let layer_context = LayerContext {
                schedules: &[],
                context: &unused,
                rope: &rope,
                anchors: &anchors,
                keep: &keep,
                block_size: bs,
                backend: AttentionBackend::DenseMask,
            };
            let empty_kv = || {
                let shape = [batch, 0, cfg.num_key_value_heads, cfg.head_dim];
                (
                    Tensor::zeros(shape, (dtype, device)),
                    Tensor::zeros(shape, (dtype, device)),
                )
            };
            let mut hidden = block_embeddings.to_device(device).to_kind(dtype);
            for (index, layer) in self.layers.iter().enumerate() {
                let (key, value) = match cache.layers.get(index) {
                    Some((k, v)) => (k.shallow_clone(), v.shallow_clone()),
                    None => empty_kv(),
                };
                hidden = layer.forward_with_context(&hidden, &key, &value, &layer_context);
            }
            self.norm.forward(&hidden)
        })
    }
}
