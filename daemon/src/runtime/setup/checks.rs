//! Everything `start` refuses without reading a weight, as one sequence of checks that two
//! callers run: `start` stops at the first refusal ([`check`]); `config validate` runs the
//! same sequence with a [`CheckSink`] that lists every refusal and every check it could not
//! run, and goes on with the checks that do not depend on a refused one. So validate refuses
//! what start refuses, in start's words, by construction: the readers it runs are private to
//! this module.
use std::path::PathBuf;

use dflash_engine::data::{LoadReport, Sample};
use dflash_engine::device;
use dflash_engine::embedded;
use dflash_engine::model::drafter::DrafterConfig;
use dflash_engine::model::target::TargetConfig;
use dflash_engine::train::config::TrainConfig;
use dflash_engine::train::online_prompts::OnlinePrompts;
use dflash_engine::train::run_config;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::warm_start::DrafterSource;
use dflash_shared::config::{self, Config};
use dflash_shared::health::healthy_record::ThroughputBasis;
use tch::Device;

use super::{chat_encoder_of_data, load_samples, read_online_prompts, SetupError, SetupInputs};
use crate::run::paths::resolve_path;
use crate::runtime::memory_plan::{self, Devices, PlanInputs};

/// The checks, in the order `start` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckStep {
    /// The topology's devices, as libtorch sees them on this machine.
    Devices,
    /// The target's `config.json`.
    Target,
    /// `drafter.init_from`'s directory and its drafter against the configured one.
    WarmStart,
    /// The tokenizer and chat template chat data is read with.
    ChatFiles,
    /// `data.train_file`, read as training reads it.
    Data,
    /// The config against the data's size (`Config::check_against_dataset`).
    AgainstData,
    /// The memory plan against the devices' memory.
    MemoryPlan,
    /// `training.online_eval_prompts` and the target's stop tokens.
    OnlinePrompts,
}

/// Where the checks report.
pub trait CheckSink {
    /// A refused check: `Err` stops the checks with it, `Ok` goes on with the checks that do
    /// not depend on this one.
    fn refused(&mut self, step: CheckStep, error: SetupError) -> Result<(), SetupError>;
    /// A check that could not be made with what this machine knows, and why.
    fn not_checked(&mut self, step: CheckStep, why: String);
    /// The data was read: `count` samples, as training reads them.
    fn samples_read(&mut self, _count: usize) {}
}

/// `start`'s sink: the first refusal is the error; what was not checked is journaled from
/// [`Checked`]'s notes instead.
struct StopAtFirst;

impl CheckSink for StopAtFirst {
    fn refused(&mut self, _: CheckStep, error: SetupError) -> Result<(), SetupError> {
        Err(error)
    }
    fn not_checked(&mut self, _: CheckStep, _: String) {}
}

/// What `start` learns and checks before it reads a weight: the topology, the target's
/// shapes (its `config.json`), the drafter, the warm-start source, the data, the memory plan
/// and the online prompts. A run any of these refuses is refused before the first weight
/// shard is opened; [`super::build`] then loads the weights.
pub struct Checked {
    pub(super) topology: TopologySpec,
    pub(super) topology_note: Option<String>,
    /// The target's directory; `None` for the embedded target.
    pub(super) target_dir: Option<PathBuf>,
    pub(super) target_config: TargetConfig,
    pub(super) drafter_cfg: DrafterConfig,
    pub(super) warm_start_source: Option<DrafterSource>,
    pub(super) samples: Vec<Sample>,
    pub(super) report: LoadReport,
    pub(super) data_source: String,
    pub(super) memory_plan_note: Option<String>,
    pub(super) throughput_basis: Option<ThroughputBasis>,
    pub(super) train_cfg: TrainConfig,
    pub(super) online_prompts: Option<OnlinePrompts>,
}

/// Everything `start` refuses without reading a weight ([`Checked`]). Writes nothing.
pub fn check(inputs: &SetupInputs<'_>) -> Result<Checked, SetupError> {
    let checked = run_checks(inputs, &mut StopAtFirst)?;
    Ok(checked.expect("start's sink stops at the first refusal, so every check passed"))
}

/// `Ok(v)` as `Some(v)`; a refusal reported to `sink` as `None`, or as the error that stops
/// the checks.
fn take<T>(
    sink: &mut dyn CheckSink,
    step: CheckStep,
    result: Result<T, SetupError>,
) -> Result<Option<T>, SetupError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) => sink.refused(step, error).map(|()| None),
    }
}

/// The checks in `start`'s order, each reported to `sink`; `Ok(None)` when `sink` let a
/// refusal pass (the run is not startable, but every independent check was made).
pub fn run_checks(
    inputs: &SetupInputs<'_>,
    sink: &mut dyn CheckSink,
) -> Result<Option<Checked>, SetupError> {
    let cfg = inputs.config;
    let topology = take(sink, CheckStep::Devices, topology(inputs))?;
    let Some((target_dir, target_config)) = take(sink, CheckStep::Target, target_shapes(inputs))?
    else {
        return Ok(None);
    };
    let drafter_cfg = run_config::drafter_config(&cfg.drafter, &target_config);
    let warm_start = take(
        sink,
        CheckStep::WarmStart,
        warm_start_source(inputs, &drafter_cfg),
    )?;
    let vocab = target_config.vocab_size();
    let data = match take(sink, CheckStep::ChatFiles, chat_encoder_of_data(inputs))? {
        Some(encoder) => take(
            sink,
            CheckStep::Data,
            load_samples(inputs, vocab as usize, encoder.as_ref()),
        )?,
        None => None,
    };
    let mut memory_plan_note = None;
    if let Some((samples, _, data_source)) = &data {
        sink.samples_read(samples.len());
        let against_data = cfg
            .check_against_dataset(samples.len())
            .map_err(SetupError::from);
        take(sink, CheckStep::AgainstData, against_data)?;
        let verdict = check_memory_plan(inputs, &target_config, samples, data_source, sink);
        memory_plan_note = take(sink, CheckStep::MemoryPlan, verdict)?.flatten();
    }
    let online = take(
        sink,
        CheckStep::OnlinePrompts,
        read_online_prompts(inputs, target_dir.as_deref(), vocab),
    )?;
    let (
        Some((topology, topology_note)),
        Some(warm_start_source),
        Some((samples, report, data_source)),
        Some((online_prompts_path, online_prompts)),
    ) = (topology, warm_start, data, online)
    else {
        return Ok(None);
    };
    let throughput_basis = memory_plan::throughput_basis(
        cfg,
        &target_config,
        Devices::of(cfg, inputs.device_override),
        &samples,
    );
    let mut train_cfg = run_config::train_config(cfg, samples.len());
    train_cfg.training.online_eval_prompts = online_prompts_path;
    Ok(Some(Checked {
        topology,
        topology_note,
        target_dir,
        target_config,
        drafter_cfg,
        warm_start_source,
        samples,
        report,
        data_source,
        memory_plan_note,
        throughput_basis,
        train_cfg,
        online_prompts,
    }))
}

/// A config device as a libtorch device, checked against what libtorch sees.
fn tch_device(d: config::Device) -> Result<Device, SetupError> {
    let device = device::from_config(d);
    device::check(device).map_err(|e| SetupError::Device {
        name: d.to_string(),
        detail: e.to_string(),
    })?;
    Ok(device)
}

/// The training device: `--device`, else the first drafter device of the topology.
pub(super) fn training_device(inputs: &SetupInputs<'_>) -> (config::Device, Option<String>) {
    let topo = &inputs.config.topology;
    let chosen = inputs
        .device_override
        .or_else(|| topo.drafter_devices.first().copied())
        .unwrap_or(config::Device::Cpu);
    let mut listed: Vec<config::Device> = topo
        .target_devices
        .iter()
        .chain(&topo.drafter_devices)
        .copied()
        .collect();
    listed.sort();
    listed.dedup();
    let unused: Vec<String> = listed
        .iter()
        .filter(|d| **d != chosen)
        .map(|d| d.to_string())
        .collect();
    let note = (!unused.is_empty()).then(|| {
        format!(
            "the topology lists {} device(s); this trainer runs target and drafter on {chosen} only, {} stay(s) idle",
            listed.len(),
            unused.join(", ")
        )
    });
    (chosen, note)
}

/// The topology this start drives: the configured one, or everything on `--device`.
fn topology(inputs: &SetupInputs<'_>) -> Result<(TopologySpec, Option<String>), SetupError> {
    let cfg = inputs.config;
    // Without `--device` the whole configured topology runs (the target is loaded on the
    // first target device and replicated onto the others); with it, everything runs on that
    // one device and the note names the devices left idle.
    let (chosen, override_note) = training_device(inputs);
    match inputs.device_override {
        Some(_) => Ok((TopologySpec::single(tch_device(chosen)?), override_note)),
        None => {
            for &d in cfg
                .topology
                .target_devices
                .iter()
                .chain(&cfg.topology.drafter_devices)
            {
                tch_device(d)?;
            }
            Ok((TopologySpec::from_config(cfg), None))
        }
    }
}

/// The target's directory (`None` for the embedded target) and its shapes from its
/// `config.json`: no weight is read.
fn target_shapes(inputs: &SetupInputs<'_>) -> Result<(Option<PathBuf>, TargetConfig), SetupError> {
    let cfg = inputs.config;
    if cfg.target.is_embedded() {
        return Ok((None, embedded::tiny_target_config()));
    }
    let dir = resolve_path(
        "target.model",
        &cfg.target.model,
        inputs.config_path,
        inputs.run_dir,
    )?;
    let config = TargetConfig::from_hf_dir(&dir).map_err(|source| SetupError::Target {
        path: dir.clone(),
        cause: Box::new(source),
    })?;
    Ok((Some(dir), config))
}

/// `drafter.init_from` on a fresh start: the directory read (its config and its tensors'
/// headers) and its config checked against the run's drafter. `None` when the key is unset,
/// or when the run resumes: its checkpoint carries the weights on.
fn warm_start_source(
    inputs: &SetupInputs<'_>,
    drafter: &dflash_engine::model::drafter::DrafterConfig,
) -> Result<Option<DrafterSource>, SetupError> {
    let Some(value) = inputs.config.drafter.init_from.as_deref() else {
        return Ok(None);
    };
    if inputs.resume.is_some() {
        return Ok(None);
    }
    let dir = resolve_path(
        "drafter.init_from",
        value,
        inputs.config_path,
        inputs.run_dir,
    )?;
    let source = DrafterSource::open(&dir)?;
    source.check_config(drafter)?;
    Ok(Some(source))
}

/// The memory plan of this run at the data's p95 row length, before the drafter is built:
/// `Err` with the refusal when a device is predicted over capacity (unless ignored), `Ok`
/// with a note to journal for an override or when no device memory is known.
fn check_memory_plan(
    inputs: &SetupInputs<'_>,
    target: &TargetConfig,
    samples: &[Sample],
    data_source: &str,
    sink: &mut dyn CheckSink,
) -> Result<Option<String>, SetupError> {
    let devices = Devices::of(inputs.config, inputs.device_override);
    let memory = memory_plan::device_memory(&devices, inputs.memory_plan.stated_gib);
    match memory_plan_verdict(inputs.config, devices, memory, target, samples, data_source) {
        MemoryPlanVerdict::Fits => Ok(None),
        MemoryPlanVerdict::NotChecked(why) => {
            let note = format!("memory plan not checked: {why}");
            sink.not_checked(CheckStep::MemoryPlan, why);
            Ok(Some(note))
        }
        MemoryPlanVerdict::DoesNotFit(refusal) if inputs.memory_plan.ignore => Ok(Some(format!(
            "--ignore-memory-plan: starting against the memory plan, which says {}",
            refusal.replace('\n', " ")
        ))),
        MemoryPlanVerdict::DoesNotFit(refusal) => Err(SetupError::MemoryPlan(refusal)),
    }
}

/// What the memory plan says of a run on `devices` of `memory` each.
#[derive(Debug, Clone, PartialEq)]
enum MemoryPlanVerdict {
    /// Predicted to fit (or no row to plan at: the data check refuses that).
    Fits,
    /// No device memory is known: why, and what would give one.
    NotChecked(String),
    /// A device is predicted over capacity: `start`'s whole refusal, remedies included.
    DoesNotFit(String),
}

/// The memory plan at the data's p95 row length, as `start` judges it before it builds the
/// drafter; `config validate` calls it with the same samples (read by [`load_samples`]) and
/// the target's `config.json`, so the two refuse the same runs in the same words.
fn memory_plan_verdict(
    cfg: &Config,
    devices: Devices,
    memory: Result<memory_plan::DeviceMemory, String>,
    target: &TargetConfig,
    samples: &[Sample],
    data_source: &str,
) -> MemoryPlanVerdict {
    let Some(shape) = memory_plan::data_shape(samples, data_source) else {
        return MemoryPlanVerdict::Fits;
    };
    let plan_inputs = PlanInputs {
        config: cfg,
        target,
        devices,
        shape,
        memory: memory.as_ref().ok().cloned(),
        peak_flops: None,
        mfu: memory_plan::DEFAULT_MFU,
    };
    let plan = dflash_engine::plan::plan_run(&memory_plan::run_spec(&plan_inputs));
    match (plan.fits, memory) {
        (Some(false), _) => {
            MemoryPlanVerdict::DoesNotFit(memory_plan::refusal(&plan, &plan_inputs))
        }
        (_, Err(why)) => MemoryPlanVerdict::NotChecked(why),
        _ => MemoryPlanVerdict::Fits,
    }
}
