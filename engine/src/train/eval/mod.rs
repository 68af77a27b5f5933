//! Offline evaluation (spec §5): deterministic anchors at every valid position, acceptance
//! length τ, per-position acceptance, recall@k per position, and the weighted loss.
//!
//! A Domino drafter is scored on its corrected logits (`model/drafter/domino.rs`), the GRU
//! teacher-forced on each block's labels.
//!
//! Per block: `correct_k = (argmax_k == label_k) | !valid_k`; `accepted = Σ_k cumprod(correct)_k ·
//! valid_k` over `k = 1..bs-1`; `τ_block = accepted + 1` (the target's bonus token); τ is the
//! mean over blocks. `per_position_acceptance[k-1]` is the fraction of blocks with a valid label
//! at `k` whose drafts `1..=k` are all accepted. `topk_recall[K][k-1]` is how often the label at
//! slot `k` is among the drafter's top-K tokens there (K in [`TOPK_RECALL_KS`]: what a tree
//! verifier such as DDTree can use), regardless of earlier slots; reports written before it was
//! renamed read as `recall_at_k`.
//!
//! `tau_tree_oracle[B]` is the budgeted DDTree oracle τ (`train/tree_metrics.rs`): per block the
//! tree of `B` nodes DDTree's decoder builds from the drafter's distributions, scored by the
//! deepest gold prefix it holds, plus one; the same blocks as τ, the same rule for slots
//! without a label (`decode/tree_oracle.rs`). `tau_tree_serve` is it at the serving budget.
//!
//! Besides `loss` it reports both objectives' losses, whatever the drafter was trained with:
//! `loss_dflash` (γ-weighted, pooled over all positions: `loss` itself) and `loss_dpace`, the
//! rows' D-PACE sums `Σ CE·m·w` over their blocks divided as `dpace_normalization` says
//! (`train/dpace.rs`; by default the mean over rows), with the evaluation's anchors at every
//! valid position and `dpace_alpha`.
use std::collections::BTreeMap;

use dflash_shared::metrics::TreeOracleTau;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::anchors::{all_anchors_chunked, AnchorBatch};
use super::dpace::{dpace_block_weights, dpace_normaliser, dpace_row_scale};
use super::dspark::DsparkLossWeights;
use super::error::TrainError;
use super::labels::{block_input_ids, block_labels, BlockLabels, LabelMaskRule, Rows};
use super::loader::{collate, Batch};
use super::loss::LossSums;
use super::replica::TargetStates;
use super::tree_metrics::{blocks_per_group, grow_trees, scored_budgets, TreeInputs, TreeTotals};
use crate::data::Sample;
use crate::decode::{accepted_per_budget, GoldSlot};
use crate::model::drafter::{AttentionBackend, DominoHead, Drafter};
use crate::model::target::{FeatureRequest, TargetHidden, TargetModel};
use dflash_shared::config::DpaceNormalization;

fn every_block() -> usize {
    1
}

/// Whether the oracle scores the block of held-out row `row` at `anchor` when it scores one
/// block in `one_in`: a fixed hash of the two (splitmix64's finalizer), so the subset is the
/// same at every evaluation of a run and of every run, and owes nothing to where blocks sit.
/// Every `k`-th anchor would: prompt headers of one length put response starts, where a
/// drafter is weakest, at regular positions, and a stride in step with them is biased.
pub fn in_tree_subsample(row: usize, anchor: i64, one_in: usize) -> bool {
    if one_in <= 1 {
        return true;
    }
    let mut z = ((row as u64) << 32 ^ anchor as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % one_in as u64 == 0
}

/// The K of per-slot top-K recall.
pub const TOPK_RECALL_KS: [usize; 5] = [1, 2, 4, 8, 16];

#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub anchors_per_forward: usize,
    pub rows_per_forward: usize,
    pub gamma: f64,
    pub rule: LabelMaskRule,
    pub chunk_positions: i64,
    pub backend: AttentionBackend,
    /// D-PACE's α for `loss_dpace`.
    pub dpace_alpha: f64,
    /// What `loss_dpace` divides the rows' D-PACE sums by.
    pub dpace_normalization: DpaceNormalization,
    /// The DDTree budgets the oracle τ is scored at (none: no tree is built).
    pub tree_budgets: Vec<usize>,
    /// The budget serving uses; scored too, and reported as `tau_tree_serve`.
    pub serve_tree_budget: Option<usize>,
    /// The oracle is scored at one block in this many ([`in_tree_subsample`]; 1: every
    /// block).
    pub tree_block_subsample: usize,
    /// DSpark's loss weights, for a drafter with a DSpark head.
    pub dspark: DsparkLossWeights,
    /// DFlash2's selector weight α (the schedule's end value), for a drafter with a selector.
    pub selector_alpha: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub tau: f64,
    /// Σ w·CE / Σ w with the training weights (decay included).
    pub loss: f64,
    /// DFlash's loss: the γ-weighted cross-entropy pooled over every valid position (the same
    /// figure as `loss`, named for the objective).
    #[serde(default)]
    pub loss_dflash: f64,
    /// D-PACE's loss: per row, `Σ CE·m·w` over the row's blocks, divided as
    /// `dpace_normalization` says (by default the mean over rows).
    #[serde(default)]
    pub loss_dpace: f64,
    /// The α `loss_dpace` was computed with.
    #[serde(default)]
    pub dpace_alpha: f64,
    /// The normalisation `loss_dpace` was computed with (reports from before it: the
    /// default, the only one there was).
    #[serde(default)]
    pub dpace_normalization: DpaceNormalization,
    /// Top-1 accuracy over all valid draft positions (unweighted).
    pub accuracy: f64,
    /// Index `k-1` for draft slot `k = 1..bs-1`.
    pub per_position_acceptance: Vec<f64>,
    /// K → per-slot top-K recall of the label, index `k-1`.
    #[serde(alias = "recall_at_k")]
    pub topk_recall: BTreeMap<usize, Vec<f64>>,
    /// Budget → the DDTree oracle τ on the same blocks (empty when no budget was asked for).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tau_tree_oracle: BTreeMap<usize, f64>,
    /// The blocks the oracle scored, and the one-in-N subsample that chose them (1: every
    /// block τ was scored at; [`in_tree_subsample`]).
    #[serde(default)]
    pub tree_blocks: u64,
    #[serde(default = "every_block")]
    pub tree_block_subsample: usize,
    /// The serving budget, and the oracle τ at it: the headline tree figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_tree_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau_tree_serve: Option<f64>,
    pub block_size: usize,
    pub samples: usize,
    pub blocks: u64,
    pub positions: u64,
    /// A Domino drafter's τ on the same blocks from the LM head's logits alone, SpecForge's
    /// `base_accept_len` offline: what the correction adds is `tau − base_tau`. Absent for a
    /// DFlash drafter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_tau: Option<f64>,
    /// A DSpark drafter's figures as SpecForge's `OnlineDSparkModel` computes them, every
    /// valid position an anchor. For such a drafter `tau` and `base_tau` are its
    /// teacher-forced greedy chain τ with and without the Markov head (as every head's `tau`,
    /// comparable with online chain τ; `tau_probabilistic` is in `dspark`), `loss` its loss and `accuracy`
    /// its `acc`; the per-slot rates and the tree oracle, which read DFlash's slots, are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dspark: Option<DsparkEval>,
    /// A DFlash2 drafter's figures as SpecForge's `OnlineDFlashModel` names them, every valid
    /// position an anchor. For such a drafter `tau` is the selector's serving accepted length
    /// (the chain a serving engine walks, teacher-forced), `base_tau` the unary argmax's,
    /// `loss` the objective at α and `accuracy` the unary argmax's; the per-slot rates and the
    /// tree oracle, which read the LM head's slots, are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dflash2: Option<Dflash2Eval>,
}

impl EvalReport {
    /// The oracle tree τ as a metrics line carries it beside `tau`: every scored budget and the
    /// serving budget. `None` when no tree was scored or the serving budget is not known.
    pub fn tree_oracle_tau(&self) -> Option<TreeOracleTau> {
        let serve_budget = self.serve_tree_budget?;
        (!self.tau_tree_oracle.is_empty()).then(|| TreeOracleTau {
            serve_budget,
            by_budget: self.tau_tree_oracle.clone(),
        })
    }
}

#[derive(Default)]
struct Totals {
    blocks: u64,
    accepted_plus_one: f64,
    valid_at: Vec<u64>,
    accepted_at: Vec<u64>,
    hits_at: Vec<Vec<u64>>,
    weighted_ce: f64,
    weight: f64,
    /// Per evaluated row (its index among the samples), D-PACE's sums.
    dpace_rows: Vec<DpaceRow>,
    top1: u64,
    positions: u64,
}

impl Totals {
    /// Mean over blocks of 1 + the accepted drafts (0 without a block).
    fn tau(&self) -> f64 {
        if self.blocks > 0 {
            self.accepted_plus_one / self.blocks as f64
        } else {
            0.0
        }
    }

    fn new(block_size: usize, ks: usize) -> Self {
        Self {
            valid_at: vec![0; block_size],
            accepted_at: vec![0; block_size],
            hits_at: vec![vec![0; block_size]; ks],
            ..Default::default()
        }
    }
}

/// One evaluated row's D-PACE sums, what every normalisation reads (`train/dpace.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct DpaceRow {
    /// `Σ CE·m·w` over the row's blocks.
    numerator: f64,
    /// `Σ m·w`.
    weight: f64,
    /// Blocks with a supervised slot (`A_b`).
    anchors: u64,
    /// Supervised slots (`T_b`).
    tokens: u64,
}

/// D-PACE's loss over `samples` rows (those missing from `rows` had no block) under
/// `normalization`: the rows' numerators, each times its factor, over the rows' normaliser.
fn dpace_loss(rows: &[DpaceRow], samples: usize, normalization: DpaceNormalization) -> f64 {
    let mut anchors: Vec<u64> = rows.iter().map(|r| r.anchors).collect();
    anchors.resize(samples.max(rows.len()), 0);
    let numerator: f64 = rows
        .iter()
        .map(|r| r.numerator * dpace_row_scale(normalization, r.anchors, r.tokens))
        .sum();
    let weight: f64 = rows.iter().map(|r| r.weight).sum();
    let normaliser = dpace_normaliser(normalization, &anchors, weight);
    if normaliser > 0.0 {
        numerator / normaliser
    } else {
        0.0
    }
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// Per valid position: CE and whether the label is within each top-K of [`TOPK_RECALL_KS`].
struct PositionScores {
    ce: Vec<f32>,
    /// `[n, TOPK_RECALL_KS.len()]` row-major.
    in_top: Vec<bool>,
    /// With a correction: whether the LM head's logits alone put the label first, from the
    /// same matmul (a Domino drafter's base τ needs nothing else of the base logits).
    base_top1: Vec<bool>,
}

impl PositionScores {
    /// The base logits' top-1 hits as scores that [`accumulate`] can take for τ: every
    /// recall column holds the top-1 hit and CE is zero, so nothing but τ may be read of
    /// the totals they go into.
    fn base_for_tau(&self) -> PositionScores {
        PositionScores {
            ce: vec![0.0; self.base_top1.len()],
            in_top: self
                .base_top1
                .iter()
                .flat_map(|&hit| [hit; TOPK_RECALL_KS.len()])
                .collect(),
            base_top1: Vec::new(),
        }
    }
}

/// A Domino drafter's head and the GRU state each slot reads (`[B, N·bs, G]`), for scoring
/// its corrected logits.
struct Correction<'a> {
    head: &'a DominoHead,
    states: Tensor,
    block_size: i64,
}

fn score_positions(
    out: &Tensor,
    lm_head: &Tensor,
    targets: &Tensor,
    idx: &Tensor,
    chunk: i64,
    max_k: i64,
    correction: Option<&Correction>,
) -> PositionScores {
    let hidden = out.size()[2];
    let flat = out.reshape([-1, hidden]);
    let flat_states = correction.map(|c| c.states.reshape([-1, c.states.size()[2]]));
    let tgt = targets.reshape([-1]).index_select(0, idx);
    let n = idx.size()[0];
    let mut ce = Vec::with_capacity(n as usize);
    let mut in_top = Vec::with_capacity(n as usize * TOPK_RECALL_KS.len());
    let mut base_top1 = Vec::new();
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let rows = idx.narrow(0, start, len);
        let z = flat.index_select(0, &rows);
        let mut logits = z.matmul(&lm_head.tr()).to_kind(Kind::Float);
        let t = tgt.narrow(0, start, len);
        if let (Some(c), Some(states)) = (correction, &flat_states) {
            let (_, first) = logits.topk(1, -1, true, true);
            base_top1.extend(
                Vec::<bool>::try_from(
                    &first
                        .squeeze_dim(1)
                        .eq_tensor(&t)
                        .to_device(tch::Device::Cpu),
                )
                .unwrap_or_default(),
            );
            let corrected = rows
                .remainder(c.block_size)
                .ge(c.head.config().suffix_start())
                .nonzero()
                .reshape([-1]);
            let delta = c.head.correction(
                &z.index_select(0, &corrected),
                &states.index_select(0, &rows).index_select(0, &corrected),
            );
            logits = logits.index_add(0, &corrected, &delta.to_kind(Kind::Float));
        }
        let nll = -logits
            .log_softmax(-1, Kind::Float)
            .gather(1, &t.unsqueeze(1), false)
            .squeeze_dim(1);
        let (_, top) = logits.topk(max_k, -1, true, true);
        let hit = top
            .eq_tensor(&t.unsqueeze(1))
            .to_kind(Kind::Int64)
            .cumsum(1, Kind::Int64)
            .gt(0);
        let cols: Vec<i64> = TOPK_RECALL_KS
            .iter()
            .map(|&k| (k as i64).min(max_k) - 1)
            .collect();
        let picked = hit.index_select(1, &Tensor::from_slice(&cols).to_device(hit.device()));
        ce.extend(Vec::<f32>::try_from(&nll.to_device(tch::Device::Cpu)).unwrap_or_default());
        in_top.extend(
            Vec::<bool>::try_from(&picked.reshape([-1]).to_device(tch::Device::Cpu))
                .unwrap_or_default(),
        );
        start += len;
    }
    PositionScores {
        ce,
        in_top,
        base_top1,
    }
}

/// One anchor chunk's blocks as [`accumulate`] reads them: the anchors, their labels, and the
/// index among the samples of the chunk's first row.
struct ChunkLabels<'a> {
    anchors: &'a AnchorBatch,
    labels: &'a BlockLabels,
    first_row: usize,
}

fn accumulate(
    totals: &mut Totals,
    chunk: &ChunkLabels,
    block_size: usize,
    valid_flat: &[usize],
    scores: &PositionScores,
    dpace_alpha: f64,
) {
    let ChunkLabels {
        anchors,
        labels,
        first_row,
    } = *chunk;
    let n_blocks = anchors.batch * anchors.width;
    // correct[block][k]: true where the label is invalid (spec §5) or the argmax hits.
    let mut correct = vec![true; n_blocks * block_size];
    // Each valid slot's CE, for D-PACE's per-block weights (read only where valid).
    let mut ce = vec![0.0f64; n_blocks * block_size];
    for (i, &f) in valid_flat.iter().enumerate() {
        ce[f] = scores.ce[i] as f64;
        let k = f % block_size;
        let in_top = &scores.in_top[i * TOPK_RECALL_KS.len()..(i + 1) * TOPK_RECALL_KS.len()];
        correct[f] = in_top[0];
        for (ki, &hit) in in_top.iter().enumerate() {
            totals.hits_at[ki][k] += u64::from(hit);
        }
        totals.top1 += u64::from(in_top[0]);
        totals.positions += 1;
        let w = labels.weights[f] as f64;
        totals.weighted_ce += w * scores.ce[i] as f64;
        totals.weight += w;
    }
    for blk in 0..n_blocks {
        if !anchors.keep[blk] {
            continue;
        }
        totals.blocks += 1;
        let base = blk * block_size;
        let slots = base..base + block_size;
        let q: Vec<f64> = ce[slots.clone()].iter().map(|c| (-c).exp()).collect();
        let valid = &labels.valid[slots.clone()];
        let w = dpace_block_weights(&q, valid, dpace_alpha);
        let row = first_row + blk / anchors.width;
        if totals.dpace_rows.len() <= row {
            totals.dpace_rows.resize(row + 1, DpaceRow::default());
        }
        let sums = &mut totals.dpace_rows[row];
        sums.numerator += w.iter().zip(&ce[slots]).map(|(w, c)| w * c).sum::<f64>();
        sums.weight += w.iter().sum::<f64>();
        let supervised = valid.iter().filter(|&&v| v).count() as u64;
        sums.tokens += supervised;
        sums.anchors += u64::from(supervised > 0);
        let mut alive = true;
        let mut accepted = 0u64;
        for k in 1..block_size {
            alive &= correct[base + k];
            if labels.valid[base + k] {
                totals.valid_at[k] += 1;
                if alive {
                    accepted += 1;
                    totals.accepted_at[k] += 1;
                }
            }
        }
        totals.accepted_plus_one += (accepted + 1) as f64;
    }
}

/// Evaluates `drafter` on `samples` with the target's features, embedding and LM head.
pub fn evaluate(
    target: &TargetModel,
    drafter: &Drafter,
    samples: &[&Sample],
    opts: &EvalOptions,
) -> Result<EvalReport, TrainError> {
    evaluate_with(target, drafter, samples, opts, &mut |_| {})
}

/// One evaluated block's DDTree oracle: which row (index into the samples), its anchor, and
/// the drafts its tree commits at each of [`BlockOutcome::budgets`].
#[derive(Debug, Clone, PartialEq)]
pub struct BlockOutcome<'a> {
    pub row: usize,
    pub anchor: i64,
    pub budgets: &'a [usize],
    pub tree_accepted: &'a [usize],
}

/// [`evaluate`], handing each block's oracle outcome to `on_block` (blocks in row order, then
/// anchor order; nothing when no tree budget is asked for).
pub fn evaluate_with(
    target: &TargetModel,
    drafter: &Drafter,
    samples: &[&Sample],
    opts: &EvalOptions,
    on_block: &mut dyn FnMut(&BlockOutcome),
) -> Result<EvalReport, TrainError> {
    let bs = drafter.config().block_size as usize;
    let vocab = target.config().vocab_size();
    // The drafter's device and dtype, where its output and therefore the scoring live. The LM
    // head (vocab × hidden: 2.4 GiB at the real size) goes there once per evaluation and each
    // forward group's features once per group, not once per anchor chunk: the chunks of a
    // group share them, and the drafter finds them already in place.
    let (eval_device, eval_kind) = (drafter.device(), drafter.dtype());
    let budgets = scored_budgets(&opts.tree_budgets, opts.serve_tree_budget);
    let scorer = BlockScorer {
        target,
        drafter,
        opts,
        bs,
        max_k: (*TOPK_RECALL_KS.iter().max().unwrap_or(&1) as i64).min(vocab),
        eval_device,
        eval_kind,
        lm_head: crate::device::place(target.lm_head(), eval_device, eval_kind),
        budgets: &budgets,
    };
    let mut tallies = Tallies {
        totals: Totals::new(bs, TOPK_RECALL_KS.len()),
        base_totals: Totals::new(bs, TOPK_RECALL_KS.len()),
        trees: TreeTotals::new(budgets.len()),
        own_objective: LossSums::default(),
    };
    let rows_per_forward = opts.rows_per_forward.max(1);
    tch::no_grad(|| -> Result<(), TrainError> {
        for (g, group) in samples.chunks(rows_per_forward).enumerate() {
            scorer.score_group(group, g * rows_per_forward, &mut tallies, on_block)?;
        }
        Ok(())
    })?;
    Ok(report(&tallies, &budgets, drafter, samples.len(), opts))
}

/// The target's states of one forward group's rows `ids` for `request`, placed once on the
/// drafter's device in its dtype (`place`), where every anchor chunk of the group reads them.
fn placed_states(
    target: &TargetModel,
    ids: &Tensor,
    request: &FeatureRequest,
    (device, kind): (Device, Kind),
) -> Result<TargetHidden, TrainError> {
    let hidden = target.hidden_states(ids, request)?;
    let place = |t: &Tensor| crate::device::place(t, device, kind);
    Ok(TargetHidden {
        features: place(&hidden.features),
        last_hidden: hidden.last_hidden.as_ref().map(place),
    })
}

/// What an evaluation accumulates: the drafter's blocks, a Domino drafter's blocks scored
/// again on the base logits alone, and the tree oracle's.
struct Tallies {
    totals: Totals,
    base_totals: Totals,
    trees: TreeTotals,
    /// A DSpark or DFlash2 drafter's loss sums (`heads.rs`).
    own_objective: LossSums,
}

/// What scoring one forward group needs, fixed for the whole evaluation.
struct BlockScorer<'a> {
    target: &'a TargetModel,
    drafter: &'a Drafter,
    opts: &'a EvalOptions,
    bs: usize,
    max_k: i64,
    eval_device: Device,
    eval_kind: Kind,
    lm_head: Tensor,
    /// The oracle's budgets, ascending (empty: no tree).
    budgets: &'a [usize],
}

/// One chunk's blocks as the tree oracle needs them.
struct ChunkBlocks<'a> {
    first_row: usize,
    anchors: &'a AnchorBatch,
    /// `[B, N·bs]` the block ids (slot 0: the anchor token).
    block_ids: &'a [i64],
    labels: &'a BlockLabels,
    /// The drafter's output `[B, N·bs, H]`.
    out: &'a Tensor,
}

impl BlockScorer<'_> {
    /// One forward group: the target's features once, then every anchor chunk of its rows.
    fn score_group(
        &self,
        group: &[&Sample],
        first_row: usize,
        tallies: &mut Tallies,
        on_block: &mut dyn FnMut(&BlockOutcome),
    ) -> Result<(), TrainError> {
        let cfg = self.drafter.config();
        let batch = collate(group, 0, 0);
        let ids =
            Tensor::from_slice(&batch.input_ids).view([batch.batch as i64, batch.seq_len as i64]);
        let hidden = placed_states(
            self.target,
            &ids,
            &cfg.feature_request(),
            (self.eval_device, self.eval_kind),
        )?;
        let states = TargetStates::from(&hidden);
        for anchors in all_anchors_chunked(&batch.masks(), self.opts.anchors_per_forward) {
            if anchors.width > 0 {
                self.score_chunk(&batch, first_row, states, &anchors, tallies, on_block);
            }
        }
        Ok(())
    }

    /// One chunk of anchors: the drafter's blocks, scored against their labels (and, for a
    /// Domino drafter, scored again without its correction), and their oracle trees.
    fn score_chunk(
        &self,
        batch: &Batch,
        first_row: usize,
        states: TargetStates<'_>,
        anchors: &AnchorBatch,
        tallies: &mut Tallies,
        on_block: &mut dyn FnMut(&BlockOutcome),
    ) {
        let (cfg, bs, opts) = (self.drafter.config(), self.bs, self.opts);
        let device = self.target.device();
        let rows: Rows = batch.rows();
        let block_ids = block_input_ids(rows, anchors, bs, cfg.mask_token_id);
        let block_ids_t = Tensor::from_slice(&block_ids).to_device(device);
        let q = (anchors.width * bs) as i64;
        let embeddings = self
            .target
            .embed_tokens()
            .index_select(0, &block_ids_t)
            .view([batch.batch as i64, q, -1]);
        let (anchor_t, keep_t) = anchors.to_tensors(device);
        let out = self.drafter.forward(
            states.features,
            &embeddings,
            &anchor_t,
            &keep_t,
            opts.backend,
        );
        let own = OwnObjectiveChunk {
            rows,
            anchors,
            anchor_t: &anchor_t,
            keep_t: &keep_t,
            out: &out,
        };
        if let Some(sums) = self.score_own_objective(states, &own) {
            tallies.own_objective.add(&sums);
            return;
        }
        let labels = block_labels(rows, anchors, bs, Some(opts.gamma), opts.rule);
        let chunk = ChunkBlocks {
            first_row,
            anchors,
            block_ids: &block_ids,
            labels: &labels,
            out: &out,
        };
        self.score_trees(&chunk, &mut tallies.trees, on_block);
        self.score_slots(batch, &chunk, tallies);
    }

    /// Every kept block's slots against their labels: τ, acceptance, recall and losses.
    fn score_slots(&self, batch: &Batch, chunk: &ChunkBlocks, tallies: &mut Tallies) {
        let (bs, opts, device) = (self.bs, self.opts, self.target.device());
        let (labels, out, anchors) = (chunk.labels, chunk.out, chunk.anchors);
        let q = (anchors.width * bs) as i64;
        let valid_flat: Vec<usize> = (0..labels.valid.len())
            .filter(|&f| labels.valid[f])
            .collect();
        let at = ChunkLabels {
            anchors,
            labels,
            first_row: chunk.first_row,
        };
        let add = |totals: &mut Totals, scores: &PositionScores| {
            accumulate(totals, &at, bs, &valid_flat, scores, opts.dpace_alpha);
        };
        if valid_flat.is_empty() {
            let none = PositionScores {
                ce: vec![],
                in_top: vec![],
                base_top1: vec![],
            };
            add(&mut tallies.totals, &none);
            add(&mut tallies.base_totals, &none);
            return;
        }
        let idx = Tensor::from_slice(&valid_flat.iter().map(|&f| f as i64).collect::<Vec<_>>())
            .to_device(out.device());
        let targets = Tensor::from_slice(&labels.targets).to_device(out.device());
        // Domino's GRU reads each block's true tokens, the slots' labels: for greedy
        // acceptance these are the accepted prefix up to the first miss, and nothing
        // after a miss changes the block's τ.
        let correction = self.drafter.domino().map(|head| {
            let embedded = self
                .target
                .embed_tokens()
                .index_select(0, &targets.to_device(device))
                .view([batch.batch as i64, q, -1]);
            Correction {
                head,
                states: head.slot_states(
                    &crate::device::place(&embedded, self.eval_device, self.eval_kind),
                    bs as i64,
                ),
                block_size: bs as i64,
            }
        });
        let scores = score_positions(
            out,
            &self.lm_head,
            &targets,
            &idx,
            opts.chunk_positions.max(1),
            self.max_k,
            correction.as_ref(),
        );
        add(&mut tallies.totals, &scores);
        if correction.is_some() {
            add(&mut tallies.base_totals, &scores.base_for_tau());
        }
    }

    /// The DDTree oracle of every kept block: its tree at the largest budget, scored at each.
    fn score_trees(
        &self,
        chunk: &ChunkBlocks,
        trees: &mut TreeTotals,
        on_block: &mut dyn FnMut(&BlockOutcome),
    ) {
        let Some(&max_budget) = self.budgets.last() else {
            return;
        };
        let (bs, anchors, labels) = (self.bs, chunk.anchors, chunk.labels);
        let one_in = self.opts.tree_block_subsample;
        let kept: Vec<usize> = (0..anchors.keep.len())
            .filter(|&blk| {
                let row = chunk.first_row + blk / anchors.width;
                anchors.keep[blk] && in_tree_subsample(row, anchors.positions[blk], one_in)
            })
            .collect();
        let hidden = chunk.out.size()[2];
        let blocks = chunk.out.reshape([-1, bs as i64, hidden]);
        let group_size = blocks_per_group(self.opts.chunk_positions, bs);
        for group in kept.chunks(group_size) {
            let index: Vec<i64> = group.iter().map(|&blk| blk as i64).collect();
            let index = Tensor::from_slice(&index).to_device(blocks.device());
            let inputs = TreeInputs {
                slots: blocks.index_select(0, &index).narrow(1, 1, bs as i64 - 1),
                roots: group.iter().map(|&blk| chunk.block_ids[blk * bs]).collect(),
                lm_head: &self.lm_head,
                embed: self.target.embed_tokens(),
                head: self.drafter.domino(),
            };
            for (tree, &blk) in grow_trees(&inputs, max_budget).iter().zip(group) {
                let slots = blk * bs + 1..(blk + 1) * bs;
                let gold: Vec<GoldSlot> = slots
                    .map(|f| GoldSlot {
                        token: labels.targets[f],
                        valid: labels.valid[f],
                    })
                    .collect();
                let accepted = accepted_per_budget(tree, &gold, self.budgets);
                trees.add(&accepted);
                on_block(&BlockOutcome {
                    row: chunk.first_row + blk / anchors.width,
                    anchor: anchors.positions[blk],
                    budgets: self.budgets,
                    tree_accepted: &accepted,
                });
            }
        }
    }
}

/// The report of the accumulated totals: τ, both objectives' losses, per-slot rates, and the
/// tree oracle at `budgets`.
fn report(
    tallies: &Tallies,
    budgets: &[usize],
    drafter: &Drafter,
    samples: usize,
    opts: &EvalOptions,
) -> EvalReport {
    if let Some(report) = own_objective_report(&tallies.own_objective, drafter, samples, opts) {
        return report;
    }
    let totals = &tallies.totals;
    let bs = drafter.config().block_size as usize;
    let per_slot =
        |num: &[u64]| -> Vec<f64> { (1..bs).map(|k| ratio(num[k], totals.valid_at[k])).collect() };
    let topk_recall = TOPK_RECALL_KS
        .iter()
        .enumerate()
        .map(|(i, &k)| (k, per_slot(&totals.hits_at[i])))
        .collect();
    let tau_tree_oracle: BTreeMap<usize, f64> =
        budgets.iter().copied().zip(tallies.trees.taus()).collect();
    let loss = if totals.weight > 0.0 {
        totals.weighted_ce / totals.weight
    } else {
        0.0
    };
    EvalReport {
        tau: totals.tau(),
        loss,
        loss_dflash: loss,
        loss_dpace: dpace_loss(&totals.dpace_rows, samples, opts.dpace_normalization),
        dpace_alpha: opts.dpace_alpha,
        dpace_normalization: opts.dpace_normalization,
        accuracy: ratio(totals.top1, totals.positions),
        per_position_acceptance: per_slot(&totals.accepted_at),
        topk_recall,
        tau_tree_serve: opts
            .serve_tree_budget
            .and_then(|b| tau_tree_oracle.get(&b).copied()),
        serve_tree_budget: opts.serve_tree_budget,
        tau_tree_oracle,
        tree_blocks: tallies.trees.blocks,
        tree_block_subsample: opts.tree_block_subsample.max(1),
        block_size: bs,
        samples,
        blocks: totals.blocks,
        positions: totals.positions,
        base_tau: drafter.domino().map(|_| tallies.base_totals.tau()),
        dspark: None,
        dflash2: None,
    }
}

mod heads;
#[cfg(test)]
mod tests;

use heads::{own_objective_report, OwnObjectiveChunk};
pub use heads::{Dflash2Eval, DsparkEval};
