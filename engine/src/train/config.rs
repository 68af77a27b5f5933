//! Training hyper-parameters (spec §2.8 defaults) and the attention backend choice.
use serde::{Deserialize, Serialize};

pub use dflash_shared::config::Objective;

use super::block_objective::LossObjective;
use super::error::TrainError;
use super::labels::{default_gamma, LabelMaskRule};
use super::optim::AdamWConfig;
use super::tree_objective::TreeObjective;
use crate::model::drafter::AttentionBackend;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Seeds drafter init, anchor sampling, the shuffle and the held-out split.
    pub seed: u64,
    /// Full passes over the training split (no early stopping).
    pub epochs: u32,
    /// Caps the schedule's length (SpecForge caps its Qwen3.6-27B recipe at 10000 steps).
    pub max_steps: Option<u64>,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Anchors (draft blocks) sampled per sequence.
    pub num_anchors: usize,
    /// What the drafter minimises (`training.objective`).
    pub objective: Objective,
    /// D-PACE's smoothing α (`training.dpace_alpha`), read when `objective` is D-PACE.
    pub dpace_alpha: f64,
    /// The tree objective's budget, temperature and loss (`[training.tree]`), read when
    /// `objective` is the tree objective.
    pub tree: TreeObjective,
    /// Domino's curriculum: λ at step 0 (`training.lambda_base_start`), read with a Domino
    /// head.
    pub lambda_base_start: f64,
    /// The fraction of the schedule over which λ falls to 0 (`training.lambda_base_decay_ratio`).
    pub lambda_base_decay_ratio: f64,
    /// Loss decay γ; `None` takes the paper default for the block size.
    pub gamma: Option<f64>,
    pub label_mask_rule: LabelMaskRule,
    /// Peak learning rate.
    pub lr: f64,
    pub warmup_ratio: f64,
    pub adamw: AdamWConfig,
    /// Longer sequences are truncated.
    pub max_len: usize,
    /// Training rows are right-padded to a multiple of this many tokens (1: not padded).
    pub seq_len_multiple: usize,
    /// Samples held out for evaluation.
    pub held_out: usize,
    /// Evaluate τ every this many steps (0: never).
    pub eval_every: u64,
    /// Evaluate only the first this many held-out samples (0: all).
    pub eval_max_samples: usize,
    /// The held-out evaluation's DDTree oracle at anchors that are a multiple of this.
    pub eval_tree_block_subsample: usize,
    /// Online evaluation (speculative decoding against the target) every this many steps and
    /// after the last, never before the first (0: never).
    pub online_eval_every: u64,
    /// A JSONL prompt file or `"embedded"`; required when `online_eval_every > 0`.
    pub online_eval_prompts: Option<String>,
    /// Prompts decoded per online evaluation at most.
    pub online_eval_max_prompts: usize,
    /// Tokens generated per prompt at most.
    pub online_eval_max_new_tokens: usize,
    /// DDTree node budgets run beside the chain (empty: chain only), and the offline DDTree
    /// oracle's budgets.
    pub online_eval_tree_budgets: Vec<usize>,
    /// The DDTree budget the drafter is served with: the headline tree figure.
    pub serve_tree_budget: usize,
    /// Checkpoint every this many steps (0: only at the end of a run).
    pub checkpoint_every: u64,
    pub keep_checkpoints: usize,
    /// Weighted positions per LM-head chunk.
    pub loss_chunk_positions: i64,
    /// Anchors per row in one evaluation forward.
    pub eval_anchors_per_forward: usize,
    pub attention: AttentionBackend,
    /// Recompute every drafter layer but the last in the backward (`training.activation_checkpointing`).
    pub activation_checkpointing: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            epochs: 6,
            max_steps: None,
            batch_size: 1,
            grad_accum: 1,
            num_anchors: 512,
            objective: Objective::Dflash,
            dpace_alpha: dflash_shared::config::DEFAULT_DPACE_ALPHA,
            tree: TreeObjective::default(),
            lambda_base_start: dflash_shared::config::DEFAULT_LAMBDA_BASE_START,
            lambda_base_decay_ratio: dflash_shared::config::DEFAULT_LAMBDA_BASE_DECAY_RATIO,
            gamma: None,
            label_mask_rule: LabelMaskRule::Independent,
            lr: 6e-4,
            warmup_ratio: 0.04,
            adamw: AdamWConfig::default(),
            max_len: 4096,
            seq_len_multiple: 64,
            held_out: 64,
            eval_every: 500,
            eval_max_samples: 0,
            eval_tree_block_subsample: 1,
            online_eval_every: 0,
            online_eval_prompts: None,
            online_eval_max_prompts: 16,
            online_eval_max_new_tokens: 128,
            online_eval_tree_budgets: dflash_shared::config::DEFAULT_TREE_BUDGETS.to_vec(),
            serve_tree_budget: dflash_shared::config::DEFAULT_SERVE_TREE_BUDGET,
            checkpoint_every: 1000,
            keep_checkpoints: 3,
            loss_chunk_positions: 2048,
            eval_anchors_per_forward: 256,
            attention: AttentionBackend::BlockSparse,
            activation_checkpointing: false,
        }
    }
}

impl TrainConfig {
    pub fn gamma_for(&self, block_size: usize) -> f64 {
        self.gamma.unwrap_or_else(|| default_gamma(block_size))
    }

    /// The loss the training step runs.
    pub fn loss_objective(&self) -> LossObjective {
        LossObjective::from_config(self.objective, self.dpace_alpha, self.tree)
    }

    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |key: &str, detail: String| {
            Err(TrainError::Config {
                key: key.into(),
                detail,
            })
        };
        if self.max_steps == Some(0) {
            return bad("max_steps", "must be at least 1 when set, found 0".into());
        }
        if self.epochs == 0 {
            return bad("epochs", "must be at least 1, found 0".into());
        }
        for (key, v) in [
            ("batch_size", self.batch_size),
            ("grad_accum", self.grad_accum),
            ("num_anchors", self.num_anchors),
            ("max_len", self.max_len),
            ("eval_anchors_per_forward", self.eval_anchors_per_forward),
            ("eval_tree_block_subsample", self.eval_tree_block_subsample),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1, found 0".into());
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(
                "lr",
                format!("must be a positive number, found {}", self.lr),
            );
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return bad(
                "warmup_ratio",
                format!("must be in [0, 1], found {}", self.warmup_ratio),
            );
        }
        if !(self.dpace_alpha.is_finite() && (0.0..=1.0).contains(&self.dpace_alpha)) {
            return bad(
                "dpace_alpha",
                format!("must be in [0, 1], found {}", self.dpace_alpha),
            );
        }
        if self.tree.budget == 0 {
            return bad("tree.budget", "must be at least 1 node, found 0".into());
        }
        if !(self.tree.temperature.is_finite() && self.tree.temperature > 0.0) {
            return bad(
                "tree.temperature",
                format!("must be a positive number, found {}", self.tree.temperature),
            );
        }
        if let Some(g) = self.gamma {
            if !(g.is_finite() && g > 0.0) {
                return bad("gamma", format!("must be a positive number, found {g}"));
            }
        }
        if self.seq_len_multiple < 1 {
            return bad(
                "seq_len_multiple",
                format!("must be at least 1, found {}", self.seq_len_multiple),
            );
        }
        if self.online_eval_every > 0 {
            if self.online_eval_prompts.is_none() {
                return bad(
                    "online_eval_prompts",
                    format!(
                        "must name a prompt file when online_eval_every is {}, found none",
                        self.online_eval_every
                    ),
                );
            }
            for (key, v) in [
                ("online_eval_max_prompts", self.online_eval_max_prompts),
                (
                    "online_eval_max_new_tokens",
                    self.online_eval_max_new_tokens,
                ),
            ] {
                if v == 0 {
                    return bad(key, "must be at least 1, found 0".into());
                }
            }
            if self.online_eval_tree_budgets.contains(&0) {
                return bad(
                    "online_eval_tree_budgets",
                    "every budget must be at least 1 node, found 0".into(),
                );
            }
        }
        if self.serve_tree_budget == 0 {
            return bad(
                "serve_tree_budget",
                "must be at least 1 node, found 0".into(),
            );
        }
        if self.loss_chunk_positions < 1 {
            return bad(
                "loss_chunk_positions",
                format!("must be at least 1, found {}", self.loss_chunk_positions),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_paper_values_and_valid() {
        let c = TrainConfig::default();
        c.validate().unwrap();
        assert_eq!(
            (c.epochs, c.num_anchors, c.lr, c.warmup_ratio),
            (6, 512, 6e-4, 0.04)
        );
        assert_eq!(c.adamw.weight_decay, 0.0);
        assert_eq!(c.adamw.max_grad_norm, Some(1.0));
        assert_eq!(c.gamma_for(16), 7.0);
    }

    #[test]
    fn bad_values_name_the_key() {
        let c = TrainConfig {
            batch_size: 0,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("`batch_size`"));
        let c = TrainConfig {
            lr: -1.0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("`lr`"));
        for alpha in [-0.1, 1.5, f64::NAN] {
            let c = TrainConfig {
                dpace_alpha: alpha,
                ..Default::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains("`dpace_alpha`") && err.contains("[0, 1]"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_objective_defaults_to_dflash_and_reads_its_alpha_for_dpace() {
        let c = TrainConfig::default();
        assert_eq!(c.loss_objective(), LossObjective::Dflash);
        let d: TrainConfig = serde_json::from_str(r#"{"objective": "dpace"}"#).unwrap();
        assert_eq!(d.loss_objective(), LossObjective::Dpace { alpha: 0.5 });
        let t: TrainConfig =
            serde_json::from_str(r#"{"objective": "tree", "tree": {"budget": 8}}"#).unwrap();
        assert_eq!(
            t.loss_objective(),
            LossObjective::Tree(TreeObjective {
                budget: 8,
                ..TreeObjective::default()
            })
        );
        for (tree, key) in [
            (r#"{"budget": 0}"#, "`tree.budget`"),
            (r#"{"temperature": 0.0}"#, "`tree.temperature`"),
        ] {
            let c: TrainConfig = serde_json::from_str(&format!(r#"{{"tree": {tree}}}"#)).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
        // Checkpoints written before the objective existed trained DFlash.
        let old: TrainConfig = serde_json::from_str(r#"{"epochs": 6}"#).unwrap();
        assert_eq!(old.objective, Objective::Dflash);
    }

    #[test]
    fn online_evaluation_needs_prompts_only_when_it_is_on() {
        let mut c = TrainConfig::default();
        assert_eq!(
            c.online_eval_every, 0,
            "off unless the run config turns it on"
        );
        c.validate().unwrap();
        c.online_eval_every = 10;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`online_eval_prompts`"), "{err}");
        c.online_eval_prompts = Some("embedded".into());
        c.validate().unwrap();
        c.online_eval_tree_budgets = vec![8, 0];
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("`online_eval_tree_budgets`"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected_and_missing_keys_default() {
        let c: TrainConfig = serde_json::from_str(r#"{"epochs": 2}"#).unwrap();
        assert_eq!(c.epochs, 2);
        assert_eq!(c.num_anchors, 512);
        assert!(serde_json::from_str::<TrainConfig>(r#"{"epoch": 2}"#).is_err());
    }
}
