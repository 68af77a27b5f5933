//! Block-sparse DFlash attention, exactly equal to the dense rule.
//!
//! A query of block `blk` sees (i) a prefix-like range of the context and (ii) its own block.
//! The blocks are grouped into chunks; each chunk is ONE fused attention call whose keys are
//! the context range its blocks can see followed by the chunk's own block keys:
//! `[context lo..hi | block_start .. block_end]`. Its additive mask hides what the rule hides
//! (including the other blocks of the chunk), so each query's softmax runs over exactly its
//! visible keys: no partial attentions, no log-sum-exp merge, and every row sees at least the
//! first key of its own block (never an empty row).
//!
//! 1. If all blocks fit one chunk (the common training shape on small configs), they are used
//!    in their given order. Otherwise they are sorted by anchor (a permutation restores the
//!    order at the end), so consecutive blocks need similar context ranges.
//! 2. Chunks grow while their `[B, heads, C·bs, L + C·bs]` score grid stays under a budget,
//!    and, once past a small size where call overhead dominates, only while the chunk's block
//!    keys (of which each query sees only its own `bs`) do not outnumber its context keys.
//! 3. The plan (order, chunks, additive masks) depends only on the anchors, the layer rule and
//!    the shapes, so the drafter builds it once per forward and rule and every layer shares it
//!    ([`BlockSparsePlan`]); the masks autograd keeps are then shared by the layers too.
//!
//! Memory kept for backward: per chunk its additive mask (`B·C·bs·(L + C·bs)`, shared by all
//! heads and layers), the chunk's key/value copy and O(Q) tensors. No `[Q, S+Q]` grid and no
//! per-head probabilities exist at any time: the fused kernel works in tiles.
use tch::{Device, Kind, Tensor};

use super::visibility::{context_mask, own_block_mask, LayerRule};
use super::BlockAttentionInputs;

/// Default cap on one chunk's score grid (`B·Hq·C·bs·(L + C·bs)` elements). The fused kernel
/// never materialises it; what scales with it is the chunk's mask (`1/Hq` of it) and key/value
/// copies, kept for backward.
pub const DEFAULT_CHUNK_SCORE_ELEMENTS: i64 = 1 << 23;

/// Modelled fixed cost of one more fused call (its key/value copies, mask slice, the context
/// gradient its slice scatters back, and a parallel region when there are threads), in score
/// elements. Measured on CPU (1 and 2 threads): 2^18 and 2^20 gave the same step times on the
/// tiny and medium bench configs within noise, and at 1024 anchors of 32 over 2048 context
/// keys (4 heads) 2^20 planned 65 chunks instead of 129, with 8% less memory; 2^22 slowed
/// the medium step.
pub(crate) const CHUNK_OVERHEAD_SCORE_ELEMENTS: i64 = 1 << 20;

/// A run of (sorted) blocks `start..end` attending to context keys `keys.0..keys.1`
/// (`None`: none of them sees any context) and to their own blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ContextChunk {
    pub start: usize,
    pub end: usize,
    pub keys: Option<(i64, i64)>,
}

/// The key range `[lo, hi)` that covers every context key visible to the given blocks: the
/// union of each block's own range (a block that sees no context adds nothing).
fn key_range<'a>(
    rule: LayerRule,
    context_len: i64,
    blocks: impl Iterator<Item = (&'a i64, &'a bool)>,
) -> Option<(i64, i64)> {
    blocks
        .filter_map(|(&anchor, &keep)| block_key_range(rule, context_len, anchor, keep))
        .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

/// The context keys one block sees, `[lo, hi)`, or `None`.
fn block_key_range(
    rule: LayerRule,
    context_len: i64,
    anchor: i64,
    keep: bool,
) -> Option<(i64, i64)> {
    if !keep {
        return None; // invalid blocks see no context
    }
    let hi = anchor.min(context_len);
    let lo = match rule {
        LayerRule::Full => 0,
        // Query offset 0 has the earliest window start.
        LayerRule::Sliding { window } => anchor - (window - 1),
    }
    .max(0);
    (hi > lo).then_some((lo, hi))
}

/// Anchors and validity of the blocks (in chunking order), row-major `[batch, blocks]`.
pub(crate) struct SortedBlocks<'a> {
    pub anchors: &'a [i64],
    pub keep: &'a [bool],
    pub batch: usize,
    pub blocks: usize,
}

/// Sizes and costs the chunk planner weighs, in score elements (`B·Hq·rows·keys`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkCosts {
    pub block_size: i64,
    /// Score elements one query row adds per key (`batch·heads`).
    pub per_row_key: i64,
    /// Cap on one chunk's score grid; a single block is always allowed, whatever its cost.
    pub budget: i64,
    /// Fixed cost of one more fused call (and its key copies, mask slice, output), expressed
    /// as the score elements that take as long.
    pub overhead: i64,
}

/// Chunking of blocks in the given order that minimises the modelled cost
/// `Σ_chunks (overhead + grid)` with every multi-block grid within the budget (dynamic
/// programming over chunk ends; a chunk only ever extends while its grid fits, so the work
/// is `O(blocks · blocks-per-chunk · batch)`). Returns the chunks and their total cost.
pub(crate) fn plan_context_chunks(
    rule: LayerRule,
    sorted: &SortedBlocks<'_>,
    context_len: i64,
    costs: ChunkCosts,
) -> (Vec<ContextChunk>, i64) {
    let SortedBlocks {
        anchors,
        keep,
        batch,
        blocks,
    } = *sorted;
    let column = |i: usize| (0..batch).map(move |b| b * blocks + i);
    // best[j]: cheapest cost of blocks 0..j; from[j]: start of the last chunk there.
    let mut best = vec![i64::MAX; blocks + 1];
    let mut from = vec![0usize; blocks + 1];
    best[0] = 0;
    for end in 1..=blocks {
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for start in (0..end).rev() {
            for i in column(start) {
                if let Some((l, h)) = block_key_range(rule, context_len, anchors[i], keep[i]) {
                    lo = lo.min(l);
                    hi = hi.max(h);
                }
            }
            let rows = (end - start) as i64 * costs.block_size;
            let context = if hi > lo { hi - lo } else { 0 };
            let grid = rows * costs.per_row_key * (context + rows);
            if end - start > 1 && grid > costs.budget {
                break; // wider chunks only cost more
            }
            let total = best[start].saturating_add(costs.overhead + grid);
            if total < best[end] {
                best[end] = total;
                from[end] = start;
            }
        }
    }
    let mut chunks = Vec::new();
    let mut end = blocks;
    while end > 0 {
        let start = from[end];
        let keys = key_range(
            rule,
            context_len,
            (start..end).flat_map(|i| column(i).map(|k| (&anchors[k], &keep[k]))),
        );
        chunks.push(ContextChunk { start, end, keys });
        end = start;
    }
    chunks.reverse();
    (chunks, best[blocks])
}

fn host_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).to_device(Device::Cpu).reshape([-1]))
        .expect("an int64 CPU tensor converts to Vec<i64>")
}

/// Per batch row, the stable order of the blocks by effective anchor (invalid blocks see no
/// context and count as anchor 0, which puts them first, out of the way). Row-major `[B, N]`.
fn sort_order(anchors: &[i64], keep: &[bool], batch: usize, blocks: usize) -> Vec<i64> {
    let mut order = Vec::with_capacity(batch * blocks);
    for b in 0..batch {
        let row = b * blocks;
        let mut idx: Vec<usize> = (0..blocks).collect();
        idx.sort_by_key(|&i| if keep[row + i] { anchors[row + i] } else { 0 });
        order.extend(idx.into_iter().map(|i| i as i64));
    }
    order
}

/// One chunk of a plan, ready to run: its blocks and the additive mask of its keys.
struct PlannedChunk {
    start: i64,
    count: i64,
    keys: Option<(i64, i64)>,
    /// `[B, 1, count·bs, L + count·bs]` in the activation dtype: 0 visible, `-inf` hidden.
    bias: Tensor,
}

/// Everything of a block-sparse attention call that depends only on the anchors, the layer
/// rule and the shapes: build it once per forward and rule, run it for every layer.
pub struct BlockSparsePlan {
    rule: LayerRule,
    block_size: i64,
    context_len: i64,
    batch: i64,
    blocks: i64,
    /// `[B, N]` sorting permutation and its inverse; `None` when blocks keep their order.
    order: Option<(Tensor, Tensor)>,
    chunks: Vec<PlannedChunk>,
}

/// Visibility of the keys `[context lo..hi | own blocks of the chunk]` for the chunk's blocks
/// `anchors`/`keep` `[B, C]`: `[B, C·bs, (hi-lo) + C·bs]` bool.
fn chunk_visibility(
    rule: LayerRule,
    anchors: &Tensor,
    keep: &Tensor,
    block_size: i64,
    keys: Option<(i64, i64)>,
) -> Tensor {
    let size = anchors.size();
    let (batch, count) = (size[0], size[1]);
    let device = anchors.device();
    let rows = count * block_size;
    let same_block = Tensor::eye(count, (Kind::Bool, device)).view([count, 1, count, 1]);
    let own = own_block_mask(rule, block_size, device).view([1, block_size, 1, block_size]);
    let blocks = same_block
        .logical_and(&own)
        .reshape([1, rows, rows])
        .expand([batch, rows, rows], false);
    match keys {
        Some((lo, hi)) => Tensor::cat(
            &[
                context_mask(rule, anchors, keep, block_size, lo, hi),
                blocks,
            ],
            -1,
        ),
        None => blocks,
    }
}

impl BlockSparsePlan {
    /// `anchors` `[B, N]` int64, `keep` `[B, N]` bool (any device; read to the host once);
    /// `heads` query heads (for the chunk cost); masks are built in `kind` on `device`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rule: LayerRule,
        anchors: &Tensor,
        keep: &Tensor,
        block_size: i64,
        context_len: i64,
        heads: i64,
        chunk_score_elements: i64,
        (kind, device): (Kind, Device),
    ) -> Self {
        let size = anchors.size();
        assert!(
            size.len() == 2 && keep.size() == size && block_size > 0,
            "BlockSparsePlan: anchors and keep must be [B, N] (got {size:?} and {:?}), block size > 0 (got {block_size})",
            keep.size()
        );
        let (batch, blocks) = (size[0], size[1]);
        let host_anchors = host_i64(anchors);
        let host_keep: Vec<bool> = host_i64(keep).into_iter().map(|k| k != 0).collect();
        let costs = ChunkCosts {
            block_size,
            per_row_key: batch * heads,
            budget: chunk_score_elements,
            overhead: CHUNK_OVERHEAD_SCORE_ELEMENTS,
        };
        let plan_of = |anchors: &[i64], keep: &[bool]| {
            let view = SortedBlocks {
                anchors,
                keep,
                batch: batch as usize,
                blocks: blocks as usize,
            };
            plan_context_chunks(rule, &view, context_len, costs)
        };
        // All blocks as one chunk, if that fits the budget: (chunk, cost).
        let plan_of_whole = |anchors: &[i64], keep: &[bool]| {
            let keys = key_range(rule, context_len, anchors.iter().zip(keep));
            let rows = blocks * block_size;
            let grid = rows * costs.per_row_key * (keys.map_or(0, |(lo, hi)| hi - lo) + rows);
            (blocks <= 1 || grid <= costs.budget).then(|| {
                (
                    ContextChunk {
                        start: 0,
                        end: blocks as usize,
                        keys,
                    },
                    grid + costs.overhead,
                )
            })
        };
        // Plan on the anchor-sorted blocks; if one chunk of all blocks is as cheap (it needs no
        // sorting gathers, worth one more call), keep the given order instead.
        let host_order = sort_order(&host_anchors, &host_keep, batch as usize, blocks as usize);
        let row = |b: usize, i: i64| b * blocks as usize + i as usize;
        let sorted_index = |b: usize, j: usize| row(b, host_order[row(b, j as i64)]);
        let all = || (0..batch as usize).flat_map(|b| (0..blocks as usize).map(move |j| (b, j)));
        let sorted_anchors: Vec<i64> = all()
            .map(|(b, j)| host_anchors[sorted_index(b, j)])
            .collect();
        let sorted_keep: Vec<bool> = all().map(|(b, j)| host_keep[sorted_index(b, j)]).collect();
        let (sorted_chunks, sorted_cost) = plan_of(&sorted_anchors, &sorted_keep);
        let whole = plan_of_whole(&host_anchors, &host_keep);
        let (chunks, order, chunk_anchors, chunk_keep) = match whole {
            Some((one, cost)) if cost <= sorted_cost + costs.overhead => (
                vec![one],
                None,
                anchors.to_device(device).to_kind(Kind::Int64),
                keep.to_device(device).to_kind(Kind::Bool),
            ),
            _ => {
                let to_device = |t: Tensor| t.view([batch, blocks]).to_device(device);
                let order_t = to_device(Tensor::from_slice(&host_order));
                let inverse = order_t.argsort_stable(true, 1, false);
                (
                    sorted_chunks,
                    Some((order_t, inverse)),
                    to_device(Tensor::from_slice(&sorted_anchors)),
                    to_device(Tensor::from_slice(&sorted_keep)),
                )
            }
        };
        let chunks = chunks
            .into_iter()
            .map(|chunk| {
                let (start, count) = (chunk.start as i64, (chunk.end - chunk.start) as i64);
                let visible = chunk_visibility(
                    rule,
                    &chunk_anchors.narrow(1, start, count),
                    &chunk_keep.narrow(1, start, count),
                    block_size,
                    chunk.keys,
                );
                let keys = visible.size()[2];
                let bias = Tensor::zeros(visible.size(), (kind, device))
                    .masked_fill(&visible.logical_not(), f64::NEG_INFINITY)
                    .view([batch, 1, count * block_size, keys]);
                PlannedChunk {
                    start,
                    count,
                    keys: chunk.keys,
                    bias,
                }
            })
            .collect();
        Self {
            rule,
            block_size,
            context_len,
            batch,
            blocks,
            order,
            chunks,
        }
    }

    /// Number of fused attention calls per use (for diagnostics and tests).
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    pub fn rule(&self) -> LayerRule {
        self.rule
    }
}

/// `[B, T, Hkv, D]` keys or values as the `[B, H, T, D]` the kernel reads. On CPU the fused
/// kernel handles grouped heads itself (`enable_gqa`); elsewhere kv head `j` is repeated for
/// query heads `j·g .. j·g+g-1` (HF `repeat_kv`), as not every fused CUDA kernel takes GQA.
fn kernel_heads(t: &Tensor, group: i64, native_gqa: bool) -> Tensor {
    let t = t.transpose(1, 2);
    if group == 1 || native_gqa {
        t
    } else {
        t.repeat_interleave_self_int(group, 1, None)
    }
}

/// Block-sparse attention; `chunk_score_elements` caps one chunk's score grid. Builds a plan
/// for this one call; the drafter shares one plan between its layers instead
/// ([`block_sparse_attention_planned`]). Returns `[B, Q, Hq, D]` in the query dtype.
pub fn block_sparse_attention(
    inputs: &BlockAttentionInputs<'_>,
    chunk_score_elements: i64,
) -> Tensor {
    let d = inputs.dims();
    let plan = BlockSparsePlan::new(
        inputs.rule,
        inputs.anchors,
        inputs.keep,
        d.block_size,
        d.context_len,
        d.kv_heads * d.group,
        chunk_score_elements,
        (inputs.query.kind(), inputs.query.device()),
    );
    block_sparse_attention_planned(inputs, &plan)
}

/// Block-sparse attention with a prepared plan. The plan must have been built for the same
/// anchors, keep, rule and shapes (checked for the shapes and the rule).
pub fn block_sparse_attention_planned(
    inputs: &BlockAttentionInputs<'_>,
    plan: &BlockSparsePlan,
) -> Tensor {
    let d = inputs.dims();
    let (b, n, bs, g) = (d.batch, d.num_blocks, d.block_size, d.group);
    assert!(
        plan.rule == inputs.rule
            && plan.batch == b
            && plan.blocks == n
            && plan.block_size == bs
            && plan.context_len == d.context_len,
        "block-sparse plan for {:?}, batch {}, {} blocks of {}, context {} used for {:?}, batch {b}, {n} blocks of {bs}, context {}",
        plan.rule,
        plan.batch,
        plan.blocks,
        plan.block_size,
        plan.context_len,
        inputs.rule,
        d.context_len
    );
    let heads = d.kv_heads * g;
    let device = inputs.query.device();
    if n == 0 || b == 0 {
        return Tensor::zeros(
            [b, n * bs, heads, d.head_dim],
            (inputs.query.kind(), device),
        );
    }
    let sort_blocks = |t: &Tensor| match &plan.order {
        None => t.shallow_clone(),
        Some((order, _)) => {
            let per_block = t.numel() as i64 / (b * n);
            let size = t.size();
            t.reshape([b, n, per_block])
                .gather(
                    1,
                    &order.unsqueeze(-1).expand([b, n, per_block], false),
                    false,
                )
                .view(size.as_slice())
        }
    };
    let (q, block_key, block_value) = (
        sort_blocks(inputs.query),
        sort_blocks(inputs.block_key),
        sort_blocks(inputs.block_value),
    );
    let native_gqa = device == Device::Cpu;
    let keys_of = |context: &Tensor, block: &Tensor, chunk: &PlannedChunk| {
        let own = block.narrow(1, chunk.start * bs, chunk.count * bs);
        let all = match chunk.keys {
            Some((lo, hi)) => Tensor::cat(&[&context.narrow(1, lo, hi - lo), &own], 1),
            None => own,
        };
        kernel_heads(&all, g, native_gqa)
    };
    let mut outs: Vec<Tensor> = plan
        .chunks
        .iter()
        .map(|chunk| {
            let q_chunk = q
                .narrow(1, chunk.start * bs, chunk.count * bs)
                .transpose(1, 2);
            let out = Tensor::scaled_dot_product_attention(
                &q_chunk,
                &keys_of(inputs.context_key, &block_key, chunk),
                &keys_of(inputs.context_value, &block_value, chunk),
                Some(&chunk.bias),
                0.0,
                false,
                inputs.scale,
                native_gqa && g > 1,
            );
            out.transpose(1, 2) // [B, C·bs, Hq, D]
        })
        .collect();
    let out = if outs.len() == 1 {
        outs.pop().expect("one chunk")
    } else {
        Tensor::cat(&outs, 1)
    };
    match &plan.order {
        None => out,
        Some((_, inverse)) => {
            let per_block = bs * heads * d.head_dim;
            out.reshape([b, n, per_block])
                .gather(
                    1,
                    &inverse.unsqueeze(-1).expand([b, n, per_block], false),
                    false,
                )
                .view([b, n * bs, heads, d.head_dim])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::visibility::context_visible;
    use super::*;

    fn costs(batch: usize, bs: i64, budget: i64, overhead: i64) -> ChunkCosts {
        ChunkCosts {
            block_size: bs,
            per_row_key: batch as i64,
            budget,
            overhead,
        }
    }

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
        let (plan, _) = plan_context_chunks(rule, &sorted, s, costs(batch, bs, budget, 50));
        let mut next = 0;
        for chunk in &plan {
            assert_eq!(
                chunk.start, next,
                "chunks must tile the blocks in order: {plan:?}"
            );
            assert!(chunk.end > chunk.start);
            next = chunk.end;
            let (lo, hi) = chunk.keys.unwrap_or((0, 0));
            let count = (chunk.end - chunk.start) as i64;
            if count > 1 {
                let cost = count * bs * batch as i64 * ((hi - lo) + count * bs);
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
            for budget in [0, 20, 64, 200, 1000, 1 << 40] {
                check_plan(rule, &anchors, &keep, 2, 18, 2, budget);
            }
        }
    }

    #[test]
    fn the_plan_trades_call_overhead_against_masked_keys() {
        // 16 blocks of 8 at anchors up to 75: one chunk wastes 120 block keys per query.
        let anchors: Vec<i64> = (0..16).map(|i| 5 * i).collect();
        let keep = vec![true; 16];
        let sorted = SortedBlocks {
            anchors: &anchors,
            keep: &keep,
            batch: 1,
            blocks: 16,
        };
        let whole = 128 * (75 + 128);
        let plan = |overhead| {
            plan_context_chunks(LayerRule::Full, &sorted, 76, costs(1, 8, 1 << 23, overhead))
        };
        // Calls that cost more than the whole grid: one chunk.
        let (one, cost) = plan(1 << 20);
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(cost, whole + (1 << 20));
        // Free calls: one chunk per block (each sees only its own context and block).
        let (many, cost) = plan(0);
        assert_eq!(many.len(), 16, "{many:?}");
        let per_block: i64 = anchors.iter().map(|a| 8 * (a + 8)).sum();
        assert_eq!(cost, per_block);
        // In between: several chunks, cheaper than either extreme under that overhead.
        let (some, cost) = plan(2000);
        assert!(some.len() > 1 && some.len() < 16, "{some:?}");
        assert!(cost < whole + 2000 && cost < per_block + 16 * 2000);
    }

    #[test]
    fn blocks_without_context_get_no_key_range() {
        let sorted = SortedBlocks {
            anchors: &[0, 0, 5],
            keep: &[true, false, true],
            batch: 1,
            blocks: 3,
        };
        let (plan, _) = plan_context_chunks(LayerRule::Full, &sorted, 10, costs(1, 1, 4, 1 << 40));
        // The two context-free blocks cost 1 and 2 (their own keys); the third would not fit.
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
        let (window_one, _) = plan_context_chunks(
            LayerRule::Sliding { window: 1 },
            &one,
            10,
            costs(1, 1, 0, 0),
        );
        assert_eq!(window_one[0].keys, None);
    }

    #[test]
    fn sort_order_is_stable_per_row_and_puts_invalid_blocks_first() {
        let anchors = [7, 3, 3, 9, 2, 8, 1, 5];
        let keep = [true, true, true, false, true, true, true, true];
        assert_eq!(sort_order(&anchors, &keep, 2, 4), [3, 1, 2, 0, 2, 0, 3, 1]);
    }
}
