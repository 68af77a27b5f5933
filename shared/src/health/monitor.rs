//! All detectors behind one object the daemon feeds, and the alerts a status snapshot shows.
use std::collections::BTreeMap;

use chrono::FixedOffset;
use serde::{Deserialize, Serialize};

use super::healthy_record::{HealthyRecordConfig, ThroughputReference};
use super::{
    explain_alert, CacheChange, CacheWatcher, Level, MemoryConfig, MemoryFlatness, QueueDiagnoser,
    QueueDiagnosis, QueueThresholds, ServeGapConfig, ServeGapDetector, ServeGapReading,
    StragglerConfig, StragglerDetector, ThroughputConfig, ThroughputDetector, ThroughputStatus,
    Transition,
};
use crate::events::{Event, Severity};
use crate::metrics::{CacheState, GpuTelemetry, QueueStats, StepMetrics, TimestampMs};

/// `[detectors]` of the run config (`crate::config` re-exports it): every detector's thresholds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectorsSection {
    /// How far before an alert the journal is searched for what changed.
    pub explain_lookback_s: u64,
    pub throughput: ThroughputConfig,
    pub memory: MemoryConfig,
    pub queue: QueueThresholds,
    /// Online chain τ against offline τ (`crate::health::serve_gap`).
    pub serve_gap: ServeGapConfig,
    /// When a node of a multi-node job is named as holding it back (`crate::job`,
    /// `crate::health::straggler`).
    pub straggler: StragglerConfig,
    /// When a run is remembered as healthy (`crate::health::healthy_record`).
    pub healthy: HealthyRecordConfig,
}

impl Default for DetectorsSection {
    fn default() -> Self {
        Self {
            explain_lookback_s: 3600,
            throughput: ThroughputConfig::default(),
            memory: MemoryConfig::default(),
            queue: QueueThresholds::default(),
            serve_gap: ServeGapConfig::default(),
            straggler: StragglerConfig::default(),
            healthy: HealthyRecordConfig::default(),
        }
    }
}

/// An active alert as a status snapshot carries it (`crate::status`).
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
    serve_gap: ServeGapDetector,
    stragglers: StragglerDetector,
    /// The newest offline τ of any line: what an online evaluation is compared with when its
    /// own line knows no offline τ of the same moment.
    last_offline_tau: Option<f64>,
    lookback_ms: i64,
    active: BTreeMap<String, Active>,
    /// What differs between the healthy record and now, attached to every alert about how the
    /// run performs (not to the cache alerts, which are themselves one of the differences).
    since_healthy: Vec<String>,
}

impl HealthMonitor {
    /// `target_workers` produce into the hidden-state queue, `drafter_workers` consume.
    pub fn new(cfg: &DetectorsSection, target_workers: usize, drafter_workers: usize) -> Self {
        Self {
            throughput: ThroughputDetector::new(cfg.throughput.clone()),
            memory: MemoryFlatness::new(cfg.memory.clone()),
            queue: QueueDiagnoser::new(cfg.queue.clone(), target_workers, drafter_workers),
            caches: CacheWatcher::new(),
            serve_gap: ServeGapDetector::new(cfg.serve_gap.clone()),
            stragglers: StragglerDetector::new(cfg.straggler.clone()),
            last_offline_tau: None,
            lookback_ms: cfg.explain_lookback_s as i64 * 1000,
            active: BTreeMap::new(),
            since_healthy: Vec::new(),
        }
    }

    /// Judge throughput against a healthy record's expectation (`None`: learn it in-process).
    pub fn set_throughput_reference(&mut self, reference: Option<ThroughputReference>) {
        self.throughput.set_reference(reference);
    }

    /// A confirmed forget of the healthy record: no reference, no differences since it
    /// (`ThroughputDetector::forget_reference`); the transition it makes, if any.
    pub fn forget_throughput_reference(&mut self, ts_ms: TimestampMs) -> Option<Transition> {
        self.since_healthy.clear();
        let transition = self.throughput.forget_reference(ts_ms)?;
        self.record(vec![transition]).pop()
    }

    /// The differences between the healthy record and now, for the alerts' explanations.
    pub fn set_since_healthy(&mut self, differences: Vec<String>) {
        self.since_healthy = differences;
    }

    /// An alert raised outside the detectors (the live environment watch): kept in the list
    /// and explained like the others until it is cleared with `to == Ok`.
    pub fn record_external(&mut self, transitions: Vec<Transition>) -> Vec<Transition> {
        self.record(transitions)
    }

    /// Caches as the healthy record saw them: a warm one missing now is an alert at once.
    pub fn remember_caches(&mut self, states: &[CacheState]) {
        self.caches.remember(states);
    }

    /// Whether any alert is active: a run with one is not healthy enough to be remembered.
    pub fn any_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// One optimizer step: its total tok/s of all workers (of all nodes, on a node of a job),
    /// the node holding a job back, and the τ figures it carries. A throughput alert on a job
    /// names its straggler when one holds it back.
    pub fn observe_step(&mut self, metrics: &StepMetrics) -> Vec<Transition> {
        let straggler = metrics.job.as_ref().and_then(|j| j.straggler.as_ref());
        let mut t: Vec<Transition> = self
            .throughput
            .observe(metrics.ts_ms, metrics.judged_tokens_per_s())
            .into_iter()
            .map(|mut t| {
                if let (Some(s), true) = (straggler, t.to != Level::Ok) {
                    t.message = format!("{}; {}", t.message, s.sentence());
                }
                t
            })
            .collect();
        if let Some(job) = &metrics.job {
            t.extend(self.stragglers.observe(metrics.ts_ms, job));
        }
        t.extend(self.judge_acceptance(metrics));
        self.record(t)
    }

    /// A line that is no optimizer step (the evaluation before the first step): only its τ
    /// figures are judged; its zero throughput is not a sample.
    pub fn observe_evaluation(&mut self, metrics: &StepMetrics) -> Vec<Transition> {
        let t = self.judge_acceptance(metrics).into_iter().collect();
        self.record(t)
    }

    /// The serve gap of a line with an online evaluation, against the offline τ of the same
    /// moment: the online evaluation's own, else the line's, else the newest seen before.
    fn judge_acceptance(&mut self, m: &StepMetrics) -> Option<Transition> {
        if let Some(tau) = m.tau {
            self.last_offline_tau = Some(tau);
        }
        let online = m.online.as_ref()?;
        let offline = online.offline_tau.or(m.tau).or(self.last_offline_tau)?;
        self.serve_gap
            .observe(m.ts_ms, m.step, online.tau_chain, offline)
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

    /// The last online evaluation the serve-gap detector judged, and its level.
    pub fn serve_gap(&self) -> (Level, Option<ServeGapReading>) {
        (self.serve_gap.level(), self.serve_gap.last())
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
                since_healthy: if detector.starts_with("cache:") {
                    Vec::new()
                } else {
                    self.since_healthy.clone()
                },
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
            tau_tree: None,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_s,
            draft_positions_per_s: 0.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
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
    fn online_evaluations_are_judged_against_the_offline_tau_of_their_moment() {
        use crate::metrics::OnlineAcceptance;
        let mut m = HealthMonitor::new(&DetectorsSection::default(), 1, 1);
        let online = |tau_chain: f64, offline_tau: Option<f64>| OnlineAcceptance {
            tau_chain,
            tau_ddtree: Default::default(),
            serve_tree_budget: None,
            offline_tau,
            base: None,
            prompts: 8,
            seconds: 1.0,
        };
        // Before the first step: offline 3.0 on the evaluation line, online 2.0 beside it.
        let mut eval = step(1_000, 0.0);
        eval.tau = Some(3.0);
        eval.online = Some(online(2.0, None));
        assert!(m.observe_evaluation(&eval).is_empty());
        assert_eq!(m.serve_gap().1.map(|r| r.offline_tau), Some(3.0));
        // A step with only an online evaluation is compared with the newest offline τ.
        let mut s = step(2_000, 20_000.0);
        s.online = Some(online(2.0, None));
        let t = m.observe_step(&s);
        assert_eq!(t.len(), 1, "two in a row beyond 15%");
        assert_eq!(t[0].detector, "serve_gap");
        let alerts = m.alerts(&[], FixedOffset::east_opt(0).unwrap());
        assert_eq!(alerts.len(), 1);
        assert!(alerts[0]
            .message
            .contains("online chain τ 2.00 is 33% below offline τ 3.00"));
        // The online evaluation's own offline τ wins over the line's and the newest.
        let mut s = step(3_000, 20_000.0);
        s.tau = Some(9.0);
        s.online = Some(online(2.9, Some(3.0)));
        m.observe_step(&s);
        assert_eq!(m.serve_gap().1.map(|r| r.offline_tau), Some(3.0));
        let mut s = step(4_000, 20_000.0);
        s.online = Some(online(3.0, Some(3.0)));
        assert_eq!(m.observe_step(&s)[0].to, Level::Ok);
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
