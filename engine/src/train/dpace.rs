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
//! - loss = `Σ CE_k·m_k·w_k`, divided as `training.dpace_normalization` says (by default by
//!   the number of sequences; [`dpace_row_scale`], [`dpace_normaliser`]).
//!
//! Why: `Σ_k ∏_{j≤k} q_j` is the block's expected accepted length, and its derivative with
//! respect to `log q_k` is `Σ_{j≥k} ∏_{i≤j} q_i`; the smoothing α keeps late slots from losing
//! all gradient while early ones are still poor.
//!
//! The normalisations, with `A_b` the blocks of sequence `b` with at least one supervised slot
//! (`m = 1`) and `T_b` its supervised slots:
//!
//! - `sequences`: `Σ_b num_b / B`, every sequence counted (SpecForge `a6b6b023`);
//! - `weight_sum`: `Σ_b num_b / Σ m·w` (SpecForge before PR #848);
//! - `anchors_per_sequence`: `Σ_b (num_b / A_b) / #{b : A_b > 0}` (SpecForge PR #848);
//! - `tokens_per_sequence`: `Σ_b num_b / (T_b + 1e-5) / B` (vLLM speculators).
//!
//! PR #848 divides by "the number of valid sampled anchors" without defining valid; `A_b`
//! counts the kept blocks that train at least one slot. Anchors are drawn only where the
//! anchor's token and the next are both supervised (`anchors.rs`), so every kept block trains
//! its slot 1 and `A_b` is the sequence's kept anchors; the choice matters only for a block
//! none of whose labels is supervised (all past the sequence's end or under the loss mask),
//! which trains nothing and would only shrink its sequence's other blocks if it counted.
//! Padding anchors (`keep = false`) have no supervised slot and never count.
//!
//! Each is a numerator (per sequence scaled by [`dpace_row_scale`]) and a normaliser
//! ([`dpace_normaliser`]) that both add up over micro-batches and drafter ranks, so the one
//! division `RankState::step` makes gives the gradient one device would compute on the whole
//! batch.
//!
//! The weights are computed chunk by chunk of whole blocks and backpropagated by
//! `block_objective.rs::block_objective_backward`, which the tree objective shares.
use dflash_shared::config::DpaceNormalization;
use tch::{Device, Kind, Tensor};

/// vLLM speculators' guard in its per-row token mean, kept so the values match its own.
pub const TOKENS_PER_SEQUENCE_EPSILON: f64 = 1e-5;

/// The factor sequence `b`'s numerator `Σ CE·m·w` carries under `normalization`, from its
/// blocks with a supervised slot (`anchors`, `A_b`) and its supervised slots (`tokens`, `T_b`):
/// `1/A_b` (0 when `A_b = 0`, whose numerator is 0 anyway), `1/(T_b + 1e-5)`, else 1.
pub fn dpace_row_scale(normalization: DpaceNormalization, anchors: u64, tokens: u64) -> f64 {
    match normalization {
        DpaceNormalization::Sequences | DpaceNormalization::WeightSum => 1.0,
        DpaceNormalization::AnchorsPerSequence if anchors == 0 => 0.0,
        DpaceNormalization::AnchorsPerSequence => 1.0 / anchors as f64,
        DpaceNormalization::TokensPerSequence => {
            1.0 / (tokens as f64 + TOKENS_PER_SEQUENCE_EPSILON)
        }
    }
}

/// What the scaled numerators of the sequences with these `anchors` (`A_b` each) and D-PACE
/// weight sum `Σ m·w` are divided by under `normalization`: the sequences, `Σ m·w`, or the
/// sequences with `A_b > 0`. Additive over disjoint sets of sequences.
pub fn dpace_normaliser(
    normalization: DpaceNormalization,
    anchors: &[u64],
    weight_sum: f64,
) -> f64 {
    match normalization {
        DpaceNormalization::Sequences | DpaceNormalization::TokensPerSequence => {
            anchors.len() as f64
        }
        DpaceNormalization::WeightSum => weight_sum,
        DpaceNormalization::AnchorsPerSequence => anchors.iter().filter(|&&a| a > 0).count() as f64,
    }
}

/// Per sequence of a `[B, N·bs]` mask (positive where `m_k = 1`): its blocks with a supervised
/// slot (`A_b`) and its supervised slots (`T_b`).
pub(crate) fn row_support(mask: &Tensor, block_size: i64) -> (Vec<u64>, Vec<u64>) {
    tch::no_grad(|| {
        let rows = mask.size()[0];
        let supervised = mask.gt(0.0).to_device(Device::Cpu);
        let anchors = supervised
            .view([rows, -1, block_size])
            .any_dim(2, false)
            .sum_dim_intlist(1, false, Kind::Int64);
        let tokens = supervised.sum_dim_intlist(1, false, Kind::Int64);
        let to_counts = |t: &Tensor| -> Vec<u64> {
            Vec::<i64>::try_from(t)
                .unwrap_or_default()
                .into_iter()
                .map(|c| c as u64)
                .collect()
        };
        (to_counts(&anchors), to_counts(&tokens))
    })
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

#[cfg(test)]
#[path = "dpace_normalization_tests.rs"]
mod normalization_tests;
