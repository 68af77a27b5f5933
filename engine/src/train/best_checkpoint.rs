//! Which checkpoint is the run's best, and which checkpoints rotation may delete: pure rules,
//! the loop (`trainer.rs`), the checkpoint writer (`resume.rs`) and `dflashd export --best` do
//! the I/O.
//!
//! The best is judged by what is served: the online evaluation's DDTree τ at
//! `training.serve_tree_budget`. Online evaluation and checkpoints run on different cadences,
//! so a new best writes a checkpoint at its own step when the cadence would not have: a best
//! whose weights are not on disk could be named but never exported. It is a whole checkpoint
//! (optimizer and data position too), so it can also be resumed from, and the trainer state of
//! every checkpoint records the best as of its step, which a resume restores.
use std::path::Path;

use dflash_shared::best_checkpoint::NoBestCheckpoint;
use dflash_shared::metrics::OnlineAcceptance;
use serde::{Deserialize, Serialize};

use super::checkpoint::{checkpoint_dir_name, MANIFEST};
use super::config::TrainConfig;

/// The best checkpoint so far: its step, and the DDTree τ its weights scored at `budget`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestSoFar {
    pub step: u64,
    pub tau_tree: f64,
    pub budget: usize,
}

impl BestSoFar {
    /// The online evaluation's figure at the serving budget as a candidate, when it decoded
    /// that budget to a finite τ.
    pub fn candidate(step: u64, online: &OnlineAcceptance, serve_budget: usize) -> Option<Self> {
        let tau_tree = *online.tau_ddtree.get(&serve_budget)?;
        tau_tree.is_finite().then_some(BestSoFar {
            step,
            tau_tree,
            budget: serve_budget,
        })
    }

    /// Whether `self` replaces `best`: a strictly higher τ at the same budget (a tie keeps the
    /// earlier checkpoint, which has had less time to overfit the prompts). A best judged at
    /// another budget (the serving budget was changed on a resume) measured something else,
    /// so the first figure at the new budget replaces it.
    pub fn beats(&self, best: Option<&BestSoFar>) -> bool {
        match best {
            None => true,
            Some(best) if best.budget != self.budget => true,
            Some(best) => self.tau_tree > best.tau_tree,
        }
    }

    /// The best's directory under the checkpoint root.
    pub fn dir(&self, root: &Path) -> std::path::PathBuf {
        root.join(checkpoint_dir_name(self.step))
    }

    /// Whether its checkpoint is still on disk (published: it has a manifest).
    pub fn is_on_disk(&self, root: &Path) -> bool {
        self.dir(root).join(MANIFEST).is_file()
    }
}

/// Why a run of this config has no best yet, with `step` the step it stands at.
pub fn no_best(cfg: &TrainConfig, step: u64) -> NoBestCheckpoint {
    let every = cfg.online_eval_every();
    if every == 0 {
        NoBestCheckpoint::OnlineEvalOff
    } else if !cfg
        .training
        .online_eval_tree_budgets
        .contains(&cfg.training.serve_tree_budget)
    {
        NoBestCheckpoint::NoTreeBudget
    } else {
        NoBestCheckpoint::NotYet {
            first_at_step: (step / every + 1) * every,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(taus: &[(usize, f64)]) -> OnlineAcceptance {
        OnlineAcceptance {
            tau_chain: 2.0,
            tau_ddtree: taus.iter().copied().collect(),
            serve_tree_budget: Some(32),
            offline_tau: None,
            base: None,
            prompts: 8,
            seconds: 1.0,
        }
    }

    fn best(step: u64, tau_tree: f64, budget: usize) -> BestSoFar {
        BestSoFar {
            step,
            tau_tree,
            budget,
        }
    }

    #[test]
    fn the_candidate_is_the_tree_tau_at_the_serving_budget() {
        let o = online(&[(8, 3.0), (32, 4.25)]);
        assert_eq!(BestSoFar::candidate(50, &o, 32), Some(best(50, 4.25, 32)));
        assert_eq!(BestSoFar::candidate(50, &o, 16), None, "not decoded");
        let nan = online(&[(32, f64::NAN)]);
        assert_eq!(BestSoFar::candidate(50, &nan, 32), None);
    }

    #[test]
    fn a_higher_tau_beats_the_best_and_a_tie_keeps_the_earlier() {
        let so_far = best(50, 4.0, 32);
        assert!(best(100, 4.01, 32).beats(Some(&so_far)));
        assert!(!best(100, 4.0, 32).beats(Some(&so_far)), "a tie");
        assert!(!best(100, 3.9, 32).beats(Some(&so_far)));
        assert!(best(100, 1.0, 32).beats(None), "the first is the best");
        assert!(
            best(100, 3.0, 16).beats(Some(&so_far)),
            "a changed serving budget judges anew"
        );
    }

    #[test]
    fn no_best_says_why_from_the_config() {
        let mut cfg = TrainConfig::default();
        cfg.training.online_eval_every = Some(50);
        cfg.training.online_eval_prompts = Some("embedded".into());
        cfg.training.online_eval_tree_budgets = vec![8, 32];
        cfg.training.serve_tree_budget = 32;
        assert_eq!(
            no_best(&cfg, 0),
            NoBestCheckpoint::NotYet { first_at_step: 50 }
        );
        assert_eq!(
            no_best(&cfg, 50),
            NoBestCheckpoint::NotYet { first_at_step: 100 }
        );
        cfg.training.online_eval_tree_budgets.clear();
        assert_eq!(no_best(&cfg, 0), NoBestCheckpoint::NoTreeBudget);
        cfg.training.online_eval_every = Some(0);
        assert_eq!(no_best(&cfg, 0), NoBestCheckpoint::OnlineEvalOff);
    }
}
