//! What one drafter step processes, and how the device computes it.
use crate::model::drafter::DrafterConfig;

/// The precision and kernel choices the engine makes per device (`device.rs::compute_kind`,
/// `attention/block_sparse.rs::kernel_heads`, `layers/norm.rs::rms_norm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationPrecision {
    /// CPU: fp32 parameters are their own masters, the flash kernel takes grouped K/V heads,
    /// RMSNorm is libtorch's fused `rms_norm`.
    Fp32Cpu,
    /// CUDA: bf16 parameters with fp32 masters, K/V repeated per query head, RMSNorm written
    /// out in fp32 (Qwen3's cast order) keeping its bf16 input for backward.
    Bf16Cuda,
}

impl ActivationPrecision {
    /// Bytes of one activation (and parameter) element.
    pub fn bytes(self) -> f64 {
        match self {
            Self::Fp32Cpu => 4.0,
            Self::Bf16Cuda => 2.0,
        }
    }

    /// Whether the attention kernel reads grouped K/V heads itself (no repeat).
    pub fn native_gqa(self) -> bool {
        self == Self::Fp32Cpu
    }

    /// Whether parameters are fp32, so no separate fp32 master copy exists.
    pub fn params_are_masters(self) -> bool {
        self == Self::Fp32Cpu
    }
}

/// One micro-batch of one drafter rank: `batch` rows of `seq_len` tokens and their anchors.
#[derive(Debug, Clone, PartialEq)]
pub struct StepShape {
    pub batch: i64,
    pub seq_len: i64,
    /// Row-major `[batch, width]` anchor positions and validity, as `train/anchors.rs` packs
    /// them (valid anchors first, ascending; padding slots at 0 with keep = false).
    pub anchors: Vec<i64>,
    pub keep: Vec<bool>,
    /// Positions with a positive loss weight (the ones the LM head projects).
    pub weighted_positions: i64,
    /// Of those, the ones a Domino head corrects (`plan::flops::corrected_positions`); 0
    /// without a Domino head.
    pub corrected_positions: i64,
    /// Positions the LM head runs over (`plan::flops::head_positions`): the weighted ones, or
    /// with a DFlash2 head every slot of each block holding one.
    pub head_positions: i64,
    /// `training.loss_chunk_positions`.
    pub loss_chunk_positions: i64,
    /// The tree objective's budget (`train/tree_objective.rs`: each loss chunk keeps the top
    /// this many logits of every position); 0 under another objective.
    pub tree_budget: i64,
}

impl StepShape {
    /// Anchor slots per row.
    pub fn width(&self) -> i64 {
        self.anchors.len() as i64 / self.batch.max(1)
    }

    /// Draft positions of the micro-batch, `B · N · bs`.
    pub fn draft_positions(&self, block_size: i64) -> i64 {
        self.batch * self.width() * block_size
    }

    /// The typical step of a training run: every row `seq_len` long, the last
    /// `supervised_fraction` of it supervised (the assistant turns), `num_anchors` anchors
    /// drawn from the valid positions (`train/anchors.rs`: `p` and `p + 1` supervised). A
    /// uniform draw without replacement has its order statistics evenly spread on average,
    /// so the anchors are placed at those expected positions. Loss weights are positive on
    /// the block slots after the anchor whose label lies inside the row, and on slot 0 too with
    /// a DSpark head (`train/labels.rs`).
    pub fn typical(
        drafter: &DrafterConfig,
        batch: i64,
        seq_len: i64,
        num_anchors: i64,
        supervised_fraction: f64,
        loss_chunk_positions: i64,
    ) -> Self {
        let bs = drafter.block_size;
        let supervised = ((seq_len as f64) * supervised_fraction.clamp(0.0, 1.0)).round() as i64;
        let first = seq_len - supervised;
        // Valid anchors: first ..= seq_len - 2 (the last position has no supervised successor).
        let valid = (seq_len - 1 - first).max(0);
        let count = num_anchors.min(valid);
        let row: Vec<i64> = (0..count)
            .map(|i| first + ((i as f64 + 0.5) * valid as f64 / count as f64) as i64)
            .collect();
        // `train/micro.rs::MicroSource::prepare` pads every row to `num_anchors` slots
        // (`AnchorBatch::padded_to`), the ones beyond the valid count with keep = false.
        let width = num_anchors.max(0);
        let mut anchors = Vec::with_capacity((batch * width) as usize);
        let mut keep = Vec::with_capacity(anchors.capacity());
        for _ in 0..batch {
            anchors.extend(&row);
            keep.extend(std::iter::repeat_n(true, row.len()));
            anchors.extend(std::iter::repeat_n(0, (width - count) as usize));
            keep.extend(std::iter::repeat_n(false, (width - count) as usize));
        }
        // Slots 1..=n of a block are weighted, n = min(bs − 1, S − 1 − anchor); a Domino head
        // corrects those from its suffix start on. DSpark's slot k predicts a + k + 1, so its
        // slots 0..n are (`train/labels.rs::next_token_block_labels`), n + 1 = min(bs, S − 1 − a).
        let dspark = drafter.head.dspark().is_some();
        let weighted_slots = |a: i64| {
            if dspark {
                bs.min(seq_len - 1 - a)
            } else {
                (bs - 1).min(seq_len - 1 - a)
            }
        };
        let weighted: i64 = row.iter().map(|&a| weighted_slots(a)).sum();
        let corrected: i64 = drafter.head.domino().map_or(0, |m| {
            row.iter()
                .map(|&a| (weighted_slots(a) - m.pure_draft_prefix_len).max(0))
                .sum()
        });
        // DFlash2's LM head runs over whole blocks: all `bs` slots of each block with a
        // weighted slot.
        let head = if drafter.head.dflash2().is_some() {
            row.iter().filter(|&&a| weighted_slots(a) > 0).count() as i64 * bs
        } else {
            weighted
        };
        Self {
            batch,
            seq_len,
            anchors,
            keep,
            weighted_positions: batch * weighted,
            corrected_positions: batch * corrected,
            head_positions: batch * head,
            loss_chunk_positions,
            tree_budget: 0,
        }
    }

    /// The same step trained with the tree objective at `budget` nodes.
    pub fn with_tree_budget(self, budget: i64) -> Self {
        Self {
            tree_budget: budget.max(0),
            ..self
        }
    }

    /// Anchors that train (keep = true) over the whole micro-batch.
    pub fn kept(&self) -> usize {
        self.keep.iter().filter(|k| **k).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded;

    #[test]
    fn typical_anchors_are_valid_sorted_and_spread_over_the_supervised_span() {
        let target = crate::model::target::TargetConfig::tiny_default();
        let d = embedded::tiny_drafter_config(&target);
        let s = StepShape::typical(&d, 2, 1000, 100, 0.85, 2048);
        assert_eq!(s.width(), 100);
        assert_eq!(s.kept(), 200);
        let row = &s.anchors[..100];
        assert!(row.windows(2).all(|w| w[0] < w[1]), "{row:?}");
        assert!(row[0] >= 150 && row[0] < 160, "{}", row[0]);
        assert!(*row.last().unwrap() <= 998);
        // Fewer valid positions than anchors: every valid one, padded to num_anchors slots
        // (keep = false at position 0) as training pads them.
        let short = StepShape::typical(&d, 1, 10, 64, 0.5, 2048);
        assert_eq!(short.kept(), 4);
        assert_eq!(short.width(), 64);
        assert!(short.anchors[4..].iter().all(|&a| a == 0) && !short.keep[4..].contains(&true));
    }
    #[test]
    fn a_dspark_step_weights_slot_zero_as_its_labels_do() {
        use crate::model::drafter::{DrafterHead, DsparkConfig, MarkovHeadType};
        use crate::train::anchors::AnchorBatch;
        use crate::train::labels::{next_token_block_labels, Rows};
        let target = crate::model::target::TargetConfig::tiny_default();
        let d = DrafterConfig {
            head: DrafterHead::Dspark(DsparkConfig {
                markov_rank: 4,
                markov_head_type: MarkovHeadType::Vanilla,
                confidence_head: true,
                confidence_head_with_markov: false,
            }),
            ..embedded::tiny_dflash_drafter_config(&target)
        };
        let bs = d.block_size;
        // Anchors up to the row's end, where the blocks lose their last slots.
        let (seq, supervised) = (40, 0.5);
        let s = StepShape::typical(&d, 2, seq, 12, supervised, 2048);
        let first = seq - (seq as f64 * supervised).round() as i64;
        let ids = vec![7i64; (2 * seq) as usize];
        let mask: Vec<u8> = (0..2 * seq).map(|i| u8::from(i % seq >= first)).collect();
        let rows = Rows {
            input_ids: &ids,
            loss_mask: &mask,
            batch: 2,
            seq_len: seq as usize,
        };
        let width = s.width() as usize;
        let per_row: Vec<Vec<i64>> = (0..2)
            .map(|b| {
                (0..width)
                    .filter(|&j| s.keep[b * width + j])
                    .map(|j| s.anchors[b * width + j])
                    .collect()
            })
            .collect();
        let anchors = AnchorBatch::from_rows(&per_row, width);
        let labels = next_token_block_labels(rows, &anchors, bs as usize, Some(4.0));
        let weighted = labels.weights.iter().filter(|w| **w > 0.0).count() as i64;
        assert_eq!(s.weighted_positions, weighted);
        // DFlash's slots 1..bs − 1: one fewer per block whose row holds all DSpark's slots.
        let dflash = StepShape::typical(
            &embedded::tiny_dflash_drafter_config(&target),
            2,
            seq,
            12,
            supervised,
            2048,
        );
        let whole = per_row
            .iter()
            .flatten()
            .filter(|&&a| seq - 1 - a >= bs)
            .count() as i64;
        assert!(whole > 0 && whole < s.kept() as i64);
        assert_eq!(s.weighted_positions - dflash.weighted_positions, whole);
    }
}
