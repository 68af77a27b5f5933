//! Locked keys: what a run was started with and must finish with.
//!
//! Changing any of these mid-run would make the result a different experiment (and usually
//! breaks the checkpoint: block size and tap layers shape the drafter's `fc`). On resume the
//! daemon compares the checkpoint's config with the new one and refuses on any change unless
//! an operator confirmed an unlock of that key. Even unlocked, some changes can never apply to
//! a running experiment: [`unlock_refusal`] says which and why.
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use super::keys::{keys_on_resume, OnResume, KEYS};
use super::{Config, Objective};

/// Dotted paths of the locked keys.
pub const PRECISION: &str = "training.precision";
pub const EPOCHS: &str = "training.epochs";
pub const NUM_ANCHORS: &str = "training.num_anchors";
pub const BLOCK_SIZE: &str = "drafter.block_size";
pub const TARGET_LAYER_IDS: &str = "drafter.target_layer_ids";
pub const OBJECTIVE: &str = "training.objective";
pub const DPACE_ALPHA: &str = "training.dpace_alpha";
pub const DPACE_NORMALIZATION: &str = "training.dpace_normalization";
pub const TREE_BUDGET: &str = "training.tree.budget";
pub const TREE_TEMPERATURE: &str = "training.tree.temperature";
pub const TREE_LOSS: &str = "training.tree.loss";
pub const HEAD: &str = "drafter.head";
pub const EMB_DIM: &str = "drafter.emb_dim";
pub const GRU_HIDDEN_DIM: &str = "drafter.gru_hidden_dim";
pub const PURE_DRAFT_PREFIX_LEN: &str = "drafter.pure_draft_prefix_len";
pub const SHIFT_LABEL: &str = "drafter.shift_label";
pub const MARKOV_RANK: &str = "drafter.markov_rank";
pub const MARKOV_HEAD_TYPE: &str = "drafter.markov_head_type";
pub const ENABLE_CONFIDENCE_HEAD: &str = "drafter.enable_confidence_head";
pub const CONFIDENCE_HEAD_WITH_MARKOV: &str = "drafter.confidence_head_with_markov";
pub const DSPARK_CE: &str = "training.dspark.ce";
pub const DSPARK_L1: &str = "training.dspark.l1";
pub const DSPARK_CONFIDENCE: &str = "training.dspark.confidence";
pub const CONV_KERNEL_SIZE: &str = "drafter.conv_kernel_size";
pub const CONV_GROUP_SIZE: &str = "drafter.conv_group_size";
pub const SELECTOR_RANK: &str = "drafter.selector_rank";
pub const SELECTOR_TOP_K: &str = "drafter.selector_top_k";
pub const OUTPUT_MULTIPLIER: &str = "drafter.output_multiplier";
pub const FINAL_LOGIT_SOFTCAPPING: &str = "drafter.final_logit_softcapping";
pub const SELECTOR_LOSS_ALPHA: &str = "training.dflash2.selector_loss_alpha";
pub const SELECTOR_WARMUP_RATIO: &str = "training.dflash2.selector_warmup_ratio";
pub const SELECTOR_RAMP_RATIO: &str = "training.dflash2.selector_ramp_ratio";
pub const SELECTOR_STOP_GRADIENT: &str = "training.dflash2.selector_stop_gradient";
pub const LAMBDA_BASE_START: &str = "training.lambda_base_start";
pub const LAMBDA_BASE_DECAY_RATIO: &str = "training.lambda_base_decay_ratio";
pub const INIT_FROM: &str = "drafter.init_from";
pub const HELD_OUT_FRACTION: &str = "data.held_out_fraction";

/// The keys whose change a resume refuses without an unlock: the table's fixed and unlockable
/// rows (`keys.rs`), in its order.
pub static LOCKED_KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    KEYS.iter()
        .filter(|k| k.on_resume != OnResume::Free)
        .map(|k| k.key)
        .collect()
});

/// The locked keys an operator's unlock can carry a run across (the unlock picker's list).
pub static UNLOCKABLE_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| keys_on_resume(OnResume::Unlockable).collect());

/// The head and its keys (Domino's, DSpark's and DFlash2's): their widths shape the drafter's
/// weights, the prefix and label shift decide which slots the correction trains, and DFlash2's
/// logit transform what its unary logits are.
const HEAD_KEYS: [&str; 15] = [
    HEAD,
    EMB_DIM,
    GRU_HIDDEN_DIM,
    PURE_DRAFT_PREFIX_LEN,
    SHIFT_LABEL,
    MARKOV_RANK,
    MARKOV_HEAD_TYPE,
    ENABLE_CONFIDENCE_HEAD,
    CONFIDENCE_HEAD_WITH_MARKOV,
    CONV_KERNEL_SIZE,
    CONV_GROUP_SIZE,
    SELECTOR_RANK,
    SELECTOR_TOP_K,
    OUTPUT_MULTIPLIER,
    FINAL_LOGIT_SOFTCAPPING,
];

pub fn is_locked_key(key: &str) -> bool {
    super::keys::refused_on_resume(key) && super::keys::kind_of(key).is_some()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedKeyChange {
    pub key: String,
    pub before: String,
    pub after: String,
}

impl std::fmt::Display for LockedKeyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is locked: {} → {}",
            self.key, self.before, self.after
        )
    }
}

/// The locked keys whose values differ, in [`LOCKED_KEYS`] order. Values are compared as
/// they serialize, so they read the way the config file writes them; the tree objective's
/// budget as the budget it trains for (`training.serve_tree_budget` when it is unset).
pub fn locked_key_changes(old: &Config, new: &Config) -> Vec<LockedKeyChange> {
    LOCKED_KEYS
        .iter()
        .filter_map(|key| {
            let (before, after) = (value_at(old, key), value_at(new, key));
            (before != after).then(|| LockedKeyChange {
                key: (*key).into(),
                before,
                after,
            })
        })
        .collect()
}

/// Why a change of the locked `key` from `old` to `new` cannot carry a run across a resume,
/// unlocked or not; `None` when an unlock makes it acceptable.
///
/// - `training.precision`: BF16 is the only training precision, and FP8 is never allowed, so
///   there is no other value an unlock could admit.
/// - `drafter.target_layer_ids`: the drafter's `fc` takes one target hidden state per tap
///   layer; a different number of tap layers changes its input width and the checkpoint's
///   weights no longer fit. Moving taps while keeping their number is fine.
/// - `drafter.head` and its Domino keys: the widths shape the GRU and `embed_proj`, the prefix
///   and label shift decide which slots the correction trains.
/// - `training.lambda_base_start`, `training.lambda_base_decay_ratio`: Domino's curriculum.
/// - `training.objective`, `training.dpace_alpha`, `training.dpace_normalization`,
///   `training.tree.*`, `training.dspark.*`, `training.dflash2.*`: the loss decides what the drafter is rewarded for
///   and the scale of its gradient (DFlash averages per weighted position, D-PACE divides its
///   sum by what `training.dpace_normalization` names, the tree objective by the sequences),
///   so a run switching midway is neither experiment and its loss curve breaks at the switch.
///   The engine refuses the checkpoint for the same reason.
/// - `drafter.init_from`: where the run's weights started. A resume continues from its
///   checkpoint and never reads the key again, so another value could change nothing but the
///   record of where the weights came from.
pub fn unlock_refusal(old: &Config, new: &Config, key: &str) -> Option<String> {
    match key {
        INIT_FROM if old.drafter.init_from != new.drafter.init_from => {
            let keep = match &old.drafter.init_from {
                Some(dir) => format!(
                    "Keep drafter.init_from = {:?} (the directory is not read on resume, so it \
                     need not exist any more)",
                    dir
                ),
                None => "Remove drafter.init_from".into(),
            };
            Some(format!(
                "the run's weights started from {}, and its checkpoints carry them on: a resume \
                 never reads drafter.init_from again, so another value would only misrecord \
                 where they came from. {keep}, or start a new run in another run dir",
                match &old.drafter.init_from {
                    Some(_) => "that drafter",
                    None => "a random initialisation",
                }
            ))
        }
        _ if HEAD_KEYS.contains(&key) && value_at(old, key) != value_at(new, key) => Some(format!(
            "the drafter's head decides its weights (the Domino GRU and embed_proj widths, \
                 the DSpark Markov and confidence heads, the DFlash2 convolution and selector) and which slots its correction trains: the checkpoint cannot carry over. Keep \
                 {key} = {}, or start a new run in another run dir",
            value_at(old, key)
        )),
        LAMBDA_BASE_START | LAMBDA_BASE_DECAY_RATIO if value_at(old, key) != value_at(new, key) => {
            Some(format!(
                "Domino's curriculum weighs the base loss against the corrected one step by \
                 step: a run that changes it midway is neither experiment. Keep {key} = {}, or \
                 start a new run in another run dir",
                value_at(old, key)
            ))
        }
        OBJECTIVE | DPACE_ALPHA | DPACE_NORMALIZATION | TREE_BUDGET | TREE_TEMPERATURE
        | TREE_LOSS | DSPARK_CE | DSPARK_L1 | DSPARK_CONFIDENCE | SELECTOR_LOSS_ALPHA
        | SELECTOR_WARMUP_RATIO | SELECTOR_RAMP_RATIO | SELECTOR_STOP_GRADIENT
            if value_at(old, key) != value_at(new, key) =>
        {
            Some(format!(
                "the training objective decides what the drafter learns and the scale of its \
                 gradient (DFlash averages per weighted position, D-PACE divides its sum by \
                 what training.dpace_normalization names, the tree objective by the \
                 sequences): a run that changes it midway is neither experiment. Keep \
                 {key} = {}, or start a new run in another run dir",
                value_at(old, key)
            ))
        }
        "training.precision" if old.training.precision != new.training.precision => Some(
            "BF16 is the only training precision and FP8 is never allowed: DFlash drafters \
             train in BF16 on FP32 master weights"
                .into(),
        ),
        "drafter.target_layer_ids" => {
            let (before, after) = (
                old.drafter.target_layer_ids.len(),
                new.drafter.target_layer_ids.len(),
            );
            (before != after).then(|| {
                format!(
                    "the number of tap layers changes ({before} → {after}): the drafter's fc \
                     input is one target hidden state per tap layer, so the checkpoint's weights \
                     cannot carry over. Keep {before} tap layers, or start a new run in another \
                     run dir"
                )
            })
        }
        _ if super::keys::kind_of(key).is_some_and(|k| k.on_resume == OnResume::Fixed)
            && value_at(old, key) != value_at(new, key) =>
        {
            Some(format!(
                "{key} is part of what the drafter learns (its data order and split, its \
                 architecture, the optimiser or the loss): a run that changes it midway is \
                 neither experiment, and the engine refuses the checkpoint for it too. Keep \
                 {key} = {}, or start a new run in another run dir",
                value_at(old, key)
            ))
        }
        _ => None,
    }
}

/// `key`'s value as TOML writes it, or as the run reads it where the two differ: the tree
/// objective's budget defaults to the serving budget, an unset label shift is no shift, an
/// unset D-PACE normalisation is its default, and the held-out fraction is not read when a
/// held-out count is set.
fn value_at(config: &Config, key: &str) -> String {
    match key {
        DPACE_NORMALIZATION => {
            return format!("{:?}", config.training.dpace_normalization.as_str());
        }
        TREE_BUDGET if config.training.objective == Objective::Tree => {
            let serve = config.training.serve_tree_budget;
            return config.training.tree.effective_budget(serve).to_string();
        }
        SHIFT_LABEL => return config.drafter.shift_label.unwrap_or(false).to_string(),
        HELD_OUT_FRACTION if config.data.held_out_samples.is_some() => {
            return "(not read: data.held_out_samples is set)".into();
        }
        _ => {}
    }
    let Ok(mut value) = toml::Value::try_from(config) else {
        return "?".into();
    };
    for segment in key.split('.') {
        match value.get(segment) {
            Some(v) => value = v.clone(),
            None => return "(unset)".into(),
        }
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tap_count_change_cannot_carry_over() {
        let old = Config::embedded_default();
        let mut moved = old.clone();
        let n = old.drafter.target_layer_ids.len();
        moved.drafter.target_layer_ids = (0..n).collect();
        moved.training.epochs = 2;
        moved.drafter.block_size = old.drafter.block_size * 2;
        for key in LOCKED_KEYS.iter() {
            assert_eq!(unlock_refusal(&old, &moved, key), None, "{key}");
        }
        assert_eq!(
            unlock_refusal(&old, &old, OBJECTIVE),
            None,
            "an unchanged objective needs no refusal"
        );
        let mut more = old.clone();
        more.drafter.target_layer_ids.push(0);
        let why = unlock_refusal(&old, &more, "drafter.target_layer_ids").unwrap();
        assert!(
            why.contains(&format!("{n} → {}", n + 1)) && why.contains("fc input"),
            "{why}"
        );
    }

    #[test]
    fn the_head_its_widths_and_the_curriculum_are_locked_and_no_unlock_carries_a_change() {
        // From DFlash's head to Domino's: the embedded default's head is Domino, so the run
        // before the change is the default with DFlash's head and no Domino width.
        let mut old = Config::embedded_default();
        old.drafter.head = super::super::DrafterHead::Dflash;
        old.drafter.emb_dim = None;
        old.drafter.gru_hidden_dim = None;
        old.drafter.pure_draft_prefix_len = None;
        let mut new = old.clone();
        new.drafter.head = super::super::DrafterHead::Domino;
        new.drafter.emb_dim = Some(32);
        new.drafter.gru_hidden_dim = Some(64);
        new.training.lambda_base_start = 0.5;
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            changes,
            [
                "drafter.head is locked: \"dflash\" → \"domino\"",
                "drafter.emb_dim is locked: (unset) → 32",
                "drafter.gru_hidden_dim is locked: (unset) → 64",
                "training.lambda_base_start is locked: 1.0 → 0.5",
            ]
        );
        for key in [HEAD, EMB_DIM, GRU_HIDDEN_DIM, LAMBDA_BASE_START] {
            let why = unlock_refusal(&old, &new, key).unwrap();
            assert!(why.contains(key) && why.contains("new run"), "{why}");
        }
        for key in [PURE_DRAFT_PREFIX_LEN, SHIFT_LABEL, LAMBDA_BASE_DECAY_RATIO] {
            assert_eq!(
                unlock_refusal(&old, &new, key),
                None,
                "{key} did not change"
            );
        }
    }

    #[test]
    fn init_from_is_locked_and_no_unlock_carries_a_change() {
        assert!(is_locked_key(INIT_FROM));
        let old = Config::embedded_default();
        let mut new = old.clone();
        new.drafter.init_from = Some("/drafters/a".into());
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            changes,
            ["drafter.init_from is locked: (unset) → \"/drafters/a\""]
        );
        let why = unlock_refusal(&old, &new, INIT_FROM).unwrap();
        assert!(
            why.contains("Remove drafter.init_from") && why.contains("new run"),
            "{why}"
        );
        let mut moved = new.clone();
        moved.drafter.init_from = Some("/drafters/b".into());
        let why = unlock_refusal(&new, &moved, INIT_FROM).unwrap();
        assert!(
            why.contains("Keep drafter.init_from = \"/drafters/a\"")
                && why.contains("never reads drafter.init_from again"),
            "{why}"
        );
        assert_eq!(unlock_refusal(&new, &new, INIT_FROM), None);
    }

    #[test]
    fn the_objective_and_its_alpha_are_locked_and_no_unlock_carries_a_change() {
        assert!(is_locked_key(OBJECTIVE) && is_locked_key(DPACE_ALPHA));
        let old = Config::embedded_default();
        let mut new = old.clone();
        new.training.objective = super::super::Objective::Dpace;
        new.training.dpace_alpha = 0.25;
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            changes,
            [
                "training.objective is locked: \"dflash\" → \"dpace\"",
                "training.dpace_alpha is locked: 0.5 → 0.25",
            ]
        );
        let why = unlock_refusal(&old, &new, OBJECTIVE).unwrap();
        assert!(
            why.contains("training.objective = \"dflash\"") && why.contains("new run"),
            "{why}"
        );
        assert!(unlock_refusal(&old, &new, DPACE_ALPHA)
            .unwrap()
            .contains("training.dpace_alpha = 0.5"));
    }

    #[test]
    fn the_dpace_normalization_is_locked_whatever_the_objective_and_named_by_its_value() {
        assert!(is_locked_key(DPACE_NORMALIZATION));
        for objective in [
            super::super::Objective::Dpace,
            super::super::Objective::Dflash,
        ] {
            let mut old = Config::embedded_default();
            old.training.objective = objective;
            let mut new = old.clone();
            new.training.dpace_normalization = super::super::DpaceNormalization::AnchorsPerSequence;
            let changes: Vec<String> = locked_key_changes(&old, &new)
                .iter()
                .map(|c| c.to_string())
                .collect();
            assert_eq!(
                changes,
                ["training.dpace_normalization is locked: \"sequences\" → \
                     \"anchors_per_sequence\""]
            );
            let why = unlock_refusal(&old, &new, DPACE_NORMALIZATION).unwrap();
            assert!(
                why.contains("Keep training.dpace_normalization = \"sequences\"")
                    && why.contains("new run"),
                "{why}"
            );
            assert_eq!(unlock_refusal(&old, &old, DPACE_NORMALIZATION), None);
        }
    }

    #[test]
    fn the_tree_objectives_keys_are_locked_and_no_unlock_carries_a_change() {
        let mut old = Config::embedded_default();
        old.training.objective = super::super::Objective::Tree;
        let mut new = old.clone();
        new.training.tree.budget = Some(8);
        new.training.tree.temperature = 0.5;
        new.training.tree.loss = super::super::TreeLoss::Expected;
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            changes,
            [
                "training.tree.budget is locked: 32 → 8",
                "training.tree.temperature is locked: (unset) → 0.5",
                "training.tree.loss is locked: (unset) → \"expected\"",
            ]
        );
        for key in [TREE_BUDGET, TREE_TEMPERATURE, TREE_LOSS] {
            let why = unlock_refusal(&old, &new, key).unwrap();
            assert!(why.contains(&format!("Keep {key} = ")), "{why}");
            assert_eq!(unlock_refusal(&old, &old, key), None);
        }
    }

    #[test]
    fn with_the_tree_objective_and_no_tree_budget_a_serving_budget_change_changes_the_trained_one()
    {
        let mut old = Config::embedded_default();
        old.training.objective = super::super::Objective::Tree;
        let mut new = old.clone();
        new.training.serve_tree_budget = 8;
        new.training.online_eval_tree_budgets = vec![8];
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(changes, ["training.tree.budget is locked: 32 → 8"]);
        // The DFlash objective reads no tree budget: the serving budget is free.
        let (mut old, mut new) = (old, new);
        old.training.objective = super::super::Objective::Dflash;
        new.training.objective = super::super::Objective::Dflash;
        assert!(locked_key_changes(&old, &new).is_empty());
    }

    #[test]
    fn a_fixed_key_without_a_reason_of_its_own_is_refused_naming_it() {
        let old = Config::embedded_default();
        let mut new = old.clone();
        new.training.lr = 1e-3;
        let changes: Vec<String> = locked_key_changes(&old, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(changes, ["training.lr is locked: 0.002 → 0.001"]);
        let why = unlock_refusal(&old, &new, "training.lr").unwrap();
        assert!(
            why.contains("Keep training.lr = 0.002") && why.contains("new run"),
            "{why}"
        );
        assert!(UNLOCKABLE_KEYS.contains(&EPOCHS) && !UNLOCKABLE_KEYS.contains(&"training.lr"));
    }
}
