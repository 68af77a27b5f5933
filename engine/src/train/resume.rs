//! Trainer checkpoints: what exact resume needs, and the checks that refuse an unsafe resume.
//!
//! A checkpoint directory holds `drafter.safetensors` (fp32 master weights, HF keys),
//! `optimizer.safetensors` (AdamW moments), `config.json` (the drafter in the HF layout) and
//! `trainer_state.json` (step, schedule, RNG state, data position, the training config and a
//! digest of the data, `train/loader.rs::data_digest`), all covered by the manifest's
//! checksums.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::Tensor;

use super::best_checkpoint::{self, BestSoFar};
use super::checkpoint;
use super::config::TrainConfig;
use super::error::TrainError;
use super::loader::DataPosition;
use super::schedule::WarmupCosine;
use super::unlocked::{self, UnlockedKeys};
use crate::model::drafter::DrafterConfig;
use dflash_shared::config::keys::{keys_on_resume, OnResume};
use dflash_shared::run_dir::CHECKPOINTS_DIR_NAME;

pub const DRAFTER_FILE: &str = "drafter.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const CONFIG_FILE: &str = "config.json";
pub const STATE_FILE: &str = "trainer_state.json";

/// Keys of a checkpoint's drafter `config.json` that describe how it is served, not what its
/// weights compute: a checkpoint written before they changed (`auto_map` was dropped, the
/// position limit now follows the target) still resumes.
const DESCRIPTIVE_DRAFTER_KEYS: [&str; 2] = ["auto_map", "max_position_embeddings"];

/// Keys of [`TrainConfig::resume_view`] that may change between a checkpoint and its resume:
/// the free rows of the config's key table (`dflash_shared::config::keys`), by their exact
/// names, which decide when and how to evaluate or save and how to chunk or pad work, not what
/// is computed. Every other leaf, a key or a value derived from keys the table fixes, is
/// refused. `training.grad_accum` may change with the number of drafter ranks as long as the
/// global batch (micro-batches per step, checked separately) stays the same.
fn resumable_keys() -> Vec<&'static str> {
    keys_on_resume(OnResume::Free).collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub step: u64,
    pub optimizer_step: u64,
    pub position: DataPosition,
    /// Micro-batches per optimizer step over all drafter ranks (the global batch); absent in
    /// checkpoints written before topologies, which trained `grad_accum` per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batches_per_step: Option<u64>,
    /// The anchor generator's state in checkpoints written before anchors were drawn per
    /// sample; ignored (anchors are now a pure function of seed, epoch and sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<[u64; 4]>,
    pub schedule: WarmupCosine,
    pub config: TrainConfig,
    /// `train/loader.rs::data_digest` of the samples; on disk under its first name.
    #[serde(rename = "data_fingerprint")]
    pub data_digest: String,
    pub dtype: String,
    /// The run's best checkpoint as of this step (`train/best_checkpoint.rs`); absent before
    /// the first online evaluation that scored one, and in checkpoints written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestSoFar>,
}

/// Keys whose values differ between two configs (top-level JSON keys), excluding `allowed`:
/// `(key, "`key`: checkpoint X vs now Y")`.
fn changed_keys(saved: &Value, now: &Value, allowed: &[&str]) -> Vec<(String, String)> {
    let (Value::Object(a), Value::Object(b)) = (saved, now) else {
        return if saved == now {
            vec![]
        } else {
            vec![("<whole config>".into(), "the whole config differs".into())]
        };
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !allowed.contains(&k.as_str()) && a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("absent".to_string(), Value::to_string);
            let text = format!(
                "`{k}`: checkpoint {} vs now {}",
                show(a.get(k)),
                show(b.get(k))
            );
            (k.clone(), text)
        })
        .collect()
}

/// A checkpoint's configs, or a trainer's: the training config and the drafter in the HF
/// layout.
pub struct SavedConfigs<'a> {
    pub train: &'a TrainConfig,
    pub drafter_hf: &'a Value,
}

/// The checkpoint check of the configs alone: `Err(detail)` when the drafter or a training
/// key differs beyond what is free or `unlocked`. The daemon's locked-key gate gives the same
/// verdict for every key both see (`engine/tests/engine/resume_verdicts.rs`).
pub fn config_verdict(
    saved: &SavedConfigs,
    now: &SavedConfigs,
    unlocked: &UnlockedKeys,
) -> Result<(), String> {
    let mut saved_drafter = unlocked::flatten_drafter(saved.drafter_hf);
    let drafter_now = unlocked::flatten_drafter(now.drafter_hf);
    unlocked::reconcile_drafter(&mut saved_drafter, &drafter_now, unlocked)?;
    let drafter_diff = changed_keys(&saved_drafter, &drafter_now, &DESCRIPTIVE_DRAFTER_KEYS);
    if !drafter_diff.is_empty() {
        return Err(format!(
            "the drafter config differs: {}",
            describe_changes(&drafter_diff)
        ));
    }
    let mut saved_config = saved.train.resume_view();
    let config_now = now.train.resume_view();
    unlocked::reconcile_train(&mut saved_config, &config_now, unlocked);
    let config_diff = changed_keys(&saved_config, &config_now, &resumable_keys());
    if !config_diff.is_empty() {
        return Err(format!(
            "locked training keys differ: {}",
            describe_changes(&config_diff)
        ));
    }
    Ok(())
}

/// "`training.epochs`: checkpoint 6 vs now 3. `training.epochs` is locked: … unlock …".
fn describe_changes(changes: &[(String, String)]) -> String {
    let listed: Vec<&str> = changes.iter().map(|(_, text)| text.as_str()).collect();
    let mut remedies: Vec<String> = changes.iter().map(|(k, _)| unlocked::remedy(k)).collect();
    remedies.dedup();
    format!("{}. {}", listed.join("; "), remedies.join(". "))
}

/// The drafter config and fp32 weights of a checkpoint (verified), for export.
pub fn read_checkpoint_drafter(
    dir: &Path,
) -> Result<(DrafterConfig, Vec<(String, Tensor)>), TrainError> {
    checkpoint::verify(dir)?;
    let config_value: Value = checkpoint::read_json(dir, CONFIG_FILE)?;
    let config =
        DrafterConfig::from_hf_value(&config_value, &dir.join(CONFIG_FILE).display().to_string())?;
    let mut weights = checkpoint::read_tensors(dir, DRAFTER_FILE)?;
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((config, weights))
}

/// The best checkpoint of a run's checkpoint root, as its newest checkpoint records it.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordedBest {
    /// The root holds no checkpoint.
    NoCheckpoint,
    /// The newest checkpoint (`newest_step`) records no best, for this reason.
    None {
        newest_step: u64,
        why: dflash_shared::best_checkpoint::NoBestCheckpoint,
    },
    Kept {
        best: BestSoFar,
        dir: PathBuf,
    },
}

/// Reads the best from the trainer state of the newest checkpoint under `root` (checkpoint
/// directories, not a run directory). Only that small file is read; the best's own
/// directory is verified by whoever loads it.
pub fn recorded_best(root: &Path) -> Result<RecordedBest, TrainError> {
    let Some(newest) = checkpoint::latest(root)? else {
        return Ok(RecordedBest::NoCheckpoint);
    };
    let state: TrainerState = checkpoint::read_json(&newest, STATE_FILE)?;
    Ok(match state.best {
        Some(best) => RecordedBest::Kept {
            best,
            dir: best.dir(root),
        },
        None => RecordedBest::None {
            newest_step: state.step,
            why: best_checkpoint::no_best(&state.config, state.step),
        },
    })
}

/// A checkpoint directory, or the newest checkpoint of a run's checkpoint root.
pub fn resolve_checkpoint(path: &Path) -> Result<PathBuf, TrainError> {
    if path.join(checkpoint::MANIFEST).is_file() {
        return Ok(path.to_path_buf());
    }
    for root in [path.join(CHECKPOINTS_DIR_NAME), path.to_path_buf()] {
        if let Some(dir) = checkpoint::latest(&root)? {
            return Ok(dir);
        }
    }
    Err(checkpoint::CheckpointError::NoManifest {
        dir: path.to_path_buf(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_checkpoint_written_with_auto_map_and_the_old_position_limit_still_matches() {
        let target = crate::embedded::tiny_target(None, tch::Device::Cpu).unwrap();
        let now = crate::embedded::tiny_drafter_config(target.config()).to_hf_json();
        let mut before = now.clone();
        before["auto_map"] = json!({"AutoModel": "dflash.DFlashDraftModel"});
        before["max_position_embeddings"] = json!(262_144);
        let (a, b) = (
            unlocked::flatten_drafter(&before),
            unlocked::flatten_drafter(&now),
        );
        assert!(changed_keys(&a, &b, &DESCRIPTIVE_DRAFTER_KEYS).is_empty());
        assert_eq!(changed_keys(&a, &b, &[]).len(), 2, "the keys did change");
        before["hidden_size"] = json!(7);
        let a = unlocked::flatten_drafter(&before);
        assert_eq!(changed_keys(&a, &b, &DESCRIPTIVE_DRAFTER_KEYS).len(), 1);
    }

    #[test]
    fn changed_keys_lists_only_locked_differences() {
        let a = json!({"training.lr": 1.0, "training.eval_every": 5, "training.epochs": 6});
        let b = json!({"training.lr": 2.0, "training.eval_every": 7, "training.epochs": 6});
        let diff = changed_keys(&a, &b, &["training.eval_every"]);
        assert_eq!(
            diff,
            vec![(
                "training.lr".to_string(),
                "`training.lr`: checkpoint 1.0 vs now 2.0".to_string()
            )]
        );
        let text = describe_changes(&changed_keys(
            &a,
            &json!({"training.epochs": 3}),
            &["training.lr", "training.eval_every"],
        ));
        assert!(
            text.starts_with(
                "`training.epochs`: checkpoint 6 vs now 3. `training.epochs` is locked"
            ),
            "{text}"
        );
        assert!(text.contains("dflash-tui attach"), "{text}");
    }

    #[test]
    fn the_data_digest_keeps_its_checkpoint_key() {
        let state = TrainerState {
            step: 1,
            optimizer_step: 1,
            position: DataPosition::default(),
            micro_batches_per_step: Some(1),
            rng: None,
            schedule: WarmupCosine::new(1e-4, 10, 0.1),
            config: TrainConfig::default(),
            data_digest: "ab".into(),
            dtype: "Float".into(),
            best: Some(BestSoFar {
                step: 1,
                tau_tree: 2.5,
                budget: 32,
            }),
        };
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["data_fingerprint"], "ab");
        assert!(json.get("data_digest").is_none());
        let back: TrainerState = serde_json::from_value(json).unwrap();
        assert_eq!(back, state);
    }

    #[test]
    fn the_free_training_keys_of_the_table_are_leaves_of_the_resume_view() {
        let mut config = TrainConfig::default();
        config.training.max_steps = Some(10);
        config.training.online_eval_prompts = Some("embedded".into());
        let view = config.resume_view();
        let resumable = resumable_keys();
        let training: Vec<&str> = resumable
            .iter()
            .copied()
            .filter(|k| k.starts_with("training."))
            .collect();
        assert!(training.len() >= 16, "{training:?}");
        for k in training {
            assert!(view.get(k).is_some(), "{k}");
        }
    }

    /// The embedded default's drafter, in the HF layout.
    fn tiny_drafter_hf() -> Value {
        let target = crate::embedded::tiny_target(None, tch::Device::Cpu).unwrap();
        crate::embedded::tiny_drafter_config(target.config()).to_hf_json()
    }

    /// A checkpoint's `trainer_state.json` as the code before `TrainConfig` held the section
    /// wrote it (the flat config) resumes under the embedded default, and a changed locked key
    /// in it is refused under the key's name.
    #[test]
    fn a_checkpoint_with_the_flat_config_resumes_and_refuses_a_changed_locked_key() {
        use crate::train::config::legacy_tests::EMBEDDED_FLAT;
        let drafter = tiny_drafter_hf();
        let state = |config: Value| {
            json!({"step": 4, "optimizer_step": 4,
                "position": serde_json::to_value(DataPosition::default()).unwrap(),
                "micro_batches_per_step": 1,
                "schedule": serde_json::to_value(WarmupCosine::new(2e-3, 10, 0.04)).unwrap(),
                "config": config, "data_fingerprint": "ab", "dtype": "Float"})
        };
        let flat: Value = serde_json::from_str(EMBEDDED_FLAT).unwrap();
        let old: TrainerState = serde_json::from_value(state(flat.clone())).unwrap();
        let now = crate::embedded::tiny_train_config();
        let configs = |train| SavedConfigs {
            train,
            drafter_hf: &drafter,
        };
        let none = UnlockedKeys::default();
        config_verdict(&configs(&old.config), &configs(&now), &none).unwrap();

        let mut changed = flat.clone();
        changed["lr"] = json!(0.003);
        let old: TrainerState = serde_json::from_value(state(changed)).unwrap();
        let err = config_verdict(&configs(&old.config), &configs(&now), &none).unwrap_err();
        assert!(
            err.contains("`training.lr`: checkpoint 0.003 vs now 0.002"),
            "{err}"
        );

        let mut changed = flat.clone();
        changed["max_len"] = json!(128);
        let old: TrainerState = serde_json::from_value(state(changed)).unwrap();
        let err = config_verdict(&configs(&old.config), &configs(&now), &none).unwrap_err();
        assert!(err.contains("`training.max_length`"), "{err}");

        let mut changed = flat;
        changed["epochs"] = json!(3);
        let old: TrainerState = serde_json::from_value(state(changed)).unwrap();
        let err = config_verdict(&configs(&old.config), &configs(&now), &none).unwrap_err();
        assert!(err.contains("`training.epochs` is locked"), "{err}");
        let epochs = UnlockedKeys::from_keys(&[unlocked::EPOCHS]);
        config_verdict(&configs(&old.config), &configs(&now), &epochs).unwrap();
    }

    /// A checkpoint from before `training.dpace_normalization` trained with its default: it
    /// resumes under the default, and another value is refused naming both, even unlocked.
    #[test]
    fn a_changed_dpace_normalization_is_refused_and_a_checkpoint_from_before_it_reads_as_the_default(
    ) {
        use dflash_shared::config::{DpaceNormalization, Objective};
        let drafter = tiny_drafter_hf();
        let configs = |train| SavedConfigs {
            train,
            drafter_hf: &drafter,
        };
        let mut before = crate::embedded::tiny_train_config();
        before.training.objective = Objective::Dpace;
        let mut written = serde_json::to_value(&before).unwrap();
        assert!(written["training"]
            .as_object_mut()
            .unwrap()
            .remove("dpace_normalization")
            .is_none());
        let old: TrainConfig = serde_json::from_value(written).unwrap();
        let none = UnlockedKeys::default();
        config_verdict(&configs(&old), &configs(&before), &none).unwrap();
        let mut now = before.clone();
        now.training.dpace_normalization = DpaceNormalization::WeightSum;
        let err = config_verdict(&configs(&old), &configs(&now), &none).unwrap_err();
        assert!(
            err.contains(
                "`training.dpace_normalization`: checkpoint \"sequences\" vs now \"weight_sum\""
            ) && err.contains("restore the checkpoint's value"),
            "{err}"
        );
        let unlocked = UnlockedKeys::from_keys(&["training.dpace_normalization"]);
        assert!(config_verdict(&configs(&old), &configs(&now), &unlocked).is_err());
    }
}
