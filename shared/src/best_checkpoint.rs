//! The run's best checkpoint as status, journal and consoles name it: the checkpoint whose
//! weights scored the highest in-training DDTree τ at the budget the drafter is served with
//! (`training.serve_tree_budget`), or why a run has none.
//!
//! The engine chooses it (`dflash-engine`'s `train/best_checkpoint.rs`); this is its shape on
//! the wire and its wording, shared by the daemon and the console.
use serde::{Deserialize, Serialize};

/// The best checkpoint so far: its step, the online DDTree τ its weights scored at `budget`,
/// and its directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestCheckpoint {
    pub step: u64,
    pub tau_tree: f64,
    pub budget: usize,
    pub path: String,
}

impl BestCheckpoint {
    /// "step 450, tree τ@32 4.45".
    pub fn words(&self) -> String {
        format!(
            "step {}, tree τ@{} {:.2}",
            self.step, self.budget, self.tau_tree
        )
    }
}

/// Why a run has no best checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum NoBestCheckpoint {
    /// `training.online_eval_every = 0`: nothing ever scores a checkpoint.
    OnlineEvalOff,
    /// The online evaluation decodes no DDTree at the serving budget
    /// (`training.online_eval_tree_budgets` is empty), so there is no tree τ to judge by.
    NoTreeBudget,
    /// Online evaluation is on but none has scored a tree τ yet; the next is due at
    /// `first_at_step`.
    NotYet { first_at_step: u64 },
}

impl NoBestCheckpoint {
    /// Why, as a clause a person reads where the best would be named ("best checkpoint: none,
    /// …").
    pub fn words(&self) -> String {
        match self {
            NoBestCheckpoint::OnlineEvalOff => {
                "online evaluation is off (training.online_eval_every = 0), so no checkpoint \
                 is judged by tree τ"
                    .into()
            }
            NoBestCheckpoint::NoTreeBudget => {
                "the online evaluation decodes no DDTree at the serving budget \
                 (training.online_eval_tree_budgets), so no checkpoint is judged by tree τ"
                    .into()
            }
            NoBestCheckpoint::NotYet { first_at_step } => format!(
                "no online evaluation has scored one yet; the next is due at step \
                 {first_at_step}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_reads_as_its_step_budget_and_figure() {
        let best = BestCheckpoint {
            step: 450,
            tau_tree: 4.4519,
            budget: 32,
            path: "/r/checkpoints/step-0000000450".into(),
        };
        assert_eq!(best.words(), "step 450, tree τ@32 4.45");
    }

    #[test]
    fn each_reason_for_no_best_names_the_key_to_look_at() {
        assert!(NoBestCheckpoint::OnlineEvalOff
            .words()
            .contains("training.online_eval_every = 0"));
        assert!(NoBestCheckpoint::NoTreeBudget
            .words()
            .contains("training.online_eval_tree_budgets"));
        assert_eq!(
            NoBestCheckpoint::NotYet { first_at_step: 50 }.words(),
            "no online evaluation has scored one yet; the next is due at step 50"
        );
        let json = serde_json::to_value(NoBestCheckpoint::NotYet { first_at_step: 50 }).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"reason": "not_yet", "first_at_step": 50})
        );
    }
}
