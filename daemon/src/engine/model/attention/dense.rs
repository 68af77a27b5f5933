//! The dense-mask oracle: every query against every key `[context | all blocks]`, masked by
//! the full grid from [`visibility::dense_mask`]. Plain softmax with `-inf`, no chunking, no
//! LSE: as little shared machinery with the block-sparse path as possible, so that agreement
//! between the two means something.
use tch::{Kind, Tensor};

use super::visibility::dense_mask;
use super::BlockAttentionInputs;

/// Returns `[B, Q, Hq, D]`. Memory is `O(B·Hq·Q·(S+Q))`: tests and single-block inference only.
pub fn dense_mask_attention(inputs: &BlockAttentionInputs<'_>) -> Tensor {
    let d = inputs.dims();
    let queries = d.num_blocks * d.block_size;
    let keys = d.context_len + queries;
    let mask = dense_mask(inputs.rule, inputs.anchors, inputs.keep, d.block_size, d.context_len);
    // [B, Q, Hq, D] -> [B, Hkv, g, Q, D]; kv head j serves query heads j·g .. j·g+g-1.
    let q = inputs
        .query
        .view([d.batch, queries, d.kv_heads, d.group, d.head_dim])
        .permute([0, 2, 3, 1, 4]);
    let to_heads = |context: &Tensor, block: &Tensor| {
        Tensor::cat(&[context, block], 1).permute([0, 2, 1, 3]).unsqueeze(2) // [B, Hkv, 1, S+Q, D]
    };
    let k = to_heads(inputs.context_key, inputs.block_key);
    let v = to_heads(inputs.context_value, inputs.block_value);
    let scores = q.matmul(&k.transpose(-2, -1)).to_kind(Kind::Float) * inputs.scale;
    let hidden = mask.logical_not().view([d.batch, 1, 1, queries, keys]);
    let probs = scores.masked_fill(&hidden, f64::NEG_INFINITY).softmax(-1, Kind::Float);
    let out = probs.to_kind(inputs.query.kind()).matmul(&v); // [B, Hkv, g, Q, D]
    out.permute([0, 3, 1, 2, 4]).reshape([d.batch, queries, d.kv_heads * d.group, d.head_dim])
}
