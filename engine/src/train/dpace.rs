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
//! The weights are computed chunk by chunk of whole blocks and backpropagated by
//! `block_objective.rs::block_objective_backward`, which the tree objective shares.
use tch::{Kind, Tensor};

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

#[cfg(test)]
#[path = "dpace_tests.rs"]
mod tests;
