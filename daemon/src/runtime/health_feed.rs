//! Feeds the run's telemetry to the shared [`HealthMonitor`] and keeps the status alerts and
//! throughput judgement current.
//!
//! Steps come from the run loop; GPU and cache readings are taken from the [`RunHandle`],
//! where the telemetry sampler puts them. Detector transitions are journaled here
//! (`RegressionStarted` / `RegressionEnded`), except the cache detector's, which the sampler
//! journals from its own watcher; here the caches only keep the alert list complete.
//!
//! With a [`HealthyRecordKeeper`] the feed also judges throughput against the run's healthy
//! record (or its recipe's), explains every alert with what differs from that record, and
//! writes this run's record once it has been healthy long enough.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{FixedOffset, Offset};
use dflash_shared::config::DetectorsSection;
use dflash_shared::health::{HealthMonitor, Level, ThroughputStatus, Transition};
use dflash_shared::metrics::{GpuTelemetry, QueueStats, StepMetrics};
use dflash_shared::status::Alert;

use super::healthy_record::HealthyRecordKeeper;
use crate::run::handle::{RunHandle, ThroughputJudgement};
use dflash_shared::clock::now_ms;
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::health::fingerprint::Fingerprint;
use dflash_shared::health::healthy_record::differences_since;
use dflash_shared::health::healthy_stretch::standing;
use dflash_shared::status::RecordClock;

/// The live environment watch's alert (`telemetry/env_watch.rs`).
pub const ENVIRONMENT_DETECTOR: &str = "environment";

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
    /// The healthy record this run is judged against and the keeper of this run's own.
    record: Option<HealthyRecordKeeper>,
    /// The live environment watch's alert level.
    environment: Level,
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
            record: None,
            environment: Level::Ok,
        }
    }

    /// Judge against the healthy record `keeper` loaded (if any) and keep this run's record.
    pub fn with_healthy_record(mut self, keeper: HealthyRecordKeeper) -> Self {
        if let Some(reference) = keeper.reference(local_offset()) {
            let mut message = format!(
                "throughput judged against the healthy record from its first post-warmup \
                 sample: {}",
                reference.source
            );
            if let Some(a) = &reference.adjustment {
                message.push_str(&format!("; {a}"));
            }
            self.handle
                .record_event_logged(Severity::Info, EventKind::Note { message });
            self.monitor.set_throughput_reference(Some(reference));
        }
        if let Some(record) = keeper.judged_against() {
            self.monitor.remember_caches(&record.caches);
        }
        self.handle
            .set_healthy_record(keeper.judged_against().cloned(), keeper.files());
        self.record = Some(keeper);
        self
    }

    /// A confirmed forget of the healthy record (`RunCommand::ForgetHealthyRecord`, on the run
    /// loop's thread, so no record write can race it): its files are removed, the stretch
    /// starts over and throughput is judged against this run's own rate. Returns the files
    /// removed; an error leaves the record judged against as it was.
    pub fn forget_record(&mut self, ts_ms: i64) -> std::io::Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        if let Some(keeper) = self.record.as_mut() {
            removed = keeper.forget()?;
            self.handle.set_healthy_record(None, keeper.files());
        }
        let transition = self.monitor.forget_throughput_reference(ts_ms);
        self.journal(transition.as_slice());
        self.handle.record_event_logged(
            Severity::Info,
            EventKind::Note {
                message: "healthy record forgotten: throughput is judged against this run's \
                          own rate from now on, and a new record is written once it has been \
                          healthy for detectors.healthy.after_ok_s"
                    .into(),
            },
        );
        self.refresh_alerts();
        // Status says what throughput is judged against now, not at the next step.
        self.publish_judgement(&self.monitor.throughput());
        Ok(removed)
    }

    /// One optimizer step (not the pre-training evaluation line): throughput, and the serve
    /// gap when the step carries an online evaluation.
    pub fn observe_step(&mut self, m: &StepMetrics) {
        let transitions = self.monitor.observe_step(m);
        self.journal(&transitions);
        let t = self.monitor.throughput();
        let alert_active = self.monitor.any_active() || self.run_alert.is_some();
        if let Some(keeper) = self.record.as_mut() {
            keeper.observe_standing(m.ts_ms, standing(&t, alert_active));
            keeper.observe_step(m);
        }
        self.poll(!transitions.is_empty());
        self.write_record_when_due(m.step);
        self.publish_judgement(&t);
    }

    /// The detector's baseline and, with a record kept, the record's clock: "stable since" is
    /// the healthy stretch's start, so the console and the record agree.
    fn publish_judgement(&self, t: &ThroughputStatus) {
        let (stable_since_ms, record_clock) = match self.record.as_ref() {
            Some(keeper) => {
                let stretch = keeper.stretch();
                let clock = RecordClock {
                    stretch_since_ms: stretch.since_ms(),
                    due_ms: stretch.first_due_ms(),
                    written_ms: stretch.last_written_ms(),
                    drop_timed: stretch.drop_timed(),
                };
                (stretch.since_ms(), Some(clock))
            }
            None => {
                let stable = t.level == Level::Ok && !t.learning;
                (stable.then_some(t.since_ms).flatten(), None)
            }
        };
        self.handle.set_throughput_judgement(ThroughputJudgement {
            baseline_tokens_per_s: t.baseline_tokens_per_s,
            stable_since_ms,
            baseline_source: t.baseline_source.clone(),
            record_clock,
        });
    }

    /// Writes this run's healthy record when it is due; the first write is journaled.
    fn write_record_when_due(&mut self, step: u64) {
        let now = now_ms();
        let Some(keeper) = self.record.as_mut() else {
            return;
        };
        if !keeper.due(now) {
            return;
        }
        let fingerprint = current_fingerprint(&self.handle);
        match keeper.write(now, step, &fingerprint, &self.handle.caches()) {
            Ok(None) => {
                tracing::debug!(
                    "healthy but slower than the record judged against: the record stands"
                )
            }
            Ok(Some((record, first))) => {
                if first {
                    self.handle.record_event_logged(
                        Severity::Info,
                        EventKind::Note {
                            message: format!(
                                "healthy record written at step {step}: {} tok/s over {} \
                                 healthy steps (healthy.json in the run dir, and the \
                                 recipe's in the state dir)",
                                dflash_shared::format::format_tokens_per_s(
                                    record.throughput.tokens_per_s
                                ),
                                record.throughput.samples
                            ),
                        },
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not write the healthy record; a restart will learn its baseline anew")
            }
        }
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
        if let Some(keeper) = self.record.as_mut() {
            keeper.observe_queue(stats);
        }
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
                if let Some(keeper) = self.record.as_mut() {
                    gpus.iter().for_each(|g| keeper.observe_gpu(g));
                }
                let t = self.monitor.observe_gpus(&GpuTelemetry::Available { gpus });
                self.journal(&t);
                changed |= !t.is_empty();
            }
        }
        changed |= self.judge_environment();
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

    /// The live environment watch's standing differences as the `environment` alert: raised
    /// while anything differs from what this process started with, cleared once reverted.
    fn judge_environment(&mut self) -> bool {
        let differences = self.handle.live_environment();
        let next = if differences.is_empty() {
            Level::Ok
        } else {
            Level::Warn
        };
        if next == self.environment {
            return false;
        }
        let message = if differences.is_empty() {
            "training environment back to what this run started with".to_string()
        } else {
            format!(
                "training environment changed while the daemon runs: {}; this process still \
                 runs the libraries it loaded, the next start would load the new ones; \
                 restore what it started with before restarting",
                differences.join("; ")
            )
        };
        let t = Transition {
            detector: ENVIRONMENT_DETECTOR.into(),
            from: self.environment,
            to: next,
            at_ms: now_ms(),
            message,
        };
        self.environment = next;
        let t = self.monitor.record_external(vec![t]);
        self.journal(&t);
        true
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
        if let Some(record) = self.record.as_ref().and_then(|k| k.judged_against()) {
            let differences = differences_since(
                record,
                &current_fingerprint(&self.handle),
                &self.handle.caches(),
                &events,
            );
            self.monitor.set_since_healthy(differences);
        }
        events.retain(|e| e.ts_ms >= since);
        let mut alerts: Vec<Alert> = self.run_alert.iter().cloned().collect();
        alerts.extend(self.monitor.alerts(&events, local_offset()));
        self.handle.set_alerts(alerts);
    }
}

/// The environment as the daemon knows it now: the start's fingerprint with what the live
/// environment watch has seen change since. Guard rails take it before the run loop starts;
/// without one (tests that build no guard rails) nothing is known of the environment.
fn current_fingerprint(handle: &RunHandle) -> Fingerprint {
    handle.fingerprint().unwrap_or_default()
}

/// The machine's UTC offset now, for "at 21:03" in alert explanations.
pub fn local_offset() -> FixedOffset {
    chrono::Local::now().offset().fix()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::bus::FrameBus;
    use crate::run::handle::RunHandleParts;
    use crate::run::journal::Journal;
    use crate::run::pending::ActionPolicy;
    use dflash_shared::events::EventKind;
    use dflash_shared::metrics::{OnlineAcceptance, StepTimes};

    fn line(step: u64, tau: Option<f64>, online_chain: Option<f64>) -> StepMetrics {
        StepMetrics {
            ts_ms: now_ms() + step as i64,
            step,
            epoch: 1,
            loss: 2.0,
            accuracy: 0.3,
            tau,
            tau_tree: None,
            lr: 1e-3,
            grad_norm: if step == 0 { 0.0 } else { 0.5 },
            tokens_per_s: if step == 0 { 0.0 } else { 900.0 },
            draft_positions_per_s: 0.0,
            mfu: None,
            workers: vec![],
            times: StepTimes::default(),
            online: online_chain.map(|tau_chain| OnlineAcceptance {
                tau_chain,
                tau_ddtree: [(16, tau_chain + 0.25)].into_iter().collect(),
                serve_tree_budget: None,
                offline_tau: tau,
                base: None,
                prompts: 8,
                seconds: 0.5,
            }),
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        }
    }

    /// The lines the run loop hands the feed (the evaluation before step 1, then steps) with
    /// online chain τ far below offline τ: the serve gap is journaled and becomes an alert in
    /// status with its figures; lines back near offline τ clear it.
    #[test]
    fn a_gap_in_constructed_lines_is_journaled_and_alerted_and_then_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let handle = RunHandle::new(RunHandleParts {
            policy: ActionPolicy::new("r"),
            run_dir: dir.path().to_path_buf(),
            journal,
            bus: FrameBus::new(16),
            recorder: None,
            config_path: None,
        });
        let mut feed = HealthFeed::new(handle.clone(), &DetectorsSection::default(), 1, 1);
        feed.observe_evaluation(&line(0, Some(1.2), Some(1.2)));
        feed.observe_step(&line(50, Some(3.0), Some(2.0)));
        assert!(
            handle.status_snapshot().alerts.is_empty(),
            "one gap is not enough"
        );
        feed.observe_step(&line(100, Some(3.2), Some(2.0)));
        let alerts = handle.status_snapshot().alerts;
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        assert_eq!(alerts[0].detector, "serve_gap");
        assert!(
            alerts[0].message.starts_with(
                "serve gap: online chain τ 2.00 is 38% below offline τ 3.20 at step 100"
            ),
            "{}",
            alerts[0].message
        );
        let journaled = |ended: bool| {
            handle
                .with_journal(|j| j.recent(usize::MAX))
                .iter()
                .filter(|e| match &e.kind {
                    EventKind::RegressionStarted { detector, .. } => {
                        !ended && detector == "serve_gap"
                    }
                    EventKind::RegressionEnded { detector, .. } => ended && detector == "serve_gap",
                    _ => false,
                })
                .count()
        };
        assert_eq!(journaled(false), 1);
        feed.observe_step(&line(150, Some(3.2), Some(3.1)));
        feed.observe_step(&line(200, Some(3.3), Some(3.3)));
        assert!(handle.status_snapshot().alerts.is_empty());
        assert_eq!(journaled(true), 1);
    }
}
