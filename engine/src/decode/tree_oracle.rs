//! The DDTree oracle's scoring: how many drafts a tree would have committed had the target's
//! greedy tokens been a block's gold labels. No target call: offline evaluation
//! (`train/tree_metrics.rs`) builds the tree DDTree's decoder would build at a block and reads
//! its accepted length here, so a drafter is judged by the tree it is served with.
//!
//! The walk is the decoder's (`tree.rs`, "follow the target's greedy choice down the tree")
//! with the gold token in the target's place: from the root, move to the child carrying the
//! next slot's gold token; stop where there is none. The oracle's τ of a block is its accepted
//! drafts + 1 (the bonus token), as the chain's.
//!
//! Slots without a valid label are handled as chain τ handles them (`train/eval.rs`): they
//! neither count nor stop the walk. A loss-mask hole inside the block (a user token, with
//! `LabelMaskRule::Independent`) still has its data token, so the walk moves to the child
//! carrying it, or, where the tree has none, to the node's first child (its best, the one the
//! chain would draft there), as the chain takes its draft there for correct. A slot past the
//! row's end is such a slot too; every slot after it is as well, so nothing more counts.
use super::tree::DraftTree;

/// A draft slot's gold token (the target's greedy token there) and whether it is supervised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoldSlot {
    pub token: i64,
    pub valid: bool,
}

/// The drafts the first `budget` nodes of `tree` (a best-first tree's budget-`budget` tree)
/// commit against `gold[d − 1]` at depth `d`; valid slots only are counted (module doc).
pub fn accepted_drafts(tree: &DraftTree, gold: &[GoldSlot], budget: usize) -> usize {
    let nodes = budget.min(tree.len());
    let mut at = None;
    let mut accepted = 0;
    for slot in gold {
        let mut children = (0..nodes).filter(|&n| tree.parents[n] == at);
        let first = children.clone().next();
        let carrying_gold = children.find(|&n| tree.tokens[n] == slot.token);
        let next = if slot.valid {
            carrying_gold
        } else {
            carrying_gold.or(first)
        };
        let Some(node) = next else { break };
        accepted += usize::from(slot.valid);
        at = Some(node);
    }
    accepted
}

/// [`accepted_drafts`] at each of `budgets`, in their order.
pub fn accepted_per_budget(tree: &DraftTree, gold: &[GoldSlot], budgets: &[usize]) -> Vec<usize> {
    budgets
        .iter()
        .map(|&b| accepted_drafts(tree, gold, b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root children 10 (node 0) and 11 (node 2); below 10: 20 (node 1) and 21 (node 4);
    /// below 20: 30 (node 3).
    fn tree() -> DraftTree {
        DraftTree {
            tokens: vec![10, 20, 11, 30, 21],
            parents: vec![None, Some(0), None, Some(1), Some(0)],
            depths: vec![1, 2, 1, 3, 2],
            scores: vec![-0.1, -0.2, -0.3, -0.4, -0.5],
        }
    }

    fn gold(tokens: &[i64]) -> Vec<GoldSlot> {
        tokens
            .iter()
            .map(|&token| GoldSlot { token, valid: true })
            .collect()
    }

    #[test]
    fn the_walk_follows_the_gold_tokens_within_the_budget() {
        let t = tree();
        assert_eq!(accepted_drafts(&t, &gold(&[10, 20, 30, 40]), 5), 3);
        // the budget-3 tree lacks node 3
        assert_eq!(accepted_drafts(&t, &gold(&[10, 20, 30, 40]), 3), 2);
        assert_eq!(accepted_drafts(&t, &gold(&[10, 21, 30]), 5), 2);
        assert_eq!(accepted_drafts(&t, &gold(&[10, 21, 30]), 4), 1);
        assert_eq!(accepted_drafts(&t, &gold(&[11, 20]), 5), 1);
        assert_eq!(accepted_drafts(&t, &gold(&[11, 20]), 2), 0);
        assert_eq!(accepted_drafts(&t, &gold(&[12]), 5), 0);
        assert_eq!(accepted_drafts(&t, &gold(&[10]), 0), 0);
        assert_eq!(
            accepted_per_budget(&t, &gold(&[10, 20, 30]), &[1, 2, 3, 4, 64]),
            vec![1, 2, 2, 3, 3]
        );
    }

    #[test]
    fn a_slot_without_a_label_neither_counts_nor_stops_the_walk() {
        let t = tree();
        let mut g = gold(&[10, 99, 30]);
        g[1].valid = false;
        // no child carries 99: the walk takes node 0's first child (20), then 30 counts
        assert_eq!(accepted_drafts(&t, &g, 5), 2);
        // a hole whose data token the tree carries: the walk goes there (21, a leaf)
        g[1].token = 21;
        assert_eq!(accepted_drafts(&t, &g, 5), 1);
        // past the row's end every later slot is invalid: nothing more counts
        let mut end = gold(&[10, 20, 0, 0]);
        end[2].valid = false;
        end[3].valid = false;
        assert_eq!(accepted_drafts(&t, &end, 5), 2);
    }
}
