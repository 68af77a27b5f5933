//! The journal as a timeline of changes, by category: what the status report calls Critical
//! Context, and the operator decisions it calls Key Decisions.
use dflash_shared::events::{Event, EventKind};
use serde::Serialize;

use crate::app::wording;
use crate::fmt::{self, DisplayClock};

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
        | EventKind::BestCheckpoint { .. }
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

/// Changes (everything but operator actions), oldest first. A cache deletion says whose it
/// was: a confirmed delete action's, or "deleted outside dflash; no confirmation on record".
pub fn changes(events: &[Event]) -> Vec<Entry> {
    events
        .iter()
        .filter_map(|e| category(&e.kind).map(|c| (e, c)))
        .filter(|(_, c)| *c != Category::Operator)
        .map(|(e, c)| {
            let mut entry = entry(e, c);
            if let Some(origin) = deletion_origin(events, e) {
                entry.text = format!("{}; {}", entry.text, origin.words());
            }
            entry
        })
        .collect()
}

/// The action ids the journal records a confirmation of.
fn confirmed_ids(events: &[Event]) -> std::collections::BTreeSet<&str> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::OperatorConfirmed { action_id, .. } => Some(action_id.as_str()),
            _ => None,
        })
        .collect()
}

/// Operator decisions, oldest first: confirmations, executed actions, and the filings that
/// were confirmed. A request nobody confirmed decided nothing ([`unconfirmed_requests`] lists
/// those).
pub fn decisions(events: &[Event]) -> Vec<Entry> {
    let confirmed = confirmed_ids(events);
    events
        .iter()
        .filter(|e| match &e.kind {
            EventKind::OperatorConfirmed { .. } | EventKind::ActionExecuted { .. } => true,
            EventKind::OperatorRequest {
                action_id: Some(id),
                ..
            } => confirmed.contains(id.as_str()),
            _ => false,
        })
        .map(|e| entry(e, Category::Operator))
        .collect()
}

/// The cache a delete filing names: "Delete the torchinductor cache (filed, awaiting
/// confirmation)" (`Action::title`, as the daemon journals it) → "torchinductor".
pub fn delete_request_cache(request: &str) -> Option<&str> {
    request
        .strip_prefix("Delete the ")?
        .split_once(" cache")
        .map(|(name, _)| name)
}

/// Filings and requests that never became a decision, oldest first: "delete of the
/// TorchInductor compile cache requested at 21:00, never confirmed", with "(cancelled at
/// 21:01)" or "(expired)" where the journal says so, and refused requests as refused.
pub fn unconfirmed_requests(events: &[Event], clock: DisplayClock) -> Vec<String> {
    let confirmed = confirmed_ids(events);
    let withdrawn = |id: &str| {
        events.iter().find_map(|e| match &e.kind {
            EventKind::OperatorRequest { request, .. }
                if request.starts_with(&format!("cancel {id} ")) =>
            {
                Some(format!(" (cancelled at {})", clock.hm(e.ts_ms)))
            }
            EventKind::Note { message }
                if message.starts_with(&format!("pending action {id} "))
                    && message.ends_with("expired unconfirmed") =>
            {
                Some(format!(" (expired at {})", clock.hm(e.ts_ms)))
            }
            _ => None,
        })
    };
    events
        .iter()
        .filter_map(|e| {
            let EventKind::OperatorRequest {
                uid,
                request,
                action_id,
            } = &e.kind
            else {
                return None;
            };
            let at = clock.hm(e.ts_ms);
            match action_id {
                Some(id) if confirmed.contains(id.as_str()) => None,
                Some(id) => {
                    let what = match delete_request_cache(request) {
                        Some(name) => format!("delete of the {}", wording::cache_label(name)),
                        None => request
                            .split(" (filed")
                            .next()
                            .unwrap_or(request)
                            .to_string(),
                    };
                    Some(format!(
                        "{what} ({id}) requested by uid {uid} at {at}, never confirmed{}",
                        withdrawn(id).unwrap_or_default()
                    ))
                }
                // Cancel lines are folded into the filing they withdraw.
                None if request.starts_with("cancel ") => None,
                None => Some(format!("uid {uid} at {at}: {request}")),
            }
        })
        .collect()
}

/// Who deleted a cache whose deletion the journal records.
#[derive(Debug, Clone, PartialEq)]
pub enum DeletionOrigin {
    /// A confirmed delete action (its id).
    Confirmed(String),
    /// No confirmed delete of that cache on record before it went.
    Outside,
}

impl DeletionOrigin {
    pub fn words(&self) -> String {
        match self {
            DeletionOrigin::Confirmed(id) => format!("by the confirmed action {id}"),
            DeletionOrigin::Outside => "deleted outside dflash; no confirmation on record".into(),
        }
    }
}

/// For a `CacheChanged` deletion: whether a confirmed delete action of that cache came
/// before it (the daemon's own deletion reads "deleted by operator"). `None` for any other
/// event.
pub fn deletion_origin(events: &[Event], event: &Event) -> Option<DeletionOrigin> {
    let EventKind::CacheChanged { name, change, .. } = &event.kind else {
        return None;
    };
    if !change.starts_with("deleted") {
        return None;
    }
    let confirmed = confirmed_ids(events);
    let action = events
        .iter()
        .rev()
        .filter(|e| e.seq < event.seq)
        .filter_map(|e| match &e.kind {
            EventKind::OperatorRequest {
                request,
                action_id: Some(id),
                ..
            } if delete_request_cache(request) == Some(name.as_str())
                && confirmed.contains(id.as_str()) =>
            {
                Some(id.clone())
            }
            _ => None,
        })
        .next();
    Some(match action {
        Some(id) => DeletionOrigin::Confirmed(id),
        None if change.starts_with("deleted by operator") => {
            DeletionOrigin::Confirmed("(its id not in this journal window)".into())
        }
        None => DeletionOrigin::Outside,
    })
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
