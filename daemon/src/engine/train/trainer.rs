//! The training loop on one device: target features → anchors and labels → drafter forward →
//! chunked weighted CE backward → clipped AdamW step (spec §2.8b).
//!
//! Everything random is drawn from seeded streams whose state is checkpointed
//! ([`super::resume`]), so a resumed run is bit-identical to an uninterrupted one on CPU.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dflash_shared::metrics::{DeviceRole, StepMetrics, StepTimes, WorkerThroughput};
use tch::{nn::VarStore, Device, Kind, Tensor};

use super::anchors::{sample_anchors, AnchorBatch};
use super::config::TrainConfig;
use super::drafter_io::named_parameters;
use super::error::TrainError;
use super::eval::{evaluate, EvalOptions, EvalReport};
use super::labels::{block_input_ids, block_labels, BlockLabels};
use super::loader::{fingerprint, split_held_out, Batch, DataPosition, Loader};
use super::loss::{weighted_ce_backward, LossSums};
use super::optim::AdamW;
use super::rng::{streams, Rng};
use super::schedule::WarmupCosine;
use crate::data::{HoldoutSplit, Sample};
use crate::engine::model::drafter::{Drafter, DrafterConfig};
use crate::engine::model::target::TargetModel;

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
    pub(super) vs: VarStore,
    pub(super) drafter: Drafter,
    pub(super) optimizer: AdamW,
    pub(super) schedule: WarmupCosine,
    pub(super) samples: Vec<Sample>,
    pub(super) split: HoldoutSplit,
    pub(super) loader: Loader,
    pub(super) rng: Rng,
    pub(super) step: u64,
    pub(super) data_fingerprint: String,
    embed: Tensor,
    lm_head: Tensor,
    device: Device,
}

struct Micro {
    batch: Batch,
    anchors: AnchorBatch,
    labels: BlockLabels,
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
    /// A fresh run. `target` should already be on `device` in [`compute_kind`]; samples must
    /// have been validated against the target's vocabulary.
    pub fn new(
        target: TargetModel,
        drafter_cfg: DrafterConfig,
        samples: Vec<Sample>,
        cfg: TrainConfig,
        device: Device,
    ) -> Result<Self, TrainError> {
        cfg.validate()?;
        drafter_cfg.validate("drafter config")?;
        check_fit(&target, &drafter_cfg)?;
        let split = split_held_out(samples.len(), cfg.held_out, cfg.seed)?;
        // Drafter init draws from libtorch's global generator; seed it so runs are reproducible.
        tch::manual_seed(cfg.seed as i64);
        let mut vs = VarStore::new(device);
        let drafter = Drafter::new(&vs.root(), &drafter_cfg);
        let kind = compute_kind(device);
        if kind != Kind::Float {
            vs.set_kind(kind);
        }
        let optimizer = AdamW::new(named_parameters(&vs), cfg.adamw.clone());
        let loader = Loader::new(split.train.clone(), cfg.batch_size, cfg.seed, PAD_ID);
        let epoch_steps =
            ((cfg.epochs as usize * loader.batches_per_epoch()).div_ceil(cfg.grad_accum)) as u64;
        let total_steps = cfg
            .max_steps
            .map_or(epoch_steps, |cap| cap.min(epoch_steps));
        let schedule = WarmupCosine::new(cfg.lr, total_steps, cfg.warmup_ratio);
        let embed = target.embed_tokens().to_device(device).to_kind(kind);
        let lm_head = target.lm_head().to_device(device).to_kind(kind);
        Ok(Self {
            data_fingerprint: fingerprint(&samples),
            rng: Rng::stream(cfg.seed, streams::ANCHORS, 0),
            cfg,
            target,
            drafter_cfg,
            vs,
            drafter,
            optimizer,
            schedule,
            samples,
            split,
            loader,
            step: 0,
            embed,
            lm_head,
            device,
        })
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }
    pub fn drafter_config(&self) -> &DrafterConfig {
        &self.drafter_cfg
    }
    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }
    pub fn target(&self) -> &TargetModel {
        &self.target
    }
    pub fn var_store(&self) -> &VarStore {
        &self.vs
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
        self.loader.position()
    }
    pub fn split(&self) -> &HoldoutSplit {
        &self.split
    }
    /// fp32 weights by HF key (what checkpoints and exports hold).
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        self.optimizer.master_weights()
    }

    fn next_micro(&mut self) -> Micro {
        let batch = self.loader.next_batch(&self.samples);
        let anchors = sample_anchors(&batch.masks(), self.cfg.num_anchors, &mut self.rng);
        let bs = self.drafter_cfg.block_size as usize;
        let gamma = self.cfg.gamma_for(bs);
        let labels = block_labels(
            batch.rows(),
            &anchors,
            bs,
            Some(gamma),
            self.cfg.label_mask_rule,
        );
        Micro {
            batch,
            anchors,
            labels,
        }
    }

    fn micro_forward_backward(
        &self,
        m: &Micro,
        denominator: f64,
        times: &mut StepTimes,
    ) -> Result<LossSums, TrainError> {
        let t = Instant::now();
        let (b, s) = (m.batch.batch as i64, m.batch.seq_len as i64);
        let ids = Tensor::from_slice(&m.batch.input_ids).view([b, s]);
        let features = self
            .target
            .features(&ids, &self.drafter_cfg.target_layer_ids)?
            .to_device(self.device);
        sync(self.device);
        times.target_forward_ms += t.elapsed().as_secs_f64() * 1e3;

        let t = Instant::now();
        let bs = self.drafter_cfg.block_size as usize;
        let block_ids = block_input_ids(
            m.batch.rows(),
            &m.anchors,
            bs,
            self.drafter_cfg.mask_token_id,
        );
        let block_ids = Tensor::from_slice(&block_ids).to_device(self.device);
        let q = (m.anchors.width * bs) as i64;
        let embeddings = tch::no_grad(|| self.embed.index_select(0, &block_ids).view([b, q, -1]));
        let (anchors, keep) = m.anchors.to_tensors(self.device);
        let out = self.drafter.forward(
            &features,
            &embeddings,
            &anchors,
            &keep,
            self.cfg.attention.into(),
        );
        let targets = Tensor::from_slice(&m.labels.targets)
            .view([b, q])
            .to_device(self.device);
        let weights = Tensor::from_slice(&m.labels.weights)
            .view([b, q])
            .to_device(self.device);
        let sums = weighted_ce_backward(
            &out,
            &self.lm_head,
            &targets,
            &weights,
            denominator,
            self.cfg.loss_chunk_positions,
        );
        times.drafter_forward_backward_ms += t.elapsed().as_secs_f64() * 1e3;
        Ok(sums)
    }

    /// One optimizer step over `grad_accum` micro-batches. Returns the step's metrics (no τ).
    pub fn train_step(&mut self) -> Result<StepMetrics, TrainError> {
        let start = Instant::now();
        let mut times = StepTimes::default();
        let micros: Vec<Micro> = (0..self.cfg.grad_accum)
            .map(|_| self.next_micro())
            .collect();
        times.data_wait_ms = start.elapsed().as_secs_f64() * 1e3;
        // Σw over the whole optimizer batch: each micro-batch's numerator is divided by it, so
        // the accumulated gradient is that of the global weighted mean (spec §2.7).
        let denominator: f64 = micros.iter().map(|m| m.labels.weight_sum()).sum();
        let mut sums = LossSums::default();
        if denominator > 0.0 {
            for m in &micros {
                sums.add(&self.micro_forward_backward(m, denominator, &mut times)?);
            }
        }
        let t = Instant::now();
        let lr = self.schedule.lr(self.step);
        let report = self.optimizer.step(lr);
        self.optimizer.zero_grad();
        let report = report?;
        sync(self.device);
        times.optimizer_ms = t.elapsed().as_secs_f64() * 1e3;
        self.step += 1;
        times.total_ms = start.elapsed().as_secs_f64() * 1e3;
        let tokens: usize = micros.iter().map(|m| m.batch.tokens).sum();
        let tokens_per_s = tokens as f64 / start.elapsed().as_secs_f64().max(1e-9);
        let epoch = micros.last().map_or(0, |m| m.batch.epoch);
        Ok(StepMetrics {
            ts_ms: chrono::Utc::now().timestamp_millis(),
            step: self.step,
            epoch,
            loss: sums.loss(),
            accuracy: sums.accuracy(),
            tau: None,
            lr,
            grad_norm: report.grad_norm,
            tokens_per_s,
            workers: vec![WorkerThroughput {
                device: device_name(self.device),
                role: DeviceRole::Both,
                tokens_per_s,
            }],
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
        evaluate(&self.target, &self.drafter, &held, &self.eval_options()).map(Some)
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
            epoch: self.loader.position().epoch,
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

/// Waits for queued CUDA work, so per-phase wall times measure the phase and not its launch.
fn sync(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
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
