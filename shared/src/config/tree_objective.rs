//! `[training.tree]`: the tree objective's knobs (`training.objective = "tree"`), read by the
//! engine's `train/tree_objective.rs`, which says what each one does to the loss.
use serde::{Deserialize, Serialize};

/// `training.tree.temperature` when unset: the margin's scale, in nats of path log-probability.
pub const DEFAULT_TREE_TEMPERATURE: f64 = 1.0;

/// `[training.tree]`. Read only when `training.objective = "tree"`; locked all the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeSection {
    /// The DDTree node budget trained for: a gold prefix counts when its path score beats the
    /// budget-th best node's. Unset: `training.serve_tree_budget`, the budget it is served
    /// with (a run that must keep its budget whatever the serving one becomes sets it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<usize>,
    /// The soft margin's scale in nats: how far from the frontier a gold prefix still moves
    /// the loss.
    pub temperature: f64,
    /// Which surrogate of the tree's acceptance is minimised.
    pub loss: TreeLoss,
}

impl Default for TreeSection {
    fn default() -> Self {
        Self {
            budget: None,
            temperature: DEFAULT_TREE_TEMPERATURE,
            loss: TreeLoss::default(),
        }
    }
}

impl TreeSection {
    /// Left out of a written config when nothing in it was set, so a config without the
    /// section reads (and records) as it did before the section existed.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The budget the objective trains for: `budget`, else the serving budget
    /// (`training.serve_tree_budget`).
    pub fn effective_budget(&self, serve_tree_budget: usize) -> usize {
        self.budget.unwrap_or(serve_tree_budget)
    }
}

/// `training.tree.loss`: the surrogate of "the gold prefix is in the budget-B tree".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeLoss {
    /// `−log σ((S_k − T_B)/t)` per gold prefix, each weighted by the detached probability that
    /// its parent is in the tree.
    #[default]
    Margin,
    /// `1 − σ((S_k − T_B)/t)` per gold prefix: the soft count of gold nodes the tree misses
    /// (GTO-style expected tree acceptance).
    Expected,
}

impl TreeLoss {
    /// The value as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            TreeLoss::Margin => "margin",
            TreeLoss::Expected => "expected",
        }
    }
}
