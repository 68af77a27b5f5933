//! The daemon's side of the engine's one training loop ([`Trainer::run`]): this file is the
//! [`RunHooks`] the loop is driven through, plus what happens when the loop ends.
//!
//! Each line the loop reports goes to the bus (`metrics` subscribers), the status snapshot,
//! the `metrics.jsonl` file and the health detectors (for the evaluation line before the first
//! step, only the serve-gap detector: it has τ figures but no throughput). Online acceptance
//! rides on these lines (`StepMetrics::online`), so it takes exactly the path offline τ takes. Before each step the hooks
//! answer, in this order: a stop signal (SIGTERM/SIGINT: checkpoint, exit 0), a confirmed
//! command (stop: checkpoint, then reply with where it went; kill: no checkpoint), a shutdown
//! of the control plane. The loop itself ends at the end of the schedule and at `--max-steps`,
//! and owns the evaluation and checkpoint cadence.
//!
//! A step or checkpoint that fails (an error, or a libtorch panic such as an OOM) pauses the
//! run: the failure is journaled, the state is Paused with an alert saying why, the last
//! checkpoint is left as it is, and the daemon only waits for a stop. It never trains on.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use dflash_shared::config::{DetectorsSection, DrafterHead};
use dflash_shared::events::{EventKind, Severity, TRAINING_COMPLETE};
use dflash_shared::metrics::StepMetrics;
use dflash_shared::status::{Alert, RunObjective, RunState};

use super::checkpoints;
use super::ending::Ending;
use super::health_feed::HealthFeed;
use super::healthy_record::HealthyRecordKeeper;
use super::metrics_out::MetricsOut;
use super::pace::Pace;
use super::tensorboard::TensorBoardOut;
use super::{notify, signals};
use crate::run::handle::{CommandOutcome, RunCommand, RunHandle};
use crate::telemetry::fingerprint::digest;
use crate::telemetry::warmup::{WarmupDevice, WarmupRecord};
use dflash_engine::device::torch_panic::panic_text;
use dflash_engine::train::{
    EvalLine, LoopEnd, LoopEvent, Next, RunHooks, RunOptions, RunSummary, TrainError, Trainer,
};
use dflash_shared::clock::now_ms;

#[derive(Debug, Clone)]
pub struct RunLoopConfig {
    pub checkpoint_root: PathBuf,
    /// Optimizer steps this process takes at most (`--max-steps`).
    pub max_steps: Option<u64>,
    pub metrics_path: PathBuf,
    /// Where the TensorBoard event files go; `None` when `[tensorboard]` is off.
    pub tensorboard_dir: Option<PathBuf>,
    /// Print a progress line every this many steps (0: only evaluations).
    pub log_every: u64,
    /// "cpu", "cuda:3".
    pub device: String,
    pub detectors: DetectorsSection,
    /// The healthy record this run is judged against and that keeps this run's own.
    pub healthy_record: Option<HealthyRecordKeeper>,
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

/// Why the hooks stopped the loop.
enum Reason {
    Signal(i32),
    Operator(String),
    Shutdown(String),
}

/// A stop the hooks asked for, with the operator's reply channel when a command asked.
struct StopRequest {
    reason: Reason,
    reply: Option<tokio::sync::oneshot::Sender<CommandOutcome>>,
}

pub struct RunLoop {
    trainer: Trainer,
    hooks: DaemonHooks,
}

/// What the daemon does at each point of the loop ([`RunHooks`]).
struct DaemonHooks {
    handle: RunHandle,
    commands: Receiver<RunCommand>,
    health: HealthFeed,
    cfg: RunLoopConfig,
    metrics: MetricsOut,
    pace: Pace,
    last_saved_step: Option<u64>,
    warmed_up: bool,
    last_notify: Option<Instant>,
    /// Set when `next` stopped the loop (a kill is a stop without a checkpoint).
    stop: Option<StopRequest>,
    killed: Option<(String, tokio::sync::oneshot::Sender<CommandOutcome>)>,
    /// The run state a checkpoint interrupted, restored when it is written.
    state_before_checkpoint: Option<RunState>,
}

impl RunLoop {
    pub fn new(
        handle: RunHandle,
        trainer: Trainer,
        commands: Receiver<RunCommand>,
        cfg: RunLoopConfig,
    ) -> Result<Self, String> {
        let mut metrics = MetricsOut::open(&cfg.metrics_path, cfg.log_every, trainer.total_steps())
            .map_err(|e| {
                format!(
                    "opening the metrics file {}: {e}",
                    cfg.metrics_path.display()
                )
            })?;
        if let Some(dir) = &cfg.tensorboard_dir {
            let tensorboard = TensorBoardOut::open(dir, now_ms()).map_err(|e| {
                format!(
                    "opening a TensorBoard event file in {}: {e}; make it writable, set \
                     tensorboard.dir to another directory, or tensorboard.enabled = false",
                    dir.display()
                )
            })?;
            metrics = metrics.with_tensorboard(tensorboard);
        }
        let on_disk = checkpoints::on_disk(&cfg.checkpoint_root);
        let step = trainer.step_count();
        let last_saved_step = on_disk.iter().any(|c| c.step == step).then_some(step);
        handle.set_checkpoints(on_disk);
        handle.set_best_checkpoint(checkpoints::best_standing(&trainer, &cfg.checkpoint_root));
        let mut cfg = cfg;
        // This process's workers: its queue's producers and consumers. On a node of a job
        // `drafter_ranks` counts every node's drafter workers, none of which read this queue.
        let mut health = HealthFeed::new(
            handle.clone(),
            &cfg.detectors,
            trainer.topology().target_devices.len(),
            trainer.topology().drafter_devices.len(),
        );
        if let Some(keeper) = cfg.healthy_record.take() {
            health = health.with_healthy_record(keeper);
        }
        let hooks = DaemonHooks {
            health,
            handle,
            commands,
            cfg,
            metrics,
            pace: Pace::default(),
            last_saved_step,
            warmed_up: false,
            last_notify: None,
            stop: None,
            killed: None,
            state_before_checkpoint: None,
        };
        Ok(RunLoop { trainer, hooks })
    }

    /// Trains until something ends the run; returns why.
    pub fn run(self) -> Ending {
        let RunLoop {
            mut trainer,
            mut hooks,
        } = self;
        let (total, epochs) = (trainer.total_steps(), trainer.config().training.epochs);
        let (step, epoch) = (trainer.step_count(), trainer.epoch_in_progress());
        let training = &trainer.config().training;
        let objective = RunObjective::new(training.objective, training.dpace_alpha)
            .with_dpace_normalization(training.dpace_normalization);
        let head = status_head(&trainer.drafter_config().head);
        hooks.handle.update_run(|r| {
            r.total_steps = total;
            r.epochs = epochs;
            r.step = step;
            r.epoch = epoch;
            r.objective = Some(objective);
            r.drafter_head = Some(head);
        });
        hooks.handle.set_run_state(RunState::WarmingUp);
        hooks.handle.set_queue_monitor(trainer.queue_monitor());
        let opts = RunOptions {
            max_steps: hooks.cfg.max_steps,
            checkpoint_root: Some(hooks.cfg.checkpoint_root.clone()),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| trainer.run(&opts, &mut hooks)));
        match outcome {
            Ok(Ok(summary)) => hooks.finish(&trainer, summary),
            Ok(Err(e)) => {
                let failure = hooks.failure_of(&e);
                hooks.pause(&trainer, failure)
            }
            Err(panic) => {
                let failure = hooks.trainer_failure(panic_text(panic.as_ref()));
                hooks.pause(&trainer, failure)
            }
        }
    }
}

impl RunHooks for DaemonHooks {
    fn next(&mut self, _trainer: &Trainer) -> Next {
        let reason = if let Some(signal) = signals::received() {
            Some((Reason::Signal(signal), None))
        } else {
            match self.commands.try_recv() {
                Ok(RunCommand::Stop { action_id, reply }) => {
                    Some((Reason::Operator(action_id), Some(reply)))
                }
                Ok(RunCommand::Kill { action_id, reply }) => {
                    self.killed = Some((action_id, reply));
                    return Next::Stop { checkpoint: false };
                }
                Ok(RunCommand::ForgetHealthyRecord { reply, .. }) => {
                    let _ = reply.send(self.forget_healthy_record());
                    None
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
            }
        };
        let reason = reason.or_else(|| {
            self.handle.is_shutdown_requested().then(|| {
                let why = self.handle.shutdown_reason().unwrap_or_default();
                (Reason::Shutdown(why), None)
            })
        });
        match reason {
            Some((reason, reply)) => {
                self.handle.set_run_state(RunState::Stopping);
                self.stop = Some(StopRequest { reason, reply });
                Next::Stop { checkpoint: true }
            }
            None => Next::Train,
        }
    }

    fn on_event(&mut self, trainer: &Trainer, event: LoopEvent<'_>) {
        match event {
            LoopEvent::Evaluated(line) => self.publish_eval(line),
            LoopEvent::Stepped(m) => self.after_step(trainer, m),
            LoopEvent::CheckpointStarted { .. } => {
                self.state_before_checkpoint = Some(self.handle.status_snapshot().run.state);
                self.handle.set_run_state(RunState::Checkpointing);
            }
            LoopEvent::CheckpointSaved { step, dir, is_best } => {
                self.checkpoint_saved(step, dir);
                if is_best {
                    self.best_saved(trainer);
                }
            }
        }
    }
}

impl DaemonHooks {
    /// The evaluation before the first step, offline τ and (when it ran) online τ: to the
    /// metrics file, the bus and status like a step's line, and to the serve-gap detector.
    fn publish_eval(&mut self, line: &EvalLine) {
        let m = line.metrics_line();
        self.metrics.write(&m, &self.handle);
        self.health.observe_evaluation(&m);
        self.handle.publish_metrics(m);
    }

    fn after_step(&mut self, trainer: &Trainer, m: &StepMetrics) {
        self.pace.step_done();
        if m.online.is_some() && trainer.best_checkpoint().is_none() {
            // No best yet: the next evaluation that could name one has moved on.
            self.handle.set_best_checkpoint(checkpoints::best_standing(
                trainer,
                &self.cfg.checkpoint_root,
            ));
        }
        self.metrics.write(m, &self.handle);
        self.handle.publish_metrics(m.clone());
        self.health.observe_step(m);
        if !self.warmed_up {
            self.warmed_up = true;
            self.record_warmup(trainer);
            self.handle.set_run_state(RunState::Training);
        }
        if let Some(queue) = trainer.queue_stats() {
            self.health.observe_queue(&queue);
            self.handle.publish_queue(queue);
        }
        let remaining = trainer.total_steps().saturating_sub(trainer.step_count());
        let eta = self.pace.eta_ms(now_ms(), remaining);
        self.handle.update_run(|r| r.eta_ms = eta);
        self.notify_progress();
    }

    /// Journals each worker's serialized warmup (`WarmupDone` per device and role) and writes
    /// them as the run's warmup record, under the current environment digest. This is the one
    /// writer of `warmup.json`.
    fn record_warmup(&self, trainer: &Trainer) {
        let records = trainer.warmup_records();
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
        // Once, on the devices the workers really run on: which SDPA kernel each attention
        // call site gets (issue 12, defect 7; cuDNN is turned off on CUDA, `dflash_engine::model::sdpa`).
        for w in trainer.sdpa_backends() {
            self.handle.record_event_logged(
                Severity::Info,
                EventKind::AttentionKernel {
                    device: w.device,
                    role: w.role,
                    call_site: w.call_site.into(),
                    backend: w.backend.name().into(),
                },
            );
        }
        let env_digest = self.handle.fingerprint().map(|fp| hex::encode(digest(&fp)));
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

    /// Lists a written checkpoint in status and journals it.
    fn checkpoint_saved(&mut self, step: u64, dir: &Path) {
        if let Some(before) = self.state_before_checkpoint.take() {
            self.handle.set_run_state(before);
        }
        let path = dir.display().to_string();
        if let Some(info) = checkpoints::describe(dir) {
            if let Err(e) = self.handle.add_checkpoint(info) {
                tracing::error!(error = %e, "journaling checkpoint {path} failed");
            }
        }
        self.handle
            .set_checkpoints(checkpoints::on_disk(&self.cfg.checkpoint_root));
        self.last_saved_step = Some(step);
    }

    /// The checkpoint just saved is the run's best: status names it and the journal records it.
    fn best_saved(&self, trainer: &Trainer) {
        if let Ok(best) = checkpoints::best_standing(trainer, &self.cfg.checkpoint_root) {
            let words = best.words();
            if let Err(e) = self.handle.add_best_checkpoint(best) {
                tracing::error!(error = %e, "journaling the best checkpoint ({words}) failed");
            }
        }
    }

    /// The loop has ended (after its final checkpoint, when one was due): journals why, and
    /// answers the operator's stop command with where the checkpoint went.
    fn finish(mut self, trainer: &Trainer, summary: RunSummary) -> Ending {
        if let Some((action_id, reply)) = self.killed.take() {
            let (ending, outcome) = self.kill(trainer, action_id);
            let _ = reply.send(outcome);
            return ending;
        }
        let step = trainer.step_count();
        let (reason, reply) = match (summary.end, self.stop.take()) {
            (LoopEnd::Stopped, Some(StopRequest { reason, reply })) => (Some(reason), reply),
            _ => (None, None),
        };
        self.handle.set_run_state(RunState::Stopping);
        let checkpoint = match summary.final_checkpoint {
            Some(Ok(dir)) => Some(dir.display().to_string()),
            Some(Err(e)) => {
                let error = format!("writing the checkpoint of step {step} failed: {e}");
                self.journal_failure(&self.trainer_failure(error.clone()));
                let stopped = format!("stopping without a final checkpoint: {error}");
                self.journal_stop(&stopped, None);
                self.handle.set_run_state(RunState::Failed);
                if let Some(reply) = reply {
                    let _ = reply.send(Err(error.clone()));
                }
                return Ending::Failed { error };
            }
            None => self.handle.checkpoints().last().map(|c| c.path.clone()),
        };
        let (text, ending) = match (summary.end, reason) {
            (LoopEnd::Complete, _) => (
                format!(
                    "{TRAINING_COMPLETE}: {} epochs, {step} steps",
                    trainer.config().training.epochs
                ),
                Ending::Finished {
                    checkpoint: checkpoint.clone(),
                },
            ),
            (LoopEnd::StepLimit(n), _) => (
                format!("--max-steps {n} reached at step {step}"),
                Ending::StepLimit {
                    checkpoint: checkpoint.clone(),
                },
            ),
            (LoopEnd::Stopped, Some(Reason::Signal(s))) => (
                format!("{} received at step {step}", signals::name(s)),
                Ending::Signal {
                    signal: s,
                    checkpoint: checkpoint.clone(),
                },
            ),
            (LoopEnd::Stopped, Some(Reason::Operator(id))) => (
                format!("stopped by operator ({id}) at step {step}"),
                Ending::Stopped {
                    action_id: id,
                    checkpoint: checkpoint.clone(),
                },
            ),
            (LoopEnd::Stopped, Some(Reason::Shutdown(why))) => (
                format!("the daemon shut down ({why}) at step {step}"),
                Ending::Shutdown {
                    checkpoint: checkpoint.clone(),
                },
            ),
            (LoopEnd::Stopped, None) => (
                format!("the loop stopped at step {step}"),
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
        if let Some(reply) = reply {
            let outcome = match &checkpoint {
                Some(path) if self.last_saved_step == Some(step) => Ok(format!(
                    "checkpoint of step {step} at {path}; the daemon exits"
                )),
                Some(path) => Ok(format!(
                    "nothing to save since the checkpoint at {path}; the daemon exits"
                )),
                None => Ok(
                    "no step was taken, so there is nothing to checkpoint; the daemon exits".into(),
                ),
            };
            let _ = reply.send(outcome);
        }
        ending
    }

    fn kill(&mut self, trainer: &Trainer, action_id: String) -> (Ending, CommandOutcome) {
        let step = trainer.step_count();
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
    fn pause(mut self, trainer: &Trainer, failure: StepFailure) -> Ending {
        let step = trainer.step_count();
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
        self.handle.record_event_logged(
            Severity::Crit,
            EventKind::RunPaused {
                reason: reason.clone(),
            },
        );
        eprintln!("dflashd: {reason}");
        notify::status(&format!("paused: step {} failed", step + 1));
        // The alert goes up before the state changes, so that a status that reads "paused"
        // always carries why.
        self.health.set_run_alert(Some(Alert {
            detector: "run".into(),
            level: Severity::Crit,
            since_ms: now_ms(),
            message: reason,
            preceded_by: Vec::new(),
            since_healthy: Vec::new(),
        }));
        self.handle.set_run_state(RunState::Paused);
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
                    Ok(RunCommand::ForgetHealthyRecord { reply, .. }) => {
                        let _ = reply.send(self.forget_healthy_record());
                        continue;
                    }
                    Err(_) if self.handle.is_shutdown_requested() => "the daemon shut down".into(),
                    Err(_) => continue,
                }
            };
            self.journal_stop(&stopped(&how), last_path.clone());
            return Ending::Failed { error };
        }
    }

    /// A confirmed forget of the healthy record: the health feed removes the files it writes.
    fn forget_healthy_record(&mut self) -> CommandOutcome {
        let removed = self
            .health
            .forget_record(dflash_shared::clock::now_ms())
            .map_err(|e| e.to_string())?;
        let files = if removed.is_empty() {
            "no record file was on disk".to_string()
        } else {
            let names: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
            format!("deleted {}", names.join(" and "))
        };
        Ok(format!(
            "healthy record forgotten ({files}); throughput is now judged against this run's own \
             rate"
        ))
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

/// The head the status reports: the console names the loss and the figures by it.
fn status_head(head: &dflash_engine::model::drafter::DrafterHead) -> DrafterHead {
    use dflash_engine::model::drafter::DrafterHead as Built;
    match head {
        Built::Dflash => DrafterHead::Dflash,
        Built::Domino(_) => DrafterHead::Domino,
        Built::Dspark(_) => DrafterHead::Dspark,
        Built::Dflash2(_) => DrafterHead::Dflash2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_engine::train::error::WorkerFailed;

    #[test]
    fn a_dspark_drafter_is_reported_as_dspark() {
        use dflash_engine::model::drafter::{DrafterHead as Built, DsparkConfig, MarkovHeadType};
        let dspark = Built::Dspark(DsparkConfig {
            markov_rank: 4,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head: false,
            confidence_head_with_markov: false,
        });
        assert_eq!(status_head(&dspark), DrafterHead::Dspark);
        assert_eq!(status_head(&Built::Dflash), DrafterHead::Dflash);
    }
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
}
