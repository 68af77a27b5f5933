//! Offline tree metrics (issue 34): the DDTree oracle τ of held-out blocks. At each block the
//! tree DDTree's decoder would build from the drafter's own distributions (`decode/tree.rs`:
//! [`build_tree`] over per-slot candidates for a DFlash drafter, the path-dependent search
//! for a Domino one, each node's children from the corrected logits of its own path), scored
//! by the deepest gold prefix it holds, plus one (`decode/tree_oracle.rs`, which also states
//! the rule for slots without a label). The gold labels stand in for the target's greedy
//! tokens; no target call.
//!
//! The tree is grown once per block at the largest budget: a best-first tree of budget `B` is
//! the first `B` nodes of any larger budget's, and the candidates below a node are cut at the
//! largest budget, which no smaller tree can reach past (a node's `B`-th child needs `B`
//! nodes before it). The trees of a group of blocks are grown in lockstep
//! ([`TreeSearch`]), one batched drafter step for every block's next node.
//!
//! The distributions come from the evaluation's forward (all of a row's blocks at once over
//! the target's features), not from the decoder's cached forward: the same function in exact
//! arithmetic, equal up to float rounding (`engine/tests/engine/tree_oracle.rs` holds the two
//! to each other round by round).
use tch::{Kind, Tensor};

use crate::decode::{build_tree, top_candidates_rows, Candidates, DraftTree, TreeSearch};
use crate::model::drafter::DominoHead;

/// The budgets the oracle is scored at by default, and the serving budget among them.
pub const DEFAULT_TREE_BUDGETS: [usize; 4] = [8, 16, 32, 64];
pub const DEFAULT_SERVE_TREE_BUDGET: usize = 32;

/// What the trees of a group of blocks grow from.
pub struct TreeInputs<'a> {
    /// `[m, bs−1, H]`: the drafter's output at slots `1..bs` of each block.
    pub slots: Tensor,
    /// Each block's root: the anchor token.
    pub roots: Vec<i64>,
    /// The target's LM head `[V, H]`, on the slots' device and dtype.
    pub lm_head: &'a Tensor,
    /// The target's embedding table, which a Domino head's GRU reads tokens through.
    pub embed: &'a Tensor,
    /// A Domino drafter's head: its slots depend on the path.
    pub head: Option<&'a DominoHead>,
}

/// The best-first tree of `budget` nodes at each block, as DDTree's decoder builds it.
pub fn grow_trees(inputs: &TreeInputs, budget: usize) -> Vec<DraftTree> {
    tch::no_grad(|| match inputs.head {
        None => independent_trees(inputs, budget),
        Some(head) => path_dependent_trees(inputs, head, budget),
    })
}

/// The LM head over `z` `[n, H]`, in f32 (as the decoder's `BlockDraft` computes it).
fn base_logits(z: &Tensor, lm_head: &Tensor) -> Tensor {
    z.linear::<Tensor>(lm_head, None).to_kind(Kind::Float)
}

/// DFlash: every slot's candidates at once, then [`build_tree`] per block.
fn independent_trees(inputs: &TreeInputs, budget: usize) -> Vec<DraftTree> {
    let size = inputs.slots.size();
    let (m, depths, hidden) = (size[0] as usize, size[1] as usize, size[2]);
    if m == 0 {
        return Vec::new();
    }
    let logits = base_logits(&inputs.slots.reshape([-1, hidden]), inputs.lm_head);
    let rows = top_candidates_rows(&logits, budget);
    rows.chunks(depths)
        .map(|per_depth| build_tree(per_depth, budget))
        .collect()
}

/// One step of the lockstep search: the node (or root) of block `block` whose children a
/// search wants, the token its GRU reads, the state it reads from and where its state goes.
struct Request {
    block: usize,
    token: i64,
    /// Row of the state before the token (the zero row for the root).
    from: i64,
    /// Row its own state is written to.
    to: i64,
    /// The slot its children are drafted at (`1..bs`; past the last slot: none).
    slot: i64,
}

/// Domino: the trees of all blocks grown together, each node's GRU step and corrected
/// logits in one batch per step, as `decode/tree.rs::draft_tree` grows one.
fn path_dependent_trees(inputs: &TreeInputs, head: &DominoHead, budget: usize) -> Vec<DraftTree> {
    let size = inputs.slots.size();
    let (m, depths, hidden) = (size[0] as usize, size[1], size[2]);
    let (kind, device) = (inputs.slots.kind(), inputs.slots.device());
    let flat_slots = inputs.slots.reshape([-1, hidden]);
    // The LM head's part of every slot's logits does not depend on the path: once per slot
    // here (the group's `[m·(bs−1), V]`, as the independent trees hold), not once per node.
    let slot_logits = base_logits(&flat_slots, inputs.lm_head);
    let mut searches: Vec<TreeSearch> = (0..m).map(|_| TreeSearch::new(budget)).collect();
    // rows b·stride: block b's root state; b·stride + n + 1: node n's; the last row stays 0
    let stride = budget as i64 + 1;
    let zero_row = m as i64 * stride;
    let gru = head.config().gru_hidden_dim;
    let mut states = Tensor::zeros([zero_row + 1, gru], (kind, device));
    loop {
        let requests = pending_requests(&searches, &inputs.roots, stride, zero_row);
        if requests.is_empty() {
            break;
        }
        let index = |f: &dyn Fn(&Request) -> i64| {
            Tensor::from_slice(&requests.iter().map(f).collect::<Vec<_>>()).to_device(device)
        };
        let x = inputs
            .embed
            .index_select(0, &index(&|r| r.token).to_device(inputs.embed.device()))
            .to_device(device)
            .to_kind(kind);
        let h = head.gru_step(&x, &states.index_select(0, &index(&|r| r.from)));
        let _ = states.index_copy_(0, &index(&|r| r.to), &h);
        let drafting: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].slot <= depths)
            .collect();
        let mut candidates = vec![Candidates::new(); requests.len()];
        if !drafting.is_empty() {
            let rows = |f: &dyn Fn(&Request) -> i64| {
                let v: Vec<i64> = drafting.iter().map(|&i| f(&requests[i])).collect();
                Tensor::from_slice(&v).to_device(device)
            };
            let slot_rows = rows(&|r| r.block as i64 * depths + r.slot - 1);
            let z = flat_slots.index_select(0, &slot_rows);
            let mut logits = slot_logits.index_select(0, &slot_rows);
            let corrected: Vec<i64> = (0..drafting.len() as i64)
                .filter(|&j| head.corrects_slot(requests[drafting[j as usize]].slot))
                .collect();
            if !corrected.is_empty() {
                let at = Tensor::from_slice(&corrected).to_device(device);
                let h_drafting = h.index_select(
                    0,
                    &Tensor::from_slice(&drafting.iter().map(|&i| i as i64).collect::<Vec<_>>())
                        .to_device(device),
                );
                let delta =
                    head.correction(&z.index_select(0, &at), &h_drafting.index_select(0, &at));
                logits = logits.index_add(0, &at, &delta.to_kind(Kind::Float));
            }
            for (j, row) in top_candidates_rows(&logits, budget).into_iter().enumerate() {
                candidates[drafting[j]] = row;
            }
        }
        for (request, offered) in requests.iter().zip(candidates) {
            searches[request.block].offer(offered);
        }
    }
    searches.into_iter().map(TreeSearch::into_tree).collect()
}

/// Every unfinished search's next request.
fn pending_requests(
    searches: &[TreeSearch],
    roots: &[i64],
    stride: i64,
    zero_row: i64,
) -> Vec<Request> {
    searches
        .iter()
        .enumerate()
        .filter_map(|(block, search)| {
            let base = block as i64 * stride;
            let tree = search.tree();
            search.wanted().map(|parent| match parent {
                None => Request {
                    block,
                    token: roots[block],
                    from: zero_row,
                    to: base,
                    slot: 1,
                },
                Some(node) => Request {
                    block,
                    token: tree.tokens[node],
                    from: base + tree.parents[node].map_or(0, |p| p as i64 + 1),
                    to: base + node as i64 + 1,
                    slot: tree.depths[node] as i64 + 1,
                },
            })
        })
        .collect()
}

/// Sums of the oracle's τ per budget over blocks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeTotals {
    pub blocks: u64,
    /// Σ (accepted + 1), index as the budgets.
    pub accepted_plus_one: Vec<f64>,
}

impl TreeTotals {
    pub fn new(budgets: usize) -> Self {
        TreeTotals {
            blocks: 0,
            accepted_plus_one: vec![0.0; budgets],
        }
    }

    pub fn add(&mut self, accepted: &[usize]) {
        self.blocks += 1;
        for (sum, &a) in self.accepted_plus_one.iter_mut().zip(accepted) {
            *sum += (a + 1) as f64;
        }
    }

    /// Mean τ per budget (0 without a block).
    pub fn taus(&self) -> Vec<f64> {
        self.accepted_plus_one
            .iter()
            .map(|s| {
                if self.blocks == 0 {
                    0.0
                } else {
                    s / self.blocks as f64
                }
            })
            .collect()
    }
}

/// The budgets to score: `budgets` and `serve`, ascending, each once.
pub fn scored_budgets(budgets: &[usize], serve: Option<usize>) -> Vec<usize> {
    let mut all: Vec<usize> = budgets
        .iter()
        .copied()
        .chain(serve)
        .filter(|&b| b > 0)
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// The device rows of `n` blocks per group so that a group's `[m·(bs−1), V]` logits stay
/// within `chunk_positions` rows.
pub fn blocks_per_group(chunk_positions: i64, block_size: usize) -> usize {
    (chunk_positions.max(1) as usize / block_size.saturating_sub(1).max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{grow_tree, top_candidates};
    use tch::Device;

    #[test]
    fn budgets_are_sorted_and_the_serving_one_included() {
        assert_eq!(
            scored_budgets(&[64, 8, 32, 8], Some(16)),
            vec![8, 16, 32, 64]
        );
        assert_eq!(scored_budgets(&[8, 32], Some(32)), vec![8, 32]);
        assert_eq!(scored_budgets(&[], None), Vec::<usize>::new());
        assert_eq!(blocks_per_group(1024, 8), 146);
        assert_eq!(blocks_per_group(4, 32), 1);
    }

    #[test]
    fn totals_average_accepted_plus_one_per_budget() {
        let mut t = TreeTotals::new(2);
        t.add(&[0, 2]);
        t.add(&[1, 5]);
        assert_eq!(t.taus(), vec![1.5, 4.5]);
        assert_eq!(TreeTotals::new(2).taus(), vec![0.0, 0.0]);
    }

    /// The lockstep growth of several Domino blocks equals each block grown alone by the
    /// decoder's search over the same head (`grow_tree`, children from the path's GRU state).
    #[test]
    fn lockstep_domino_trees_equal_each_block_grown_alone() {
        use crate::model::drafter::DominoConfig;
        let _rng = crate::device::global_rng::seeded(11);
        let (bs, h, v, m) = (5i64, 8i64, 13i64, 3usize);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let cfg = DominoConfig {
            emb_dim: 6,
            gru_hidden_dim: 7,
            pure_draft_prefix_len: 1,
        };
        let head = DominoHead::new(&vs.root(), &cfg, h, v, 0.5);
        let opts = (Kind::Float, Device::Cpu);
        let slots = Tensor::randn([m as i64, bs - 1, h], opts) * 2.0;
        let lm_head = Tensor::randn([v, h], opts);
        let embed = Tensor::randn([v, h], opts);
        let roots = vec![3, 0, 12];
        let inputs = TreeInputs {
            slots: slots.shallow_clone(),
            roots: roots.clone(),
            lm_head: &lm_head,
            embed: &embed,
            head: Some(&head),
        };
        for budget in [1, 6, 20] {
            let trees = grow_trees(&inputs, budget);
            for b in 0..m {
                let z = slots.get(b as i64);
                let mut states: Vec<Tensor> = Vec::new();
                let step =
                    |h: &Tensor, token: i64| head.gru_step(&embed.get(token).unsqueeze(0), h);
                let root = step(&Tensor::zeros([1, 7], opts), roots[b]);
                let logits = |slot: i64, state: &Tensor| {
                    let base = z.get(slot - 1).unsqueeze(0).matmul(&lm_head.tr());
                    let delta = head.correction(&z.get(slot - 1).unsqueeze(0), state);
                    if head.corrects_slot(slot) {
                        base + delta
                    } else {
                        base
                    }
                    .get(0)
                };
                let alone = tch::no_grad(|| {
                    grow_tree(budget, |parent, tree| match parent {
                        None => top_candidates(&logits(1, &root), budget),
                        Some(n) => {
                            let from = tree.parents[n].map_or(&root, |p| &states[p]);
                            let state = step(from, tree.tokens[n]);
                            let depth = tree.depths[n] as i64;
                            let c = if depth < bs - 1 {
                                top_candidates(&logits(depth + 1, &state), budget)
                            } else {
                                Vec::new()
                            };
                            states.push(state);
                            c
                        }
                    })
                });
                assert_eq!(trees[b].tokens, alone.tokens, "budget {budget} block {b}");
                assert_eq!(trees[b].parents, alone.parents);
                for (x, y) in trees[b].scores.iter().zip(&alone.scores) {
                    assert!((x - y).abs() < 1e-5, "{x} vs {y}");
                }
            }
        }
    }
}
