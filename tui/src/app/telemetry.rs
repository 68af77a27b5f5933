//! Telemetry history: throughput, loss and τ curves, per-GPU memory, queue depth. The memory
//! and queue verdicts come from the shared detectors the daemon also runs.
use std::collections::BTreeMap;

use dflash_shared::health::{
    MemoryConfig, MemoryFlatness, MemoryVerdict, QueueDiagnoser, QueueDiagnosis, QueueThresholds,
};
use dflash_shared::metrics::{DeviceRole, GpuSample, GpuTelemetry, QueueStats, StepMetrics};

use super::history::Series;

/// Charts keep this much history.
pub const RETENTION_MS: i64 = 6 * 60 * 60 * 1000;
const CAPACITY: usize = 20_000;

fn series() -> Series {
    Series::new(CAPACITY, RETENTION_MS)
}

/// The console judges memory over the detector's window from the first sample it sees; the
/// daemon already skips the run's own warmup before it streams, so no second warmup here.
pub fn console_memory_config() -> MemoryConfig {
    MemoryConfig {
        warmup_s: 0.0,
        ..MemoryConfig::default()
    }
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
    memory: MemoryFlatness,
    pub queue: Option<QueueStats>,
    pub queue_depth: Series,
    queue_diagnoser: QueueDiagnoser,
    /// (target workers, drafter workers) the diagnoser was built for.
    queue_workers: (usize, usize),
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
            memory: MemoryFlatness::new(console_memory_config()),
            queue: None,
            queue_depth: series(),
            queue_diagnoser: QueueDiagnoser::new(QueueThresholds::default(), 1, 1),
            queue_workers: (1, 1),
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
                    self.apply_gpu(sample);
                }
            }
        }
    }

    fn apply_gpu(&mut self, sample: &GpuSample) {
        let history = self
            .gpus
            .entry(sample.index)
            .or_insert_with(|| GpuHistory::new(sample));
        if sample.ts_ms < history.latest.ts_ms {
            return;
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
        // The console shows the verdict; the daemon journals the transitions.
        let _ = self.memory.observe(sample);
    }

    pub fn memory_verdict(&self, gpu_index: u32) -> MemoryVerdict {
        self.memory.verdict(gpu_index)
    }

    /// GPUs whose memory is volatile now.
    pub fn volatile_gpus(&self) -> Vec<u32> {
        self.gpus
            .keys()
            .copied()
            .filter(|i| matches!(self.memory.verdict(*i), MemoryVerdict::Volatile { .. }))
            .collect()
    }

    pub fn apply_queue(&mut self, stats: &QueueStats) {
        if self.queue.as_ref().is_some_and(|q| stats.ts_ms <= q.ts_ms) {
            return;
        }
        let workers = self.worker_counts();
        if workers != self.queue_workers {
            self.queue_workers = workers;
            self.queue_diagnoser =
                QueueDiagnoser::new(QueueThresholds::default(), workers.0, workers.1);
        }
        let _ = self.queue_diagnoser.observe(stats);
        self.queue_depth.push(stats.ts_ms, stats.depth as f64);
        self.queue = Some(stats.clone());
    }

    /// `None` until two queue samples span some time.
    pub fn queue_diagnosis(&self) -> Option<QueueDiagnosis> {
        self.queue_diagnoser.diagnosis()
    }

    /// (target workers, drafter workers), from the per-worker throughput or the GPU roles.
    fn worker_counts(&self) -> (usize, usize) {
        let count = |roles: &mut dyn Iterator<Item = DeviceRole>| {
            roles.fold((0, 0), |(t, d), role| match role {
                DeviceRole::Target => (t + 1, d),
                DeviceRole::Drafter => (t, d + 1),
                DeviceRole::Both => (t + 1, d + 1),
                DeviceRole::Idle => (t, d),
            })
        };
        let from_workers = self
            .last_metrics
            .as_ref()
            .map(|m| count(&mut m.workers.iter().map(|w| w.role)))
            .unwrap_or((0, 0));
        let (t, d) = if from_workers != (0, 0) {
            from_workers
        } else {
            count(&mut self.gpus.values().map(|g| g.latest.role))
        };
        (t.max(1), d.max(1))
    }

    /// Steps per millisecond over the trailing `window_ms` of metrics.
    pub fn step_rate_per_ms(&self, window_ms: i64) -> Option<f64> {
        let (last_ts, last_step) = self.steps.last()?;
        let &(first_ts, first_step) = self.steps.since(last_ts - window_ms).next()?;
        let span = (last_ts - first_ts) as f64;
        (span > 0.0 && last_step > first_step).then(|| (last_step - first_step) / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn gpu(ts_s: i64, used: u64) -> GpuSample {
        GpuSample {
            ts_ms: ts_s * 1000,
            index: 2,
            name: "NVIDIA H200".into(),
            role: DeviceRole::Drafter,
            memory_used_bytes: Some(used),
            memory_total_bytes: Some(141 * GB),
            utilization_pct: Some(97),
            power_w: Some(600.0),
            temperature_c: Some(70),
            allocator: None,
        }
    }

    #[test]
    fn flat_then_volatile_memory_is_judged_per_gpu_and_charted() {
        let mut telemetry = Telemetry::default();
        for i in 0..30 {
            telemetry.apply_gpus(&GpuTelemetry::Available {
                gpus: vec![gpu(i * 15, 70 * GB)],
            });
        }
        assert!(matches!(
            telemetry.memory_verdict(2),
            MemoryVerdict::Flat { .. }
        ));
        assert!(telemetry.volatile_gpus().is_empty());
        for i in 30..60 {
            let swing = if i % 2 == 0 { 58 } else { 79 };
            telemetry.apply_gpus(&GpuTelemetry::Available {
                gpus: vec![gpu(i * 15, swing * GB)],
            });
        }
        assert_eq!(telemetry.volatile_gpus(), vec![2]);
        assert_eq!(telemetry.gpus[&2].memory_used.len(), 60);
    }

    #[test]
    fn unavailable_gpu_telemetry_keeps_its_reason() {
        let mut telemetry = Telemetry::default();
        telemetry.apply_gpus(&GpuTelemetry::Unavailable {
            reason: "NVML unavailable: libnvidia-ml.so.1 not found".into(),
        });
        assert_eq!(
            telemetry.gpu_unavailable.as_deref(),
            Some("NVML unavailable: libnvidia-ml.so.1 not found")
        );
    }

    #[test]
    fn the_step_rate_comes_from_the_step_counter_not_the_sample_count() {
        let mut telemetry = Telemetry::default();
        for i in 0..5_u64 {
            telemetry.steps.push(i as i64 * 10_000, (i * 50) as f64);
        }
        let rate = telemetry.step_rate_per_ms(60_000).unwrap();
        assert!((rate - 0.005).abs() < 1e-12, "{rate}");
    }
}
