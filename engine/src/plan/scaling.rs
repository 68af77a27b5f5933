//! Cross-node scaling, on paper: the gradient all-reduce a data-parallel job of `n` nodes
//! would add to each step, whether the step hides it, and the node count at which adding
//! nodes stops paying. Pure arithmetic over the plan's own per-step figures.
//!
//! **A prediction of a reduce not built yet.** dflashd's multi-node jobs run nodes of several
//! target and drafter GPUs each, every drafter GPU of every node one rank of one flat group;
//! the reduce this model plans, inside the node and then across, is not built (the flat
//! ring's figure, [`flat_ring_seconds`], is what the build runs). Every figure is a
//! prediction of this model.
//!
//! The model, term by term:
//!
//! - **What crosses.** The drafter's trainable parameters ([`super::drafter::drafter_params`];
//!   the frozen embedding and LM head are not reduced) at the all-reduce's element size. Today's
//!   code copies the gradients (bf16 on CUDA) into an fp32 bucket and sums that
//!   (`collective/allreduce.rs::sum_in_buckets`, `collective/bucket.rs`), so the element size
//!   is [`ALLREDUCE_BYTES_PER_ELEMENT`]: 4 bytes, not bf16's 2.
//! - **How it crosses.** Hierarchical: the drafter GPUs of a node reduce among themselves over
//!   NVLink (not counted: an order of magnitude faster than the network, and a cost the
//!   one-node run already pays, which the one-node step does not count either), then a ring runs across the `n` nodes. In a ring all-reduce
//!   each participant sends and receives `2·(n−1)/n` of the buffer ([`ring_factor`]); with the
//!   node as the participant that is `2·(n−1)/n · S` bytes through each node's network link,
//!   in each direction, whichever GPUs of the node carry the shards. That is the least any
//!   all-reduce can move per node, which is why it is the prediction. One flat ring over all
//!   `N = n·g` drafter GPUs (one communicator and no hierarchy) crosses each node boundary with
//!   `2·(N−1)/N · S` instead; [`flat_ring_seconds`] gives that figure beside it.
//! - **The link.** `gbps` is the node's inter-node bandwidth available to the drafter GPUs, in
//!   Gb/s (10⁹ bits/s) per direction: the sum of their NICs'. Only bandwidth is counted: no
//!   per-hop latency, no congestion, no straggler.
//! - **The step.** The drafter ranks wait for their items in a queue the target workers fill,
//!   so a node's step takes `max(target, drafter compute + all-reduce)`: the all-reduce
//!   runs after the step's last backward (`train/topology/rank.rs::step`: forward and backward
//!   of every micro-batch, then `sum_in_buckets`), so it does **not** overlap the backward
//!   today. It is hidden only while the drafter would otherwise wait for the target.
//!   [`StepPrediction::if_overlapped_step_s`] says what an all-reduce overlapped with the last
//!   micro-batch's backward (not built) would give.
//! - **When it stops paying.** Per-node efficiency `E(n) = step(1) / step(n)`: each node's
//!   tokens/s at `n` nodes over one node's. It never rises with `n`. The recommendation is the
//!   largest `n` (up to [`SCAN_MAX_NODES`]) with `E(n) ≥ min_efficiency`: past it every
//!   added node's GPUs deliver less than that share of what they deliver alone.
use serde::Serialize;

use super::run::{RunPlan, RunSpec};
use crate::collective::bucket::{ALLREDUCE_BUCKET_BYTES, ALLREDUCE_BUCKET_ELEMENTS};

/// Bytes of one gradient element as the all-reduce moves it: the bucket's (fp32 today).
pub const ALLREDUCE_BYTES_PER_ELEMENT: f64 =
    ALLREDUCE_BUCKET_BYTES as f64 / ALLREDUCE_BUCKET_ELEMENTS as f64;

/// The largest node count the recommendation scans.
pub const SCAN_MAX_NODES: usize = 256;

/// The per-node efficiency below which the recommendation says scaling stops paying, unless
/// the caller states another: a choice, not a source (below it a fifth of every added GPU-hour
/// waits on the network).
pub const DEFAULT_MIN_EFFICIENCY: f64 = 0.8;

/// Node counts the table always shows.
pub const TABLE_NODES: [usize; 5] = [1, 2, 4, 8, 16];

/// What one line of the plan says about every prediction below.
pub const PREDICTION_STATUS: &str =
    "multi-node jobs run nodes of several target and drafter GPUs each, every drafter GPU one \
     rank of one flat group (the flat ring below); the reduce inside the node and then across \
     it, as planned here, is not built yet, and these figures predict it, they measure nothing";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScalingError {
    #[error("--nnodes: expected a node count of at least 1, found {0} (pass e.g. --nnodes 2)")]
    NoNodes(usize),
    #[error(
        "--inter-node-gbps: expected a positive, finite bandwidth in Gb/s, found {0} (pass each \
         node's inter-node bandwidth, e.g. --inter-node-gbps 200)"
    )]
    BadBandwidth(f64),
    #[error(
        "--min-scaling-efficiency: expected a fraction in (0, 1], found {0} (e.g. \
         --min-scaling-efficiency 0.8)"
    )]
    BadEfficiency(f64),
    #[error("the drafter has no parameters to reduce ({0})")]
    NoParameters(f64),
}

/// One node's step, from the plan's per-step prediction (seconds at its MFU).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NodeStep {
    /// Training tokens one node's step takes (drafter ranks × grad_accum × batch × row).
    pub tokens: f64,
    /// The target side's time for those tokens (0 when one device runs both roles: then
    /// `drafter_compute_s` holds both, in turn).
    pub target_s: f64,
    /// One drafter rank's forward and backward of its micro-batches.
    pub drafter_compute_s: f64,
    /// The backward of the step's last micro-batch: what an all-reduce overlapped with the
    /// backward could hide behind.
    pub last_backward_s: f64,
}

impl NodeStep {
    /// The step without any cross-node all-reduce: today's one-node prediction.
    pub fn one_node_s(&self) -> f64 {
        self.target_s.max(self.drafter_compute_s)
    }

    /// The step with an all-reduce of `allreduce_s` after the backward (today's code).
    pub fn step_s(&self, allreduce_s: f64) -> f64 {
        self.target_s.max(self.drafter_compute_s + allreduce_s)
    }

    /// The step were the all-reduce overlapped with the last micro-batch's backward.
    pub fn overlapped_step_s(&self, allreduce_s: f64) -> f64 {
        self.target_s
            .max(self.drafter_compute_s + (allreduce_s - self.last_backward_s).max(0.0))
    }
}

/// One node's step as the plan predicts it (`plan_run` on `spec`), with `grad_accum`
/// micro-batches per rank per optimizer step
/// (`train/topology/step.rs::MicroBatchAssignment`): the same model FLOPs at the same MFU as
/// `RunPlan::tokens_per_s_at_mfu`, so `tokens / one_node_s()` is its `run` figure. `None`
/// without a peak FLOP/s.
pub fn node_step(spec: &RunSpec, plan: &RunPlan, grad_accum: usize) -> Option<NodeStep> {
    let useful = spec.peak_flops? * spec.mfu;
    let micro_tokens = (spec.step.batch * spec.step.seq_len) as f64;
    let inline = spec.target_devices.is_empty();
    let ranks = if inline {
        1
    } else {
        spec.drafter_devices.len().max(1)
    };
    let per_rank = grad_accum.max(1) as f64 * micro_tokens;
    let tokens = ranks as f64 * per_rank;
    let f = plan.flops_per_token;
    let last_backward_s = micro_tokens * plan.drafter_backward_flops_per_token / useful;
    Some(if inline {
        // One device runs the target's forward and the drafter's step in turn.
        NodeStep {
            tokens,
            target_s: 0.0,
            drafter_compute_s: per_rank * (f.target + f.drafter) / useful,
            last_backward_s,
        }
    } else {
        NodeStep {
            tokens,
            target_s: tokens * f.target / (spec.target_devices.len() as f64 * useful),
            drafter_compute_s: per_rank * f.drafter / useful,
            last_backward_s,
        }
    })
}

/// What the caller knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalingInput {
    pub nnodes: usize,
    pub inter_node_gbps: f64,
    /// Trainable drafter parameters.
    pub drafter_params: f64,
    /// Drafter GPUs (ranks) on each node.
    pub drafter_gpus_per_node: usize,
    /// `None` without a peak FLOP/s: bytes and the all-reduce time only.
    pub step: Option<NodeStep>,
    pub min_efficiency: f64,
}

/// `2·(n−1)/n`: the share of the buffer each ring participant sends (and receives).
pub fn ring_factor(participants: usize) -> f64 {
    if participants == 0 {
        return 0.0;
    }
    2.0 * (participants - 1) as f64 / participants as f64
}

/// Bytes of gradients one all-reduce sums.
pub fn gradient_bytes(params: f64, bytes_per_element: f64) -> f64 {
    params * bytes_per_element
}

/// Bytes per second in each direction of a link of `gbps` Gb/s.
pub fn link_bytes_per_s(gbps: f64) -> f64 {
    gbps * 1e9 / 8.0
}

/// The hierarchical all-reduce's time across `nodes` nodes: `2·(n−1)/n · S` through each
/// node's link.
pub fn allreduce_seconds(grad_bytes: f64, nodes: usize, gbps: f64) -> f64 {
    ring_factor(nodes) * grad_bytes / link_bytes_per_s(gbps)
}

/// One flat ring over all `nodes · gpus_per_node` drafter GPUs: `2·(N−1)/N · S` through each
/// node's link. With one node nothing crosses.
pub fn flat_ring_seconds(grad_bytes: f64, nodes: usize, gpus_per_node: usize, gbps: f64) -> f64 {
    if nodes <= 1 {
        return 0.0;
    }
    ring_factor(nodes * gpus_per_node.max(1)) * grad_bytes / link_bytes_per_s(gbps)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Nothing crosses (one node).
    NothingToReduce,
    /// The drafter would have waited for the target at least as long.
    Hidden,
    /// The step grows: part of the all-reduce is beyond the drafter's wait for the target.
    AddsToStep,
}

/// The requested node count's step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPrediction {
    pub node_step: NodeStep,
    pub one_node_step_s: f64,
    pub step_s: f64,
    /// `step_s − one_node_step_s`.
    pub added_s: f64,
    pub verdict: Verdict,
    /// Whether today's code overlaps the all-reduce with the backward: it does not.
    pub overlapped_with_backward: bool,
    /// The step were the all-reduce overlapped with the last micro-batch's backward (not built).
    pub if_overlapped_step_s: f64,
    pub tokens_per_s: f64,
    pub one_node_tokens_per_s: f64,
    pub efficiency: f64,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScalingRow {
    pub nodes: usize,
    pub bytes_per_node: f64,
    pub allreduce_s: f64,
    /// With a step prediction only.
    pub step_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    pub efficiency: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    pub min_efficiency: f64,
    /// The largest count with `E(n) ≥ min_efficiency`, `None` when none up to
    /// [`SCAN_MAX_NODES`] falls below it.
    pub nodes: Option<usize>,
    /// The efficiency the model tends to as `n` grows: `step(1) / step(∞)`.
    pub limit_efficiency: f64,
    pub rule: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingPlan {
    /// [`PREDICTION_STATUS`].
    pub status: &'static str,
    pub nnodes: usize,
    pub inter_node_gbps: f64,
    pub drafter_params: f64,
    pub allreduce_dtype: &'static str,
    pub bytes_per_element: f64,
    pub gradient_bytes: f64,
    pub ring_factor: f64,
    /// `ring_factor · gradient_bytes`: through each node's link per step, each direction.
    pub bytes_per_node: f64,
    pub allreduce_s: f64,
    pub drafter_gpus_per_node: usize,
    pub flat_ring_allreduce_s: f64,
    pub step: Option<StepPrediction>,
    pub table: Vec<ScalingRow>,
    pub recommendation: Option<Recommendation>,
    /// Why there is no step, verdict or recommendation, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

/// The name of an all-reduce element size.
fn dtype_name(bytes: f64) -> &'static str {
    if bytes == 4.0 {
        "fp32"
    } else if bytes == 2.0 {
        "bf16"
    } else {
        "other"
    }
}

/// The largest `n ≤ SCAN_MAX_NODES` with `E(n) ≥ min`; `None` when even the last does.
fn recommend(step: &NodeStep, grad_bytes: f64, gbps: f64, min: f64) -> Recommendation {
    let one = step.one_node_s();
    let efficiency = |n: usize| one / step.step_s(allreduce_seconds(grad_bytes, n, gbps));
    let nodes = if efficiency(SCAN_MAX_NODES) >= min {
        None
    } else {
        // E never rises with n, so the first count below the bar ends the scan.
        Some(
            (1..=SCAN_MAX_NODES)
                .take_while(|&n| efficiency(n) >= min)
                .last()
                .unwrap_or(1),
        )
    };
    let limit_efficiency = one / step.step_s(2.0 * grad_bytes / link_bytes_per_s(gbps));
    let pct = min * 100.0;
    let rule = match nodes {
        Some(n) => format!(
            "{n} node{}: the largest count at which each node still gets at least {pct:.0} % of \
             one node's tokens/s (per-node efficiency step(1)/step(n))",
            if n == 1 { "" } else { "s" }
        ),
        None => format!(
            "no limit up to {SCAN_MAX_NODES} nodes: per-node efficiency step(1)/step(n) tends to \
             {:.0} % (the ring's traffic per node never exceeds twice the gradient bytes), above \
             the {pct:.0} % bar; this bandwidth-only model has no latency or straggler term to \
             set one",
            limit_efficiency * 100.0
        ),
    };
    Recommendation {
        min_efficiency: min,
        nodes,
        limit_efficiency,
        rule,
    }
}

/// The caller's figures, checked before anything else is read.
pub fn validate(nnodes: usize, gbps: f64, min_efficiency: f64) -> Result<(), ScalingError> {
    if nnodes == 0 {
        return Err(ScalingError::NoNodes(nnodes));
    }
    if !(gbps.is_finite() && gbps > 0.0) {
        return Err(ScalingError::BadBandwidth(gbps));
    }
    if !(min_efficiency > 0.0 && min_efficiency <= 1.0) {
        return Err(ScalingError::BadEfficiency(min_efficiency));
    }
    Ok(())
}

pub fn scaling_plan(input: &ScalingInput) -> Result<ScalingPlan, ScalingError> {
    let (n, gbps, min) = (input.nnodes, input.inter_node_gbps, input.min_efficiency);
    validate(n, gbps, min)?;
    if !(input.drafter_params.is_finite() && input.drafter_params > 0.0) {
        return Err(ScalingError::NoParameters(input.drafter_params));
    }
    let bytes_per_element = ALLREDUCE_BYTES_PER_ELEMENT;
    let grad_bytes = gradient_bytes(input.drafter_params, bytes_per_element);
    let allreduce_s = allreduce_seconds(grad_bytes, n, gbps);
    let mut nodes: Vec<usize> = TABLE_NODES.to_vec();
    if !nodes.contains(&n) {
        nodes.push(n);
        nodes.sort_unstable();
    }
    let row = |k: usize| {
        let ar = allreduce_seconds(grad_bytes, k, gbps);
        let timed = input.step.map(|s| {
            let step_s = s.step_s(ar);
            (
                step_s,
                k as f64 * s.tokens / step_s,
                s.one_node_s() / step_s,
            )
        });
        ScalingRow {
            nodes: k,
            bytes_per_node: ring_factor(k) * grad_bytes,
            allreduce_s: ar,
            step_s: timed.map(|t| t.0),
            tokens_per_s: timed.map(|t| t.1),
            efficiency: timed.map(|t| t.2),
        }
    };
    let step = input.step.map(|s| {
        let one = s.one_node_s();
        let step_s = s.step_s(allreduce_s);
        let verdict = if n == 1 {
            Verdict::NothingToReduce
        } else if step_s <= one {
            Verdict::Hidden
        } else {
            Verdict::AddsToStep
        };
        StepPrediction {
            node_step: s,
            one_node_step_s: one,
            step_s,
            added_s: step_s - one,
            verdict,
            overlapped_with_backward: false,
            if_overlapped_step_s: s.overlapped_step_s(allreduce_s),
            tokens_per_s: n as f64 * s.tokens / step_s,
            one_node_tokens_per_s: s.tokens / one,
            efficiency: one / step_s,
        }
    });
    Ok(ScalingPlan {
        status: PREDICTION_STATUS,
        nnodes: n,
        inter_node_gbps: gbps,
        drafter_params: input.drafter_params,
        allreduce_dtype: dtype_name(bytes_per_element),
        bytes_per_element,
        gradient_bytes: grad_bytes,
        ring_factor: ring_factor(n),
        bytes_per_node: ring_factor(n) * grad_bytes,
        allreduce_s,
        drafter_gpus_per_node: input.drafter_gpus_per_node,
        flat_ring_allreduce_s: flat_ring_seconds(grad_bytes, n, input.drafter_gpus_per_node, gbps),
        step,
        table: nodes.into_iter().map(row).collect(),
        recommendation: input.step.map(|s| recommend(&s, grad_bytes, gbps, min)),
        missing: input.step.is_none().then(|| {
            "no step time without a peak FLOP/s: pass --peak-tflops (the device's dense bf16 \
             datasheet figure) for the step, the verdict and the recommendation"
                .to_string()
        }),
    })
}

#[cfg(test)]
#[path = "scaling_tests.rs"]
mod tests;
