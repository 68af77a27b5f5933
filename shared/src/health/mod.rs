//! Health detectors: pure state machines fed telemetry samples, emitting level transitions.
//!
//! Each detector owns its hysteresis (separate enter/exit thresholds plus minimum durations),
//! so a noisy but stable run never flaps. A [`Transition`] maps onto the journal's
//! `RegressionStarted` / `RegressionEnded` events through [`Transition::to_event_kind`].
pub mod cache;
pub mod explain;
pub mod fingerprint;
pub mod grouping;
pub mod healthy_record;
pub mod healthy_stretch;
pub mod memory;
mod monitor;
pub mod queue;
pub mod serve_gap;
mod stats;
pub mod straggler;
pub mod throughput;

use serde::{Deserialize, Serialize};

use crate::events::{EventKind, Severity};
use crate::metrics::TimestampMs;

pub use cache::{CacheChange, CacheChangeKind, CacheWatcher};
pub use explain::{explain_alert, render_precursors, throughput_headline, Precursor};
pub use fingerprint::{
    diff_fingerprints, drift_impact, DriftImpact, EnvironmentDrift, Fingerprint,
};
pub use memory::{MemoryConfig, MemoryFlatness, MemoryStats, MemoryVerdict};
pub use monitor::{Alert, DetectorsSection, HealthMonitor};
pub use queue::{QueueBound, QueueDiagnoser, QueueDiagnosis, QueueThresholds};
pub use serve_gap::{ServeGapConfig, ServeGapDetector, ServeGapReading};
pub use straggler::{StragglerConfig, StragglerDetector, STRAGGLER_DETECTOR};
pub use throughput::{ThroughputConfig, ThroughputDetector, ThroughputStatus};

/// How healthy one signal is. Ordered: `Ok < Warn < Crit`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    #[default]
    Ok,
    Warn,
    Crit,
}

impl Level {
    /// The journal severity of an event entering this level.
    pub fn severity(self) -> Severity {
        match self {
            Level::Ok => Severity::Info,
            Level::Warn => Severity::Warn,
            Level::Crit => Severity::Crit,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "Ok",
            Level::Warn => "Warn",
            Level::Crit => "Crit",
        }
    }
}

/// A detector changed level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// e.g. `throughput`, `memory:gpu3`, `queue`, `cache:triton`, `serve_gap`.
    pub detector: String,
    pub from: Level,
    pub to: Level,
    pub at_ms: TimestampMs,
    /// A sentence for people, with the numbers that decided it.
    pub message: String,
}

impl Transition {
    /// Entering (or moving between) Warn and Crit starts a regression; returning to Ok ends it.
    pub fn to_event_kind(&self) -> EventKind {
        if self.to == Level::Ok {
            EventKind::RegressionEnded {
                detector: self.detector.clone(),
                message: self.message.clone(),
            }
        } else {
            EventKind::RegressionStarted {
                detector: self.detector.clone(),
                level: self.to.severity(),
                message: self.message.clone(),
            }
        }
    }

    pub fn severity(&self) -> Severity {
        self.to.severity()
    }
}

/// "Condition has held since": the building block of minimum durations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HeldSince(Option<TimestampMs>);

impl HeldSince {
    pub(crate) fn update(&mut self, condition: bool, ts_ms: TimestampMs) {
        self.0 = match (condition, self.0) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(ts_ms),
            (false, _) => None,
        };
    }

    pub(crate) fn held_for(&self, ts_ms: TimestampMs, duration_ms: i64) -> bool {
        self.0.is_some_and(|since| ts_ms - since >= duration_ms)
    }

    pub(crate) fn since(&self) -> Option<TimestampMs> {
        self.0
    }

    pub(crate) fn reset(&mut self) {
        self.0 = None;
    }
}

pub(crate) fn secs_to_ms(s: f64) -> i64 {
    (s * 1000.0).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_map_to_regression_events() {
        let t = Transition {
            detector: "throughput".into(),
            from: Level::Ok,
            to: Level::Crit,
            at_ms: 5,
            message: "collapse".into(),
        };
        assert_eq!(
            t.to_event_kind(),
            EventKind::RegressionStarted {
                detector: "throughput".into(),
                level: Severity::Crit,
                message: "collapse".into()
            }
        );
        let ended = Transition {
            from: Level::Crit,
            to: Level::Ok,
            ..t
        };
        assert!(matches!(
            ended.to_event_kind(),
            EventKind::RegressionEnded { .. }
        ));
        assert_eq!(ended.severity(), Severity::Info);
    }

    #[test]
    fn held_since_measures_continuous_truth() {
        let mut h = HeldSince::default();
        h.update(true, 100);
        h.update(true, 150);
        assert!(h.held_for(150, 50));
        assert!(!h.held_for(150, 51));
        h.update(false, 160);
        h.update(true, 170);
        assert_eq!(h.since(), Some(170));
    }
}
