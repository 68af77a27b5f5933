//! Locked config keys across restarts.
//!
//! Every start that trains writes the effective config (every default filled in) to
//! `<run_dir>/config.effective.toml`. The next start compares its own config with it: a changed
//! locked key (precision, epochs, early stopping, anchors, block size, tap layers) refuses the
//! resume, unless an operator unlocked that key through a confirmed, journaled action. Unlocks
//! are recorded in `<run_dir>/unlocked-keys.json`, so an unlock confirmed while the old run was
//! still training covers the restart with the new value; an accepted change consumes it and is
//! kept in `<run_dir>/applied-unlocks.json`, so the checkpoint check of later starts knows the
//! run's locked values moved on purpose (the checkpoint may predate the change).
//!
//! Some changes never apply, unlocked or not (FP8, a different number of tap layers): the gate
//! refuses them naming the key and the reason, and does not suggest an unlock.
use std::path::{Path, PathBuf};

use dflash_shared::config::{locked_key_changes, unlock_refusal, Config, LockedKeyChange};
use dflash_shared::metrics::TimestampMs;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use dflash_engine::files::atomic_write::write_atomic;

use dflash_shared::run_dir::{
    APPLIED_UNLOCKS_FILE_NAME, EFFECTIVE_CONFIG_FILE_NAME, UNLOCKS_FILE_NAME,
};

#[derive(Debug, Error)]
pub enum LockedError {
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "the previous effective config {path} does not parse ({detail}); locked keys cannot be \
         checked against it. Restore it, or move it aside to treat this start as a new run"
    )]
    BadPrevious { path: PathBuf, detail: String },
    #[error("{path} is not a valid unlock record: {detail}")]
    BadUnlocks { path: PathBuf, detail: String },
}

/// One confirmed unlock, waiting for the resume that uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlock {
    /// Dotted config path, e.g. `training.epochs`.
    pub key: String,
    pub action_id: String,
    pub unlocked_ms: TimestampMs,
}

/// What comparing the new config with the previous one decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// No previous effective config: a new run (or one from before configs were recorded).
    NoPrevious,
    Unchanged,
    /// Every changed locked key was unlocked; the unlocks are consumed.
    Accepted {
        changes: Vec<LockedKeyChange>,
        used: Vec<Unlock>,
    },
    /// Changes no unlock can make acceptable: `(change, why)`. The run must not resume.
    CannotCarry {
        refusals: Vec<(LockedKeyChange, String)>,
    },
    /// Changed locked keys without an unlock; the run must not resume.
    Refused {
        changes: Vec<LockedKeyChange>,
        /// The changes an unlock already covers (listed for the operator).
        unlocked: Vec<String>,
    },
}

/// Pure decision: `previous` is the recorded effective config, `unlocks` the recorded unlocks
/// (keys are dotted paths).
pub fn judge(previous: Option<&Config>, new: &Config, unlocks: &[Unlock]) -> Gate {
    let Some(previous) = previous else {
        return Gate::NoPrevious;
    };
    let changes = locked_key_changes(previous, new);
    if changes.is_empty() {
        return Gate::Unchanged;
    }
    let refusals: Vec<(LockedKeyChange, String)> = changes
        .iter()
        .filter_map(|c| unlock_refusal(previous, new, &c.key).map(|why| (c.clone(), why)))
        .collect();
    if !refusals.is_empty() {
        return Gate::CannotCarry { refusals };
    }
    let covering = |c: &LockedKeyChange| unlocks.iter().find(|u| u.key == c.key).cloned();
    if changes.iter().all(|c| covering(c).is_some()) {
        let used = changes.iter().filter_map(covering).collect();
        return Gate::Accepted { changes, used };
    }
    let unlocked = changes
        .iter()
        .filter(|c| covering(c).is_some())
        .map(|c| c.key.clone())
        .collect();
    Gate::Refused { changes, unlocked }
}

/// The refusal an operator reads: what changed, why it is refused, and the two ways out.
pub fn refusal_message(changes: &[LockedKeyChange], unlocked: &[String], run_dir: &Path) -> String {
    let mut out = format!(
        "refusing to resume the run in {}: locked config keys changed since it was started:\n",
        run_dir.display()
    );
    for c in changes {
        let note = if unlocked.contains(&c.key) {
            " (unlocked)"
        } else {
            ""
        };
        out.push_str(&format!(
            "  - {}: {} → {}{note}\n",
            c.key, c.before, c.after
        ));
    }
    out.push_str(&format!(
        "A locked key changed mid-run makes the result a different experiment. Either start with \
         the previous values (recorded in {}), or unlock each key while the run is up: in \
         `dflash-tui attach` press U (unlock), pick the key and type the run name. The unlock \
         is journaled and covers the next start.",
        run_dir.join(EFFECTIVE_CONFIG_FILE_NAME).display()
    ));
    out
}

/// The refusal of changes no unlock can admit.
pub fn cannot_carry_message(refusals: &[(LockedKeyChange, String)], run_dir: &Path) -> String {
    let mut out = format!(
        "refusing to resume the run in {}: locked config keys changed in a way the run cannot \
         carry, even unlocked:\n",
        run_dir.display()
    );
    for (c, why) in refusals {
        out.push_str(&format!(
            "  - {}: {} → {}: {why}\n",
            c.key, c.before, c.after
        ));
    }
    out.push_str(&format!(
        "Start with the previous values (recorded in {}).",
        run_dir.join(EFFECTIVE_CONFIG_FILE_NAME).display()
    ));
    out
}

/// The locked keys the checkpoint check may let differ: those an unlock covers at this start
/// (`used`) and those an earlier start already applied. Only meaningful when the gate compared
/// against a previous effective config.
pub fn carried_keys(run_dir: &Path, used: &[Unlock]) -> Result<Vec<String>, LockedError> {
    let mut keys: Vec<String> = load_unlock_list(run_dir, APPLIED_UNLOCKS_FILE_NAME)?
        .into_iter()
        .chain(used.iter().cloned())
        .map(|u| u.key)
        .collect();
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The effective config recorded by the last start that trained, if any.
pub fn load_effective(run_dir: &Path) -> Result<Option<Config>, LockedError> {
    let path = run_dir.join(EFFECTIVE_CONFIG_FILE_NAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LockedError::Io {
                action: "reading",
                path,
                cause: source,
            })
        }
    };
    let origin = path.display().to_string();
    Config::from_toml_str(&text, &origin)
        .map(Some)
        .map_err(|e| LockedError::BadPrevious {
            path,
            detail: e.to_string(),
        })
}

pub fn save_effective(run_dir: &Path, config: &Config) -> Result<(), LockedError> {
    let path = run_dir.join(EFFECTIVE_CONFIG_FILE_NAME);
    let text = format!(
        "# The effective config of this run (every default filled in), written by dflashd at \
         start.\n# Locked keys are checked against it on resume; do not edit.\n{}",
        config.to_toml_string()
    );
    write_atomic(&path, text.as_bytes()).map_err(|source| LockedError::Io {
        action: "writing",
        path,
        cause: source,
    })
}

pub fn load_unlocks(run_dir: &Path) -> Result<Vec<Unlock>, LockedError> {
    load_unlock_list(run_dir, UNLOCKS_FILE_NAME)
}

fn load_unlock_list(run_dir: &Path, file: &str) -> Result<Vec<Unlock>, LockedError> {
    let path = run_dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LockedError::BadUnlocks {
            path,
            detail: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(LockedError::Io {
            action: "reading",
            path,
            cause: source,
        }),
    }
}

fn save_unlocks(run_dir: &Path, unlocks: &[Unlock]) -> Result<(), LockedError> {
    save_unlock_list(run_dir, UNLOCKS_FILE_NAME, unlocks)
}

fn save_unlock_list(run_dir: &Path, file: &str, unlocks: &[Unlock]) -> Result<(), LockedError> {
    let path = run_dir.join(file);
    let result = if unlocks.is_empty() {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    } else {
        let bytes = serde_json::to_vec_pretty(unlocks).map_err(std::io::Error::other);
        bytes.and_then(|b| write_atomic(&path, &b))
    };
    result.map_err(|source| LockedError::Io {
        action: "writing",
        path,
        cause: source,
    })
}

/// Records a confirmed unlock of `key` (a dotted path); a newer unlock replaces an older one.
pub fn record_unlock(run_dir: &Path, unlock: Unlock) -> Result<(), LockedError> {
    let mut all = load_unlocks(run_dir)?;
    all.retain(|u| u.key != unlock.key);
    all.push(unlock);
    save_unlocks(run_dir, &all)
}

/// Moves the unlocks a resume used from the pending list to the applied one.
pub fn consume_unlocks(run_dir: &Path, used: &[Unlock]) -> Result<(), LockedError> {
    let mut applied = load_unlock_list(run_dir, APPLIED_UNLOCKS_FILE_NAME)?;
    applied.extend(used.iter().cloned());
    save_unlock_list(run_dir, APPLIED_UNLOCKS_FILE_NAME, &applied)?;
    let mut all = load_unlocks(run_dir)?;
    all.retain(|u| !used.iter().any(|x| x.key == u.key));
    save_unlocks(run_dir, &all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlock(key: &str) -> Unlock {
        Unlock {
            key: key.into(),
            action_id: "unlock-1".into(),
            unlocked_ms: 1,
        }
    }

    #[test]
    fn a_changed_locked_key_is_refused_unless_unlocked() {
        let old = Config::embedded_default();
        assert_eq!(judge(None, &old, &[]), Gate::NoPrevious);
        let mut new = old.clone();
        new.training.eval_every = 7;
        assert_eq!(judge(Some(&old), &new, &[]), Gate::Unchanged, "not locked");
        new.training.epochs = 3;
        new.training.num_anchors = 8;
        let refused = judge(Some(&old), &new, &[unlock("training.epochs")]);
        match &refused {
            Gate::Refused { changes, unlocked } => {
                let keys: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
                assert_eq!(keys, ["training.epochs", "training.num_anchors"]);
                assert_eq!(unlocked, &["training.epochs".to_string()]);
                let text = refusal_message(changes, unlocked, Path::new("/runs/a"));
                assert!(text.contains("training.epochs: 6 → 3 (unlocked)"), "{text}");
                assert!(text.contains("training.num_anchors: 16 → 8\n"), "{text}");
                assert!(text.contains("/runs/a/config.effective.toml"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let both = [unlock("training.epochs"), unlock("training.num_anchors")];
        match judge(Some(&old), &new, &both) {
            Gate::Accepted { changes, used } => {
                assert_eq!(changes.len(), 2);
                assert_eq!(used, both);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_tap_count_change_is_refused_even_unlocked() {
        let old = Config::embedded_default();
        let mut new = old.clone();
        new.drafter.target_layer_ids.push(0);
        new.training.epochs = 3;
        let unlocks = [
            unlock("drafter.target_layer_ids"),
            unlock("training.epochs"),
        ];
        let Gate::CannotCarry { refusals } = judge(Some(&old), &new, &unlocks) else {
            panic!("a different number of tap layers cannot carry the weights");
        };
        assert_eq!(refusals.len(), 1);
        let text = cannot_carry_message(&refusals, Path::new("/runs/a"));
        assert!(
            text.contains("drafter.target_layer_ids: [") && text.contains("fc input"),
            "{text}"
        );
        assert!(!text.contains("press U"), "no unlock can help: {text}");

        let mut moved = old.clone();
        moved.drafter.target_layer_ids = (0..old.drafter.target_layer_ids.len()).collect();
        assert!(matches!(
            judge(Some(&old), &moved, &[unlock("drafter.target_layer_ids")]),
            Gate::Accepted { .. }
        ));
    }

    #[test]
    fn effective_config_and_unlocks_round_trip_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_effective(dir.path()).unwrap(), None);
        let cfg = Config::embedded_default();
        save_effective(dir.path(), &cfg).unwrap();
        assert_eq!(load_effective(dir.path()).unwrap(), Some(cfg));

        record_unlock(dir.path(), unlock("training.epochs")).unwrap();
        record_unlock(dir.path(), unlock("drafter.block_size")).unwrap();
        record_unlock(dir.path(), unlock("training.epochs")).unwrap();
        assert_eq!(load_unlocks(dir.path()).unwrap().len(), 2);
        consume_unlocks(dir.path(), &[unlock("training.epochs")]).unwrap();
        assert_eq!(
            load_unlocks(dir.path()).unwrap(),
            vec![unlock("drafter.block_size")]
        );
        consume_unlocks(dir.path(), &[unlock("drafter.block_size")]).unwrap();
        assert!(!dir.path().join(UNLOCKS_FILE_NAME).exists());
        assert_eq!(
            carried_keys(dir.path(), &[unlock("training.num_anchors")]).unwrap(),
            [
                "drafter.block_size",
                "training.epochs",
                "training.num_anchors"
            ],
            "applied unlocks stay known to later starts"
        );

        std::fs::write(
            dir.path().join(EFFECTIVE_CONFIG_FILE_NAME),
            "[run]\nname = 3\n",
        )
        .unwrap();
        let err = load_effective(dir.path()).unwrap_err().to_string();
        assert!(err.contains("does not parse"), "{err}");
    }
}
