//! Locked keys an operator unlocked, as the checkpoint check sees them.
//!
//! The daemon decides which locked keys may differ from the checkpoint (a confirmed, journaled
//! unlock); this module decides whether the checkpoint can still carry the run across each
//! change. Epochs, anchors and block size change nothing the checkpoint stores: the schedule is
//! recomputed from the new total and the data position is kept. Tap layers may move as long as
//! their number stays, because the number sets the width of the drafter's `fc` input.
use serde_json::Value;

use super::schedule::WarmupCosine;

/// Dotted config paths of the keys the engine can carry across a resume when unlocked.
// The key names are the config's (`dflash_shared::config::locked`), named once there.
pub use dflash_shared::config::locked::{BLOCK_SIZE, EPOCHS, NUM_ANCHORS, TARGET_LAYER_IDS};

/// Which locked keys may differ between a checkpoint and the trainer that resumes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnlockedKeys {
    pub epochs: bool,
    pub num_anchors: bool,
    pub block_size: bool,
    pub target_layer_ids: bool,
}

impl UnlockedKeys {
    /// From dotted config paths; other unlocked keys are ignored here: the config's key table
    /// (`dflash_shared::config::keys`) makes only these four unlockable, and the daemon's gate
    /// refuses a change of any other locked key whatever was unlocked.
    pub fn from_keys<S: AsRef<str>>(keys: &[S]) -> Self {
        let has = |k: &str| keys.iter().any(|x| x.as_ref() == k);
        Self {
            epochs: has(EPOCHS),
            num_anchors: has(NUM_ANCHORS),
            block_size: has(BLOCK_SIZE),
            target_layer_ids: has(TARGET_LAYER_IDS),
        }
    }
}

/// The dotted config path of a key the checkpoint check names, when it is a locked key an
/// operator can unlock: a training key is named by its path already, a drafter key by its
/// name in the HF layout (`block_size`, `dflash_config` → tap layers).
pub fn locked_key_path(engine_key: &str) -> Option<&'static str> {
    match engine_key {
        EPOCHS => Some(EPOCHS),
        NUM_ANCHORS => Some(NUM_ANCHORS),
        "block_size" => Some(BLOCK_SIZE),
        "target_layer_ids" => Some(TARGET_LAYER_IDS),
        _ => None,
    }
}

/// How to get past a refused change of `engine_key`.
pub fn remedy(engine_key: &str) -> String {
    match locked_key_path(engine_key) {
        Some(path) => format!(
            "`{path}` is locked: restore the checkpoint's value, or unlock it while the run is up \
             (`dflash-tui attach`, press U, pick {path}, then confirm by typing the run name) and \
             start again"
        ),
        None => format!(
            "`{engine_key}` cannot change within a run: restore the checkpoint's value, or start \
             a new run in another run dir"
        ),
    }
}

/// The drafter's HF config with the `dflash_config` fields (tap layers, mask token) lifted to
/// the top level, so a difference names the exact key.
pub fn flatten_drafter(hf: &Value) -> Value {
    let mut out = hf.clone();
    if let Some(map) = out.as_object_mut() {
        if let Some(Value::Object(inner)) = map.remove("dflash_config") {
            map.extend(inner);
        }
    }
    out
}

/// Makes the checkpoint's (flattened) drafter config agree with `now` on the unlocked keys, or
/// says why the weights cannot carry over.
pub fn reconcile_drafter(
    saved: &mut Value,
    now: &Value,
    unlocked: &UnlockedKeys,
) -> Result<(), String> {
    if unlocked.block_size {
        copy_field(saved, now, &["block_size"]);
    }
    if unlocked.target_layer_ids {
        let path = ["target_layer_ids"];
        let count = |v: &Value| lookup(v, &path).and_then(Value::as_array).map(Vec::len);
        let (before, after) = (count(saved), count(now));
        if before != after {
            return Err(format!(
                "`{TARGET_LAYER_IDS}` was unlocked, but the number of tap layers changes ({} → \
                 {}): the drafter's fc input is one target hidden state per tap layer, so the \
                 checkpoint's weights cannot carry over. Keep {} tap layers, or start a new run \
                 in another run dir",
                show_count(before),
                show_count(after),
                show_count(before),
            ));
        }
        copy_field(saved, now, &path);
    }
    Ok(())
}

/// Makes the checkpoint's training config agree with `now` on the unlocked keys (both as
/// `TrainConfig::resume_view` gives them).
pub fn reconcile_train(saved: &mut Value, now: &Value, unlocked: &UnlockedKeys) {
    if unlocked.epochs {
        copy_field(saved, now, &[EPOCHS]);
    }
    if unlocked.num_anchors {
        copy_field(saved, now, &[NUM_ANCHORS]);
    }
    if unlocked.block_size {
        // The default loss decay γ is a function of the block size and moves with it.
        copy_field(saved, now, &["training.loss_decay_gamma"]);
    }
}

/// Whether the checkpoint's schedule may give way to `now`'s: only its length may differ, and
/// only with epochs unlocked; the run must not already be past the new end.
pub fn check_schedule(
    saved: &WarmupCosine,
    now: &WarmupCosine,
    step: u64,
    unlocked: &UnlockedKeys,
) -> Result<(), String> {
    if saved == now {
        return Ok(());
    }
    let only_length = saved.base_lr == now.base_lr;
    if unlocked.epochs && only_length {
        if step >= now.total_steps {
            return Err(format!(
                "`{EPOCHS}` was unlocked, but the run is already at step {step} and the new \
                 total is {} steps: there is nothing left to train. Choose more epochs",
                now.total_steps
            ));
        }
        return Ok(());
    }
    let hint = if only_length {
        format!("; {}", remedy(EPOCHS))
    } else {
        String::new()
    };
    Err(format!(
        "the schedule differs: checkpoint {saved:?}, now {now:?}{hint}"
    ))
}

fn show_count(n: Option<usize>) -> String {
    n.map_or("an unknown number of".into(), |n| n.to_string())
}

fn lookup<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn copy_field(saved: &mut Value, now: &Value, path: &[&str]) {
    let Some(value) = lookup(now, path).cloned() else {
        return;
    };
    let (last, parents) = path.split_last().expect("a non-empty path");
    let mut at = saved;
    for key in parents {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(map) = at.as_object_mut() {
        map.insert((*last).to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn drafter(block: u32, taps: &[u32]) -> Value {
        flatten_drafter(&json!({"block_size": block, "hidden_size": 64,
               "dflash_config": {"mask_token_id": 5, "target_layer_ids": taps}}))
    }

    #[test]
    fn unlocked_drafter_keys_carry_over_while_the_tap_count_stays() {
        let none = UnlockedKeys::default();
        let mut saved = drafter(4, &[1, 3]);
        reconcile_drafter(&mut saved, &drafter(8, &[0, 2]), &none).unwrap();
        assert_eq!(
            saved,
            drafter(4, &[1, 3]),
            "nothing unlocked, nothing copied"
        );

        let both = UnlockedKeys::from_keys(&[BLOCK_SIZE, TARGET_LAYER_IDS]);
        reconcile_drafter(&mut saved, &drafter(8, &[0, 2]), &both).unwrap();
        assert_eq!(saved, drafter(8, &[0, 2]));

        let err = reconcile_drafter(&mut drafter(4, &[1, 3]), &drafter(4, &[0, 1, 2]), &both)
            .unwrap_err();
        assert!(
            err.contains(TARGET_LAYER_IDS) && err.contains("2 → 3") && err.contains("fc input"),
            "{err}"
        );
    }

    #[test]
    fn unlocked_training_keys_and_the_schedule_length() {
        let unlocked = UnlockedKeys::from_keys(&[EPOCHS, NUM_ANCHORS]);
        assert!(unlocked.epochs && unlocked.num_anchors && !unlocked.block_size);
        let mut now = crate::train::TrainConfig::default();
        now.training.epochs = 3;
        now.training.num_anchors = 8;
        now.training.lr = 1e-3;
        let mut saved = crate::train::TrainConfig::default().resume_view();
        reconcile_train(&mut saved, &now.resume_view(), &unlocked);
        assert_eq!(
            (saved[EPOCHS].clone(), saved[NUM_ANCHORS].clone()),
            (json!(3), json!(8))
        );
        assert_eq!(saved["training.lr"], json!(6e-4), "lr is not unlockable");

        let (six, three) = (
            WarmupCosine::new(1e-3, 600, 0.04),
            WarmupCosine::new(1e-3, 300, 0.04),
        );
        check_schedule(&six, &three, 10, &unlocked).unwrap();
        let past = check_schedule(&six, &three, 300, &unlocked).unwrap_err();
        assert!(
            past.contains("step 300") && past.contains("300 steps"),
            "{past}"
        );
        let locked = check_schedule(&six, &three, 10, &UnlockedKeys::default()).unwrap_err();
        assert!(
            locked.contains("dflash-tui") && locked.contains(EPOCHS),
            "{locked}"
        );
        let other_lr = WarmupCosine::new(2e-3, 300, 0.04);
        let err = check_schedule(&six, &other_lr, 10, &unlocked).unwrap_err();
        assert!(
            !err.contains("dflash-tui"),
            "an lr change is not an unlock: {err}"
        );
    }

    #[test]
    fn remedies_name_the_unlock_only_for_locked_keys() {
        assert!(remedy(NUM_ANCHORS).contains("press U, pick training.num_anchors"));
        assert!(remedy("target_layer_ids").contains(TARGET_LAYER_IDS));
        assert!(remedy("mask_token_id").contains("new run"));
        let flat = flatten_drafter(&json!({"a": 1, "dflash_config": {"target_layer_ids": [1]}}));
        assert_eq!(flat, json!({"a": 1, "target_layer_ids": [1]}));
        assert!(remedy("training.lr").contains("new run"));
    }
}
