//! D-PACE (arXiv 2605.18810): the cross-entropy of each draft slot weighted by how much the
//! block's expected accepted length depends on it, as SpecForge trains it
//! (`specforge/algorithms/common/dflash_family_model.py`, `loss_type = "dpace"`:
//! `_dpace_weight`, and the D-PACE branch of the objective).
//!
//! Per block, with `m_k` the slot's mask (block kept × label in the row × `k > 0` × loss mask;
//! `BlockLabels::valid`) and `q_k` the drafter's probability of the label:
//!
//! - `s_k = (1−α)·q_k + α`, and `s_k = 1` where `m_k = 0` (a no-op in the product);
//! - `P_k = ∏_{j≤k} s_j`;
//! - `w_k = Σ_{j≥k} P_j·m_j`, detached: no gradient flows through the weights;
//! - loss = `Σ CE_k·m_k·w_k`, divided by the number of sequences (not by a weight sum).
//!
//! Why: `Σ_k ∏_{j≤k} q_j` is the block's expected accepted length, and its derivative with
//! respect to `log q_k` is `Σ_{j≥k} ∏_{i≤j} q_i`; the smoothing α keeps late slots from losing
//! all gradient while early ones are still poor.
//!
//! Chunking: the weights of a slot depend on every slot of its block, so the LM head runs over
//! whole blocks at a time (as SpecForge chunks its objective by blocks): each chunk's logits
//! give its cross-entropies and, detached, the `q` its weights need, and the chunk is
//! backpropagated at once. The head runs once per position, as for DFlash.
use dflash_shared::config::Objective;
use tch::{Device, Kind, Reduction, Tensor};

use super::loss::{weighted_positions, LossSums};
use super::tree_objective::{tree_chunk_weights, TreeObjective};

/// What a training step minimises.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LossObjective {
    /// `train/loss.rs::weighted_ce_backward` with the γ-decayed weights, normalised by Σ w.
    #[default]
    Dflash,
    /// [`dpace_ce_backward`] with smoothing `alpha`, normalised by the number of sequences.
    Dpace { alpha: f64 },
    /// `train/tree_objective.rs`, normalised by the number of sequences.
    Tree(TreeObjective),
}

impl LossObjective {
    /// `training.objective` with its `training.dpace_alpha` or `[training.tree]`.
    pub fn from_config(objective: Objective, dpace_alpha: f64, tree: TreeObjective) -> Self {
        match objective {
            Objective::Dflash => LossObjective::Dflash,
            Objective::Dpace => LossObjective::Dpace { alpha: dpace_alpha },
            Objective::Tree => LossObjective::Tree(tree),
        }
    }

    /// Whether the objective weighs slots from the drafter's own output, block by block, and
    /// divides by the number of sequences (D-PACE, the tree objective); DFlash's weights are
    /// the γ decay, fixed in advance, and it divides by their sum.
    pub fn is_block_objective(&self) -> bool {
        !matches!(self, LossObjective::Dflash)
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
        LossObjective::Dpace { alpha } => {
            Some((chunk_weights(ce, local, blocks, block_size, alpha), None))
        }
        LossObjective::Tree(tree) => {
            let (w, loss) = tree_chunk_weights(logits, ce, targets, local, block_size, &tree);
            Some((w, Some(loss)))
        }
    }
}

/// The D-PACE weights `w_k·m_k` of one block, from the drafter's probability of each slot's
/// label (`q[k]`, read only where `mask[k]`). In f64, for the evaluation's per-row sums.
pub fn dpace_block_weights(q: &[f64], mask: &[bool], alpha: f64) -> Vec<f64> {
    let mut prefix = Vec::with_capacity(q.len());
    let mut running = 1.0;
    for (&qk, &mk) in q.iter().zip(mask) {
        if mk {
            running *= (1.0 - alpha) * qk + alpha;
        }
        prefix.push(running);
    }
    let mut weights = vec![0.0; q.len()];
    let mut suffix = 0.0;
    for k in (0..q.len()).rev() {
        if mask[k] {
            suffix += prefix[k];
            weights[k] = suffix;
        }
    }
    weights
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

/// The detached weights `w_k` of the positions `local` (flat slot indices relative to the
/// chunk's first block) of `blocks` blocks, from their cross-entropies.
pub(crate) fn chunk_weights(
    ce: &Tensor,
    local: &Tensor,
    blocks: i64,
    block_size: i64,
    alpha: f64,
) -> Tensor {
    tch::no_grad(|| {
        let device = ce.device();
        let n = blocks * block_size;
        let q = ce.detach().neg().exp();
        let smooth = q * (1.0 - alpha) + alpha;
        let s = Tensor::ones([n], (Kind::Float, device))
            .index_copy(0, local, &smooth)
            .view([blocks, block_size]);
        let prefix = s.cumprod(1, Kind::Float);
        let mask = Tensor::zeros([n], (Kind::Float, device))
            .index_fill(0, local, 1.0)
            .view([blocks, block_size]);
        let suffix = (prefix * mask).flip([1]).cumsum(1, Kind::Float).flip([1]);
        suffix.view([-1]).index_select(0, local)
    })
}

/// Computes the D-PACE numerator `Σ CE·m·w` over `drafter_out` and backpropagates
/// `numerator / denominator` into the drafter, chunk by chunk of whole blocks.
///
/// - `drafter_out`: `[B, N·bs, H]`, part of the autograd graph; `lm_head`: `[V, H]`, frozen.
/// - `targets`: `[B, N·bs]` int64; `mask`: `[B, N·bs]`, positive where `m_k = 1`.
/// - `denominator`: the global number of sequences of the optimizer step, or 1 when the caller
///   divides the summed gradient once itself (as `RankState::step` does).
/// - `chunk_positions`: how many positions go through the head at once (rounded to whole
///   blocks; a block is never split).
///
/// The returned sums carry `normaliser = B`, the sequences of this micro-batch, so that summed
/// over micro-batches and ranks they give SpecForge's per-sequence normalisation of the whole
/// batch.
#[allow(clippy::too_many_arguments)]
pub fn dpace_ce_backward(
    drafter_out: &Tensor,
    lm_head: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    block_size: i64,
    alpha: f64,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    block_objective_backward(
        drafter_out,
        lm_head,
        targets,
        mask,
        block_size,
        LossObjective::Dpace { alpha },
        denominator,
        chunk_positions,
    )
}

/// [`dpace_ce_backward`] for any block objective (D-PACE, the tree objective): per chunk of
/// whole blocks, the logits, their cross-entropies, the objective's detached weights
/// ([`block_objective_weights`]) and the backward of `Σ CE·w / denominator`. `weighted_ce` is
/// the objective's reported numerator (`Σ CE·w` for D-PACE, `Σ L` for the tree objective).
#[allow(clippy::too_many_arguments)]
pub(crate) fn block_objective_backward(
    drafter_out: &Tensor,
    lm_head: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    block_size: i64,
    objective: LossObjective,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let size = drafter_out.size();
    let (sequences, hidden) = (size[0], size.last().copied().unwrap_or(0));
    let (idx, _) = weighted_positions(mask);
    let positions = Vec::<i64>::try_from(&idx.to_device(Device::Cpu)).unwrap_or_default();
    let chunks = block_aligned_chunks(&positions, block_size, chunk_positions);
    let tgt = targets.reshape([-1]).index_select(0, &idx);
    // With one chunk nothing needs cutting (as in `weighted_ce_backward`).
    let detached = (chunks.len() > 1).then(|| drafter_out.detach().set_requires_grad(true));
    let flat = detached
        .as_ref()
        .unwrap_or(drafter_out)
        .reshape([-1, hidden]);
    let mut sums = LossSums {
        normaliser: sequences as f64,
        ..LossSums::default()
    };
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
        let numerator = (&ce * &w).sum(Kind::Float);
        (&numerator / denominator).backward();
        let correct = tch::no_grad(|| logits.argmax(-1, false).eq_tensor(&t).sum(Kind::Int64));
        sums.weighted_ce += reported.unwrap_or_else(|| numerator.double_value(&[]));
        sums.weight += w.sum(Kind::Double).double_value(&[]);
        sums.correct += correct.int64_value(&[]) as u64;
        sums.counted += len as u64;
    }
    if let Some(grad) = detached.map(|d| d.grad()).filter(Tensor::defined) {
        (drafter_out * grad.detach()).sum(Kind::Float).backward();
    }
    sums
}

#[cfg(test)]
#[path = "dpace_tests.rs"]
mod tests;
