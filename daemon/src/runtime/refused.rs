//! A start refused before the daemon could open its run (a config file that does not load):
//! the caller's terminal gets the error, and an existing run's journal keeps it, so the run's
//! history shows the failed restart next to everything else.
use std::path::Path;

use dflash_shared::events::{EventKind, Severity};

use crate::run::journal::Journal;
use crate::runtime::run_dir_lock::RunDirLock;

/// Appends `RunStopped { reason }` to the journal of `run_dir`, if it is an existing run that
/// no live daemon holds (a live daemon's journal is its own to write). Returns whether the
/// event was written; failing to journal never hides the original error.
pub fn journal_refused_start(run_dir: &Path, reason: &str) -> bool {
    if !dflash_shared::run_dir::journal_path(run_dir).is_file() {
        return false;
    }
    let Ok(_lock) = RunDirLock::acquire(run_dir) else {
        return false;
    };
    let Ok((mut journal, _)) = Journal::open(run_dir) else {
        return false;
    };
    journal
        .append(
            Severity::Crit,
            EventKind::RunStopped {
                reason: reason.to_string(),
                checkpoint: None,
            },
        )
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_existing_unheld_run_journals_the_refusal() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            !journal_refused_start(dir.path(), "bad config"),
            "no run yet"
        );
        drop(Journal::open(dir.path()).unwrap());
        {
            let _held = RunDirLock::acquire(dir.path()).unwrap();
            assert!(!journal_refused_start(dir.path(), "bad config"), "held");
        }
        assert!(journal_refused_start(dir.path(), "bad config: x"));
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let last = journal.recent(1);
        assert!(
            matches!(&last[0].kind, EventKind::RunStopped { reason, .. } if reason == "bad config: x"),
            "{last:?}"
        );
    }
}
