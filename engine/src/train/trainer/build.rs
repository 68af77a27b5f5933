//! Building a [`Trainer`]: the [`TrainerSpec`] it is made from, the checks a spec must pass,
//! rank 0's replica and the worker threads, the schedule, and, for a node of a job, joining it.
use std::sync::Arc;

use dflash_shared::metrics::DeviceRole;
use tch::Device;

use super::{Trainer, PAD_ID};
use crate::data::Sample;
use crate::model::drafter::DrafterConfig;
use crate::model::target::TargetModel;
use crate::train::config::TrainConfig;
use crate::train::dspark::DsparkLossWeights;
use crate::train::error::TrainError;
use crate::train::loader::{data_digest, split_held_out};
use crate::train::micro::{MicroSource, MicroSpec};
use crate::train::online_prompts::OnlinePrompts;
use crate::train::replica::DrafterReplica;
use crate::train::schedule::WarmupCosine;
use crate::train::throughput::DevicePeaks;
use crate::train::topology::rank::RankState;
use crate::train::topology::step::MicroBatchAssignment;
use crate::train::topology::{Cluster, TopologySpec, WorkerId};

use super::JobMembership;

/// Everything a [`Trainer`] is built from, in one value: [`Trainer::build`] returns the
/// trainer complete, with nothing left for the caller to set afterwards.
/// [`TrainerSpec::new`] gives a run with no MFU peaks, no online prompts and no job; set the
/// other fields on it for those.
pub struct TrainerSpec {
    /// On the topology's first target device in [`crate::device::compute_kind`]; replicated onto
    /// every other target device (shared when on the same device).
    pub target: TargetModel,
    pub drafter_cfg: DrafterConfig,
    /// Validated against the target's vocabulary.
    pub samples: Vec<Sample>,
    /// `batch_size` and `grad_accum` are per drafter rank: one optimizer step trains
    /// `ranks × grad_accum` micro-batches.
    pub cfg: TrainConfig,
    pub topology: TopologySpec,
    /// Each device's dense peak, for the steps' MFU (the engine measures none itself: on CPU
    /// the caller measures one with [`crate::train::peak::measure_matmul`], on CUDA it reads a
    /// datasheet; [`TopologySpec::devices`] lists the devices). A device left out gets no MFU.
    pub device_peaks: DevicePeaks,
    /// The online evaluation's prompts (the daemon loads them at setup); `None`: no online
    /// evaluation runs, whatever the cadence.
    pub online_prompts: Option<OnlinePrompts>,
    /// The data-parallel job this trainer is one node of (issue 23); `None` for one process.
    pub job: Option<JobMembership>,
}

impl TrainerSpec {
    /// A run of `samples` on `topology`: no device peaks (no MFU), no online prompts, no job.
    pub fn new(
        target: TargetModel,
        drafter_cfg: DrafterConfig,
        samples: Vec<Sample>,
        cfg: TrainConfig,
        topology: TopologySpec,
    ) -> Self {
        Self {
            target,
            drafter_cfg,
            samples,
            cfg,
            topology,
            device_peaks: DevicePeaks::new(),
            online_prompts: None,
            job: None,
        }
    }
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

/// The warmup-cosine schedule over the run's optimizer steps: `epochs` of the training split
/// at `assignment`'s global batch, capped by `max_steps`. Steps are global: every node of a
/// job takes the same steps at the same learning rate.
pub(super) fn schedule_for(
    cfg: &TrainConfig,
    source: &MicroSource,
    assignment: MicroBatchAssignment,
) -> WarmupCosine {
    let epoch_micro = u64::from(cfg.training.epochs) * source.batches_per_epoch();
    let epoch_steps = epoch_micro.div_ceil(assignment.micro_per_step());
    let total_steps = cfg
        .training
        .max_steps
        .map_or(epoch_steps, |cap| cap.min(epoch_steps));
    WarmupCosine::new(cfg.training.lr, total_steps, cfg.training.warmup_ratio)
}

impl Trainer {
    /// A fresh run on one device (both roles inline), with no MFU peaks, no online prompts and
    /// no job: the short form of [`Self::build`]. `target` should already be on `device` in
    /// [`crate::device::compute_kind`]; samples must have been validated against the target's
    /// vocabulary.
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

    /// A fresh run on `topology`, with no MFU peaks, no online prompts and no job: the short
    /// form of [`Self::build`] with [`TrainerSpec::new`].
    pub fn with_topology(
        target: TargetModel,
        drafter_cfg: DrafterConfig,
        samples: Vec<Sample>,
        cfg: TrainConfig,
        topology: TopologySpec,
    ) -> Result<Self, TrainError> {
        Self::build(TrainerSpec::new(
            target,
            drafter_cfg,
            samples,
            cfg,
            topology,
        ))
    }

    /// A fresh run, complete: `spec.target` is replicated onto every target device (shared
    /// when on the same device); drafter rank 0 lives on `drafter_devices[0]` and every other
    /// rank starts as an exact copy of it; the worker threads start. For a node of a job
    /// ([`TrainerSpec::job`]) the last step joins the job's gradient group
    /// ([`JobMembership::open_group`] meets the other nodes, so it runs once the workers have
    /// started), and steps, epochs and the schedule count the job's global batch.
    pub fn build(spec: TrainerSpec) -> Result<Self, TrainError> {
        let TrainerSpec {
            target,
            drafter_cfg,
            samples,
            cfg,
            topology,
            device_peaks,
            online_prompts,
            job,
        } = spec;
        drafter_cfg.validate("drafter config")?;
        check_fit(&target, &drafter_cfg)?;
        topology.validate()?;
        // The deliberate SDPA kernel choice, before any attention runs (see `crate::model::sdpa`).
        crate::model::sdpa::choose_backends();
        let split = split_held_out(samples.len(), cfg.held_out, cfg.seed)?;
        let device = topology.drafter_devices[0];
        let replica = DrafterReplica::seeded(
            &drafter_cfg,
            target.embed_tokens(),
            target.lm_head(),
            device,
            cfg.adamw(),
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
        let mut rank0 = RankState::new(
            id,
            replica,
            cfg.training.attention,
            cfg.training.loss_chunk_positions as i64,
            cfg.training.activation_checkpointing,
        );
        rank0.objective = cfg.loss_objective();
        rank0.dspark = DsparkLossWeights::from(&cfg.training.dspark);
        rank0.selector_stop_gradient = cfg.training.dflash2.selector_stop_gradient;
        let data_digest = data_digest(&samples);
        let samples = Arc::new(samples);
        let source = Arc::new(MicroSource::new(
            Arc::clone(&samples),
            split.train.clone(),
            MicroSpec::for_training(&cfg, &drafter_cfg, PAD_ID),
        ));
        let assignment = MicroBatchAssignment {
            ranks: topology.drafter_devices.len(),
            accum: cfg.training.grad_accum,
        };
        let schedule = schedule_for(&cfg, &source, assignment);
        let cluster = if inline {
            None
        } else {
            Some(Cluster::start(
                &topology,
                cfg.training.grad_accum,
                &target,
                Arc::clone(&source),
                drafter_cfg.feature_request(),
                &mut rank0,
                0,
            )?)
        };
        let mut trainer = Self {
            data_digest,
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
            assignment,
            rank0_global: 0,
            topology,
            cluster,
            warmup: None,
            failure: None,
            device_peaks,
            online_prompts,
            checkpoint_witness: None,
            job_node: None,
            best: None,
            straggler_behind_frac: dflash_shared::job::STRAGGLER_BEHIND_FRAC,
        };
        if let Some(job) = job {
            trainer.join_job(job)?;
        }
        Ok(trainer)
    }
}
