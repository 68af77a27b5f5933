//! The tree objective held to its written-out definition: the frontier against every path
//! enumerated, one block's loss and weights against finite differences, and the chunked
//! backward against a dense autograd oracle (a loss-mask hole inside a block, a block running
//! past the row's end, budgets below, at and above the vocabulary, every chunk size).
use super::*;
use crate::train::block_objective::{block_objective_backward, BlockObjectiveBatch, LossObjective};
use crate::train::loss::LossSums;
use tch::{Device, Kind, Tensor};

/// Deterministic, irregular values (no global generator: tests run in parallel).
fn wavy(n: usize, phase: f64, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| scale * ((i as f64 * 0.731 + phase).sin() + 0.5 * (i as f64 * 1.37).cos()))
        .collect()
}

/// Every prefix score of the paths over `per_depth` (all candidates of every depth).
fn all_prefix_scores(per_depth: &[Vec<f64>]) -> Vec<f64> {
    let mut scores: Vec<f64> = Vec::new();
    let mut level = vec![0.0];
    for depth in per_depth {
        level = level
            .iter()
            .flat_map(|s| depth.iter().map(move |l| s + l))
            .collect();
        scores.extend(&level);
    }
    scores.sort_by(|a, b| b.total_cmp(a));
    scores
}

/// `T_B` by enumeration: the `budget`-th best prefix score, −∞ past the last.
fn enumerated_threshold(per_depth: &[Vec<f64>], budget: usize) -> f64 {
    all_prefix_scores(per_depth)
        .get(budget - 1)
        .copied()
        .unwrap_or(f64::NEG_INFINITY)
}

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    z.iter().map(|v| v - lse).collect()
}

fn sorted_desc(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| b.total_cmp(a));
    v
}

fn tree(budget: usize, loss: TreeLoss) -> TreeObjective {
    TreeObjective {
        budget,
        temperature: 0.7,
        loss,
    }
}

#[test]
fn the_frontier_is_the_budget_th_best_of_every_path_prefix() {
    let vocab = 4;
    let per_depth: Vec<Vec<f64>> = (0..3)
        .map(|d| sorted_desc(log_softmax(&wavy(vocab, d as f64, 2.0))))
        .collect();
    let total = vocab + vocab * vocab + vocab * vocab * vocab;
    for budget in 1..=total + 2 {
        // The search reads only the top `budget` of each depth, as the chunk hands it.
        let cut: Vec<&[f64]> = per_depth
            .iter()
            .map(|c| &c[..c.len().min(budget)])
            .collect();
        let got = frontier_threshold(&cut, budget);
        let want = enumerated_threshold(&per_depth, budget);
        assert!(
            got == want || (got - want).abs() < 1e-12,
            "budget {budget}: {got} vs {want}"
        );
    }
    assert_eq!(frontier_threshold(&[], 3), f64::NEG_INFINITY);
}

#[test]
fn one_blocks_weights_are_minus_the_losss_derivative_in_each_log_probability() {
    let gold = [-0.3, -1.9, -0.8];
    let threshold = -2.1;
    for loss in [TreeLoss::Margin, TreeLoss::Expected] {
        let t = tree(8, loss);
        let terms = block_terms(&gold, threshold, &t);
        // The credit is detached: the derivative holds it at its value.
        let p = |s: f64| 1.0 / (1.0 + (-(s - threshold) / t.temperature).exp());
        let scores = [-0.3, -2.2, -3.0];
        let credit = [1.0, p(scores[0]), p(scores[1])];
        let loss_at = |g: &[f64]| -> f64 {
            let mut s = 0.0;
            g.iter()
                .enumerate()
                .map(|(k, l)| {
                    s += l;
                    let z = (s - threshold) / t.temperature;
                    match loss {
                        TreeLoss::Margin => credit[k] * t.temperature * (1.0 + (-z).exp()).ln(),
                        TreeLoss::Expected => t.temperature * (1.0 - p(s)),
                    }
                })
                .sum()
        };
        assert!((terms.loss - loss_at(&gold)).abs() < 1e-12, "{loss:?}");
        for i in 0..gold.len() {
            let (mut up, mut down) = (gold, gold);
            up[i] += 1e-6;
            down[i] -= 1e-6;
            let derivative = (loss_at(&up) - loss_at(&down)) / 2e-6;
            assert!(
                (terms.weights[i] + derivative).abs() < 1e-6,
                "{loss:?} slot {i}: {} vs {}",
                terms.weights[i],
                -derivative
            );
            assert!(terms.weights[i] > 0.0);
        }
    }
    // A tree that holds every node: nothing to gain, nothing to push.
    let all_in = block_terms(&gold, f64::NEG_INFINITY, &tree(8, TreeLoss::Margin));
    assert_eq!((all_in.loss, all_in.weights), (0.0, vec![0.0; 3]));
}

/// The loss written out densely with autograd: per block, its supervised slots' label
/// log-probabilities, their running sums `S`, the frontier by enumerating every path over the
/// supervised depths (all `V` tokens each), the detached credit, and the sum of the terms.
/// `logits`: `[n, V]` of `n` slots in blocks of `block_size`; `mask`: the supervised slots.
pub(crate) fn dense_tree_loss(
    logits: &Tensor,
    targets: &[i64],
    mask: &[bool],
    block_size: usize,
    tree: &TreeObjective,
) -> Tensor {
    let log_q = logits.log_softmax(-1, Kind::Double);
    let t = tree.temperature;
    let mut total = Tensor::zeros([], (Kind::Double, Device::Cpu));
    for block in 0..mask.len() / block_size {
        let slots: Vec<usize> = (block * block_size..(block + 1) * block_size)
            .filter(|&i| mask[i])
            .collect();
        let per_depth: Vec<Vec<f64>> = slots
            .iter()
            .map(|&i| Vec::<f64>::try_from(log_q.get(i as i64).detach()).unwrap())
            .collect();
        let threshold = enumerated_threshold(&per_depth, tree.budget);
        let mut score = Tensor::zeros([], (Kind::Double, Device::Cpu));
        let mut credit = 1.0;
        for &i in &slots {
            // Out of place: the autograd graph keeps every prefix's score.
            let next = &score + log_q.get(i as i64).get(targets[i]);
            score = next;
            let z = (&score - threshold) / t;
            let p = z.sigmoid();
            let term = match tree.loss {
                TreeLoss::Margin => z.neg().softplus() * (credit * t),
                TreeLoss::Expected => (p.ones_like() - &p) * t,
            };
            let next = &total + term;
            total = next;
            credit = p.double_value(&[]);
        }
    }
    total
}

/// Two rows of three blocks of 4 slots over a vocabulary of 5; the head is the identity, so
/// the drafter's output is the logits.
struct Case {
    logits: Vec<f64>,
    targets: Vec<i64>,
    mask: Vec<bool>,
}

const ROWS: usize = 2;
const BLOCK: usize = 4;
const SLOTS: usize = 3 * BLOCK;
const VOCAB: usize = 5;

fn case() -> Case {
    let n = ROWS * SLOTS;
    let mask = (0..n)
        .map(|i| {
            let (row, slot) = (i / SLOTS, i % SLOTS);
            let (block, k) = (slot / BLOCK, slot % BLOCK);
            // Slot 0 never trains; row 0's block 1 has a loss-mask hole at slot 2; row 1's
            // last block runs past the row's end after slot 1.
            k > 0 && !(row == 0 && block == 1 && k == 2) && !(row == 1 && block == 2 && k > 1)
        })
        .collect::<Vec<bool>>();
    let targets = (0..n)
        .map(|i| {
            if mask[i] {
                ((i * 3 + 1) % VOCAB) as i64
            } else {
                -100
            }
        })
        .collect();
    Case {
        logits: wavy(n * VOCAB, 0.4, 1.5),
        targets,
        mask,
    }
}

impl Case {
    fn leaf(&self) -> Tensor {
        Tensor::from_slice(&self.logits)
            .view([ROWS as i64, SLOTS as i64, VOCAB as i64])
            .to_kind(Kind::Float)
            .set_requires_grad(true)
    }

    fn targets(&self) -> Tensor {
        // The chunked loss never reads a label outside the mask; the dense one neither.
        let t: Vec<i64> = self.targets.iter().map(|&t| t.max(0)).collect();
        Tensor::from_slice(&t).view([ROWS as i64, SLOTS as i64])
    }

    fn mask(&self) -> Tensor {
        let m: Vec<f32> = self.mask.iter().map(|&m| f32::from(u8::from(m))).collect();
        Tensor::from_slice(&m).view([ROWS as i64, SLOTS as i64])
    }

    /// The oracle's loss `Σ L / rows` and its gradient in the logits.
    fn oracle(&self, tree: &TreeObjective) -> (f64, Vec<f64>) {
        let x = Tensor::from_slice(&self.logits)
            .view([-1, VOCAB as i64])
            .set_requires_grad(true);
        let loss = dense_tree_loss(&x, &self.targets, &self.mask, BLOCK, tree) / ROWS as f64;
        loss.backward();
        let grad = Vec::<f64>::try_from(x.grad().reshape([-1])).unwrap();
        (loss.double_value(&[]), grad)
    }

    fn chunked(&self, tree: TreeObjective, chunk: i64) -> (LossSums, Vec<f64>) {
        let x = self.leaf();
        let head = Tensor::eye(VOCAB as i64, (Kind::Float, Device::Cpu));
        let (targets, mask) = (self.targets(), self.mask());
        let batch = BlockObjectiveBatch {
            lm_head: &head,
            targets: &targets,
            mask: &mask,
            block_size: BLOCK as i64,
        };
        let sums = block_objective_backward(
            &(&x * 1.0),
            &batch,
            LossObjective::Tree(tree),
            ROWS as f64,
            chunk,
        );
        let grad = Vec::<f64>::try_from(x.grad().to_kind(Kind::Double).reshape([-1])).unwrap();
        (sums, grad)
    }
}

#[test]
fn values_and_gradients_agree_with_the_dense_oracle_at_every_chunk_size_and_budget() {
    let case = case();
    for loss in [TreeLoss::Margin, TreeLoss::Expected] {
        for budget in [1, 3, 7, 40] {
            let t = tree(budget, loss);
            let (want, want_grad) = case.oracle(&t);
            assert!(
                want_grad.iter().any(|g| g.abs() > 1e-4),
                "{loss:?} budget {budget} must train something"
            );
            for chunk in [1, 5, 8, 1000] {
                let (sums, grad) = case.chunked(t, chunk);
                let what = format!("{loss:?}, budget {budget}, chunk {chunk}");
                assert_eq!(sums.normaliser, ROWS as f64, "{what}");
                let supervised = case.mask.iter().filter(|&&m| m).count() as u64;
                assert_eq!(sums.counted, supervised, "{what}");
                assert!(
                    (sums.loss() - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{what}: {} vs {want}",
                    sums.loss()
                );
                for (i, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
                    assert!((g - w).abs() < 2e-5, "{what}, element {i}: {g} vs {w}");
                }
                // Outside the mask nothing moves: the hole and the slots past the row's end.
                for (slot, &m) in case.mask.iter().enumerate() {
                    if !m {
                        let row = &grad[slot * VOCAB..(slot + 1) * VOCAB];
                        assert!(row.iter().all(|&g| g == 0.0), "{what}, slot {slot}");
                    }
                }
            }
        }
    }
}
