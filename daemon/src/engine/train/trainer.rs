//! The training loop: target features → anchors and labels → drafter forward → chunked
//! weighted CE backward → global Σw normalisation → clipped AdamW step (spec §2.8b), on the
//! configured topology ([`crate::runtime::topology`]): inline on one device, or target workers
//! feeding data-parallel drafter ranks over hidden-state queues.
//!
//! Everything random is a pure function of the seed and the data position (anchors come from
//! per-sample generators), so a resumed run is bit-identical to an uninterrupted one on CPU and
//! the number of workers never changes which anchors a sample gets.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dflash_shared::metrics::{DeviceRole, QueueStats, StepMetrics, StepTimes};
use tch::{nn::VarStore, Device, Kind, Tensor};

use super::config::TrainConfig;
use super::error::TrainError;
use super::eval::{evaluate, EvalOptions, EvalReport};
use super::loader::{fingerprint, split_held_out, DataPosition};
use super::micro::{MicroSource, MicroSpec};
use super::replica::DrafterReplica;
use super::schedule::WarmupCosine;
use crate::data::{HoldoutSplit, Sample};
use crate::engine::model::drafter::{Drafter, DrafterConfig};
use crate::engine::model::target::TargetModel;
use crate::runtime::topology::pipeline::produce_item;
use crate::runtime::topology::plan::{step_telemetry, StepPlan, WorkerNames};
use crate::runtime::topology::rank::{RankReport, RankState};
use crate::runtime::topology::warmup::write_warmup_file;
use crate::runtime::topology::{
    panic_text, Cluster, QueueMonitor, TopologySpec, WarmupRecord, WorkerFailure, WorkerId,
};

/// Token id used to pad rows (loss mask 0, after every real token, so causal features of real
/// positions never see it).
pub const PAD_ID: i64 = 0;

/// Compute dtype: BF16 on GPU, fp32 on CPU (spec §2.8).
pub fn compute_kind(device: Device) -> Kind {
    if device.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    }
}

pub struct Trainer {
    pub(super) cfg: TrainConfig,
    pub(super) target: TargetModel,
    pub(super) drafter_cfg: DrafterConfig,
    /// Drafter rank 0, trained on the calling thread (the only rank when inline).
    pub(super) rank0: RankState,
    pub(super) schedule: WarmupCosine,
    pub(super) samples: Arc<Vec<Sample>>,
    pub(super) split: HoldoutSplit,
    pub(super) source: Arc<MicroSource>,
    pub(super) step: u64,
    /// Global index of the next micro-batch to train (the data position).
    pub(super) cursor: u64,
    pub(super) data_fingerprint: String,
    pub(super) plan: StepPlan,
    topology: TopologySpec,
    /// The worker threads; `None` when one device runs both roles inline.
    pub(super) cluster: Option<Cluster>,
    warmup: Option<Vec<WarmupRecord>>,
    /// Set by the first worker failure: every later step returns it.
    failure: Option<WorkerFailure>,
}

fn check_fit(target: &TargetModel, d: &DrafterConfig) -> Result<(), TrainError> {
    let t = target.config();
    let mismatch = |s: String| Err(TrainError::Mismatch(s));
    if d.target_hidden_size != t.hidden_size() {
        return mismatch(format!(
            "drafter target_hidden_size {} but the target's hidden_size is {}",
            d.target_hidden_size,
            t.hidden_size()
        ));
    }
    if d.hidden_size != t.hidden_size() {
        return mismatch(format!(
            "drafter hidden_size {} must equal the target's hidden_size {} (the drafter reuses the target's embedding and LM head)",
            d.hidden_size,
            t.hidden_size()
        ));
    }
    if d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size() {
        return mismatch(format!(
            "mask_token_id {} is not a row of the target's embedding (vocab {})",
            d.mask_token_id,
            t.vocab_size()
        ));
    }
    if let Some(&l) = d.target_layer_ids.iter().find(|&&l| l >= t.num_layers()) {
        return mismatch(format!(
            "target_layer_ids contains {l}, but the target has {} layers",
            t.num_layers()
        ));
    }
    Ok(())
}

impl Trainer {
    /// A fresh run on one device (both roles inline). `target` should already be on `device`
    /// in [`compute_kind`]; samples must have been validated against the target's vocabulary.
    pub fn new(
        target: TargetModel,
        drafter_cfg: DrafterConfig,
        samples: Vec<Sample>,
        cfg: TrainConfig,
        device: Device,
    ) -> Result<Self, TrainError> {
        Self::with_topology(
            target,
            drafter_cfg,
            samples,
            cfg,
            TopologySpec::single(device),
        )
    }

    /// A fresh run on `topology`. `target` is replicated onto every target device (shared
    /// when on the same device); drafter rank 0 lives on `drafter_devices[0]` and every other
    /// rank starts as an exact copy of it. `cfg.batch_size` and `cfg.grad_accum` are per
    /// drafter rank: one optimizer step trains `ranks × grad_accum` micro-batches.
    pub fn with_topology(
        target: TargetModel,
        drafter_cfg: DrafterConfig,
        samples: Vec<Sample>,
        cfg: TrainConfig,
        topology: TopologySpec,
    ) -> Result<Self, TrainError> {
        cfg.validate()?;
        drafter_cfg.validate("drafter config")?;
        check_fit(&target, &drafter_cfg)?;
        topology.validate()?;
        let split = split_held_out(samples.len(), cfg.held_out, cfg.seed)?;
        let device = topology.drafter_devices[0];
        let replica = DrafterReplica::seeded(
            &drafter_cfg,
            target.embed_tokens(),
            target.lm_head(),
            device,
            cfg.adamw.clone(),
            cfg.seed,
        );
        let inline = topology.is_inline();
        let id = WorkerId {
            role: if inline {
                DeviceRole::Both
            } else {
                DeviceRole::Drafter
            },
            index: 0,
            device,
        };
        let mut rank0 = RankState::new(id, replica, cfg.attention.into(), cfg.loss_chunk_positions);
        let bs = drafter_cfg.block_size as usize;
        let data_fingerprint = fingerprint(&samples);
        let samples = Arc::new(samples);
        let source = Arc::new(MicroSource::new(
            Arc::clone(&samples),
            split.train.clone(),
            MicroSpec {
                seed: cfg.seed,
                batch_size: cfg.batch_size,
                num_anchors: cfg.num_anchors,
                block_size: bs,
                gamma: cfg.gamma_for(bs),
                rule: cfg.label_mask_rule,
                pad_id: PAD_ID,
            },
        ));
        let plan = StepPlan {
            ranks: topology.drafter_devices.len(),
            accum: cfg.grad_accum,
        };
        let epoch_micro = u64::from(cfg.epochs) * source.batches_per_epoch();
        let epoch_steps = epoch_micro.div_ceil(plan.micro_per_step());
        let total_steps = cfg
            .max_steps
            .map_or(epoch_steps, |cap| cap.min(epoch_steps));
        let schedule = WarmupCosine::new(cfg.lr, total_steps, cfg.warmup_ratio);
        let cluster = if inline {
            None
        } else {
            Some(Cluster::start(
                &topology,
                cfg.grad_accum,
                &target,
                Arc::clone(&source),
                drafter_cfg.target_layer_ids.clone(),
                &mut rank0,
                0,
            )?)
        };
        Ok(Self {
            data_fingerprint,
            cfg,
            target,
            drafter_cfg,
            rank0,
            schedule,
            samples,
            split,
            source,
            step: 0,
            cursor: 0,
            plan,
            topology,
            cluster,
            warmup: None,
            failure: None,
        })
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
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
    /// Drafter replicas (data-parallel ranks).
    pub fn drafter_ranks(&self) -> usize {
        self.plan.ranks
    }
    /// Micro-batches (of `batch_size` sequences) per optimizer step, over all ranks.
    pub fn micro_batches_per_step(&self) -> u64 {
        self.plan.micro_per_step()
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
        (self.data_position().epoch + 1).min(self.config().epochs)
    }

    pub fn split(&self) -> &HoldoutSplit {
        &self.split
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
    pub fn warmup_records(&self) -> &[WarmupRecord] {
        self.warmup.as_deref().unwrap_or(&[])
    }

    /// Runs the serialized warmup if it has not run: every worker's first forward (target) or
    /// forward+backward (drafter), one device at a time, on the next micro-batch to train;
    /// nothing is learned from it. Writes `<run_dir>/warmup.json` when the topology names a
    /// run directory.
    pub fn warmup(&mut self) -> Result<&[WarmupRecord], TrainError> {
        if self.warmup.is_none() {
            let records = self.run_warmup().map_err(|e| self.note_failure(e))?;
            if let Some(dir) = &self.topology.run_dir {
                write_warmup_file(dir, &records).map_err(TrainError::io(dir))?;
            }
            self.warmup = Some(records);
        }
        Ok(self.warmup_records())
    }

    fn run_warmup(&mut self) -> Result<Vec<WarmupRecord>, TrainError> {
        if let Some(f) = &self.failure {
            return Err(f.to_error());
        }
        let seq = self.cursor;
        match self.cluster.as_mut() {
            Some(c) => c.warmup(&mut self.rank0, seq),
            None => {
                let (target, source, rank0) = (&self.target, &self.source, &mut self.rank0);
                let layers = &self.drafter_cfg.target_layer_ids;
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let item = produce_item(target, source, layers, seq, rank0.id.device, 0)?;
                    let ms = rank0.warmup(&item.features, &item.micro);
                    Ok::<_, String>(item.timing.data_ms + item.timing.target_ms + ms)
                }))
                .unwrap_or_else(|p| Err(panic_text(p.as_ref())));
                match outcome {
                    Ok(ms) => Ok(vec![WarmupRecord::new(rank0.id, ms)]),
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
    fn inline_step(&mut self, base: u64, lr: f64) -> Result<Vec<RankReport>, TrainError> {
        let seqs = self.plan.rank_seqs(base, 0);
        let (target, source, rank0) = (&self.target, &self.source, &mut self.rank0);
        let layers = &self.drafter_cfg.target_layer_ids;
        let id = rank0.id;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            rank0.step(&seqs, lr, &mut |seq| {
                produce_item(target, source, layers, seq, id.device, 0).map(|item| (item, 0.0))
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
        let n = self.plan.micro_per_step();
        let lr = self.schedule.lr(self.step);
        let end = base + self.schedule.total_steps.saturating_sub(self.step) * n;
        let result = match self.cluster.as_mut() {
            Some(c) => c.step(&mut self.rank0, base, lr, end),
            None => self.inline_step(base, lr),
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
                targets: vec![device_name(self.rank0.id.device)],
                drafters: vec![device_name(self.rank0.id.device)],
                inline: true,
            },
        };
        let (times, workers, tokens) = step_telemetry(&names, &timings, wall_ms);
        Ok(StepMetrics {
            ts_ms: chrono::Utc::now().timestamp_millis(),
            step: self.step,
            // Operators count epochs from 1 ("epoch 3 / 6"); the data position counts from 0.
            epoch: epoch + 1,
            loss: first.sums.loss(),
            accuracy: first.sums.accuracy(),
            tau: None,
            lr,
            grad_norm: report.grad_norm,
            tokens_per_s: tokens as f64 / (wall_ms / 1e3).max(1e-9),
            workers,
            times,
        })
    }

    pub fn eval_options(&self) -> EvalOptions {
        let bs = self.drafter_cfg.block_size as usize;
        EvalOptions {
            anchors_per_forward: self.cfg.eval_anchors_per_forward,
            rows_per_forward: self.cfg.batch_size,
            gamma: self.cfg.gamma_for(bs),
            rule: self.cfg.label_mask_rule,
            chunk_positions: self.cfg.loss_chunk_positions,
            backend: self.cfg.attention.into(),
        }
    }

    /// Evaluates on the held-out split (`None` when nothing is held out).
    pub fn evaluate_held_out(&self) -> Result<Option<EvalReport>, TrainError> {
        let limit = if self.cfg.eval_max_samples == 0 {
            usize::MAX
        } else {
            self.cfg.eval_max_samples
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

    /// Runs until the schedule ends, `max_steps` more steps were taken, or `stop` is set.
    /// Evaluates every `eval_every` steps (and once before the first step of a fresh run),
    /// checkpoints every `checkpoint_every` steps and at the end.
    pub fn run(
        &mut self,
        opts: &RunOptions,
        sink: &mut dyn FnMut(&StepMetrics) -> Result<(), TrainError>,
    ) -> Result<RunSummary, TrainError> {
        let mut summary = RunSummary::default();
        if self.step == 0 && self.cfg.eval_every > 0 {
            if let Some(report) = self.evaluate_held_out()? {
                sink(&self.eval_line(&report))?;
                summary.first_eval = Some(report);
            }
        }
        let mut last_saved = None;
        while !self.is_finished() && opts.max_steps.is_none_or(|m| summary.steps_run < m) {
            if opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                break;
            }
            let mut metrics = self.train_step()?;
            summary.steps_run += 1;
            let eval_due = self.cfg.eval_every > 0
                && (self.step % self.cfg.eval_every == 0 || self.is_finished());
            if eval_due {
                if let Some(report) = self.evaluate_held_out()? {
                    metrics.tau = Some(report.tau);
                    summary.last_eval = Some(report);
                }
            }
            sink(&metrics)?;
            summary.last_metrics = Some(metrics);
            if let Some(root) = &opts.checkpoint_root {
                if self.cfg.checkpoint_every > 0 && self.step % self.cfg.checkpoint_every == 0 {
                    summary.last_checkpoint = Some(self.save_checkpoint(root)?);
                    last_saved = Some(self.step);
                }
            }
        }
        if let Some(root) = &opts.checkpoint_root {
            if last_saved != Some(self.step) && summary.steps_run > 0 {
                summary.last_checkpoint = Some(self.save_checkpoint(root)?);
            }
        }
        summary.final_step = self.step;
        summary.finished = self.is_finished();
        Ok(summary)
    }

    /// The metrics line of an evaluation outside a training step (before the first step).
    fn eval_line(&self, report: &EvalReport) -> StepMetrics {
        StepMetrics {
            ts_ms: chrono::Utc::now().timestamp_millis(),
            step: self.step,
            epoch: self.epoch_in_progress(),
            loss: report.loss,
            accuracy: report.accuracy,
            tau: Some(report.tau),
            lr: self.schedule.lr(self.step),
            grad_norm: 0.0,
            tokens_per_s: 0.0,
            workers: Vec::new(),
            times: StepTimes::default(),
        }
    }
}

pub fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Mps => "mps".into(),
        Device::Vulkan => "vulkan".into(),
        Device::Cpu => "cpu".into(),
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Optimizer steps to take in this call at most.
    pub max_steps: Option<u64>,
    /// Where checkpoints go (`None`: no checkpoints).
    pub checkpoint_root: Option<PathBuf>,
    /// Checked before every step; set it to stop after the current step.
    pub stop: Option<Arc<AtomicBool>>,
}

#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    pub steps_run: u64,
    pub final_step: u64,
    pub finished: bool,
    pub first_eval: Option<EvalReport>,
    pub last_eval: Option<EvalReport>,
    pub last_metrics: Option<StepMetrics>,
    pub last_checkpoint: Option<PathBuf>,
}
