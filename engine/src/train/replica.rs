//! One drafter replica on one device, and the two halves of a training step on it:
//! [`DrafterReplica::forward_backward`] (one micro-batch → gradient of its loss numerator, Σw
//! and statistics) and [`DrafterReplica::apply`] (normalised, clipped AdamW update). Between
//! them the caller sums gradients and Σw across replicas (spec §2.8b).
use std::collections::HashMap;

use tch::{nn::VarStore, Device, Kind, Tensor};

use super::block_objective::{block_objective_backward, BlockObjectiveBatch, LossObjective};
use super::dflash2::{dflash2_backward, Dflash2Batch};
use super::domino::{domino_ce_backward, DominoBatch};
use super::drafter_io::named_parameters;
use super::dspark::{dspark_backward, DsparkInputs, DsparkLossWeights};
use super::labels::block_input_ids;
use super::loss::{weighted_ce_backward, LossSums};
use super::micro::PreparedMicro;
use super::optim::{AdamW, AdamWConfig, OptimError, StepReport};
use crate::device::compute_kind;
use crate::model::drafter::{AttentionBackend, Drafter, DrafterConfig, DrafterInputs};
use crate::model::target::TargetHidden;

/// Weights, moments and step counter of a replica (deep copies, on the CPU).
pub struct ReplicaState {
    pub master: HashMap<String, Tensor>,
    pub moments: HashMap<String, Tensor>,
    pub optimizer_step: u64,
}

/// The target's states of one micro-batch's rows, what [`DrafterReplica::forward_backward`]
/// trains on.
#[derive(Clone, Copy, Debug)]
pub struct TargetStates<'a> {
    /// `[B, S, n·H]` tap-layer features, on any device.
    pub features: &'a Tensor,
    /// `[B, S, H]` the target's final-normed last hidden state, what its frozen LM head turns
    /// into the teacher's distribution; present exactly when the head needs it
    /// ([`DrafterHead::needs_target_last_hidden`](crate::model::drafter::DrafterHead::needs_target_last_hidden)).
    pub last_hidden: Option<&'a Tensor>,
}

impl<'a> TargetStates<'a> {
    /// The tap features alone (every head that does not distil the target).
    pub fn features_only(features: &'a Tensor) -> Self {
        Self {
            features,
            last_hidden: None,
        }
    }
}

impl<'a> From<&'a TargetHidden> for TargetStates<'a> {
    fn from(hidden: &'a TargetHidden) -> Self {
        Self {
            features: &hidden.features,
            last_hidden: hidden.last_hidden.as_ref(),
        }
    }
}

/// The weights a run's schedules set step by step (each computed from the steps done and the
/// run's total): every rank of every node computes the same ones.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepSchedule {
    /// Domino's curriculum weight: the loss is `(1−λ)·final + λ·base` (`train/domino.rs`); a
    /// drafter without a Domino head ignores it. λ = 0 trains the corrected logits alone, as
    /// SpecForge does without a schedule.
    pub lambda_base: f64,
    /// DFlash2's `α_eff`, the selector term's weight (`Dflash2Section::effective_alpha`); a
    /// drafter without a selector ignores it. At 0 the selector is measured, not trained.
    pub selector_alpha: f64,
}

/// How [`DrafterReplica::forward_backward`] trains one micro-batch.
#[derive(Clone, Copy, Debug)]
pub struct MicroStepOptions {
    pub backend: AttentionBackend,
    /// How many positions go through the LM head at once (the loss is computed per chunk).
    pub chunk_positions: i64,
    /// The drafter recomputes its layers in the backward ([`Drafter::forward_backward`]).
    pub activation_checkpointing: bool,
    pub objective: LossObjective,
    /// This step's scheduled weights.
    pub schedule: StepSchedule,
    /// DFlash2's selector term sees the unary scores and hidden states detached
    /// (`training.dflash2.selector_stop_gradient`); ignored without a selector.
    pub selector_stop_gradient: bool,
    /// DSpark's loss weights (`[training.dspark]`); a drafter without a DSpark head ignores
    /// them.
    pub dspark: DsparkLossWeights,
}

pub struct DrafterReplica {
    pub(crate) vs: VarStore,
    pub(crate) drafter: Drafter,
    pub(crate) optimizer: AdamW,
    /// The target's frozen embedding and LM head, on this replica's device.
    embed: Tensor,
    lm_head: Tensor,
    device: Device,
}

impl DrafterReplica {
    /// A freshly initialised drafter on `device`, drawn from libtorch's global generator
    /// seeded with `seed`, parameters in [`compute_kind`]. `embed` / `lm_head` are the
    /// target's tables. The generator is process-wide: the seeding and the draws happen under
    /// one lock, so trainers built concurrently (tests, replicas) cannot interleave draws.
    pub fn seeded(
        cfg: &DrafterConfig,
        embed: &Tensor,
        lm_head: &Tensor,
        device: Device,
        adamw: AdamWConfig,
        seed: u64,
    ) -> Self {
        let _draws = crate::device::global_rng::seeded(seed as i64);
        Self::build(cfg, embed, lm_head, device, adamw)
    }

    /// Builds a drafter; its random init draws from the global generator (callers hold
    /// [`crate::device::global_rng::lock`]).
    fn build(
        cfg: &DrafterConfig,
        embed: &Tensor,
        lm_head: &Tensor,
        device: Device,
        adamw: AdamWConfig,
    ) -> Self {
        let mut vs = VarStore::new(device);
        let drafter = Drafter::new(&vs.root(), cfg);
        let kind = compute_kind(device);
        if kind != Kind::Float {
            vs.set_kind(kind);
        }
        let optimizer = AdamW::new(named_parameters(&vs), adamw);
        Self {
            embed: embed.to_device(device).to_kind(kind),
            lm_head: lm_head.to_device(device).to_kind(kind),
            vs,
            drafter,
            optimizer,
            device,
        }
    }

    /// A replica on `device` with exactly this replica's parameters and optimizer state.
    pub fn replicate(&self, device: Device) -> Result<Self, OptimError> {
        let cfg = self.drafter.config().clone();
        let mut copy = {
            let _draws = crate::device::global_rng::lock();
            Self::build(
                &cfg,
                &self.embed,
                &self.lm_head,
                device,
                self.optimizer.config().clone(),
            )
        };
        copy.load_state(&self.state())?;
        Ok(copy)
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// Forward and backward of one micro-batch: accumulates the gradient of the objective's
    /// numerator (`Σ w·CE`, not yet divided by anything: the returned `normaliser`, summed
    /// over the step, is what divides it) into the parameters' gradients. `states` are the
    /// target's states of the micro-batch's rows.
    pub fn forward_backward(
        &self,
        states: TargetStates<'_>,
        micro: &PreparedMicro,
        options: &MicroStepOptions,
    ) -> LossSums {
        let MicroStepOptions {
            backend,
            chunk_positions,
            activation_checkpointing,
            objective,
            schedule,
            selector_stop_gradient,
            dspark,
        } = *options;
        let cfg = self.drafter.config();
        let bs = cfg.block_size as usize;
        let b = micro.batch.batch as i64;
        let block_ids = block_input_ids(micro.batch.rows(), &micro.anchors, bs, cfg.mask_token_id);
        let block_ids = Tensor::from_slice(&block_ids).to_device(self.device);
        let q = (micro.anchors.width * bs) as i64;
        let embeddings = tch::no_grad(|| self.embed.index_select(0, &block_ids).view([b, q, -1]));
        let (anchors, keep) = micro.anchors.to_tensors(self.device);
        let targets = Tensor::from_slice(&micro.labels.targets)
            .view([b, q])
            .to_device(self.device);
        // DFlash weighs each slot by its γ decay; D-PACE and the tree objective by its mask
        // alone and compute their own weights from the drafter's output.
        let weights: Vec<f32> = match objective {
            LossObjective::Dflash => micro.labels.weights.clone(),
            LossObjective::Dpace { .. } | LossObjective::Tree(_) => micro
                .labels
                .valid
                .iter()
                .map(|&v| f32::from(u8::from(v)))
                .collect(),
        };
        let weights = Tensor::from_slice(&weights)
            .view([b, q])
            .to_device(self.device);
        let inputs = DrafterInputs {
            target_features: states.features,
            block_embeddings: &embeddings,
            anchors: &anchors,
            keep: &keep,
        };
        if self.drafter.dspark().is_some() {
            let dspark_inputs = self.dspark_inputs(states, micro, (&anchors, &keep), dspark);
            let head = self.drafter.dspark().expect("checked above");
            let batch = dspark_inputs.batch(head, &self.lm_head);
            return self.drafter.forward_backward(
                &inputs,
                backend,
                activation_checkpointing,
                |out| dspark_backward(out, &batch, 1.0, chunk_positions),
            );
        }
        if let Some(selector) = self.drafter.selector() {
            let batch = Dflash2Batch {
                selector,
                lm_head: &self.lm_head,
                targets: &targets,
                weights: &weights,
                block_size: bs as i64,
                selector_alpha: schedule.selector_alpha,
                stop_gradient: selector_stop_gradient,
            };
            return self.drafter.forward_backward(
                &inputs,
                backend,
                activation_checkpointing,
                |out| dflash2_backward(out, &batch, objective, 1.0, chunk_positions),
            );
        }
        self.drafter
            .forward_backward(&inputs, backend, activation_checkpointing, |out| {
                match (self.drafter.domino(), objective) {
                    (Some(head), _) => {
                        // Teacher forcing: the GRU reads each block's true tokens, which are the
                        // slots' labels (slot 0's is the anchor).
                        let label_embeddings =
                            tch::no_grad(|| self.embed.index_select(0, &targets.view([-1])))
                                .view([b, q, -1]);
                        let batch = DominoBatch {
                            head,
                            lm_head: &self.lm_head,
                            label_embeddings: &label_embeddings,
                            targets: &targets,
                            weights: &weights,
                            block_size: bs as i64,
                        };
                        domino_ce_backward(
                            out,
                            &batch,
                            objective,
                            schedule.lambda_base,
                            1.0,
                            chunk_positions,
                        )
                    }
                    (None, LossObjective::Dflash) => weighted_ce_backward(
                        out,
                        &self.lm_head,
                        &targets,
                        &weights,
                        1.0,
                        chunk_positions,
                    ),
                    (None, block @ (LossObjective::Dpace { .. } | LossObjective::Tree(_))) => {
                        let batch = BlockObjectiveBatch {
                            lm_head: &self.lm_head,
                            targets: &targets,
                            mask: &weights,
                            block_size: bs as i64,
                        };
                        block_objective_backward(out, &batch, block, 1.0, chunk_positions)
                    }
                }
            })
    }

    /// What DSpark's loss reads of a micro-batch besides the drafter's output: the next-token
    /// labels and weights the micro-batch was built with, the tokens before each slot, and the
    /// target's last hidden state at each slot's label − 1, on this replica's device.
    fn dspark_inputs(
        &self,
        states: TargetStates<'_>,
        micro: &PreparedMicro,
        anchors_keep: (&Tensor, &Tensor),
        loss_weights: DsparkLossWeights,
    ) -> DsparkInputs {
        let bs = self.drafter.config().block_size;
        let last_hidden = states.last_hidden.expect(
            "a DSpark drafter's micro-batches carry the target's last hidden state \
             (DrafterHead::needs_target_last_hidden)",
        );
        let last_hidden = last_hidden
            .to_device(self.device)
            .to_kind(self.lm_head.kind());
        DsparkInputs::new(
            &micro.labels,
            &micro.prev_token_ids(bs as usize),
            &last_hidden,
            anchors_keep,
            bs,
            loss_weights,
        )
    }

    /// Elements of all parameters.
    pub fn param_elements(&self) -> i64 {
        self.optimizer.param_numels().iter().sum()
    }

    /// The current gradients in the optimizer's parameter order, for summing across replicas
    /// in place: the parameters' own gradient tensors (so a sum written into them is what
    /// [`Self::apply`] then uses), and zeros of the parameter's shape and dtype where a
    /// parameter has none (another replica may have one, and the update must see the sum).
    pub fn grads_for_reduce(&self) -> Vec<Tensor> {
        tch::no_grad(|| {
            self.optimizer
                .param_grads()
                .into_iter()
                .zip(self.optimizer.param_shapes())
                .map(|(grad, shape)| {
                    if grad.defined() {
                        grad
                    } else {
                        Tensor::zeros(shape.as_slice(), (compute_kind(self.device), self.device))
                    }
                })
                .collect()
        })
    }

    /// The AdamW update at `lr` on `scale ×` the gradients: the parameters' own gradients, or
    /// (`reduced`) the list [`Self::grads_for_reduce`] returned, summed across replicas.
    /// Gradients are cleared afterwards, whatever the outcome.
    pub fn apply(
        &mut self,
        lr: f64,
        reduced: Option<&[Tensor]>,
        scale: f64,
    ) -> Result<StepReport, OptimError> {
        let report = match reduced {
            None => self.optimizer.step_scaled(lr, scale),
            Some(grads) => self.optimizer.step_with_grads(lr, grads, scale),
        };
        self.optimizer.zero_grad();
        report
    }

    /// Clears gradients (after a warmup pass, which must not train).
    pub fn zero_grad(&mut self) {
        self.optimizer.zero_grad();
    }

    /// Deep copies of the fp32 master weights, the moments and the step counter, on the CPU.
    pub fn state(&self) -> ReplicaState {
        let copy = |list: Vec<(String, Tensor)>| -> HashMap<String, Tensor> {
            list.into_iter()
                .map(|(n, t)| (n, t.to_device(Device::Cpu).copy()))
                .collect()
        };
        ReplicaState {
            master: copy(self.optimizer.master_weights()),
            moments: copy(self.optimizer.moment_tensors()),
            optimizer_step: self.optimizer.step_count(),
        }
    }

    /// Takes `weights` as the initial weights of a replica that has not stepped (a warm start,
    /// `train/warm_start.rs`); the moments stay zero.
    pub fn initialise_weights(
        &mut self,
        weights: &HashMap<String, Tensor>,
    ) -> Result<(), OptimError> {
        self.optimizer.initialise_weights(weights)
    }

    /// Takes over weights, moments and step counter (every tensor must be present).
    pub fn load_state(&mut self, state: &ReplicaState) -> Result<(), OptimError> {
        self.optimizer
            .restore(&state.master, &state.moments, state.optimizer_step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded;
    use crate::model::target::{TargetConfig, TargetModel};

    #[test]
    fn a_replica_has_the_same_weights_and_moments() {
        let target = TargetModel::random(TargetConfig::tiny_default(), Device::Cpu, Kind::Float, 1);
        let cfg = embedded::tiny_drafter_config(target.config());
        let a = DrafterReplica::seeded(
            &cfg,
            target.embed_tokens(),
            target.lm_head(),
            Device::Cpu,
            AdamWConfig::default(),
            1,
        );
        let b = a.replicate(Device::Cpu).unwrap();
        let (wa, wb) = (a.optimizer.master_weights(), b.optimizer.master_weights());
        assert_eq!(wa.len(), wb.len());
        for ((na, ta), (nb, tb)) in wa.iter().zip(&wb) {
            assert_eq!(na, nb);
            assert!(ta.equal(tb), "{na}");
            assert_ne!(ta.data_ptr(), tb.data_ptr(), "{na} must not share storage");
        }
        assert_eq!(a.param_elements(), b.param_elements());
    }
}
