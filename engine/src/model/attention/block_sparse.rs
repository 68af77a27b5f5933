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
//!    order at the end), so consecutive blocks need similar context ranges. When a schedule needs
//!    that order, the drafter sorts its blocks once per forward ([`BlockOrder`]) and rebuilds
//!    its schedules, which then find them sorted and gather nothing per layer.
//! 2. Chunks grow while their `[B, heads, C·bs, L + C·bs]` score grid stays under a budget,
//!    and, once past a small size where call overhead dominates, only while the chunk's block
//!    keys (of which each query sees only its own `bs`) do not outnumber its context keys.
//! 3. The schedule (order, chunks, additive masks) depends only on the anchors, the layer rule and
//!    the shapes, so the drafter builds it once per forward and rule and every layer shares it
//!    ([`ChunkSchedule`]); the masks autograd keeps are then shared by the layers too.
//! 4. The shapes of the calls come from a small set: a chunk holds `2^k` or `3·2^k` blocks and
//!    its context range is widened (masked) to a multiple of [`context_key_quantum`] keys, so
//!    a step's distinct (rows, keys) stay within `chunk_schedule::max_distinct_chunk_shapes`
//!    whatever the anchors ([`super::shape_log`] observes them).
//! 5. q and the block keys/values are split into the chunks' rows once per call (one
//!    `split_with_sizes`, whose backward is one concatenation), and grouped query heads reach
//!    the kernel without repeating K/V ([`GroupedHeads`]).
//!
//! Memory kept for backward: per chunk its additive mask (`B·C·bs·(L + C·bs)`, shared by all
//! heads and layers; `g` times that where the group is folded into rows), the chunk's
//! key/value copy (one kv head per group) and O(Q) tensors. No `[Q, S+Q]` grid and no per-head
//! probabilities exist at any time: the fused kernel works in tiles.
use tch::{Device, Kind, Tensor};

use super::chunk_schedule::{choose_chunks, chunk_costs, sort_order};
use super::visibility::{context_mask, own_block_mask, LayerRule};
use super::BlockAttentionInputs;

/// How the query heads of a GQA group meet their shared key/value head at the kernel. Both are
/// exact; neither repeats K/V (HF `repeat_kv` would copy each chunk's keys and values `g`
/// times, and the kernel would keep those copies for backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedHeads {
    /// SDPA's `enable_gqa`: the kernel maps query head `h` to kv head `h / g` itself. libtorch
    /// 2.11's CPU flash kernel takes it with a bias (probed: `_fused_sdp_choice` answers flash,
    /// `sdpa.rs` tests).
    Native,
    /// The `g` query heads of kv head `j` become `g` stacked copies of the rows of one head:
    /// q `[B, Hkv, g·rows, D]`, the bias repeated `g` times along rows (once per schedule,
    /// shared by its layers), an ordinary equal-heads call. For devices whose biased kernel refuses
    /// `enable_gqa`: on CUDA with cuDNN attention off (`sdpa.rs`) a biased call goes to the
    /// memory-efficient kernel, whose dense constraints are
    /// `check_batch_size_and_num_heads_dense<false /*supports_gqa*/>` in libtorch 2.11, and
    /// flash refuses any mask, so `enable_gqa` there would fall back to the math kernel (the
    /// whole score grid). NOT VERIFIED ON A GPU; tested on CPU against the dense oracle.
    Folded,
}

impl GroupedHeads {
    /// What the block-sparse attention uses on `device`.
    pub fn for_device(device: Device) -> Self {
        if device == Device::Cpu {
            GroupedHeads::Native
        } else {
            GroupedHeads::Folded
        }
    }
}

fn host_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).to_device(Device::Cpu).reshape([-1]))
        .expect("an int64 CPU tensor converts to Vec<i64>")
}

/// A permutation of the blocks of each batch row, and its inverse, as `[B, N]` index tensors.
/// Gathers whole blocks of any per-block tensor `[B, N·k, ...]` (`[B, N]` included).
pub struct BlockOrder {
    order: Tensor,
    inverse: Tensor,
}

impl BlockOrder {
    /// `order` (row-major `[batch, blocks]`, from [`sort_order`]) on `device`, or `None` when
    /// it is the identity, so nothing needs gathering.
    fn from_host(order: &[i64], (batch, blocks): (i64, i64), device: Device) -> Option<Self> {
        let identity = order
            .iter()
            .enumerate()
            .all(|(k, &i)| i == k as i64 % blocks);
        (!identity).then(|| {
            let order = Tensor::from_slice(order)
                .view([batch, blocks])
                .to_device(device);
            let inverse = order.argsort_stable(true, 1, false);
            Self { order, inverse }
        })
    }

    /// The order that sorts the blocks of `anchors`/`keep` (`[B, N]`) by anchor, or `None`
    /// when they are sorted already. Reads both to the host once.
    pub fn by_anchor(anchors: &Tensor, keep: &Tensor) -> Option<Self> {
        let size = anchors.size();
        assert!(
            size.len() == 2 && keep.size() == size,
            "BlockOrder::by_anchor: anchors and keep must be [B, N], got {size:?} and {:?}",
            keep.size()
        );
        let host_keep: Vec<bool> = host_i64(keep).into_iter().map(|k| k != 0).collect();
        let (batch, blocks) = (size[0], size[1]);
        let order = sort_order(
            &host_i64(anchors),
            &host_keep,
            batch as usize,
            blocks as usize,
        );
        Self::from_host(&order, (batch, blocks), anchors.device())
    }

    /// `t` with its blocks in this order.
    pub fn permute(&self, t: &Tensor) -> Tensor {
        gather_blocks(t, &self.order)
    }

    /// Undoes [`Self::permute`].
    pub fn restore(&self, t: &Tensor) -> Tensor {
        gather_blocks(t, &self.inverse)
    }
}

/// `t` `[B, N·k, ...]` with block `j` of row `b` taken from block `index[b, j]`.
fn gather_blocks(t: &Tensor, index: &Tensor) -> Tensor {
    let (b, n) = (index.size()[0], index.size()[1]);
    let size = t.size();
    let per_block = t.numel() as i64 / (b * n);
    t.reshape([b, n, per_block])
        .gather(
            1,
            &index.unsqueeze(-1).expand([b, n, per_block], false),
            false,
        )
        .view(size.as_slice())
}

/// One chunk of a schedule, ready to run: its blocks and the range of context keys it reads.
struct ScheduledChunk {
    count: i64,
    keys: Option<(i64, i64)>,
}

/// Everything of a block-sparse attention call that depends only on the anchors, the layer
/// rule and the shapes: build it once per forward and rule, run it for every layer.
pub struct ChunkSchedule {
    rule: LayerRule,
    block_size: i64,
    context_len: i64,
    batch: i64,
    blocks: i64,
    /// `None` when the blocks keep their given order (one chunk, or already sorted).
    order: Option<BlockOrder>,
    chunks: Vec<ScheduledChunk>,
    /// Per chunk its additive mask `[B, 1, f·count·bs, L + count·bs]` in the activation dtype
    /// (0 visible, `-inf` hidden), its rows repeated `f` times for [`GroupedHeads::Folded`]
    /// (`f` = [`Self::bias_fold`], 1 until a folded call first needs `g`; then replaced, so a
    /// schedule never holds both).
    biases: std::cell::RefCell<Vec<Tensor>>,
    bias_fold: std::cell::Cell<i64>,
    grouped: GroupedHeads,
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

/// The blocks a [`ChunkSchedule`] is built for: which anchors, which of them are kept, and the
/// shapes the chunk costs depend on.
#[derive(Clone, Copy)]
pub struct ScheduledBlocks<'a> {
    pub rule: LayerRule,
    /// `[B, N]` int64, on any device (read to the host once).
    pub anchors: &'a Tensor,
    /// `[B, N]` bool, on any device (read to the host once).
    pub keep: &'a Tensor,
    pub block_size: i64,
    pub context_len: i64,
    /// Query heads, for the chunk cost.
    pub heads: i64,
}

impl ChunkSchedule {
    /// The schedule of `blocks` with one chunk's score grid capped at `chunk_score_elements`;
    /// masks are built in `kind` on `device`.
    pub fn new(
        blocks: &ScheduledBlocks<'_>,
        chunk_score_elements: i64,
        (kind, device): (Kind, Device),
    ) -> Self {
        let ScheduledBlocks {
            rule,
            anchors,
            keep,
            block_size,
            context_len,
            heads,
        } = *blocks;
        let size = anchors.size();
        assert!(
            size.len() == 2 && keep.size() == size && block_size > 0,
            "ChunkSchedule: anchors and keep must be [B, N] (got {size:?} and {:?}), block size > 0 (got {block_size})",
            keep.size()
        );
        let (batch, blocks) = (size[0], size[1]);
        let host_anchors = host_i64(anchors);
        let host_keep: Vec<bool> = host_i64(keep).into_iter().map(|k| k != 0).collect();
        let costs = chunk_costs(block_size, batch, heads, chunk_score_elements);
        let choice = choose_chunks(
            rule,
            &host_anchors,
            &host_keep,
            (batch as usize, blocks as usize),
            context_len,
            costs,
        );
        let (chunks, order, chunk_anchors, chunk_keep) = match choice.sorted {
            None => (
                choice.chunks,
                None,
                anchors.to_device(device).to_kind(Kind::Int64),
                keep.to_device(device).to_kind(Kind::Bool),
            ),
            Some(sorted) => {
                let to_device = |t: Tensor| t.view([batch, blocks]).to_device(device);
                (
                    choice.chunks,
                    BlockOrder::from_host(&sorted.order, (batch, blocks), device),
                    to_device(Tensor::from_slice(&sorted.anchors)),
                    to_device(Tensor::from_slice(&sorted.keep)),
                )
            }
        };
        let biases = chunks
            .iter()
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
                Tensor::zeros(visible.size(), (kind, device))
                    .masked_fill(&visible.logical_not(), f64::NEG_INFINITY)
                    .view([batch, 1, count * block_size, keys])
            })
            .collect();
        let chunks = chunks
            .into_iter()
            .map(|chunk| ScheduledChunk {
                count: (chunk.end - chunk.start) as i64,
                keys: chunk.keys,
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
            biases: std::cell::RefCell::new(biases),
            bias_fold: std::cell::Cell::new(1),
            grouped: GroupedHeads::for_device(device),
        }
    }

    /// The same schedule with grouped query heads passed to the kernel as `grouped` instead of
    /// the device's choice ([`GroupedHeads::for_device`]); for tests of both layouts on one
    /// device.
    pub fn with_grouped_heads(mut self, grouped: GroupedHeads) -> Self {
        self.grouped = grouped;
        self
    }

    /// The chunks' masks with their rows repeated `fold` times (built on the first call that
    /// needs them, replacing the unrepeated ones, and shared by every later layer).
    fn biases(&self, fold: i64) -> std::cell::Ref<'_, Vec<Tensor>> {
        let have = self.bias_fold.get();
        if have != fold {
            assert!(
                have == 1,
                "block-sparse schedule: masks folded for a group of {have} used with a group of {fold}"
            );
            let mut biases = self.biases.borrow_mut();
            for bias in biases.iter_mut() {
                let s = bias.size(); // [B, 1, rows, keys]
                *bias = bias
                    .unsqueeze(2)
                    .expand([s[0], 1, fold, s[2], s[3]], false)
                    .reshape([s[0], 1, fold * s[2], s[3]]);
            }
            self.bias_fold.set(fold);
        }
        self.biases.borrow()
    }

    /// Number of fused attention calls per use (for diagnostics and tests).
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    pub fn rule(&self) -> LayerRule {
        self.rule
    }

    /// Whether the schedule runs the blocks in the order it was given (one chunk of all blocks,
    /// or blocks already sorted by anchor), so it gathers nothing.
    pub fn keeps_given_order(&self) -> bool {
        self.order.is_none()
    }
}

/// Block-sparse attention; `chunk_score_elements` caps one chunk's score grid. Builds a schedule
/// for this one call; the drafter shares one schedule between its layers instead
/// ([`block_sparse_attention_scheduled`]). Returns `[B, Q, Hq, D]` in the query dtype.
pub fn block_sparse_attention(
    inputs: &BlockAttentionInputs<'_>,
    chunk_score_elements: i64,
) -> Tensor {
    let d = inputs.dims();
    let blocks = ScheduledBlocks {
        rule: inputs.rule,
        anchors: inputs.anchors,
        keep: inputs.keep,
        block_size: d.block_size,
        context_len: d.context_len,
        heads: d.kv_heads * d.group,
    };
    let schedule = ChunkSchedule::new(
        &blocks,
        chunk_score_elements,
        (inputs.query.kind(), inputs.query.device()),
    );
    block_sparse_attention_scheduled(inputs, &schedule)
}

/// Block-sparse attention with a prepared schedule. The schedule must have been built for the same
/// anchors, keep, rule and shapes (checked for the shapes and the rule).
pub fn block_sparse_attention_scheduled(
    inputs: &BlockAttentionInputs<'_>,
    schedule: &ChunkSchedule,
) -> Tensor {
    let d = inputs.dims();
    let (b, n, bs, g) = (d.batch, d.num_blocks, d.block_size, d.group);
    assert!(
        schedule.rule == inputs.rule
            && schedule.batch == b
            && schedule.blocks == n
            && schedule.block_size == bs
            && schedule.context_len == d.context_len,
        "block-sparse schedule for {:?}, batch {}, {} blocks of {}, context {} used for {:?}, batch {b}, {n} blocks of {bs}, context {}",
        schedule.rule,
        schedule.batch,
        schedule.blocks,
        schedule.block_size,
        schedule.context_len,
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
    let sort_blocks = |t: &Tensor| match &schedule.order {
        None => t.shallow_clone(),
        Some(order) => order.permute(t),
    };
    let (q, block_key, block_value) = (
        sort_blocks(inputs.query),
        sort_blocks(inputs.block_key),
        sort_blocks(inputs.block_value),
    );
    // Folding only matters with a group; with one query head per kv head both are the same call.
    let folded = schedule.grouped == GroupedHeads::Folded && g > 1;
    let biases = schedule.biases(if folded { g } else { 1 });
    // One split per tensor (not a `narrow` per chunk): the chunks tile the rows in order, so
    // backward joins the chunks' gradients with one concatenation instead of zero-filling a
    // full-size gradient and accumulating into it once per chunk.
    let rows: Vec<i64> = schedule.chunks.iter().map(|c| c.count * bs).collect();
    let split = |t: &Tensor| {
        if rows.len() == 1 {
            vec![t.shallow_clone()]
        } else {
            t.split_with_sizes(&rows, 1)
        }
    };
    let (q_chunks, key_chunks, value_chunks) = (split(&q), split(&block_key), split(&block_value));
    // `[B, T, Hkv, D]` keys or values of the chunk as the `[B, Hkv, T, D]` the kernel reads.
    let keys_of = |context: &Tensor, own: &Tensor, chunk: &ScheduledChunk| {
        match chunk.keys {
            Some((lo, hi)) => Tensor::cat(&[&context.narrow(1, lo, hi - lo), own], 1),
            None => own.shallow_clone(),
        }
        .transpose(1, 2)
    };
    let (hkv, dim) = (d.kv_heads, d.head_dim);
    let mut outs: Vec<Tensor> = schedule
        .chunks
        .iter()
        .enumerate()
        .map(|(c, chunk)| {
            let r = chunk.count * bs;
            // Query head h = j·g + i reads kv head j (HF `repeat_kv`). Folded: row i·r + t of
            // kv head j is row t of query head j·g + i.
            let q_chunk = if folded {
                q_chunks[c]
                    .reshape([b, r, hkv, g, dim])
                    .permute([0, 2, 3, 1, 4])
                    .reshape([b, hkv, g * r, dim])
            } else {
                q_chunks[c].transpose(1, 2)
            };
            let (k, v) = (
                keys_of(inputs.context_key, &key_chunks[c], chunk),
                keys_of(inputs.context_value, &value_chunks[c], chunk),
            );
            super::shape_log::record(&q_chunk, &k);
            let out = Tensor::scaled_dot_product_attention(
                &q_chunk,
                &k,
                &v,
                Some(&biases[c]),
                0.0,
                false,
                inputs.scale,
                !folded && g > 1,
            );
            if folded {
                out.reshape([b, hkv, g, r, dim])
                    .permute([0, 3, 1, 2, 4])
                    .reshape([b, r, heads, dim])
            } else {
                out.transpose(1, 2) // [B, C·bs, Hq, D]
            }
        })
        .collect();
    let out = if outs.len() == 1 {
        outs.pop().expect("one chunk")
    } else {
        Tensor::cat(&outs, 1)
    };
    match &schedule.order {
        None => out,
        Some(order) => order.restore(&out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(t: &Tensor) -> Vec<i64> {
        host_i64(t)
    }

    #[test]
    fn block_order_sorts_whole_blocks_by_anchor_and_restores_them() {
        let anchors = Tensor::from_slice(&[9i64, 2, 5, 0, 1, 4]).view([2, 3]);
        // Row 1's first block is invalid: it sorts first whatever its stale anchor.
        let keep = Tensor::from_slice(&[true, true, true, false, true, true]).view([2, 3]);
        let order = BlockOrder::by_anchor(&anchors, &keep).expect("rows are not sorted");
        assert_eq!(ints(&order.permute(&anchors)), [2, 5, 9, 0, 1, 4]);
        // Blocks of 2 positions with 3 features each move as units.
        let per_position = Tensor::arange(2 * 6 * 3, (Kind::Int64, Device::Cpu)).view([2, 6, 3]);
        let sorted = order.permute(&per_position);
        assert_eq!(
            ints(&sorted.get(0).narrow(0, 0, 2)),
            ints(&per_position.get(0).narrow(0, 2, 2)),
            "row 0's first sorted block is its block 1 (anchor 2)"
        );
        assert!(order.restore(&sorted).equal(&per_position));
        assert!(
            order
                .permute(&keep)
                .to_kind(Kind::Int64)
                .sum(Kind::Int64)
                .int64_value(&[])
                == 5
        );
    }

    #[test]
    fn sorted_blocks_need_no_order() {
        let anchors = Tensor::from_slice(&[1i64, 3, 3, 0, 2, 7]).view([2, 3]);
        let keep = Tensor::from_slice(&[true; 6]).view([2, 3]);
        assert!(BlockOrder::by_anchor(&anchors, &keep).is_none());
    }
}
