//! The journal as a timeline of changes, by category: what the status report calls Critical
//! Context, and the operator decisions it calls Key Decisions.
use dflash_shared::events::{Event, EventKind};
use serde::Serialize;

use crate::app::wording;
use crate::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Environment,
    Caches,
    Restarts,
    Throughput,
    Memory,
    Queue,
    Failures,
    Operator,
}

impl Category {
    pub fn word(self) -> &'static str {
        match self {
            Category::Environment => "environment",
            Category::Caches => "caches",
            Category::Restarts => "restarts",
            Category::Throughput => "throughput",
            Category::Memory => "memory",
            Category::Queue => "queue",
            Category::Failures => "failures",
            Category::Operator => "operator",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub seq: u64,
    pub ts_ms: i64,
    /// RFC 3339, UTC.
    pub at: String,
    pub category: Category,
    pub text: String,
}

/// The category of a change worth a line in the timeline; routine events have none.
pub fn category(kind: &EventKind) -> Option<Category> {
    Some(match kind {
        EventKind::Fingerprint { .. }
        | EventKind::EnvironmentDrift { .. }
        | EventKind::EnvironmentChanged { .. } => Category::Environment,
        EventKind::CacheChanged { .. } => Category::Caches,
        EventKind::RunStarted { .. }
        | EventKind::RunStopped { .. }
        | EventKind::RunPaused { .. }
        | EventKind::CheckpointFallback { .. } => Category::Restarts,
        EventKind::RegressionStarted { detector, .. }
        | EventKind::RegressionEnded { detector, .. } => detector_category(detector),
        EventKind::WorkerFailed { .. } => Category::Failures,
        EventKind::OperatorRequest { .. }
        | EventKind::OperatorConfirmed { .. }
        | EventKind::ActionExecuted { .. } => Category::Operator,
        EventKind::WarmupDone { .. }
        | EventKind::AttentionKernel { .. }
        | EventKind::CheckpointWritten { .. }
        | EventKind::BadDataLine { .. }
        | EventKind::Note { .. } => return None,
    })
}

/// Detectors are named `throughput`, `memory:gpu3`, `queue`, `cache:triton` (shared health).
fn detector_category(detector: &str) -> Category {
    match detector.split(':').next().unwrap_or(detector) {
        "memory" => Category::Memory,
        "queue" => Category::Queue,
        "cache" => Category::Caches,
        "fingerprint" | "environment" => Category::Environment,
        _ => Category::Throughput,
    }
}

fn entry(event: &Event, category: Category) -> Entry {
    Entry {
        seq: event.seq,
        ts_ms: event.ts_ms,
        at: fmt::rfc3339(event.ts_ms),
        category,
        text: wording::describe(&event.kind),
    }
}

/// Changes (everything but operator actions), oldest first.
pub fn changes(events: &[Event]) -> Vec<Entry> {
    events
        .iter()
        .filter_map(|e| category(&e.kind).map(|c| (e, c)))
        .filter(|(_, c)| *c != Category::Operator)
        .map(|(e, c)| entry(e, c))
        .collect()
}

/// Operator requests, confirmations and executed actions, oldest first.
pub fn decisions(events: &[Event]) -> Vec<Entry> {
    events
        .iter()
        .filter(|e| category(&e.kind) == Some(Category::Operator))
        .map(|e| entry(e, Category::Operator))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::events::Severity;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            ts_ms: seq as i64 * 60_000,
            severity: Severity::Info,
            kind,
        }
    }

    #[test]
    fn changes_and_decisions_split_the_journal() {
        let events = vec![
            event(
                1,
                EventKind::RunStarted {
                    run_name: "r".into(),
                    resumed_from_step: None,
                },
            ),
            event(
                2,
                EventKind::CheckpointWritten {
                    step: 5,
                    path: "/c".into(),
                    bytes: 1,
                },
            ),
            event(
                3,
                EventKind::EnvironmentDrift {
                    field: "torch".into(),
                    before: "a".into(),
                    after: "b".into(),
                },
            ),
            event(
                4,
                EventKind::OperatorConfirmed {
                    uid: 1000,
                    action_id: "act-1".into(),
                    via: "token".into(),
                    client_says: None,
                },
            ),
        ];
        let changes = changes(&events);
        assert_eq!(
            changes.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(changes[1].category, Category::Environment);
        assert_eq!(changes[1].text, "torch a → b");
        let decisions = decisions(&events);
        assert_eq!(decisions.len(), 1);
        assert_eq!(decisions[0].text, "uid 1000 confirmed act-1 via token");
    }
}
