//! Journal events in words: the one home of what each [`EventKind`] says to people.
//!
//! Every event has a headline and a full sentence, and the full sentence always begins with the
//! headline:
//!
//! - [`EventKind::headline`], what changed in the fewest words that still say it: an alert's
//!   "Before it: …" (`health/explain.rs`) names its preceding events this way;
//! - [`EventKind::describe`], the headline and its detail (paths, sizes, ids): the console's
//!   events view, `dflash-tui tail`, the report's timeline.
//!
//! So an alert and the console cannot word one event two ways, and a new kind is worded once.
//! What stays with each caller is presentation only: the console's column tag, colours and
//! truncation; which kinds explain an alert (`health/explain.rs`).
use super::EventKind;
use crate::format::{format_bytes, format_duration_ms, format_thousands};
use crate::metrics::DeviceRole;

impl EventKind {
    /// "TorchInductor compile cache deleted": what happened, without its detail.
    pub fn headline(&self) -> String {
        self.wording().0
    }

    /// "TorchInductor compile cache deleted (was 2.1 GB, 418 entries) (/srv/cache/inductor)":
    /// the headline followed by its detail.
    pub fn describe(&self) -> String {
        let (headline, detail) = self.wording();
        headline + &detail
    }

    /// The headline and the detail that follows it (empty when there is none).
    fn wording(&self) -> (String, String) {
        let bare = |headline: String| (headline, String::new());
        match self {
            EventKind::RunStarted {
                run_name,
                resumed_from_step: Some(step),
            } => (
                format!(
                    "daemon restarted, resumed at step {}",
                    format_thousands(*step)
                ),
                format!(" (run {run_name})"),
            ),
            EventKind::RunStarted { run_name, .. } => bare(format!("run {run_name} started")),
            EventKind::WarmupDone {
                device,
                role,
                duration_ms,
            } => (
                format!("warmup done on {device} ({role:?})"),
                format!(" in {}", format_duration_ms((*duration_ms as i64).max(0))),
            ),
            EventKind::AttentionKernel {
                device,
                role,
                call_site,
                backend,
            } => bare(format!(
                "attention on {device} ({role:?}): {call_site} runs {backend}"
            )),
            EventKind::Fingerprint { summary } => bare(format!("environment: {summary}")),
            EventKind::EnvironmentDrift {
                field,
                before,
                after,
            } => bare(drift_sentence(field, before, after)),
            EventKind::EnvironmentChanged {
                field,
                before,
                after,
            } => (
                drift_sentence(field, before, after),
                " (informational; resume not held)".into(),
            ),
            EventKind::CacheChanged { name, path, change } => {
                cache_changed_wording(name, path, change)
            }
            EventKind::CheckpointWritten { step, path, bytes } => (
                format!("checkpoint at step {}", format_thousands(*step)),
                format!(", {} ({path})", format_bytes(*bytes)),
            ),
            EventKind::BestCheckpoint {
                step,
                tau_tree,
                budget,
                path,
            } => (
                format!("best checkpoint: step {}", format_thousands(*step)),
                format!(", tree τ@{budget} {tau_tree:.2} ({path})"),
            ),
            EventKind::CheckpointFallback { from_step, to_step } => {
                checkpoint_fallback_wording(*from_step, *to_step)
            }
            EventKind::RegressionStarted { message, .. }
            | EventKind::RegressionEnded { message, .. } => regression_wording(message),
            EventKind::OperatorRequest {
                uid,
                request,
                action_id,
            } => operator_request_wording(*uid, request, action_id.as_deref()),
            EventKind::OperatorConfirmed {
                uid,
                action_id,
                via,
                client_says,
            } => operator_confirmed_wording(*uid, action_id, via, client_says.as_deref()),
            EventKind::ActionExecuted { action_id, outcome } => {
                bare(format!("operator action {action_id}: {outcome}"))
            }
            EventKind::WorkerFailed {
                device,
                error,
                role,
                rank,
            } => bare(worker_failed_sentence(device, *role, *rank, error)),
            EventKind::RunPaused { reason } => bare(run_paused_sentence(reason)),
            EventKind::RunStopped { reason, checkpoint } => (
                format!("run stopped ({reason})"),
                match checkpoint {
                    Some(path) => format!("; checkpoint {path}"),
                    None => "; no checkpoint".into(),
                },
            ),
            EventKind::BadDataLine { file, line, reason } => (
                format!("skipped bad data line {file}:{line}"),
                format!(": {reason}"),
            ),
            EventKind::Note { message } => bare(message.clone()),
        }
    }
}

fn cache_changed_wording(name: &str, path: &str, change: &str) -> (String, String) {
    // `change` is the kind's word, then maybe "(was 2.1 GB, 418 entries)"
    // (`health/cache.rs::CacheChange::to_event_kind`): the word is the headline's.
    let (word, was) = match change.split_once(" (") {
        Some((word, rest)) => (word, format!(" ({rest}")),
        None => (change, String::new()),
    };
    (
        format!("{} {word}", cache_label(name)),
        format!("{was} ({path})"),
    )
}

fn checkpoint_fallback_wording(from_step: u64, to_step: u64) -> (String, String) {
    (
        format!(
            "resumed from step {} instead of step {} (--resume-from)",
            format_thousands(to_step),
            format_thousands(from_step)
        ),
        "; the steps after it are trained again".into(),
    )
}

/// A detector's message is its headline, a colon, then the figures:
/// "GPU 0 memory volatile: range …".
fn regression_wording(message: &str) -> (String, String) {
    match message.split_once(": ") {
        Some((headline, rest)) => (headline.to_string(), format!(": {rest}")),
        None => (message.to_string(), String::new()),
    }
}

fn operator_request_wording(uid: u32, request: &str, action_id: Option<&str>) -> (String, String) {
    (
        format!("uid {uid} requested {request}"),
        match action_id {
            Some(id) => format!(" (pending {id})"),
            None => String::new(),
        },
    )
}

fn operator_confirmed_wording(
    uid: u32,
    action_id: &str,
    via: &str,
    client_says: Option<&str>,
) -> (String, String) {
    (
        format!("uid {uid} confirmed {action_id}"),
        match client_says {
            Some(says) => format!(" via {via} (the client says {says})"),
            None => format!(" via {via}"),
        },
    )
}

/// "target worker 1 on cuda:3", or "worker on cuda:3" when the role or rank is unknown.
pub fn worker_subject(device: &str, role: Option<DeviceRole>, rank: Option<usize>) -> String {
    match (role, rank) {
        (Some(role), Some(rank)) => {
            let word = match role {
                DeviceRole::Target => "target",
                DeviceRole::Drafter => "drafter",
                DeviceRole::Both => "target+drafter",
                DeviceRole::Idle => "idle",
            };
            format!("{word} worker {rank} on {device}")
        }
        _ => format!("worker on {device}"),
    }
}

/// "drafter worker 1 on cuda:6 failed: CUDA out of memory": a `WorkerFailed` event's sentence
/// (the healthy record's "since it" list words a failure the same).
pub fn worker_failed_sentence(
    device: &str,
    role: Option<DeviceRole>,
    rank: Option<usize>,
    error: &str,
) -> String {
    format!("{} failed: {error}", worker_subject(device, role, rank))
}

/// "run paused: …": a `RunPaused` event's sentence.
pub fn run_paused_sentence(reason: &str) -> String {
    format!("run paused: {reason}")
}

/// Human name of a configured cache: "TorchInductor compile cache" for `torchinductor`.
pub fn cache_label(name: &str) -> String {
    match name {
        "torchinductor" => "TorchInductor compile cache".into(),
        "triton" => "Triton kernel cache".into(),
        "cuda_compute_cache" => "CUDA ComputeCache".into(),
        "dflash_warmup" => "warmup record".into(),
        other => format!("{other} cache"),
    }
}

/// Human wording of an environment drift (`health/fingerprint.rs`), shared by the drift's own
/// sentence and the `EnvironmentDrift` event.
pub fn drift_sentence(field: &str, before: &str, after: &str) -> String {
    let label = match field {
        "libtorch" => "libtorch",
        "tch" => "tch",
        "cuda_runtime" => "CUDA runtime",
        "cuda_driver" => "CUDA driver",
        "gpu_models" => "GPUs",
        "hostname" => "host",
        "dflashd" => "dflashd",
        "code_git_commit" => "code commit",
        "config_git_commit" => "config commit",
        "config_hash" => "config",
        "data_hash" => "training data",
        "python_executable" => "Python",
        "cuda_alloc_conf" => "CUDA allocator config",
        other => other.strip_prefix("python.").unwrap_or(other),
    };
    let (before, after) = match field {
        "code_git_commit" | "config_git_commit" | "config_hash" | "data_hash" => {
            (short_hash(before), short_hash(after))
        }
        _ => (before.to_string(), after.to_string()),
    };
    format!("{label} {before} → {after}")
}

fn short_hash(h: &str) -> String {
    if h.len() > 12 && h.chars().all(|c| c.is_ascii_hexdigit()) {
        h[..12].to_string()
    } else {
        h.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, Severity};
    use crate::health::explain_alert;

    fn every_kind() -> Vec<EventKind> {
        vec![
            EventKind::RunStarted {
                run_name: "qwen".into(),
                resumed_from_step: Some(1_200),
            },
            EventKind::RunStarted {
                run_name: "qwen".into(),
                resumed_from_step: None,
            },
            EventKind::WarmupDone {
                device: "cuda:0".into(),
                role: DeviceRole::Drafter,
                duration_ms: 95_000.0,
            },
            EventKind::AttentionKernel {
                device: "cuda:0".into(),
                role: DeviceRole::Drafter,
                call_site: "drafter".into(),
                backend: "flash".into(),
            },
            EventKind::Fingerprint {
                summary: "torch 2.9.1".into(),
            },
            EventKind::EnvironmentDrift {
                field: "python.torch".into(),
                before: "2.11.0+cu128".into(),
                after: "2.9.1+cu130".into(),
            },
            EventKind::EnvironmentChanged {
                field: "dflashd".into(),
                before: "0.0.1".into(),
                after: "0.0.2".into(),
            },
            EventKind::CacheChanged {
                name: "torchinductor".into(),
                path: "/srv/cache/inductor".into(),
                change: "deleted (was 2.1 GB, 418 entries)".into(),
            },
            EventKind::CacheChanged {
                name: "triton".into(),
                path: "/srv/cache/triton".into(),
                change: "appeared".into(),
            },
            EventKind::CheckpointWritten {
                step: 12_000,
                path: "/srv/run/checkpoints/step-12000".into(),
                bytes: 2_100_000_000,
            },
            EventKind::CheckpointFallback {
                from_step: 1_200,
                to_step: 1_000,
            },
            EventKind::RegressionStarted {
                detector: "memory:gpu0".into(),
                level: Severity::Warn,
                message: "GPU 0 memory volatile: range 9 GB".into(),
            },
            EventKind::RegressionEnded {
                detector: "memory:gpu0".into(),
                message: "GPU 0 memory steady again".into(),
            },
            EventKind::OperatorRequest {
                uid: 1000,
                request: "stop".into(),
                action_id: Some("act-1".into()),
            },
            EventKind::OperatorConfirmed {
                uid: 1000,
                action_id: "act-1".into(),
                via: "run name".into(),
                client_says: Some("tty".into()),
            },
            EventKind::ActionExecuted {
                action_id: "act-1".into(),
                outcome: "checkpointing, then stopping".into(),
            },
            EventKind::WorkerFailed {
                device: "cuda:6".into(),
                error: "CUDA out of memory".into(),
                role: Some(DeviceRole::Drafter),
                rank: Some(1),
            },
            EventKind::RunPaused {
                reason: "disk full".into(),
            },
            EventKind::RunStopped {
                reason: "operator".into(),
                checkpoint: None,
            },
            EventKind::BadDataLine {
                file: "train.jsonl".into(),
                line: 7,
                reason: "not JSON".into(),
            },
            EventKind::Note {
                message: "hello".into(),
            },
            EventKind::BestCheckpoint {
                step: 450,
                tau_tree: 4.4519,
                budget: 32,
                path: "/srv/run/checkpoints/step-0000000450".into(),
            },
        ]
    }

    #[test]
    fn every_full_sentence_begins_with_its_headline() {
        for kind in every_kind() {
            let (headline, full) = (kind.headline(), kind.describe());
            assert!(!headline.is_empty(), "{kind:?}");
            assert!(full.starts_with(&headline), "{full:?} vs {headline:?}");
        }
    }

    #[test]
    fn sentences_read_like_the_incident() {
        let said: Vec<(String, String)> = every_kind()
            .iter()
            .map(|k| (k.headline(), k.describe()))
            .collect();
        let pair = |h: &str, d: &str| (h.to_string(), d.to_string());
        assert_eq!(
            said[0],
            pair(
                "daemon restarted, resumed at step 1,200",
                "daemon restarted, resumed at step 1,200 (run qwen)"
            )
        );
        assert_eq!(said[1], pair("run qwen started", "run qwen started"));
        assert_eq!(said[2].1, "warmup done on cuda:0 (Drafter) in 1 min");
        assert_eq!(
            said[5],
            pair(
                "torch 2.11.0+cu128 → 2.9.1+cu130",
                "torch 2.11.0+cu128 → 2.9.1+cu130"
            )
        );
        assert_eq!(
            said[6],
            pair(
                "dflashd 0.0.1 → 0.0.2",
                "dflashd 0.0.1 → 0.0.2 (informational; resume not held)"
            )
        );
        assert_eq!(
            said[7],
            pair(
                "TorchInductor compile cache deleted",
                "TorchInductor compile cache deleted (was 2.1 GB, 418 entries) \
                 (/srv/cache/inductor)"
            )
        );
        assert_eq!(
            said[8],
            pair(
                "Triton kernel cache appeared",
                "Triton kernel cache appeared (/srv/cache/triton)"
            )
        );
        assert_eq!(
            said[9].1,
            "checkpoint at step 12,000, 2.1 GB (/srv/run/checkpoints/step-12000)"
        );
        assert_eq!(
            said[10].1,
            "resumed from step 1,000 instead of step 1,200 (--resume-from); the steps after it \
             are trained again"
        );
        assert_eq!(
            said[11],
            pair("GPU 0 memory volatile", "GPU 0 memory volatile: range 9 GB")
        );
        assert_eq!(said[13].1, "uid 1000 requested stop (pending act-1)");
        assert_eq!(
            said[14].1,
            "uid 1000 confirmed act-1 via run name (the client says tty)"
        );
        assert_eq!(
            said[15],
            pair(
                "operator action act-1: checkpointing, then stopping",
                "operator action act-1: checkpointing, then stopping"
            )
        );
        assert_eq!(
            said[16].1,
            "drafter worker 1 on cuda:6 failed: CUDA out of memory"
        );
        assert_eq!(said[17].1, "run paused: disk full");
        assert_eq!(said[18].1, "run stopped (operator); no checkpoint");
        assert_eq!(said[19].1, "skipped bad data line train.jsonl:7: not JSON");
        assert_eq!(
            said[21],
            pair(
                "best checkpoint: step 450",
                "best checkpoint: step 450, tree τ@32 4.45 (/srv/run/checkpoints/step-0000000450)"
            )
        );
    }

    /// The one home: what an alert says preceded it is the console's line for the same event,
    /// less its detail.
    #[test]
    fn an_alert_names_a_preceding_event_in_the_console_words() {
        let events: Vec<Event> = every_kind()
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                seq: i as u64,
                ts_ms: 1_000 + i as i64,
                severity: Severity::Warn,
                kind,
            })
            .collect();
        let alert_at = 10_000;
        // One event at a time: an alert keeps only its latest few precursors.
        let named: Vec<String> = events
            .iter()
            .flat_map(|e| explain_alert(alert_at, std::slice::from_ref(e), alert_at))
            .map(|p| {
                let event = events.iter().find(|e| e.ts_ms == p.ts_ms).unwrap();
                assert_eq!(p.text, event.kind.headline());
                assert!(event.kind.describe().starts_with(&p.text), "{p:?}");
                p.text
            })
            .collect();
        for wanted in [
            "daemon restarted, resumed at step 1,200",
            "torch 2.11.0+cu128 → 2.9.1+cu130",
            "dflashd 0.0.1 → 0.0.2",
            "TorchInductor compile cache deleted",
            "GPU 0 memory volatile",
            "operator action act-1: checkpointing, then stopping",
        ] {
            assert!(named.iter().any(|n| n == wanted), "{wanted}: {named:?}");
        }
    }

    #[test]
    fn failures_and_pauses_read_as_one_sentence() {
        assert_eq!(
            worker_failed_sentence(
                "cuda:6",
                Some(DeviceRole::Drafter),
                Some(1),
                "CUDA out of memory"
            ),
            "drafter worker 1 on cuda:6 failed: CUDA out of memory"
        );
        assert_eq!(
            worker_failed_sentence("cpu", None, None, "panicked"),
            "worker on cpu failed: panicked"
        );
        assert_eq!(run_paused_sentence("disk full"), "run paused: disk full");
        assert_eq!(
            worker_subject("cuda:3", Some(DeviceRole::Target), Some(1)),
            "target worker 1 on cuda:3"
        );
        assert_eq!(worker_subject("cpu", None, None), "worker on cpu");
    }
}
