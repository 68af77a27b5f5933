//! Journal events: the durable, append-only history of a run.
use serde::{Deserialize, Serialize};

use crate::metrics::TimestampMs;

pub mod wording;
pub use wording::{run_paused_sentence, worker_failed_sentence, worker_subject};

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
    /// The `scaled_dot_product_attention` kernel libtorch gives one attention call site on a
    /// worker's device (`memory-efficient`, `flash`, `math`, `cudnn`, …), journaled once at
    /// warmup.
    AttentionKernel {
        device: String,
        role: crate::metrics::DeviceRole,
        call_site: String,
        backend: String,
    },
    Fingerprint {
        summary: String,
    },
    /// A fingerprint field that holds resume differs from the one recorded at the previous
    /// start (torch, CUDA, driver, GPUs, data, …).
    EnvironmentDrift {
        field: String,
        before: String,
        after: String,
    },
    /// An informational fingerprint field changed (code commit, dflashd version, config
    /// revision): recorded and shown, never holds resume.
    EnvironmentChanged {
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
    /// A checkpoint became the run's best: its weights scored the highest online DDTree τ at
    /// the serving budget so far (`crate::best_checkpoint`). Written after its
    /// `CheckpointWritten`.
    BestCheckpoint {
        step: u64,
        tau_tree: f64,
        budget: usize,
        path: String,
    },
    /// The operator chose (`dflashd start --resume-from`) to resume from `to_step`, an older
    /// checkpoint than the newest the run had (`from_step`), because the newer ones were
    /// damaged or missing; the steps after `to_step` are trained again.
    CheckpointFallback {
        from_step: u64,
        to_step: u64,
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
        /// How the confirmation reached the daemon, as the daemon established it: the run name
        /// matched, on a full (not read-only) connection, from this pid. Journals written before
        /// this field was the daemon's hold the client's word here.
        via: String,
        /// How the client says the operator confirmed (`tty`, `token`, `tui`): its word, not
        /// checked, since a run name typed and one a script copied look the same to the daemon.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_says: Option<String>,
    },
    ActionExecuted {
        action_id: String,
        outcome: String,
    },
    /// A worker failed; `role` and `rank` name which one (absent in journals written before
    /// they were recorded, and for failures outside a worker such as a checkpoint write).
    WorkerFailed {
        device: String,
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<crate::metrics::DeviceRole>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<usize>,
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

/// How a `RunStopped` reason begins when the run trained every epoch; the console reads a run
/// whose daemon is gone as finished by it.
pub const TRAINING_COMPLETE: &str = "training complete";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DeviceRole;

    #[test]
    fn a_worker_failure_names_its_role_and_rank_and_older_lines_still_load() {
        assert_eq!(
            worker_subject("cuda:3", Some(DeviceRole::Target), Some(1)),
            "target worker 1 on cuda:3"
        );
        assert_eq!(worker_subject("cpu", None, None), "worker on cpu");
        let old: EventKind =
            serde_json::from_str(r#"{"kind":"worker_failed","device":"cuda:3","error":"oom"}"#)
                .unwrap();
        assert_eq!(
            old,
            EventKind::WorkerFailed {
                device: "cuda:3".into(),
                error: "oom".into(),
                role: None,
                rank: None
            }
        );
    }
}
