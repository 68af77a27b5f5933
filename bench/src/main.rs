//! `dflash-bench`: the engine measured side by side with the PyTorch reference
//! (`benches/reference/`) on the same weights and batches. See `docs/BENCHMARKS.md`.
//!
//! The parent prepares each case and runs every implementation in its own child process
//! (`dflash-bench --child TASK ...` for the engine, the reference's Python scripts), so peak
//! memory is measured per process. The last stdout line is one JSON summary; the full results
//! go to `<out-dir>/results.json` and `<out-dir>/results.md`.
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use tch::Kind;

use dflash_bench::attention::{prepare_attention_case, run_engine_attention};
use dflash_bench::case::prepare_step_case;
use dflash_bench::harness::{Harness, ReferenceMode};
use dflash_bench::overhead::{run_clients, run_overhead};
use dflash_bench::plan_check;
use dflash_bench::presets::{
    step_preset, target_preset, AttentionPreset, ATTENTION_LADDER, CPU_STEP_PRESETS,
};
use dflash_bench::process::Python;
use dflash_bench::queue::{run_queue, QueueCase};
use dflash_bench::report::{loadavg, BenchReport, Machine};
use dflash_bench::step::{run_engine_step, StepOptions};
use dflash_bench::target_pass::{prepare_target_case, run_engine_target};
use dflash_bench::{matmul, multi_gpu, real_step, target_layers, BenchError};
use dflash_engine::device::parse as parse_device;
use dflash_engine::model::drafter::AttentionBackend;

const CASES: &[&str] = &[
    "step",
    "attention",
    "target",
    "overhead",
    "queue",
    "parity",
    "plan",
    "objectives",
];

/// dflash-bench — the engine side by side with the PyTorch reference (docs/BENCHMARKS.md).
#[derive(Parser, Debug)]
#[command(name = "dflash-bench", version, about)]
pub struct BenchArgs {
    /// The short run: the tiny drafter step, engine vs reference, and the matmul peak
    /// (under 3 minutes on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// Cases: step, attention, target, overhead (daemon: clients, telemetry), queue, parity
    /// (--device vs CPU and bf16 vs the reference on the first of --configs; on cpu a
    /// plumbing self-test), plan, objectives (DFlash, D-PACE and Domino trained and scored).
    /// Default: step,attention,target,overhead,queue (--quick: step).
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// Drafter-step configs: tiny, small, small-domino, medium, gpu-large, real-structure.
    /// Default: tiny,small,medium (--quick: tiny; the plan case:
    /// tiny,small,small-domino,medium,real-structure).
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Anchors of the attention case (block 32, context 2048). Default: 128,256,512,1024.
    #[arg(long, value_delimiter = ',')]
    pub anchors: Vec<usize>,
    /// Untimed steps before the timed ones, per process.
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Timed steps per process (medians are over these).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Steps of the memory pass that measures a step's live memory on CPU: one more process
    /// per implementation and config, after the timed rounds (0 skips it).
    #[arg(long, default_value_t = 2)]
    pub memory_steps: usize,
    /// Rounds of (engine, reference), alternated so the machine's noise falls on both.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Intra-op threads of every process, engine and reference alike. The default is 1: on a
    /// shared machine more threads than idle cores make OpenMP barriers spin and step times
    /// swing by several times (see docs/BENCHMARKS.md).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Device of the step cases: `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The engine's drafter steps recompute their layers in the backward
    /// (`training.activation_checkpointing`); the reference keeps every activation either way.
    /// Applies to the step and plan cases (the plan's prediction follows it).
    #[arg(long)]
    pub activation_checkpointing: bool,
    /// Compute dtype of the step cases: `f32` or `bf16`.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Reference attention back-end for the step cases: `eager` (dense mask, SDPA) or `flex`.
    #[arg(long, default_value = "eager")]
    pub reference_attention: String,
    /// `torch.compile` the reference's decoder layers.
    #[arg(long)]
    pub reference_compile: bool,
    /// Python for the reference (default: $DFLASH_PYTHON, then <repo>/.venv/bin/python, then python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Directory of the reference scripts (default: benches/reference above the working directory).
    #[arg(long)]
    pub reference_dir: Option<PathBuf>,
    /// Where cases and results are written.
    #[arg(long, default_value = "runs/bench")]
    pub out_dir: PathBuf,
    /// A child that runs longer than this is killed and reported.
    #[arg(long, default_value_t = 1800)]
    pub timeout_s: u64,
    /// Size of the square matmul that measures the machine's peak.
    #[arg(long)]
    pub matmul_n: Option<i64>,
    /// A datasheet peak (TFLOP/s) to report MFU against, e.g. 989 for H200 dense bf16.
    #[arg(long)]
    pub datasheet_peak_tflops: Option<f64>,
    /// Objectives case: the seeds; every objective trains once per seed.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 2, 3])]
    pub objectives_seeds: Vec<u64>,
    /// Objectives case: the data sets, each its own tournament: `embedded` (the embedded
    /// default's set) and `regenerated` (its replies regenerated by the tiny target first).
    #[arg(long, value_delimiter = ',', default_values_t = ["embedded".to_string(), "regenerated".to_string()])]
    pub objectives_data: Vec<String>,
    /// Objectives case: `training.epochs` of each run. The schedule (warmup, learning-rate
    /// decay, Domino's λ) spans them; the embedded default has 107 steps per epoch.
    #[arg(long, default_value_t = 1)]
    pub objectives_epochs: u32,
    /// Objectives case: each run stops after this many steps (`dflashd start --max-steps`).
    /// The default is a smoke check; docs/BENCHMARKS.md's table ran a whole schedule
    /// (`--objectives-epochs 6 --objectives-steps 642`).
    #[arg(long, default_value_t = 20)]
    pub objectives_steps: u64,
    /// Objectives case: the contenders trained (dflash, dpace, domino, tree, domino_tree,
    /// dspark, dflash2).
    #[arg(long, value_delimiter = ',', default_values_t = ["dflash".to_string(), "dpace".to_string(), "domino".to_string(), "tree".to_string(), "domino_tree".to_string()])]
    pub objectives_contenders: Vec<String>,
    /// Objectives case: `training.tree.loss` of the tree contenders (margin or expected).
    #[arg(long, default_value = "margin")]
    pub objectives_tree_loss: String,
    /// Objectives case: the DDTree budgets every drafter is decoded and scored (oracle) at.
    #[arg(long, value_delimiter = ',', default_values_t = [8usize, 16, 32, 64])]
    pub objectives_tree_budgets: Vec<usize>,
    /// Objectives case: the figure objectives are ranked and judged by: `chain` (online chain
    /// τ) or `ddtree_<B>` (online DDTree τ at budget B, one of --objectives-tree-budgets; the
    /// default is the serving budget, `training.serve_tree_budget`'s default).
    #[arg(long, default_value = "ddtree_32")]
    pub rank_by: String,
    /// Objectives case: the `dflashd` that trains and evaluates (default: the one beside this
    /// binary).
    #[arg(long)]
    pub dflashd: Option<PathBuf>,
    /// Internal: run one task of one case in this process and print its JSON.
    #[arg(long, hide = true, value_enum)]
    pub child: Option<ChildTask>,
    #[arg(long, hide = true)]
    pub work_dir: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub config: Option<String>,
    #[arg(long, hide = true)]
    pub backend: Option<String>,
    #[arg(long, hide = true)]
    pub forward_only: bool,
    /// run-step child: one more step with its executed FLOPs counted op by op.
    #[arg(long, hide = true)]
    pub count_flops: bool,
    /// Items pushed through the queue in the queue case.
    #[arg(long, default_value_t = 2000)]
    pub queue_items: usize,
    /// Clients attached in the overhead case.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    #[arg(long, hide = true)]
    pub socket: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub sampler: bool,
    /// real-step / target-layers children: the reduced shapes of the CPU self-test.
    #[arg(long, hide = true)]
    pub reduced: bool,
    /// multi-gpu child: the two devices (`cuda:0,cuda:1`; `cpu,cpu` in the self-test).
    #[arg(long, hide = true, value_delimiter = ',')]
    pub devices: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ChildTask {
    PrepareStep,
    RunStep,
    PrepareAttention,
    RunAttention,
    PrepareTarget,
    RunTarget,
    Matmul,
    Overhead,
    Clients,
    Queue,
    /// The GPU check's drafter step at the real structure (`--reduced`: the CPU self-test's).
    RealStep,
    /// The GPU check's target layers at the real dimensions (`--reduced`: small ones).
    TargetLayers,
    /// The GPU check's multi-device step on `--devices` (2): all-reduce of the drafter's
    /// gradient size (`--reduced`: the reduced drafter's) and a 2-rank step against 1 rank.
    MultiGpu,
}

fn parse_kind(name: &str) -> Result<Kind> {
    match name {
        "f32" | "float32" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        other => bail!("--dtype: expected `f32` or `bf16`, found `{other}`"),
    }
}

fn child_value(task: ChildTask, args: &BenchArgs) -> Result<Value, BenchError> {
    let dir = args.work_dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let warmup = args.warmup.unwrap_or(2);
    let steps = args.steps.unwrap_or(5);
    let to_value = |v: serde_json::Result<Value>| {
        v.map_err(|e| BenchError::case(&dir, format!("cannot serialise the result: {e}")))
    };
    let child = ChildCall {
        task,
        args,
        dir: &dir,
        warmup,
        steps,
    };
    let usage = |what: &str| child.usage(what);
    match task {
        ChildTask::PrepareStep => {
            let preset = step_preset(args.config.as_deref().ok_or_else(|| usage("--config"))?)?;
            to_value(serde_json::to_value(prepare_step_case(&preset, &dir)?))
        }
        ChildTask::RunStep => {
            let opts = child.step_options()?;
            to_value(serde_json::to_value(run_engine_step(&dir, &opts)?))
        }
        ChildTask::PrepareAttention => {
            let anchors = *args.anchors.first().ok_or_else(|| usage("--anchors"))?;
            to_value(serde_json::to_value(prepare_attention_case(
                &AttentionPreset::at(anchors),
                &dir,
            )?))
        }
        ChildTask::RunAttention => {
            let backend = match args.backend.as_deref() {
                Some("block_sparse") => AttentionBackend::BlockSparse,
                Some("dense_mask") => AttentionBackend::DenseMask,
                _ => return Err(usage("--backend block_sparse|dense_mask")),
            };
            to_value(serde_json::to_value(run_engine_attention(
                &dir, backend, warmup, steps,
            )?))
        }
        ChildTask::PrepareTarget => to_value(serde_json::to_value(prepare_target_case(
            &target_preset(args.quick),
            &dir,
        )?)),
        ChildTask::RunTarget => to_value(serde_json::to_value(run_engine_target(
            &dir, warmup, steps,
        )?)),
        ChildTask::Matmul => {
            let device = parse_device(&args.device).map_err(|e| usage(&e.to_string()))?;
            let kind = parse_kind(&args.dtype).map_err(|e| usage(&e.to_string()))?;
            let n = args.matmul_n.unwrap_or(2048);
            to_value(serde_json::to_value(matmul::measure(
                n, device, kind, warmup, steps,
            )?))
        }
        ChildTask::Overhead => to_value(serde_json::to_value(run_overhead(
            &dir,
            args.clients,
            args.sampler,
            warmup,
            steps,
        )?)),
        ChildTask::Clients => {
            run_clients(
                args.socket.as_deref().ok_or_else(|| usage("--socket"))?,
                args.clients,
            )?;
            Ok(json!({ "clients": args.clients }))
        }
        ChildTask::RealStep => to_value(serde_json::to_value(child.real_step()?)),
        ChildTask::TargetLayers => {
            let device = parse_device(&args.device).map_err(|e| usage(&e.to_string()))?;
            let opts = target_layers::TargetLayersOptions {
                device,
                reduced: args.reduced,
                layers_per_kind: if args.reduced { 2 } else { 3 },
                seq_len: if args.reduced { 128 } else { 4096 },
                warmup,
                steps,
                peak_flops: args.datasheet_peak_tflops.map(|t| t * 1e12),
            };
            to_value(serde_json::to_value(target_layers::run_target_layers(
                &opts,
            )?))
        }
        ChildTask::MultiGpu => child.multi_gpu(),
        ChildTask::Queue => to_value(serde_json::to_value(run_queue(QueueCase::default_for(
            args.steps.unwrap_or(2000),
        ))?)),
    }
}

/// One child task's arguments, with the defaults `child_value` filled in.
struct ChildCall<'a> {
    task: ChildTask,
    args: &'a BenchArgs,
    dir: &'a Path,
    warmup: usize,
    steps: usize,
}

impl ChildCall<'_> {
    fn usage(&self, what: &str) -> BenchError {
        let task = self.task;
        BenchError::case(self.dir, format!("child task {task:?} needs {what}"))
    }

    fn step_options(&self) -> Result<StepOptions, BenchError> {
        let args = self.args;
        let device = parse_device(&args.device).map_err(|e| self.usage(&e.to_string()))?;
        let kind = parse_kind(&args.dtype).map_err(|e| self.usage(&e.to_string()))?;
        let backend = match args.backend.as_deref() {
            None | Some("block_sparse") => AttentionBackend::BlockSparse,
            Some("dense_mask") => AttentionBackend::DenseMask,
            Some(_) => return Err(self.usage("--backend block_sparse|dense_mask")),
        };
        Ok(StepOptions {
            warmup: self.warmup,
            steps: self.steps,
            device,
            kind,
            forward_only: args.forward_only,
            memory_steps: args.memory_steps,
            backend,
            activation_checkpointing: args.activation_checkpointing,
            count_flops: args.count_flops,
        })
    }

    fn real_step(&self) -> Result<real_step::RealStepSummary, BenchError> {
        let args = self.args;
        let device = parse_device(&args.device).map_err(|e| self.usage(&e.to_string()))?;
        let shape = if args.reduced {
            real_step::reduced_structure()
        } else {
            real_step::real_structure()
        };
        let (shape, note) = real_step::fit_vocab(shape, device);
        let opts = real_step::RealStepOptions {
            shape,
            device,
            warmup: self.warmup,
            steps: self.steps,
            peak_flops: args.datasheet_peak_tflops.map(|t| t * 1e12),
            seed: 1,
        };
        let mut summary = real_step::run_real_step(self.dir, &opts)?;
        summary.vocab_note = note;
        Ok(summary)
    }

    fn multi_gpu(&self) -> Result<Value, BenchError> {
        let args = self.args;
        let devices = args
            .devices
            .iter()
            .map(|d| parse_device(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.usage(&e.to_string()))?;
        let [a, b] = devices[..] else {
            return Err(self.usage("--devices with two devices (cuda:0,cuda:1)"));
        };
        let shape = if args.reduced {
            real_step::reduced_structure()
        } else {
            real_step::real_structure()
        };
        let elements = dflash_engine::plan::drafter::drafter_params(&shape.drafter) as i64;
        let all_reduce = multi_gpu::measure_all_reduce(&[a, b], elements, self.warmup, self.steps)?;
        let parity = multi_gpu::two_rank_parity([a, b], 3)?;
        Ok(json!({ "all_reduce": all_reduce, "two_rank_step": parity, "ok": parity.ok }))
    }
}

fn run_child(task: ChildTask, args: &BenchArgs) -> Result<()> {
    if let Some(t) = args.threads {
        tch::set_num_threads(t);
    }
    match child_value(task, args) {
        Ok(value) => {
            println!("{value}");
            Ok(())
        }
        Err(e) => {
            // The parent reads the error from the JSON; the exit status says it too.
            println!("{}", json!({ "error": e.to_string() }));
            std::process::exit(1);
        }
    }
}

fn defaults(args: &BenchArgs) -> (Vec<String>, Vec<String>, Vec<usize>) {
    let or = |given: &[String], default: &[&str]| {
        if given.is_empty() {
            default.iter().map(|s| s.to_string()).collect()
        } else {
            given.to_vec()
        }
    };
    let cases = or(
        &args.cases,
        if args.quick {
            &["step"]
        } else {
            &["step", "attention", "target", "overhead", "queue"]
        },
    );
    let configs = or(
        &args.configs,
        if args.quick {
            &["tiny"]
        } else {
            CPU_STEP_PRESETS
        },
    );
    let anchors = if args.anchors.is_empty() {
        ATTENTION_LADDER.to_vec()
    } else {
        args.anchors.clone()
    };
    (cases, configs, anchors)
}

/// `--objectives-contenders` in the tournament's own order, each once.
fn objectives_contenders(names: &[String]) -> Result<Vec<dflash_bench::objectives::Contender>> {
    use dflash_bench::objectives::Contender;
    let chosen: Vec<Contender> = names
        .iter()
        .map(|n| Contender::parse(n))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    if chosen.is_empty() {
        bail!("--objectives-contenders: give at least one");
    }
    Ok(Contender::ALL
        .into_iter()
        .filter(|c| chosen.contains(c))
        .collect())
}

/// The objectives case's settings: online evaluation at most 64 new tokens (the embedded
/// default's), at every `--objectives-tree-budgets` budget, on every held-out prompt.
fn objectives_options(args: &BenchArgs) -> Result<dflash_bench::objectives::ObjectivesOptions> {
    let dflashd = match &args.dflashd {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .context("locating this binary to find dflashd beside it")?
            .with_file_name("dflashd"),
    };
    if !dflashd.is_file() {
        bail!(
            "--cases objectives needs dflashd: {} is not a file; build it (`cargo build --release -p dflashd`) or pass --dflashd PATH",
            dflashd.display()
        );
    }
    if args.objectives_epochs == 0 || args.objectives_steps == 0 {
        bail!("--objectives-epochs and --objectives-steps must be at least 1");
    }
    let rank_by = dflash_bench::objectives::RankBy::parse(&args.rank_by)
        .map_err(|e| anyhow::anyhow!("--rank-by: {e}"))?;
    if args.objectives_tree_budgets.contains(&0) {
        bail!("--objectives-tree-budgets: every budget is a positive node count");
    }
    if let dflash_bench::objectives::RankBy::Ddtree(b) = rank_by {
        if !args.objectives_tree_budgets.contains(&b) {
            bail!(
                "--rank-by ddtree_{b}: budget {b} is not decoded; add it to --objectives-tree-budgets ({:?})",
                args.objectives_tree_budgets
            );
        }
    }
    Ok(dflash_bench::objectives::ObjectivesOptions {
        dflashd,
        seeds: args.objectives_seeds.clone(),
        data: args
            .objectives_data
            .iter()
            .map(|d| dflash_bench::objectives::data::TournamentData::parse(d))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?,
        epochs: args.objectives_epochs,
        max_steps: args.objectives_steps,
        tree_budgets: args.objectives_tree_budgets.clone(),
        max_new_tokens: 64,
        timeout_s: args.timeout_s,
        contenders: objectives_contenders(&args.objectives_contenders)?,
        tree_loss: match args.objectives_tree_loss.as_str() {
            "margin" => dflash_shared::config::TreeLoss::Margin,
            "expected" => dflash_shared::config::TreeLoss::Expected,
            other => bail!("--objectives-tree-loss: margin or expected, found {other:?}"),
        },
        rank_by,
    })
}

/// Prints a progress line with the machine's load, which every figure is read against.
fn progress(what: &str) {
    eprintln!(
        "[bench] {what} (load average {:.1})",
        loadavg().unwrap_or(f64::NAN)
    );
}

/// What a parent run measures: the cases, the step configs and the attention ladder, checked.
struct Selection {
    cases: Vec<String>,
    configs: Vec<String>,
    anchors: Vec<usize>,
}

impl Selection {
    fn checked(args: &BenchArgs) -> Result<Self> {
        let (cases, configs, anchors) = defaults(args);
        if let Some(bad) = cases.iter().find(|c| !CASES.contains(&c.as_str())) {
            bail!(
                "--cases: unknown case `{bad}`; expected some of {}",
                CASES.join(", ")
            );
        }
        for c in &configs {
            step_preset(c)?;
        }
        parse_device(&args.device)?;
        parse_kind(&args.dtype)?;
        if !["eager", "flex"].contains(&args.reference_attention.as_str()) {
            bail!(
                "--reference-attention: expected `eager` or `flex`, found `{}`",
                args.reference_attention
            );
        }
        Ok(Selection {
            cases,
            configs,
            anchors,
        })
    }
}

/// The parent's harness: the out dir (created) and the per-device defaults of every length.
fn harness_for(args: &BenchArgs) -> Result<Harness> {
    fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let out_dir = args
        .out_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", args.out_dir.display()))?;
    let cuda = args.device != "cpu";
    Ok(Harness {
        out_dir,
        warmup: args.warmup.unwrap_or(if cuda { 3 } else { 2 }),
        steps: args.steps.unwrap_or(if cuda { 10 } else { 5 }),
        memory_steps: args.memory_steps,
        activation_checkpointing: args.activation_checkpointing,
        rounds: args
            .rounds
            .unwrap_or(if args.quick || cuda { 1 } else { 2 }),
        threads: args.threads.unwrap_or(1),
        device: args.device.clone(),
        dtype: args.dtype.clone(),
        python: Python::locate(args.python.clone(), args.reference_dir.clone())
            .map_err(|e| e.to_string()),
        reference: ReferenceMode {
            attention: args.reference_attention.clone(),
            compile: args.reference_compile,
        },
        timeout: Duration::from_secs(args.timeout_s),
    })
}

pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(task) = args.child {
        return run_child(task, &args);
    }
    let selection = Selection::checked(&args)?;
    let harness = harness_for(&args)?;
    let mut report = BenchReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: Machine::probe(harness.threads),
        ..BenchReport::default()
    };
    matmul_peak(&args, &harness, &mut report);
    // In CASES's order, whatever order --cases gave.
    for case in CASES
        .iter()
        .filter(|c| selection.cases.iter().any(|s| s == *c))
    {
        run_case(case, &args, &selection, &harness, &mut report)?;
    }
    report.machine.loadavg_end = loadavg();
    write_results(&args, &report, &harness.out_dir)
}

/// The dense matmul peak every MFU of the run is read against (f32 on CPU, --dtype on CUDA).
fn matmul_peak(args: &BenchArgs, harness: &Harness, report: &mut BenchReport) {
    let (dtype, n) = if args.device != "cpu" {
        (args.dtype.as_str(), args.matmul_n.unwrap_or(8192))
    } else {
        ("f32", args.matmul_n.unwrap_or(2048))
    };
    progress(&format!("matmul peak: {dtype} {n}x{n} on {}", args.device));
    match harness.matmul(n, &args.device, dtype) {
        Ok(p) => report.matmul_peak = Some(p),
        Err(e) => report.errors.push(format!("matmul peak: {e}")),
    }
}

/// One case into the report. A case that fails is an error line of the report, not the end
/// of the run; only failing to write a case's own file ends it.
fn run_case(
    case: &str,
    args: &BenchArgs,
    selection: &Selection,
    harness: &Harness,
    report: &mut BenchReport,
) -> Result<()> {
    let cuda = args.device != "cpu";
    match case {
        "step" => {
            if !harness.measures_live_memory() && args.memory_steps > 0 {
                report.not_done.push(format!(
                    "live step memory: the memory pass runs on CPU only; on {} the step tables' \
                     `cuda_max_allocated_mb` (results.json) is the device's own peak",
                    args.device
                ));
            }
            for config in &selection.configs {
                progress(&format!(
                    "drafter step `{config}`: engine vs reference-{}",
                    args.reference_attention
                ));
                match harness.step(config, report.matmul_peak.as_ref()) {
                    Ok(c) => {
                        eprintln!(
                            "[bench]   ratio {:?}, check {}",
                            c.ratio,
                            c.check.void_reason.as_deref().unwrap_or("valid")
                        );
                        report.steps.push(c);
                    }
                    Err(e) => report.errors.push(format!("step {config}: {e}")),
                }
            }
        }
        "attention" => {
            for &n in &selection.anchors {
                progress(&format!("attention at {n} anchors"));
                match harness.attention(n) {
                    Ok(r) => report.attention.push(r),
                    Err(e) => report.errors.push(format!("attention {n}: {e}")),
                }
            }
        }
        "target" => {
            progress("target feature pass: engine vs transformers");
            match harness.target(args.quick) {
                Ok(t) => report.target = Some(t),
                Err(e) => report.errors.push(format!("target: {e}")),
            }
        }
        "overhead" => {
            progress(&format!(
                "daemon overhead: 0 vs {} clients, telemetry sampler off/on",
                args.clients
            ));
            match harness.overhead(args.clients) {
                Ok(o) => report.overhead = Some(o),
                Err(e) => report.errors.push(format!("overhead: {e}")),
            }
        }
        "queue" => {
            progress("hidden-state queue throughput");
            match harness.queue(args.queue_items) {
                Ok(q) => report.queue = Some(q),
                Err(e) => report.errors.push(format!("queue: {e}")),
            }
        }
        "parity" => {
            // The first config given (`--configs tiny` or `small`, the multi-chunk shape); on
            // the CPU this is the GPU check's self-test (CPU against CPU).
            let config = selection.configs.first().map_or("tiny", |c| c.as_str());
            progress(&format!(
                "parity ({config}): {} vs CPU (f32) and {} bf16 vs the reference",
                args.device, args.device
            ));
            match harness.parity(&args.device, config) {
                Ok(p) => report.parity = Some(p),
                Err(e) => report.errors.push(format!("parity: {e}")),
            }
        }
        "plan" if cuda => report
            .errors
            .push("plan: the memory pass runs on CPU only".into()),
        "plan" => {
            progress("plan: predicted vs measured live step memory and executed FLOPs");
            let plan_configs: Vec<String> = if args.configs.is_empty() {
                plan_check::PLAN_CONFIGS
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            } else {
                args.configs.clone()
            };
            let plan = plan_check::run(harness, &plan_configs);
            let path = harness.out_dir.join("plan.md");
            fs::write(&path, plan.markdown())
                .with_context(|| format!("writing {}", path.display()))?;
            report.plan = Some(plan);
        }
        "objectives" => {
            let opts = objectives_options(args)?;
            match dflash_bench::objectives::run(&opts, &harness.out_dir, &progress) {
                Ok(results) => {
                    for o in &results {
                        eprintln!("[bench]   {} data: {}", o.data, o.verdict.sentence());
                    }
                    report.objectives = results;
                }
                Err(e) => report.errors.push(format!("objectives: {e}")),
            }
        }
        other => unreachable!("case `{other}` passed Selection::checked"),
    }
    Ok(())
}

/// The one-line JSON summary the last stdout line carries.
fn summary(args: &BenchArgs, report: &BenchReport) -> Value {
    let mut summary = report.summary();
    if let (Some(peak), Some(c)) = (args.datasheet_peak_tflops, report.steps.first()) {
        let mfu = |g: Option<f64>| g.map(|g| g / (peak * 1e3));
        summary["datasheet_peak_tflops"] = json!(peak);
        summary["engine_mfu_datasheet"] = json!(mfu(c.engine_gflops));
        summary["reference_mfu_datasheet"] = json!(mfu(c.reference_gflops));
        summary["reference_tokens_per_s"] = json!(c.reference_tokens_per_s);
    }
    if let Some(p) = &report.parity {
        let verdict = |v: &Option<String>| v.clone().unwrap_or_else(|| "ok".into());
        summary["parity_cuda_vs_cpu"] = json!(verdict(&p.cuda_vs_cpu.void_reason));
        summary["parity_bf16_vs_reference"] = json!(verdict(&p.bf16_vs_reference.void_reason));
    }
    summary
}

/// `results.json` and `results.md` into the out dir, then the summary on stdout.
fn write_results(args: &BenchArgs, report: &BenchReport, out_dir: &std::path::Path) -> Result<()> {
    let json_path = out_dir.join("results.json");
    fs::write(&json_path, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out_dir.join("results.md");
    fs::write(&md_path, report.markdown())
        .with_context(|| format!("writing {}", md_path.display()))?;
    eprintln!(
        "[bench] results: {} and {}",
        json_path.display(),
        md_path.display()
    );
    println!("{}", summary(args, report));
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run(BenchArgs::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dflash-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
