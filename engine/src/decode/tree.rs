//! DDTree speculative decoding (liranringel/ddtree `ddtree_generate`), greedy, one prompt:
//! the drafter's block is turned into a tree of candidate continuations, best first by path
//! probability under a node budget; the target verifies the whole tree in one forward
//! ([`TargetModel::forward_tree`]); the longest path that follows the target's greedy choices
//! is committed, and both caches keep that path only.
//!
//! Building the tree ([`build_tree`]) is pure: per depth `d = 1 … bs−1` the drafter's top
//! `min(budget, vocab)` log-probabilities, then a best-first search over paths. The search
//! starts from (depth 1, rank 0); popping a candidate adds it as a node and offers its next
//! sibling (same parent, rank + 1) and its first child (depth + 1, rank 0). A path's score is
//! the sum of its log-probabilities; since every term is ≤ 0, pops come in non-increasing score
//! and the tree of budget `B` is the first `B` nodes of the tree of any larger budget.
//!
//! A Domino drafter's distributions depend on the path (its correction reads the tokens
//! before a slot), so its tree is grown by the same search with each node's children ranked by
//! the corrected logits its own path gives ([`grow_tree`]): the GRU steps from the root
//! through the node's ancestors, as the chain steps through its drafts. The chain's greedy
//! draft is still the rank-0 path, and the score, tie rules and the budget-prefix property
//! are unchanged. Neither DDTree nor SpecForge defines a Domino tree; this is dflashd's
//! construction, chosen because it is the tree whose every path is a chain the drafter would
//! draft, each node's probability the one serving's chain would give it.
//!
//! Ties, on which greedy agreement with other implementations depends:
//! - within a depth, tokens of equal log-probability are ranked by token id, lowest first (the
//!   reference takes `torch.topk`'s order, which on CPU is not index order); rank 0 is thus the
//!   chain's greedy draft (`argmax`, lowest id on ties);
//! - between candidates of equal score, the one whose rank tuple (its path's ranks, depth 1
//!   first) is lexicographically smaller is popped first, as the reference's heap of tuples does.
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use tch::{Kind, Tensor};

use super::chain::{check_fit, prefill, Generation, PeerCount, Settings};
use super::draft::{BlockDraft, DraftLogits, PathState};
use super::error::DecodeError;
use super::sampling::argmax;
use super::sampling::Sampling;
use crate::model::drafter::Drafter;
use crate::model::target::{TargetModel, TreeShape};

/// A tree of draft tokens below the round's root (the last committed token, not a node here).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree {
    /// Node tokens in insertion (best-first) order.
    pub tokens: Vec<i64>,
    /// Each node's parent node, `None` for a child of the root.
    pub parents: Vec<Option<usize>>,
    /// 1 for a child of the root.
    pub depths: Vec<usize>,
    /// The path's summed log-probability.
    pub scores: Vec<f64>,
}

impl DraftTree {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The verification input: the root (index 0) and then every node (node `n` at `n + 1`).
    pub fn verify_shape(&self) -> TreeShape {
        let mut parents = vec![None];
        parents.extend(self.parents.iter().map(|p| Some(p.map_or(0, |p| p + 1))));
        TreeShape::new(parents).expect("best-first adds a parent before its children")
    }

    /// The node below `parent` (`None`: the root) carrying `token`, if any (siblings carry
    /// distinct tokens).
    pub fn child(&self, parent: Option<usize>, token: i64) -> Option<usize> {
        (0..self.len()).find(|&n| self.parents[n] == parent && self.tokens[n] == token)
    }

    /// The tokens from the root's child down to `node`.
    pub fn path_tokens(&self, node: usize) -> Vec<i64> {
        let mut path: Vec<i64> = std::iter::successors(Some(node), |&n| self.parents[n])
            .map(|n| self.tokens[n])
            .collect();
        path.reverse();
        path
    }
}

/// One depth's candidates, best first: `(token, log-probability)`.
pub type Candidates = Vec<(i64, f64)>;

/// A candidate node of the search.
struct Frontier {
    score: f64,
    /// The ranks along its path, depth 1 first.
    ranks: Vec<usize>,
    parent: Option<usize>,
}

impl Frontier {
    fn depth(&self) -> usize {
        self.ranks.len()
    }
}

impl PartialEq for Frontier {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Frontier {}

impl PartialOrd for Frontier {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Frontier {
    /// The max-heap pops the highest score; on equal scores the smaller rank tuple.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.ranks.cmp(&self.ranks))
    }
}

/// The best-first tree of at most `budget` nodes over `per_depth[d−1]` (depth d's candidates,
/// best first; see the module doc for the order).
pub fn build_tree(per_depth: &[Candidates], budget: usize) -> DraftTree {
    grow_tree(budget, |parent, tree| {
        let depth = parent.map_or(0, |p| tree.depths[p]);
        per_depth.get(depth).cloned().unwrap_or_default()
    })
}

/// The best-first tree of at most `budget` nodes where the candidates below a node depend on
/// its path (a Domino drafter's, whose correction reads the path's tokens): `children(parent,
/// tree)` gives the candidates below `parent` (`None`: the root), best first, empty at the
/// deepest depth. It is called for the root first and then for each node as it is added,
/// except the last, in insertion order; the search is [`build_tree`]'s.
pub fn grow_tree(
    budget: usize,
    mut children: impl FnMut(Option<usize>, &DraftTree) -> Candidates,
) -> DraftTree {
    let mut search = TreeSearch::new(budget);
    while let Some(parent) = search.wanted() {
        let candidates = children(parent, search.tree());
        search.offer(candidates);
    }
    search.into_tree()
}

/// [`grow_tree`]'s search, turned inside out: the caller asks which node's children it needs
/// ([`Self::wanted`]) and hands them over ([`Self::offer`]). Many trees can then be grown in
/// lockstep with one batched drafter call per step (the offline oracle, `train/tree_metrics.rs`)
/// while each tree is exactly the one [`grow_tree`] grows.
pub struct TreeSearch {
    budget: usize,
    tree: DraftTree,
    /// `below[0]`: the root's children; `below[n + 1]`: node n's.
    below: Vec<Candidates>,
    heap: BinaryHeap<Frontier>,
    /// Each node's ranks along its path, depth 1 first.
    ranks: Vec<Vec<usize>>,
    /// Whose children the search needs next (`Some(None)`: the root's); `None` once done.
    wanted: Option<Option<usize>>,
}

impl TreeSearch {
    pub fn new(budget: usize) -> Self {
        TreeSearch {
            budget,
            tree: DraftTree {
                tokens: Vec::new(),
                parents: Vec::new(),
                depths: Vec::new(),
                scores: Vec::new(),
            },
            below: Vec::new(),
            heap: BinaryHeap::new(),
            ranks: Vec::new(),
            wanted: (budget > 0).then_some(None),
        }
    }

    /// The node whose children the search needs next (`Some(None)`: the root's), or `None`
    /// when the tree is complete.
    pub fn wanted(&self) -> Option<Option<usize>> {
        self.wanted
    }

    /// The tree so far.
    pub fn tree(&self) -> &DraftTree {
        &self.tree
    }

    pub fn into_tree(self) -> DraftTree {
        self.tree
    }

    /// The candidates below [`Self::wanted`]'s node, best first; the search then adds the next
    /// node. Ignored once the tree is complete.
    pub fn offer(&mut self, candidates: Candidates) {
        let Some(parent) = self.wanted.take() else {
            return;
        };
        let first = candidates.first().map(|&(_, logp)| logp);
        self.below.push(candidates);
        if let Some(logp) = first {
            let (score, ranks) = match parent {
                None => (logp, vec![0]),
                Some(node) => {
                    let mut ranks = self.ranks[node].clone();
                    ranks.push(0);
                    (self.tree.scores[node] + logp, ranks)
                }
            };
            self.heap.push(Frontier {
                score,
                ranks,
                parent,
            });
        }
        self.add_next();
    }

    /// Pops the best candidate into the tree and offers its next sibling; then wants the new
    /// node's children unless the budget is spent or nothing is left.
    fn add_next(&mut self) {
        if self.tree.len() >= self.budget {
            return;
        }
        let Some(node) = self.heap.pop() else { return };
        let depth = node.depth();
        let rank = *node.ranks.last().expect("a candidate has a depth");
        let siblings = &self.below[node.parent.map_or(0, |p| p + 1)];
        let (token, logp) = siblings[rank];
        let next = siblings.get(rank + 1).map(|&(_, next_logp)| next_logp);
        let index = self.tree.len();
        self.tree.tokens.push(token);
        self.tree.parents.push(node.parent);
        self.tree.depths.push(depth);
        self.tree.scores.push(node.score);
        self.ranks.push(node.ranks.clone());
        if let Some(next_logp) = next {
            let mut ranks = node.ranks;
            *ranks.last_mut().expect("a candidate has a depth") = rank + 1;
            self.heap.push(Frontier {
                score: node.score - logp + next_logp,
                ranks,
                parent: node.parent,
            });
        }
        if self.tree.len() < self.budget {
            self.wanted = Some(Some(index));
        }
    }
}

/// The round's tree from the drafter's block: over per-depth candidates when its slots do not
/// depend on the path (DFlash), else each node's children from its own path's corrected
/// logits (Domino: the GRU reads the root and the node's ancestors, as the chain reads the
/// drafts before a slot).
fn draft_tree(block: &BlockDraft, root: i64, budget: usize) -> DraftTree {
    if let Some(logits) = block.independent_logits() {
        let per_depth: Vec<Candidates> = (0..logits.size()[0])
            .map(|d| top_candidates(&logits.get(d), budget))
            .collect();
        return build_tree(&per_depth, budget);
    }
    let root_state = block.start(root);
    // node n's state: what its children's slot reads of the root and the path down to n (the
    // GRU's state; the Markov head's previous token and state)
    let mut states: Vec<PathState> = Vec::new();
    grow_tree(budget, |parent, tree| match parent {
        None => top_candidates(&block.slot_logits(1, &root_state), budget),
        Some(node) => {
            let from = tree.parents[node].map_or(&root_state, |p| &states[p]);
            let depth = tree.depths[node] as i64;
            let state = block.read(from, depth, tree.tokens[node]);
            let candidates = if depth < block.slots() {
                top_candidates(&block.slot_logits(depth + 1, &state), budget)
            } else {
                Vec::new()
            };
            states.push(state);
            candidates
        }
    })
}

/// The `k` most likely tokens of `logits` `[V]` as `(token, log-probability)`, best first,
/// equal log-probabilities by token id (lowest first, including at the cut); fewer where fewer
/// have a positive probability.
pub fn top_candidates(logits: &Tensor, k: usize) -> Candidates {
    candidates_of_logp(&logits.to_kind(Kind::Float).log_softmax(-1, Kind::Float), k)
}

/// [`top_candidates`] of each row of `logits` `[m, V]`, with one top-k for all rows; a row
/// with a tie at its cut is done alone, exactly as [`top_candidates`] does it.
pub fn top_candidates_rows(logits: &Tensor, k: usize) -> Vec<Candidates> {
    let rows = logits.size()[0] as usize;
    let logp = logits.to_kind(Kind::Float).log_softmax(-1, Kind::Float);
    let k = k.min(logp.size()[1] as usize);
    if k == 0 || rows == 0 {
        return vec![Vec::new(); rows];
    }
    let (values, ids) = logp.topk(k as i64, -1, true, true);
    let cut = values.narrow(1, k as i64 - 1, 1);
    let at_least = logp
        .ge_tensor(&cut)
        .sum_dim_intlist(1, false, Kind::Int64)
        .to_device(tch::Device::Cpu);
    let at_least = Vec::<i64>::try_from(&at_least).expect("a 1-d tensor");
    let to_vec = |t: Tensor| -> Vec<f64> {
        Vec::<f64>::try_from(
            t.to_kind(Kind::Double)
                .to_device(tch::Device::Cpu)
                .reshape([-1]),
        )
        .expect("a tensor")
    };
    let values = to_vec(values);
    let ids =
        Vec::<i64>::try_from(ids.to_device(tch::Device::Cpu).reshape([-1])).expect("int64 indices");
    (0..rows)
        .map(|r| {
            if at_least[r] as usize > k {
                return candidates_of_logp(&logp.get(r as i64), k);
            }
            let span = r * k..(r + 1) * k;
            let mut row: Candidates = ids[span.clone()]
                .iter()
                .copied()
                .zip(values[span].iter().copied())
                .collect();
            row.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            row
        })
        .collect()
}

/// [`top_candidates`] over log-probabilities `logp` `[V]`.
fn candidates_of_logp(logp: &Tensor, k: usize) -> Candidates {
    let vocab = logp.size()[0] as usize;
    let k = k.min(vocab);
    if k == 0 {
        return Vec::new();
    }
    let (values, _) = logp.topk(k as i64, -1, true, true);
    let cut = values.double_value(&[k as i64 - 1]);
    // every token at or above the k-th value: exactly k unless there is a tie at the cut
    let at_least = logp
        .ge(cut)
        .nonzero()
        .squeeze_dim(-1)
        .to_device(tch::Device::Cpu);
    let ids = Vec::<i64>::try_from(&at_least).expect("int64 indices");
    let chosen = logp.to_device(tch::Device::Cpu).index_select(0, &at_least);
    let values = Vec::<f64>::try_from(chosen.to_kind(Kind::Double)).expect("a 1-d tensor");
    let mut candidates: Vec<(i64, f64)> = ids.into_iter().zip(values).collect();
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    // A token of probability 0 (a DFlash2 slot's non-candidates) is never a child.
    candidates.retain(|c| c.1.is_finite());
    candidates.truncate(k);
    candidates
}

/// One verification round of a tree decode, for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeRound {
    /// The root: the last committed token before the round.
    pub root: i64,
    pub tree: DraftTree,
    /// The nodes committed, root's child first.
    pub accepted: Vec<usize>,
    /// The target's greedy token after the last accepted node.
    pub bonus: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TreeGeneration {
    pub generation: Generation,
    /// The output's rounds, one per `generation.acceptance_lengths` entry (a round the peers'
    /// counting adds after the output is complete is in `peer_acceptance_lengths` only).
    pub rounds: Vec<TreeRound>,
}

/// Greedy DDTree decoding with a node budget per round (`budget ≥ 1`; the tree is never
/// deeper than the drafter's block − 1). The output equals the target's greedy output. A
/// Domino drafter's tree is built from its corrected logits ([`generate_tree_with`]).
pub fn generate_tree(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    settings: &Settings,
    budget: usize,
) -> Result<TreeGeneration, DecodeError> {
    generate_tree_with(
        target,
        drafter,
        prompt,
        settings,
        budget,
        DraftLogits::Drafter,
    )
}

/// [`generate_tree`] drafting from `logits`.
pub fn generate_tree_with(
    target: &TargetModel,
    drafter: &Drafter,
    prompt: &[i64],
    settings: &Settings,
    budget: usize,
    logits: DraftLogits,
) -> Result<TreeGeneration, DecodeError> {
    if settings.sampling != Sampling::Greedy {
        return Err(DecodeError::TreeNeedsGreedy);
    }
    if budget == 0 {
        return Err(DecodeError::BadBudget { budget });
    }
    check_fit(target, drafter)?;
    let taps = drafter.config().target_layer_ids.clone();
    let device = target.device();
    let mut cache = target.new_cache();
    let mut context = drafter.new_cache();
    let mut count = PeerCount::new(settings);
    let mut rounds = Vec::new();
    let first = prefill(target, drafter, prompt, &mut cache, &mut context)?;
    if settings.max_new_tokens == 0 {
        let generation = count.finish();
        return Ok(TreeGeneration { generation, rounds });
    }
    let mut last = argmax(&first);
    count.first(last);
    while count.another_round() {
        let block = BlockDraft::new(target, drafter, &context, last, logits);
        let tree = draft_tree(&block, last, budget);

        // verify: the root and every node in one forward
        let mut ids = vec![last];
        ids.extend_from_slice(&tree.tokens);
        let input = Tensor::from_slice(&ids)
            .view([1, ids.len() as i64])
            .to_device(device);
        let step = target.forward_tree(&input, &tree.verify_shape(), &mut cache, &taps)?;
        let verified = step.logits.get(0);

        // follow the target's greedy choice down the tree
        let mut accepted = Vec::new();
        let mut at = None;
        let bonus = loop {
            let row = at.map_or(0, |n: usize| n as i64 + 1);
            let want = argmax(&verified.get(row));
            match tree.child(at, want) {
                Some(node) => {
                    accepted.push(node);
                    at = Some(node);
                }
                None => break want,
            }
        };

        // commit
        let mut produced: Vec<i64> = accepted.iter().map(|&n| tree.tokens[n]).collect();
        produced.push(bonus);
        let counted = count.round(&produced);
        let path: Vec<usize> = std::iter::once(0)
            .chain(accepted.iter().map(|&n| n + 1))
            .collect();
        if counted {
            rounds.push(TreeRound {
                root: last,
                tree,
                accepted,
                bonus,
            });
        }
        if !count.another_round() {
            break;
        }
        cache.keep_path(&path)?;
        let index: Vec<i64> = path.iter().map(|&i| i as i64).collect();
        let kept_taps = step
            .taps
            .index_select(1, &Tensor::from_slice(&index).to_device(step.taps.device()));
        drafter.extend_context(&mut context, &kept_taps);
        last = bonus;
    }
    let generation = count.finish();
    Ok(TreeGeneration { generation, rounds })
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
