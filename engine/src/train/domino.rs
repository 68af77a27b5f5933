//! Training a Domino drafter (`model/drafter/domino.rs`): the base-anchored curriculum and the
//! acceptance it reports, as SpecForge's `OnlineDominoModel` and `DominoTrainStrategy` define
//! them (`specforge/algorithms/common/dflash_family_model.py`, `specforge/core/domino.py`,
//! `specforge/training/strategies/base.py::linear_lambda_base`).
//!
//! - **The curriculum.** `loss = (1−λ)·final + λ·base`: `final` is the objective on the
//!   corrected logits, `base` the same objective on the LM head's logits alone. Early on the
//!   correction is noise and `base` keeps the backbone learning what DFlash would; λ falls
//!   linearly from `lambda_base_start` to 0 over the first `lambda_base_decay_ratio` of the
//!   run's steps ([`lambda_base`]), then the drafter is trained on what it serves.
//! - **Every objective.** With DFlash, both terms are `Σ w·CE` over the γ-weighted slots and
//!   share the divisor Σw (SpecForge's `loss_terms`). With D-PACE each term's weights come from
//!   its own logits' confidence (`train/dpace.rs`), each sequence's times the same factor of
//!   `training.dpace_normalization` (it reads only the mask), and both share one divisor: the
//!   sequences (or those with a supervised anchor), or with `weight_sum` the blend's own weight
//!   sum `(1−λ)·Σw_final + λ·Σw_base` (one divisor, as the step divides the summed gradient
//!   once; at λ = 0 it is the corrected term's `Σw`). With the tree objective each term is its
//!   own logits' tree loss (`train/tree_objective.rs`), divided by the sequences. SpecForge's
//!   Domino trains DFlash's loss only; the D-PACE blend is dflashd's, the same curriculum over
//!   D-PACE's terms.
//! - **Acceptance.** `accept_len` and `base_accept_len` are SpecForge's: per block with a
//!   supervised slot, 1 + the number of leading supervised slots whose argmax is the label
//!   (an unsupervised slot neither counts nor breaks the run), averaged over those blocks, from
//!   the corrected and the base logits.
//!
//! Chunking is `train/loss.rs`'s: whole blocks of weighted positions go through the LM head
//! and `embed_proj` at once, each chunk backpropagated into detached copies of the drafter's
//! output and of the GRU states, which then backpropagate once into the drafter and the GRU.
use tch::{Device, Kind, Reduction, Tensor};

use super::block_objective::{
    block_aligned_chunks, block_objective_weights, LossObjective, MicroNormaliser,
};
use super::loss::{weighted_positions, LossSums};
use crate::model::drafter::DominoHead;

/// λ at optimizer step `step` (the steps done before this one) of a `total_steps` run:
/// `lambda_start` falling linearly to 0 over `⌊total_steps·decay_ratio⌋` steps (at least 1),
/// 0 after, clamped to [0, 1]; 0 without a schedule (SpecForge's `linear_lambda_base`).
pub fn lambda_base(step: u64, total_steps: u64, lambda_start: f64, decay_ratio: f64) -> f64 {
    if total_steps == 0 {
        return 0.0;
    }
    let decay_steps = ((total_steps as f64 * decay_ratio) as u64).max(1);
    let progress = (step as f64 / decay_steps as f64).min(1.0);
    (lambda_start * (1.0 - progress)).clamp(0.0, 1.0)
}

/// The Domino inputs of one micro-batch besides the drafter's output.
pub struct DominoBatch<'a> {
    pub head: &'a DominoHead,
    pub lm_head: &'a Tensor,
    /// `[B, N·bs, H]`: the embeddings of each slot's label (slot 0's being the anchor), what
    /// the GRU reads, teacher-forced.
    pub label_embeddings: &'a Tensor,
    /// `[B, N·bs]` int64.
    pub targets: &'a Tensor,
    /// `[B, N·bs]`: DFlash's γ-decayed weights, or D-PACE's 0/1 mask; positive exactly where a
    /// slot is supervised.
    pub weights: &'a Tensor,
    pub block_size: i64,
}

/// Computes the curriculum's numerator `(1−λ)·final + λ·base` over `drafter_out`
/// (`[B, N·bs, H]`, in the graph) and backpropagates it divided by `denominator` into the
/// drafter and the head, chunk by chunk of whole blocks. The sums carry both terms
/// (`final_ce`, `base_ce`), the objective's normaliser (Σw for DFlash, D-PACE's as
/// `training.dpace_normalization` says, `B` for the tree objective) and the acceptance counts.
pub fn domino_ce_backward(
    drafter_out: &Tensor,
    batch: &DominoBatch,
    objective: LossObjective,
    lambda: f64,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let states = batch
        .head
        .slot_states(batch.label_embeddings, batch.block_size);
    let out_leaf = drafter_out.detach().set_requires_grad(true);
    let states_leaf = states.detach().set_requires_grad(true);
    let sums = chunked_terms(
        &out_leaf,
        &states_leaf,
        batch,
        objective,
        Some((lambda, denominator)),
        chunk_positions,
    );
    // One backward into the drafter and the GRU from the gradients the chunks left on the
    // leaves: d/d(x) Σ(x·g) is exactly g.
    let mut total: Option<Tensor> = None;
    for (output, leaf) in [(drafter_out, &out_leaf), (&states, &states_leaf)] {
        let grad = leaf.grad();
        if grad.defined() && output.requires_grad() {
            let term = (output * grad.detach()).sum(Kind::Float);
            total = Some(match total {
                Some(t) => t + term,
                None => term,
            });
        }
    }
    if let Some(total) = total {
        total.backward();
    }
    sums
}

/// The same sums without gradients (evaluation), at `lambda` = 0: `weighted_ce` is the
/// corrected logits' objective, `base_ce` the base logits'.
pub fn domino_ce(
    drafter_out: &Tensor,
    batch: &DominoBatch,
    objective: LossObjective,
    chunk_positions: i64,
) -> LossSums {
    tch::no_grad(|| {
        let states = batch
            .head
            .slot_states(batch.label_embeddings, batch.block_size);
        chunked_terms(
            drafter_out,
            &states,
            batch,
            objective,
            None,
            chunk_positions,
        )
    })
}

/// The chunk loop: per chunk of whole blocks, base and corrected logits, both objectives'
/// numerators and, when `backward` is given as `(λ, denominator)`, the blend's backward.
fn chunked_terms(
    out: &Tensor,
    states: &Tensor,
    batch: &DominoBatch,
    objective: LossObjective,
    backward: Option<(f64, f64)>,
    chunk_positions: i64,
) -> LossSums {
    let bs = batch.block_size;
    let size = out.size();
    let (sequences, q, hidden) = (size[0], size[1], size[2]);
    let device = out.device();
    let flat = out.reshape([-1, hidden]);
    let flat_states = states.reshape([-1, states.size()[2]]);
    let (idx, w) = weighted_positions(batch.weights);
    let division = MicroNormaliser::new(objective, batch.weights, &idx, bs);
    let positions = Vec::<i64>::try_from(&idx.to_device(Device::Cpu)).unwrap_or_default();
    let tgt = batch.targets.reshape([-1]).index_select(0, &idx);
    let lambda = backward.map_or(0.0, |(l, _)| l);
    let mut sums = LossSums::default();
    let mut base_weight = 0.0;
    let slots = sequences * q;
    let mut final_hit = Tensor::zeros([slots], (Kind::Bool, device));
    let mut base_hit = Tensor::zeros([slots], (Kind::Bool, device));
    let first_corrected = batch.head.config().suffix_start();
    for (start, len) in block_aligned_chunks(&positions, bs, chunk_positions) {
        let (start, len) = (start as i64, len as i64);
        let rows = idx.narrow(0, start, len);
        let z = flat.index_select(0, &rows);
        let base = z.matmul(&batch.lm_head.tr()).to_kind(Kind::Float);
        let corrected = rows
            .remainder(bs)
            .ge(first_corrected)
            .nonzero()
            .reshape([-1]);
        let correction = batch
            .head
            .correction(
                &z.index_select(0, &corrected),
                &flat_states
                    .index_select(0, &rows)
                    .index_select(0, &corrected),
            )
            .to_kind(Kind::Float);
        let corrected_logits = base.index_add(0, &corrected, &correction);
        let t = tgt.narrow(0, start, len);
        let ce = |logits: &Tensor| {
            logits.cross_entropy_loss::<Tensor>(&t, None, Reduction::None, -100, 0.0)
        };
        let (ce_final, ce_base) = (ce(&corrected_logits), ce(&base));
        let first_block = positions[start as usize] / bs;
        let blocks = positions[(start + len - 1) as usize] / bs - first_block + 1;
        let local = &rows - first_block * bs;
        // Each term's weights from its own logits (D-PACE, the tree objective), or DFlash's γ
        // decay for both.
        let weigh = |logits: &Tensor, ce: &Tensor| {
            block_objective_weights(objective, logits, ce, &t, &local, blocks, bs)
                .unwrap_or_else(|| (w.narrow(0, start, len), None))
        };
        let (w_final, reported_final) = weigh(&corrected_logits, &ce_final);
        let (w_base, reported_base) = weigh(&base, &ce_base);
        sums.weight += w_final.sum(Kind::Double).double_value(&[]);
        base_weight += w_base.sum(Kind::Double).double_value(&[]);
        let w_final = division.scaled(w_final, start, len);
        let w_base = division.scaled(w_base, start, len);
        let final_num = (&ce_final * &w_final).sum(Kind::Float);
        let base_num = (&ce_base * &w_base).sum(Kind::Float);
        let blended = &final_num * (1.0 - lambda) + &base_num * lambda;
        if let Some((_, denominator)) = backward {
            (&blended / denominator).backward();
        }
        let (final_value, base_value, blended_value) = match (reported_final, reported_base) {
            (Some(f), Some(b)) => (f, b, f * (1.0 - lambda) + b * lambda),
            _ => (
                final_num.double_value(&[]),
                base_num.double_value(&[]),
                blended.double_value(&[]),
            ),
        };
        tch::no_grad(|| {
            let final_eq = corrected_logits.argmax(-1, false).eq_tensor(&t);
            let base_eq = base.argmax(-1, false).eq_tensor(&t);
            let _ = final_hit.index_copy_(0, &rows, &final_eq);
            let _ = base_hit.index_copy_(0, &rows, &base_eq);
            sums.correct += final_eq.sum(Kind::Int64).int64_value(&[]) as u64;
        });
        sums.weighted_ce += blended_value;
        sums.final_ce += final_value;
        sums.base_ce += base_value;
        sums.counted += len as u64;
    }
    // DFlash's terms share their weights, so Σw is both terms' and the blend's.
    let weight_sum = match objective {
        LossObjective::Dflash => sums.weight,
        _ => (1.0 - lambda) * sums.weight + lambda * base_weight,
    };
    sums.normaliser = division.normaliser(weight_sum);
    let supervised = batch.weights.reshape([-1, bs]).gt(0.0);
    let (accepted, blocks) = accepted_counts(&final_hit.view([-1, bs]), &supervised);
    let (base_accepted, _) = accepted_counts(&base_hit.view([-1, bs]), &supervised);
    sums.accepted = accepted;
    sums.base_accepted = base_accepted;
    sums.accept_blocks = blocks;
    sums
}

/// SpecForge's `compute_accept_len` summed: over blocks (`[blocks, bs]`) with a supervised
/// slot, Σ (1 + the leading supervised slots whose prediction `hit` the label; unsupervised
/// slots are skipped), and the number of such blocks.
pub fn accepted_counts(hit: &Tensor, supervised: &Tensor) -> (f64, f64) {
    tch::no_grad(|| {
        let through = hit.logical_or(&supervised.logical_not());
        let run =
            through.to_kind(Kind::Int64).cumprod(1, Kind::Int64) * supervised.to_kind(Kind::Int64);
        let accepted = run.sum_dim_intlist(1, false, Kind::Int64);
        let counted = supervised.any_dim(1, false);
        let total = ((accepted + 1) * counted.to_kind(Kind::Int64)).sum(Kind::Int64);
        (
            total.int64_value(&[]) as f64,
            counted.sum(Kind::Int64).int64_value(&[]) as f64,
        )
    })
}

#[cfg(test)]
#[path = "domino_tests.rs"]
mod tests;
