//! All detectors behind one object the daemon feeds, and the alerts a status snapshot shows.
use std::collections::BTreeMap;

use chrono::FixedOffset;

use super::{
    explain_alert, CacheChange, CacheWatcher, Level, MemoryFlatness, QueueDiagnoser,
    QueueDiagnosis, ThroughputDetector, ThroughputStatus, Transition,
};
use crate::config::DetectorsSection;
use crate::events::Event;
use crate::metrics::{CacheState, GpuTelemetry, QueueStats, StepMetrics, TimestampMs};
use crate::status::Alert;

#[derive(Debug, Clone, PartialEq)]
struct Active {
    level: Level,
    since_ms: TimestampMs,
    message: String,
}

/// Feeds every detector and remembers which are not Ok.
#[derive(Debug, Clone)]
pub struct HealthMonitor {
    throughput: ThroughputDetector,
    memory: MemoryFlatness,
    queue: QueueDiagnoser,
    caches: CacheWatcher,
    lookback_ms: i64,
    active: BTreeMap<String, Active>,
}

impl HealthMonitor {
    /// `target_workers` produce into the hidden-state queue, `drafter_workers` consume.
    pub fn new(cfg: &DetectorsSection, target_workers: usize, drafter_workers: usize) -> Self {
        Self {
            throughput: ThroughputDetector::new(cfg.throughput.clone()),
            memory: MemoryFlatness::new(cfg.memory.clone()),
            queue: QueueDiagnoser::new(cfg.queue.clone(), target_workers, drafter_workers),
            caches: CacheWatcher::new(),
            lookback_ms: cfg.explain_lookback_s as i64 * 1000,
            active: BTreeMap::new(),
        }
    }

    /// One optimizer step (total tok/s of all workers).
    pub fn observe_step(&mut self, metrics: &StepMetrics) -> Vec<Transition> {
        let t = self.throughput.observe(metrics.ts_ms, metrics.tokens_per_s);
        self.record(t.into_iter().collect())
    }

    /// One NVML/allocator reading of all GPUs; nothing to judge without NVML.
    pub fn observe_gpus(&mut self, telemetry: &GpuTelemetry) -> Vec<Transition> {
        let GpuTelemetry::Available { gpus } = telemetry else {
            return Vec::new();
        };
        let t = gpus.iter().filter_map(|g| self.memory.observe(g)).collect();
        self.record(t)
    }

    pub fn observe_queue(&mut self, stats: &QueueStats) -> Vec<Transition> {
        let t = self.queue.observe(stats);
        self.record(t.into_iter().collect())
    }

    /// Returns the cache changes (journal `CacheChanged` events) and level transitions.
    pub fn observe_caches(
        &mut self,
        ts_ms: TimestampMs,
        states: &[CacheState],
    ) -> (Vec<CacheChange>, Vec<Transition>) {
        let (changes, t) = self.caches.observe(ts_ms, states);
        (changes, self.record(t))
    }

    fn record(&mut self, transitions: Vec<Transition>) -> Vec<Transition> {
        for t in &transitions {
            if t.to == Level::Ok {
                self.active.remove(&t.detector);
            } else {
                let since = match self.active.get(&t.detector) {
                    // Warn → Crit keeps the time the regression began.
                    Some(a) if a.level != Level::Ok => a.since_ms,
                    _ => t.at_ms,
                };
                self.active.insert(
                    t.detector.clone(),
                    Active {
                        level: t.to,
                        since_ms: since,
                        message: t.message.clone(),
                    },
                );
            }
        }
        transitions
    }

    pub fn throughput(&self) -> ThroughputStatus {
        self.throughput.status()
    }

    pub fn queue(&self) -> Option<QueueDiagnosis> {
        self.queue.diagnosis()
    }

    pub fn memory(&self) -> &MemoryFlatness {
        &self.memory
    }

    /// The active alerts, worst first, each with what the journal shows just before it.
    pub fn alerts(&self, journal: &[Event], offset: FixedOffset) -> Vec<Alert> {
        let mut alerts: Vec<Alert> = self
            .active
            .iter()
            .map(|(detector, a)| Alert {
                detector: detector.clone(),
                level: a.level.severity(),
                since_ms: a.since_ms,
                message: a.message.clone(),
                preceded_by: explain_alert(a.since_ms, journal, self.lookback_ms)
                    .iter()
                    .map(|p| p.sentence(offset))
                    .collect(),
            })
            .collect();
        alerts.sort_by(|x, y| y.level.cmp(&x.level).then(x.since_ms.cmp(&y.since_ms)));
        alerts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, Severity};
    use crate::metrics::StepTimes;

    fn step(ts_ms: i64, tokens_per_s: f64) -> StepMetrics {
        StepMetrics {
            ts_ms,
            step: 0,
            epoch: 0,
            loss: 1.0,
            accuracy: 0.1,
            tau: None,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_s,
            draft_positions_per_s: 0.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
        }
    }

    #[test]
    fn escalation_keeps_the_start_and_recovery_clears_the_alert() {
        let mut m = HealthMonitor::new(&DetectorsSection::default(), 5, 3);
        let mut t = 0;
        let mut feed = |m: &mut HealthMonitor, secs: i64, v: f64| {
            let mut out = Vec::new();
            for _ in 0..secs {
                t += 1000;
                out.extend(m.observe_step(&step(t, v)));
            }
            out
        };
        feed(&mut m, 600, 20_000.0);
        let warn = feed(&mut m, 120, 12_000.0);
        assert_eq!(warn.len(), 1);
        let crit = feed(&mut m, 60, 2_000.0);
        assert_eq!(crit[0].to, Level::Crit);
        let drift = Event {
            seq: 1,
            ts_ms: warn[0].at_ms - 60_000,
            severity: Severity::Warn,
            kind: EventKind::EnvironmentDrift {
                field: "python.torch".into(),
                before: "a".into(),
                after: "b".into(),
            },
        };
        let alerts = m.alerts(&[drift], FixedOffset::east_opt(0).unwrap());
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].level, Severity::Crit);
        assert_eq!(
            alerts[0].since_ms, warn[0].at_ms,
            "the regression began at the Warn"
        );
        assert_eq!(alerts[0].preceded_by, ["torch a → b at 00:10"]);
        feed(&mut m, 300, 20_000.0);
        assert!(m.alerts(&[], FixedOffset::east_opt(0).unwrap()).is_empty());
    }

    #[test]
    fn no_nvml_means_no_memory_verdicts() {
        let mut m = HealthMonitor::new(&DetectorsSection::default(), 1, 1);
        let none = GpuTelemetry::Unavailable {
            reason: "NVML unavailable".into(),
        };
        assert!(m.observe_gpus(&none).is_empty());
        assert_eq!(m.memory().gpu_indices().count(), 0);
    }
}
