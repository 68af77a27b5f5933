//! Telemetry samples: what the daemon measures and streams to consoles.
//!
//! Every optional field is `None` when the number could not be read. A GPU figure that NVML or
//! libtorch did not report is never filled in with a guess.
use serde::{Deserialize, Serialize};

pub use online::{OnlineAcceptance, OnlineBase, ONLINE_KEY_PREFIX};
pub use tree::{chain_and_tree_words, tree_label, TreeOracleTau};

/// Unix time in milliseconds (UTC).
pub type TimestampMs = i64;

/// Wall time spent in each phase of one optimizer step, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimes {
    pub data_wait_ms: f64,
    pub target_forward_ms: f64,
    pub queue_wait_ms: f64,
    pub drafter_forward_backward_ms: f64,
    pub all_reduce_ms: f64,
    pub optimizer_ms: f64,
    pub total_ms: f64,
}

/// Throughput of one worker thread (one device).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerThroughput {
    /// e.g. "cuda:3" or "cpu".
    pub device: String,
    pub role: DeviceRole,
    /// Training-sequence tokens this worker consumed per second.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation: this worker's analytic FLOPs per second over its device's
    /// dense peak (measured on CPU, from a datasheet on CUDA). `None` for a device whose peak
    /// is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
}

/// One optimizer step. This is also the schema of a `--metrics-jsonl` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub ts_ms: TimestampMs,
    pub step: u64,
    /// The epoch this step trained on, counted from 1 (`epoch 3 / 6`).
    pub epoch: u32,
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub loss: f64,
    /// Top-1 accuracy over weighted draft positions.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub accuracy: f64,
    /// Offline acceptance length; only on evaluation steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau: Option<f64>,
    /// The same evaluation's DDTree oracle τ by budget, and the budget the drafter is served
    /// with; written flat, as `serve_tree_budget` and `tau_tree_oracle_<budget>` (see
    /// [`TreeOracleTau`]). Only on evaluation steps that scored trees; absent in files written
    /// before it.
    #[serde(flatten)]
    pub tau_tree: Option<TreeOracleTau>,
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub lr: f64,
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub grad_norm: f64,
    /// Tokens of training sequences consumed per second, all workers together.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub tokens_per_s: f64,
    /// Draft positions trained per second (kept anchors × block size), all ranks together:
    /// the figure that compares across anchor counts and block sizes.
    #[serde(default)]
    pub draft_positions_per_s: f64,
    /// All workers' analytic FLOPs per second over the sum of their devices' peaks; `None`
    /// unless every device's peak is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    #[serde(default)]
    pub workers: Vec<WorkerThroughput>,
    #[serde(default)]
    pub times: StepTimes,
    /// Online acceptance (real speculative decoding against the target) when the loop ran it
    /// at this line; written flat, as `online_tau_chain`, `online_tau_ddtree_<budget>`, … (see
    /// [`OnlineAcceptance`]). Absent in lines without one and in files written before it.
    #[serde(flatten)]
    pub online: Option<OnlineAcceptance>,
    /// A Domino drafter's curriculum and acceptance at this step, written flat under
    /// SpecForge's names (`lambda_base`, `final_loss`, `base_loss`, `accept_len`,
    /// `base_accept_len`). Absent for a DFlash drafter and in files written before it.
    #[serde(flatten)]
    pub domino: Option<DominoStepMetrics>,
    /// A DSpark drafter's loss terms, acceptance and confidence calibration at this step,
    /// written flat under SpecForge's names (`ce_loss`, `l1_loss`, `confidence_loss`,
    /// `tau_probabilistic`, …). Absent for another head and in files written before it.
    #[serde(flatten)]
    pub dspark: Option<DsparkStepMetrics>,
    /// A DFlash2 drafter's base and selector terms and acceptance at this step, written flat
    /// (`selector_alpha`, `selector_loss`, `unary_topk_recall`, `serving_accepted_length`, …).
    /// Absent for another head and in files written before it.
    #[serde(flatten)]
    pub dflash2: Option<Dflash2StepMetrics>,
    /// On a node of a multi-node job: every node's figures for this step, the job's totals and
    /// the node holding it back, if one is ([`crate::job`]). Absent for a single node and in
    /// files written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::job::JobView>,
}

impl StepMetrics {
    /// The tokens/s the run is judged by: the whole job's on a node of a multi-node job (its
    /// nodes' sum), else this process's. The throughput detector, the healthy record and the
    /// status headline all read this one figure, so they never compare one node with a job.
    pub fn judged_tokens_per_s(&self) -> f64 {
        self.job
            .as_ref()
            .map_or(self.tokens_per_s, |j| j.tokens_per_s)
    }

    /// Draft positions/s on the same footing as [`Self::judged_tokens_per_s`].
    pub fn judged_draft_positions_per_s(&self) -> f64 {
        self.job
            .as_ref()
            .map_or(self.draft_positions_per_s, |j| j.draft_positions_per_s)
    }
}

/// What a Domino step reports besides its loss (SpecForge's `OnlineDominoModel` metrics).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DominoStepMetrics {
    /// The curriculum's weight of the base loss at this step: `loss = (1−λ)·final + λ·base`.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub lambda_base: f64,
    /// The objective on the corrected logits.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub final_loss: f64,
    /// The objective on the LM head's logits alone.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub base_loss: f64,
    /// Mean over blocks with a supervised slot of 1 + the accepted prefix, teacher-forced,
    /// from the corrected logits.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub accept_len: f64,
    /// The same from the base logits: what the correction adds is the difference.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub base_accept_len: f64,
}

/// What a DSpark step reports besides its loss (SpecForge's `OnlineDSparkModel` metrics,
/// `dflash_family_model.py:1031-1063`), each a Σw-weighted mean over the step's slots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DsparkStepMetrics {
    /// The cross-entropy of the Markov-corrected logits against the data token.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub ce_loss: f64,
    /// Σ_v |q − p|: the drafter's distance from the target's own distribution.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub l1_loss: f64,
    /// The confidence head's binary cross-entropy against `a = 1 − L1/2` (0 without a head).
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub confidence_loss: f64,
    /// Mean over blocks of `1 + Σ_k Π_{i≤k} a_i`: the expected accepted length when the target
    /// samples, from the corrected logits.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub tau_probabilistic: f64,
    /// The same from the LM head's logits alone (the Markov head off): what the head adds is
    /// the difference, and a head that is silently ignored shows as none.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub base_tau_probabilistic: f64,
    /// Mean `a`: the acceptance probability the confidence head is trained to predict.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub acceptance_mean: f64,
    /// Mean σ(confidence logit): the confidence head's prediction of `a`. `None` without a
    /// confidence head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_mean: Option<f64>,
    /// Mean |σ(confidence logit) − a|. `None` without a confidence head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_abs_error: Option<f64>,
}

/// What a DFlash2 step reports besides its loss (SpecForge's `dflash/hard_label/...` and
/// `dflash2/selector/...` metrics), each over the step's training batch, teacher-forced.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dflash2StepMetrics {
    /// `α_eff`: the selector term's weight at this step.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub selector_alpha: f64,
    /// The base term alone (the unary scores' weighted cross-entropy).
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub base_loss: f64,
    /// The selector's cross-entropy over the slots whose gold is a candidate.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub selector_loss: f64,
    /// The share of supervised slots whose gold is among the unary top-K.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub unary_topk_recall: f64,
    /// Mean over blocks of 1 + the slots up to the first whose gold is no candidate: what a
    /// perfect selector would accept.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub oracle_accepted_length: f64,
    /// The share of supervised slots where the greedy walk from the anchor picks the gold.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub serving_accuracy: f64,
    /// Mean over blocks of 1 + the walk's leading hits: the selector's chain τ.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub serving_accepted_length: f64,
    /// The same from the unary argmax: the chain τ without the selector, so what the selector
    /// adds is the difference.
    #[serde(deserialize_with = "crate::serde_util::f64_or_nan")]
    pub unary_accepted_length: f64,
}

mod online;
mod tree;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceRole {
    Target,
    Drafter,
    /// A single device that runs both (the CPU default).
    Both,
    Idle,
}

/// libtorch caching-allocator statistics for one CUDA device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorStats {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
}

/// One NVML reading of one GPU. Fields NVML could not read are `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub ts_ms: TimestampMs,
    pub index: u32,
    pub name: String,
    /// NVML's UUID (`GPU-…`, or `MIG-…` for a MIG instance), the key DCGM labels its series
    /// with; `None` when NVML could not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub role: DeviceRole,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub utilization_pct: Option<u32>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorStats>,
}

/// Host-side reading, always available (sysinfo).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    pub ts_ms: TimestampMs,
    pub process_rss_bytes: u64,
    pub host_memory_used_bytes: u64,
    pub host_memory_total_bytes: u64,
    pub process_cpu_pct: f32,
}

/// Whether GPU telemetry exists at all, and why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GpuTelemetry {
    Available {
        gpus: Vec<GpuSample>,
    },
    /// e.g. "NVML unavailable: libnvidia-ml.so.1 not found".
    Unavailable {
        reason: String,
    },
}

/// The hidden-state queue between target and drafter workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub ts_ms: TimestampMs,
    pub depth: usize,
    pub capacity: usize,
    pub high_watermark: usize,
    pub low_watermark: usize,
    pub bytes_resident: u64,
    pub byte_cap: u64,
    /// Items pushed / popped per second over the last sampling interval.
    pub producer_rate: f64,
    pub consumer_rate: f64,
    /// Cumulative time producers spent blocked on a full queue.
    pub producer_blocked_ms: f64,
    /// Cumulative time consumers spent waiting on an empty queue.
    pub consumer_starved_ms: f64,
}

/// Warm/cold state of one compile or kernel cache directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheState {
    /// e.g. "torchinductor", "triton", "cuda_compute_cache", "dflash_warmup".
    pub name: String,
    pub path: String,
    pub present: bool,
    pub size_bytes: u64,
    pub entries: u64,
    pub last_change_ms: Option<TimestampMs>,
    pub warm: bool,
}

#[cfg(test)]
mod domino_line_tests {
    use super::*;

    #[test]
    fn a_domino_step_writes_specforges_names_flat_and_a_dflash_line_has_none() {
        let mut line: StepMetrics = serde_json::from_str(
            r#"{"ts_ms":1,"step":2,"epoch":1,"loss":2.0,"accuracy":0.5,"lr":0.001,
                "grad_norm":1.0,"tokens_per_s":10.0}"#,
        )
        .unwrap();
        assert_eq!(
            line.domino, None,
            "a line without the keys has no Domino figures"
        );
        line.domino = Some(DominoStepMetrics {
            lambda_base: 0.75,
            final_loss: 2.25,
            base_loss: 1.25,
            accept_len: 2.5,
            base_accept_len: 2.0,
        });
        let json = serde_json::to_value(&line).unwrap();
        for (key, value) in [
            ("lambda_base", 0.75),
            ("final_loss", 2.25),
            ("base_loss", 1.25),
            ("accept_len", 2.5),
            ("base_accept_len", 2.0),
        ] {
            assert_eq!(json[key].as_f64(), Some(value), "{key}");
        }
        let back: StepMetrics = serde_json::from_value(json).unwrap();
        assert_eq!(back, line);
    }
}

#[cfg(test)]
mod dspark_line_tests {
    use super::*;

    #[test]
    fn a_dspark_step_writes_specforges_names_flat_and_another_line_has_none() {
        let mut line: StepMetrics = serde_json::from_str(
            r#"{"ts_ms":1,"step":2,"epoch":1,"loss":2.0,"accuracy":0.5,"lr":0.001,
                "grad_norm":1.0,"tokens_per_s":10.0}"#,
        )
        .unwrap();
        assert_eq!(
            line.dspark, None,
            "a line without the keys has no DSpark figures"
        );
        line.dspark = Some(DsparkStepMetrics {
            ce_loss: 2.5,
            l1_loss: 0.75,
            confidence_loss: 0.5,
            tau_probabilistic: 3.25,
            base_tau_probabilistic: 2.75,
            acceptance_mean: 0.625,
            confidence_mean: Some(0.5),
            confidence_abs_error: Some(0.125),
        });
        let json = serde_json::to_value(&line).unwrap();
        for (key, value) in [
            ("ce_loss", 2.5),
            ("l1_loss", 0.75),
            ("confidence_loss", 0.5),
            ("tau_probabilistic", 3.25),
            ("base_tau_probabilistic", 2.75),
            ("acceptance_mean", 0.625),
            ("confidence_mean", 0.5),
            ("confidence_abs_error", 0.125),
        ] {
            assert_eq!(json[key].as_f64(), Some(value), "{key}");
        }
        let back: StepMetrics = serde_json::from_value(json).unwrap();
        assert_eq!(back, line);
        // Without a confidence head the two keys are left out, and the line still reads back.
        let mut headless = line.clone();
        if let Some(d) = headless.dspark.as_mut() {
            d.confidence_mean = None;
            d.confidence_abs_error = None;
        }
        let json = serde_json::to_value(&headless).unwrap();
        assert!(json.get("confidence_mean").is_none());
        assert_eq!(
            serde_json::from_value::<StepMetrics>(json).unwrap(),
            headless
        );
    }
}
