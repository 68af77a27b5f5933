//! One drafter rank's half of an optimizer step (spec §2.8b): forward/backward of its
//! micro-batches in index order, then the sum of gradients and of the objective's normaliser
//! (Σw for DFlash, sequences for D-PACE) over all ranks, one division by the global
//! normaliser, clipping and the AdamW update.
use std::time::Instant;

use tch::{Kind, Tensor};

use super::pipeline::{sync, HiddenItem};
use super::step::RankTiming;
use super::WorkerId;
use crate::collective::allreduce::{sum_in_buckets, AllReduce};
use crate::collective::bucket::ALLREDUCE_BUCKET_ELEMENTS;
use crate::model::drafter::AttentionBackend;
use crate::train::block_objective::LossObjective;
use crate::train::dspark::DsparkLossWeights;
use crate::train::loss::LossSums;
use crate::train::micro::PreparedMicro;
use crate::train::optim::{OptimError, StepReport};
use crate::train::replica::{DrafterReplica, MicroStepOptions, StepSchedule, TargetStates};
use crate::train::throughput::drafter_flops;

/// What a rank reports after a step. `sums` and the optimizer outcome are global (identical on
/// every rank); the timing is this rank's.
pub struct RankReport {
    pub sums: LossSums,
    pub optim: Result<StepReport, OptimError>,
    pub timing: RankTiming,
    /// Epoch of the newest micro-batch this rank trained.
    pub last_epoch: u32,
}

/// A drafter replica with what it needs to take part in steps.
pub struct RankState {
    pub id: WorkerId,
    pub replica: DrafterReplica,
    /// `None` when this is the only rank.
    pub allreduce: Option<Box<dyn AllReduce>>,
    /// The fp32 all-reduce bucket ([`ALLREDUCE_BUCKET_ELEMENTS`], or fewer when the drafter is
    /// smaller), allocated once.
    bucket: Option<Tensor>,
    pub backend: AttentionBackend,
    pub chunk_positions: i64,
    /// `training.activation_checkpointing`.
    pub activation_checkpointing: bool,
    /// `training.objective` (DFlash unless the trainer sets it).
    pub objective: LossObjective,
    /// `[training.dspark]` (SpecForge's weights unless the trainer sets them).
    pub dspark: DsparkLossWeights,
    /// `training.dflash2.selector_stop_gradient` (false unless the trainer sets it).
    pub selector_stop_gradient: bool,
}

impl RankState {
    pub fn new(
        id: WorkerId,
        replica: DrafterReplica,
        backend: AttentionBackend,
        chunk_positions: i64,
        activation_checkpointing: bool,
    ) -> Self {
        Self {
            id,
            replica,
            allreduce: None,
            bucket: None,
            backend,
            chunk_positions,
            activation_checkpointing,
            objective: LossObjective::Dflash,
            dspark: DsparkLossWeights::default(),
            selector_stop_gradient: false,
        }
    }

    /// How this rank trains a micro-batch, with the step's scheduled weights.
    fn micro_step_options(&self, schedule: StepSchedule) -> MicroStepOptions {
        MicroStepOptions {
            backend: self.backend,
            chunk_positions: self.chunk_positions,
            activation_checkpointing: self.activation_checkpointing,
            objective: self.objective,
            schedule,
            selector_stop_gradient: self.selector_stop_gradient,
            dspark: self.dspark,
        }
    }

    /// The serialized warmup: one forward/backward alone, gradients discarded. Returns its
    /// wall time in ms.
    pub fn warmup(&mut self, states: TargetStates<'_>, micro: &PreparedMicro) -> f64 {
        let t = Instant::now();
        // The warmup's gradients are discarded, whatever the step's curriculum (λ = 0); a
        // selector term in the graph gives it a trained step's memory and kernels.
        let warmup = StepSchedule {
            lambda_base: 0.0,
            selector_alpha: 1.0,
        };
        let _ = self
            .replica
            .forward_backward(states, micro, &self.micro_step_options(warmup));
        sync(self.replica.device());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        self.replica.zero_grad();
        ms
    }

    /// Trains micro-batches `seqs` (ascending), fetched by `fetch` (which returns the item and
    /// how long it waited for it), then reduces and applies the update at `lr`. `schedule`
    /// holds this step's scheduled weights (Domino's λ, DFlash2's α_eff; each ignored without
    /// its head). An `Err` is a failure of this worker (or of its queue or group, after another
    /// worker failed).
    pub fn step(
        &mut self,
        seqs: &[u64],
        lr: f64,
        schedule: StepSchedule,
        fetch: &mut dyn FnMut(u64) -> Result<(HiddenItem, f64), String>,
    ) -> Result<RankReport, String> {
        let mut sums = LossSums::default();
        let mut timing = RankTiming::default();
        let mut last_epoch = 0;
        let device = self.replica.device();
        for &seq in seqs {
            let (item, waited_ms) = fetch(seq)?;
            timing.queue_wait_ms += waited_ms;
            let t = Instant::now();
            sums.add(&self.replica.forward_backward(
                item.target_states(),
                &item.micro,
                &self.micro_step_options(schedule),
            ));
            sync(device);
            timing.forward_backward_ms += t.elapsed().as_secs_f64() * 1e3;
            timing.drafter_flops += drafter_flops(self.replica.drafter().config(), &item.micro);
            timing.items.push(item.timing);
            last_epoch = last_epoch.max(item.micro.batch.epoch);
        }

        let t = Instant::now();
        let mut totals = sums.to_array();
        let mut reduced = None;
        if let Some(group) = self.allreduce.as_mut() {
            let n = self
                .replica
                .param_elements()
                .clamp(1, ALLREDUCE_BUCKET_ELEMENTS);
            let bucket = self
                .bucket
                .get_or_insert_with(|| Tensor::zeros([n], (Kind::Float, device)));
            let mut grads = self.replica.grads_for_reduce();
            sum_in_buckets(group.as_mut(), &mut grads, bucket).map_err(|e| e.to_string())?;
            group.sum_f64(&mut totals).map_err(|e| e.to_string())?;
            reduced = Some(grads);
        }
        sync(device);
        timing.all_reduce_ms = t.elapsed().as_secs_f64() * 1e3;
        let global = LossSums::from_array(totals);

        let t = Instant::now();
        // The gradient of Σw·CE / normaliser over the whole optimizer batch (spec §2.7; Σw for
        // DFlash, what `training.dpace_normalization` names for D-PACE, the sequences for the
        // tree objective): the backward ran on numerators, so one division
        // by the global normaliser gives the gradient one device would compute on the batch.
        let scale = if global.normaliser > 0.0 {
            1.0 / global.normaliser
        } else {
            1.0
        };
        let optim = self.replica.apply(lr, reduced.as_deref(), scale);
        sync(device);
        timing.optimizer_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(RankReport {
            sums: global,
            optim,
            timing,
            last_epoch,
        })
    }
}
