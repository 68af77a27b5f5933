//! The daemon's state as one snapshot: what `status` queries return and consoles render.
use serde::{Deserialize, Serialize};

use crate::actions::PendingAction;
use crate::events::Severity;
use crate::metrics::{CacheState, GpuTelemetry, HostSample, QueueStats, TimestampMs};

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
    pub baseline_tokens_per_s: Option<f64>,
    /// Since when the current level has held, if stable.
    pub stable_since_ms: Option<TimestampMs>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub detector: String,
    pub level: Severity,
    pub since_ms: TimestampMs,
    pub message: String,
    /// Journal lines just before the alert began, already worded for people.
    pub preceded_by: Vec<String>,
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
}
