//! Journal events: the durable, append-only history of a run.
use serde::{Deserialize, Serialize};

use crate::metrics::TimestampMs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warn,
    Crit,
}

/// One journal line. `seq` is strictly increasing within a journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub ts_ms: TimestampMs,
    pub severity: Severity,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Serialized with a `"kind"` tag so journal lines are greppable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    RunStarted {
        run_name: String,
        resumed_from_step: Option<u64>,
    },
    WarmupDone {
        device: String,
        role: crate::metrics::DeviceRole,
        duration_ms: f64,
    },
    Fingerprint {
        summary: String,
    },
    /// A fingerprint field differs from the one recorded at the previous start.
    EnvironmentDrift {
        field: String,
        before: String,
        after: String,
    },
    CacheChanged {
        name: String,
        path: String,
        change: String,
    },
    CheckpointWritten {
        step: u64,
        path: String,
        bytes: u64,
    },
    RegressionStarted {
        detector: String,
        level: Severity,
        message: String,
    },
    RegressionEnded {
        detector: String,
        message: String,
    },
    OperatorRequest {
        uid: u32,
        request: String,
        action_id: Option<String>,
    },
    OperatorConfirmed {
        uid: u32,
        action_id: String,
        via: String,
    },
    ActionExecuted {
        action_id: String,
        outcome: String,
    },
    WorkerFailed {
        device: String,
        error: String,
    },
    RunPaused {
        reason: String,
    },
    RunStopped {
        reason: String,
        checkpoint: Option<String>,
    },
    BadDataLine {
        file: String,
        line: u64,
        reason: String,
    },
    Note {
        message: String,
    },
}
