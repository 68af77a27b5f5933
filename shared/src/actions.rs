//! Destructive operations, as data: nothing destructive happens without a pending action that an
//! operator confirmed by name.
use serde::{Deserialize, Serialize};

use crate::metrics::TimestampMs;

/// Every destructive request the daemon accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Checkpoint, then exit.
    StopRun,
    /// Exit without a final checkpoint.
    Kill,
    /// Stop the run, then run the configured power-off command.
    PowerOff,
    DeleteCache {
        name: String,
    },
    /// Allow a locked config key (precision, epochs, anchors, block_size, target_layer_ids) to change.
    UnlockKey {
        key: String,
    },
    /// Delete the healthy record this run is judged against (the run dir's and its recipe's):
    /// the throughput detector then learns its baseline from this run's own rate. For a
    /// slowdown that is legitimate (another machine, a new driver on purpose).
    ForgetHealthyRecord,
}

impl Action {
    pub fn title(&self) -> String {
        match self {
            Action::StopRun => "Stop the run (checkpoint, then exit)".into(),
            Action::Kill => "Kill the run (no final checkpoint)".into(),
            Action::PowerOff => "Stop the run and power off the machine".into(),
            Action::DeleteCache { name } => format!("Delete the {name} cache"),
            Action::UnlockKey { key } => format!("Unlock the locked key '{key}'"),
            Action::ForgetHealthyRecord => {
                "Forget the healthy record (throughput is then learned anew)".into()
            }
        }
    }
}

/// A request waiting for typed confirmation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingAction {
    pub id: String,
    pub action: Action,
    pub requested_by_uid: u32,
    pub created_ms: TimestampMs,
    pub expires_ms: TimestampMs,
    /// Human sentences, e.g. "last checkpoint 14 min ago", "stable at 12.8K tok/s for 3 h".
    pub consequences: Vec<String>,
}
