//! Feeds the run's telemetry to the shared [`HealthMonitor`] and keeps the status alerts and
//! throughput judgement current.
//!
//! Steps come from the run loop; GPU and cache readings are taken from the [`RunHandle`],
//! where the telemetry sampler puts them. Detector transitions are journaled here
//! (`RegressionStarted` / `RegressionEnded`), except the cache detector's, which the sampler
//! journals from its own watcher; here the caches only keep the alert list complete.
use std::time::{Duration, Instant};

use chrono::{FixedOffset, Offset};
use dflash_shared::config::DetectorsSection;
use dflash_shared::health::{HealthMonitor, Level, Transition};
use dflash_shared::metrics::{GpuTelemetry, QueueStats, StepMetrics};
use dflash_shared::status::Alert;

use crate::run::handle::RunHandle;
use dflash_shared::clock::now_ms;

/// Alerts are recomputed at least this often ("since" texts, journal context).
const REFRESH: Duration = Duration::from_secs(2);

pub struct HealthFeed {
    monitor: HealthMonitor,
    handle: RunHandle,
    lookback_ms: i64,
    last_gpu_ts: i64,
    last_refresh: Option<Instant>,
    /// An alert about the run itself (a failed step), shown first.
    run_alert: Option<Alert>,
}

impl HealthFeed {
    /// `target_workers` and `drafter_workers` of the topology the trainer runs (1 and 1 for
    /// the single-device trainer): the queue diagnosis weighs its waits by them.
    pub fn new(
        handle: RunHandle,
        cfg: &DetectorsSection,
        target_workers: usize,
        drafter_workers: usize,
    ) -> Self {
        handle.set_detectors(cfg.clone());
        HealthFeed {
            monitor: HealthMonitor::new(cfg, target_workers, drafter_workers),
            handle,
            lookback_ms: cfg.explain_lookback_s as i64 * 1000,
            last_gpu_ts: i64::MIN,
            last_refresh: None,
            run_alert: None,
        }
    }

    /// One optimizer step (not the pre-training evaluation line): throughput, and the serve
    /// gap when the step carries an online evaluation.
    pub fn observe_step(&mut self, m: &StepMetrics) {
        let transitions = self.monitor.observe_step(m);
        self.journal(&transitions);
        let t = self.monitor.throughput();
        let stable_since = (t.level == Level::Ok && !t.learning)
            .then_some(t.since_ms)
            .flatten();
        self.handle
            .set_throughput_judgement(t.baseline_tokens_per_s, stable_since);
        self.poll(!transitions.is_empty());
    }

    /// A line that is no optimizer step (the evaluation before the first step): its offline
    /// and online τ reach the serve-gap detector; its zero throughput reaches no detector.
    pub fn observe_evaluation(&mut self, m: &StepMetrics) {
        let transitions = self.monitor.observe_evaluation(m);
        self.journal(&transitions);
        if !transitions.is_empty() {
            self.refresh_alerts();
        }
    }

    /// A hidden-state queue reading (threaded topologies): target- or drafter-bound.
    pub fn observe_queue(&mut self, stats: &QueueStats) {
        let transitions = self.monitor.observe_queue(stats);
        self.journal(&transitions);
        if !transitions.is_empty() {
            self.refresh_alerts();
        }
    }

    /// GPU memory and caches as last sampled; alerts refreshed when due or when `force`d.
    pub fn poll(&mut self, force: bool) {
        let mut changed = force;
        if let GpuTelemetry::Available { gpus } = self.handle.gpus() {
            let newest = gpus.iter().map(|g| g.ts_ms).max().unwrap_or(i64::MIN);
            if newest > self.last_gpu_ts {
                self.last_gpu_ts = newest;
                let t = self.monitor.observe_gpus(&GpuTelemetry::Available { gpus });
                self.journal(&t);
                changed |= !t.is_empty();
            }
        }
        let caches = self.handle.caches();
        if !caches.is_empty() {
            let (_, t) = self.monitor.observe_caches(now_ms(), &caches);
            changed |= !t.is_empty();
        }
        let due = self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH);
        if changed || due {
            self.refresh_alerts();
        }
    }

    /// Sets (or clears) the alert about the run itself and republishes the alerts.
    pub fn set_run_alert(&mut self, alert: Option<Alert>) {
        self.run_alert = alert;
        self.refresh_alerts();
    }

    fn journal(&self, transitions: &[Transition]) {
        for t in transitions {
            self.handle
                .record_event_logged(t.severity(), t.to_event_kind());
        }
    }

    fn refresh_alerts(&mut self) {
        self.last_refresh = Some(Instant::now());
        // The in-memory tail (thousands of events) covers the lookback of any real run; the
        // file is never reread for this.
        let since = now_ms() - self.lookback_ms - 60_000;
        let mut events = self.handle.with_journal(|j| j.recent(usize::MAX));
        events.retain(|e| e.ts_ms >= since);
        let mut alerts: Vec<Alert> = self.run_alert.iter().cloned().collect();
        alerts.extend(self.monitor.alerts(&events, local_offset()));
        self.handle.set_alerts(alerts);
    }
}

/// The machine's UTC offset now, for "at 21:03" in alert explanations.
pub fn local_offset() -> FixedOffset {
    chrono::Local::now().offset().fix()
}
