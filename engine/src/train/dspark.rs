//! Training a DSpark drafter (`model/drafter/dspark.rs`): the objective SpecForge's
//! `OnlineDSparkModel` trains (`specforge/algorithms/common/dflash_family_model.py:714-1107`,
//! a6b6b023).
//!
//! Slot `k` of a block (slot 0 included) drafts the token after `a + k`
//! ([`next_token_block_labels`](super::labels::next_token_block_labels)), with mask `m_k`
//! (prefix-cumulative) and weight `w_k = m_k · exp(−k/γ)`. With the drafter's output `h_k`,
//! the token before the slot `prev_k`, and the target's own final-normed last hidden state at
//! `a + k`, `T_k` (the state from which the target predicts the same token):
//!
//! ```text
//! logits_k = lm_head(h_k) + W₂ · u_k            (u_k the Markov latent; no head: no bias)
//! q_k = softmax(logits_k)        p_k = softmax(lm_head(T_k))          (p: no gradient)
//! CE_k = −log q_k[label_k]
//! L1_k = Σ_v |q_k − p_k|         a_k = clamp(1 − L1_k / 2, 0, 1)
//! BCE_k = BCE-with-logits(c_k, a_k)   (c_k the confidence logit; a_k detached)
//! numerator = ce · Σ w·CE + l1 · Σ w·L1 + confidence · Σ w·BCE,   normaliser = Σ w
//! ```
//!
//! (`_dspark_objective_chunk_terms`, :823-944; the weights are `[training.dspark]`). `a_k` is
//! the probability that the target accepts a token drawn from `q_k`: `Σ_v min(q, p)`. Nothing
//! else is detached: the L1 term trains the backbone and the Markov head through `q`, and the
//! confidence head reads `h_k` (and `W₁[prev_k]`) undetached, so its BCE trains them too
//! (`predict_confidence`, :883-886). SpecForge's loss is `world_size · numerator / Σ_ranks Σw`
//! under FSDP's gradient mean (:1011-1029), the gradient of `Σ_ranks numerator / Σ_ranks Σw`:
//! each micro-batch here backpropagates its numerator and reports Σw as its `normaliser`, and
//! the step divides the summed gradient by the summed normaliser. Where SpecForge raises on a
//! batch without a supervised slot, the sums here are zero (no gradient, normaliser 0).
//!
//! The logits are formed in f32 (SpecForge adds the bias to the LM head's logits in the
//! model's dtype and takes the cross-entropy there; the softmaxes are f32 in both).
//!
//! Chunking as `train/domino.rs`: the Markov latents (`[…, r]`, small) are formed for every
//! slot at once (the RNN's recurrence needs whole blocks); the vocabulary-wide tensors (the
//! corrected, base and teacher logits and their softmaxes) only for the supervised slots of
//! whole blocks at a time, each chunk backpropagated into detached copies of the drafter's
//! output and of the latents, which then backpropagate once into the drafter and the head.
use dflash_shared::config::DsparkSection;
use tch::{Device, Kind, Reduction, Tensor};

use super::block_objective::block_aligned_chunks;
use super::labels::BlockLabels;
use super::loss::{DsparkSums, LossSums};
use crate::model::drafter::{at_least_f32, DsparkHead};

/// The weights of DSpark's three terms (`[training.dspark]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DsparkLossWeights {
    pub ce: f64,
    pub l1: f64,
    pub confidence: f64,
}

impl Default for DsparkLossWeights {
    /// SpecForge's: `[training.dspark]` left out.
    fn default() -> Self {
        Self::from(&DsparkSection::default())
    }
}

impl From<&DsparkSection> for DsparkLossWeights {
    fn from(section: &DsparkSection) -> Self {
        Self {
            ce: section.ce,
            l1: section.l1,
            confidence: section.confidence,
        }
    }
}

/// The DSpark inputs of one micro-batch besides the drafter's output.
pub struct DsparkBatch<'a> {
    pub head: &'a DsparkHead,
    /// `[V, H]`, frozen.
    pub lm_head: &'a Tensor,
    /// `[B, N·bs]` int64: each slot's label, the token after `a + k`.
    pub targets: &'a Tensor,
    /// `[B, N·bs]` int64: the token before each slot, what the Markov head reads
    /// ([`next_token_prev_ids`](super::labels::next_token_prev_ids)).
    pub prev_tokens: &'a Tensor,
    /// `[B, N·bs]`: `w_k = m_k · exp(−k/γ)`.
    pub weights: &'a Tensor,
    /// `[B, N·bs]` bool: the mask `m_k` (`BlockLabels::valid`, SpecForge's `eval_mask`), over
    /// which accuracy and acceptance are counted; prefix-cumulative within each block.
    pub valid: &'a Tensor,
    /// `[B, N·bs, H]`: the target's last hidden state predicting each slot's label
    /// ([`teacher_hidden_for_slots`]).
    pub teacher_hidden: &'a Tensor,
    pub block_size: i64,
    pub loss_weights: DsparkLossWeights,
}

/// [`DsparkBatch`]'s tensors, owned: built once per micro-batch (training) or anchor chunk
/// (evaluation) from the host-side labels, on the device of the target's last hidden state.
pub struct DsparkInputs {
    targets: Tensor,
    prev_tokens: Tensor,
    weights: Tensor,
    valid: Tensor,
    teacher_hidden: Tensor,
    block_size: i64,
    loss_weights: DsparkLossWeights,
}

impl DsparkInputs {
    /// `labels` are the next-token labels of the blocks at `anchors` (`[B, N]`, with `keep`),
    /// flattened `[B, N·bs]`; `prev_tokens` the token before each slot; `last_hidden` the
    /// target's final-normed last hidden state `[B, S, H]` on the drafter's device, in the LM
    /// head's dtype.
    pub fn new(
        labels: &BlockLabels,
        prev_tokens: &[i64],
        last_hidden: &Tensor,
        (anchors, keep): (&Tensor, &Tensor),
        block_size: i64,
        loss_weights: DsparkLossWeights,
    ) -> Self {
        let (batch, blocks) = (anchors.size()[0], anchors.size()[1]);
        let on_device = |t: Tensor| {
            t.view([batch, blocks * block_size])
                .to_device(last_hidden.device())
        };
        let valid: Vec<u8> = labels.valid.iter().map(|&v| u8::from(v)).collect();
        Self {
            targets: on_device(Tensor::from_slice(&labels.targets)),
            prev_tokens: on_device(Tensor::from_slice(prev_tokens)),
            weights: on_device(Tensor::from_slice(&labels.weights)),
            valid: on_device(Tensor::from_slice(&valid).to_kind(Kind::Bool)),
            teacher_hidden: tch::no_grad(|| {
                teacher_hidden_for_slots(last_hidden, anchors, keep, block_size)
            }),
            block_size,
            loss_weights,
        }
    }

    /// Lent to the loss with the drafter's head and the frozen LM head.
    pub fn batch<'a>(&'a self, head: &'a DsparkHead, lm_head: &'a Tensor) -> DsparkBatch<'a> {
        DsparkBatch {
            head,
            lm_head,
            targets: &self.targets,
            prev_tokens: &self.prev_tokens,
            weights: &self.weights,
            valid: &self.valid,
            teacher_hidden: &self.teacher_hidden,
            block_size: self.block_size,
            loss_weights: self.loss_weights,
        }
    }
}

/// The target's final-normed last hidden states `[B, S, H]` gathered per slot: `[B, N·bs, H]`,
/// slot `k` of the block at `anchors[b, j]` reading position `min(a + k + 1, S − 1) − 1`
/// (`a + k`, whose next-token distribution is the slot's label's), position 0 in an unkept
/// block (`_aligned_target_hidden`, dflash_family_model.py:804-821). Slots past the row's end
/// read a clamped position; their weight is 0.
pub fn teacher_hidden_for_slots(
    last_hidden: &Tensor,
    anchors: &Tensor,
    keep: &Tensor,
    block_size: i64,
) -> Tensor {
    let size = last_hidden.size();
    let (batch, seq_len, hidden) = (size[0], size[1], size[2]);
    let device = last_hidden.device();
    let anchors = anchors.to_device(device).to_kind(Kind::Int64);
    let keep = keep.to_device(device).to_kind(Kind::Bool).unsqueeze(-1);
    let offsets = Tensor::arange_start(1, block_size + 1, (Kind::Int64, device)).view([1, 1, -1]);
    let labels = (anchors.unsqueeze(-1) + offsets).clamp_max(seq_len - 1);
    let labels = labels.where_self(&keep, &labels.zeros_like());
    let positions = (labels - 1).clamp_min(0).view([batch, -1, 1]);
    let slots = positions.size()[1];
    last_hidden.gather(1, &positions.expand([batch, slots, hidden], false), false)
}

/// Computes DSpark's numerator over `drafter_out` (`[B, N·bs, H]`, in the graph) and
/// backpropagates it divided by `denominator` into the drafter and both heads, chunk by chunk
/// of whole blocks of at most `chunk_positions` supervised slots. Returns the sums:
/// `weighted_ce` the numerator, `weight` and `normaliser` Σw, `correct`/`counted` and
/// [`DsparkSums`] the telemetry.
pub fn dspark_backward(
    drafter_out: &Tensor,
    batch: &DsparkBatch,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let latents = markov_latents(drafter_out, batch);
    let out_leaf = drafter_out.detach().set_requires_grad(true);
    let latent_leaf = latents.as_ref().map(|l| l.detach().set_requires_grad(true));
    let sums = chunked_terms(
        &out_leaf,
        latent_leaf.as_ref(),
        batch,
        Some(denominator),
        chunk_positions,
    );
    // One backward into the drafter and the Markov head from the gradients the chunks left on
    // the leaves: d/d(x) Σ(x·g) is exactly g.
    let mut total: Option<Tensor> = None;
    let pairs = [
        (Some(drafter_out), Some(&out_leaf)),
        (latents.as_ref(), latent_leaf.as_ref()),
    ];
    for (output, leaf) in pairs {
        let (Some(output), Some(leaf)) = (output, leaf) else {
            continue;
        };
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

/// The same sums without gradients (evaluation).
pub fn dspark_loss(drafter_out: &Tensor, batch: &DsparkBatch, chunk_positions: i64) -> LossSums {
    tch::no_grad(|| {
        let latents = markov_latents(drafter_out, batch);
        chunked_terms(drafter_out, latents.as_ref(), batch, None, chunk_positions)
    })
}

/// The Markov head's teacher-forced latents of every slot, `[B, N·bs, r]`; `None` without
/// a Markov head.
fn markov_latents(drafter_out: &Tensor, batch: &DsparkBatch) -> Option<Tensor> {
    let markov = batch.head.markov()?;
    let size = drafter_out.size();
    let bs = batch.block_size;
    let prev = batch
        .prev_tokens
        .to_device(drafter_out.device())
        .reshape([-1, bs]);
    let latents = markov.block_latents(&prev, &drafter_out.reshape([-1, bs, size[2]]));
    Some(latents.reshape([size[0], size[1], markov.rank()]))
}

/// Index of each telemetry sum in a chunk's `[STATS]` vector.
mod stat {
    pub const NUMERATOR: i64 = 0;
    pub const WEIGHT: i64 = 1;
    pub const CORRECT: i64 = 2;
    /// Then [`super::DsparkSums`]'s first nine fields in order, `ce` to `draft_top1`.
    pub const CE: i64 = 3;
    pub const BASE_CORRECT: i64 = 12;
    pub const LEN: i64 = 13;
}

/// The chunk loop: per chunk of whole blocks of supervised slots, the terms, their
/// numerator's backward when `backward` holds the denominator, and the telemetry; then the
/// acceptance per block from the slots' `a_k`.
fn chunked_terms(
    out: &Tensor,
    latents: Option<&Tensor>,
    batch: &DsparkBatch,
    backward: Option<f64>,
    chunk_positions: i64,
) -> LossSums {
    let bs = batch.block_size;
    let size = out.size();
    let (hidden, slots) = (size[2], size[0] * size[1]);
    let device = out.device();
    let valid = batch
        .valid
        .to_device(device)
        .reshape([-1])
        .to_kind(Kind::Bool);
    let idx = valid.nonzero().reshape([-1]);
    let positions = Vec::<i64>::try_from(&idx.to_device(Device::Cpu)).unwrap_or_default();
    let select = |t: &Tensor| t.to_device(device).reshape([-1]).index_select(0, &idx);
    let (targets, prev, weights) = (
        select(batch.targets),
        select(batch.prev_tokens),
        select(batch.weights),
    );
    let flat = out.reshape([-1, hidden]);
    let flat_teacher = batch.teacher_hidden.reshape([-1, hidden]);
    let flat_latents = latents.map(|l| l.reshape([slots, -1]));
    let mut stats = Tensor::zeros([stat::LEN], (Kind::Double, device));
    let mut accept = Tensor::zeros([slots], (Kind::Double, device));
    let mut base_accept = Tensor::zeros([slots], (Kind::Double, device));
    let mut hit = Tensor::zeros([slots], (Kind::Double, device));
    let mut base_hit = Tensor::zeros([slots], (Kind::Double, device));
    for (start, len) in block_aligned_chunks(&positions, bs, chunk_positions) {
        let (start, len) = (start as i64, len as i64);
        let rows = idx.narrow(0, start, len);
        let chunk = ChunkInputs {
            z: flat.index_select(0, &rows),
            latent: flat_latents.as_ref().map(|l| l.index_select(0, &rows)),
            teacher: flat_teacher.index_select(0, &rows.to_device(flat_teacher.device())),
            targets: targets.narrow(0, start, len),
            prev: prev.narrow(0, start, len),
            weights: weights.narrow(0, start, len),
        };
        let terms = chunk_terms(&chunk, batch);
        if let Some(denominator) = backward {
            (&terms.numerator / denominator).backward();
        }
        tch::no_grad(|| {
            stats += &terms.stats;
            let _ = accept.index_copy_(0, &rows, &terms.accept);
            let _ = base_accept.index_copy_(0, &rows, &terms.base_accept);
            let _ = hit.index_copy_(0, &rows, &terms.hit);
            let _ = base_hit.index_copy_(0, &rows, &terms.base_hit);
        });
    }
    let mask = valid.to_kind(Kind::Double).view([-1, bs]);
    let (tau, tau_blocks) = expected_accepted(&accept.view([-1, bs]), &mask);
    let (base_tau, _) = expected_accepted(&base_accept.view([-1, bs]), &mask);
    // The same chain over 0/1 hits is the teacher-forced greedy acceptance.
    let (greedy_tau, _) = expected_accepted(&hit.view([-1, bs]), &mask);
    let (base_greedy_tau, _) = expected_accepted(&base_hit.view([-1, bs]), &mask);
    let stats = Vec::<f64>::try_from(&stats.to_device(Device::Cpu)).unwrap_or_default();
    let mut dspark = [0.0; DsparkSums::LEN];
    dspark[..9].copy_from_slice(&stats[stat::CE as usize..stat::CE as usize + 9]);
    let mut dspark = DsparkSums::from_array(dspark);
    (dspark.tau, dspark.base_tau, dspark.tau_blocks) = (tau, base_tau, tau_blocks);
    dspark.base_correct = stats[stat::BASE_CORRECT as usize];
    (dspark.greedy_tau, dspark.base_greedy_tau) = (greedy_tau, base_greedy_tau);
    LossSums {
        weighted_ce: stats[stat::NUMERATOR as usize],
        weight: stats[stat::WEIGHT as usize],
        normaliser: stats[stat::WEIGHT as usize],
        correct: stats[stat::CORRECT as usize] as u64,
        counted: positions.len() as u64,
        dspark,
        ..LossSums::default()
    }
}

/// SpecForge's `tau_probabilistic` summed (dflash_family_model.py:922-927): over blocks
/// (`[blocks, bs]`) with a supervised slot, Σ (1 + Σ_k Π_{i≤k} a_i·m_i), and the number of
/// those blocks.
fn expected_accepted(accept: &Tensor, mask: &Tensor) -> (f64, f64) {
    tch::no_grad(|| {
        let run = (accept * mask).cumprod(1, Kind::Double);
        let expected = run.sum_dim_intlist(1, false, Kind::Double) + 1.0;
        let counted = mask.sum_dim_intlist(1, false, Kind::Double).gt(0.0);
        let blocks = counted.to_kind(Kind::Double);
        (
            (expected * &blocks).sum(Kind::Double).double_value(&[]),
            blocks.sum(Kind::Double).double_value(&[]),
        )
    })
}

/// One chunk's rows: the drafter's output, the Markov latents, the teacher's states, the
/// labels, previous tokens and weights.
struct ChunkInputs {
    z: Tensor,
    latent: Option<Tensor>,
    teacher: Tensor,
    targets: Tensor,
    prev: Tensor,
    weights: Tensor,
}

/// What one chunk contributes: the numerator (in the graph), the telemetry (`[stat::LEN]`,
/// f64), each row's acceptance probability and whether its argmax is the label, from the
/// corrected and from the base logits.
struct ChunkTerms {
    numerator: Tensor,
    stats: Tensor,
    accept: Tensor,
    base_accept: Tensor,
    hit: Tensor,
    base_hit: Tensor,
}

/// The module doc's formulas at one chunk's rows.
fn chunk_terms(chunk: &ChunkInputs, batch: &DsparkBatch) -> ChunkTerms {
    let lm_head = batch.lm_head;
    let base = at_least_f32(&chunk.z.matmul(&lm_head.tr()));
    let kind = base.kind();
    let corrected = match (&chunk.latent, batch.head.markov()) {
        (Some(latent), Some(markov)) => &base + markov.project(latent).to_kind(kind),
        _ => base.shallow_clone(),
    };
    let targets = &chunk.targets;
    let weights = chunk.weights.to_kind(kind);
    let ce = corrected.cross_entropy_loss::<Tensor>(targets, None, Reduction::None, -100, 0.0);
    let teacher = tch::no_grad(|| {
        at_least_f32(&chunk.teacher.to_device(base.device()).matmul(&lm_head.tr()))
            .to_kind(kind)
            .softmax(-1, kind)
    });
    let q = corrected.softmax(-1, kind);
    let l1 = (&q - &teacher).abs().sum_dim_intlist(-1, false, kind);
    let accept = tch::no_grad(|| (l1.detach() * -0.5 + 1.0).clamp(0.0, 1.0));
    let confidence = batch
        .head
        .confidence_logit(&chunk.z, &chunk.prev)
        .map(|c| c.to_kind(kind));
    let bce = confidence.as_ref().map(|c| {
        c.binary_cross_entropy_with_logits::<Tensor>(&accept, None, None, Reduction::None)
    });
    let weighted = |t: &Tensor| (t * &weights).sum(kind);
    let (ce_sum, l1_sum) = (weighted(&ce), weighted(&l1));
    let lw = batch.loss_weights;
    let bce_sum = bce.as_ref().map(weighted);
    let logit_terms = &ce_sum * lw.ce + &l1_sum * lw.l1;
    let numerator = match &bce_sum {
        Some(bce_sum) => logit_terms + bce_sum * lw.confidence,
        None => logit_terms,
    };
    tch::no_grad(|| {
        let sum = |t: &Tensor| t.sum(Kind::Double);
        let count = |hits: &Tensor| hits.sum(Kind::Double);
        let zero = || Tensor::zeros([], (Kind::Double, base.device()));
        let predicted = corrected.argmax(-1, false);
        let probability = confidence.as_ref().map(Tensor::sigmoid);
        let base_q = base.softmax(-1, kind);
        let base_l1 = (&base_q - &teacher).abs().sum_dim_intlist(-1, false, kind);
        let stats = Tensor::stack(
            &[
                sum(&numerator),
                sum(&weights),
                count(&predicted.eq_tensor(targets)),
                sum(&ce_sum),
                sum(&l1_sum),
                bce_sum.as_ref().map_or_else(zero, sum),
                probability
                    .as_ref()
                    .map_or_else(zero, |s| sum(&((s - &accept).abs() * &weights))),
                probability.as_ref().map_or_else(zero, sum),
                sum(&accept),
                count(&predicted.eq_tensor(&teacher.argmax(-1, false))),
                sum(&teacher.amax(-1, false)),
                sum(&q.amax(-1, false)),
                count(&base.argmax(-1, false).eq_tensor(targets)),
            ],
            0,
        );
        ChunkTerms {
            numerator: numerator.shallow_clone(),
            stats,
            accept: accept.to_kind(Kind::Double),
            base_accept: (base_l1 * -0.5 + 1.0).clamp(0.0, 1.0).to_kind(Kind::Double),
            hit: predicted.eq_tensor(targets).to_kind(Kind::Double),
            base_hit: base
                .argmax(-1, false)
                .eq_tensor(targets)
                .to_kind(Kind::Double),
        }
    })
}

#[cfg(test)]
#[path = "dspark_tests.rs"]
mod tests;
