//! `dflashd plan --config F`: what the run would hold on each device, whether it fits, which
//! side bounds it, its FLOPs per token, its tokens/s at an MFU and the best target/drafter
//! split, from the shapes alone (`dflash_engine::plan`); nothing is loaded onto a device.
//!
//! The target's shapes come from `target.model`'s `config.json` or `--target-config`; the row
//! length is `--seq-len` or the data's p95 (the data is then read as training reads it).
//!
//! `--nnodes N --inter-node-gbps B` adds the cross-node section (`dflash_engine::plan::
//! scaling`): a prediction for data-parallel nodes of several GPUs each reduced inside the node
//! and then across, which is not built (today's nodes sum in one flat group of every drafter
//! GPU), and the output says so.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use dflash_engine::embedded;
use dflash_engine::model::target::TargetConfig;
use dflash_engine::plan::scaling::{self, ScalingInput, ScalingPlan, Verdict};
use dflash_engine::plan::{plan_run, RunPlan};
use dflash_shared::config::Config;
use serde::Serialize;

use super::config::load_config;
use super::memory_plan_args::MemoryPlanArgs;
use crate::run::paths::{resolve, resolve_path, PathInputs};
use crate::runtime::memory_plan::{
    self, DataShape, DeviceMemory, Devices, PlanInputs, ASSUMED_SUPERVISED_FRACTION,
};
use crate::runtime::setup::{read_training_data, MemoryPlanPolicy, SetupInputs};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Run config (TOML). Default: the embedded tiny CPU config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Row length to plan for. Default: the 95th percentile of the data's rows.
    #[arg(long, value_name = "N")]
    pub seq_len: Option<i64>,
    /// Share of each row supervised (its last part), with --seq-len (read from the data
    /// otherwise).
    #[arg(long, value_name = "F", default_value_t = ASSUMED_SUPERVISED_FRACTION)]
    pub supervised_fraction: f64,
    #[command(flatten)]
    pub memory_plan: MemoryPlanArgs,
    /// The target's Hugging Face config.json, when `target.model` is not on this machine.
    #[arg(long, value_name = "FILE")]
    pub target_config: Option<PathBuf>,
    /// Dense bf16 peak of one device, TFLOP/s (its datasheet figure), for tokens/s.
    #[arg(long, value_name = "X")]
    pub peak_tflops: Option<f64>,
    /// Model FLOP utilisation assumed for tokens/s.
    #[arg(long, default_value_t = memory_plan::DEFAULT_MFU)]
    pub mfu: f64,
    /// Predict the cross-node gradient all-reduce for this many data-parallel nodes (with
    /// --inter-node-gbps). A prediction only: the hierarchical reduce it models is not built.
    #[arg(long, value_name = "N")]
    pub nnodes: Option<usize>,
    /// Each node's inter-node bandwidth available to its drafter GPUs, Gb/s per direction
    /// (the sum of their NICs'), with --nnodes.
    #[arg(long, value_name = "B")]
    pub inter_node_gbps: Option<f64>,
    /// With --nnodes: the per-node efficiency (each node's tokens/s against one node's alone)
    /// below which adding nodes stops paying.
    #[arg(long, value_name = "F", default_value_t = scaling::DEFAULT_MIN_EFFICIENCY)]
    pub min_scaling_efficiency: f64,
    /// Print the plan as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints: the plan, and what it was computed from.
#[derive(Serialize)]
struct PlanOutput<'a> {
    config: String,
    target_config: String,
    shape: &'a DataShape,
    device_memory: Option<&'a DeviceMemory>,
    /// Why there is no device memory, when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    device_memory_missing: Option<&'a str>,
    #[serde(flatten)]
    plan: &'a RunPlan,
    /// With --nnodes: the cross-node prediction.
    #[serde(skip_serializing_if = "Option::is_none")]
    scaling: Option<&'a ScalingPlan>,
}

fn positive(flag: &str, v: Option<f64>) -> Result<()> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            bail!("{flag}: expected a positive number, found {x}")
        }
        _ => Ok(()),
    }
}

/// `(nnodes, gbps)` when the cross-node section was asked for; both flags or neither.
fn scaling_flags(args: &PlanArgs) -> Result<Option<(usize, f64)>> {
    let (n, gbps) = match (args.nnodes, args.inter_node_gbps) {
        (None, None) => return Ok(None),
        (Some(n), Some(b)) => (n, b),
        (Some(_), None) => bail!(
            "--nnodes needs --inter-node-gbps B: each node's inter-node bandwidth in Gb/s \
             (e.g. --inter-node-gbps 200)"
        ),
        (None, Some(_)) => bail!("--inter-node-gbps needs --nnodes N (e.g. --nnodes 2)"),
    };
    scaling::validate(n, gbps, args.min_scaling_efficiency)?;
    Ok(Some((n, gbps)))
}

pub fn run(args: PlanArgs) -> Result<()> {
    let scaling_request = scaling_flags(&args)?;
    args.memory_plan.check_gpu_memory()?;
    positive("--peak-tflops", args.peak_tflops)?;
    if !(args.mfu > 0.0 && args.mfu <= 1.0) {
        bail!("--mfu: expected a fraction in (0, 1], found {}", args.mfu);
    }
    if !(0.0..=1.0).contains(&args.supervised_fraction) {
        bail!(
            "--supervised-fraction: expected a fraction in [0, 1], found {}",
            args.supervised_fraction
        );
    }
    let (config, config_path, origin) = match &args.config {
        Some(p) => (
            load_config(p)?,
            Some(std::path::absolute(p)?),
            p.display().to_string(),
        ),
        None => (Config::embedded_default(), None, "embedded default".into()),
    };
    // The run dir `start` would use without --run-dir, for `{run_dir}` in the config's paths;
    // nothing is written there.
    let paths = resolve(&PathInputs::from_environment()?);
    let run_dir = match &config.run.run_dir {
        Some(dir) => resolve_path(
            "run.run_dir",
            dir,
            config_path.as_deref(),
            &paths.default_run_dir,
        )?,
        None => paths.default_run_dir.clone(),
    };
    let (target, target_origin) = target_config(&args, &config, config_path.as_deref(), &run_dir)?;
    let shape = match args.seq_len {
        Some(n) if n < 2 => bail!("--seq-len: expected at least 2 tokens, found {n}"),
        Some(n) => DataShape {
            seq_len: n,
            supervised_fraction: args.supervised_fraction,
            source: format!(
                "--seq-len, the last {:.0} % of each row supervised (--supervised-fraction)",
                args.supervised_fraction * 100.0
            ),
        },
        None => data_shape(&config, config_path.as_deref(), &run_dir, &target)?,
    };
    let devices = Devices::of(&config, args.memory_plan.device_override()?);
    let memory = memory_plan::device_memory(&devices, args.memory_plan.gpu_memory_gib);
    let inputs = PlanInputs {
        config: &config,
        target: &target,
        devices,
        shape,
        memory: memory.as_ref().ok().cloned(),
        peak_flops: args.peak_tflops.map(|t| t * 1e12),
        mfu: args.mfu,
    };
    let spec = memory_plan::run_spec(&inputs);
    let plan = plan_run(&spec);
    let scaling = scaling_request
        .map(|(nnodes, gbps)| {
            scaling::scaling_plan(&ScalingInput {
                nnodes,
                inter_node_gbps: gbps,
                drafter_params: dflash_engine::plan::drafter::drafter_params(&spec.drafter),
                drafter_gpus_per_node: if spec.target_devices.is_empty() {
                    1
                } else {
                    spec.drafter_devices.len().max(1)
                },
                step: scaling::node_step(&spec, &plan, config.training.grad_accum),
                min_efficiency: args.min_scaling_efficiency,
            })
        })
        .transpose()?;
    if args.json {
        let out = PlanOutput {
            config: origin,
            target_config: target_origin,
            shape: &inputs.shape,
            device_memory: inputs.memory.as_ref(),
            device_memory_missing: memory.as_ref().err().map(String::as_str),
            plan: &plan,
            scaling: scaling.as_ref(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print!("{}", human(&plan, &inputs, &origin, &target_origin));
    if let Err(why) = &memory {
        println!("device memory unknown: {why}");
    }
    if plan.fits == Some(false) {
        println!("{}", memory_plan::refusal(&plan, &inputs));
    }
    if let Some(s) = &scaling {
        print!("{}", scaling_section(s));
    }
    Ok(())
}

fn target_config(
    args: &PlanArgs,
    config: &Config,
    config_path: Option<&std::path::Path>,
    run_dir: &std::path::Path,
) -> Result<(TargetConfig, String)> {
    if let Some(file) = &args.target_config {
        let t = TargetConfig::from_hf_config_file(file)
            .with_context(|| format!("--target-config {}", file.display()))?;
        return Ok((t, file.display().to_string()));
    }
    if config.target.is_embedded() {
        return Ok((
            embedded::tiny_target_config(),
            "the embedded tiny target".into(),
        ));
    }
    let dir = resolve_path("target.model", &config.target.model, config_path, run_dir)?;
    let t = TargetConfig::from_hf_dir(&dir).with_context(|| {
        format!(
            "target.model {}: no readable config.json; pass --target-config FILE with the \
             target's config.json (configs/targets/ has some)",
            dir.display()
        )
    })?;
    Ok((t, dir.join("config.json").display().to_string()))
}

fn data_shape(
    config: &Config,
    config_path: Option<&std::path::Path>,
    run_dir: &std::path::Path,
    target: &TargetConfig,
) -> Result<DataShape> {
    let inputs = SetupInputs {
        config,
        config_path,
        run_dir,
        device_override: None,
        unlocked_keys: Vec::new(),
        // Only the data is read here: no trainer is built, nothing resumes.
        resume: None,
        memory_plan: MemoryPlanPolicy::default(),
        cpu_peak_flops: None,
    };
    let (samples, _, source) = read_training_data(&inputs, target.vocab_size() as usize)
        .with_context(|| {
            "reading the data for its p95 row length; pass --seq-len N to plan without it"
        })?;
    memory_plan::data_shape(&samples, &source).context("the data has no rows; pass --seq-len N")
}

fn human(plan: &RunPlan, inputs: &PlanInputs<'_>, origin: &str, target: &str) -> String {
    let mut out = format!(
        "memory plan of {origin} (target shapes: {target})\n  rows of {} tokens ({}), {} draft \
         positions per row\n",
        inputs.shape.seq_len, inputs.shape.source, plan.draft_positions_per_sequence
    );
    if let Some(m) = &inputs.memory {
        out.push_str(&format!(
            "  device memory {} ({})\n",
            memory_plan::size(m.bytes / dflash_engine::plan::GIB),
            m.source
        ));
    }
    for d in &plan.devices {
        let verdict = match d.fits {
            Some(true) => "fits",
            Some(false) => "DOES NOT FIT",
            None => "capacity unknown",
        };
        out.push_str(&format!(
            "  {:<8} {:<18} {:>11}  {verdict}; largest: {}\n",
            d.device,
            format!("{:?}", d.role),
            memory_plan::size(d.predicted_peak_gib),
            d.top_consumers
                .iter()
                .map(|c| format!("{} {}", c.name, memory_plan::size(c.gib)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let f = plan.flops_per_token;
    out.push_str(&format!(
        "  FLOPs per training token: target {:.1} G, drafter {:.1} G; bound by: {:?}\n",
        f.target / 1e9,
        f.drafter / 1e9,
        plan.bound_by
    ));
    out.push_str(&format!(
        "  the drafter's kernels execute {:.1} G per token ({:.0} % of it useful; the rest is \
         masked attention keys{})\n",
        plan.drafter_executed_flops_per_token / 1e9,
        100.0 * f.drafter / plan.drafter_executed_flops_per_token,
        if plan.activation_checkpointing {
            " and the recomputed layers"
        } else {
            ""
        }
    ));
    let t = &plan.tokens_per_s_at_mfu;
    match t.run {
        Some(run) => out.push_str(&format!(
            "  at {:.0} % MFU of {:.0} TFLOP/s per device: {run:.0} tokens/s (a prediction)\n",
            t.mfu * 100.0,
            t.peak_flops_per_device.unwrap_or(0.0) / 1e12
        )),
        None => out.push_str(&format!(
            "  tokens/s: {}\n",
            t.missing.as_deref().unwrap_or("")
        )),
    }
    if let Some(s) = plan.recommended_split {
        out.push_str(&format!(
            "  best split of these devices: {} target + {} drafter ({:.2}x the configured one)\n",
            s.target_devices, s.drafter_devices, s.speedup_over_configured
        ));
    }
    out
}

/// Seconds in the unit that keeps them readable, from the 27B's seconds to the tiny default's
/// microseconds.
fn seconds(s: f64) -> String {
    if s == 0.0 {
        "0 s".into()
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Bytes in decimal units (link speeds are decimal).
fn bytes(b: f64) -> String {
    if b == 0.0 {
        "0 B".into()
    } else if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

fn count(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.3} G", n / 1e9)
    } else {
        format!("{:.3} M", n / 1e6)
    }
}

/// The cross-node section: what crosses, the model, the verdict, the table and the
/// recommendation, every figure labelled a prediction.
fn scaling_section(s: &ScalingPlan) -> String {
    let n = s.nnodes;
    let mut out = format!(
        "cross-node scaling, {n} node{} at {} Gb/s (a prediction: {})\n",
        if n == 1 { "" } else { "s" },
        s.inter_node_gbps,
        s.status
    );
    out.push_str(&format!(
        "  gradient all-reduce per step: {} drafter parameters x {} bytes ({}: \
         sum_in_buckets copies the gradients into an {} bucket and sums that) = {}\n",
        count(s.drafter_params),
        s.bytes_per_element,
        s.allreduce_dtype,
        s.allreduce_dtype,
        bytes(s.gradient_bytes)
    ));
    out.push_str(&format!(
        "  model: each node reduces inside itself over NVLink (not counted), then a ring \
         across the {n} nodes moves 2(n-1)/n = {:.3} of it through each node's link: {} each \
         way at {:.1} GB/s = {}\n",
        s.ring_factor,
        bytes(s.bytes_per_node),
        scaling::link_bytes_per_s(s.inter_node_gbps) / 1e9,
        seconds(s.allreduce_s)
    ));
    if n > 1 && s.drafter_gpus_per_node > 1 {
        out.push_str(&format!(
            "    (one flat ring over all {} drafter GPUs, no hierarchy, as this build sums: {})\n",
            n * s.drafter_gpus_per_node,
            seconds(s.flat_ring_allreduce_s)
        ));
    }
    match &s.step {
        Some(p) => {
            let st = &p.node_step;
            out.push_str(
                "  overlap: none in today's code: the all-reduce starts after the step's last \
                 backward (train/topology/rank.rs), so it adds to the drafter's step and hides \
                 only in time the drafter would wait for the target anyway\n",
            );
            let verdict = match p.verdict {
                Verdict::NothingToReduce => "nothing crosses nodes".to_string(),
                Verdict::Hidden => {
                    "hidden: the drafter waits for the target at least as long".into()
                }
                Verdict::AddsToStep => format!(
                    "adds {} to the one-node step of {} ({:.0} % per-node efficiency)",
                    seconds(p.added_s),
                    seconds(p.one_node_step_s),
                    p.efficiency * 100.0
                ),
            };
            let (d, a) = (st.drafter_compute_s, s.allreduce_s);
            let step = if st.target_s == 0.0 {
                // One device runs both roles in turn: nothing to wait for.
                format!(
                    "target and drafter in turn {} + all-reduce {} = {}",
                    seconds(d),
                    seconds(a),
                    seconds(p.step_s)
                )
            } else {
                format!(
                    "drafter {} + all-reduce {} = {}, against the target's {}: {}",
                    seconds(d),
                    seconds(a),
                    seconds(d + a),
                    seconds(st.target_s),
                    seconds(p.step_s)
                )
            };
            out.push_str(&format!("  step: {step}; {verdict}\n"));
            out.push_str(&format!(
                "  were it overlapped with the last micro-batch's backward ({}; not built): {}\n",
                seconds(st.last_backward_s),
                seconds(p.if_overlapped_step_s)
            ));
        }
        None => out.push_str(&format!("  {}\n", s.missing.as_deref().unwrap_or(""))),
    }
    out.push_str("  nodes  bytes/node  all-reduce  step      tokens/s  per-node efficiency\n");
    for r in &s.table {
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "  {:>5}  {:>10}  {:>10}  {:>8}  {:>8}  {:>8}\n",
            r.nodes,
            bytes(r.bytes_per_node),
            seconds(r.allreduce_s),
            or_dash(r.step_s.map(seconds)),
            or_dash(r.tokens_per_s.map(|t| format!("{t:.0}"))),
            or_dash(r.efficiency.map(|e| format!("{:.0} %", e * 100.0)))
        ));
    }
    if let Some(r) = &s.recommendation {
        out.push_str(&format!("  recommended: {}\n", r.rule));
    }
    out
}
