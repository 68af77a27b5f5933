//! Locked keys: what a run was started with and must finish with.
//!
//! Changing any of these mid-run would make the result a different experiment (and usually
//! breaks the checkpoint: block size and tap layers shape the drafter's `fc`). On resume the
//! daemon compares the checkpoint's config with the new one and refuses on any change unless
//! an operator confirmed an unlock of that key.
use serde::{Deserialize, Serialize};

use super::Config;

/// Dotted paths of the locked keys.
pub const LOCKED_KEYS: &[&str] = &[
    "training.precision",
    "training.epochs",
    "training.early_stopping",
    "training.num_anchors",
    "drafter.block_size",
    "drafter.target_layer_ids",
];

pub fn is_locked_key(key: &str) -> bool {
    LOCKED_KEYS.contains(&key)
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
/// they serialize, so they read the way the config file writes them.
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

fn value_at(config: &Config, key: &str) -> String {
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
