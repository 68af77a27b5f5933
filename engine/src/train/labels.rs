//! What each draft slot sees and what it must predict (spec §2.3, §2.4, §2.6).
//!
//! Block `j` of a row starts at anchor `a`: slot 0 holds the anchor token, slots `1..bs` hold the
//! mask token, and slot `k` predicts the data token at `a + k` (same-position labels, no shift).
//! Slot 0 is never trained; slot `k >= 1` has weight `exp(-(k-1)/γ)` when its label is inside the
//! row and supervised.
//!
//! DSpark shifts the labels by one ([`LabelAlignment::NextToken`], [`next_token_block_labels`]):
//! slot `k` (slot 0 included) predicts the token at `a + k + 1` from the token at `a + k`.
use serde::{Deserialize, Serialize};

use super::anchors::AnchorBatch;
use crate::model::drafter::DrafterHead;

/// Which data token a block's slot `k` is trained to predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelAlignment {
    /// DFlash and Domino: the token at `a + k`, slot 0 (the anchor itself) never trained
    /// ([`block_labels`]).
    #[default]
    SamePosition,
    /// DSpark: the token at `a + k + 1`, every slot trained ([`next_token_block_labels`]).
    NextToken,
}

impl LabelAlignment {
    /// The alignment a drafter with `head` trains with.
    pub fn for_head(head: &DrafterHead) -> Self {
        match head {
            DrafterHead::Dflash | DrafterHead::Domino(_) | DrafterHead::Dflash2(_) => {
                LabelAlignment::SamePosition
            }
            DrafterHead::Dspark(_) => LabelAlignment::NextToken,
        }
    }
}

/// How an unsupervised label inside a block affects the slots after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelMaskRule {
    /// SpecForge: each slot is masked by its own label's `loss_mask` only.
    #[default]
    Independent,
    /// Stop at the first unsupervised or out-of-range label (safer for multi-turn data, where a
    /// block may run from one assistant turn through a user turn into the next).
    Cumulative,
}

/// Paper defaults (γ=7 for bs 16, 5 for bs 10, 4 for bs 8); other sizes scale γ ≈ 0.44·bs,
/// which keeps the last slot's weight near the same fraction of the first.
pub fn default_gamma(block_size: usize) -> f64 {
    match block_size {
        16 => 7.0,
        10 => 5.0,
        8 => 4.0,
        bs => (bs as f64 * 7.0 / 16.0).max(1.0),
    }
}

/// The decay weight of slot `k` (slot 0 has weight 0).
pub fn slot_weight(k: usize, gamma: Option<f64>) -> f32 {
    if k == 0 {
        return 0.0;
    }
    match gamma {
        Some(g) if g > 0.0 => (-((k - 1) as f64) / g).exp() as f32,
        _ => 1.0,
    }
}

/// A batch's token rows, right-padded to a common length `seq_len`.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub input_ids: &'a [i64],
    pub loss_mask: &'a [u8],
    pub batch: usize,
    pub seq_len: usize,
}

impl<'a> Rows<'a> {
    pub fn ids(&self, b: usize) -> &'a [i64] {
        &self.input_ids[b * self.seq_len..(b + 1) * self.seq_len]
    }
    pub fn mask(&self, b: usize) -> &'a [u8] {
        &self.loss_mask[b * self.seq_len..(b + 1) * self.seq_len]
    }
}

/// Block token ids `[B, N*bs]`: the anchor token in slot 0 of kept blocks, the mask token
/// everywhere else (padded blocks are all mask).
pub fn block_input_ids(
    rows: Rows,
    anchors: &AnchorBatch,
    block_size: usize,
    mask_token_id: i64,
) -> Vec<i64> {
    let mut out = vec![mask_token_id; rows.batch * anchors.width * block_size];
    for b in 0..rows.batch {
        let ids = rows.ids(b);
        for (j, (a, keep)) in anchors.row(b).enumerate() {
            if keep {
                out[(b * anchors.width + j) * block_size] = ids[a as usize];
            }
        }
    }
    out
}

/// Position ids `[B, S + N*bs]`: `0..S` for the context, then `anchor + k` for block slots.
pub fn position_ids(seq_len: usize, anchors: &AnchorBatch, block_size: usize) -> Vec<i64> {
    let row_len = seq_len + anchors.width * block_size;
    let mut out = Vec::with_capacity(anchors.batch * row_len);
    for b in 0..anchors.batch {
        out.extend(0..seq_len as i64);
        for (a, _) in anchors.row(b) {
            out.extend((0..block_size as i64).map(|k| a + k));
        }
    }
    out
}

/// Per-slot labels and loss weights, both `[B, N*bs]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockLabels {
    pub targets: Vec<i64>,
    pub weights: Vec<f32>,
    /// 1 where the label exists and is supervised (before decay), 0 elsewhere. Evaluation
    /// counts acceptance over these slots.
    pub valid: Vec<bool>,
}

impl BlockLabels {
    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|w| *w as f64).sum()
    }
}

/// Spec §2.6: `target = input_ids[min(a+k, S-1)]`; weight `keep · (a+k < S) · (k > 0) ·
/// loss_mask[a+k] · exp(-(k-1)/γ)`.
pub fn block_labels(
    rows: Rows,
    anchors: &AnchorBatch,
    block_size: usize,
    gamma: Option<f64>,
    rule: LabelMaskRule,
) -> BlockLabels {
    let n = rows.batch * anchors.width * block_size;
    let mut targets = vec![0i64; n];
    let mut weights = vec![0f32; n];
    let mut valid = vec![false; n];
    let s = rows.seq_len;
    for b in 0..rows.batch {
        let (ids, mask) = (rows.ids(b), rows.mask(b));
        for (j, (a, keep)) in anchors.row(b).enumerate() {
            let base = (b * anchors.width + j) * block_size;
            let mut chain_alive = true;
            for k in 0..block_size {
                let idx = a as usize + k;
                targets[base + k] = ids[idx.min(s - 1)];
                if k == 0 {
                    continue;
                }
                let supervised = keep && idx < s && mask[idx] != 0;
                if !supervised && rule == LabelMaskRule::Cumulative {
                    chain_alive = false;
                }
                if supervised && chain_alive {
                    valid[base + k] = true;
                    weights[base + k] = slot_weight(k, gamma);
                }
            }
        }
    }
    BlockLabels {
        targets,
        weights,
        valid,
    }
}

/// DSpark's labels (`_build_dspark_labels_and_mask` and `_dspark_loss_weight_mask`,
/// `specforge/algorithms/common/dflash_family_model.py:755-802`): slot `k = 0..bs−1` of the
/// block at `a` predicts `input_ids[a + k + 1]` (clamped to `S − 1`; `input_ids[0]` in an
/// unkept block). Its mask is `keep · (a+k+1 < S) · loss_mask[a+k+1]` made prefix-cumulative
/// along the block (a slot is supervised only when every slot before it is: the acceptance
/// the loss models stops at the first miss), whatever `training.label_mask` says; its weight
/// is the mask times `exp(−k/γ)` from `k = 0` (the mask alone when γ is `None` or ≤ 0).
/// `valid` is the mask (SpecForge's `eval_mask`).
pub fn next_token_block_labels(
    rows: Rows,
    anchors: &AnchorBatch,
    block_size: usize,
    gamma: Option<f64>,
) -> BlockLabels {
    let n = rows.batch * anchors.width * block_size;
    let mut targets = vec![0i64; n];
    let mut weights = vec![0f32; n];
    let mut valid = vec![false; n];
    let s = rows.seq_len;
    for b in 0..rows.batch {
        let (ids, mask) = (rows.ids(b), rows.mask(b));
        for (j, (a, keep)) in anchors.row(b).enumerate() {
            let base = (b * anchors.width + j) * block_size;
            let mut chain_alive = keep;
            for k in 0..block_size {
                let label = a as usize + k + 1;
                targets[base + k] = ids[next_token_label_index(label, keep, s)];
                chain_alive = chain_alive && label < s && mask[label] != 0;
                if chain_alive {
                    valid[base + k] = true;
                    weights[base + k] = next_token_slot_weight(k, gamma);
                }
            }
        }
    }
    BlockLabels {
        targets,
        weights,
        valid,
    }
}

/// Where slot `k`'s label is read, for the label at `a + k + 1`: clamped to the row, position
/// 0 in an unkept block (SpecForge's `safe_label_indices`).
fn next_token_label_index(label: usize, keep: bool, seq_len: usize) -> usize {
    if keep {
        label.min(seq_len - 1)
    } else {
        0
    }
}

/// DSpark's decay: `exp(−k/γ)` from slot 0 (`_dspark_loss_weight_mask`), 1 without a γ > 0.
pub fn next_token_slot_weight(k: usize, gamma: Option<f64>) -> f32 {
    match gamma {
        Some(g) if g > 0.0 => (-(k as f64) / g).exp() as f32,
        _ => 1.0,
    }
}

/// The token before each slot of DSpark's blocks, `[B, N*bs]` row-major: what the Markov head
/// reads, teacher-forced. Slot 0's is the anchor token, slot `k ≥ 1`'s is slot `k − 1`'s
/// label (SpecForge's `prev_token_ids`, `dflash_family_model.py:1093-1097`), so the token at
/// `a + k` clamped to the row (position 0 in an unkept block).
pub fn next_token_prev_ids(rows: Rows, anchors: &AnchorBatch, block_size: usize) -> Vec<i64> {
    let s = rows.seq_len;
    let mut out = vec![0i64; rows.batch * anchors.width * block_size];
    for b in 0..rows.batch {
        let ids = rows.ids(b);
        for (j, (a, keep)) in anchors.row(b).enumerate() {
            let base = (b * anchors.width + j) * block_size;
            out[base] = ids[(a.max(0) as usize).min(s - 1)];
            for k in 1..block_size {
                out[base + k] = ids[next_token_label_index(a as usize + k, keep, s)];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows<'a>(ids: &'a [i64], mask: &'a [u8], batch: usize) -> Rows<'a> {
        Rows {
            input_ids: ids,
            loss_mask: mask,
            batch,
            seq_len: ids.len() / batch,
        }
    }

    #[test]
    fn gamma_defaults_follow_the_paper() {
        assert_eq!(default_gamma(16), 7.0);
        assert_eq!(default_gamma(8), 4.0);
        assert_eq!(default_gamma(10), 5.0);
        assert!((default_gamma(32) - 14.0).abs() < 1e-12);
    }

    #[test]
    fn slot_weights_decay_from_one() {
        assert_eq!(slot_weight(0, Some(7.0)), 0.0);
        assert_eq!(slot_weight(1, Some(7.0)), 1.0);
        assert!((slot_weight(2, Some(7.0)) - (-1.0f32 / 7.0).exp()).abs() < 1e-7);
        assert!((slot_weight(8, Some(7.0)) - (-1.0f32).exp()).abs() < 1e-7);
        assert_eq!(slot_weight(5, None), 1.0);
    }

    #[test]
    fn block_inputs_put_the_anchor_token_first() {
        let ids = [10, 11, 12, 13, 14, 15];
        let mask = [0, 1, 1, 1, 1, 1];
        let anchors = AnchorBatch::from_rows(&[vec![1, 3]], 3);
        let got = block_input_ids(rows(&ids, &mask, 1), &anchors, 3, 99);
        assert_eq!(got, vec![11, 99, 99, 13, 99, 99, 99, 99, 99]);
    }

    #[test]
    fn position_ids_continue_from_each_anchor() {
        let anchors = AnchorBatch::from_rows(&[vec![2], vec![0]], 1);
        let got = position_ids(4, &anchors, 3);
        assert_eq!(got, vec![0, 1, 2, 3, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]);
    }

    #[test]
    fn labels_are_same_position_tokens_weighted_by_mask_and_decay() {
        //          0   1   2   3   4   5
        let ids = [10, 11, 12, 13, 14, 15];
        let mask = [0, 1, 1, 0, 1, 1];
        let anchors = AnchorBatch::from_rows(&[vec![1, 4]], 3);
        let l = block_labels(
            rows(&ids, &mask, 1),
            &anchors,
            4,
            Some(2.0),
            LabelMaskRule::Independent,
        );
        // Block at 1: labels 11,12,13,14 -> weights 0, 1 (12 supervised), 0 (13 not), e^-1 (14).
        assert_eq!(&l.targets[0..4], &[11, 12, 13, 14]);
        let w = &l.weights[0..4];
        assert_eq!(w[0], 0.0);
        assert_eq!(w[1], 1.0);
        assert_eq!(w[2], 0.0);
        assert!((w[3] - (-1.0f32).exp()).abs() < 1e-7);
        // Block at 4: labels 14,15, then past the end (clamped to 15, weight 0).
        assert_eq!(&l.targets[4..8], &[14, 15, 15, 15]);
        assert_eq!(&l.weights[4..8], &[0.0, 1.0, 0.0, 0.0]);
        assert_eq!(&l.valid[4..8], &[false, true, false, false]);
        // Padded third block: nothing.
        assert!(l.weights[8..12].iter().all(|w| *w == 0.0));
    }

    #[test]
    fn cumulative_rule_stops_at_the_first_gap() {
        let ids = [10, 11, 12, 13, 14, 15];
        let mask = [0, 1, 1, 0, 1, 1];
        let anchors = AnchorBatch::from_rows(&[vec![1]], 1);
        let l = block_labels(
            rows(&ids, &mask, 1),
            &anchors,
            4,
            None,
            LabelMaskRule::Cumulative,
        );
        assert_eq!(l.weights, vec![0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn next_token_labels_shift_by_one_and_stop_at_the_first_gap() {
        //          0   1   2   3   4   5   6   7
        let ids = [10, 11, 12, 13, 14, 15, 16, 17];
        let mask = [0, 1, 1, 1, 0, 1, 1, 1];
        let anchors = AnchorBatch::from_rows(&[vec![1, 5]], 3);
        let r = rows(&ids, &mask, 1);
        let l = next_token_block_labels(r, &anchors, 4, Some(2.0));
        let decay = |k: i32| (-(k as f32) / 2.0).exp();
        // Block at 1: slot k predicts 1+k+1 = 12, 13, 14, 15; 14 is unsupervised, so slots 2
        // and 3 are not trained (15 is supervised, but after the gap).
        assert_eq!(&l.targets[0..4], &[12, 13, 14, 15]);
        assert_eq!(&l.valid[0..4], &[true, true, false, false]);
        assert_eq!(&l.weights[0..4], &[1.0, decay(1), 0.0, 0.0]);
        // Block at 5: labels 16, 17, then past the end (clamped to 17, untrained).
        assert_eq!(&l.targets[4..8], &[16, 17, 17, 17]);
        assert_eq!(&l.valid[4..8], &[true, true, false, false]);
        assert_eq!(&l.weights[4..8], &[1.0, decay(1), 0.0, 0.0]);
        // Padded third block: position 0's token, nothing trained.
        assert_eq!(&l.targets[8..12], &[10, 10, 10, 10]);
        assert!(l.weights[8..12].iter().all(|w| *w == 0.0));
        assert!(!l.valid[8..12].iter().any(|v| *v));
        // The Markov head reads the anchor token before slot 0, then slot k−1's label.
        let prev = next_token_prev_ids(r, &anchors, 4);
        assert_eq!(&prev[0..4], &[11, 12, 13, 14]);
        assert_eq!(&prev[4..8], &[15, 16, 17, 17]);
        assert_eq!(&prev[8..12], &[10, 10, 10, 10]);
        // Without a decay every supervised slot weighs 1.
        let flat = next_token_block_labels(r, &anchors, 4, None);
        assert_eq!(&flat.weights[0..4], &[1.0, 1.0, 0.0, 0.0]);
        assert_eq!(next_token_slot_weight(3, Some(0.0)), 1.0);
    }

    #[test]
    fn next_token_labels_ignore_unkept_blocks_and_the_anchors_own_mask() {
        let ids = [10, 11, 12, 13];
        // The anchor's own position is unsupervised: slot 0 predicts position 1, which is.
        let mask = [0, 1, 1, 1];
        let kept = AnchorBatch::from_rows(&[vec![0]], 1);
        let l = next_token_block_labels(rows(&ids, &mask, 1), &kept, 2, Some(4.0));
        assert_eq!(l.valid, vec![true, true]);
        let unkept = AnchorBatch {
            batch: 1,
            width: 1,
            positions: vec![0],
            keep: vec![false],
        };
        let l = next_token_block_labels(rows(&ids, &mask, 1), &unkept, 2, Some(4.0));
        assert_eq!(l.weight_sum(), 0.0);
        assert_eq!(l.valid, vec![false, false]);
    }

    #[test]
    fn the_alignment_follows_the_drafters_head() {
        use crate::model::drafter::{DominoConfig, DsparkConfig, MarkovHeadType};
        assert_eq!(
            LabelAlignment::for_head(&DrafterHead::Dflash),
            LabelAlignment::SamePosition
        );
        let domino = DominoConfig {
            emb_dim: 4,
            gru_hidden_dim: 4,
            pure_draft_prefix_len: 0,
        };
        assert_eq!(
            LabelAlignment::for_head(&DrafterHead::Domino(domino)),
            LabelAlignment::SamePosition
        );
        let dspark = DsparkConfig {
            markov_rank: 4,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head: true,
            confidence_head_with_markov: false,
        };
        assert_eq!(
            LabelAlignment::for_head(&DrafterHead::Dspark(dspark)),
            LabelAlignment::NextToken
        );
    }

    #[test]
    fn unkept_blocks_have_no_weight() {
        let ids = [10, 11, 12, 13];
        let mask = [1, 1, 1, 1];
        let anchors = AnchorBatch {
            batch: 1,
            width: 1,
            positions: vec![0],
            keep: vec![false],
        };
        let l = block_labels(
            rows(&ids, &mask, 1),
            &anchors,
            3,
            None,
            LabelMaskRule::Independent,
        );
        assert_eq!(l.weight_sum(), 0.0);
    }
}
