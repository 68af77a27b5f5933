//! The trainer: one optimizer step ([`Trainer::train_step`]) and THE training loop
//! ([`Trainer::run`]), the one `dflashd start` runs and the tests drive.
//!
//! One step (spec §2.8b): target features → anchors and labels → drafter forward → chunked
//! weighted CE backward → all-reduce of gradients and Σw → division by the global Σw → clipped
//! AdamW, on the configured [`topology`](crate::train::topology): inline on this thread when one
//! device runs both roles, else target workers feeding data-parallel drafter ranks over
//! hidden-state queues. Each drafter rank's half of the step, where that arithmetic is written
//! out, is [`RankState::step`](crate::train::topology::rank::RankState::step); `train_step`
//! hands it the micro-batches and assembles the step's metrics.
//!
//! The loop asks [`Cadence`] when to evaluate and checkpoint, and its driver ([`RunHooks`])
//! whether to go on; it reports every line through the same hooks.
//!
//! A trainer is built in one step ([`Trainer::build`] from a [`TrainerSpec`]: MFU peaks,
//! online prompts, the job of a node; `trainer/build.rs`). What changes it afterwards is an
//! operation on its state, never a setting: a warm start (`warm_start.rs`) or a restore
//! (`resume.rs`).
//!
//! Everything random is a pure function of the seed and the data position (anchors come from
//! per-sample generators), so a resumed run is bit-identical to an uninterrupted one on CPU and
//! the number of workers never changes which anchors a sample gets.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use dflash_shared::metrics::{
    Dflash2StepMetrics, DominoStepMetrics, DsparkStepMetrics, OnlineAcceptance, QueueStats,
    StepMetrics, StepTimes,
};
use tch::{nn::VarStore, Device, Tensor};

use super::best_checkpoint::BestSoFar;
use super::cadence::Cadence;
use super::checkpoint;
use super::config::TrainConfig;
use super::domino::lambda_base;
use super::dspark::DsparkLossWeights;
use super::error::TrainError;
use super::eval::{evaluate, EvalOptions, EvalReport};
use super::loader::DataPosition;
use super::micro::MicroSource;
use super::replica::StepSchedule;
use super::schedule::WarmupCosine;
use crate::data::{HoldoutSplit, Sample};
use crate::device;
use crate::device::torch_panic::panic_text;
use crate::model::drafter::{Drafter, DrafterConfig};
use crate::model::target::TargetModel;
use crate::train::online_prompts::OnlinePrompts;
use crate::train::throughput::DevicePeaks;
use crate::train::topology::pipeline::produce_item;
use crate::train::topology::rank::{RankReport, RankState};
use crate::train::topology::step::{step_telemetry, MicroBatchAssignment, WorkerNames};
use crate::train::topology::{Cluster, QueueMonitor, TopologySpec, WorkerFailure, WorkerWarmup};

/// Token id used to pad rows (loss mask 0, after every real token, so causal features of real
/// positions never see it).
pub const PAD_ID: i64 = 0;

pub struct Trainer {
    cfg: TrainConfig,
    target: TargetModel,
    drafter_cfg: DrafterConfig,
    /// Drafter rank 0, trained on the calling thread (the only rank when inline).
    /// `pub(super)`: a warm start (`warm_start.rs`) and a restore (`resume.rs`) write its
    /// weights and optimizer state.
    pub(super) rank0: RankState,
    schedule: WarmupCosine,
    samples: Arc<Vec<Sample>>,
    split: HoldoutSplit,
    source: Arc<MicroSource>,
    /// Optimizer steps taken. `pub(super)`: a restore (`resume.rs`) sets it, a warm start
    /// (`warm_start.rs`) checks it is 0.
    pub(super) step: u64,
    /// Global index of the next micro-batch to train (the data position). `pub(super)`: a
    /// restore (`resume.rs`) sets it.
    pub(super) cursor: u64,
    /// [`data_digest`] of the samples, which a checkpoint records and a resume compares.
    data_digest: String,
    /// The job's micro-batch assignment: this process's drafter ranks, or every drafter worker
    /// of every node when this trainer is one node of a data-parallel job ([`TrainerSpec::job`]).
    assignment: MicroBatchAssignment,
    /// Rank 0's global rank in [`Self::assignment`] (0 unless this is node 1.. of a job).
    rank0_global: usize,
    topology: TopologySpec,
    /// The worker threads; `None` when one device runs both roles inline. `pub(super)`: a
    /// warm start (`warm_start.rs`) and a restore (`resume.rs`) copy rank 0's state to the
    /// other ranks through it.
    pub(super) cluster: Option<Cluster>,
    warmup: Option<Vec<WorkerWarmup>>,
    /// Set by the first worker failure: every later step returns it.
    failure: Option<WorkerFailure>,
    /// Each device's dense peak, for the steps' MFU ([`TrainerSpec::device_peaks`]).
    device_peaks: DevicePeaks,
    /// The online evaluation's prompts ([`TrainerSpec::online_prompts`]).
    online_prompts: Option<OnlinePrompts>,
    /// Asked after every checkpoint this trainer writes (a node of a job compares its state
    /// with the other nodes'); `None` for one process.
    checkpoint_witness: Option<CheckpointWitness>,
    /// This node's rank and the job's node count, for a node of a job ([`TrainerSpec::job`]).
    job_node: Option<(u32, u32)>,
    /// The run's best checkpoint so far (`train/best_checkpoint.rs`). `pub(super)`: a
    /// checkpoint records it and a restore (`resume.rs`) sets it.
    pub(super) best: Option<BestSoFar>,
    /// How far behind the next slowest node a node's own work must be for the job's view to
    /// name it the straggler ([`JobMembership::straggler_behind_frac`]).
    straggler_behind_frac: f64,
}

pub use nodes::{CheckpointWitness, JobMembership, OpenGroup};

/// The multi-node side: joining a job, the per-step job view, the checkpoint witness.
mod nodes;

pub use build::TrainerSpec;

/// Building a trainer: its spec, the checks, the replicas and workers, the schedule.
mod build;

/// Writing and restoring the trainer's checkpoints.
mod checkpointing;

/// The online evaluation between steps: speculative decoding against the target.
mod online_eval;

/// A fresh run's drafter initialised from another drafter's weights.
mod warm_start;

impl Trainer {
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }
    /// The run's best checkpoint so far, by online DDTree τ at the serving budget.
    pub fn best_checkpoint(&self) -> Option<BestSoFar> {
        self.best
    }
    pub fn drafter_config(&self) -> &DrafterConfig {
        &self.drafter_cfg
    }
    /// Drafter rank 0 (every rank holds the same weights).
    pub fn drafter(&self) -> &Drafter {
        self.rank0.replica.drafter()
    }
    pub fn target(&self) -> &TargetModel {
        &self.target
    }
    pub fn var_store(&self) -> &VarStore {
        &self.rank0.replica.vs
    }
    pub fn topology(&self) -> &TopologySpec {
        &self.topology
    }
    /// Every device the run trains on, targets first (each once; [`TopologySpec::devices`]).
    pub fn devices(&self) -> Vec<Device> {
        self.topology.devices()
    }
    /// Drafter replicas (data-parallel ranks).
    pub fn drafter_ranks(&self) -> usize {
        self.assignment.ranks
    }
    /// Micro-batches (of `batch_size` sequences) per optimizer step, over all ranks.
    pub fn micro_batches_per_step(&self) -> u64 {
        self.assignment.micro_per_step()
    }
    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        self.step
    }
    pub fn total_steps(&self) -> u64 {
        self.schedule.total_steps
    }
    pub fn is_finished(&self) -> bool {
        self.step >= self.schedule.total_steps
    }
    pub fn data_position(&self) -> DataPosition {
        self.source.position_of(self.cursor)
    }

    /// The epoch the next step trains on, counted from 1 as operators do; the last epoch once
    /// the run is complete.
    pub fn epoch_in_progress(&self) -> u32 {
        (self.data_position().epoch + 1).min(self.config().training.epochs)
    }

    pub fn split(&self) -> &HoldoutSplit {
        &self.split
    }

    /// The learning-rate schedule: a checkpoint records it, a restore checks it (`resume.rs`).
    pub(super) fn schedule(&self) -> &WarmupCosine {
        &self.schedule
    }
    /// The training micro-batches: a restore maps the checkpoint's data position to a cursor.
    pub(super) fn source(&self) -> &MicroSource {
        &self.source
    }
    /// [`data_digest`] of the samples: a checkpoint records it, a restore compares it.
    pub(super) fn data_digest(&self) -> &str {
        &self.data_digest
    }
    /// The job's micro-batch assignment: a checkpoint records its global batch, a restore
    /// compares it.
    pub(super) fn assignment(&self) -> MicroBatchAssignment {
        self.assignment
    }
    /// The online evaluation's prompts (`online_eval.rs`); `None`: no online evaluation.
    pub(super) fn online_prompts(&self) -> Option<&OnlinePrompts> {
        self.online_prompts.as_ref()
    }
    /// fp32 weights by HF key (what checkpoints and exports hold), of rank 0.
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        self.rank0.replica.optimizer().master_weights()
    }

    /// Copies of every rank's fp32 master weights, rank 0 first (they must be identical).
    pub fn replica_weights(&mut self) -> Result<Vec<Vec<(String, Tensor)>>, TrainError> {
        let own = self
            .master_weights()
            .into_iter()
            .map(|(n, t)| (n, t.to_device(Device::Cpu).copy()))
            .collect();
        let mut all = vec![own];
        if let Some(c) = self.cluster.as_mut() {
            all.extend(c.replica_weights()?);
        }
        Ok(all)
    }

    /// Hidden-state queue statistics (all drafter ranks' queues together); `None` when the
    /// topology runs inline and has no queue.
    pub fn queue_stats(&self) -> Option<QueueStats> {
        self.queue_monitor().map(|m| m.stats())
    }

    /// A handle that reads queue statistics from another thread while training runs.
    pub fn queue_monitor(&self) -> Option<QueueMonitor> {
        self.cluster.as_ref().map(Cluster::queue_monitor)
    }

    /// Each worker's serialized warmup, once [`Self::warmup`] ran (the first step runs it).
    pub fn warmup_records(&self) -> &[WorkerWarmup] {
        self.warmup.as_deref().unwrap_or(&[])
    }

    /// Which SDPA kernel each attention call site gets on each warmed-up worker's device (read
    /// from libtorch at the sites' shapes in the device's compute dtype; `crate::model::sdpa`). Empty
    /// before the warmup ran.
    pub fn sdpa_backends(&self) -> Vec<crate::model::sdpa::WorkerSdpa> {
        let workers: Vec<_> = self
            .warmup_records()
            .iter()
            .filter_map(|r| device::parse(&r.device).ok().map(|d| (d, r.role)))
            .collect();
        crate::model::sdpa::worker_backends(&workers, self.drafter_config(), self.target().config())
    }

    /// Runs the serialized warmup if it has not run: every worker's first forward (target) or
    /// forward+backward (drafter), one device at a time, on the next micro-batch to train;
    /// nothing is learned from it.
    pub fn warmup(&mut self) -> Result<&[WorkerWarmup], TrainError> {
        if self.warmup.is_none() {
            let records = self.run_warmup().map_err(|e| self.note_failure(e))?;
            self.warmup = Some(records);
        }
        Ok(self.warmup_records())
    }

    fn run_warmup(&mut self) -> Result<Vec<WorkerWarmup>, TrainError> {
        if let Some(f) = &self.failure {
            return Err(f.to_error());
        }
        let seq = self.cursor;
        match self.cluster.as_mut() {
            Some(c) => c.warmup(&mut self.rank0, seq),
            None => {
                let (target, source, rank0) = (&self.target, &self.source, &mut self.rank0);
                let request = self.drafter_cfg.feature_request();
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let item = produce_item(target, source, &request, seq, rank0.id.device, 0)?;
                    let ms = rank0.warmup(item.target_states(), &item.micro);
                    Ok::<_, String>(item.timing.data_ms + item.timing.target_ms + ms)
                }))
                .unwrap_or_else(|p| Err(panic_text(p.as_ref())));
                match outcome {
                    Ok(ms) => Ok(vec![WorkerWarmup::new(rank0.id, ms)]),
                    Err(detail) => Err(WorkerFailure {
                        worker: rank0.id,
                        detail,
                    }
                    .to_error()),
                }
            }
        }
    }

    /// Remembers a worker failure so no later step runs on fewer devices.
    fn note_failure(&mut self, e: TrainError) -> TrainError {
        if self.failure.is_none() {
            let inline_failure = match &e {
                TrainError::Worker(failed) => Some(WorkerFailure {
                    worker: self.rank0.id,
                    detail: failed.detail.clone(),
                }),
                _ => None,
            };
            self.failure = self
                .cluster
                .as_ref()
                .and_then(Cluster::failure)
                .or(inline_failure);
        }
        e
    }

    /// The inline step: the calling thread builds each micro-batch, runs the target and then
    /// the drafter on it; no thread, no queue, no copy.
    fn inline_step(
        &mut self,
        base: u64,
        lr: f64,
        schedule: StepSchedule,
    ) -> Result<Vec<RankReport>, TrainError> {
        let seqs = self.assignment.rank_seqs(base, self.rank0_global);
        let (target, source, rank0) = (&self.target, &self.source, &mut self.rank0);
        let request = self.drafter_cfg.feature_request();
        let id = rank0.id;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            rank0.step(&seqs, lr, schedule, &mut |seq| {
                produce_item(target, source, &request, seq, id.device, 0).map(|item| (item, 0.0))
            })
        }))
        .unwrap_or_else(|p| Err(panic_text(p.as_ref())));
        outcome
            .map(|r| vec![r])
            .map_err(|detail| WorkerFailure { worker: id, detail }.to_error())
    }

    /// One optimizer step over `ranks × grad_accum` micro-batches. Returns the step's metrics
    /// (no τ). A worker failure is returned now and by every later call.
    pub fn train_step(&mut self) -> Result<StepMetrics, TrainError> {
        self.warmup()?;
        if let Some(f) = &self.failure {
            return Err(f.to_error());
        }
        let start = Instant::now();
        let base = self.cursor;
        let n = self.assignment.micro_per_step();
        let lr = self.schedule.lr(self.step);
        let schedule = self.step_schedule();
        let end = base + self.schedule.total_steps.saturating_sub(self.step) * n;
        let result = match self.cluster.as_mut() {
            Some(c) => c.step(&mut self.rank0, base, lr, schedule, end),
            None => self.inline_step(base, lr, schedule),
        };
        let mut reports = result.map_err(|e| self.note_failure(e))?;
        // The micro-batches are consumed even if the update is refused (non-finite gradients),
        // as they were before topologies existed.
        self.cursor = base + n;
        let first = reports.remove(0);
        let report = first.optim?;
        self.step += 1;
        let wall_ms = start.elapsed().as_secs_f64() * 1e3;
        let mut timings = vec![first.timing];
        let mut epoch = first.last_epoch;
        for r in reports {
            timings.push(r.timing);
            epoch = epoch.max(r.last_epoch);
        }
        let names = match &self.cluster {
            Some(c) => c.names().clone(),
            None => WorkerNames {
                targets: vec![device::name(self.rank0.id.device)],
                drafters: vec![device::name(self.rank0.id.device)],
                inline: true,
            },
        };
        let secs = (wall_ms / 1e3).max(1e-9);
        let telemetry = step_telemetry(&names, &timings, wall_ms, &self.device_peaks);
        let tokens_per_s = telemetry.tokens as f64 / secs;
        let draft_positions_per_s = telemetry.draft_positions as f64 / secs;
        let job = self.job_view(tokens_per_s, draft_positions_per_s, &telemetry.times)?;
        Ok(StepMetrics {
            ts_ms: dflash_shared::clock::now_ms(),
            step: self.step,
            // Operators count epochs from 1 ("epoch 3 / 6"); the data position counts from 0.
            epoch: epoch + 1,
            loss: first.sums.loss(),
            accuracy: first.sums.accuracy(),
            tau: None,
            tau_tree: None,
            lr,
            grad_norm: report.grad_norm,
            tokens_per_s,
            draft_positions_per_s,
            mfu: telemetry.mfu,
            workers: telemetry.workers,
            times: telemetry.times,
            online: None,
            domino: self.drafter_cfg.head.domino().map(|_| DominoStepMetrics {
                lambda_base: schedule.lambda_base,
                final_loss: first.sums.final_loss(),
                base_loss: first.sums.base_loss(),
                accept_len: first.sums.accept_len(),
                base_accept_len: first.sums.base_accept_len(),
            }),
            dspark: self.drafter_cfg.head.dspark().map(|head| {
                let m = first.sums.dspark_metrics();
                let confidence = head.confidence_head;
                DsparkStepMetrics {
                    ce_loss: m.ce_loss,
                    l1_loss: m.l1_loss,
                    confidence_loss: m.confidence_loss,
                    tau_probabilistic: m.tau_probabilistic,
                    base_tau_probabilistic: m.base_tau_probabilistic,
                    acceptance_mean: m.accept_probability_mean,
                    confidence_mean: confidence.then_some(m.confidence_mean),
                    confidence_abs_error: confidence.then_some(m.confidence_abs_error),
                }
            }),
            dflash2: self.drafter_cfg.head.dflash2().map(|_| {
                let m = first.sums.dflash2.metrics(first.sums.normaliser);
                Dflash2StepMetrics {
                    selector_alpha: schedule.selector_alpha,
                    base_loss: m.base_loss,
                    selector_loss: m.selector_loss,
                    unary_topk_recall: m.unary_topk_recall,
                    oracle_accepted_length: m.oracle_accepted_length,
                    serving_accuracy: m.serving_accuracy,
                    serving_accepted_length: m.serving_accepted_length,
                    unary_accepted_length: m.unary_accepted_length,
                }
            }),
            job,
        })
    }

    /// The scheduled weights of the next step: Domino's λ and DFlash2's α_eff.
    pub fn step_schedule(&self) -> StepSchedule {
        StepSchedule {
            lambda_base: self.lambda_base(),
            selector_alpha: match self.drafter_cfg.head.dflash2() {
                Some(_) => self
                    .cfg
                    .training
                    .dflash2
                    .effective_alpha(self.step, self.schedule.total_steps),
                None => 0.0,
            },
        }
    }

    /// Domino's curriculum weight for the next step (`train/domino.rs::lambda_base` at the
    /// steps done of the schedule's total); 0 for a DFlash drafter.
    pub fn lambda_base(&self) -> f64 {
        match self.drafter_cfg.head.domino() {
            Some(_) => lambda_base(
                self.step,
                self.schedule.total_steps,
                self.cfg.training.lambda_base_start,
                self.cfg.training.lambda_base_decay_ratio,
            ),
            None => 0.0,
        }
    }

    pub fn eval_options(&self) -> EvalOptions {
        let bs = self.drafter_cfg.block_size as usize;
        EvalOptions {
            anchors_per_forward: self.cfg.training.eval_anchors_per_forward,
            rows_per_forward: self.cfg.training.batch_size,
            gamma: self.cfg.gamma_for(bs),
            rule: self.cfg.label_mask_rule(),
            chunk_positions: self.cfg.training.loss_chunk_positions as i64,
            backend: self.cfg.training.attention,
            dpace_alpha: self.cfg.training.dpace_alpha,
            dpace_normalization: self.cfg.training.dpace_normalization,
            tree_budgets: self.cfg.training.online_eval_tree_budgets.clone(),
            serve_tree_budget: Some(self.cfg.training.serve_tree_budget),
            tree_block_subsample: self.cfg.training.eval_tree_block_subsample,
            dspark: DsparkLossWeights::from(&self.cfg.training.dspark),
            selector_alpha: self.cfg.training.dflash2.selector_loss_alpha,
        }
    }

    /// Evaluates on the held-out split (`None` when nothing is held out).
    pub fn evaluate_held_out(&self) -> Result<Option<EvalReport>, TrainError> {
        let limit = if self.cfg.training.eval_max_samples == 0 {
            usize::MAX
        } else {
            self.cfg.training.eval_max_samples
        };
        let held: Vec<&Sample> = self
            .split
            .eval
            .iter()
            .take(limit)
            .map(|&i| &self.samples[i])
            .collect();
        if held.is_empty() {
            return Ok(None);
        }
        evaluate(&self.target, self.drafter(), &held, &self.eval_options()).map(Some)
    }

    /// THE training loop, the one production runs and the tests drive. Before the first step
    /// of a fresh run it evaluates; then, until the schedule ends, `opts.max_steps` more steps
    /// were taken or `hooks` says stop: one optimizer step ([`Self::train_step`]), an
    /// evaluation when [`Cadence::eval_due`], a checkpoint when [`Cadence::checkpoint_due`].
    /// When it ends it saves what is unsaved (unless the stop said not to).
    ///
    /// An `Err` is a failed step or cadence checkpoint: the run must not continue. A failed
    /// final checkpoint is not an `Err`: it is [`RunSummary::final_checkpoint`].
    pub fn run(
        &mut self,
        opts: &RunOptions,
        hooks: &mut dyn RunHooks,
    ) -> Result<RunSummary, TrainError> {
        let cadence = Cadence::of(&self.cfg);
        let mut summary = RunSummary::default();
        let mut last_saved = match &opts.checkpoint_root {
            Some(root) => checkpoint::list(root)?
                .iter()
                .any(|(s, _)| *s == self.step)
                .then_some(self.step),
            None => None,
        };
        if cadence.eval_before_start(self.step) {
            if let Some(report) = self.evaluate_held_out()? {
                // No online evaluation here: an untrained drafter's drafts are all rejected
                // (online τ 1 by construction), and a baseline would cost every start seconds.
                let line = self.eval_line(report);
                hooks.on_event(self, LoopEvent::Evaluated(&line));
                summary.first_eval = Some(line.report);
            }
        }
        let (end, save_at_end) = loop {
            if let Next::Stop { checkpoint } = hooks.next(self) {
                break (LoopEnd::Stopped, checkpoint);
            }
            if self.is_finished() {
                break (LoopEnd::Complete, true);
            }
            if let Some(limit) = opts.max_steps.filter(|&m| summary.steps_run >= m) {
                break (LoopEnd::StepLimit(limit), true);
            }
            let mut metrics = self.train_step()?;
            summary.steps_run += 1;
            if cadence.eval_due(self.step, self.is_finished()) {
                if let Some(report) = self.evaluate_held_out()? {
                    metrics.tau = Some(report.tau);
                    metrics.tau_tree = report.tree_oracle_tau();
                    summary.last_eval = Some(report);
                }
            }
            if cadence.online_eval_due(self.step, self.is_finished()) {
                metrics.online = self.evaluate_online(metrics.tau)?;
            }
            let new_best = self.judge_best(metrics.online.as_ref());
            hooks.on_event(self, LoopEvent::Stepped(&metrics));
            summary.last_metrics = Some(metrics);
            if let Some(root) = &opts.checkpoint_root {
                // A new best is saved at its own step: the cadence may not land on it.
                if cadence.checkpoint_due(self.step, last_saved)
                    || (new_best && last_saved != Some(self.step))
                {
                    let dir = self.checkpoint_with(root, hooks).map_err(|e| {
                        TrainError::CheckpointWrite {
                            step: self.step,
                            cause: Box::new(e),
                        }
                    })?;
                    summary.last_checkpoint = Some(dir);
                    last_saved = Some(self.step);
                }
            }
        };
        summary.end = end;
        if let Some(root) = &opts.checkpoint_root {
            if save_at_end && cadence.final_checkpoint_due(self.step, last_saved) {
                let saved = self.checkpoint_with(root, hooks);
                if let Ok(dir) = &saved {
                    summary.last_checkpoint = Some(dir.clone());
                }
                summary.final_checkpoint = Some(saved);
            }
        }
        summary.final_step = self.step;
        summary.finished = self.is_finished();
        Ok(summary)
    }

    /// Makes this step the best when its online evaluation beats the best so far
    /// (`BestSoFar::beats`); whether it did.
    fn judge_best(&mut self, online: Option<&OnlineAcceptance>) -> bool {
        let candidate = online
            .and_then(|o| BestSoFar::candidate(self.step, o, self.cfg.training.serve_tree_budget));
        match candidate {
            Some(c) if c.beats(self.best.as_ref()) => {
                self.best = Some(c);
                true
            }
            _ => false,
        }
    }

    /// Writes a checkpoint of the current step, telling `hooks` before and after.
    fn checkpoint_with(
        &mut self,
        root: &Path,
        hooks: &mut dyn RunHooks,
    ) -> Result<PathBuf, TrainError> {
        hooks.on_event(self, LoopEvent::CheckpointStarted { step: self.step });
        let dir = self.save_checkpoint(root)?;
        if let Some(witness) = self.checkpoint_witness.as_mut() {
            let weights = self.rank0.replica.optimizer().master_weights();
            witness(self.step, &weights).map_err(|detail| {
                TrainError::Topology(format!("checkpoint step {}: {detail}", self.step))
            })?;
        }
        hooks.on_event(
            self,
            LoopEvent::CheckpointSaved {
                step: self.step,
                dir: &dir,
                is_best: self.best.is_some_and(|b| b.step == self.step),
            },
        );
        Ok(dir)
    }

    /// An evaluation outside a training step (before the first step).
    fn eval_line(&self, report: EvalReport) -> EvalLine {
        EvalLine {
            ts_ms: dflash_shared::clock::now_ms(),
            step: self.step,
            epoch: self.epoch_in_progress(),
            lr: self.schedule.lr(self.step),
            report,
            online: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Optimizer steps to take in this call at most.
    pub max_steps: Option<u64>,
    /// Where checkpoints go (`None`: no checkpoints).
    pub checkpoint_root: Option<PathBuf>,
}

/// What the loop asks its driver before every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Train,
    /// End the loop now; `checkpoint: false` leaves the unsaved steps unsaved (a kill).
    Stop {
        checkpoint: bool,
    },
}

/// What the loop tells its driver, in the order it happens.
///
/// Online acceptance has no event of its own: like offline τ it rides on the line of the
/// moment it was measured at (`StepMetrics::online`, `EvalLine::online`), so the metrics file
/// keeps one line per step and every consumer of `Stepped` and `Evaluated` sees it.
#[derive(Debug)]
pub enum LoopEvent<'a> {
    /// An evaluation that is not part of a step (before the first step of a fresh run);
    /// `online` is set when the online evaluation ran with it.
    Evaluated(&'a EvalLine),
    /// An optimizer step; `tau` (and `tau_tree`, the same evaluation's tree oracle) is set when
    /// the cadence evaluated after it, `online` when the online cadence
    /// ([`Cadence::online_eval_due`]) did.
    Stepped(&'a StepMetrics),
    CheckpointStarted {
        step: u64,
    },
    CheckpointSaved {
        step: u64,
        dir: &'a Path,
        /// This checkpoint is the run's best ([`Trainer::best_checkpoint`]): its step's online
        /// evaluation beat every earlier one. Only the checkpoint of the step that set the best
        /// says so, once.
        is_best: bool,
    },
}

/// The narrow interface between the loop and whoever runs it: the daemon (which publishes,
/// journals and answers operators) or a test.
pub trait RunHooks {
    /// Asked before every step; the loop's own ends (schedule done, `max_steps`) come after.
    fn next(&mut self, _trainer: &Trainer) -> Next {
        Next::Train
    }
    fn on_event(&mut self, trainer: &Trainer, event: LoopEvent<'_>);
}

/// Hooks that only collect what the loop reports: every metrics line, evaluations first
/// (for tests, examples and tools that run the loop without a daemon).
#[derive(Debug, Default)]
pub struct CollectLines {
    pub evals: Vec<EvalLine>,
    pub steps: Vec<StepMetrics>,
    pub checkpoints: Vec<PathBuf>,
}

impl RunHooks for CollectLines {
    fn on_event(&mut self, _trainer: &Trainer, event: LoopEvent<'_>) {
        match event {
            LoopEvent::Evaluated(line) => self.evals.push(line.clone()),
            LoopEvent::Stepped(m) => self.steps.push(m.clone()),
            LoopEvent::CheckpointStarted { .. } => {}
            LoopEvent::CheckpointSaved { dir, .. } => self.checkpoints.push(dir.to_path_buf()),
        }
    }
}

/// The evaluation line: held-out loss, accuracy and τ at a step, outside any training step.
#[derive(Debug, Clone)]
pub struct EvalLine {
    pub ts_ms: i64,
    pub step: u64,
    /// Counted from 1.
    pub epoch: u32,
    /// The learning rate the next step will use.
    pub lr: f64,
    pub report: EvalReport,
    /// The online evaluation of the same moment, when one ran (the training loop runs none
    /// before the first step); `offline_tau` in it is `report.tau`.
    pub online: Option<OnlineAcceptance>,
}

impl EvalLine {
    /// As a `metrics.jsonl` / bus line: no throughput, no gradient, `tau` and `tau_tree` set
    /// (and the online figures, when the online evaluation ran with it).
    pub fn metrics_line(&self) -> StepMetrics {
        StepMetrics {
            ts_ms: self.ts_ms,
            step: self.step,
            epoch: self.epoch,
            loss: self.report.loss,
            accuracy: self.report.accuracy,
            tau: Some(self.report.tau),
            tau_tree: self.report.tree_oracle_tau(),
            lr: self.lr,
            grad_norm: 0.0,
            tokens_per_s: 0.0,
            draft_positions_per_s: 0.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online: self.online.clone(),
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        }
    }
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoopEnd {
    /// The schedule's last step is done.
    #[default]
    Complete,
    /// `max_steps` steps were taken in this call.
    StepLimit(u64),
    /// The hooks said stop.
    Stopped,
}

#[derive(Debug, Default)]
pub struct RunSummary {
    pub end: LoopEnd,
    pub steps_run: u64,
    pub final_step: u64,
    pub finished: bool,
    pub first_eval: Option<EvalReport>,
    pub last_eval: Option<EvalReport>,
    pub last_metrics: Option<StepMetrics>,
    /// The newest checkpoint this call wrote.
    pub last_checkpoint: Option<PathBuf>,
    /// The save at the end of the loop, when one was due: where it went, or why it failed.
    pub final_checkpoint: Option<Result<PathBuf, TrainError>>,
}
