//! The chunking of block-sparse attention (see [`super::block_sparse`]): which blocks share one
//! fused call and which context keys that call needs. Pure functions of the anchors, the
//! validity flags, the layer rule and the sizes.
use super::visibility::LayerRule;

/// Default cap on one chunk's score grid (`B·Hq·C·bs·(L + C·bs)` elements). The fused kernel
/// never materialises it; what scales with it is the chunk's mask (`1/Hq` of it) and key/value
/// copies, kept for backward.
pub const DEFAULT_CHUNK_SCORE_ELEMENTS: i64 = 1 << 23;

/// Modelled fixed cost of one more fused call (its key/value copies, mask slice, the context
/// gradient its slice scatters back, and a parallel region when there are threads), in score
/// elements. The largest value that did not slow a step: it halves the chunk count of the
/// training shape against a smaller one and saves memory, where a larger one slowed the medium
/// bench step (docs/BENCHMARKS.md#chunk-schedule-the-cost-of-one-more-fused-call).
pub(crate) const CHUNK_OVERHEAD_SCORE_ELEMENTS: i64 = 1 << 20;

/// Context key ranges of a chunk are widened to a multiple of this many keys (masked), so a
/// step's fused calls come from a small set of key counts (piece 4 of issue 11: every new shape
/// is a new kernel plan and allocation size on CUDA). `8·bs`: at block 32 that is 256 keys,
/// about 6 % more keys on the real structure's ~2K-key sliding chunks, and with `bs` a multiple
/// of 16 every call's key count is too (the memory-efficient CUDA kernel pads its bias to that
/// alignment otherwise, and keeps the padded copy for backward).
pub fn context_key_quantum(block_size: i64) -> i64 {
    8 * block_size.max(1)
}

/// What the chunk scheduler weighs, for a schedule of `batch` rows and `heads` query heads: one
/// home for the engine (`ChunkSchedule::new`) and the memory model (`crate::plan`).
pub(crate) fn chunk_costs(block_size: i64, batch: i64, heads: i64, budget: i64) -> ChunkCosts {
    ChunkCosts {
        block_size,
        per_row_key: batch * heads,
        budget,
        overhead: CHUNK_OVERHEAD_SCORE_ELEMENTS,
        key_quantum: context_key_quantum(block_size),
    }
}

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
pub(crate) fn key_range<'a>(
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

/// Whether a chunk may hold `blocks` blocks: 1, 2, 3, 4, 6, 8, 12, 16, ... (`2^k` and
/// `3·2^k`). Why: every distinct (rows, keys) shape of a fused call is a new kernel plan and
/// a new allocation size on CUDA, so the rows of a chunk come from this small set (at most
/// `2·log2(N) + 1` sizes up to `N` blocks) rather than any count. Restricting the scheduler's
/// choice changes which tiling it picks, never the result (any tiling is exact); the set's
/// ratio of at most 1.5 between neighbours keeps the cost close to the unrestricted optimum.
pub(crate) fn chunk_blocks_allowed(blocks: usize) -> bool {
    let odd = blocks >> blocks.trailing_zeros();
    blocks > 0 && (odd == 1 || odd == 3)
}

/// The context key range `[lo, hi)` widened to a bucketed length: the length rounded up to a
/// multiple of `quantum`, capped at `context_len`, the range moved left where it would pass
/// the end of the context. The added keys are real context positions the mask hides, so the
/// call's result is unchanged; what is bounded is the set of key counts (`0`, the multiples of
/// `quantum` below `context_len`, and `context_len` itself).
pub(crate) fn padded_key_range(
    keys: Option<(i64, i64)>,
    context_len: i64,
    quantum: i64,
) -> Option<(i64, i64)> {
    let (lo, hi) = keys?;
    let quantum = quantum.max(1);
    let len = ((hi - lo + quantum - 1) / quantum * quantum).min(context_len);
    let hi = (lo + len).min(context_len);
    Some((hi - len, hi))
}

/// The most distinct (rows, keys) shapes the fused calls of any number of steps can have, over
/// all layer rules, for `blocks` blocks of `block_size` per row (the anchor count; fixed when it
/// is padded to `num_anchors`), `batch_heads` = batch × query heads, the default chunk budget
/// and the distinct context lengths `context_lens` the steps use. A chunk holds `c` blocks,
/// `c` allowed ([`chunk_blocks_allowed`]) or `blocks` itself (the schedule that keeps every block
/// in one chunk), so `rows = c·bs`; its context key count is `0`, a multiple of the quantum
/// ([`context_key_quantum`]) below the longest context, or one of the
/// context lengths; `keys = context + rows`; and a chunk of more than one block stays within
/// the budget. This counts those (rows, keys) pairs. It is the bound the shape-observer test
/// holds the engine to ([`super::shape_log`]).
pub fn max_distinct_chunk_shapes(
    blocks: usize,
    block_size: i64,
    batch_heads: i64,
    context_lens: &[i64],
) -> usize {
    let quantum = context_key_quantum(block_size);
    let longest = context_lens.iter().copied().max().unwrap_or(0);
    let mut contexts: Vec<i64> = std::iter::once(0)
        .chain((1..).map(|m| m * quantum).take_while(|&k| k < longest))
        .chain(context_lens.iter().copied())
        .collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut counts: Vec<usize> = (1..=blocks).filter(|&c| chunk_blocks_allowed(c)).collect();
    counts.push(blocks);
    counts.dedup();
    let budget = DEFAULT_CHUNK_SCORE_ELEMENTS;
    let mut shapes = std::collections::BTreeSet::new();
    for &c in &counts {
        let rows = c as i64 * block_size;
        for &context in &contexts {
            if c <= 1 || rows * batch_heads * (context + rows) <= budget {
                shapes.insert((rows, context + rows));
            }
        }
    }
    shapes.len()
}

/// Sizes and costs the chunk scheduler weighs, in score elements (`B·Hq·rows·keys`).
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
    /// Context key ranges are widened to a multiple of this ([`padded_key_range`]); 1 keeps
    /// them exact.
    pub key_quantum: i64,
}

/// Chunking of blocks in the given order that minimises the modelled cost
/// `Σ_chunks (overhead + grid)` with every multi-block grid within the budget (dynamic
/// programming over chunk ends; a chunk only ever extends while its grid fits, so the work
/// is `O(blocks · blocks-per-chunk · batch)`). Returns the chunks and their total cost.
pub(crate) fn schedule_context_chunks(
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
            let context = padded_key_range(
                (hi > lo).then_some((lo, hi)),
                context_len,
                costs.key_quantum,
            )
            .map_or(0, |(l, h)| h - l);
            let grid = rows * costs.per_row_key * (context + rows);
            if end - start > 1 && grid > costs.budget {
                break; // wider chunks only cost more
            }
            if !chunk_blocks_allowed(end - start) {
                continue;
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
        let keys = padded_key_range(
            key_range(
                rule,
                context_len,
                (start..end).flat_map(|i| column(i).map(|k| (&anchors[k], &keep[k]))),
            ),
            context_len,
            costs.key_quantum,
        );
        chunks.push(ContextChunk { start, end, keys });
        end = start;
    }
    chunks.reverse();
    (chunks, best[blocks])
}

/// The blocks sorted by anchor, as a schedule that chunks them in that order runs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SortedLayout {
    /// Row-major `[batch, blocks]` permutation ([`sort_order`]).
    pub order: Vec<i64>,
    pub anchors: Vec<i64>,
    pub keep: Vec<bool>,
}

/// The chunks of one block-sparse call, and the order they run the blocks in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChunkChoice {
    pub chunks: Vec<ContextChunk>,
    /// `None`: the blocks keep their given order (one chunk of all of them).
    pub sorted: Option<SortedLayout>,
}

/// What [`super::block_sparse::ChunkSchedule::new`] runs: the cheapest chunking of the
/// anchor-sorted blocks, unless one chunk of all blocks in their given order is as cheap (it
/// needs no sorting gathers, worth one more call). `anchors`/`keep` row-major `[batch,
/// blocks]`. Pure, so the memory model (`crate::plan`) schedules exactly what the engine runs.
pub(crate) fn choose_chunks(
    rule: LayerRule,
    anchors: &[i64],
    keep: &[bool],
    (batch, blocks): (usize, usize),
    context_len: i64,
    costs: ChunkCosts,
) -> ChunkChoice {
    let order = sort_order(anchors, keep, batch, blocks);
    let sorted_index = |k: usize| (k / blocks.max(1)) * blocks + order[k] as usize;
    let sorted_anchors: Vec<i64> = (0..batch * blocks)
        .map(|k| anchors[sorted_index(k)])
        .collect();
    let sorted_keep: Vec<bool> = (0..batch * blocks).map(|k| keep[sorted_index(k)]).collect();
    let view = SortedBlocks {
        anchors: &sorted_anchors,
        keep: &sorted_keep,
        batch,
        blocks,
    };
    let (sorted_chunks, sorted_cost) = schedule_context_chunks(rule, &view, context_len, costs);
    // All blocks as one chunk, if that fits the budget.
    let keys = padded_key_range(
        key_range(rule, context_len, anchors.iter().zip(keep)),
        context_len,
        costs.key_quantum,
    );
    let rows = blocks as i64 * costs.block_size;
    let grid = rows * costs.per_row_key * (keys.map_or(0, |(lo, hi)| hi - lo) + rows);
    if (blocks <= 1 || grid <= costs.budget)
        && grid + costs.overhead <= sorted_cost + costs.overhead
    {
        return ChunkChoice {
            chunks: vec![ContextChunk {
                start: 0,
                end: blocks,
                keys,
            }],
            sorted: None,
        };
    }
    ChunkChoice {
        chunks: sorted_chunks,
        sorted: Some(SortedLayout {
            order,
            anchors: sorted_anchors,
            keep: sorted_keep,
        }),
    }
}

/// Per batch row, the stable order of the blocks by effective anchor (invalid blocks see no
/// context and count as anchor 0, which puts them first, out of the way). Row-major `[B, N]`.
pub(crate) fn sort_order(anchors: &[i64], keep: &[bool], batch: usize, blocks: usize) -> Vec<i64> {
    let mut order = Vec::with_capacity(batch * blocks);
    for b in 0..batch {
        let row = b * blocks;
        let mut idx: Vec<usize> = (0..blocks).collect();
        idx.sort_by_key(|&i| if keep[row + i] { anchors[row + i] } else { 0 });
        order.extend(idx.into_iter().map(|i| i as i64));
    }
    order
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
            key_quantum: 1,
        }
    }

    fn check_schedule(
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
        let (schedule, _) = schedule_context_chunks(rule, &sorted, s, costs(batch, bs, budget, 50));
        let mut next = 0;
        for chunk in &schedule {
            assert_eq!(
                chunk.start, next,
                "chunks must tile the blocks in order: {schedule:?}"
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
                check_schedule(rule, &anchors, &keep, 2, 18, 2, budget);
            }
        }
    }

    #[test]
    fn the_schedule_trades_call_overhead_against_masked_keys() {
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
        let schedule = |overhead| {
            schedule_context_chunks(LayerRule::Full, &sorted, 76, costs(1, 8, 1 << 23, overhead))
        };
        // Calls that cost more than the whole grid: one chunk.
        let (one, cost) = schedule(1 << 20);
        assert_eq!(one.len(), 1, "{one:?}");
        assert_eq!(cost, whole + (1 << 20));
        // Free calls: one chunk per block (each sees only its own context and block).
        let (many, cost) = schedule(0);
        assert_eq!(many.len(), 16, "{many:?}");
        let per_block: i64 = anchors.iter().map(|a| 8 * (a + 8)).sum();
        assert_eq!(cost, per_block);
        // In between: several chunks, cheaper than either extreme under that overhead.
        let (some, cost) = schedule(2000);
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
        let (schedule, _) =
            schedule_context_chunks(LayerRule::Full, &sorted, 10, costs(1, 1, 4, 1 << 40));
        // The two context-free blocks cost 1 and 2 (their own keys); the third would not fit.
        assert_eq!(
            schedule,
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
        let (window_one, _) = schedule_context_chunks(
            LayerRule::Sliding { window: 1 },
            &one,
            10,
            costs(1, 1, 0, 0),
        );
        assert_eq!(window_one[0].keys, None);
    }

    #[test]
    fn chunks_hold_2_to_the_k_or_3_times_2_to_the_k_blocks() {
        let allowed: Vec<usize> = (0..=50).filter(|&n| chunk_blocks_allowed(n)).collect();
        assert_eq!(allowed, [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]);
    }

    #[test]
    fn key_ranges_widen_to_the_quantum_inside_the_context() {
        assert_eq!(padded_key_range(None, 100, 8), None);
        assert_eq!(padded_key_range(Some((3, 10)), 100, 8), Some((3, 11)));
        assert_eq!(padded_key_range(Some((3, 11)), 100, 8), Some((3, 11)));
        // Past the end of the context: the range moves left.
        assert_eq!(padded_key_range(Some((95, 99)), 100, 8), Some((92, 100)));
        // Longer than the context rounds to: the whole context.
        assert_eq!(padded_key_range(Some((0, 70)), 76, 64), Some((0, 76)));
        assert_eq!(padded_key_range(Some((5, 9)), 100, 1), Some((5, 9)));
    }

    /// A small deterministic generator, so the anchor draws below need no crate.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn bucketed_schedules_stay_exact_and_use_a_bounded_set_of_shapes() {
        // The visibility, tiling and budget checks hold with widened key ranges too.
        let anchors = [0, 0, 2, 3, 3, 9, 14, 15, 1, 4, 4, 5, 8, 8, 12, 17];
        let keep = [true; 16];
        for rule in [LayerRule::Full, LayerRule::Sliding { window: 4 }] {
            for quantum in [4, 16] {
                let (batch, blocks) = (2, 8);
                let sorted = SortedBlocks {
                    anchors: &anchors,
                    keep: &keep,
                    batch,
                    blocks,
                };
                let c = ChunkCosts {
                    key_quantum: quantum,
                    ..costs(batch, 2, 200, 50)
                };
                let (schedule, _) = schedule_context_chunks(rule, &sorted, 18, c);
                for chunk in &schedule {
                    assert!(
                        chunk_blocks_allowed(chunk.end - chunk.start),
                        "{schedule:?}"
                    );
                    if let Some((lo, hi)) = chunk.keys {
                        assert!(0 <= lo && hi <= 18);
                        assert!((hi - lo) % quantum == 0 || hi - lo == 18, "{chunk:?}");
                    }
                }
            }
        }
        // Many random draws at the real drafter's attention shape (1024 anchors of 32 over up
        // to 4096 context keys, 32 query heads) never leave the stated bound.
        let (blocks, bs, heads) = (1024usize, 32i64, 32i64);
        let mut seen = std::collections::BTreeSet::new();
        let mut state = 7u64;
        let lens = [2048i64, 3072, 4096];
        for draw in 0..6 {
            let s = lens[draw % lens.len()];
            let mut a: Vec<i64> = (0..blocks).map(|_| (lcg(&mut state) as i64) % s).collect();
            a.sort_unstable();
            let k: Vec<bool> = (0..blocks).map(|i| i % 7 != 0).collect();
            for rule in [LayerRule::Full, LayerRule::Sliding { window: 2048 }] {
                let c = super::chunk_costs(bs, 1, heads, super::DEFAULT_CHUNK_SCORE_ELEMENTS);
                let choice = choose_chunks(rule, &a, &k, (1, blocks), s, c);
                for chunk in &choice.chunks {
                    let rows = (chunk.end - chunk.start) as i64 * bs;
                    let keys = chunk.keys.map_or(0, |(lo, hi)| hi - lo) + rows;
                    seen.insert((rows, keys));
                }
            }
        }
        let bound = max_distinct_chunk_shapes(blocks, bs, heads, &lens);
        eprintln!(
            "distinct chunk shapes over 6 draws: {} (bound {bound})",
            seen.len()
        );
        assert!(seen.len() <= bound, "{} shapes > bound {bound}", seen.len());
    }

    #[test]
    fn sort_order_is_stable_per_row_and_puts_invalid_blocks_first() {
        let anchors = [7, 3, 3, 9, 2, 8, 1, 5];
        let keep = [true, true, true, false, true, true, true, true];
        assert_eq!(sort_order(&anchors, &keep, 2, 4), [3, 1, 2, 0, 2, 0, 3, 1]);
    }
}
