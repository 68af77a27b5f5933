//! The dense-mask oracle: every query against every key `[context | all blocks]`, masked by
//! the full grid from [`visibility::dense_mask`], through libtorch's fused
//! `scaled_dot_product_attention`. It shares nothing with the block-sparse path but the
//! visibility rule (tested on its own against a brute-force loop), so agreement between the
//! two means something; and it is the strongest dense baseline libtorch offers (the fused
//! kernel never holds the `[Q, S+Q]` scores, only the mask), which keeps the memory and time
//! comparison honest.
use tch::Tensor;

use super::visibility::dense_mask;
use super::BlockAttentionInputs;

/// Returns `[B, Q, Hq, D]`. Memory is `O(B·Q·(S+Q))` for the mask: tests and single-block
/// inference only (where the grid is `[bs, anchor+bs]`).
pub fn dense_mask_attention(inputs: &BlockAttentionInputs<'_>) -> Tensor {
    let d = inputs.dims();
    let queries = d.num_blocks * d.block_size;
    let keys = d.context_len + queries;
    let visible = dense_mask(
        inputs.rule,
        inputs.anchors,
        inputs.keep,
        d.block_size,
        d.context_len,
    )
    .view([d.batch, 1, queries, keys]);
    let q = inputs.query.transpose(1, 2); // [B, Hq, Q, D]
                                          // kv head j serves query heads j·g .. j·g+g-1 (HF `repeat_kv`). Repeating explicitly keeps
                                          // SDPA on its fused kernels, which not every back-end offers with `enable_gqa`.
    let to_heads = |context: &Tensor, block: &Tensor| {
        Tensor::cat(&[context, block], 1)
            .transpose(1, 2)
            .repeat_interleave_self_int(d.group, 1, None)
    };
    let k = to_heads(inputs.context_key, inputs.block_key);
    let v = to_heads(inputs.context_value, inputs.block_value);
    let out = Tensor::scaled_dot_product_attention(
        &q,
        &k,
        &v,
        Some(&visible),
        0.0,
        false,
        inputs.scale,
        false,
    );
    out.transpose(1, 2) // [B, Q, Hq, D]
}
