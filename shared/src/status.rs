//! The daemon's state as one snapshot: what `status` queries return and consoles render.
use serde::{Deserialize, Serialize};

use crate::actions::PendingAction;
use crate::config::DetectorsSection;
use crate::events::Severity;
use crate::health::healthy_record::HealthyRecord;
use crate::metrics::{
    CacheState, GpuTelemetry, HostSample, OnlineAcceptance, QueueStats, TimestampMs,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Starting,
    WarmingUp,
    Training,
    Evaluating,
    Checkpointing,
    Paused,
    Stopping,
    Finished,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub name: String,
    pub state: RunState,
    pub step: u64,
    pub total_steps: u64,
    /// The epoch in progress, counted from 1 (0 before the run has a trainer).
    pub epoch: u32,
    pub epochs: u32,
    pub started_ms: TimestampMs,
    pub eta_ms: Option<TimestampMs>,
    pub run_dir: String,
    pub config_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub tokens_per_s: f64,
    /// Draft positions (kept anchors × block size) per second, the latest step's.
    #[serde(default)]
    pub draft_positions_per_s: f64,
    /// The latest step's model FLOPs utilisation, where every device's peak is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    pub baseline_tokens_per_s: Option<f64>,
    /// Since when the current level has held, if stable.
    pub stable_since_ms: Option<TimestampMs>,
    /// Where the baseline came from when this daemon did not learn it itself: the healthy
    /// record ("this recipe ran at 21.5K tok/s here on …") or the config's pinned figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub detector: String,
    pub level: Severity,
    pub since_ms: TimestampMs,
    pub message: String,
    /// Journal lines just before the alert began, already worded for people.
    pub preceded_by: Vec<String>,
    /// What differs between the run's healthy record and now (environment, caches, restarts,
    /// worker failures since), worded for people; empty without a record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub since_healthy: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub step: u64,
    pub path: String,
    pub written_ms: TimestampMs,
    pub bytes: u64,
}

/// Everything a console needs to draw one frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusSnapshot {
    pub run: RunInfo,
    pub throughput: Throughput,
    pub gpus: GpuTelemetry,
    pub host: Option<HostSample>,
    pub queue: QueueStats,
    pub caches: Vec<CacheState>,
    pub alerts: Vec<Alert>,
    pub pending_actions: Vec<PendingAction>,
    pub checkpoints: Vec<CheckpointInfo>,
    pub last_loss: Option<f64>,
    pub last_tau: Option<f64>,
    /// The newest online evaluation (speculative decoding against the target) and the step it
    /// ran at; absent before the first, and from a daemon that does not run them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online: Option<OnlineEvalStatus>,
    /// The thresholds the daemon's health detectors judge this run by: the run's effective
    /// `[detectors]` section. A console judges memory flatness and the queue with these, never
    /// with defaults of its own. `None` until the daemon's detectors run, and from a daemon
    /// that does not send them (or sends them in a shape this build cannot read).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub detectors: Option<DetectorsSection>,
    /// The healthy record this run is judged against (its own, or the last of its recipe on
    /// this machine), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_record: Option<Box<HealthyRecord>>,
}

/// An online evaluation and when it ran: the figures of its metrics line, flat, beside the
/// line's `step` and `ts_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnlineEvalStatus {
    pub step: u64,
    pub ts_ms: TimestampMs,
    #[serde(flatten)]
    pub acceptance: OnlineAcceptance,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::QueueStats;

    fn snapshot() -> StatusSnapshot {
        StatusSnapshot {
            run: RunInfo {
                name: "r".into(),
                state: RunState::Training,
                step: 1,
                total_steps: 2,
                epoch: 1,
                epochs: 6,
                started_ms: 0,
                eta_ms: None,
                run_dir: "/runs/r".into(),
                config_path: None,
            },
            throughput: Throughput {
                tokens_per_s: 1.0,
                draft_positions_per_s: 0.0,
                mfu: None,
                baseline_tokens_per_s: None,
                stable_since_ms: None,
                baseline_source: None,
            },
            gpus: GpuTelemetry::Unavailable {
                reason: "no NVML".into(),
            },
            host: None,
            queue: QueueStats::default(),
            caches: Vec::new(),
            alerts: Vec::new(),
            pending_actions: Vec::new(),
            checkpoints: Vec::new(),
            last_loss: None,
            last_tau: None,
            last_online: None,
            detectors: None,
            healthy_record: None,
        }
    }

    #[test]
    fn the_detector_thresholds_travel_and_a_frame_without_them_still_reads() {
        let mut tuned = snapshot();
        let mut detectors = DetectorsSection::default();
        detectors.memory.max_range_frac = 0.07;
        detectors.queue.starved_frac = 0.3;
        tuned.detectors = Some(detectors);
        let text = serde_json::to_string(&tuned).unwrap();
        assert_eq!(
            serde_json::from_str::<StatusSnapshot>(&text).unwrap(),
            tuned
        );

        // An older daemon's snapshot has no `detectors` key; this one writes none either.
        let old = serde_json::to_value(snapshot()).unwrap();
        assert!(old.get("detectors").is_none(), "{old}");
        let read: StatusSnapshot = serde_json::from_value(old).unwrap();
        assert_eq!(read.detectors, None);
    }

    #[test]
    fn the_last_online_evaluation_travels_flat_and_an_older_frame_has_none() {
        let mut s = snapshot();
        s.last_online = Some(OnlineEvalStatus {
            step: 50,
            ts_ms: 7,
            acceptance: OnlineAcceptance {
                tau_chain: 2.5,
                tau_ddtree: [(16, 3.0)].into_iter().collect(),
                offline_tau: Some(3.1),
                prompts: 8,
                seconds: 0.8,
            },
        });
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(value["last_online"]["online_tau_ddtree_16"], 3.0);
        assert_eq!(value["last_online"]["step"], 50);
        assert_eq!(serde_json::from_value::<StatusSnapshot>(value).unwrap(), s);
        let old = serde_json::to_value(snapshot()).unwrap();
        assert!(old.get("last_online").is_none(), "{old}");
    }

    #[test]
    fn thresholds_in_a_shape_this_build_does_not_know_read_as_none_not_as_a_lost_frame() {
        let mut value = serde_json::to_value(snapshot()).unwrap();
        let mut detectors = serde_json::to_value(DetectorsSection::default()).unwrap();
        detectors["memory"]["max_range_frac_per_role"] = serde_json::json!(0.01);
        value["detectors"] = detectors;
        let read: StatusSnapshot = serde_json::from_value(value).unwrap();
        assert_eq!(read.detectors, None);
        assert_eq!(read.run.name, "r");
    }
}
