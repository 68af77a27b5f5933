//! `trainer_state.json`'s `config` as checkpoints wrote it before [`TrainConfig`] held the
//! `[training]` section: one flat object restating the section's keys, some renamed, beside
//! the seed, the held-out count and γ. Such a checkpoint still loads, resumes and is compared
//! key by key under the section's names.
use serde_json::{Map, Value};

use super::{TrainConfig, TrainingSection};

/// The old field and the section key it restated under another name.
const RENAMED: [(&str, &str); 2] = [("max_len", "max_length"), ("label_mask_rule", "label_mask")];

/// The old `adamw` object's fields and the section keys they came from.
const ADAMW: [(&str, &str); 4] = [
    ("beta1", "adam_beta1"),
    ("beta2", "adam_beta2"),
    ("eps", "adam_eps"),
    ("weight_decay", "weight_decay"),
];

/// The old flat shape, converted. Keys the old shape lacked (written before they existed)
/// take the section's defaults, which are the values the old shape defaulted them to.
pub(super) fn from_flat(mut flat: Map<String, Value>) -> Result<TrainConfig, String> {
    let mut take = |key: &str| flat.remove(key);
    let number = |v: Option<Value>, key: &str| -> Result<Option<u64>, String> {
        v.map(|v| {
            v.as_u64()
                .ok_or_else(|| format!("`{key}`: expected a non-negative integer, found {v}"))
        })
        .transpose()
    };
    let seed = number(take("seed"), "seed")?.unwrap_or(0);
    let held_out = number(take("held_out"), "held_out")?.unwrap_or(64) as usize;
    let gamma = take("gamma").and_then(|v| v.as_f64());
    let mut section = Map::new();
    for (old, new) in RENAMED {
        if let Some(v) = take(old) {
            section.insert(new.into(), v);
        }
    }
    if let Some(adamw) = take("adamw") {
        let Value::Object(mut adamw) = adamw else {
            return Err(format!("`adamw`: expected an object, found {adamw}"));
        };
        for (old, new) in ADAMW {
            if let Some(v) = adamw.remove(old) {
                section.insert(new.into(), v);
            }
        }
        // No clipping was `null`; the section says it with 0.
        let clip = adamw.remove("max_grad_norm").unwrap_or(Value::from(1.0));
        section.insert(
            "grad_clip".into(),
            if clip.is_null() { 0.0.into() } else { clip },
        );
        if let Some(extra) = adamw.keys().next() {
            return Err(format!("`adamw.{extra}`: unknown field"));
        }
    }
    // The rest kept their names. The old `online_eval_every` was the interval in effect: as
    // the section's `Some(interval)` it stays in effect (0 with no prompts either way).
    section.extend(flat);
    let training: TrainingSection =
        serde_json::from_value(Value::Object(section)).map_err(|e| e.to_string())?;
    Ok(TrainConfig {
        training,
        seed,
        held_out,
        gamma,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `trainer_state.json`'s `config` as the code before the section wrote it for the
    /// embedded default (taken from a checkpoint that code wrote).
    pub(crate) const EMBEDDED_FLAT: &str = r#"{"seed": 1, "epochs": 6, "max_steps": null,
        "batch_size": 8, "grad_accum": 1, "num_anchors": 16, "objective": "dflash",
        "dpace_alpha": 0.5, "tree": {"budget": 32, "temperature": 1.0, "loss": "margin"},
        "lambda_base_start": 1.0, "lambda_base_decay_ratio": 0.5, "gamma": 4.0,
        "label_mask_rule": "independent", "lr": 0.002, "warmup_ratio": 0.04,
        "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.0,
                  "max_grad_norm": 1.0},
        "max_len": 256, "seq_len_multiple": 64, "held_out": 48, "eval_every": 50,
        "eval_max_samples": 0, "eval_tree_block_subsample": 4, "online_eval_every": 50,
        "online_eval_prompts": "embedded", "online_eval_max_prompts": 8,
        "online_eval_max_new_tokens": 64, "online_eval_tree_budgets": [8, 32],
        "serve_tree_budget": 32, "checkpoint_every": 100, "keep_checkpoints": 3,
        "loss_chunk_positions": 1024, "eval_anchors_per_forward": 64,
        "attention": "block_sparse", "activation_checkpointing": false}"#;

    #[test]
    fn the_flat_shape_converts_to_the_section_and_compares_equal_to_the_embedded_default() {
        let old: TrainConfig = serde_json::from_str(EMBEDDED_FLAT).unwrap();
        let now = crate::embedded::tiny_train_config();
        assert_eq!(old.resume_view(), now.resume_view());
        assert_eq!((old.seed, old.held_out, old.gamma), (1, 48, Some(4.0)));
        assert_eq!(old.training.max_length, 256);
        assert_eq!(old.adamw(), now.adamw());
        assert_eq!(old.online_eval_every(), 50);
        assert_eq!(old.loss_objective(), now.loss_objective());
    }

    #[test]
    fn no_clipping_and_unknown_fields_convert_as_the_old_shape_meant_them() {
        let mut flat: Value = serde_json::from_str(EMBEDDED_FLAT).unwrap();
        flat["adamw"]["max_grad_norm"] = Value::Null;
        let old: TrainConfig = serde_json::from_value(flat.clone()).unwrap();
        assert_eq!(old.training.grad_clip, 0.0);
        assert_eq!(old.adamw().max_grad_norm, None);
        flat["epoch"] = 2.into();
        assert!(serde_json::from_value::<TrainConfig>(flat).is_err());
        let old: TrainConfig = serde_json::from_str(r#"{"epochs": 2}"#).unwrap();
        assert_eq!(old.training.epochs, 2);
        assert_eq!(old.training.objective, super::super::Objective::Dflash);
    }
}
