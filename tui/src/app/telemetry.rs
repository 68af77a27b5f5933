//! Telemetry history: throughput, loss and τ curves, per-GPU memory, queue depth.
use std::collections::BTreeMap;

use dflash_shared::metrics::{GpuSample, GpuTelemetry, QueueStats, StepMetrics, TimestampMs};

use super::history::Series;
use super::judge::{self, MemoryVerdict, QueueBound};

/// Charts keep this much history.
pub const RETENTION_MS: i64 = 6 * 60 * 60 * 1000;
const CAPACITY: usize = 20_000;

fn series() -> Series {
    Series::new(CAPACITY, RETENTION_MS)
}

#[derive(Debug, Clone)]
pub struct GpuHistory {
    pub latest: GpuSample,
    pub memory_used: Series,
    pub allocator_reserved: Series,
    pub allocator_allocated: Series,
}

impl GpuHistory {
    fn new(sample: &GpuSample) -> Self {
        Self {
            latest: sample.clone(),
            memory_used: series(),
            allocator_reserved: series(),
            allocator_allocated: series(),
        }
    }

    pub fn verdict(&self, now_ms: TimestampMs) -> MemoryVerdict {
        judge::memory_verdict(&self.memory_used, now_ms, self.latest.memory_total_bytes)
    }
}

#[derive(Debug, Clone)]
pub struct Telemetry {
    pub last_metrics: Option<StepMetrics>,
    pub tokens_per_s: Series,
    /// The step number over time, for the step rate behind the ETA.
    pub steps: Series,
    pub loss: Series,
    pub tau: Series,
    /// Set when the daemon reports no GPU telemetry, with its reason.
    pub gpu_unavailable: Option<String>,
    pub gpus: BTreeMap<u32, GpuHistory>,
    pub queue: Option<QueueStats>,
    previous_queue: Option<QueueStats>,
    pub queue_depth: Series,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            last_metrics: None,
            tokens_per_s: series(),
            steps: series(),
            loss: series(),
            tau: series(),
            gpu_unavailable: None,
            gpus: BTreeMap::new(),
            queue: None,
            previous_queue: None,
            queue_depth: series(),
        }
    }
}

impl Telemetry {
    pub fn apply_metrics(&mut self, metrics: &StepMetrics) {
        self.tokens_per_s.push(metrics.ts_ms, metrics.tokens_per_s);
        self.steps.push(metrics.ts_ms, metrics.step as f64);
        self.loss.push(metrics.ts_ms, metrics.loss);
        if let Some(tau) = metrics.tau {
            self.tau.push(metrics.ts_ms, tau);
        }
        let newer = self
            .last_metrics
            .as_ref()
            .is_none_or(|m| metrics.ts_ms >= m.ts_ms);
        if newer {
            self.last_metrics = Some(metrics.clone());
        }
    }

    pub fn apply_gpus(&mut self, telemetry: &GpuTelemetry) {
        match telemetry {
            GpuTelemetry::Unavailable { reason } => self.gpu_unavailable = Some(reason.clone()),
            GpuTelemetry::Available { gpus } => {
                self.gpu_unavailable = None;
                for sample in gpus {
                    let history = self
                        .gpus
                        .entry(sample.index)
                        .or_insert_with(|| GpuHistory::new(sample));
                    if sample.ts_ms < history.latest.ts_ms {
                        continue;
                    }
                    if let Some(used) = sample.memory_used_bytes {
                        history.memory_used.push(sample.ts_ms, used as f64);
                    }
                    if let Some(alloc) = &sample.allocator {
                        history
                            .allocator_reserved
                            .push(sample.ts_ms, alloc.reserved_bytes as f64);
                        history
                            .allocator_allocated
                            .push(sample.ts_ms, alloc.allocated_bytes as f64);
                    }
                    history.latest = sample.clone();
                }
            }
        }
    }

    pub fn apply_queue(&mut self, stats: &QueueStats) {
        if self.queue.as_ref().is_some_and(|q| stats.ts_ms <= q.ts_ms) {
            return;
        }
        self.previous_queue = self.queue.take();
        self.queue_depth.push(stats.ts_ms, stats.depth as f64);
        self.queue = Some(stats.clone());
    }

    pub fn queue_bound(&self) -> QueueBound {
        match &self.queue {
            Some(current) => judge::queue_bound(self.previous_queue.as_ref(), current),
            None => QueueBound::Unknown,
        }
    }

    /// Steps per millisecond over the trailing `window_ms` of metrics.
    pub fn step_rate_per_ms(&self, window_ms: i64) -> Option<f64> {
        let (last_ts, last_step) = self.steps.last()?;
        let &(first_ts, first_step) = self.steps.since(last_ts - window_ms).next()?;
        let span = (last_ts - first_ts) as f64;
        (span > 0.0 && last_step > first_step).then(|| (last_step - first_step) / span)
    }

    /// GPUs whose memory is volatile now.
    pub fn volatile_gpus(&self, now_ms: TimestampMs) -> Vec<u32> {
        self.gpus
            .iter()
            .filter(|(_, h)| matches!(h.verdict(now_ms), MemoryVerdict::Volatile { .. }))
            .map(|(i, _)| *i)
            .collect()
    }
}
