//! Journal events in the console: the column tags and severity words of the events view,
//! alerts and the status report. What an event says is `dflash_shared::events::wording`'s.
use dflash_shared::events::{EventKind, Severity};

pub fn severity_word(level: Severity) -> &'static str {
    match level {
        Severity::Info => "Info",
        Severity::Warn => "Warn",
        Severity::Crit => "Crit",
    }
}

pub use dflash_shared::events::wording::cache_label;

/// The short kind tag used in the events view and `tail`.
pub fn kind_tag(kind: &EventKind) -> &'static str {
    match kind {
        EventKind::RunStarted { .. } => "start",
        EventKind::WarmupDone { .. } => "warmup",
        EventKind::AttentionKernel { .. } => "attention",
        EventKind::Fingerprint { .. } => "fingerprint",
        EventKind::EnvironmentDrift { .. } => "env-drift",
        EventKind::EnvironmentChanged { .. } => "env-change",
        EventKind::CacheChanged { .. } => "cache",
        EventKind::CheckpointWritten { .. } => "checkpoint",
        EventKind::BestCheckpoint { .. } => "best",
        EventKind::CheckpointFallback { .. } => "fallback",
        EventKind::RegressionStarted { .. } => "regression",
        EventKind::RegressionEnded { .. } => "recovered",
        EventKind::OperatorRequest { .. } => "request",
        EventKind::OperatorConfirmed { .. } => "confirmed",
        EventKind::ActionExecuted { .. } => "action",
        EventKind::WorkerFailed { .. } => "worker-failed",
        EventKind::RunPaused { .. } => "paused",
        EventKind::RunStopped { .. } => "stopped",
        EventKind::BadDataLine { .. } => "bad-data",
        EventKind::Note { .. } => "note",
    }
}

/// One sentence per event: the shared wording (`dflash_shared::events::wording`), the same
/// words an alert's "Before it" uses, followed by the event's detail.
pub fn describe(kind: &EventKind) -> String {
    kind.describe()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_and_cache_changes_read_like_the_incident() {
        let drift = EventKind::EnvironmentDrift {
            field: "torch".into(),
            before: "2.11.0+cu128".into(),
            after: "2.9.1+cu130".into(),
        };
        assert_eq!(describe(&drift), "torch 2.11.0+cu128 → 2.9.1+cu130");
        let deleted = EventKind::CacheChanged {
            name: "torchinductor".into(),
            path: "/home/op/.cache/torchinductor".into(),
            change: "deleted".into(),
        };
        assert_eq!(
            describe(&deleted),
            "TorchInductor compile cache deleted (/home/op/.cache/torchinductor)"
        );
        assert_eq!(kind_tag(&deleted), "cache");
    }
}
