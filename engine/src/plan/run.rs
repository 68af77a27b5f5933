//! The whole topology: each device's predicted peak and whether it fits, the FLOPs per token
//! of both sides, tokens/s at an MFU, which side bounds the run and the best integer split.
use super::drafter::{drafter_memory, DrafterMemory, RankContext};
use super::flops::{
    drafter_step_executed_flops, drafter_step_flops, target_forward_flops, StepWork,
};
use super::shape::{ActivationPrecision, StepShape};
use super::target::target_memory;
use super::{top_consumers, Consumer, GIB};
use crate::model::drafter::DrafterConfig;
use crate::model::target::{FeatureRequest, TargetConfig};

/// What a run is, for the model.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub drafter: DrafterConfig,
    pub target: TargetConfig,
    pub step: StepShape,
    /// Device names; empty `target_devices` means one device runs both roles (inline).
    pub target_devices: Vec<String>,
    pub drafter_devices: Vec<String>,
    pub precision: ActivationPrecision,
    /// `training.activation_checkpointing`.
    pub activation_checkpointing: bool,
    /// Items that can wait in each drafter rank's queue (`topology/step.rs::per_rank_queue`).
    pub queued_items_per_rank: usize,
    /// Memory of each device, bytes (NVML, `--gpu-memory-gib`, or host memory on CPU).
    pub device_memory_bytes: Option<f64>,
    /// Memory the device's runtime takes before any tensor (CUDA context, library
    /// workspaces); an allowance the caller states, not something this model knows.
    pub runtime_reserve_bytes: f64,
    /// Dense peak FLOP/s of one device, when known, and the MFU to assume.
    pub peak_flops: Option<f64>,
    pub mfu: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Target,
    Drafter,
    /// One device for both (the CPU default).
    TargetAndDrafter,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DevicePlan {
    pub device: String,
    pub role: Role,
    pub predicted_peak_gib: f64,
    pub capacity_gib: Option<f64>,
    pub fits: Option<bool>,
    pub top_consumers: Vec<ConsumerGib>,
    /// Every consumer, for `--json` readers who want the whole breakdown.
    pub consumers: Vec<ConsumerGib>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ConsumerGib {
    pub name: String,
    pub gib: f64,
}

impl From<&Consumer> for ConsumerGib {
    fn from(c: &Consumer) -> Self {
        Self {
            name: c.name.clone(),
            gib: c.gib(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SideFlops {
    pub target: f64,
    pub drafter: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Split {
    pub target_devices: usize,
    pub drafter_devices: usize,
    /// Sequences per second of the split relative to the configured one (same MFU).
    pub speedup_over_configured: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Throughput {
    pub mfu: f64,
    pub peak_flops_per_device: Option<f64>,
    /// Training-sequence tokens per second one device of each side sustains at `mfu`.
    pub target_per_device: Option<f64>,
    pub drafter_per_device: Option<f64>,
    /// The configured topology's tokens/s: the slower side's total.
    pub run: Option<f64>,
    /// Why there is no figure, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunPlan {
    pub seq_len: i64,
    pub draft_positions_per_sequence: i64,
    pub devices: Vec<DevicePlan>,
    /// `None` when no device memory is known.
    pub fits: Option<bool>,
    pub bound_by: Role,
    /// Model FLOPs (useful work only), what MFU and the throughput below count.
    pub flops_per_token: SideFlops,
    pub flops_per_sequence: SideFlops,
    /// What the drafter's kernels execute per training token
    /// (`flops::drafter_step_executed_flops`: every key of each fused attention call, and the
    /// layers recomputed under activation checkpointing); `flops_per_token.drafter` over this
    /// is the share of the drafter's work that is useful.
    pub drafter_executed_flops_per_token: f64,
    /// The backward's share of `flops_per_token.drafter` (model FLOPs; with activation
    /// checkpointing the recomputed forward is not in it).
    pub drafter_backward_flops_per_token: f64,
    pub tokens_per_s_at_mfu: Throughput,
    pub recommended_split: Option<Split>,
    pub drafter_peak_phase: &'static str,
    /// Whether the drafter step recomputes its layers (`training.activation_checkpointing`).
    pub activation_checkpointing: bool,
    pub chunks_per_layer: Vec<usize>,
}

impl RunPlan {
    /// Devices predicted not to fit.
    pub fn over_capacity(&self) -> impl Iterator<Item = &DevicePlan> {
        self.devices.iter().filter(|d| d.fits == Some(false))
    }
}

/// The best integer split of `total` devices: the target count maximising
/// `min(T / target_cost, D / drafter_cost)` (both sides at the same MFU), ties to fewer
/// target devices. `None` with fewer than two devices.
pub fn best_split(total: usize, target_cost: f64, drafter_cost: f64) -> Option<(usize, usize)> {
    (1..total)
        .map(|t| {
            let rate = (t as f64 / target_cost).min((total - t) as f64 / drafter_cost);
            (t, rate)
        })
        .fold(None, |best: Option<(usize, f64)>, (t, r)| match best {
            Some((_, br)) if br >= r => best,
            _ => Some((t, r)),
        })
        .map(|(t, _)| (t, total - t))
}

pub fn plan_run(spec: &RunSpec) -> RunPlan {
    plan_carrying(spec, spec.drafter.head.needs_target_last_hidden())
}

/// [`plan_run`] for a run whose items carry the target's last hidden state beside the
/// features (`carries_last_hidden`, which the head decides): the target's pass then runs to
/// its last layer and keeps one more state, the queued items grow by it, and the drafter
/// computes the teacher's logits at every weighted position.
fn plan_carrying(spec: &RunSpec, carries_last_hidden: bool) -> RunPlan {
    let d = &spec.drafter;
    let s = &spec.step;
    let inline = spec.target_devices.is_empty();
    let layers_read = FeatureRequest {
        layer_ids: d.target_layer_ids.clone(),
        last_hidden: carries_last_hidden,
    }
    .layers_read(spec.target.num_layers());
    let drafter = drafter_memory(d, s, rank_context(spec, carries_last_hidden));
    let devices = device_plans(spec, &drafter, &layers_read);
    let fits = spec
        .device_memory_bytes
        .map(|_| devices.iter().all(|d| d.fits == Some(true)));

    let tokens = (s.batch * s.seq_len) as f64;
    let work = StepWork {
        drafter: d,
        batch: s.batch,
        seq_len: s.seq_len,
        anchors: &s.anchors,
        keep: &s.keep,
        weighted_positions: s.weighted_positions,
        corrected_positions: s.corrected_positions,
        head_positions: s.head_positions,
        teacher_positions: if carries_last_hidden {
            s.weighted_positions
        } else {
            0
        },
        vocab_size: d.vocab_size,
    };
    let per_sequence = |total: f64| total / s.batch.max(1) as f64;
    let drafter_flops = drafter_step_flops(&work);
    let drafter_step = drafter_flops.total();
    let drafter_executed =
        drafter_step_executed_flops(&work, spec.activation_checkpointing).total();
    let target_fwd = target_forward_flops(&spec.target, &layers_read, s.batch, s.seq_len);
    let flops_per_token = SideFlops {
        target: target_fwd / tokens,
        drafter: drafter_step / tokens,
    };
    let counts = if inline {
        (1, 1)
    } else {
        (spec.target_devices.len(), spec.drafter_devices.len())
    };
    RunPlan {
        seq_len: s.seq_len,
        draft_positions_per_sequence: s.width() * d.block_size,
        devices,
        fits,
        bound_by: bound_by(inline, counts, &flops_per_token),
        drafter_executed_flops_per_token: drafter_executed / tokens,
        drafter_backward_flops_per_token: drafter_flops.backward / tokens,
        flops_per_sequence: SideFlops {
            target: per_sequence(target_fwd),
            drafter: per_sequence(drafter_step),
        },
        tokens_per_s_at_mfu: throughput_at_mfu(spec, inline, counts, &flops_per_token),
        recommended_split: (!inline)
            .then(|| recommended_split(counts, &flops_per_token))
            .flatten(),
        flops_per_token,
        drafter_peak_phase: drafter.peak_phase,
        activation_checkpointing: spec.activation_checkpointing,
        chunks_per_layer: drafter.chunks_per_layer,
    }
}

/// Bytes of one hidden-state item on its drafter rank (`topology/pipeline.rs::HiddenItem`):
/// the tap features `[B, S, n·H]` and, when the item carries it, the target's last hidden
/// state `[B, S, H]`, in the activation precision.
pub fn queue_item_bytes(
    d: &DrafterConfig,
    batch: i64,
    seq_len: i64,
    precision: ActivationPrecision,
    carries_last_hidden: bool,
) -> f64 {
    let last_hidden = if carries_last_hidden {
        d.target_hidden_size
    } else {
        0
    };
    (batch * seq_len * (d.feature_size() + last_hidden)) as f64 * precision.bytes()
}

/// What a drafter rank holds besides its own model: how many ranks split the optimizer's
/// work, whether the tables are the target's (inline), and the queue's waiting items.
fn rank_context(spec: &RunSpec, carries_last_hidden: bool) -> RankContext {
    let s = &spec.step;
    let inline = spec.target_devices.is_empty();
    let item_bytes = queue_item_bytes(
        &spec.drafter,
        s.batch,
        s.seq_len,
        spec.precision,
        carries_last_hidden,
    );
    RankContext {
        precision: spec.precision,
        ranks: if inline {
            1
        } else {
            spec.drafter_devices.len().max(1)
        },
        tables_shared_with_target: inline,
        queued_items: if inline {
            0
        } else {
            spec.queued_items_per_rank
        },
        item_bytes,
        activation_checkpointing: spec.activation_checkpointing,
    }
}

/// Each device's consumers, peak and fit: one device with both sides inline, else every
/// target device and every drafter device with its own side (and the runtime allowance).
/// `layers_read` are the target layers whose states its pass keeps.
fn device_plans(spec: &RunSpec, drafter: &DrafterMemory, layers_read: &[usize]) -> Vec<DevicePlan> {
    let s = &spec.step;
    let target = target_memory(
        &spec.target,
        layers_read,
        s.batch,
        s.seq_len,
        spec.precision,
    );
    let reserve = (spec.runtime_reserve_bytes > 0.0).then(|| {
        Consumer::new(
            "runtime context and workspaces (allowance)",
            spec.runtime_reserve_bytes,
        )
    });
    let device = |name: &str, role: Role, mut consumers: Vec<Consumer>| {
        consumers.extend(reserve.clone());
        let peak: f64 = consumers.iter().map(|c| c.bytes).sum();
        DevicePlan {
            device: name.to_string(),
            role,
            predicted_peak_gib: peak / GIB,
            capacity_gib: spec.device_memory_bytes.map(|b| b / GIB),
            fits: spec.device_memory_bytes.map(|b| peak <= b),
            top_consumers: top_consumers(&consumers, 3)
                .iter()
                .map(Into::into)
                .collect(),
            consumers: consumers.iter().map(Into::into).collect(),
        }
    };
    let drafter_consumers = || {
        let mut c = drafter.resident.clone();
        c.extend(drafter.step.iter().cloned());
        c
    };
    if spec.target_devices.is_empty() {
        let mut c = target;
        c.extend(drafter_consumers());
        let name = spec.drafter_devices.first().map_or("cpu", String::as_str);
        return vec![device(name, Role::TargetAndDrafter, c)];
    }
    spec.target_devices
        .iter()
        .map(|n| device(n, Role::Target, target.clone()))
        .chain(
            spec.drafter_devices
                .iter()
                .map(|n| device(n, Role::Drafter, drafter_consumers())),
        )
        .collect()
}

/// The side with the lower token rate over its devices bounds the run.
fn bound_by(inline: bool, (targets, drafters): (usize, usize), per_token: &SideFlops) -> Role {
    let target_rate = targets as f64 / per_token.target;
    let drafter_rate = drafters as f64 / per_token.drafter;
    if inline {
        Role::TargetAndDrafter
    } else if drafter_rate <= target_rate {
        Role::Drafter
    } else {
        Role::Target
    }
}

/// Tokens/s at the assumed MFU of the device's peak; with no peak, says which flag gives one.
fn throughput_at_mfu(
    spec: &RunSpec,
    inline: bool,
    (targets, drafters): (usize, usize),
    per_token: &SideFlops,
) -> Throughput {
    let Some(peak) = spec.peak_flops else {
        return Throughput {
            mfu: spec.mfu,
            peak_flops_per_device: None,
            target_per_device: None,
            drafter_per_device: None,
            run: None,
            missing: Some(
                "no peak FLOP/s for this device: pass --peak-tflops (the device's dense \
                 bf16 figure from its datasheet)"
                    .into(),
            ),
        };
    };
    let useful = peak * spec.mfu;
    let (t, dr) = (useful / per_token.target, useful / per_token.drafter);
    let run = if inline {
        // One device does both in turn.
        useful / (per_token.target + per_token.drafter)
    } else {
        (t * targets as f64).min(dr * drafters as f64)
    };
    Throughput {
        mfu: spec.mfu,
        peak_flops_per_device: Some(peak),
        target_per_device: Some(t),
        drafter_per_device: Some(dr),
        run: Some(run),
        missing: None,
    }
}

/// The best integer split of the same device count, and its speed-up over the configured one.
fn recommended_split((targets, drafters): (usize, usize), per_token: &SideFlops) -> Option<Split> {
    let (t, dr) = best_split(targets + drafters, per_token.target, per_token.drafter)?;
    let rate = |t: f64, dr: f64| (t / per_token.target).min(dr / per_token.drafter);
    Some(Split {
        target_devices: t,
        drafter_devices: dr,
        speedup_over_configured: rate(t as f64, dr as f64) / rate(targets as f64, drafters as f64),
    })
}

#[cfg(test)]
#[path = "run_tests.rs"]
pub(crate) mod tests;
