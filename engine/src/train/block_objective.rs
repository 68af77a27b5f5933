//! The objectives that weigh each slot's cross-entropy from the drafter's own output, block by
//! block (D-PACE, `dpace.rs`; the tree objective, `tree_objective.rs`), beside DFlash's fixed γ
//! decay: which one a step minimises, and the chunked backward they share.
//!
//! Chunking: a slot's weight depends on every slot of its block, so the LM head runs over whole
//! blocks at a time (as SpecForge chunks its objective by blocks): each chunk's logits give its
//! cross-entropies and, detached, what its weights need, and the chunk is backpropagated at once.
//! The head runs once per position, as for DFlash.
use dflash_shared::config::{DpaceNormalization, Objective};
use tch::{Device, Kind, Reduction, Tensor};

use super::dpace::{chunk_weights, dpace_normaliser, dpace_row_scale, row_support};
use super::loss::{weighted_positions, LossSums};
use super::tree_objective::{tree_chunk_weights, TreeObjective};

/// What a training step minimises.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LossObjective {
    /// `train/loss.rs::weighted_ce_backward` with the γ-decayed weights, normalised by Σ w.
    #[default]
    Dflash,
    /// [`block_objective_backward`] with D-PACE's weights at smoothing `alpha`, divided as
    /// `normalization` says (`train/dpace.rs`).
    Dpace {
        alpha: f64,
        normalization: DpaceNormalization,
    },
    /// `train/tree_objective.rs`, normalised by the number of sequences (whatever
    /// `training.dpace_normalization` says: its loss is reported per chunk, not per sequence).
    Tree(TreeObjective),
}

impl LossObjective {
    /// `training.objective` with its `training.dpace_alpha` and `training.dpace_normalization`,
    /// or `[training.tree]`.
    pub fn from_config(
        objective: Objective,
        dpace_alpha: f64,
        dpace_normalization: DpaceNormalization,
        tree: TreeObjective,
    ) -> Self {
        match objective {
            Objective::Dflash => LossObjective::Dflash,
            Objective::Dpace => LossObjective::Dpace {
                alpha: dpace_alpha,
                normalization: dpace_normalization,
            },
            Objective::Tree => LossObjective::Tree(tree),
        }
    }
}

/// A block objective's detached weights for one chunk of whole blocks (`chunk_weights`'s
/// arguments, with the chunk's `logits` and `targets`), and the loss it reports for the chunk
/// where that is not `Σ CE·w` (the tree objective's). `None` for DFlash, whose weights are the
/// γ decay the caller holds.
pub(crate) fn block_objective_weights(
    objective: LossObjective,
    logits: &Tensor,
    ce: &Tensor,
    targets: &Tensor,
    local: &Tensor,
    blocks: i64,
    block_size: i64,
) -> Option<(Tensor, Option<f64>)> {
    match objective {
        LossObjective::Dflash => None,
        LossObjective::Dpace { alpha, .. } => {
            Some((chunk_weights(ce, local, blocks, block_size, alpha), None))
        }
        LossObjective::Tree(tree) => {
            let (w, loss) = tree_chunk_weights(logits, ce, targets, local, block_size, &tree);
            Some((w, Some(loss)))
        }
    }
}

/// How one micro-batch's numerator is divided: the factor each weighted position's weight
/// carries (its sequence's, under `training.dpace_normalization`) and the micro-batch's part of
/// the normaliser. DFlash divides by Σ w, the tree objective by the sequences, D-PACE as its
/// normalisation says (`train/dpace.rs`).
pub(crate) struct MicroNormaliser {
    objective: LossObjective,
    /// `[P]`: the factor of each weighted position's sequence, in `weighted_positions` order;
    /// `None` where every factor is 1.
    scales: Option<Tensor>,
    /// Per sequence, its blocks with a supervised slot (D-PACE only; else empty).
    anchors: Vec<u64>,
    sequences: usize,
}

impl MicroNormaliser {
    /// For `objective` over a `[B, N·bs]` `mask` (positive where a slot is supervised) whose
    /// weighted positions are `idx` (flat indices, `weighted_positions`'s).
    pub(crate) fn new(
        objective: LossObjective,
        mask: &Tensor,
        idx: &Tensor,
        block_size: i64,
    ) -> Self {
        let size = mask.size();
        let (sequences, slots) = (size[0], size.get(1).copied().unwrap_or(0));
        let mut division = Self {
            objective,
            scales: None,
            anchors: Vec::new(),
            sequences: sequences as usize,
        };
        let LossObjective::Dpace { normalization, .. } = objective else {
            return division;
        };
        let (anchors, tokens) = row_support(mask, block_size);
        let per_row: Vec<f32> = anchors
            .iter()
            .zip(&tokens)
            .map(|(&a, &t)| dpace_row_scale(normalization, a, t) as f32)
            .collect();
        if per_row.iter().any(|&f| f != 1.0) {
            let device = idx.device();
            let row_of = idx.floor_divide_scalar(slots.max(1));
            let per_row = Tensor::from_slice(&per_row).to_device(device);
            division.scales = Some(per_row.index_select(0, &row_of));
        }
        division.anchors = anchors;
        division
    }

    /// The weights `w` of the weighted positions `start..start + len`, each times its
    /// sequence's factor.
    pub(crate) fn scaled(&self, w: Tensor, start: i64, len: i64) -> Tensor {
        match &self.scales {
            Some(scales) => w * scales.narrow(0, start, len),
            None => w,
        }
    }

    /// The micro-batch's normaliser, given the sum of its (unscaled) weights.
    pub(crate) fn normaliser(&self, weight_sum: f64) -> f64 {
        match self.objective {
            LossObjective::Dflash => weight_sum,
            LossObjective::Dpace { normalization, .. } => {
                dpace_normaliser(normalization, &self.anchors, weight_sum)
            }
            LossObjective::Tree(_) => self.sequences as f64,
        }
    }
}

/// `(start, len)` runs of `positions` (ascending flat slot indices, block `p / block_size`)
/// that hold whole blocks, each at most `chunk` positions unless one block alone holds more.
pub(crate) fn block_aligned_chunks(
    positions: &[i64],
    block_size: i64,
    chunk: i64,
) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1) as usize;
    let mut chunks = Vec::new();
    let (mut start, mut len) = (0usize, 0usize);
    let mut i = 0;
    while i < positions.len() {
        let block = positions[i] / block_size;
        let group = positions[i..]
            .iter()
            .take_while(|&&p| p / block_size == block)
            .count();
        if len > 0 && len + group > chunk {
            chunks.push((start, len));
            (start, len) = (i, 0);
        }
        len += group;
        i += group;
    }
    if len > 0 {
        chunks.push((start, len));
    }
    chunks
}

/// The inputs of a block objective of one micro-batch besides the drafter's output.
#[derive(Clone, Copy)]
pub struct BlockObjectiveBatch<'a> {
    /// `[V, H]`, frozen.
    pub lm_head: &'a Tensor,
    /// `[B, N·bs]` int64.
    pub targets: &'a Tensor,
    /// `[B, N·bs]`, positive where `m_k = 1`.
    pub mask: &'a Tensor,
    pub block_size: i64,
}

/// Computes a block objective (D-PACE, the tree objective) over `drafter_out` and backpropagates
/// `numerator / denominator` into the drafter: per chunk of whole blocks, the logits, their
/// cross-entropies, the objective's detached weights ([`block_objective_weights`]), each times
/// its sequence's factor ([`MicroNormaliser`]), and the backward of `Σ CE·w / denominator`.
///
/// - `drafter_out`: `[B, N·bs, H]`, part of the autograd graph; `batch`: the head and labels.
/// - `denominator`: 1 when the caller divides the summed gradient once itself by the summed
///   normaliser (as `RankState::step` does), or that global normaliser when it is known.
/// - `chunk_positions`: how many positions go through the head at once (rounded to whole
///   blocks; a block is never split).
///
/// The returned sums carry this micro-batch's part of the normaliser (the sequences for the
/// tree objective; what `training.dpace_normalization` names for D-PACE), so that summed over
/// micro-batches and ranks they give the whole batch's. `weighted_ce` is the objective's
/// reported numerator (`Σ CE·w`, with the sequences' factors, for D-PACE, `Σ L` for the tree
/// objective); `weight` is `Σ w` without them.
pub fn block_objective_backward(
    drafter_out: &Tensor,
    batch: &BlockObjectiveBatch,
    objective: LossObjective,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let BlockObjectiveBatch {
        lm_head,
        targets,
        mask,
        block_size,
    } = *batch;
    let hidden = drafter_out.size().last().copied().unwrap_or(0);
    let (idx, _) = weighted_positions(mask);
    let division = MicroNormaliser::new(objective, mask, &idx, block_size);
    let positions = Vec::<i64>::try_from(&idx.to_device(Device::Cpu)).unwrap_or_default();
    let chunks = block_aligned_chunks(&positions, block_size, chunk_positions);
    let tgt = targets.reshape([-1]).index_select(0, &idx);
    // With one chunk nothing needs cutting (as in `weighted_ce_backward`).
    let detached = (chunks.len() > 1).then(|| drafter_out.detach().set_requires_grad(true));
    let flat = detached
        .as_ref()
        .unwrap_or(drafter_out)
        .reshape([-1, hidden]);
    let mut sums = LossSums::default();
    for (start, len) in chunks {
        let rows = idx.narrow(0, start as i64, len as i64);
        let first_block = positions[start] / block_size;
        let blocks = positions[start + len - 1] / block_size - first_block + 1;
        let logits = flat
            .index_select(0, &rows)
            .matmul(&lm_head.tr())
            .to_kind(Kind::Float);
        let t = tgt.narrow(0, start as i64, len as i64);
        let ce = logits.cross_entropy_loss::<Tensor>(&t, None, Reduction::None, -100, 0.0);
        let local = &rows - first_block * block_size;
        let Some((w, reported)) =
            block_objective_weights(objective, &logits, &ce, &t, &local, blocks, block_size)
        else {
            continue;
        };
        sums.weight += w.sum(Kind::Double).double_value(&[]);
        let w = division.scaled(w, start as i64, len as i64);
        let numerator = (&ce * &w).sum(Kind::Float);
        (&numerator / denominator).backward();
        let correct = tch::no_grad(|| logits.argmax(-1, false).eq_tensor(&t).sum(Kind::Int64));
        sums.weighted_ce += reported.unwrap_or_else(|| numerator.double_value(&[]));
        sums.correct += correct.int64_value(&[]) as u64;
        sums.counted += len as u64;
    }
    if let Some(grad) = detached.map(|d| d.grad()).filter(Tensor::defined) {
        (drafter_out * grad.detach()).sum(Kind::Float).backward();
    }
    sums.normaliser = division.normaliser(sums.weight);
    sums
}
