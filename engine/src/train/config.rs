//! The engine's training config: the run config's `[training]` section as it is, the seed, and
//! the few values derived from other sections. Every key is documented and validated once, in
//! `dflash_shared::config` (`sections.rs`, `validate/training.rs`); the engine reads the
//! section and never restates it.
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

pub use dflash_shared::config::{Objective, TrainingSection};

use super::block_objective::LossObjective;
use super::labels::{default_gamma, LabelMaskRule};
use super::optim::AdamWConfig;
use super::tree_objective::TreeObjective;

mod legacy;
#[cfg(test)]
pub(crate) use legacy::tests as legacy_tests;

/// What a trainer runs with (`train/run_config.rs::train_config` builds it from a validated
/// run config). Checkpoints store it in `trainer_state.json`; checkpoints written before it held
/// the section (a flat copy of its keys) load through `legacy.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    /// `[training]` as the config declares it, with `online_eval_prompts` resolved by the
    /// daemon (a file relative to the config becomes its path).
    pub training: TrainingSection,
    /// `[run].seed`.
    pub seed: u64,
    /// Samples held out for evaluation: `[data]`'s count for the run's samples
    /// (`DataSection::held_out_count`).
    pub held_out: usize,
    /// Loss decay γ: `Config::loss_decay_gamma` (the section's, or the paper's for the block
    /// size). `None` only in configs built without a run config: then the paper's value for
    /// the drafter's block size.
    pub gamma: Option<f64>,
}

impl Default for TrainConfig {
    /// The section's defaults (the paper's values), seed 0, 64 held-out samples.
    fn default() -> Self {
        Self {
            training: TrainingSection::default(),
            seed: 0,
            held_out: 64,
            gamma: None,
        }
    }
}

/// The stored shape of [`TrainConfig`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    training: TrainingSection,
    seed: u64,
    held_out: usize,
    #[serde(default)]
    gamma: Option<f64>,
}

impl<'de> Deserialize<'de> for TrainConfig {
    /// The current shape, or the flat one checkpoints were written in before (`legacy.rs`).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        match value {
            Value::Object(map) if !map.contains_key("training") => {
                legacy::from_flat(map).map_err(serde::de::Error::custom)
            }
            other => {
                let s: Stored = serde_json::from_value(other).map_err(serde::de::Error::custom)?;
                Ok(Self {
                    training: s.training,
                    seed: s.seed,
                    held_out: s.held_out,
                    gamma: s.gamma,
                })
            }
        }
    }
}

impl TrainConfig {
    pub fn gamma_for(&self, block_size: usize) -> f64 {
        self.gamma.unwrap_or_else(|| default_gamma(block_size))
    }

    /// The loss the training step runs.
    pub fn loss_objective(&self) -> LossObjective {
        let t = &self.training;
        LossObjective::from_config(
            t.objective,
            t.dpace_alpha,
            t.dpace_normalization,
            self.tree_objective(),
        )
    }

    /// `[training.tree]` with its budget resolved. Only the tree objective trains for the
    /// serving budget; another objective's record of it must not move when the serving budget
    /// does (a free key).
    pub fn tree_objective(&self) -> TreeObjective {
        let t = &self.training;
        let serve = match t.objective {
            Objective::Tree => t.serve_tree_budget,
            _ => dflash_shared::config::DEFAULT_SERVE_TREE_BUDGET,
        };
        TreeObjective::from_section(&t.tree, serve)
    }

    /// The optimizer's settings from `training.adam_*`, `weight_decay` and `grad_clip`
    /// (0: no clipping).
    pub fn adamw(&self) -> AdamWConfig {
        let t = &self.training;
        AdamWConfig {
            beta1: t.adam_beta1,
            beta2: t.adam_beta2,
            eps: t.adam_eps,
            weight_decay: t.weight_decay,
            max_grad_norm: (t.grad_clip > 0.0).then_some(t.grad_clip),
        }
    }

    /// `training.label_mask` as the labels read it.
    pub fn label_mask_rule(&self) -> LabelMaskRule {
        match self.training.label_mask {
            dflash_shared::config::LabelMask::Independent => LabelMaskRule::Independent,
            dflash_shared::config::LabelMask::Cumulative => LabelMaskRule::Cumulative,
        }
    }

    /// Steps between online evaluations (`TrainingSection::online_eval_interval`; 0: off).
    pub fn online_eval_every(&self) -> u64 {
        self.training.online_eval_interval()
    }

    /// The values a resume compares, one per leaf key of the config's key table
    /// (`dflash_shared::config::keys`), named as the table names it. Derived values stand at
    /// the key they realise: `run.seed`, `data.held_out_samples` (the count held out),
    /// `training.loss_decay_gamma` (γ in effect), `training.tree.budget` (the budget trained
    /// for), `training.dpace_normalization` (the one in effect, which a written section
    /// leaves out at its default, as checkpoints from before the key do) and
    /// `training.online_eval_every` (the interval in effect).
    pub fn resume_view(&self) -> Value {
        let mut out = Map::new();
        if let Ok(Value::Object(section)) = serde_json::to_value(&self.training) {
            flatten_into(&mut out, "training", section);
        }
        let tree = self.tree_objective();
        // `[training.dspark]` and `[training.dflash2]` are left out of the serialised section
        // when default (as the tree's section is): their keys are written here so every locked
        // key has a value.
        let dspark = &self.training.dspark;
        let dflash2 = &self.training.dflash2;
        let derived = [
            ("run.seed", Value::from(self.seed)),
            ("data.held_out_samples", Value::from(self.held_out)),
            ("training.loss_decay_gamma", serde_json::json!(self.gamma)),
            ("training.dspark.ce", Value::from(dspark.ce)),
            ("training.dspark.l1", Value::from(dspark.l1)),
            ("training.dspark.confidence", Value::from(dspark.confidence)),
            (
                "training.dflash2.selector_loss_alpha",
                Value::from(dflash2.selector_loss_alpha),
            ),
            (
                "training.dflash2.selector_warmup_ratio",
                Value::from(dflash2.selector_warmup_ratio),
            ),
            (
                "training.dflash2.selector_ramp_ratio",
                Value::from(dflash2.selector_ramp_ratio),
            ),
            (
                "training.dflash2.selector_stop_gradient",
                Value::from(dflash2.selector_stop_gradient),
            ),
            ("training.tree.budget", Value::from(tree.budget)),
            ("training.tree.temperature", Value::from(tree.temperature)),
            (
                "training.tree.loss",
                Value::from(tree.loss.as_str().to_string()),
            ),
            (
                "training.dpace_normalization",
                Value::from(self.training.dpace_normalization.as_str()),
            ),
            (
                "training.online_eval_every",
                Value::from(self.online_eval_every()),
            ),
        ];
        for (key, value) in derived {
            out.insert(key.to_string(), value);
        }
        Value::Object(out)
    }
}

/// `section`'s leaves into `out` under `prefix.`: a table is walked, anything else (an array
/// included) is one leaf, as the key table counts them.
fn flatten_into(out: &mut Map<String, Value>, prefix: &str, section: Map<String, Value>) {
    for (key, value) in section {
        let path = format!("{prefix}.{key}");
        match value {
            Value::Object(inner) => flatten_into(out, &path, inner),
            leaf => {
                out.insert(path, leaf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::config::DpaceNormalization;

    #[test]
    fn defaults_are_the_paper_values() {
        let c = TrainConfig::default();
        assert_eq!(
            (
                c.training.epochs,
                c.training.num_anchors,
                c.training.lr,
                c.training.warmup_ratio
            ),
            (6, 512, 6e-4, 0.04)
        );
        assert_eq!(c.adamw(), AdamWConfig::default());
        assert_eq!(c.gamma_for(16), 7.0);
        assert_eq!(c.label_mask_rule(), LabelMaskRule::Independent);
    }

    #[test]
    fn a_zero_grad_clip_turns_clipping_off() {
        let mut c = TrainConfig::default();
        c.training.grad_clip = 0.0;
        assert_eq!(c.adamw().max_grad_norm, None);
    }

    #[test]
    fn the_objective_defaults_to_dflash_and_reads_its_alpha_for_dpace() {
        let mut c = TrainConfig::default();
        assert_eq!(c.loss_objective(), LossObjective::Dflash);
        c.training.objective = Objective::Dpace;
        assert_eq!(
            c.loss_objective(),
            LossObjective::Dpace {
                alpha: 0.5,
                normalization: DpaceNormalization::Sequences
            }
        );
        c.training.dpace_normalization = DpaceNormalization::WeightSum;
        assert_eq!(
            c.loss_objective(),
            LossObjective::Dpace {
                alpha: 0.5,
                normalization: DpaceNormalization::WeightSum
            }
        );
        c.training.objective = Objective::Tree;
        c.training.tree.budget = Some(8);
        assert_eq!(
            c.loss_objective(),
            LossObjective::Tree(TreeObjective {
                budget: 8,
                ..TreeObjective::default()
            })
        );
    }

    #[test]
    fn the_dpace_normalization_is_in_the_resume_view_set_or_not() {
        let mut c = TrainConfig::default();
        let json = serde_json::to_value(&c).unwrap();
        assert!(
            json["training"].get("dpace_normalization").is_none(),
            "a checkpoint at the default records what one from before the key did"
        );
        assert_eq!(c.resume_view()["training.dpace_normalization"], "sequences");
        c.training.dpace_normalization = DpaceNormalization::AnchorsPerSequence;
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(
            json["training"]["dpace_normalization"],
            "anchors_per_sequence"
        );
        assert_eq!(serde_json::from_value::<TrainConfig>(json).unwrap(), c);
        assert_eq!(
            c.resume_view()["training.dpace_normalization"],
            "anchors_per_sequence"
        );
    }

    #[test]
    fn online_evaluation_is_off_without_prompts() {
        let mut c = TrainConfig::default();
        assert_eq!(
            c.online_eval_every(),
            0,
            "off unless the run config turns it on"
        );
        c.training.online_eval_every = Some(10);
        assert_eq!(c.online_eval_every(), 0, "no prompts, no online evaluation");
        c.training.online_eval_prompts = Some("embedded".into());
        assert_eq!(c.online_eval_every(), 10);
    }

    #[test]
    fn it_round_trips_and_unknown_keys_are_rejected() {
        let mut c = TrainConfig::default();
        c.training.epochs = 2;
        c.gamma = Some(4.0);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["training"]["epochs"], 2);
        assert_eq!(
            serde_json::from_value::<TrainConfig>(json.clone()).unwrap(),
            c
        );
        let mut bad = json.clone();
        bad["training"]["epoch"] = 2.into();
        assert!(serde_json::from_value::<TrainConfig>(bad).is_err());
        let mut bad = json;
        bad["epoch"] = 2.into();
        assert!(serde_json::from_value::<TrainConfig>(bad).is_err());
    }

    #[test]
    fn the_resume_view_names_the_key_tables_leaves() {
        let mut c = TrainConfig::default();
        c.training.max_steps = Some(10);
        c.training.online_eval_prompts = Some("embedded".into());
        let view = c.resume_view();
        let keys: Vec<&String> = view.as_object().unwrap().keys().collect();
        for key in &keys {
            assert!(
                dflash_shared::config::keys::kind_of(key).is_some(),
                "{key} has no row in the key table"
            );
        }
        for row in dflash_shared::config::keys::KEYS {
            if row.key.starts_with("training.") {
                assert!(
                    view.get(row.key).is_some(),
                    "{} is not in the view",
                    row.key
                );
            }
        }
        assert_eq!(view["training.tree.budget"], 32, "the budget in effect");
    }
}
