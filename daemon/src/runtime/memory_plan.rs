//! The memory plan of a run config: the engine's model of a run (`dflash_engine::plan`) fed
//! with what the config, the target's `config.json`, the data and the devices say. `dflashd
//! plan` prints it; `dflashd start` runs the same prediction before it builds the drafter and
//! refuses a topology predicted not to fit (`--ignore-memory-plan` overrides, journaled).
//!
//! Pure apart from [`device_memory`], which reads NVML or the host's memory.
use dflash_engine::data::Sample;
use dflash_engine::model::target::TargetConfig;
use dflash_engine::plan::run::queue_item_bytes;
use dflash_engine::plan::{plan_run, ActivationPrecision, RunPlan, RunSpec, StepShape, GIB};
use dflash_engine::train::loader::bucketed_len;
use dflash_engine::train::run_config;
use dflash_engine::train::topology::step::{per_rank_queue, queue_config};
use dflash_shared::config::{Config, Device, Objective};
use dflash_shared::health::healthy_record::ThroughputBasis;
use serde::Serialize;

/// The share of each row assumed supervised (the last part, the assistant turns) when no data
/// was read to measure it. An assumption, printed as one; `--supervised-fraction` changes it.
pub const ASSUMED_SUPERVISED_FRACTION: f64 = 0.85;

/// Memory the CUDA runtime takes on each GPU before any tensor (context, cuBLAS and NCCL
/// workspaces). An allowance this daemon makes, not a measurement; it is a named consumer in
/// every CUDA device's plan.
pub const CUDA_RUNTIME_ALLOWANCE_GIB: f64 = 1.0;

/// The model FLOP utilisation tokens/s are quoted at unless `--mfu` says otherwise.
pub const DEFAULT_MFU: f64 = 0.4;

/// The sequence length and supervised share the plan is computed at, and where they came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataShape {
    pub seq_len: i64,
    pub supervised_fraction: f64,
    pub source: String,
}

/// The 95th-percentile row length (nearest rank) and the mean supervised share of the rows.
pub fn data_shape(samples: &[Sample], source: &str) -> Option<DataShape> {
    if samples.is_empty() {
        return None;
    }
    let mut lengths: Vec<usize> = samples.iter().map(Sample::len).collect();
    lengths.sort_unstable();
    let rank = ((0.95 * lengths.len() as f64).ceil() as usize).clamp(1, lengths.len());
    let supervised: f64 = samples
        .iter()
        .map(|s| {
            let on = s.loss_mask.iter().filter(|&&m| m != 0).count();
            on as f64 / s.len().max(1) as f64
        })
        .sum::<f64>()
        / samples.len() as f64;
    Some(DataShape {
        seq_len: lengths[rank - 1] as i64,
        supervised_fraction: supervised,
        source: format!("p95 row length of {} samples of {source}", samples.len()),
    })
}

/// The work a training token costs on this data: the model FLOPs per token (target forward and
/// drafter step, the plan's model) at the data's mean row length. The healthy record keeps it,
/// so a later run on longer rows is expected to be slower by exactly that much and no more.
pub fn throughput_basis(
    config: &Config,
    target: &TargetConfig,
    devices: Devices,
    samples: &[Sample],
) -> Option<ThroughputBasis> {
    let shape = data_shape(samples, "the training data")?;
    let mean = samples.iter().map(Sample::len).sum::<usize>() as f64 / samples.len() as f64;
    let inputs = PlanInputs {
        config,
        target,
        devices,
        shape: DataShape {
            seq_len: mean.round() as i64,
            ..shape
        },
        memory: None,
        peak_flops: None,
        mfu: DEFAULT_MFU,
    };
    let f = plan_run(&run_spec(&inputs)).flops_per_token;
    let per_token = f.target + f.drafter;
    (per_token.is_finite() && per_token > 0.0).then_some(ThroughputBasis {
        mean_row_tokens: mean,
        model_flops_per_token: per_token,
    })
}

/// Each device's memory, and where the figure came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceMemory {
    pub bytes: f64,
    pub source: String,
}

/// The devices a run uses, by role, after `--device`.
#[derive(Debug, Clone, PartialEq)]
pub struct Devices {
    pub target: Vec<Device>,
    pub drafter: Vec<Device>,
}

impl Devices {
    pub fn of(cfg: &Config, device_override: Option<Device>) -> Self {
        match device_override {
            Some(d) => Self {
                target: vec![d],
                drafter: vec![d],
            },
            None => Self {
                target: cfg.topology.target_devices.clone(),
                drafter: cfg.topology.drafter_devices.clone(),
            },
        }
    }

    /// One device runs both roles (`TopologySpec::is_inline`).
    pub fn is_inline(&self) -> bool {
        self.target.len() == 1 && self.target == self.drafter
    }

    fn cuda(&self) -> impl Iterator<Item = u32> + '_ {
        self.target
            .iter()
            .chain(&self.drafter)
            .filter_map(Device::cuda_index)
    }

    fn on_cuda(&self) -> bool {
        self.drafter.iter().any(Device::is_cuda)
    }
}

/// The memory of each device: `--gpu-memory-gib` when given (on a CPU topology too: a stated
/// limit), else the smallest GPU of the topology from NVML, else on a CPU topology the host's
/// memory. `Err` says why no figure exists (GPUs but no NVML).
pub fn device_memory(devices: &Devices, stated_gib: Option<f64>) -> Result<DeviceMemory, String> {
    if let Some(gib) = stated_gib {
        return Ok(DeviceMemory {
            bytes: gib * GIB,
            source: "--gpu-memory-gib".into(),
        });
    }
    let cuda: Vec<u32> = devices.cuda().collect();
    if cuda.is_empty() {
        return Ok(DeviceMemory {
            bytes: crate::telemetry::host::host_memory_total_bytes() as f64,
            source: "host memory (sysinfo)".into(),
        });
    }
    let sampler = crate::telemetry::gpu::GpuSampler::new();
    if let Some(reason) = sampler.unavailable_reason() {
        return Err(format!(
            "{reason}; pass --gpu-memory-gib with the memory of one GPU"
        ));
    }
    let mut smallest: Option<u64> = None;
    for index in cuda {
        let total = sampler.memory_total_bytes(index as usize).ok_or_else(|| {
            format!(
                "NVML cannot tell the memory of cuda:{index}; pass --gpu-memory-gib with the \
                 memory of one GPU"
            )
        })?;
        smallest = Some(smallest.map_or(total, |s| s.min(total)));
    }
    Ok(DeviceMemory {
        bytes: smallest.unwrap_or(0) as f64,
        source: "NVML (the smallest GPU of the topology)".into(),
    })
}

/// Everything the model needs besides the config.
#[derive(Debug, Clone)]
pub struct PlanInputs<'a> {
    pub config: &'a Config,
    pub target: &'a TargetConfig,
    pub devices: Devices,
    pub shape: DataShape,
    pub memory: Option<DeviceMemory>,
    /// Dense bf16 peak of one device, FLOP/s, and the MFU to assume.
    pub peak_flops: Option<f64>,
    pub mfu: f64,
}

/// The engine's `RunSpec` for a run config at `inputs.shape`, as `runtime/setup.rs` and
/// `TopologySpec::from_config` would build the run.
pub fn run_spec(inputs: &PlanInputs<'_>) -> RunSpec {
    run_spec_at(
        inputs,
        inputs.shape.seq_len,
        inputs.config.training.num_anchors,
    )
}

fn run_spec_at(inputs: &PlanInputs<'_>, seq_len: i64, num_anchors: usize) -> RunSpec {
    let cfg = inputs.config;
    let drafter = run_config::drafter_config(&cfg.drafter, inputs.target);
    let precision = if inputs.devices.on_cuda() {
        ActivationPrecision::Bf16Cuda
    } else {
        ActivationPrecision::Fp32Cpu
    };
    let batch = cfg.training.batch_size as i64;
    // Training pads rows to a multiple of `training.seq_len_multiple` (`train/micro.rs`).
    let seq_len = bucketed_len(seq_len.max(0) as usize, cfg.training.seq_len_multiple) as i64;
    let step = StepShape::typical(
        &drafter,
        batch,
        seq_len,
        num_anchors as i64,
        inputs.shape.supervised_fraction,
        cfg.training.loss_chunk_positions as i64,
    )
    .with_tree_budget(match cfg.training.objective {
        Objective::Tree => cfg
            .training
            .tree
            .effective_budget(cfg.training.serve_tree_budget) as i64,
        Objective::Dflash | Objective::Dpace => 0,
    });
    let inline = inputs.devices.is_inline();
    let ranks = inputs.devices.drafter.len().max(1);
    let queue = per_rank_queue(queue_config(&cfg.queue), ranks);
    let carries_last_hidden = drafter.head.needs_target_last_hidden();
    let item_bytes = queue_item_bytes(&drafter, batch, seq_len, precision, carries_last_hidden);
    // A rank's queue holds at most `capacity` items and at most `byte_cap` bytes of them.
    let by_bytes = (queue.byte_cap as f64 / item_bytes.max(1.0)).floor() as usize;
    let names = |list: &[Device]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
    RunSpec {
        drafter,
        target: inputs.target.clone(),
        step,
        target_devices: if inline {
            Vec::new()
        } else {
            names(&inputs.devices.target)
        },
        drafter_devices: names(&inputs.devices.drafter),
        precision,
        activation_checkpointing: cfg.training.activation_checkpointing,
        queued_items_per_rank: queue.capacity.min(by_bytes.max(1)),
        device_memory_bytes: inputs.memory.as_ref().map(|m| m.bytes),
        runtime_reserve_bytes: if inputs.devices.on_cuda() {
            CUDA_RUNTIME_ALLOWANCE_GIB * GIB
        } else {
            0.0
        },
        peak_flops: inputs.peak_flops,
        mfu: inputs.mfu,
    }
}

/// What would make a plan that does not fit fit, each predicted by the same model: turning
/// `training.activation_checkpointing` on (when that alone fits), the longest
/// `training.max_length` and the most `training.num_anchors` that fit (the other kept).
pub fn remedies(inputs: &PlanInputs<'_>) -> Vec<String> {
    let fits = |seq: i64, anchors: usize| plan_run(&run_spec_at(inputs, seq, anchors)).fits;
    let (seq, anchors) = (inputs.shape.seq_len, inputs.config.training.num_anchors);
    let mut out = Vec::new();
    if !inputs.config.training.activation_checkpointing {
        let recomputed = RunSpec {
            activation_checkpointing: true,
            ..run_spec(inputs)
        };
        if plan_run(&recomputed).fits == Some(true) {
            out.push(
                "training.activation_checkpointing = true (the drafter recomputes its layers in \
                 the backward and keeps about one layer's activations; now false)"
                    .to_string(),
            );
        }
    }
    if let Some(s) = largest_fitting(1, seq, |s| fits(s, anchors) == Some(true)) {
        out.push(format!(
            "training.max_length = {s} (rows at most {s} tokens; now {seq})"
        ));
    }
    if let Some(n) = largest_fitting(1, anchors as i64, |n| fits(seq, n as usize) == Some(true)) {
        out.push(format!(
            "training.num_anchors = {n} (now {anchors}; it is locked once a run has a checkpoint)"
        ));
    }
    let peak = plan_run(&run_spec(inputs))
        .devices
        .iter()
        .map(|d| d.predicted_peak_gib)
        .fold(0.0, f64::max);
    out.push(format!("devices of at least {}", size(peak)));
    out
}

/// A size given in GiB, as MiB below one GiB (a CPU run's figures are MiB).
pub fn size(gib: f64) -> String {
    if gib < 1.0 {
        format!("{:.1} MiB", gib * 1024.0)
    } else {
        format!("{gib:.2} GiB")
    }
}

/// The largest `x` in `lo..=hi` with `ok(x)`, for an `ok` that holds up to some point and not
/// after (memory grows with length and anchors); `None` when not even `lo` is ok.
fn largest_fitting(lo: i64, hi: i64, ok: impl Fn(i64) -> bool) -> Option<i64> {
    if hi < lo || !ok(lo) {
        return None;
    }
    if ok(hi) {
        return Some(hi);
    }
    let (mut good, mut bad) = (lo, hi);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

/// The refusal of `dflashd start` for a plan with devices over capacity: per device the need
/// against what it has and its top three consumers, then what would make it fit.
pub fn refusal(plan: &RunPlan, inputs: &PlanInputs<'_>) -> String {
    let mut text = format!(
        "the memory plan predicts this run does not fit (rows of {} tokens: {}; device memory: \
         {}):",
        inputs.shape.seq_len,
        inputs.shape.source,
        inputs
            .memory
            .as_ref()
            .map_or("unknown".to_string(), |m| m.source.clone()),
    );
    for d in plan.over_capacity() {
        let role = serde_json::to_value(d.role)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        text.push_str(&format!(
            "\n  {} ({role}): needs {}, has {}; largest: {}",
            d.device,
            size(d.predicted_peak_gib),
            size(d.capacity_gib.unwrap_or(0.0)),
            d.top_consumers
                .iter()
                .map(|c| format!("{} {}", c.name, size(c.gib)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text.push_str("\nIt would fit (predicted) with any one of:");
    for r in remedies(inputs) {
        text.push_str(&format!("\n  - {r}"));
    }
    text.push_str(
        "\nSee the whole breakdown with `dflashd plan --config <FILE>`. To start anyway (the \
         model can be wrong; the override is journaled), add --ignore-memory-plan.",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_engine::embedded;

    fn sample(len: usize, supervised: usize) -> Sample {
        Sample {
            input_ids: vec![1; len],
            loss_mask: (0..len).map(|i| u8::from(i >= len - supervised)).collect(),
        }
    }

    #[test]
    fn the_data_shape_is_the_p95_length_and_the_mean_supervised_share() {
        let samples: Vec<Sample> = (1..=100).map(|n| sample(n * 10, n * 5)).collect();
        let shape = data_shape(&samples, "d").unwrap();
        assert_eq!(shape.seq_len, 950);
        assert!((shape.supervised_fraction - 0.5).abs() < 1e-9);
        assert_eq!(data_shape(&[sample(7, 1)], "d").unwrap().seq_len, 7);
        assert!(data_shape(&[], "d").is_none());
    }

    #[test]
    fn largest_fitting_finds_the_boundary() {
        assert_eq!(largest_fitting(1, 100, |x| x <= 37), Some(37));
        assert_eq!(largest_fitting(1, 100, |_| true), Some(100));
        assert_eq!(largest_fitting(1, 100, |_| false), None);
    }

    fn tiny_inputs<'a>(cfg: &'a Config, target: &'a TargetConfig, gib: f64) -> PlanInputs<'a> {
        PlanInputs {
            config: cfg,
            target,
            devices: Devices::of(cfg, None),
            shape: DataShape {
                seq_len: cfg.training.max_length as i64,
                supervised_fraction: ASSUMED_SUPERVISED_FRACTION,
                source: "test".into(),
            },
            memory: Some(DeviceMemory {
                bytes: gib * GIB,
                source: "test".into(),
            }),
            peak_flops: None,
            mfu: 0.4,
        }
    }

    #[test]
    fn a_plan_over_capacity_is_refused_with_the_need_and_a_remedy_that_fits() {
        let cfg = embedded::tiny_run_config();
        let target = embedded::tiny_target_config();
        let roomy = tiny_inputs(&cfg, &target, 64.0);
        let plan = plan_run(&run_spec(&roomy));
        assert_eq!(plan.fits, Some(true), "{plan:#?}");
        let peak = plan.devices[0].predicted_peak_gib;
        // Just under the predicted peak: refused, and the shorter rows it proposes fit.
        let tight = tiny_inputs(&cfg, &target, peak * 0.9);
        let plan = plan_run(&run_spec(&tight));
        assert_eq!(plan.fits, Some(false));
        let text = refusal(&plan, &tight);
        assert!(text.contains("cpu (target_and_drafter): needs"), "{text}");
        assert!(text.contains("training.max_length = "), "{text}");
        assert!(text.contains("--ignore-memory-plan"), "{text}");
        let proposed: i64 = text
            .split("training.max_length = ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(proposed < tight.shape.seq_len);
        let mut shorter = tight.clone();
        shorter.shape.seq_len = proposed;
        assert_eq!(plan_run(&run_spec(&shorter)).fits, Some(true));
    }

    #[test]
    fn the_refusal_offers_activation_checkpointing_when_it_alone_fits() {
        let mut cfg = embedded::tiny_run_config();
        let target = embedded::tiny_target_config();
        let peak = |cfg: &Config| {
            plan_run(&run_spec(&tiny_inputs(cfg, &target, 64.0))).devices[0].predicted_peak_gib
        };
        let plain = peak(&cfg);
        cfg.training.activation_checkpointing = true;
        let recomputed = peak(&cfg);
        assert!(recomputed < plain, "{recomputed} vs {plain}");
        cfg.training.activation_checkpointing = false;
        // Between the two peaks: only checkpointing makes it fit, and the refusal says so.
        let between = tiny_inputs(&cfg, &target, (plain + recomputed) / 2.0);
        let text = refusal(&plan_run(&run_spec(&between)), &between);
        assert!(
            text.contains("training.activation_checkpointing = true"),
            "{text}"
        );
        // Already on: not offered again.
        cfg.training.activation_checkpointing = true;
        let tight = tiny_inputs(&cfg, &target, recomputed * 0.9);
        let text = refusal(&plan_run(&run_spec(&tight)), &tight);
        assert!(!text.contains("activation_checkpointing"), "{text}");
    }
}
