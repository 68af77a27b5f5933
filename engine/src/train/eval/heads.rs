//! The heads whose evaluation is their own objective's figures rather than DFlash's slots:
//! DSpark (SpecForge's `OnlineDSparkModel` figures on next-token labels, teacher from the
//! target's last hidden state) and DFlash2 (the selector objective's figures on DFlash's
//! labels). Every valid position is an anchor, as for DFlash.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::{BlockScorer, EvalOptions, EvalReport};
use crate::model::drafter::{CandidateSelector, Drafter, DsparkHead};
use crate::train::anchors::AnchorBatch;
use crate::train::block_objective::LossObjective;
use crate::train::dflash2::{dflash2_backward, Dflash2Batch};
use crate::train::dspark::{dspark_loss, DsparkInputs};
use crate::train::labels::{block_labels, next_token_block_labels, next_token_prev_ids, Rows};
use crate::train::loss::LossSums;
use crate::train::replica::TargetStates;

/// [`EvalReport::dspark`]: DSpark's loss, its three terms and what they measure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DsparkEval {
    /// `(ce·Σ CE·w + l1·Σ L1·w + confidence·Σ BCE·w) / Σ w` at the weights it was computed with.
    pub loss: f64,
    pub ce_loss: f64,
    pub l1_loss: f64,
    pub confidence_loss: f64,
    pub tau_probabilistic: f64,
    /// `tau_probabilistic` from the LM head's logits alone (the Markov head off).
    pub base_tau_probabilistic: f64,
    /// The teacher-forced greedy chain τ (1 + the leading slots whose argmax is the label),
    /// with and without the Markov head: the report's `tau` and `base_tau`, comparable with
    /// online chain τ. Reports from before them read 0.
    #[serde(default)]
    pub greedy_tau: f64,
    #[serde(default)]
    pub base_greedy_tau: f64,
    /// `acc`: the corrected logits' argmax against the label, over the supervised slots.
    pub acc: f64,
    pub base_acc: f64,
    /// Mean acceptance probability `a = 1 − L1/2` of the supervised slots.
    pub acceptance_mean: f64,
    /// Mean σ(confidence logit) and its mean absolute error against `a`; `None` without a
    /// confidence head.
    pub confidence_mean: Option<f64>,
    pub confidence_abs_error: Option<f64>,
    /// The loss weights `loss` was computed with.
    pub weights: [f64; 3],
}

impl BlockScorer<'_> {
    /// A DSpark or a DFlash2 drafter's chunk scored by its own objective (`None` for another
    /// head, which the DFlash scorer scores).
    pub(super) fn score_own_objective(
        &self,
        states: TargetStates<'_>,
        chunk: &OwnObjectiveChunk,
    ) -> Option<LossSums> {
        if let Some(head) = self.drafter.dspark() {
            return Some(self.score_dspark(head, states, chunk));
        }
        self.drafter
            .selector()
            .map(|selector| self.score_dflash2(selector, chunk))
    }

    /// A DFlash2 drafter's chunk: its objective's sums on DFlash's labels, at the configured α.
    fn score_dflash2(&self, selector: &CandidateSelector, chunk: &OwnObjectiveChunk) -> LossSums {
        let (bs, opts) = (self.bs, self.opts);
        let device = chunk.out.device();
        let shape = [chunk.rows.batch as i64, (chunk.anchors.width * bs) as i64];
        let on_device = |t: Tensor| t.view(shape).to_device(device);
        let labels = block_labels(chunk.rows, chunk.anchors, bs, Some(opts.gamma), opts.rule);
        let (targets, weights) = (
            on_device(Tensor::from_slice(&labels.targets)),
            on_device(Tensor::from_slice(&labels.weights)),
        );
        let batch = Dflash2Batch {
            selector,
            lm_head: &self.lm_head,
            targets: &targets,
            weights: &weights,
            block_size: bs as i64,
            selector_alpha: opts.selector_alpha,
            stop_gradient: false,
        };
        dflash2_backward(
            chunk.out,
            &batch,
            LossObjective::Dflash,
            1.0,
            opts.chunk_positions.max(1),
        )
    }

    /// A DSpark drafter's chunk: its loss sums on the next-token labels, every slot's teacher
    /// the target's last hidden state at the slot's label − 1.
    fn score_dspark(
        &self,
        head: &DsparkHead,
        states: TargetStates<'_>,
        chunk: &OwnObjectiveChunk,
    ) -> LossSums {
        let (bs, opts) = (self.bs, self.opts);
        let device = chunk.out.device();
        let labels = next_token_block_labels(chunk.rows, chunk.anchors, bs, Some(opts.gamma));
        let last_hidden = states
            .last_hidden
            .expect("a DSpark drafter's evaluation asks the target for its last hidden state");
        let inputs = DsparkInputs::new(
            &labels,
            &next_token_prev_ids(chunk.rows, chunk.anchors, bs),
            last_hidden,
            (
                &chunk.anchor_t.to_device(device),
                &chunk.keep_t.to_device(device),
            ),
            bs as i64,
            opts.dspark,
        );
        let batch = inputs.batch(head, &self.lm_head);
        dspark_loss(chunk.out, &batch, opts.chunk_positions.max(1))
    }
}

/// What [`BlockScorer::score_own_objective`] reads of one anchor chunk.
pub(super) struct OwnObjectiveChunk<'a> {
    pub rows: Rows<'a>,
    pub anchors: &'a AnchorBatch,
    pub anchor_t: &'a Tensor,
    pub keep_t: &'a Tensor,
    pub out: &'a Tensor,
}

/// The report of a drafter scored by its own objective; `None` for another head.
pub(super) fn own_objective_report(
    sums: &LossSums,
    drafter: &Drafter,
    samples: usize,
    opts: &EvalOptions,
) -> Option<EvalReport> {
    if drafter.dspark().is_some() {
        return Some(dspark_report(sums, drafter, samples, opts));
    }
    let selector = drafter.selector()?;
    let m = sums.dflash2.metrics(sums.normaliser);
    let dflash2 = Dflash2Eval {
        loss: sums.loss(),
        base_loss: m.base_loss,
        selector_loss: m.selector_loss,
        selector_alpha: opts.selector_alpha,
        top_k: selector.top_k() as usize,
        unary_topk_recall: m.unary_topk_recall,
        oracle_accepted_length: m.oracle_accepted_length,
        conditional_accuracy: m.conditional_accuracy,
        serving_accuracy: m.serving_accuracy,
        serving_accepted_length: m.serving_accepted_length,
        unary_accepted_length: m.unary_accepted_length,
    };
    Some(EvalReport {
        tau: m.serving_accepted_length,
        base_tau: Some(m.unary_accepted_length),
        loss: dflash2.loss,
        accuracy: sums.accuracy(),
        blocks: sums.dflash2.blocks as u64,
        dspark: None,
        dflash2: Some(dflash2),
        ..headline_only(sums, drafter, samples, opts)
    })
}

/// The fields of a report by a head's own objective that are not that objective's: the
/// options it ran with and the counts, with DFlash's per-slot rates and tree oracle empty.
fn headline_only(
    sums: &LossSums,
    drafter: &Drafter,
    samples: usize,
    opts: &EvalOptions,
) -> EvalReport {
    EvalReport {
        tau: 0.0,
        loss: 0.0,
        loss_dflash: 0.0,
        loss_dpace: 0.0,
        dpace_alpha: opts.dpace_alpha,
        dpace_normalization: opts.dpace_normalization,
        accuracy: 0.0,
        per_position_acceptance: Vec::new(),
        topk_recall: BTreeMap::new(),
        tau_tree_oracle: BTreeMap::new(),
        tree_blocks: 0,
        tree_block_subsample: opts.tree_block_subsample.max(1),
        serve_tree_budget: opts.serve_tree_budget,
        tau_tree_serve: None,
        block_size: drafter.config().block_size as usize,
        samples,
        blocks: 0,
        positions: sums.counted,
        base_tau: None,
        dspark: None,
        dflash2: None,
    }
}

/// [`EvalReport::dflash2`]: the selector objective's figures, SpecForge's names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dflash2Eval {
    /// `(Σ CE·w + α·Σ CE_sel·w·[covered]) / Σ w`.
    pub loss: f64,
    /// The base term alone over Σ w.
    pub base_loss: f64,
    /// `dflash2/selector/loss`: the selector's CE over the covered slots' weights.
    pub selector_loss: f64,
    /// The α `loss` was computed with.
    pub selector_alpha: f64,
    /// K, the candidates per slot.
    pub top_k: usize,
    /// `dflash/hard_label/unary_top{K}_recall`.
    pub unary_topk_recall: f64,
    /// `unary_top{K}_oracle_accepted_length`: a perfect selector's chain.
    pub oracle_accepted_length: f64,
    /// `dflash2/selector/conditional_accuracy`: teacher-forced picks over covered slots.
    pub conditional_accuracy: f64,
    /// `dflash2/selector/serving_accuracy` and `serving_accepted_length`: the greedy walk from
    /// the anchor, each pick the next slot's predecessor.
    pub serving_accuracy: f64,
    pub serving_accepted_length: f64,
    /// The same chain from the unary argmax (the selector off).
    pub unary_accepted_length: f64,
}

/// A DSpark drafter's report: SpecForge's figures in [`EvalReport::dspark`] and the headline
/// fields; nothing of DFlash's slots.
fn dspark_report(
    sums: &LossSums,
    drafter: &Drafter,
    samples: usize,
    opts: &EvalOptions,
) -> EvalReport {
    let m = sums.dspark_metrics();
    let confidence = drafter.dspark().is_some_and(|h| h.has_confidence_head());
    let w = opts.dspark;
    let dspark = DsparkEval {
        loss: sums.loss(),
        ce_loss: m.ce_loss,
        l1_loss: m.l1_loss,
        confidence_loss: m.confidence_loss,
        tau_probabilistic: m.tau_probabilistic,
        base_tau_probabilistic: m.base_tau_probabilistic,
        greedy_tau: m.greedy_tau,
        base_greedy_tau: m.base_greedy_tau,
        acc: m.acc,
        base_acc: m.base_acc,
        acceptance_mean: m.accept_probability_mean,
        confidence_mean: confidence.then_some(m.confidence_mean),
        confidence_abs_error: confidence.then_some(m.confidence_abs_error),
        weights: [w.ce, w.l1, w.confidence],
    };
    EvalReport {
        tau: m.greedy_tau,
        loss: dspark.loss,
        accuracy: m.acc,
        blocks: sums.dspark.tau_blocks as u64,
        base_tau: Some(m.base_greedy_tau),
        dspark: Some(dspark),
        ..headline_only(sums, drafter, samples, opts)
    }
}
