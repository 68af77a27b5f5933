//! DFlash drafter attention: block queries over injected context keys plus their own block.
//!
//! Two back-ends compute the same function of the same inputs:
//! - [`AttentionBackend::BlockSparse`] (training and evaluation): groups the blocks into
//!   chunks (sorted by anchor when there is more than one) and runs one fused attention per
//!   chunk over the context range the chunk can see plus the chunk's own block keys, masked by
//!   the rule. Memory is bounded by the chunk budget instead of the `[N·bs, S+N·bs]` grid;
//!   the schedule (order, chunks, masks) is shared by all layers of one rule ([`ChunkSchedule`]).
//! - [`AttentionBackend::DenseMask`]: the full mask built from the visibility rule and one
//!   softmax over all keys. Only for tests (the oracle) and single-block inference, where the
//!   grid is `[bs, anchor+bs]`.
//!
//! The visibility rule itself lives in [`visibility`] as pure functions.
mod block_sparse;
pub(crate) mod chunk_schedule;
mod dense;
pub mod shape_log;
pub mod visibility;

use tch::Tensor;

pub use block_sparse::{
    block_sparse_attention, block_sparse_attention_scheduled, BlockOrder, ChunkSchedule,
    GroupedHeads, ScheduledBlocks,
};
pub(crate) use chunk_schedule::chunk_costs;
pub use chunk_schedule::{
    context_key_quantum, max_distinct_chunk_shapes, DEFAULT_CHUNK_SCORE_ELEMENTS,
};
pub use dense::dense_mask_attention;
pub use visibility::LayerRule;

pub use dflash_shared::config::AttentionBackend;

/// Inputs of one attention call of one drafter layer. All tensors are post-projection,
/// post-`k_norm`/`q_norm` and post-RoPE, in the activation dtype.
///
/// Layouts (`Q = N·bs`): `query` `[B, Q, Hq, D]`; `context_key`/`context_value`
/// `[B, S, Hkv, D]`; `block_key`/`block_value` `[B, Q, Hkv, D]`; `anchors` `[B, N]` int64;
/// `keep` `[B, N]` bool. Query head `h` reads kv head `h / (Hq/Hkv)` (HF `repeat_kv`).
pub struct BlockAttentionInputs<'a> {
    pub query: &'a Tensor,
    pub context_key: &'a Tensor,
    pub context_value: &'a Tensor,
    pub block_key: &'a Tensor,
    pub block_value: &'a Tensor,
    pub anchors: &'a Tensor,
    pub keep: &'a Tensor,
    pub block_size: i64,
    pub rule: LayerRule,
    /// Multiplies `q·k` (Qwen3: `head_dim^-0.5`).
    pub scale: f64,
}

/// Dimensions shared by both back-ends, checked once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub batch: i64,
    pub num_blocks: i64,
    pub block_size: i64,
    pub context_len: i64,
    pub kv_heads: i64,
    pub group: i64,
    pub head_dim: i64,
}

impl BlockAttentionInputs<'_> {
    /// Shape contract of the call. The drafter builds these tensors itself, so a mismatch
    /// is a programming error, reported with every shape involved.
    pub(crate) fn dims(&self) -> Dims {
        let q = self.query.size();
        let ck = self.context_key.size();
        let bk = self.block_key.size();
        let a = self.anchors.size();
        let shapes = || {
            format!(
                "query {:?}, context_key {:?}, context_value {:?}, block_key {:?}, block_value {:?}, anchors {:?}, keep {:?}, block_size {}",
                q,
                ck,
                self.context_value.size(),
                bk,
                self.block_value.size(),
                a,
                self.keep.size(),
                self.block_size
            )
        };
        assert!(
            q.len() == 4 && ck.len() == 4 && bk.len() == 4 && a.len() == 2,
            "attention inputs have wrong ranks: {}",
            shapes()
        );
        let (batch, queries, heads, head_dim) = (q[0], q[1], q[2], q[3]);
        let num_blocks = a[1];
        let kv_heads = ck[2];
        let ok = self.block_size > 0
            && a[0] == batch
            && queries == num_blocks * self.block_size
            && self.keep.size() == a
            && ck[0] == batch
            && ck[3] == head_dim
            && self.context_value.size() == ck
            && bk == [batch, queries, kv_heads, head_dim]
            && self.block_value.size() == bk
            && kv_heads > 0
            && heads % kv_heads == 0;
        assert!(
            ok,
            "attention inputs have inconsistent shapes: {}",
            shapes()
        );
        Dims {
            batch,
            num_blocks,
            block_size: self.block_size,
            context_len: ck[1],
            kv_heads,
            group: heads / kv_heads,
            head_dim,
        }
    }
}

/// Runs one attention call with the chosen back-end. Returns `[B, Q, Hq, D]` in the query dtype.
pub fn block_attention(inputs: &BlockAttentionInputs<'_>, backend: AttentionBackend) -> Tensor {
    match backend {
        AttentionBackend::BlockSparse => {
            block_sparse_attention(inputs, DEFAULT_CHUNK_SCORE_ELEMENTS)
        }
        AttentionBackend::DenseMask => dense_mask_attention(inputs),
    }
}
