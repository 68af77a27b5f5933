//! Block-sparse DFlash attention, exactly equal to the dense rule.
//!
//! A query of block `blk` sees (i) a prefix-like range of the context and (ii) its own block.
//! The two key sets are disjoint, so softmax over their union is the LSE-weighted merge of
//! the two partial attentions:
//! 1. Blocks are sorted by anchor (a permutation restores the order at the end), so
//!    consecutive blocks need similar context ranges.
//! 2. Context part: sorted blocks are grouped into chunks whose `[B, heads, C·bs, L]` score
//!    grid stays under a budget; `L` is only the key range the chunk can see (up to its
//!    largest anchor; on sliding layers also from its smallest window start). The mask is
//!    built per chunk from the visibility rule, and the chunk runs through the fused SDPA
//!    kernel with a differentiable LSE ([`fused_attention_with_lse`]).
//! 3. Own-block part: one batched `[B·N, heads, bs, bs]` attention.
//! 4. Merge by log-sum-exp, restore block order.
//!
//! Memory kept for backward: per chunk its additive mask (`B·C·bs·L`, shared by all heads)
//! and O(Q) tensors; the own-block probabilities `B·Hq·Q·bs`. No `[Q, S+Q]` grid and no
//! per-head context probabilities exist at any time; the largest transient is one chunk's
//! fp32 scores (for the LSE value).
use tch::{Device, Kind, Tensor};

use super::softmax::{attention_with_lse, fused_attention_with_lse, merge_by_lse, HIDDEN_SCORE};
use super::visibility::{context_mask, own_block_mask, LayerRule};
use super::BlockAttentionInputs;

/// Default cap on one chunk's score grid (`B·Hq·C·bs·L` elements; 8 Mi fp32 = 32 MiB, of
/// which about three exist at once, only while the chunk runs). Large enough that per-chunk
/// kernel launches are few, small enough that the transients stay well below what the whole
/// attention keeps for backward.
pub const DEFAULT_CHUNK_SCORE_ELEMENTS: i64 = 1 << 23;

/// A run of sorted blocks `start..end` attending to context keys `keys.0..keys.1`
/// (`None`: none of them sees any context).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContextChunk {
    pub start: usize,
    pub end: usize,
    pub keys: Option<(i64, i64)>,
}

/// The key range `[lo, hi)` that covers every context key visible to the given blocks.
fn key_range<'a>(
    rule: LayerRule,
    context_len: i64,
    blocks: impl Iterator<Item = (&'a i64, &'a bool)>,
) -> Option<(i64, i64)> {
    let mut lo = i64::MAX;
    let mut hi = i64::MIN;
    for (&anchor, &keep) in blocks {
        if !keep {
            continue; // invalid blocks see no context
        }
        hi = hi.max(anchor.min(context_len));
        let first = match rule {
            LayerRule::Full => 0,
            // Query offset 0 has the earliest window start.
            LayerRule::Sliding { window } => anchor - (window - 1),
        };
        lo = lo.min(first.max(0));
    }
    (hi > lo).then_some((lo, hi))
}

/// Anchors and validity of the blocks after sorting, row-major `[batch, blocks]`.
pub(crate) struct SortedBlocks<'a> {
    pub anchors: &'a [i64],
    pub keep: &'a [bool],
    pub batch: usize,
    pub blocks: usize,
}

/// Greedy chunking of sorted blocks. `cost_per_key` is the score elements one block adds per
/// visible key (`batch·heads·bs`). A chunk grows while its score grid stays within `budget`
/// (a single block is always allowed, whatever its cost).
pub(crate) fn plan_context_chunks(
    rule: LayerRule,
    sorted: &SortedBlocks<'_>,
    context_len: i64,
    cost_per_key: i64,
    budget: i64,
) -> Vec<ContextChunk> {
    let SortedBlocks {
        anchors,
        keep,
        batch,
        blocks,
    } = *sorted;
    let column = move |start: usize, end: usize| {
        (0..batch).flat_map(move |b| (start..end).map(move |i| b * blocks + i))
    };
    let range_of = |start: usize, end: usize| {
        key_range(
            rule,
            context_len,
            column(start, end).map(|i| (&anchors[i], &keep[i])),
        )
    };
    let cost = |start: usize, end: usize, keys: Option<(i64, i64)>| {
        keys.map_or(0, |(lo, hi)| {
            (end - start) as i64 * cost_per_key * (hi - lo)
        })
    };
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < blocks {
        let mut end = start + 1;
        let mut keys = range_of(start, end);
        while end < blocks {
            let wider = range_of(start, end + 1);
            if cost(start, end + 1, wider) > budget {
                break;
            }
            end += 1;
            keys = wider;
        }
        chunks.push(ContextChunk { start, end, keys });
        start = end;
    }
    chunks
}

fn host_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).to_device(Device::Cpu).reshape([-1]))
        .expect("an int64 CPU tensor converts to Vec<i64>")
}

/// Block-sparse attention; `chunk_score_elements` caps one context chunk's score tensor.
/// Returns `[B, Q, Hq, D]` in the query dtype.
pub fn block_sparse_attention(
    inputs: &BlockAttentionInputs<'_>,
    chunk_score_elements: i64,
) -> Tensor {
    let d = inputs.dims();
    let (b, n, bs, hkv, g, dh) = (
        d.batch,
        d.num_blocks,
        d.block_size,
        d.kv_heads,
        d.group,
        d.head_dim,
    );
    let heads = hkv * g;
    let kind = inputs.query.kind();
    let device = inputs.query.device();
    if n == 0 || b == 0 {
        return Tensor::zeros([b, n * bs, heads, dh], (kind, device));
    }

    // Invalid blocks see no context; sorting them as anchor 0 puts them first, out of the way.
    let effective = inputs
        .anchors
        .where_self(inputs.keep, &inputs.anchors.zeros_like());
    let order = effective.argsort_stable(true, 1, false);
    let inverse = order.argsort_stable(true, 1, false);
    let anchors = inputs.anchors.gather(1, &order, false);
    let keep = inputs.keep.gather(1, &order, false);
    let sort_blocks = |t: &Tensor, per_block: i64| {
        t.reshape([b, n, per_block]).gather(
            1,
            &order.unsqueeze(-1).expand([b, n, per_block], false),
            false,
        )
    };
    let q = sort_blocks(inputs.query, bs * heads * dh).view([b, n, bs, hkv, g, dh]);
    let block_key = sort_blocks(inputs.block_key, bs * hkv * dh).view([b, n, bs, hkv, dh]);
    let block_value = sort_blocks(inputs.block_value, bs * hkv * dh).view([b, n, bs, hkv, dh]);

    // Own block: [B, N, Hkv, g, bs, D] against [B, N, Hkv, 1, bs, D].
    let (inner_out, inner_lse) = attention_with_lse(
        &q.permute([0, 1, 3, 4, 2, 5]),
        &block_key.permute([0, 1, 3, 2, 4]).unsqueeze(3),
        &block_value.permute([0, 1, 3, 2, 4]).unsqueeze(3),
        &own_block_mask(inputs.rule, bs, device),
        inputs.scale,
    );

    // Context, chunk by chunk of sorted blocks.
    let host_keep: Vec<bool> = host_i64(&keep).into_iter().map(|k| k != 0).collect();
    let host_anchors = host_i64(&anchors);
    let sorted = SortedBlocks {
        anchors: &host_anchors,
        keep: &host_keep,
        batch: b as usize,
        blocks: n as usize,
    };
    let plan = plan_context_chunks(
        inputs.rule,
        &sorted,
        d.context_len,
        b * heads * bs,
        chunk_score_elements,
    );
    // [B, Hq, S, D]: kv heads repeated to the query heads (HF `repeat_kv`), as the fused
    // kernel wants equal head counts.
    let context_key = inputs
        .context_key
        .transpose(1, 2)
        .repeat_interleave_self_int(g, 1, None);
    let context_value = inputs
        .context_value
        .transpose(1, 2)
        .repeat_interleave_self_int(g, 1, None);
    let mut outs = Vec::with_capacity(plan.len());
    let mut lses = Vec::with_capacity(plan.len());
    for chunk in &plan {
        let (start, count) = (chunk.start as i64, (chunk.end - chunk.start) as i64);
        let Some((lo, hi)) = chunk.keys else {
            // No context for any of these blocks: an empty part with weight exactly 0.
            outs.push(Tensor::zeros([b, count, hkv, g, bs, dh], (kind, device)));
            lses.push(Tensor::full(
                [b, count, hkv, g, bs],
                HIDDEN_SCORE,
                (Kind::Float, device),
            ));
            continue;
        };
        let len = hi - lo;
        let q_chunk = q
            .narrow(1, start, count)
            .permute([0, 3, 4, 1, 2, 5])
            .reshape([b, heads, count * bs, dh]);
        let visible = context_mask(
            inputs.rule,
            &anchors.narrow(1, start, count),
            &keep.narrow(1, start, count),
            bs,
            lo,
            hi,
        )
        .view([b, 1, count * bs, len]);
        let (out, lse) = fused_attention_with_lse(
            &q_chunk,
            &context_key.narrow(2, lo, len),
            &context_value.narrow(2, lo, len),
            &visible,
            inputs.scale,
        );
        outs.push(
            out.view([b, hkv, g, count, bs, dh])
                .permute([0, 3, 1, 2, 4, 5]),
        );
        lses.push(lse.view([b, hkv, g, count, bs]).permute([0, 3, 1, 2, 4]));
    }
    let context_out = Tensor::cat(&outs, 1);
    let context_lse = Tensor::cat(&lses, 1);

    let merged = merge_by_lse(&context_out, &context_lse, &inner_out, &inner_lse); // [B, N, Hkv, g, bs, D]
    let per_block = bs * heads * dh;
    let merged = merged
        .permute([0, 1, 4, 2, 3, 5])
        .reshape([b, n, per_block]);
    merged
        .gather(
            1,
            &inverse.unsqueeze(-1).expand([b, n, per_block], false),
            false,
        )
        .view([b, n * bs, heads, dh])
}

#[cfg(test)]
mod tests {
    use super::super::visibility::context_visible;
    use super::*;

    fn check_plan(
        rule: LayerRule,
        anchors: &[i64],
        keep: &[bool],
        batch: usize,
        s: i64,
        bs: i64,
        budget: i64,
    ) {
        let blocks = anchors.len() / batch;
        let sorted = SortedBlocks {
            anchors,
            keep,
            batch,
            blocks,
        };
        let plan = plan_context_chunks(rule, &sorted, s, batch as i64 * bs, budget);
        let mut next = 0;
        for chunk in &plan {
            assert_eq!(
                chunk.start, next,
                "chunks must tile the blocks in order: {plan:?}"
            );
            assert!(chunk.end > chunk.start);
            next = chunk.end;
            let (lo, hi) = chunk.keys.unwrap_or((0, 0));
            if chunk.end - chunk.start > 1 {
                let cost = (chunk.end - chunk.start) as i64 * batch as i64 * bs * (hi - lo);
                assert!(cost <= budget, "chunk {chunk:?} costs {cost} > {budget}");
            }
            for b in 0..batch {
                for i in chunk.start..chunk.end {
                    let (a, k) = (anchors[b * blocks + i], keep[b * blocks + i]);
                    for off in 0..bs {
                        for j in 0..s {
                            if context_visible(rule, a, k, off, j) {
                                assert!(
                                    lo <= j && j < hi,
                                    "{rule:?}: key {j} of block {i} outside {chunk:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(next, blocks);
    }

    #[test]
    fn chunks_tile_the_blocks_cover_every_visible_key_and_respect_the_budget() {
        let anchors = [0, 0, 2, 3, 3, 9, 14, 15, 1, 4, 4, 5, 8, 8, 12, 17];
        let keep = [
            false, true, true, true, true, true, true, false, true, true, true, true, false, true,
            true, true,
        ];
        for rule in [
            LayerRule::Full,
            LayerRule::Sliding { window: 1 },
            LayerRule::Sliding { window: 4 },
        ] {
            for budget in [0, 20, 64, 200, i64::MAX] {
                check_plan(rule, &anchors, &keep, 2, 18, 2, budget);
            }
        }
    }

    #[test]
    fn blocks_without_context_get_no_key_range() {
        let sorted = SortedBlocks {
            anchors: &[0, 0, 5],
            keep: &[true, false, true],
            batch: 1,
            blocks: 3,
        };
        let plan = plan_context_chunks(LayerRule::Full, &sorted, 10, 1, 0);
        // The two context-free blocks cost nothing and share a chunk; the third would not fit.
        assert_eq!(
            plan,
            [
                ContextChunk {
                    start: 0,
                    end: 2,
                    keys: None
                },
                ContextChunk {
                    start: 2,
                    end: 3,
                    keys: Some((0, 5))
                }
            ]
        );
        let one = SortedBlocks {
            anchors: &[5],
            keep: &[true],
            batch: 1,
            blocks: 1,
        };
        let window_one = plan_context_chunks(LayerRule::Sliding { window: 1 }, &one, 10, 1, 0);
        assert_eq!(window_one[0].keys, None);
    }
}
