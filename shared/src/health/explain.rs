//! "What changed just before": the journal events that preceded an alert, worded for people.
//!
//! `explain_alert` picks the events of kinds that change how a run behaves (environment drift
//! and informational changes such as a new code commit,
//! cache changes, restarts, worker failures, executed actions, earlier regressions) from the
//! `window_ms` before the alert began, oldest first, each by its headline
//! ([`EventKind::headline`], `events/wording.rs`: the words the console's line for the same
//! event begins with). Rendering adds wall-clock times in the
//! caller's UTC offset: "torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52; TorchInductor compile cache
//! deleted at 21:00".
use chrono::FixedOffset;
use serde::{Deserialize, Serialize};

use super::Level;
use crate::events::{Event, EventKind, Severity};
use crate::format::{format_clock, format_tokens_per_s};
use crate::metrics::TimestampMs;

/// At most this many precursors are kept (the most recent ones): an alert line must stay short.
pub const MAX_PRECURSORS: usize = 6;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Precursor {
    pub ts_ms: TimestampMs,
    /// The sentence without its time, e.g. "TorchInductor compile cache deleted".
    pub text: String,
}

impl Precursor {
    /// "TorchInductor compile cache deleted at 21:00".
    pub fn sentence(&self, offset: FixedOffset) -> String {
        format!("{} at {}", self.text, format_clock(self.ts_ms, offset))
    }
}

/// The events in `[alert_since_ms - window_ms, alert_since_ms]` that explain an alert.
///
/// Regression events count only when strictly earlier than the alert, so the alert does not
/// explain itself.
pub fn explain_alert(
    alert_since_ms: TimestampMs,
    events: &[Event],
    window_ms: i64,
) -> Vec<Precursor> {
    let from = alert_since_ms - window_ms;
    let mut out: Vec<Precursor> = events
        .iter()
        .filter(|e| e.ts_ms >= from && e.ts_ms <= alert_since_ms)
        .filter_map(|e| {
            let is_regression = matches!(e.kind, EventKind::RegressionStarted { .. });
            if is_regression && e.ts_ms >= alert_since_ms {
                return None;
            }
            precursor_text(e).map(|text| Precursor {
                ts_ms: e.ts_ms,
                text,
            })
        })
        .collect();
    out.sort_by_key(|p| p.ts_ms);
    if out.len() > MAX_PRECURSORS {
        out.drain(..out.len() - MAX_PRECURSORS);
    }
    out
}

/// The event's headline (`events/wording.rs`, the words the console's line for it begins with)
/// when its kind explains an alert.
fn precursor_text(event: &Event) -> Option<String> {
    let explains = match &event.kind {
        // A new build preceding a regression is as telling as a swapped library.
        EventKind::EnvironmentDrift { .. }
        | EventKind::EnvironmentChanged { .. }
        | EventKind::CacheChanged { .. }
        | EventKind::RunStarted { .. }
        | EventKind::WorkerFailed { .. }
        | EventKind::RunPaused { .. }
        | EventKind::ActionExecuted { .. } => true,
        // Cache detectors repeat what their `CacheChanged` event already says.
        EventKind::RegressionStarted { detector, .. } if detector.starts_with("cache:") => false,
        // The headline of another detector's alert: "GPU 0 memory volatile".
        EventKind::RegressionStarted { level, .. } => *level >= Severity::Warn,
        _ => false,
    };
    // The headline drops the detail (a cache's "(was …)", a path): the alert line must stay
    // short.
    explains.then(|| event.kind.headline())
}

/// "Before it: a at 20:52; b at 21:00." or `None` when nothing preceded the alert.
pub fn render_precursors(precursors: &[Precursor], offset: FixedOffset) -> Option<String> {
    if precursors.is_empty() {
        return None;
    }
    let parts: Vec<String> = precursors.iter().map(|p| p.sentence(offset)).collect();
    Some(format!("Before it: {}.", parts.join("; ")))
}

/// "4.3K tok/s, Crit since 21:03 (baseline 21.5K)".
pub fn throughput_headline(
    tokens_per_s: f64,
    level: Level,
    since_ms: Option<TimestampMs>,
    baseline_tokens_per_s: Option<f64>,
    offset: FixedOffset,
) -> String {
    let mut s = format!("{} tok/s", format_tokens_per_s(tokens_per_s));
    if level != Level::Ok {
        s.push_str(&format!(", {}", level.label()));
        if let Some(since) = since_ms {
            s.push_str(&format!(" since {}", format_clock(since, offset)));
        }
    }
    if let Some(b) = baseline_tokens_per_s {
        s.push_str(&format!(" (baseline {})", format_tokens_per_s(b)));
    }
    s
}
