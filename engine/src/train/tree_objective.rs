//! The tree objective (`training.objective = "tree"`): the drafter trained for the DDTree it is
//! served with (`decode/tree.rs`), not for the chain.
//!
//! DDTree keeps the `B` best paths of the drafter's per-depth log-probabilities, a path's score
//! being their sum along it. With `ℓ_k` the drafter's log-probability of slot `k`'s label, the
//! gold prefix through slot `k` scores `S_k = Σ_{j≤k} ℓ_j` and is in the tree exactly when `S_k`
//! reaches `T_B`, the score of the tree's `B`-th best node ([`frontier_threshold`]). A greedy
//! target whose tokens are the labels accepts every gold node in the tree, so the block's
//! accepted length is the number of gold prefixes at or above the frontier. Scores only fall
//! with depth, so a prefix above the frontier has its ancestors above it too.
//!
//! Per block, over its supervised slots `k` (`m_k = 1`), with `z_k = (S_k − T_B)/t` and
//! `p_k = σ(z_k)` (the soft "prefix `k` is in the tree"), two losses (`training.tree.loss`):
//!
//! - `margin`: `L = Σ_k c_k · t · softplus(−z_k)`, with `c_k = p_{k'}` detached, `k'` the
//!   supervised slot before `k` (`c = 1` for the first): a deep prefix counts as far as its
//!   parent is in the tree (D-PACE's credit). `−∂L/∂ℓ_i = Σ_{k≥i} c_k·(1−p_k)`: the soft
//!   probability that the walk stops at or after slot `i`.
//! - `expected`: `L = t · Σ_k (1 − p_k)`, the soft count of gold nodes the tree misses (GTO's
//!   expected tree acceptance, the labels standing for the target's tokens).
//!   `−∂L/∂ℓ_i = Σ_{k≥i} p_k·(1−p_k)`.
//!
//! `T_B` and the credit are detached: the loss moves the gold path, not the frontier (raising a
//! label's log-probability lowers every other token's, so the frontier falls with it). A slot
//! with `m_k = 0` (a loss-mask hole, a label past the row's end) is transparent, as in D-PACE: it
//! adds nothing to `S` and no depth to the frontier. Either loss is then the cross-entropy of each
//! supervised slot weighted by `w_i = −∂L/∂ℓ_i`, detached, and is backpropagated as such
//! (`block_objective.rs::block_objective_backward`); the loss reported is `L` itself, summed over blocks
//! and divided by the number of sequences, as D-PACE's default (`training.dpace_normalization`
//! is not read here).
//!
//! With a Domino head it applies to the corrected logits, teacher-forced: each depth's
//! candidates are those below the gold prefix, and the frontier is computed as if they held for
//! every node of that depth. That is exactly the DFlash head's tree, and an approximation of the
//! path-dependent tree `decode/tree.rs::grow_tree` serves a Domino drafter.
//!
//! Memory: a chunk adds the top `B` of its logits (`[c, B]`) beside the cross-entropy it already
//! computes, whose value gives each label's log-probability; no other vocabulary-wide tensor.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

pub use dflash_shared::config::TreeLoss;
use dflash_shared::config::{TreeSection, DEFAULT_SERVE_TREE_BUDGET, DEFAULT_TREE_TEMPERATURE};

/// `[training.tree]` as the trainer runs it, the budget resolved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeObjective {
    /// `B`: the DDTree node budget trained for.
    pub budget: usize,
    /// `t`: the margin's scale in nats.
    pub temperature: f64,
    pub loss: TreeLoss,
}

impl Default for TreeObjective {
    fn default() -> Self {
        Self {
            budget: DEFAULT_SERVE_TREE_BUDGET,
            temperature: DEFAULT_TREE_TEMPERATURE,
            loss: TreeLoss::default(),
        }
    }
}

impl TreeObjective {
    /// `[training.tree]`, its budget defaulting to `serve_tree_budget`.
    pub fn from_section(section: &TreeSection, serve_tree_budget: usize) -> Self {
        Self {
            budget: section.effective_budget(serve_tree_budget),
            temperature: section.temperature,
            loss: section.loss,
        }
    }
}

/// A candidate of the best-first search: a node at `depth` (0-based) of `rank` below a parent
/// scoring `parent`.
struct Candidate {
    score: f64,
    parent: f64,
    depth: usize,
    rank: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score)
    }
}

/// `T_B`: the score of the `budget`-th node DDTree's best-first search adds over `per_depth`
/// (depth `d + 1`'s candidate log-probabilities, best first, at least the top `budget` where
/// the vocabulary has them), the same search as `decode/tree.rs::build_tree`; −∞ when the
/// depths hold fewer than `budget` nodes, so that every prefix is in the tree.
pub fn frontier_threshold(per_depth: &[&[f64]], budget: usize) -> f64 {
    let Some(&first) = per_depth.first().and_then(|c| c.first()) else {
        return f64::NEG_INFINITY;
    };
    let mut heap = BinaryHeap::from([Candidate {
        score: first,
        parent: 0.0,
        depth: 0,
        rank: 0,
    }]);
    let mut added = 0;
    while let Some(node) = heap.pop() {
        added += 1;
        if added == budget {
            return node.score;
        }
        if let Some(&next) = per_depth[node.depth].get(node.rank + 1) {
            heap.push(Candidate {
                score: node.parent + next,
                rank: node.rank + 1,
                ..node
            });
        }
        if let Some(&child) = per_depth.get(node.depth + 1).and_then(|c| c.first()) {
            heap.push(Candidate {
                score: node.score + child,
                parent: node.score,
                depth: node.depth + 1,
                rank: 0,
            });
        }
    }
    f64::NEG_INFINITY
}

/// One block's loss and the weights of its supervised slots' cross-entropies.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockTerms {
    /// `w_i = −∂L/∂ℓ_i`, one per supervised slot, in slot order.
    pub weights: Vec<f64>,
    pub loss: f64,
}

fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// `ln(1 + e^x)` without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The block's loss and weights from its supervised slots' label log-probabilities `gold`
/// (slot order) and its frontier `threshold` (the module doc's formulas).
pub fn block_terms(gold: &[f64], threshold: f64, tree: &TreeObjective) -> BlockTerms {
    let t = tree.temperature;
    let mut score = 0.0;
    let mut parent_in = 1.0;
    // Per prefix: ∂L/∂S_k's size (what every ℓ_i, i ≤ k, receives) and its loss term.
    let mut pull = Vec::with_capacity(gold.len());
    let mut loss = 0.0;
    for &l in gold {
        score += l;
        let z = (score - threshold) / t;
        let p = sigmoid(z);
        match tree.loss {
            TreeLoss::Margin => {
                pull.push(parent_in * (1.0 - p));
                loss += parent_in * t * softplus(-z);
            }
            TreeLoss::Expected => {
                pull.push(p * (1.0 - p));
                loss += t * (1.0 - p);
            }
        }
        parent_in = p;
    }
    let mut weights = pull;
    for i in (0..weights.len().saturating_sub(1)).rev() {
        weights[i] += weights[i + 1];
    }
    BlockTerms { weights, loss }
}

/// The detached weights of one chunk's positions and the chunk's loss `Σ L` over its blocks.
///
/// - `logits`: `[c, V]` of the chunk's supervised positions, whole blocks, in slot order;
///   `ce` their cross-entropies against `targets`;
/// - `local`: each position's flat slot index from the chunk's first block (its block is
///   `local / block_size`).
pub(crate) fn tree_chunk_weights(
    logits: &Tensor,
    ce: &Tensor,
    targets: &Tensor,
    local: &Tensor,
    block_size: i64,
    tree: &TreeObjective,
) -> (Tensor, f64) {
    tch::no_grad(|| {
        let (logits, ce) = (logits.detach(), ce.detach());
        // log q(v) = logit_v − logsumexp, and the logsumexp is the label's logit plus its CE.
        let lse = logits
            .gather(1, &targets.unsqueeze(1), false)
            .squeeze_dim(1)
            + &ce;
        let k = (tree.budget as i64).min(logits.size()[1]).max(1);
        let (top, _) = logits.topk(k, -1, true, true);
        let host = |t: Tensor| {
            Vec::<f64>::try_from(t.to_kind(Kind::Double).to_device(Device::Cpu).reshape([-1]))
                .unwrap_or_default()
        };
        let top = host(top - lse.unsqueeze(1));
        let gold = host(ce.neg());
        let local = Vec::<i64>::try_from(&local.to_device(Device::Cpu)).unwrap_or_default();
        let k = k as usize;
        let mut weights = Vec::with_capacity(local.len());
        let mut loss = 0.0;
        let mut start = 0;
        while start < local.len() {
            let block = local[start] / block_size;
            let len = local[start..]
                .iter()
                .take_while(|&&p| p / block_size == block)
                .count();
            let per_depth: Vec<&[f64]> = (start..start + len)
                .map(|r| &top[r * k..(r + 1) * k])
                .collect();
            let threshold = frontier_threshold(&per_depth, tree.budget);
            let terms = block_terms(&gold[start..start + len], threshold, tree);
            weights.extend(terms.weights);
            loss += terms.loss;
            start += len;
        }
        let weights = Tensor::from_slice(&weights)
            .to_kind(ce.kind())
            .to_device(logits.device());
        (weights, loss)
    })
}

#[cfg(test)]
#[path = "tree_objective_tests.rs"]
pub(crate) mod tests;
