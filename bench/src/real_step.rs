//! The GPU check's drafter step at the real structure (`scripts/gpu-check.sh`, step 3): the
//! training path's own calls (`MicroSource::prepare` → `DrafterReplica::forward_backward` →
//! `apply`), a fresh micro-batch every step, so every step has a new sequence length from the
//! buckets and new anchors (new attention chunk shapes), as a run does. Per step: wall time,
//! tokens/s, draft positions/s, MFU, the CUDA allocator's readings, NVML's used memory, and
//! the memory model's prediction (`dflash_engine::plan`) for that step's shape next to the
//! measured peak.
//!
//! Each step's record is appended to `<work dir>/steps.jsonl` as soon as it is taken, so a
//! kill keeps every finished step.
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use super::timing::sync;
use dflash_engine::data::Sample;
use dflash_engine::model::drafter::{AttentionBackend, DrafterConfig, LayerType};
use dflash_engine::plan::drafter::{drafter_memory, RankContext};
use dflash_engine::plan::flops::{
    corrected_positions, drafter_step_flops, head_positions, teacher_positions, StepWork,
};
use dflash_engine::plan::shape::{ActivationPrecision, StepShape};
use dflash_engine::train::block_objective::LossObjective;
use dflash_engine::train::labels::{default_gamma, LabelAlignment, LabelMaskRule};
use dflash_engine::train::micro::{MicroSource, MicroSpec, PreparedMicro};
use dflash_engine::train::optim::AdamWConfig;
use dflash_engine::train::replica::{DrafterReplica, MicroStepOptions, TargetStates};
use dflashd::telemetry::{allocator, GpuSampler};

/// The Qwen3.6-27B vocabulary, what the real drafter's LM head projects onto.
pub const REAL_VOCAB: i64 = 248_320;

/// What the step runs at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RealStepShape {
    /// The drafter (its `vocab_size` is the one run: the real one or the largest that fits).
    #[serde(skip)]
    pub drafter: DrafterConfig,
    /// The longest sequence; each step draws its length from [`seq_buckets`] of it.
    pub max_seq_len: i64,
    pub num_anchors: usize,
    /// `training.loss_chunk_positions`.
    pub loss_chunk_positions: i64,
    /// `training.activation_checkpointing`: on, as `configs/qwen3.6-27b-8gpu.toml` has it.
    pub activation_checkpointing: bool,
}

/// The real structure (issue 12): hidden 5120, 5 layers (4 sliding + 1 full, window 2048),
/// 32/8 heads × 128, block 32, 1024 anchors, S = 3072, vocabulary 248,320.
pub fn real_structure() -> RealStepShape {
    RealStepShape {
        drafter: DrafterConfig {
            vocab_size: REAL_VOCAB,
            ..dflash_engine::plan::reference::qwen36_27b_drafter()
        },
        max_seq_len: 3072,
        num_anchors: 1024,
        loss_chunk_positions: 2048,
        activation_checkpointing: true,
    }
}

/// The CPU self-test's shape: the same layer mix (4 sliding + 1 full, the window shorter than
/// the sequence so the sliding rule cuts), GQA, several attention chunks; small enough for
/// seconds a step on two cores.
pub fn reduced_structure() -> RealStepShape {
    let mut s = real_structure();
    let d = &mut s.drafter;
    d.hidden_size = 64;
    d.intermediate_size = 128;
    d.num_attention_heads = 4;
    d.num_key_value_heads = 2;
    d.head_dim = 16;
    d.sliding_window = Some(64);
    d.block_size = 8;
    d.mask_token_id = 1000;
    d.target_hidden_size = 64;
    d.vocab_size = 1024;
    s.max_seq_len = 256;
    s.num_anchors = 24;
    s.loss_chunk_positions = 64;
    s
}

/// The sequence-length buckets of a run up to `max`: multiples of `step` from `max / 2` to
/// `max`. The engine has no bucketing yet (the real-shape issue adds it); this is the check's
/// own set, the one the review proposes (multiples of 256).
pub fn seq_buckets(max: i64, step: i64) -> Vec<i64> {
    let step = step.max(1);
    let first = ((max / 2 + step - 1) / step * step).max(step);
    (first..=max).step_by(step as usize).collect()
}

/// The memory model's peak for one rank at `shape` (bf16 on CUDA, fp32 on the CPU; one rank;
/// the embedding and LM head are this process's own tables, counted as the copies a replica
/// holds), recomputing the layers in the backward or not (`activation_checkpointing`).
pub fn predicted_peak_bytes(
    d: &DrafterConfig,
    shape: &StepShape,
    device: Device,
    activation_checkpointing: bool,
) -> f64 {
    let precision = if device == Device::Cpu {
        ActivationPrecision::Fp32Cpu
    } else {
        ActivationPrecision::Bf16Cuda
    };
    let rank = RankContext {
        activation_checkpointing,
        ..RankContext::alone(precision, false)
    };
    drafter_memory(d, shape, rank).peak_bytes()
}

/// The largest vocabulary (the real one, else a multiple of 1024 below it) whose predicted
/// peak at the typical longest step fits `capacity` bytes less `reserve`; `None` when not
/// even 1024 fits.
pub fn largest_vocab_that_fits(
    shape: &RealStepShape,
    device: Device,
    capacity: f64,
    reserve: f64,
) -> Option<i64> {
    let fits = |vocab: i64| {
        let mut d = shape.drafter.clone();
        d.vocab_size = vocab;
        let step = StepShape::typical(
            &d,
            1,
            shape.max_seq_len,
            shape.num_anchors as i64,
            0.85,
            shape.loss_chunk_positions,
        );
        predicted_peak_bytes(&d, &step, device, shape.activation_checkpointing) + reserve
            <= capacity
    };
    let top = shape.drafter.vocab_size;
    if fits(top) {
        return Some(top);
    }
    (1..=top / 1024).rev().map(|k| k * 1024).find(|&v| fits(v))
}

/// An allowance for what the CUDA runtime takes before any tensor (context, cuBLAS/cuDNN
/// workspaces), subtracted from the device's memory when the vocabulary is chosen. A stated
/// allowance, not a measurement.
pub const CUDA_RUNTIME_ALLOWANCE_BYTES: f64 = 4.0 * 1024.0 * 1024.0 * 1024.0;

/// On CUDA: the vocabulary that fits the device (NVML's total memory), and a note when it is
/// not the real one. On the CPU the shape is run as given.
pub fn fit_vocab(mut shape: RealStepShape, device: Device) -> (RealStepShape, Option<String>) {
    let Device::Cuda(index) = device else {
        return (shape, None);
    };
    let mut sampler = GpuSampler::new();
    sampler.set_roles_by_cuda_index(&[(index, dflash_shared::metrics::DeviceRole::Drafter)]);
    let total = match sampler.sample(dflash_shared::clock::now_ms()) {
        dflash_shared::metrics::GpuTelemetry::Available { gpus } => gpus
            .iter()
            .find(|g| g.role == dflash_shared::metrics::DeviceRole::Drafter)
            .and_then(|g| g.memory_total_bytes),
        _ => None,
    };
    let Some(total) = total else {
        return (
            shape,
            Some("NVML gave no total memory: the real vocabulary is run unchecked".into()),
        );
    };
    match largest_vocab_that_fits(&shape, device, total as f64, CUDA_RUNTIME_ALLOWANCE_BYTES) {
        Some(v) if v == shape.drafter.vocab_size => (shape, None),
        Some(v) => {
            let note = format!(
                "vocabulary {v}, not {}: the memory model predicts the real one does not fit \
                 {:.1} GiB less a {:.0} GiB runtime allowance",
                shape.drafter.vocab_size,
                total as f64 / 1073741824.0,
                CUDA_RUNTIME_ALLOWANCE_BYTES / 1073741824.0
            );
            shape.drafter.vocab_size = v;
            shape.drafter.mask_token_id = shape.drafter.mask_token_id.min(v - 1);
            (shape, Some(note))
        }
        None => (
            shape,
            Some("the memory model predicts no vocabulary fits: run as given".into()),
        ),
    }
}

/// One step's record (one line of `steps.jsonl`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: usize,
    pub warmup: bool,
    pub seq_len: i64,
    pub anchors: usize,
    pub draft_positions: i64,
    pub wall_ms: f64,
    pub tokens_per_s: f64,
    pub draft_positions_per_s: f64,
    /// Analytic FLOPs of the step (`plan::flops::drafter_step_flops`).
    pub flops: f64,
    /// Of the datasheet peak given; null without one.
    pub mfu: Option<f64>,
    pub loss: Option<f64>,
    /// CUDA allocator after the step, MiB (null on the CPU).
    pub allocated_mb: Option<f64>,
    pub reserved_mb: Option<f64>,
    /// The allocator's peak since the previous step (reset after each reading).
    pub peak_allocated_mb: Option<f64>,
    pub num_alloc_retries: Option<u64>,
    /// NVML's used memory of this device, MiB (flatness across steps).
    pub nvml_used_mb: Option<f64>,
    /// MODEL, NOT MEASURED: `dflash_engine::plan`'s predicted peak for this step's shape, MiB,
    /// next to `peak_allocated_mb`.
    pub model_predicted_peak_mb: f64,
}

const MIB: f64 = 1024.0 * 1024.0;

impl StepRecord {
    /// Rates of a step that took `wall_ms` for `tokens` tokens and `positions` draft positions.
    pub fn rates(&mut self, tokens: i64, peak_flops: Option<f64>) {
        let s = self.wall_ms / 1e3;
        self.tokens_per_s = tokens as f64 / s;
        self.draft_positions_per_s = self.draft_positions as f64 / s;
        self.mfu = peak_flops.map(|p| self.flops / s / p);
    }
}

/// What the child prints when its steps are done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RealStepSummary {
    pub device: String,
    pub dtype: String,
    pub hidden: i64,
    pub layers: String,
    pub heads: String,
    pub block_size: i64,
    pub num_anchors: usize,
    pub max_seq_len: i64,
    pub seq_buckets: Vec<i64>,
    pub vocab: i64,
    /// Why the vocabulary is not the real one, when it is not.
    pub vocab_note: Option<String>,
    pub sdpa_backend: String,
    pub steps: Vec<StepRecord>,
    pub median_wall_ms: Option<f64>,
    pub median_tokens_per_s: Option<f64>,
    pub median_draft_positions_per_s: Option<f64>,
    pub median_mfu: Option<f64>,
    pub max_peak_allocated_mb: Option<f64>,
    /// MODEL, NOT MEASURED: the largest predicted peak over the timed steps, MiB.
    pub max_model_predicted_peak_mb: Option<f64>,
    /// NVML used memory, last timed step minus first timed step, MiB (growth: not flat).
    pub nvml_growth_mb: Option<f64>,
}

pub struct RealStepOptions {
    pub shape: RealStepShape,
    pub device: Device,
    pub warmup: usize,
    pub steps: usize,
    pub peak_flops: Option<f64>,
    pub seed: u64,
}

fn synthetic_samples(shape: &RealStepShape, buckets: &[i64], seed: u64) -> Vec<Sample> {
    let vocab = shape.drafter.vocab_size;
    let mut rng = dflash_engine::train::rng::Rng::from_seed(seed);
    (0..64)
        .map(|_| {
            let len = buckets[rng.below(buckets.len() as u64) as usize] as usize;
            let prompt = len * 15 / 100;
            Sample {
                input_ids: (0..len).map(|_| rng.below(vocab as u64) as i64).collect(),
                loss_mask: (0..len).map(|i| u8::from(i >= prompt)).collect(),
            }
        })
        .collect()
}

/// Runs the steps; appends each record to `dir/steps.jsonl`.
pub fn run_real_step(dir: &Path, opts: &RealStepOptions) -> Result<RealStepSummary, BenchError> {
    let io = |e: std::io::Error| BenchError::case(dir, e.to_string());
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut log = std::fs::File::create(dir.join("steps.jsonl")).map_err(io)?;
    let shape = &opts.shape;
    let d = &shape.drafter;
    let kind = dflash_engine::device::compute_kind(opts.device);
    let buckets = seq_buckets(
        shape.max_seq_len,
        if shape.max_seq_len >= 2048 { 256 } else { 32 },
    );
    let source = micro_source(shape, &buckets, opts.seed);
    let opts_t = (kind, opts.device);
    let (embed, lm_head) = tch::no_grad(|| {
        (
            Tensor::randn([d.vocab_size, d.target_hidden_size], opts_t) * 0.02,
            Tensor::randn([d.vocab_size, d.hidden_size], opts_t) * 0.02,
        )
    });
    dflash_engine::model::sdpa::choose_backends();
    let site = dflash_engine::model::sdpa::drafter_site(d, opts.device);
    let sdpa = dflash_engine::model::sdpa::backend_for(&site, opts.device, kind);
    let mut replica = DrafterReplica::seeded(
        d,
        &embed,
        &lm_head,
        opts.device,
        AdamWConfig::default(),
        opts.seed,
    );
    let mut nvml = drafter_sampler(opts.device);
    let feature_width = d.target_hidden_size * d.target_layer_ids.len() as i64;
    let mut records = Vec::new();
    for step in 0..opts.warmup + opts.steps {
        let micro: PreparedMicro = source.prepare(step as u64);
        let seq_len = (micro.batch.seq_len) as i64;
        let features = tch::no_grad(|| {
            Tensor::randn([micro.batch.batch as i64, seq_len, feature_width], opts_t)
        });
        let step_shape = step_shape(d, &micro, shape.loss_chunk_positions);
        let flops = step_flops(d, &step_shape);
        sync(opts.device);
        let started = Instant::now();
        let options = MicroStepOptions {
            backend: AttentionBackend::BlockSparse,
            chunk_positions: shape.loss_chunk_positions,
            activation_checkpointing: shape.activation_checkpointing,
            objective: LossObjective::Dflash,
            schedule: Default::default(),
            selector_stop_gradient: false,
            dspark: Default::default(),
        };
        let sums =
            replica.forward_backward(TargetStates::features_only(&features), &micro, &options);
        let weight = sums.weight.max(f64::MIN_POSITIVE);
        replica
            .apply(1e-4, None, 1.0 / weight)
            .map_err(|e| BenchError::case(dir, format!("optimizer step {step}: {e}")))?;
        sync(opts.device);
        let mut r = StepRecord {
            step,
            warmup: step < opts.warmup,
            seq_len,
            anchors: micro.anchors.kept(),
            draft_positions: step_shape.draft_positions(d.block_size),
            wall_ms: started.elapsed().as_secs_f64() * 1e3,
            flops,
            loss: Some(sums.weighted_ce / weight).filter(|l| l.is_finite()),
            model_predicted_peak_mb: predicted_peak_bytes(
                d,
                &step_shape,
                opts.device,
                shape.activation_checkpointing,
            ) / MIB,
            ..StepRecord::default()
        };
        r.rates(step_shape.batch * seq_len, opts.peak_flops);
        read_device_memory(&mut r, opts.device, nvml.as_mut());
        let line = serde_json::to_string(&r).map_err(|e| BenchError::case(dir, e.to_string()))?;
        writeln!(log, "{line}")
            .and_then(|_| log.flush())
            .map_err(io)?;
        eprintln!("[real-step] {line}");
        records.push(r);
    }
    Ok(summarise(
        shape,
        opts.device,
        kind,
        buckets,
        sdpa.name(),
        records,
    ))
}

fn micro_source(shape: &RealStepShape, buckets: &[i64], seed: u64) -> MicroSource {
    let d = &shape.drafter;
    let samples = Arc::new(synthetic_samples(shape, buckets, seed));
    let spec = MicroSpec {
        seed,
        batch_size: 1,
        num_anchors: shape.num_anchors,
        block_size: d.block_size as usize,
        gamma: default_gamma(d.block_size as usize),
        rule: LabelMaskRule::default(),
        alignment: LabelAlignment::SamePosition,
        pad_id: 0,
        // The synthetic rows already come in `seq_buckets` lengths.
        seq_len_multiple: 1,
    };
    MicroSource::new(samples.clone(), (0..samples.len()).collect(), spec)
}

/// NVML's view of the drafter's device (CUDA only), for the steps' used-memory readings.
fn drafter_sampler(device: Device) -> Option<GpuSampler> {
    match device {
        Device::Cuda(i) => {
            let mut s = GpuSampler::new();
            s.set_roles_by_cuda_index(&[(i, dflash_shared::metrics::DeviceRole::Drafter)]);
            Some(s)
        }
        _ => None,
    }
}

fn step_shape(d: &DrafterConfig, micro: &PreparedMicro, loss_chunk_positions: i64) -> StepShape {
    StepShape {
        batch: micro.batch.batch as i64,
        seq_len: (micro.batch.seq_len) as i64,
        anchors: micro.anchors.positions.clone(),
        keep: micro.anchors.keep.clone(),
        weighted_positions: micro.labels.weights.iter().filter(|w| **w > 0.0).count() as i64,
        corrected_positions: corrected_positions(d, &micro.labels.weights),
        head_positions: head_positions(d, &micro.labels.weights),
        loss_chunk_positions,
        tree_budget: 0,
    }
}

fn step_flops(d: &DrafterConfig, step_shape: &StepShape) -> f64 {
    drafter_step_flops(&StepWork {
        drafter: d,
        batch: step_shape.batch,
        seq_len: step_shape.seq_len,
        anchors: &step_shape.anchors,
        keep: &step_shape.keep,
        weighted_positions: step_shape.weighted_positions,
        corrected_positions: step_shape.corrected_positions,
        head_positions: step_shape.head_positions,
        teacher_positions: teacher_positions(d, step_shape.weighted_positions),
        vocab_size: d.vocab_size,
    })
    .total()
}

/// The CUDA allocator's readings after a step (its peak reset for the next one) and NVML's
/// used memory; nothing on the CPU.
fn read_device_memory(r: &mut StepRecord, device: Device, nvml: Option<&mut GpuSampler>) {
    if let Device::Cuda(i) = device {
        if let Ok(a) = allocator::cuda_stats(i) {
            r.allocated_mb = Some(a.allocated_bytes as f64 / MIB);
            r.reserved_mb = Some(a.reserved_bytes as f64 / MIB);
            r.peak_allocated_mb = Some(a.peak_allocated_bytes as f64 / MIB);
            r.num_alloc_retries = Some(a.alloc_retries);
        }
        let _ = allocator::reset_peak(i);
    }
    if let Some(s) = nvml {
        if let dflash_shared::metrics::GpuTelemetry::Available { gpus } =
            s.sample(dflash_shared::clock::now_ms())
        {
            r.nvml_used_mb = gpus
                .iter()
                .find(|g| g.role == dflash_shared::metrics::DeviceRole::Drafter)
                .and_then(|g| g.memory_used_bytes)
                .map(|b| b as f64 / MIB);
        }
    }
}

fn summarise(
    shape: &RealStepShape,
    device: Device,
    kind: Kind,
    buckets: Vec<i64>,
    sdpa: &str,
    steps: Vec<StepRecord>,
) -> RealStepSummary {
    let d = &shape.drafter;
    let timed: Vec<&StepRecord> = steps.iter().filter(|s| !s.warmup).collect();
    let med = |f: &dyn Fn(&StepRecord) -> Option<f64>| {
        let v: Vec<f64> = timed.iter().filter_map(|s| f(s)).collect();
        super::stats::median(&v)
    };
    let max =
        |f: &dyn Fn(&StepRecord) -> Option<f64>| timed.iter().filter_map(|s| f(s)).reduce(f64::max);
    let sliding = d
        .layer_types
        .iter()
        .filter(|t| **t == LayerType::Sliding)
        .count();
    RealStepSummary {
        device: dflash_engine::device::name(device),
        dtype: super::step::kind_name(kind).into(),
        hidden: d.hidden_size,
        layers: format!(
            "{} ({sliding} sliding, window {}, + {} full)",
            d.layer_types.len(),
            d.sliding_window.unwrap_or(0),
            d.layer_types.len() - sliding
        ),
        heads: format!(
            "{}/{} × {}",
            d.num_attention_heads, d.num_key_value_heads, d.head_dim
        ),
        block_size: d.block_size,
        num_anchors: shape.num_anchors,
        max_seq_len: shape.max_seq_len,
        seq_buckets: buckets,
        vocab: d.vocab_size,
        vocab_note: None,
        sdpa_backend: sdpa.into(),
        median_wall_ms: med(&|s| Some(s.wall_ms)),
        median_tokens_per_s: med(&|s| Some(s.tokens_per_s)),
        median_draft_positions_per_s: med(&|s| Some(s.draft_positions_per_s)),
        median_mfu: med(&|s| s.mfu),
        max_peak_allocated_mb: max(&|s| s.peak_allocated_mb),
        max_model_predicted_peak_mb: max(&|s| Some(s.model_predicted_peak_mb)),
        nvml_growth_mb: match (timed.first(), timed.last()) {
            (Some(a), Some(b)) if timed.len() > 1 => {
                a.nvml_used_mb.zip(b.nvml_used_mb).map(|(a, b)| b - a)
            }
            _ => None,
        },
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_multiples_from_half_to_the_longest() {
        assert_eq!(
            seq_buckets(3072, 256),
            [1536, 1792, 2048, 2304, 2560, 2816, 3072]
        );
        assert_eq!(seq_buckets(256, 32), [128, 160, 192, 224, 256]);
    }

    #[test]
    fn the_vocabulary_shrinks_only_when_the_real_one_does_not_fit() {
        let s = real_structure();
        let gpu = Device::Cuda(0);
        assert_eq!(
            largest_vocab_that_fits(&s, gpu, 1e15, 0.0),
            Some(REAL_VOCAB)
        );
        let need = {
            let step = StepShape::typical(&s.drafter, 1, 3072, 1024, 0.85, 2048);
            predicted_peak_bytes(&s.drafter, &step, gpu, s.activation_checkpointing)
        };
        let smaller = largest_vocab_that_fits(&s, gpu, need - 1e9, 0.0).unwrap();
        assert!(smaller < REAL_VOCAB && smaller % 1024 == 0, "{smaller}");
        assert_eq!(largest_vocab_that_fits(&s, gpu, 1e6, 0.0), None);
    }

    #[test]
    fn rates_follow_the_wall_time() {
        let mut r = StepRecord {
            wall_ms: 500.0,
            draft_positions: 1000,
            flops: 1e12,
            ..StepRecord::default()
        };
        r.rates(3000, Some(4e12));
        assert_eq!(r.tokens_per_s, 6000.0);
        assert_eq!(r.draft_positions_per_s, 2000.0);
        assert_eq!(r.mfu, Some(0.5));
        r.rates(3000, None);
        assert_eq!(r.mfu, None);
    }

    #[test]
    fn the_reduced_steps_draw_fresh_lengths_and_record_every_step() {
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        let opts = RealStepOptions {
            shape: reduced_structure(),
            device: Device::Cpu,
            warmup: 1,
            steps: 4,
            peak_flops: None,
            seed: 3,
        };
        let s = run_real_step(dir.path(), &opts).unwrap();
        assert_eq!(s.steps.len(), 5);
        let lines = std::fs::read_to_string(dir.path().join("steps.jsonl")).unwrap();
        assert_eq!(
            lines.lines().count(),
            5,
            "each step is written as it is taken"
        );
        let lens: std::collections::BTreeSet<i64> = s.steps.iter().map(|r| r.seq_len).collect();
        assert!(lens.len() > 1, "fresh lengths: {lens:?}");
        assert!(s.steps.iter().all(|r| s.seq_buckets.contains(&r.seq_len)));
        assert!(s.steps.iter().all(|r| r.loss.is_some() && r.wall_ms > 0.0));
        assert!(s.median_tokens_per_s.unwrap() > 0.0);
        assert!(s.max_model_predicted_peak_mb.unwrap() > 0.0);
    }
}
