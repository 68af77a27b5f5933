//! The daemon's training loop: drives the [`Trainer`] one optimizer step at a time and, between
//! steps, does what the control plane and the operator ask.
//!
//! Each step's metrics go to the bus (`metrics` subscribers), the status snapshot, the
//! `metrics.jsonl` file and the health detectors. Checkpoints are written every
//! `training.checkpoint_every` steps and whenever the loop ends with steps to save. Between
//! steps the loop answers, in this order: a stop signal (SIGTERM/SIGINT: checkpoint, exit 0),
//! a confirmed command (stop: checkpoint, then reply with where it went; kill: no
//! checkpoint), a shutdown of the control plane, the end of the schedule, `--max-steps`.
//!
//! A step or checkpoint that fails (an error, or a libtorch panic such as an OOM) pauses the
//! run: the failure is journaled, the state is Paused with an alert saying why, the last
//! checkpoint is left as it is, and the loop only waits for a stop. It never trains on.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use dflash_shared::config::DetectorsSection;
use dflash_shared::events::{EventKind, Severity, TRAINING_COMPLETE};
use dflash_shared::metrics::StepMetrics;
use dflash_shared::status::{Alert, RunState};

use super::checkpoints;
use super::ending::Ending;
use super::handle::{CommandOutcome, RunCommand, RunHandle};
use super::health_feed::HealthFeed;
use super::metrics_out::MetricsOut;
use super::pace::Pace;
use super::{notify, signals};
use crate::control::journal::now_ms;
use crate::engine::train::trainer::{RunOptions, Trainer};
use crate::engine::train::TrainError;
use crate::telemetry::fingerprint::digest;
use crate::telemetry::warmup::{WarmupDevice, WarmupRecord};

#[derive(Debug, Clone)]
pub struct RunLoopConfig {
    pub checkpoint_root: PathBuf,
    /// Optimizer steps this process takes at most (`--max-steps`).
    pub max_steps: Option<u64>,
    pub metrics_path: PathBuf,
    /// Print a progress line every this many steps (0: only evaluations).
    pub log_every: u64,
    /// "cpu", "cuda:3".
    pub device: String,
    pub detectors: DetectorsSection,
}

/// Which part of the run failed a step, and why.
#[derive(Debug, Clone)]
struct StepFailure {
    /// "target worker 1 on cuda:3", "the trainer on cuda:5".
    subject: String,
    device: String,
    role: Option<dflash_shared::metrics::DeviceRole>,
    rank: Option<usize>,
    error: String,
}

impl StepFailure {
    /// Names the worker a step error came from; errors outside the workers are the trainer's.
    fn of(e: &TrainError, trainer_device: &str) -> Self {
        match e {
            TrainError::Worker(w) => StepFailure {
                subject: w.worker.clone(),
                device: w.device.clone(),
                role: Some(w.role),
                rank: Some(w.rank),
                error: e.to_string(),
            },
            other => Self::trainer(other.to_string(), trainer_device),
        }
    }

    /// A failure of the training thread itself (a checkpoint write, a panic outside a worker),
    /// which runs beside drafter rank 0 on `trainer_device`.
    fn trainer(error: String, trainer_device: &str) -> Self {
        StepFailure {
            subject: format!("the trainer on {trainer_device}"),
            device: trainer_device.to_string(),
            role: None,
            rank: None,
            error,
        }
    }
}

enum Reason {
    Complete,
    StepLimit(u64),
    Signal(i32),
    Operator(String),
    Shutdown(String),
}

pub struct RunLoop {
    handle: RunHandle,
    trainer: Trainer,
    commands: Receiver<RunCommand>,
    health: HealthFeed,
    cfg: RunLoopConfig,
    metrics: MetricsOut,
    pace: Pace,
    steps_run: u64,
    last_saved_step: Option<u64>,
    warmed_up: bool,
    last_notify: Option<Instant>,
}

impl RunLoop {
    pub fn new(
        handle: RunHandle,
        trainer: Trainer,
        commands: Receiver<RunCommand>,
        cfg: RunLoopConfig,
    ) -> std::io::Result<Self> {
        let metrics = MetricsOut::open(&cfg.metrics_path, cfg.log_every, trainer.total_steps())?;
        let on_disk = checkpoints::on_disk(&cfg.checkpoint_root);
        let step = trainer.step_count();
        let last_saved_step = on_disk.iter().any(|c| c.step == step).then_some(step);
        handle.set_checkpoints(on_disk);
        Ok(RunLoop {
            health: HealthFeed::new(
                handle.clone(),
                &cfg.detectors,
                trainer.topology().target_devices.len(),
                trainer.drafter_ranks(),
            ),
            handle,
            trainer,
            commands,
            cfg,
            metrics,
            pace: Pace::default(),
            steps_run: 0,
            last_saved_step,
            warmed_up: false,
            last_notify: None,
        })
    }

    /// Trains until something ends the run; returns why.
    pub fn run(mut self) -> Ending {
        let (total, epochs) = (self.trainer.total_steps(), self.trainer.config().epochs);
        let (step, epoch) = (self.trainer.step_count(), self.trainer.epoch_in_progress());
        self.handle.update_run(|r| {
            r.total_steps = total;
            r.epochs = epochs;
            r.step = step;
            r.epoch = epoch;
        });
        self.handle.set_run_state(RunState::WarmingUp);
        self.handle.set_queue_monitor(self.trainer.queue_monitor());
        loop {
            if let Some(ending) = self.between_steps() {
                return ending;
            }
            if let Err(failure) = self.one_step() {
                return self.pause(failure);
            }
        }
    }

    fn between_steps(&mut self) -> Option<Ending> {
        if let Some(signal) = signals::received() {
            return Some(self.finish(Reason::Signal(signal)).0);
        }
        match self.commands.try_recv() {
            Ok(RunCommand::Stop { action_id, reply }) => {
                let (ending, outcome) = self.finish(Reason::Operator(action_id));
                let _ = reply.send(outcome);
                return Some(ending);
            }
            Ok(RunCommand::Kill { action_id, reply }) => {
                let (ending, outcome) = self.kill(action_id);
                let _ = reply.send(outcome);
                return Some(ending);
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
        }
        if self.handle.is_shutdown_requested() {
            let why = self.handle.shutdown_reason().unwrap_or_default();
            return Some(self.finish(Reason::Shutdown(why)).0);
        }
        if self.trainer.is_finished() {
            return Some(self.finish(Reason::Complete).0);
        }
        if let Some(limit) = self.cfg.max_steps.filter(|m| self.steps_run >= *m) {
            return Some(self.finish(Reason::StepLimit(limit)).0);
        }
        None
    }

    fn one_step(&mut self) -> Result<(), StepFailure> {
        let mut lines: Vec<StepMetrics> = Vec::with_capacity(2);
        let opts = RunOptions {
            max_steps: Some(1),
            checkpoint_root: None,
            stop: None,
        };
        let trainer = &mut self.trainer;
        let result = catch_unwind(AssertUnwindSafe(|| {
            trainer.run(&opts, &mut |m| {
                lines.push(m.clone());
                Ok(())
            })
        }));
        let summary = match result {
            Ok(Ok(summary)) => summary,
            Ok(Err(e)) => return Err(self.failure_of(&e)),
            Err(panic) => return Err(self.trainer_failure(panic_text(panic.as_ref()))),
        };
        self.steps_run += summary.steps_run;
        self.pace.step_done();
        for m in lines {
            self.publish(m);
        }
        if !self.warmed_up && summary.steps_run > 0 {
            self.warmed_up = true;
            self.record_warmup();
            self.handle.set_run_state(RunState::Training);
        }
        if let Some(queue) = self.trainer.queue_stats() {
            self.health.observe_queue(&queue);
            self.handle.publish_queue(queue);
        }
        let step = self.trainer.step_count();
        let remaining = self.trainer.total_steps().saturating_sub(step);
        let eta = self.pace.eta_ms(now_ms(), remaining);
        self.handle.update_run(|r| r.eta_ms = eta);
        let every = self.trainer.config().checkpoint_every;
        if every > 0 && step % every == 0 && self.last_saved_step != Some(step) {
            self.checkpoint().map_err(|e| self.trainer_failure(e))?;
        }
        self.notify_progress();
        Ok(())
    }

    fn publish(&mut self, m: StepMetrics) {
        self.metrics.write(&m, &self.handle);
        // The line before the first step of a fresh run is an evaluation, not a step.
        let trained = m.step > 0 && m.tokens_per_s > 0.0;
        self.handle.publish_metrics(m.clone());
        if trained {
            self.health.observe_step(&m);
        }
    }

    /// Journals each worker's serialized warmup (`WarmupDone` per device and role) and writes
    /// them as the warmup record, under the current environment digest.
    fn record_warmup(&self) {
        let records = self.trainer.warmup_records();
        for r in records {
            self.handle.record_event_logged(
                Severity::Info,
                EventKind::WarmupDone {
                    device: r.device.clone(),
                    role: r.role,
                    duration_ms: r.duration_ms,
                },
            );
        }
        let env_digest = serde_json::from_value(self.handle.fingerprint())
            .ok()
            .map(|fp| hex::encode(digest(&fp)));
        let record = WarmupRecord {
            fingerprint_digest: env_digest,
            devices: records
                .iter()
                .map(|r| WarmupDevice {
                    device: r.device.clone(),
                    role: r.role,
                    duration_ms: r.duration_ms,
                    finished_ms: r.finished_ms,
                })
                .collect(),
        };
        if let Err(e) = record.save(self.handle.run_dir()) {
            tracing::warn!(error = %e, "could not write the warmup record");
        }
    }

    /// Writes a checkpoint of the current step, lists it in status and journals it.
    fn checkpoint(&mut self) -> Result<String, String> {
        let step = self.trainer.step_count();
        let before = self.handle.status_snapshot().run.state;
        self.handle.set_run_state(RunState::Checkpointing);
        let saved = self.trainer.save_checkpoint(&self.cfg.checkpoint_root);
        self.handle.set_run_state(before);
        let dir =
            saved.map_err(|e| format!("writing the checkpoint of step {step} failed: {e}"))?;
        let path = dir.display().to_string();
        if let Some(info) = checkpoints::describe(&dir) {
            if let Err(e) = self.handle.add_checkpoint(info) {
                tracing::error!(error = %e, "journaling checkpoint {path} failed");
            }
        }
        self.handle
            .set_checkpoints(checkpoints::on_disk(&self.cfg.checkpoint_root));
        self.last_saved_step = Some(step);
        Ok(path)
    }

    /// Saves what is unsaved, journals why the run stops, and returns the ending with the
    /// sentence for an operator's stop command.
    fn finish(&mut self, reason: Reason) -> (Ending, CommandOutcome) {
        let step = self.trainer.step_count();
        self.handle.set_run_state(RunState::Stopping);
        let checkpoint = if step > 0 && self.last_saved_step != Some(step) {
            match self.checkpoint() {
                Ok(path) => Some(path),
                Err(error) => {
                    self.journal_failure(&self.trainer_failure(error.clone()));
                    let stopped = format!("stopping without a final checkpoint: {error}");
                    self.journal_stop(&stopped, None);
                    self.handle.set_run_state(RunState::Failed);
                    return (
                        Ending::Failed {
                            error: error.clone(),
                        },
                        Err(error),
                    );
                }
            }
        } else {
            self.handle.checkpoints().last().map(|c| c.path.clone())
        };
        let (text, ending) = match reason {
            Reason::Complete => (
                format!(
                    "{TRAINING_COMPLETE}: {} epochs, {step} steps",
                    self.trainer.config().epochs
                ),
                Ending::Finished {
                    checkpoint: checkpoint.clone(),
                },
            ),
            Reason::StepLimit(n) => (
                format!("--max-steps {n} reached at step {step}"),
                Ending::StepLimit {
                    checkpoint: checkpoint.clone(),
                },
            ),
            Reason::Signal(s) => (
                format!("{} received at step {step}", signals::name(s)),
                Ending::Signal {
                    signal: s,
                    checkpoint: checkpoint.clone(),
                },
            ),
            Reason::Operator(id) => (
                format!("stopped by operator ({id}) at step {step}"),
                Ending::Stopped {
                    action_id: id,
                    checkpoint: checkpoint.clone(),
                },
            ),
            Reason::Shutdown(why) => (
                format!("the daemon shut down ({why}) at step {step}"),
                Ending::Shutdown {
                    checkpoint: checkpoint.clone(),
                },
            ),
        };
        self.journal_stop(&text, checkpoint.clone());
        let finished = matches!(ending, Ending::Finished { .. });
        self.handle.set_run_state(if finished {
            RunState::Finished
        } else {
            RunState::Stopping
        });
        let outcome = match &checkpoint {
            Some(path) if self.last_saved_step == Some(step) => Ok(format!(
                "checkpoint of step {step} at {path}; the daemon exits"
            )),
            Some(path) => Ok(format!(
                "nothing to save since the checkpoint at {path}; the daemon exits"
            )),
            None => {
                Ok("no step was taken, so there is nothing to checkpoint; the daemon exits".into())
            }
        };
        (ending, outcome)
    }

    fn kill(&mut self, action_id: String) -> (Ending, CommandOutcome) {
        let step = self.trainer.step_count();
        let lost = match self.handle.checkpoints().last() {
            Some(c) if c.step == step => {
                format!("nothing is lost (checkpoint {} is current)", c.path)
            }
            Some(c) => format!(
                "steps {}..{step} are lost; the last checkpoint is {} (step {})",
                c.step + 1,
                c.path,
                c.step
            ),
            None => format!("all {step} steps are lost; there is no checkpoint"),
        };
        let text =
            format!("killed by operator ({action_id}) at step {step} without a checkpoint: {lost}");
        self.handle.set_run_state(RunState::Stopping);
        self.journal_stop(&text, None);
        (Ending::Killed { action_id }, Ok(text))
    }

    fn journal_stop(&self, reason: &str, checkpoint: Option<String>) {
        tracing::info!(checkpoint = ?checkpoint, "run stopped: {reason}");
        self.handle.record_event_logged(
            Severity::Info,
            EventKind::RunStopped {
                reason: reason.to_string(),
                checkpoint,
            },
        );
    }

    fn failure_of(&self, e: &TrainError) -> StepFailure {
        StepFailure::of(e, &self.cfg.device)
    }

    fn trainer_failure(&self, error: String) -> StepFailure {
        StepFailure::trainer(error, &self.cfg.device)
    }

    fn journal_failure(&self, failure: &StepFailure) {
        tracing::error!("{} failed: {}", failure.subject, failure.error);
        self.handle.record_event_logged(
            Severity::Crit,
            EventKind::WorkerFailed {
                device: failure.device.clone(),
                error: failure.error.clone(),
                role: failure.role,
                rank: failure.rank,
            },
        );
    }

    /// Holds the run after a failure: never trains on, keeps status up, waits for a stop.
    fn pause(mut self, failure: StepFailure) -> Ending {
        let step = self.trainer.step_count();
        let last = self.handle.checkpoints().last().cloned();
        let kept = match &last {
            Some(c) => format!(
                "the last checkpoint (step {}, {}) is intact",
                c.step, c.path
            ),
            None => "there is no checkpoint yet".to_string(),
        };
        let reason = format!(
            "step {} failed in {}: {}. Training is paused and will not continue by itself; \
             {kept}. Restart dflashd to resume from it (stop this one with `dflash-tui stop` and \
             `dflash-tui confirm-stop`, or SIGTERM)",
            step + 1,
            failure.subject,
            failure.error
        );
        self.journal_failure(&failure);
        let error = failure.error;
        self.handle.set_run_state(RunState::Paused);
        self.handle.record_event_logged(
            Severity::Crit,
            EventKind::RunPaused {
                reason: reason.clone(),
            },
        );
        eprintln!("dflashd: {reason}");
        notify::status(&format!("paused: step {} failed", step + 1));
        self.health.set_run_alert(Some(Alert {
            detector: "run".into(),
            level: Severity::Crit,
            since_ms: now_ms(),
            message: reason,
            preceded_by: Vec::new(),
        }));
        let last_path = last.map(|c| c.path);
        let stopped = |how: &str| {
            format!("{how} while paused after a failed step; no new checkpoint (the trainer's state after a failure is not trusted)")
        };
        loop {
            std::thread::sleep(Duration::from_millis(100));
            self.health.poll(false);
            let how = if let Some(s) = signals::received() {
                format!("{} received", signals::name(s))
            } else {
                match self.commands.try_recv() {
                    Ok(
                        RunCommand::Stop { action_id, reply }
                        | RunCommand::Kill { action_id, reply },
                    ) => {
                        let text = stopped(&format!("stopped by operator ({action_id})"));
                        let _ = reply.send(Ok(match &last_path {
                            Some(p) => format!("{text}; the last checkpoint is {p}"),
                            None => text.clone(),
                        }));
                        format!("stopped by operator ({action_id})")
                    }
                    Err(_) if self.handle.is_shutdown_requested() => "the daemon shut down".into(),
                    Err(_) => continue,
                }
            };
            self.journal_stop(&stopped(&how), last_path.clone());
            return Ending::Failed { error };
        }
    }

    fn notify_progress(&mut self) {
        if self
            .last_notify
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        self.last_notify = Some(Instant::now());
        let s = self.handle.status_snapshot();
        notify::status(&format!(
            "training: step {}/{}, {:.0} tok/s",
            s.run.step, s.run.total_steps, s.throughput.tokens_per_s
        ));
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into());
    // libtorch errors carry a long C++ backtrace after the first line.
    let first = text.lines().next().unwrap_or_default().trim();
    format!("libtorch error: {first}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::error::WorkerFailed;
    use dflash_shared::metrics::DeviceRole;

    #[test]
    fn a_step_failure_names_the_failing_worker_not_drafter_rank_0() {
        let e = TrainError::Worker(Box::new(WorkerFailed {
            worker: "target worker 1 on cuda:3".into(),
            device: "cuda:3".into(),
            role: DeviceRole::Target,
            rank: 1,
            detail: "CUDA out of memory".into(),
        }));
        let f = StepFailure::of(&e, "cuda:5");
        assert_eq!(
            (f.subject.as_str(), f.device.as_str(), f.role, f.rank),
            (
                "target worker 1 on cuda:3",
                "cuda:3",
                Some(DeviceRole::Target),
                Some(1)
            )
        );
        assert!(f.error.contains("CUDA out of memory"), "{}", f.error);

        let other = StepFailure::of(&TrainError::Topology("the queue closed".into()), "cuda:5");
        assert_eq!(
            (other.subject.as_str(), other.device.as_str(), other.role),
            ("the trainer on cuda:5", "cuda:5", None)
        );
    }

    #[test]
    fn panic_messages_keep_their_first_line() {
        let p: Box<dyn std::any::Any + Send> = Box::new(
            "CUDA out of memory. Tried to allocate 2.00 GiB\nException raised from malloc"
                .to_string(),
        );
        assert_eq!(
            panic_text(p.as_ref()),
            "libtorch error: CUDA out of memory. Tried to allocate 2.00 GiB"
        );
        let p: Box<dyn std::any::Any + Send> = Box::new(3u8);
        assert_eq!(
            panic_text(p.as_ref()),
            "libtorch error: a panic without a message"
        );
    }
}
