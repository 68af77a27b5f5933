//! D-PACE's four normalisations (`training.dpace_normalization`) held to written-out formulas:
//! a hand-computed batch, and a batch built as training builds it (rows, anchors drawn where
//! the anchor and the next token are supervised, `block_labels`) with a loss-mask hole inside
//! a block, a block running past the sequence's end and a row with no valid anchor, whose loss
//! and gradient must be the dense f64 formula's at every chunk size and however the batch is
//! split into micro-batches (numerators summed, then one division by the summed normaliser).
use super::*;
use crate::train::anchors::AnchorBatch;
use crate::train::block_objective::{block_objective_backward, BlockObjectiveBatch, LossObjective};
use crate::train::labels::{block_labels, LabelMaskRule, Rows};
use crate::train::loss::LossSums;

const ALPHA: f64 = 0.5;

fn objective(normalization: DpaceNormalization) -> LossObjective {
    LossObjective::Dpace {
        alpha: ALPHA,
        normalization,
    }
}

/// A batch as plain data: the drafter's output is the logits `[B, Q, V]` (the head is the
/// identity), with the labels and the 0/1 mask `m`.
struct Batch {
    rows: usize,
    slots: usize,
    vocab: usize,
    block: usize,
    logits: Vec<f32>,
    targets: Vec<i64>,
    mask: Vec<bool>,
}

/// What a run of the chunked backward gives: its sums, and the gradient with respect to the
/// logits divided by the normaliser it reports (as `RankState::step` divides).
struct Run {
    sums: LossSums,
    grad: Vec<f64>,
}

impl Batch {
    /// Three sequences of 12 tokens, blocks of 4, three anchor columns, drawn as training
    /// draws them (an anchor's token and the next are supervised):
    ///
    /// - row 0: a loss-mask hole at token 6 and anchors 1, 4, 10: the block at 4 trains
    ///   labels 5 and 7 around the hole, the block at 10 trains 11 and runs past the end;
    /// - row 1: nothing supervised, so no valid anchor: all three columns are padding;
    /// - row 2: a 3-token prompt, anchors 3 and 7, and a padding column.
    ///
    /// So `A = (3, 0, 2)` blocks with a supervised slot and `T = (6, 0, 6)` supervised slots.
    fn built_as_training_builds_it() -> Self {
        const SEQ: usize = 12;
        let (block, vocab, width) = (4, 5, 3);
        let input_ids: Vec<i64> = (0..3 * SEQ).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
        let mut loss_mask = vec![0u8; 3 * SEQ];
        for p in 0..SEQ {
            loss_mask[p] = u8::from(p != 6);
            loss_mask[2 * SEQ + p] = u8::from(p >= 3);
        }
        let rows = Rows {
            input_ids: &input_ids,
            loss_mask: &loss_mask,
            batch: 3,
            seq_len: SEQ,
        };
        let anchors = AnchorBatch::from_rows(&[vec![1, 4, 10], vec![], vec![3, 7]], width);
        let labels = block_labels(rows, &anchors, block, None, LabelMaskRule::Independent);
        let slots = width * block;
        Batch {
            rows: 3,
            slots,
            vocab,
            block,
            logits: wavy(3 * slots * vocab),
            targets: labels.targets,
            mask: labels.valid,
        }
    }

    fn out(&self) -> Tensor {
        Tensor::from_slice(&self.logits)
            .view([self.rows as i64, self.slots as i64, self.vocab as i64])
            .set_requires_grad(true)
    }

    fn targets(&self) -> Tensor {
        Tensor::from_slice(&self.targets).view([self.rows as i64, self.slots as i64])
    }

    fn mask(&self) -> Tensor {
        let m: Vec<f32> = self.mask.iter().map(|&b| f32::from(u8::from(b))).collect();
        Tensor::from_slice(&m).view([self.rows as i64, self.slots as i64])
    }

    /// The chunked backward over the rows `start..start + len` of the leaf `out`, on their
    /// numerator (denominator 1).
    fn backward(
        &self,
        out: &Tensor,
        (start, len): (i64, i64),
        normalization: DpaceNormalization,
        chunk: i64,
    ) -> LossSums {
        let head = Tensor::eye(self.vocab as i64, (Kind::Float, Device::Cpu));
        let (targets, mask) = (
            self.targets().narrow(0, start, len),
            self.mask().narrow(0, start, len),
        );
        let batch = BlockObjectiveBatch {
            lm_head: &head,
            targets: &targets,
            mask: &mask,
            block_size: self.block as i64,
        };
        let out = out.narrow(0, start, len);
        block_objective_backward(&out, &batch, objective(normalization), 1.0, chunk)
    }

    /// The whole batch in micro-batches of `splits` rows each (in order), their sums added
    /// and the summed gradient divided once by the summed normaliser.
    fn run(&self, normalization: DpaceNormalization, splits: &[i64], chunk: i64) -> Run {
        assert_eq!(splits.iter().sum::<i64>(), self.rows as i64);
        let out = self.out();
        let mut sums = LossSums::default();
        let mut start = 0;
        for &len in splits {
            sums.add(&self.backward(&out, (start, len), normalization, chunk));
            start += len;
        }
        let g = out.grad();
        let grad = if g.defined() {
            let divided = g.to_kind(Kind::Double) / sums.normaliser;
            Vec::<f64>::try_from(&divided.reshape([-1])).unwrap()
        } else {
            vec![0.0; self.logits.len()]
        };
        Run { sums, grad }
    }

    /// The loss and its gradient from the definition, in f64 loops. Per row `b`, with
    /// `num_b = Σ CE·m·w` over its blocks, `W_b = Σ m·w`, `A_b` its blocks with a supervised
    /// slot and `T_b` its supervised slots, the row's factor `f_b` and the divisor `D`:
    ///
    /// - sequences: `f_b = 1`, `D = B`;
    /// - weight_sum: `f_b = 1`, `D = Σ_b W_b`;
    /// - anchors_per_sequence: `f_b = 1/A_b` (0 when `A_b = 0`), `D = #{b : A_b > 0}`;
    /// - tokens_per_sequence: `f_b = 1/(T_b + 1e-5)`, `D = B`;
    ///
    /// `L = Σ_b f_b·num_b / D` and, `w` being constant, `∂L/∂z_k = f_b·w_k (softmax(z_k) −
    /// e_y) / D` for slot `k` of row `b`.
    fn oracle(&self, normalization: DpaceNormalization) -> (f64, Vec<f64>) {
        let (v, positions) = (self.vocab, self.rows * self.slots);
        let mut ce = vec![0.0; positions];
        let mut probs = vec![0.0; positions * v];
        for p in 0..positions {
            let z: Vec<f64> = self.logits[p * v..(p + 1) * v]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let ls = log_softmax(&z);
            ce[p] = -ls[self.targets[p] as usize];
            for c in 0..v {
                probs[p * v + c] = ls[c].exp();
            }
        }
        let mut weights = vec![0.0; positions];
        for b0 in (0..positions).step_by(self.block) {
            let q: Vec<f64> = ce[b0..b0 + self.block].iter().map(|c| (-c).exp()).collect();
            let w = dpace_block_weights(&q, &self.mask[b0..b0 + self.block], ALPHA);
            weights[b0..b0 + self.block].copy_from_slice(&w);
        }
        let row_slots = |b: usize| b * self.slots..(b + 1) * self.slots;
        let num: Vec<f64> = (0..self.rows)
            .map(|b| row_slots(b).map(|p| ce[p] * weights[p]).sum())
            .collect();
        let weight_sum: f64 = weights.iter().sum();
        let anchors: Vec<f64> = (0..self.rows)
            .map(|b| {
                let row = &self.mask[row_slots(b)];
                row.chunks(self.block)
                    .filter(|blk| blk.contains(&true))
                    .count() as f64
            })
            .collect();
        let tokens: Vec<f64> = (0..self.rows)
            .map(|b| self.mask[row_slots(b)].iter().filter(|&&m| m).count() as f64)
            .collect();
        let rows = self.rows as f64;
        let (factor, divisor): (Vec<f64>, f64) = match normalization {
            DpaceNormalization::Sequences => (vec![1.0; self.rows], rows),
            DpaceNormalization::WeightSum => (vec![1.0; self.rows], weight_sum),
            DpaceNormalization::AnchorsPerSequence => (
                anchors
                    .iter()
                    .map(|&a| if a > 0.0 { 1.0 / a } else { 0.0 })
                    .collect(),
                anchors.iter().filter(|&&a| a > 0.0).count() as f64,
            ),
            DpaceNormalization::TokensPerSequence => {
                (tokens.iter().map(|&t| 1.0 / (t + 1e-5)).collect(), rows)
            }
        };
        let loss = (0..self.rows).map(|b| factor[b] * num[b]).sum::<f64>() / divisor;
        let mut grad = vec![0.0; positions * v];
        for p in 0..positions {
            let row_factor = factor[p / self.slots];
            for c in 0..v {
                let onehot = f64::from(u8::from(c as i64 == self.targets[p]));
                grad[p * v + c] = row_factor * weights[p] * (probs[p * v + c] - onehot) / divisor;
            }
        }
        (loss, grad)
    }
}

/// Deterministic, irregular values (no global generator: tests run in parallel).
fn wavy(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (2.0 * ((i as f64 * 0.731 + 0.3).sin() + 0.5 * (i as f64 * 1.37).cos())) as f32)
        .collect()
}

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    z.iter().map(|v| v - lse).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn the_batch_built_as_training_builds_it_has_the_hole_the_overrun_and_the_anchorless_row() {
    let batch = Batch::built_as_training_builds_it();
    let slot = |row: usize, block: usize| row * batch.slots + block * batch.block;
    let at = |start: usize| batch.mask[start..start + batch.block].to_vec();
    // Row 0: the block at 4 skips the hole at token 6; the block at 10 trains token 11 only.
    assert_eq!(at(slot(0, 1)), [false, true, false, true]);
    assert_eq!(at(slot(0, 2)), [false, true, false, false]);
    assert!(batch.mask[batch.slots..2 * batch.slots].iter().all(|m| !m));
    assert_eq!(at(slot(2, 2)), [false; 4], "row 2's padding column");
    assert_eq!(
        row_support(&batch.mask(), 4),
        (vec![3, 0, 2], vec![6, 0, 6])
    );
}

#[test]
fn a_hand_computed_batch_gives_each_normalizations_value() {
    // All-zero logits over a vocabulary of 2: every label has q = 1/2 and CE = ln 2, and a
    // block of 4 with slots 1..3 supervised has w = (1.734375, 0.984375, 0.421875), so its
    // sum is S = 3.140625·ln 2. Row 0 holds two such blocks (A = 2, T = 6), row 1 one and
    // a padding block (A = 1, T = 3), row 2 only padding (A = 0, T = 0).
    let block = [false, true, true, true];
    let pad = [false; 4];
    let batch = Batch {
        rows: 3,
        slots: 8,
        vocab: 2,
        block: 4,
        logits: vec![0.0; 3 * 8 * 2],
        targets: vec![1; 24],
        mask: [block, block, block, pad, pad, pad].concat(),
    };
    let s = 3.140625 * std::f64::consts::LN_2;
    let eps = TOKENS_PER_SEQUENCE_EPSILON;
    for (normalization, numerator, normaliser) in [
        (DpaceNormalization::Sequences, 3.0 * s, 3.0),
        (DpaceNormalization::WeightSum, 3.0 * s, 3.0 * 3.140625),
        (DpaceNormalization::AnchorsPerSequence, 2.0 * s, 2.0),
        (
            DpaceNormalization::TokensPerSequence,
            2.0 * s / (6.0 + eps) + s / (3.0 + eps),
            3.0,
        ),
    ] {
        let Run { sums, .. } = batch.run(normalization, &[3], 1000);
        assert!(
            (sums.weighted_ce - numerator).abs() < 1e-6 * numerator,
            "{normalization:?}: {sums:?}"
        );
        assert!(
            (sums.normaliser - normaliser).abs() < 1e-9,
            "{normalization:?}: {sums:?}"
        );
        assert!(
            (sums.weight - 3.0 * 3.140625).abs() < 1e-6,
            "Σw carries no factor"
        );
    }
}

#[test]
fn each_normalizations_loss_and_gradient_are_the_dense_formulas_at_every_chunk_size() {
    let batch = Batch::built_as_training_builds_it();
    for normalization in DpaceNormalization::ALL {
        let (want_loss, want_grad) = batch.oracle(normalization);
        for chunk in [1, 5, 1000] {
            let what = format!("{normalization:?}, chunk {chunk}");
            let Run { sums, grad } = batch.run(normalization, &[3], chunk);
            assert!(
                (sums.loss() - want_loss).abs() < 1e-5 * want_loss.abs().max(1.0),
                "{what}: {} vs {want_loss}",
                sums.loss()
            );
            assert_close(&grad, &want_grad, 1e-5, &what);
            assert!(grad.iter().any(|g| *g != 0.0), "{what}: something trains");
        }
    }
}

#[test]
fn splitting_the_batch_into_micro_batches_changes_neither_loss_nor_gradient() {
    // Every normalisation is a numerator and a normaliser that both add up, so micro-batches
    // (and ranks) summed before the one division give the whole batch's gradient: the
    // anchorless row alone, or with its neighbours, or the batch row by row.
    let batch = Batch::built_as_training_builds_it();
    for normalization in DpaceNormalization::ALL {
        let whole = batch.run(normalization, &[3], 4);
        for splits in [&[1, 2][..], &[2, 1], &[1, 1, 1]] {
            let what = format!("{normalization:?}, micro-batches of {splits:?} rows");
            let split = batch.run(normalization, splits, 4);
            assert!(
                (split.sums.normaliser - whole.sums.normaliser).abs() < 1e-9,
                "{what}: {:?} vs {:?}",
                split.sums,
                whole.sums
            );
            assert!(
                (split.sums.loss() - whole.sums.loss()).abs() < 1e-6 * whole.sums.loss(),
                "{what}"
            );
            assert_close(&split.grad, &whole.grad, 1e-6, &what);
        }
    }
}

#[test]
fn the_default_divides_by_every_sequence_as_before_the_key() {
    let batch = Batch::built_as_training_builds_it();
    assert_eq!(DpaceNormalization::default(), DpaceNormalization::Sequences);
    let Run { sums, .. } = batch.run(DpaceNormalization::default(), &[3], 1000);
    assert_eq!(sums.normaliser, 3.0, "the anchorless row counts too");
    let anchors = batch.run(DpaceNormalization::AnchorsPerSequence, &[3], 1000);
    assert_eq!(
        anchors.sums.normaliser, 2.0,
        "only rows with an anchor count"
    );
}

#[test]
fn the_row_factors_and_normalisers_are_the_documented_ones() {
    let eps = TOKENS_PER_SEQUENCE_EPSILON;
    assert_eq!(dpace_row_scale(DpaceNormalization::Sequences, 3, 9), 1.0);
    assert_eq!(dpace_row_scale(DpaceNormalization::WeightSum, 3, 9), 1.0);
    assert_eq!(
        dpace_row_scale(DpaceNormalization::AnchorsPerSequence, 4, 9),
        0.25
    );
    assert_eq!(
        dpace_row_scale(DpaceNormalization::AnchorsPerSequence, 0, 0),
        0.0
    );
    assert_eq!(
        dpace_row_scale(DpaceNormalization::TokensPerSequence, 3, 4),
        1.0 / (4.0 + eps)
    );
    let anchors = [3, 0, 2];
    for (normalization, want) in [
        (DpaceNormalization::Sequences, 3.0),
        (DpaceNormalization::WeightSum, 7.5),
        (DpaceNormalization::AnchorsPerSequence, 2.0),
        (DpaceNormalization::TokensPerSequence, 3.0),
    ] {
        assert_eq!(dpace_normaliser(normalization, &anchors, 7.5), want);
    }
}
