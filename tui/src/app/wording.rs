//! Journal events in words, for the events view, alerts and the status report.
use dflash_shared::events::{run_paused_sentence, worker_failed_sentence, EventKind, Severity};
use dflash_shared::format::format_bytes;

use crate::fmt;

pub fn severity_word(level: Severity) -> &'static str {
    match level {
        Severity::Info => "Info",
        Severity::Warn => "Warn",
        Severity::Crit => "Crit",
    }
}

pub use dflash_shared::health::cache::cache_label;

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

/// One sentence per event.
pub fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::RunStarted {
            run_name,
            resumed_from_step: Some(step),
        } => format!(
            "run {run_name} restarted, resuming at step {}",
            fmt::thousands(*step)
        ),
        EventKind::RunStarted { run_name, .. } => format!("run {run_name} started"),
        EventKind::WarmupDone {
            device,
            role,
            duration_ms,
        } => format!(
            "warmup done on {device} ({role:?}) in {}",
            fmt::duration_ms(*duration_ms as i64)
        ),
        EventKind::AttentionKernel {
            device,
            role,
            call_site,
            backend,
        } => format!("attention on {device} ({role:?}): {call_site} runs {backend}"),
        EventKind::Fingerprint { summary } => format!("environment: {summary}"),
        EventKind::EnvironmentDrift {
            field,
            before,
            after,
        } => dflash_shared::health::fingerprint::drift_sentence(field, before, after),
        EventKind::EnvironmentChanged {
            field,
            before,
            after,
        } => format!(
            "{} (informational; resume not held)",
            dflash_shared::health::fingerprint::drift_sentence(field, before, after)
        ),
        EventKind::CacheChanged { name, path, change } => {
            format!("{} {change} ({path})", cache_label(name))
        }
        EventKind::CheckpointWritten { step, path, bytes } => {
            format!(
                "checkpoint at step {}, {} ({path})",
                fmt::thousands(*step),
                format_bytes(*bytes)
            )
        }
        EventKind::RegressionStarted { message, .. } => message.clone(),
        EventKind::RegressionEnded { message, .. } => message.clone(),
        EventKind::OperatorRequest {
            uid,
            request,
            action_id,
        } => match action_id {
            Some(id) => format!("uid {uid} requested {request} (pending {id})"),
            None => format!("uid {uid} requested {request}"),
        },
        EventKind::OperatorConfirmed {
            uid,
            action_id,
            via,
            client_says,
        } => match client_says {
            Some(says) => {
                format!("uid {uid} confirmed {action_id} via {via} (the client says {says})")
            }
            None => format!("uid {uid} confirmed {action_id} via {via}"),
        },
        EventKind::ActionExecuted { action_id, outcome } => format!("{action_id}: {outcome}"),
        EventKind::WorkerFailed {
            device,
            error,
            role,
            rank,
        } => worker_failed_sentence(device, *role, *rank, error),
        EventKind::RunPaused { reason } => run_paused_sentence(reason),
        EventKind::RunStopped { reason, checkpoint } => match checkpoint {
            Some(path) => format!("run stopped ({reason}); checkpoint {path}"),
            None => format!("run stopped ({reason}); no checkpoint"),
        },
        EventKind::BadDataLine { file, line, reason } => {
            format!("skipped bad data line {file}:{line}: {reason}")
        }
        EventKind::CheckpointFallback { from_step, to_step } => format!(
            "resumed from step {} instead of step {} (--resume-from); the steps after it are \
             trained again",
            fmt::thousands(*to_step),
            fmt::thousands(*from_step)
        ),
        EventKind::Note { message } => message.clone(),
    }
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
