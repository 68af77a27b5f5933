//! DFlash2's objective (SpecForge's `OnlineDFlashModel` with a `DFlash2DraftModel`:
//! `_dflash_objective_chunk_terms` and `_selector_chunk_terms`, `docs/concepts/DFlash2.md`).
//!
//! Each slot `k ≥ 1` of a block predicts `input_ids[anchor + k]` (DFlash's labels), from the
//! unary scores `U = cap(lm_head(h)·multiplier)`:
//!
//! - the base term is DFlash's (or D-PACE's, or the tree objective's) on `U`: `Σ CE(U, gold)·w`;
//! - the selector term rescores the unary top-K of each slot given the gold previous token (the
//!   anchor for slot 1), `S(c) = U(c) + ⟨A[prev] ⊙ W_h·h, B[c]⟩`, and takes its cross-entropy
//!   against the gold's place among the candidates **only where the gold is one of them**
//!   (strict, as SpecForge's main trains it: a miss is the backbone's recall failure, not a
//!   selection example), weighted by the base weights. vLLM's speculators instead injects a
//!   missing gold into the loss's candidate set.
//!
//! `loss = (Σ CE·w + α_eff·Σ CE_sel·w·[gold ∈ top-K]) / Σ w`, the denominator the base
//! objective's (so `training.dpace_normalization` scales both terms), `α_eff` the step's weight
//! from `[training.dflash2]`.
//!
//! The chunks hold whole blocks, every slot of them (as SpecForge's do): the weights of the
//! block objectives and the greedy walk that measures serving need each block entire.
use tch::{Device, Kind, Reduction, Tensor};

use super::block_objective::{
    block_aligned_chunks, block_objective_weights, LossObjective, MicroNormaliser,
};
use super::dflash2_sums::Dflash2Sums;
use super::loss::{weighted_positions, LossSums};
use crate::model::drafter::CandidateSelector;

/// The inputs of DFlash2's objective of one micro-batch besides the drafter's output.
#[derive(Clone, Copy)]
pub struct Dflash2Batch<'a> {
    pub selector: &'a CandidateSelector,
    /// `[V, H]`, frozen.
    pub lm_head: &'a Tensor,
    /// `[B, N·bs]` int64: DFlash's labels, slot 0 holding the anchor token.
    pub targets: &'a Tensor,
    /// `[B, N·bs]`: DFlash's γ-decayed weights, or the block objectives' 0/1 mask; positive
    /// exactly where a slot is supervised (never slot 0).
    pub weights: &'a Tensor,
    pub block_size: i64,
    /// `α_eff` of this step; at 0 the selector term is measured but not trained.
    pub selector_alpha: f64,
    /// The selector term sees `U` and `h` detached (it trains the selector alone).
    pub stop_gradient: bool,
}

/// One chunk's tensors over whole blocks: every slot's hidden state, unary scores and label.
struct ChunkBlocks {
    hidden: Tensor,
    unary: Tensor,
    targets: Tensor,
    /// The gold previous token of each slot (slot 0: itself, never weighted).
    previous: Tensor,
    /// `[n·bs]` bool: supervised slots.
    supervised: Tensor,
    /// The chunk's weighted positions' places among its slots.
    weighted: Tensor,
    blocks: i64,
}

/// Computes DFlash2's objective over `drafter_out` (`[B, N·bs, H]`, in the graph) and
/// backpropagates `numerator / denominator` into the drafter, chunk by chunk of whole blocks
/// (`chunk_positions` weighted positions at most, a block never split). `denominator` as in
/// `block_objective_backward`; the returned sums carry the micro-batch's part of the base
/// objective's normaliser, `weighted_ce` the whole numerator (base + α_eff·selector).
pub fn dflash2_backward(
    drafter_out: &Tensor,
    batch: &Dflash2Batch,
    objective: LossObjective,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let Dflash2Batch {
        lm_head,
        targets,
        weights,
        block_size: bs,
        ..
    } = *batch;
    let hidden = drafter_out.size().last().copied().unwrap_or(0);
    let (idx, given) = weighted_positions(weights);
    let division = MicroNormaliser::new(objective, weights, &idx, bs);
    let positions = Vec::<i64>::try_from(&idx.to_device(Device::Cpu)).unwrap_or_default();
    let chunks = block_aligned_chunks(&positions, bs, chunk_positions);
    let detached = (chunks.len() > 1).then(|| drafter_out.detach().set_requires_grad(true));
    let flat = detached
        .as_ref()
        .unwrap_or(drafter_out)
        .reshape([-1, hidden]);
    let flat_targets = targets.reshape([-1]);
    let flat_supervised = weights.reshape([-1]).gt(0.0);
    let mut sums = LossSums::default();
    for (start, len) in chunks {
        let chunk = &positions[start..start + len];
        let c = chunk_blocks(
            &flat,
            &flat_targets,
            &flat_supervised,
            lm_head,
            batch.selector,
            chunk,
            bs,
        );
        let ce_all =
            c.unary
                .cross_entropy_loss::<Tensor>(&c.targets, None, Reduction::None, -100, 0.0);
        let ce = ce_all.index_select(0, &c.weighted);
        let gold = c.targets.index_select(0, &c.weighted);
        let (w, reported) = match objective {
            LossObjective::Dflash => (given.narrow(0, start as i64, len as i64), None),
            // The block objectives weigh in f32, as they do on the LM head's logits.
            _ => block_objective_weights(
                objective,
                &c.unary.index_select(0, &c.weighted).to_kind(Kind::Float),
                &ce.to_kind(Kind::Float),
                &gold,
                &c.weighted,
                c.blocks,
                bs,
            )
            .expect("a block objective weighs its chunks"),
        };
        sums.weight += w.sum(Kind::Double).double_value(&[]);
        let w = division.scaled(w, start as i64, len as i64);
        let base = (&ce * &w).sum(ce.kind());
        let selector = selector_term(batch, &c, &w);
        let alpha = batch.selector_alpha;
        let numerator = if alpha > 0.0 {
            &base + &selector.numerator * alpha
        } else {
            base.shallow_clone()
        };
        if numerator.requires_grad() {
            (&numerator / denominator).backward();
        }
        let base_value = reported.unwrap_or_else(|| base.double_value(&[]));
        let selector_value = selector.numerator.double_value(&[]);
        sums.weighted_ce += base_value + alpha * selector_value;
        let d = &mut sums.dflash2;
        d.base_ce += base_value;
        d.selector_ce += selector_value;
        d.selector_weight += selector.weight;
        tch::no_grad(|| {
            let hits = c.unary.argmax(-1, false).eq_tensor(&c.targets);
            sums.correct += hits
                .index_select(0, &c.weighted)
                .sum(Kind::Int64)
                .int64_value(&[]) as u64;
            sums.counted += len as u64;
            let measured = measure(batch, &c, &selector, &hits);
            sums.dflash2.add(&measured);
        });
    }
    if let Some(grad) = detached.map(|d| d.grad()).filter(Tensor::defined) {
        (drafter_out * grad.detach()).sum(Kind::Float).backward();
    }
    sums.normaliser = division.normaliser(sums.weight);
    sums
}

/// The chunk's blocks (those of its weighted `positions`, in order), every slot of them.
fn chunk_blocks(
    flat: &Tensor,
    flat_targets: &Tensor,
    flat_supervised: &Tensor,
    lm_head: &Tensor,
    selector: &CandidateSelector,
    positions: &[i64],
    bs: i64,
) -> ChunkBlocks {
    let device = flat.device();
    let mut blocks: Vec<i64> = positions.iter().map(|p| p / bs).collect();
    blocks.dedup();
    let weighted: Vec<i64> = positions
        .iter()
        .map(|p| {
            let block = blocks.partition_point(|&b| b < p / bs) as i64;
            block * bs + p % bs
        })
        .collect();
    let n = blocks.len() as i64;
    let block_ids = Tensor::from_slice(&blocks).to_device(device);
    let rows =
        (block_ids.unsqueeze(1) * bs + Tensor::arange(bs, (Kind::Int64, device))).reshape([-1]);
    let hidden = flat.index_select(0, &rows);
    let logits = hidden.matmul(&lm_head.tr());
    ChunkBlocks {
        unary: selector.unary(&logits),
        hidden,
        targets: flat_targets.index_select(0, &rows),
        previous: flat_targets.index_select(0, &(&rows - 1).clamp_min(0)),
        supervised: flat_supervised.index_select(0, &rows),
        weighted: Tensor::from_slice(&weighted).to_device(device),
        blocks: n,
    }
}

/// The selector's scores and cross-entropy over one chunk.
struct SelectorTerm {
    /// `Σ CE_sel·w·[gold ∈ top-K]` (in the graph when the step trains the selector).
    numerator: Tensor,
    /// `Σ w·[gold ∈ top-K]`.
    weight: f64,
    /// `[n·bs, K]`: candidates, unary scores and teacher-forced scores of every slot.
    candidates: Tensor,
    unary_top: Tensor,
    scores: Tensor,
    /// `[n·bs]` bool: the gold is a candidate.
    covered: Tensor,
}

fn selector_term(batch: &Dflash2Batch, c: &ChunkBlocks, w: &Tensor) -> SelectorTerm {
    let compute = || {
        let (hidden, unary) = if batch.stop_gradient {
            (c.hidden.detach(), c.unary.detach())
        } else {
            (c.hidden.shallow_clone(), c.unary.shallow_clone())
        };
        let (unary_top, candidates) = batch.selector.candidates(&unary);
        let scores = batch
            .selector
            .score(&candidates, &unary_top, &hidden, &c.previous);
        let matches = candidates.eq_tensor(&c.targets.unsqueeze(-1));
        let covered = matches.any_dim(-1, false);
        let place = matches.to_kind(Kind::Int64).argmax(-1, false);
        let ce = scores.cross_entropy_loss::<Tensor>(&place, None, Reduction::None, -100, 0.0);
        let selector_w = w * covered.index_select(0, &c.weighted).to_kind(Kind::Float);
        let numerator = (ce.index_select(0, &c.weighted) * &selector_w).sum(ce.kind());
        SelectorTerm {
            numerator,
            weight: selector_w.sum(Kind::Double).double_value(&[]),
            candidates,
            unary_top,
            scores,
            covered,
        }
    };
    if batch.selector_alpha > 0.0 {
        compute()
    } else {
        tch::no_grad(compute)
    }
}

/// The chunk's acceptance sums: coverage, the teacher-forced and the serving picks, and the
/// accepted lengths of the oracle, the greedy walk and the unary argmax (`unary_hits`).
fn measure(
    batch: &Dflash2Batch,
    c: &ChunkBlocks,
    s: &SelectorTerm,
    unary_hits: &Tensor,
) -> Dflash2Sums {
    let (n, bs) = (c.blocks, batch.block_size);
    let supervised = c.supervised.view([n, bs]);
    let sup = supervised.to_kind(Kind::Double);
    let covered = s.covered.view([n, bs]);
    let pick = s
        .candidates
        .gather(1, &s.scores.argmax(-1, true), false)
        .squeeze_dim(1);
    let conditional = pick.eq_tensor(&c.targets).view([n, bs]);
    let grid = |t: &Tensor| t.view([n, bs, -1]).narrow(1, 1, bs - 1);
    let path = batch.selector.greedy_path(
        &grid(&s.candidates),
        &grid(&s.unary_top),
        &grid(&c.hidden.detach()),
        &c.targets.view([n, bs]).select(1, 0),
    );
    let gold = c.targets.view([n, bs]).narrow(1, 1, bs - 1);
    let walked = path.eq_tensor(&gold);
    let after_anchor = supervised.narrow(1, 1, bs - 1);
    let sum = |t: &Tensor| t.to_kind(Kind::Double).sum(Kind::Double).double_value(&[]);
    let accepted = |hits: &Tensor| {
        let chain = hits
            .logical_and(&after_anchor)
            .to_kind(Kind::Double)
            .cumprod(1, Kind::Double);
        let blocks = after_anchor.any_dim(1, false);
        sum(&((chain.sum_dim_intlist(1, false, Kind::Double) + 1.0) * blocks.to_kind(Kind::Double)))
    };
    Dflash2Sums {
        supervised: sum(&sup),
        covered: sum(&covered.logical_and(&supervised)),
        conditional_correct: sum(&conditional.logical_and(&covered).logical_and(&supervised)),
        serving_correct: sum(&walked.logical_and(&after_anchor)),
        oracle_accepted: accepted(&covered.narrow(1, 1, bs - 1)),
        serving_accepted: accepted(&walked),
        unary_accepted: accepted(&unary_hits.view([n, bs]).narrow(1, 1, bs - 1)),
        blocks: sum(&after_anchor.any_dim(1, false)),
        ..Dflash2Sums::default()
    }
}

#[cfg(test)]
#[path = "dflash2_tests.rs"]
mod tests;
