//! Telemetry history: throughput, loss and τ curves, per-GPU memory, queue depth. The memory
//! and queue verdicts come from the shared detectors the daemon also runs, with the thresholds
//! the daemon judges this run by (its status snapshot carries them); until those have arrived
//! the console gives no verdict rather than one of its own.
use std::collections::BTreeMap;

use dflash_shared::config::DetectorsSection;
use dflash_shared::health::{
    Level, MemoryConfig, MemoryFlatness, MemoryVerdict, QueueDiagnoser, QueueDiagnosis, Transition,
};
use dflash_shared::metrics::{
    DeviceRole, GpuSample, GpuTelemetry, QueueStats, StepMetrics, TimestampMs, TreeOracleTau,
};

use dflash_shared::status::{Alert, OnlineEvalStatus};

use super::history::Series;

/// Charts keep this much history.
pub const RETENTION_MS: i64 = 6 * 60 * 60 * 1000;
const CAPACITY: usize = 20_000;

fn series() -> Series {
    Series::new(CAPACITY, RETENTION_MS)
}

/// What the console can say about a signal it judges with the daemon's thresholds.
#[derive(Debug, Clone, PartialEq)]
pub enum Judged<T> {
    /// No status snapshot with the run's `[detectors]` thresholds yet (the daemon's detectors
    /// have not started, or the daemon does not send them): no verdict.
    AwaitingThresholds,
    Verdict(T),
}

/// What the views say where a verdict would be while [`Judged::AwaitingThresholds`].
pub const AWAITING_THRESHOLDS: &str = "waiting for the daemon's thresholds";

/// The detectors the console judges with, built from the daemon's thresholds.
#[derive(Debug, Clone)]
struct Judges {
    thresholds: DetectorsSection,
    run_started_ms: TimestampMs,
    /// The daemon does not judge memory during the run's warmup (`detectors.memory.warmup_s`);
    /// the console, which may attach at any time, counts that warmup from the run's start and
    /// feeds its detector only the samples after it.
    memory_from_ms: TimestampMs,
    memory: MemoryFlatness,
    queue: QueueDiagnoser,
    /// (target workers, drafter workers) the diagnoser was built for.
    queue_workers: (usize, usize),
    /// The console's own verdicts that are not Ok, by detector (`memory:gpuN`, `queue`), from
    /// the transitions of the same detectors the daemon runs: what the Alerts panel shows
    /// where the daemon sent no alert of that detector.
    active: BTreeMap<String, Alert>,
}

impl Judges {
    /// Keeps `active` as the daemon's `HealthMonitor` keeps its alerts.
    fn record(&mut self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        if t.to == Level::Ok {
            self.active.remove(&t.detector);
            return;
        }
        let since_ms = self.active.get(&t.detector).map_or(t.at_ms, |a| a.since_ms);
        self.active.insert(
            t.detector.clone(),
            Alert {
                detector: t.detector.clone(),
                level: t.severity(),
                since_ms,
                message: t.message,
                preceded_by: Vec::new(),
                since_healthy: Vec::new(),
            },
        );
    }
}

impl Judges {
    fn new(
        thresholds: &DetectorsSection,
        run_started_ms: TimestampMs,
        workers: (usize, usize),
    ) -> Self {
        let memory = MemoryConfig {
            warmup_s: 0.0,
            ..thresholds.memory.clone()
        };
        Self {
            thresholds: thresholds.clone(),
            run_started_ms,
            memory_from_ms: run_started_ms
                .saturating_add((thresholds.memory.warmup_s * 1000.0).round() as i64),
            memory: MemoryFlatness::new(memory),
            queue: QueueDiagnoser::new(thresholds.queue.clone(), workers.0, workers.1),
            queue_workers: workers,
            active: BTreeMap::new(),
        }
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
    /// Offline τ (held-out data, an anchor at every position).
    pub tau: Series,
    /// The same evaluations' DDTree oracle τ at the serving budget, by that budget (a resume
    /// may serve with another).
    pub offline_tree: BTreeMap<usize, Series>,
    /// Online chain τ (speculative decoding against the target).
    pub online_chain: Series,
    /// Online DDTree τ by node budget.
    pub online_ddtree: BTreeMap<usize, Series>,
    /// The serving budget the newest online evaluation named (`online_serve_tree_budget`);
    /// `None` before one, and from a daemon older than the field.
    pub online_serve_budget: Option<usize>,
    /// The newest online evaluation a metrics line carried, with its step.
    pub last_online: Option<OnlineEvalStatus>,
    /// Set when the daemon reports no GPU telemetry, with its reason.
    pub gpu_unavailable: Option<String>,
    pub gpus: BTreeMap<u32, GpuHistory>,
    /// When GPU readings came (the newest sample time of each reading), for their freshness.
    pub gpu_readings: Series,
    pub queue: Option<QueueStats>,
    pub queue_depth: Series,
    /// `None` until the daemon's thresholds arrive.
    judges: Option<Judges>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            last_metrics: None,
            tokens_per_s: series(),
            steps: series(),
            loss: series(),
            tau: series(),
            offline_tree: BTreeMap::new(),
            online_chain: series(),
            online_ddtree: BTreeMap::new(),
            online_serve_budget: None,
            last_online: None,
            gpu_unavailable: None,
            gpus: BTreeMap::new(),
            gpu_readings: series(),
            queue: None,
            queue_depth: series(),
            judges: None,
        }
    }
}

impl Telemetry {
    /// The thresholds of a status snapshot (`StatusSnapshot::detectors`) for the run that
    /// started at `run_started_ms`. New thresholds, or another run, start the judgement afresh;
    /// none (an older daemon, or one whose detectors have not started) withdraw it.
    pub fn apply_thresholds(
        &mut self,
        thresholds: Option<&DetectorsSection>,
        run_started_ms: TimestampMs,
    ) {
        let Some(thresholds) = thresholds else {
            self.judges = None;
            return;
        };
        let unchanged = self
            .judges
            .as_ref()
            .is_some_and(|j| j.thresholds == *thresholds && j.run_started_ms == run_started_ms);
        if !unchanged {
            self.judges = Some(Judges::new(
                thresholds,
                run_started_ms,
                self.worker_counts(),
            ));
        }
    }

    /// The thresholds the verdicts are judged by, once the daemon has sent them.
    pub fn thresholds(&self) -> Option<&DetectorsSection> {
        self.judges.as_ref().map(|j| &j.thresholds)
    }

    pub fn apply_metrics(&mut self, metrics: &StepMetrics) {
        self.tokens_per_s.push(metrics.ts_ms, metrics.tokens_per_s);
        self.steps.push(metrics.ts_ms, metrics.step as f64);
        self.loss.push(metrics.ts_ms, metrics.loss);
        if let Some(tau) = metrics.tau {
            self.tau.push(metrics.ts_ms, tau);
        }
        if let Some((budget, tau)) = metrics
            .tau_tree
            .as_ref()
            .and_then(TreeOracleTau::at_serve_budget)
        {
            self.offline_tree
                .entry(budget)
                .or_insert_with(series)
                .push(metrics.ts_ms, tau);
        }
        if let Some(online) = &metrics.online {
            self.online_chain.push(metrics.ts_ms, online.tau_chain);
            for (&budget, &tau) in &online.tau_ddtree {
                self.online_ddtree
                    .entry(budget)
                    .or_insert_with(series)
                    .push(metrics.ts_ms, tau);
            }
            let newest = self
                .last_online
                .as_ref()
                .is_none_or(|o| metrics.ts_ms >= o.ts_ms);
            if newest {
                self.online_serve_budget = online.serve_tree_budget;
                self.last_online = Some(OnlineEvalStatus {
                    step: metrics.step,
                    ts_ms: metrics.ts_ms,
                    acceptance: online.clone(),
                });
            }
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
                if let Some(ts) = gpus.iter().map(|g| g.ts_ms).max() {
                    self.gpu_readings.push(ts, gpus.len() as f64);
                }
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
        if let Some(judges) = &mut self.judges {
            if sample.ts_ms >= judges.memory_from_ms {
                let transition = judges.memory.observe(sample);
                judges.record(transition);
            }
        }
    }

    pub fn memory_verdict(&self, gpu_index: u32) -> Judged<MemoryVerdict> {
        match &self.judges {
            None => Judged::AwaitingThresholds,
            Some(judges) => Judged::Verdict(judges.memory.verdict(gpu_index)),
        }
    }

    /// The console's own verdicts that are not Ok (`memory:gpuN`, `queue`), as alerts; none
    /// before the daemon's thresholds arrive.
    pub fn console_alerts(&self) -> impl Iterator<Item = &Alert> {
        self.judges.iter().flat_map(|j| j.active.values())
    }

    /// GPUs whose memory is volatile now (none before the daemon's thresholds arrive).
    pub fn volatile_gpus(&self) -> Vec<u32> {
        self.gpus
            .keys()
            .copied()
            .filter(|i| {
                matches!(
                    self.memory_verdict(*i),
                    Judged::Verdict(MemoryVerdict::Volatile { .. })
                )
            })
            .collect()
    }

    pub fn apply_queue(&mut self, stats: &QueueStats) {
        if self.queue.as_ref().is_some_and(|q| stats.ts_ms <= q.ts_ms) {
            return;
        }
        let workers = self.worker_counts();
        if let Some(judges) = &mut self.judges {
            if workers != judges.queue_workers {
                judges.queue_workers = workers;
                judges.queue =
                    QueueDiagnoser::new(judges.thresholds.queue.clone(), workers.0, workers.1);
                judges.active.remove(dflash_shared::health::queue::DETECTOR);
            }
            let transition = judges.queue.observe(stats);
            judges.record(transition);
        }
        self.queue_depth.push(stats.ts_ms, stats.depth as f64);
        self.queue = Some(stats.clone());
    }

    /// The diagnosis is `None` until two queue samples span some time.
    pub fn queue_diagnosis(&self) -> Judged<Option<QueueDiagnosis>> {
        match &self.judges {
            None => Judged::AwaitingThresholds,
            Some(judges) => Judged::Verdict(judges.queue.diagnosis()),
        }
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
    use dflash_shared::health::{HealthMonitor, QueueBound};

    const GB: u64 = 1_000_000_000;

    fn gpu(ts_s: i64, used: u64) -> GpuSample {
        GpuSample {
            ts_ms: ts_s * 1000,
            index: 2,
            name: "NVIDIA H200".into(),
            uuid: None,
            role: DeviceRole::Drafter,
            memory_used_bytes: Some(used),
            memory_total_bytes: Some(141 * GB),
            utilization_pct: Some(97),
            power_w: Some(600.0),
            temperature_c: Some(70),
            allocator: None,
        }
    }

    /// The run started an hour before the samples: its warmup is long over.
    const STARTED_MS: TimestampMs = -3_600_000;

    fn judged_with(thresholds: &DetectorsSection) -> Telemetry {
        let mut telemetry = Telemetry::default();
        telemetry.apply_thresholds(Some(thresholds), STARTED_MS);
        telemetry
    }

    fn feed_gpu(telemetry: &mut Telemetry, from: i64, to: i64, used_gb: impl Fn(i64) -> u64) {
        for i in from..to {
            telemetry.apply_gpus(&GpuTelemetry::Available {
                gpus: vec![gpu(i * 15, used_gb(i) * GB)],
            });
        }
    }

    fn queue(ts_s: i64, starved_ms: f64) -> QueueStats {
        QueueStats {
            ts_ms: ts_s * 1000,
            depth: 2,
            capacity: 64,
            high_watermark: 48,
            low_watermark: 8,
            consumer_starved_ms: starved_ms,
            ..QueueStats::default()
        }
    }

    fn is_volatile(verdict: Judged<MemoryVerdict>) -> bool {
        match verdict {
            Judged::Verdict(MemoryVerdict::Volatile { .. }) => true,
            Judged::Verdict(MemoryVerdict::Flat { .. }) => false,
            other => panic!("no verdict: {other:?}"),
        }
    }

    #[test]
    fn flat_then_volatile_memory_is_judged_per_gpu_and_charted() {
        let mut telemetry = judged_with(&DetectorsSection::default());
        feed_gpu(&mut telemetry, 0, 30, |_| 70);
        assert!(!is_volatile(telemetry.memory_verdict(2)));
        assert!(telemetry.volatile_gpus().is_empty());
        feed_gpu(&mut telemetry, 30, 60, |i| if i % 2 == 0 { 58 } else { 79 });
        assert_eq!(telemetry.volatile_gpus(), vec![2]);
        assert_eq!(telemetry.gpus[&2].memory_used.len(), 60);
    }

    #[test]
    fn without_the_daemons_thresholds_nothing_is_judged_only_charted() {
        let mut telemetry = Telemetry::default();
        feed_gpu(&mut telemetry, 0, 60, |i| if i % 2 == 0 { 58 } else { 79 });
        for i in 0..20 {
            telemetry.apply_queue(&queue(i * 10, i as f64 * 9_000.0));
        }
        assert_eq!(telemetry.memory_verdict(2), Judged::AwaitingThresholds);
        assert!(telemetry.volatile_gpus().is_empty());
        assert_eq!(telemetry.queue_diagnosis(), Judged::AwaitingThresholds);
        assert_eq!(telemetry.gpus[&2].memory_used.len(), 60);
        assert_eq!(telemetry.queue_depth.len(), 20);

        // Thresholds arrive: judged from then on; a snapshot without them withdraws the verdict.
        telemetry.apply_thresholds(Some(&DetectorsSection::default()), STARTED_MS);
        assert_eq!(
            telemetry.memory_verdict(2),
            Judged::Verdict(MemoryVerdict::Collecting { samples: 0 })
        );
        feed_gpu(&mut telemetry, 60, 90, |i| if i % 2 == 0 { 58 } else { 79 });
        assert_eq!(telemetry.volatile_gpus(), vec![2]);
        telemetry.apply_thresholds(None, STARTED_MS);
        assert_eq!(telemetry.memory_verdict(2), Judged::AwaitingThresholds);
    }

    #[test]
    fn a_tuned_threshold_changes_the_consoles_verdict_as_it_changes_the_daemons() {
        // 70 and 73 GB in turn on 141 GB: a 2.1% range, above the default 2% limit.
        let swing = |i: i64| if i % 2 == 0 { 70 } else { 73 };
        let default = DetectorsSection::default();
        let mut tuned = DetectorsSection::default();
        tuned.memory.max_range_frac = 0.05;
        tuned.memory.max_stddev_frac = 0.02;
        // Drafters starved 20% of the time at a low depth: target-bound by default (10%).
        tuned.queue.starved_frac = 0.3;

        let mut verdicts = Vec::new();
        for thresholds in [&default, &tuned] {
            let mut telemetry = judged_with(thresholds);
            // The daemon's judge of the same samples, built from the same section.
            let mut daemon = HealthMonitor::new(thresholds, 1, 1);
            for i in 0..40 {
                let gpus = GpuTelemetry::Available {
                    gpus: vec![gpu(i * 15, swing(i) * GB)],
                };
                telemetry.apply_gpus(&gpus);
                daemon.observe_gpus(&gpus);
            }
            for i in 0..13 {
                telemetry.apply_queue(&queue(i * 10, i as f64 * 2_000.0));
                daemon.observe_queue(&queue(i * 10, i as f64 * 2_000.0));
            }
            let Judged::Verdict(Some(diagnosis)) = telemetry.queue_diagnosis() else {
                panic!("no queue diagnosis");
            };
            let console = (is_volatile(telemetry.memory_verdict(2)), diagnosis.bound);
            let daemon = (
                is_volatile(Judged::Verdict(daemon.memory().verdict(2))),
                daemon.queue().expect("the daemon's diagnosis").bound,
            );
            assert_eq!(console, daemon, "{thresholds:?}");
            verdicts.push(console);
        }
        assert_eq!(
            verdicts,
            vec![
                (true, QueueBound::TargetBound),
                (false, QueueBound::Balanced)
            ]
        );

        // New thresholds mid-run start the judgement afresh with them.
        let mut telemetry = judged_with(&default);
        feed_gpu(&mut telemetry, 0, 40, swing);
        assert!(is_volatile(telemetry.memory_verdict(2)));
        telemetry.apply_thresholds(Some(&tuned), STARTED_MS);
        feed_gpu(&mut telemetry, 40, 80, swing);
        assert!(!is_volatile(telemetry.memory_verdict(2)));
    }

    #[test]
    fn the_runs_memory_warmup_counts_from_its_start_not_from_when_the_console_attached() {
        let thresholds = DetectorsSection::default();
        assert_eq!(thresholds.memory.warmup_s, 300.0);
        // Attached at the run's start: nothing before 300 s is judged.
        let mut telemetry = Telemetry::default();
        telemetry.apply_thresholds(Some(&thresholds), 0);
        feed_gpu(&mut telemetry, 0, 20, |_| 70);
        assert_eq!(
            telemetry.memory_verdict(2),
            Judged::Verdict(MemoryVerdict::Collecting { samples: 0 })
        );
        feed_gpu(&mut telemetry, 20, 30, |_| 70);
        assert_eq!(
            telemetry.memory_verdict(2),
            Judged::Verdict(MemoryVerdict::Collecting { samples: 10 })
        );
        // Attached an hour in: judged from the first samples.
        let mut late = judged_with(&thresholds);
        feed_gpu(&mut late, 0, 20, |_| 70);
        assert!(!is_volatile(late.memory_verdict(2)));
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
