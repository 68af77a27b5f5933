//! D-PACE held to its written-out definition: values and gradients against a hand-computed
//! block, an f64 loop oracle on dense masks, the α = 1 closed form, and the normalisation
//! (duplicated rows, micro-batches summed then divided once).
use super::*;
use crate::train::block_objective::{
    block_aligned_chunks, block_objective_backward, BlockObjectiveBatch, LossObjective,
};
use crate::train::loss::LossSums;
use crate::train::tree_objective::TreeObjective;
use dflash_shared::config::{DpaceNormalization, Objective};
use tch::Device;

const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

/// Deterministic, irregular values (no global generator: tests run in parallel).
fn wavy(n: usize, phase: f64, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (scale * ((i as f64 * 0.731 + phase).sin() + 0.5 * (i as f64 * 1.37).cos())) as f32
        })
        .collect()
}

/// The weights straight from the definition, in f64: `w_k = Σ_{j≥k, m_j} ∏_{i≤j, m_i} s_i`.
fn loop_weights(q: &[f64], mask: &[bool], alpha: f64) -> Vec<f64> {
    let bs = q.len();
    let s = |i: usize| {
        if mask[i] {
            (1.0 - alpha) * q[i] + alpha
        } else {
            1.0
        }
    };
    (0..bs)
        .map(|k| {
            if !mask[k] {
                return 0.0;
            }
            (k..bs)
                .filter(|&j| mask[j])
                .map(|j| (0..=j).map(s).product::<f64>())
                .sum()
        })
        .collect()
}

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    z.iter().map(|v| v - lse).collect()
}

/// A batch as plain data: logits `[B, Q, V]` (the head is the identity), labels, mask.
struct Case {
    rows: usize,
    slots: usize,
    vocab: usize,
    block: usize,
    logits: Vec<f32>,
    targets: Vec<i64>,
    mask: Vec<bool>,
}

impl Case {
    fn random_like(rows: usize, blocks: usize, block: usize, vocab: usize) -> Self {
        let slots = blocks * block;
        let n = rows * slots;
        let logits = wavy(n * vocab, 0.3, 2.0);
        let targets = (0..n).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
        // Slot 0 never trains; some blocks lose a middle slot, one block is padding.
        let mask = (0..n)
            .map(|i| {
                let (blk, k) = (i / block, i % block);
                k > 0 && blk != 2 && !(blk % 3 == 1 && k == 2)
            })
            .collect();
        Case {
            rows,
            slots,
            vocab,
            block,
            logits,
            targets,
            mask,
        }
    }

    fn out(&self) -> Tensor {
        Tensor::from_slice(&self.logits)
            .view([self.rows as i64, self.slots as i64, self.vocab as i64])
            .set_requires_grad(true)
    }

    fn head(&self) -> Tensor {
        Tensor::eye(self.vocab as i64, CPU)
    }

    fn targets(&self) -> Tensor {
        Tensor::from_slice(&self.targets).view([self.rows as i64, self.slots as i64])
    }

    fn mask(&self) -> Tensor {
        let m: Vec<f32> = self.mask.iter().map(|&b| f32::from(u8::from(b))).collect();
        Tensor::from_slice(&m).view([self.rows as i64, self.slots as i64])
    }

    /// The loss and its gradient with respect to the logits from the definition, in f64 loops:
    /// `L = Σ CE·m·w / B` and, `w` being constant, `∂L/∂z_k = w_k (softmax(z_k) − e_y) / B`.
    fn oracle(&self, alpha: f64) -> (f64, Vec<f64>) {
        let v = self.vocab;
        let positions = self.rows * self.slots;
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
            let w = loop_weights(&q, &self.mask[b0..b0 + self.block], alpha);
            weights[b0..b0 + self.block].copy_from_slice(&w);
        }
        let rows = self.rows as f64;
        let loss = (0..positions).map(|p| ce[p] * weights[p]).sum::<f64>() / rows;
        let mut grad = vec![0.0; positions * v];
        for p in 0..positions {
            for c in 0..v {
                let onehot = f64::from(u8::from(c as i64 == self.targets[p]));
                grad[p * v + c] = weights[p] * (probs[p * v + c] - onehot) / rows;
            }
        }
        (loss, grad)
    }

    /// Runs [`dpace_ce_backward`] with the whole batch's denominator; loss and gradient.
    fn run(&self, alpha: f64, chunk: i64) -> (LossSums, Vec<f64>) {
        let out = self.out();
        let (head, targets, mask) = (self.head(), self.targets(), self.mask());
        let batch = BlockObjectiveBatch {
            lm_head: &head,
            targets: &targets,
            mask: &mask,
            block_size: self.block as i64,
        };
        let sums = block_objective_backward(
            &out,
            &batch,
            LossObjective::Dpace {
                alpha,
                normalization: DpaceNormalization::Sequences,
            },
            self.rows as f64,
            chunk,
        );
        let g = out.grad();
        let grad = if g.defined() {
            Vec::<f64>::try_from(&g.to_kind(Kind::Double).reshape([-1])).unwrap()
        } else {
            vec![0.0; self.logits.len()]
        };
        (sums, grad)
    }
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
fn a_hand_computed_block_has_the_papers_weights_loss_and_gradient() {
    // One row, one block of 4 over a vocabulary of 2 with all-zero logits: every slot gives its
    // label q = 1/2, so s = 0.75, P = (0.75, 0.5625, 0.421875) on slots 1..3, and
    // w = (1.734375, 0.984375, 0.421875); CE = ln 2 at every slot.
    let case = Case {
        rows: 1,
        slots: 4,
        vocab: 2,
        block: 4,
        logits: vec![0.0; 8],
        targets: vec![0, 1, 0, 1],
        mask: vec![false, true, true, true],
    };
    let (sums, grad) = case.run(0.5, 1000);
    let ln2 = std::f64::consts::LN_2;
    let w = [0.0, 1.734375, 0.984375, 0.421875];
    assert!((sums.weighted_ce - ln2 * 3.140625).abs() < 1e-6, "{sums:?}");
    assert!((sums.loss() - ln2 * 3.140625).abs() < 1e-6);
    assert!((sums.weight - 3.140625).abs() < 1e-6);
    assert_eq!((sums.normaliser, sums.counted), (1.0, 3));
    // ∂/∂z = w·(softmax − onehot): −w/2 on the label, +w/2 on the other token; slot 0 none.
    let want: Vec<f64> = (0..4)
        .flat_map(|k| {
            let label = case.targets[k] as usize;
            (0..2).map(move |c| if c == label { -w[k] / 2.0 } else { w[k] / 2.0 })
        })
        .collect();
    assert_close(&grad, &want, 1e-6, "gradient");
}

#[test]
fn block_weights_match_specforges_own_numbers_and_the_definition() {
    // SpecForge's test of `_dpace_weight`: q = 0, α = 0.25, three valid slots.
    let w = dpace_block_weights(&[0.0; 3], &[true; 3], 0.25);
    assert_close(
        &w,
        &[0.328125, 0.078125, 0.015625],
        1e-12,
        "SpecForge credit",
    );
    let q = [0.9, 0.2, 0.7, 0.4, 0.05, 0.6];
    let mask = [false, true, false, true, true, false];
    for alpha in [0.0, 0.3, 0.5, 1.0] {
        assert_close(
            &dpace_block_weights(&q, &mask, alpha),
            &loop_weights(&q, &mask, alpha),
            1e-12,
            &format!("alpha {alpha}"),
        );
    }
}

#[test]
fn values_and_gradients_agree_with_the_dense_loop_oracle_at_every_chunk_size() {
    let case = Case::random_like(2, 4, 5, 7);
    for alpha in [0.0, 0.5, 0.8] {
        let (want_loss, want_grad) = case.oracle(alpha);
        for chunk in [1, 4, 6, 1000] {
            let (sums, grad) = case.run(alpha, chunk);
            assert!(
                (sums.loss() - want_loss).abs() < 1e-5 * want_loss.abs().max(1.0),
                "alpha {alpha} chunk {chunk}: {} vs {want_loss}",
                sums.loss()
            );
            assert_close(
                &grad,
                &want_grad,
                1e-5,
                &format!("alpha {alpha} chunk {chunk}"),
            );
            assert_eq!(
                sums.counted,
                case.mask.iter().filter(|&&m| m).count() as u64
            );
        }
    }
}

#[test]
fn alpha_one_weights_each_slot_by_the_valid_slots_from_it_on() {
    // α = 1: s = 1, P = 1, w_k = #{j ≥ k valid}: a closed form with no dependence on q.
    let case = Case::random_like(2, 3, 4, 5);
    let (sums, grad) = case.run(1.0, 3);
    let (want_loss, want_grad) = case.oracle(1.0);
    let mut closed = 0.0;
    for b0 in (0..case.rows * case.slots).step_by(case.block) {
        for k in 0..case.block {
            let p = b0 + k;
            if !case.mask[p] {
                continue;
            }
            let later = (k..case.block).filter(|&j| case.mask[b0 + j]).count() as f64;
            let z: Vec<f64> = case.logits[p * case.vocab..(p + 1) * case.vocab]
                .iter()
                .map(|&x| x as f64)
                .collect();
            closed += -log_softmax(&z)[case.targets[p] as usize] * later;
        }
    }
    closed /= case.rows as f64;
    assert!(
        (sums.loss() - closed).abs() < 1e-5 * closed,
        "{} vs {closed}",
        sums.loss()
    );
    assert!((want_loss - closed).abs() < 1e-9 * closed);
    assert_close(&grad, &want_grad, 1e-5, "gradient");
}

#[test]
fn doubling_the_rows_by_duplication_leaves_the_loss_and_gradient_unchanged() {
    let base = Case::random_like(2, 3, 4, 6);
    let twice = Case {
        rows: 4,
        logits: [base.logits.clone(), base.logits.clone()].concat(),
        targets: [base.targets.clone(), base.targets.clone()].concat(),
        mask: [base.mask.clone(), base.mask.clone()].concat(),
        ..Case::random_like(2, 3, 4, 6)
    };
    // The drafter's parameters are shared by every row: a projection in front of the head.
    let proj = Tensor::from_slice(&wavy(36, 1.1, 0.4))
        .view([6, 6])
        .set_requires_grad(true);
    let run = |c: &Case| {
        if proj.grad().defined() {
            let _ = proj.grad().zero_();
        }
        let out = c.out().detach().matmul(&proj);
        let (head, targets, mask) = (c.head(), c.targets(), c.mask());
        let batch = BlockObjectiveBatch {
            lm_head: &head,
            targets: &targets,
            mask: &mask,
            block_size: c.block as i64,
        };
        let sums = block_objective_backward(
            &out,
            &batch,
            LossObjective::Dpace {
                alpha: 0.5,
                normalization: DpaceNormalization::Sequences,
            },
            c.rows as f64,
            5,
        );
        (sums, proj.grad().copy())
    };
    let (one, grad_one) = run(&base);
    let (two, grad_two) = run(&twice);
    assert_eq!((one.normaliser, two.normaliser), (2.0, 4.0));
    assert!(
        (one.loss() - two.loss()).abs() < 1e-6 * one.loss(),
        "{one:?} {two:?}"
    );
    assert!(grad_one.allclose(&grad_two, 1e-5, 1e-7, false));
    assert!(grad_one.abs().sum(Kind::Float).double_value(&[]) > 0.0);
}

#[test]
fn micro_batches_summed_then_divided_once_give_the_whole_batchs_gradient() {
    // What `RankState::step` does across micro-batches and ranks: each backward runs on the
    // numerator (denominator 1), the gradients add up, one division by Σ normaliser.
    let case = Case::random_like(4, 3, 4, 6);
    let (whole, grad_whole) = case.run(0.5, 4);
    let out = case.out();
    let (targets, mask) = (case.targets(), case.mask());
    let mut total = LossSums::default();
    for (start, len) in [(0, 1), (1, 3)] {
        let head = case.head();
        let (targets, mask) = (targets.narrow(0, start, len), mask.narrow(0, start, len));
        let batch = BlockObjectiveBatch {
            lm_head: &head,
            targets: &targets,
            mask: &mask,
            block_size: case.block as i64,
        };
        total.add(&block_objective_backward(
            &out.narrow(0, start, len),
            &batch,
            LossObjective::Dpace {
                alpha: 0.5,
                normalization: DpaceNormalization::Sequences,
            },
            1.0,
            4,
        ));
    }
    assert_eq!(total.normaliser, 4.0);
    let grad: Vec<f64> =
        Vec::<f64>::try_from(&(out.grad().to_kind(Kind::Double) / total.normaliser).reshape([-1]))
            .unwrap();
    assert!((total.loss() - whole.loss()).abs() < 1e-6 * whole.loss());
    assert_close(&grad, &grad_whole, 1e-6, "gradient");
}

#[test]
fn chunks_hold_whole_blocks() {
    // Blocks of 4: positions 1,2,3 | 5,6 | 9 | 13,14,15.
    let p = [1, 2, 3, 5, 6, 9, 13, 14, 15];
    assert_eq!(
        block_aligned_chunks(&p, 4, 1),
        [(0, 3), (3, 2), (5, 1), (6, 3)]
    );
    assert_eq!(block_aligned_chunks(&p, 4, 5), [(0, 5), (5, 4)]);
    assert_eq!(block_aligned_chunks(&p, 4, 6), [(0, 6), (6, 3)]);
    assert_eq!(block_aligned_chunks(&p, 4, 100), [(0, 9)]);
    assert!(block_aligned_chunks(&[], 4, 8).is_empty());
}

#[test]
fn nothing_valid_trains_nothing_and_still_counts_the_sequences() {
    let case = Case {
        mask: vec![false; 2 * 8],
        ..Case::random_like(2, 2, 4, 3)
    };
    let (sums, grad) = case.run(0.5, 8);
    assert_eq!(
        (sums.weighted_ce, sums.counted, sums.normaliser),
        (0.0, 0, 2.0)
    );
    assert!(grad.iter().all(|g| *g == 0.0));
}

#[test]
fn the_objective_follows_the_config() {
    let weight_sum = DpaceNormalization::WeightSum;
    assert_eq!(
        LossObjective::from_config(Objective::Dflash, 0.5, weight_sum, TreeObjective::default()),
        LossObjective::Dflash
    );
    assert_eq!(
        LossObjective::from_config(Objective::Dpace, 0.25, weight_sum, TreeObjective::default()),
        LossObjective::Dpace {
            alpha: 0.25,
            normalization: weight_sum
        }
    );
    let tree = TreeObjective {
        budget: 8,
        ..TreeObjective::default()
    };
    assert_eq!(
        LossObjective::from_config(Objective::Tree, 0.25, weight_sum, tree),
        LossObjective::Tree(tree)
    );
}
