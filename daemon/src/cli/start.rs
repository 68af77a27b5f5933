//! `dflashd start`: the daemon. It takes the run-dir lock, journals the start and the
//! environment fingerprint, serves the control socket, and trains with the run config (the
//! embedded tiny CPU default without `--config`) until the schedule ends, `--max-steps` is
//! reached, a signal arrives (checkpoint, exit 0) or an operator stops it through the socket.
//!
//! The run directory holds the target (`target/`, for the embedded default), checkpoints
//! (`checkpoints/`, the last K plus `latest`), `metrics.jsonl` (unless `--metrics-jsonl`
//! points elsewhere), `tensorboard/` (the same lines as TensorBoard events, unless
//! `[tensorboard]` says otherwise), `data_report.json`, the journal, the recording, the
//! effective config and the fingerprint. A run dir with a checkpoint resumes from the newest one, exactly.
//!
//! Metrics lines carry the step's training loss; lines with `tau` also ran a held-out
//! evaluation after that step. The line of step 0 (fresh runs only) is the evaluation of the
//! untrained drafter: its `loss` and `accuracy` are held-out figures and it has no throughput.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use dflash_shared::config::{
    parse_metrics_listen, Config, EMBEDDED_ORIGIN, METRICS_LISTEN_EXPECTED,
};

use super::config::load_config;
use super::memory_plan_args::MemoryPlanArgs;
use super::start_launch::{launch_environment, startable_launch, LaunchArgs};
use crate::run::paths::resolve_path;
use crate::run::paths::{resolve, PathInputs};
use crate::runtime::detach::{self, Detached, Readiness};
use crate::runtime::launch::{launch, LaunchSpec};
use crate::runtime::probe::probe;
use crate::runtime::refused;
use crate::runtime::setup::MemoryPlanPolicy;

#[derive(Args, Debug)]
pub struct StartArgs {
    /// Run config (TOML). Default: the embedded tiny CPU config (`dflashd config show`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Run directory: checkpoints, journal, metrics. Default: `run.run_dir` of the config,
    /// else $XDG_DATA_HOME/dflash/runs/default.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Control socket. Default: `control.socket` of the config, else
    /// $XDG_RUNTIME_DIR/dflash/dflashd.sock (a private /tmp/dflash-<uid>/ without it).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Run in this process (the default; for systemd and tmux).
    #[arg(long, conflicts_with = "detach")]
    pub foreground: bool,
    /// Run in the background: returns once the socket accepts connections and training has
    /// started, printing the pid and how to attach and stop.
    #[arg(long)]
    pub detach: bool,
    /// With --detach: if a dflashd already answers on the socket, say so and exit 0.
    #[arg(long, requires = "detach")]
    pub reuse_running: bool,
    /// Stop after this many optimizer steps of this invocation, checkpointing there; a resume
    /// counts afresh. Default: until the schedule ends (`training.epochs`, capped by
    /// `training.max_steps` when set).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Append one JSON object per step here (default: <run-dir>/metrics.jsonl).
    #[arg(long)]
    pub metrics_jsonl: Option<PathBuf>,
    /// Accept the environment drift that held the run; the token is printed in the refusal.
    #[arg(long, value_name = "TOKEN")]
    pub accept_drift: Option<String>,
    /// Resume from this checkpoint (`step-N`, as named under <run-dir>/checkpoints/) when the
    /// newest one is damaged or missing: only the newest intact step is accepted, `step-0`
    /// when none is left. The start's refusal names it and the steps it re-trains; the damaged
    /// directories are moved to `checkpoints/corrupt-step-…` and the choice is journaled.
    #[arg(long, value_name = "STEP")]
    pub resume_from: Option<String>,
    /// CPU threads for libtorch's intra-op parallelism. The tiny default's tensors are too small
    /// to gain from more than one, and spinning threads collapse throughput on a shared machine.
    #[arg(long, default_value_t = 1)]
    pub threads: i32,
    /// Print a progress line every this many steps (0: only evaluations).
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
    #[command(flatten)]
    pub memory_plan: MemoryPlanArgs,
    /// Start even when the memory plan predicts a device over capacity; the override is
    /// journaled.
    #[arg(long)]
    pub ignore_memory_plan: bool,
    /// The CPU's MFU peak, FLOP/s (e.g. 5e10), instead of timing a 1024×1024 matmul at start
    /// (about a second); journaled as given, not measured. For tests and for machines whose
    /// rate is known; CUDA devices keep their datasheet figure.
    #[arg(long, value_name = "FLOPS", env = "DFLASH_CPU_PEAK_FLOPS")]
    pub cpu_peak_flops: Option<f64>,
    /// Serve Prometheus `/metrics` here, overriding `metrics.listen`: `IP:PORT`, or a bare
    /// port for 127.0.0.1 (port 0: any free port; the journal and the banner say which). An
    /// address beyond loopback serves the run's figures to anyone who can reach it.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub launch: LaunchArgs,
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

pub fn run(args: StartArgs) -> Result<ExitCode> {
    // First, while this process has one thread and before any tch call: libtorch reads the
    // variable when it initialises its CUDA allocator.
    let alloc_conf = crate::runtime::alloc_conf::apply();
    // Before anything of the run is written: other users may not read it.
    crate::runtime::private_files::restrict_umask();
    check_numeric_flags(&args)?;
    let (config, config_path) = load_start_config(&args)?;
    for warning in config.warnings() {
        let origin = config_path
            .as_ref()
            .map_or(EMBEDDED_ORIGIN.to_string(), |p| p.display().to_string());
        eprintln!("dflashd: warning: {origin}: {warning}");
    }
    let paths = resolve(&PathInputs::from_environment()?);
    let run_dir = match (&args.run_dir, &config.run.run_dir) {
        (Some(dir), _) => dir.clone(),
        (None, Some(dir)) => resolve_path(
            "run.run_dir",
            dir,
            config_path.as_deref(),
            &paths.default_run_dir,
        )?,
        (None, None) => paths.default_run_dir.clone(),
    };
    let run_dir = absolute(&run_dir)?;
    // Before anything of the run is opened: a launch that does not resolve is refused.
    let node = match startable_launch(&args.launch, &launch_environment()) {
        Ok(node) => node,
        Err(text) => {
            refused::journal_refused_start(&run_dir, &format!("the run did not start: {text}"));
            bail!(text);
        }
    };
    check_python(&config, config_path.as_deref(), &run_dir)?;
    let socket = match (&args.socket, &config.control.socket) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => resolve_path("control.socket", s, config_path.as_deref(), &run_dir)?,
        (None, None) => paths.socket.clone(),
    };
    let socket_is_default = args.socket.is_none() && config.control.socket.is_none();
    let socket = absolute(&socket)?;
    let device_override = args.memory_plan.device_override()?;
    let metrics_listen = metrics_listen(&args, &config)?;
    let resume_from = args
        .resume_from
        .as_deref()
        .map(crate::runtime::checkpoint_gate::parse_resume_from)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    if args.reuse_running {
        if let Some(live) = probe(&socket, Duration::from_secs(3)) {
            println!(
                "dflashd is already running on {} (pid {}, run '{}'); reusing it.",
                socket.display(),
                live.pid,
                live.run_name
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    let metrics_path = match &args.metrics_jsonl {
        Some(p) => absolute(p)?,
        None => run_dir.join(dflash_shared::run_dir::METRICS_FILE_NAME),
    };
    let spec = LaunchSpec {
        config,
        config_path,
        paths,
        run_dir,
        socket,
        socket_is_default,
        max_steps: args.max_steps,
        metrics_path,
        log_every: args.log_every,
        device_override,
        accept_drift: args.accept_drift,
        threads: args.threads,
        memory_plan: MemoryPlanPolicy {
            stated_gib: args.memory_plan.gpu_memory_gib,
            ignore: args.ignore_memory_plan,
        },
        cpu_peak_flops: args.cpu_peak_flops,
        resume_from,
        metrics_listen,
        alloc_conf,
        collective_timeout: args.launch.collective_timeout(),
        node,
    };
    launch_in_place_or_detached(spec, args.detach)
}

/// The numeric flags no config can fix: refused before anything is read.
fn check_numeric_flags(args: &StartArgs) -> Result<()> {
    if args.threads < 1 {
        bail!("--threads: expected at least 1, found {}", args.threads);
    }
    args.memory_plan.check_gpu_memory()?;
    if let Some(flops) = args.cpu_peak_flops {
        if !(flops.is_finite() && flops > 0.0) {
            bail!(
                "--cpu-peak-flops (DFLASH_CPU_PEAK_FLOPS): expected a positive number of FLOP/s, found {flops}"
            );
        }
    }
    Ok(())
}

/// `--config`, or the embedded default. A config that fails says how to check it, and is
/// journaled in `--run-dir` when one was given (the config that would name it failed).
fn load_start_config(args: &StartArgs) -> Result<(Config, Option<PathBuf>)> {
    let Some(path) = &args.config else {
        return Ok((Config::embedded_default(), None));
    };
    match load_config(path) {
        Ok(config) => Ok((config, Some(absolute(path)?))),
        Err(e) => {
            let text = format!(
                "{e:#}\nFix the config (check it with `dflashd config validate {}`) and start \
                 again.",
                path.display()
            );
            if let Some(dir) = &args.run_dir {
                let reason = format!("the run did not start: {}", text.replace('\n', " "));
                refused::journal_refused_start(&absolute(dir)?, &reason);
            }
            bail!(text);
        }
    }
}

/// `config validate` refuses a `telemetry.python` that names no file; so does `start`, before
/// it records a fingerprint without the Python environment the operator asked for.
fn check_python(config: &Config, config_path: Option<&Path>, run_dir: &Path) -> Result<()> {
    let Some(python) = &config.telemetry.python else {
        return Ok(());
    };
    let resolved = resolve_path("telemetry.python", python, config_path, run_dir)?;
    if !resolved.is_file() {
        let text = format!(
            "telemetry.python = {python:?}: expected the path of an existing Python \
             interpreter, found {} (no such file). Fix the path, or remove the key to record \
             no Python environment, and start again.",
            resolved.display()
        );
        refused::journal_refused_start(run_dir, &format!("the run did not start: {text}"));
        bail!(text);
    }
    Ok(())
}

/// `--metrics-listen`, else `metrics.listen`. `config validate` checked the key already; the
/// flag is read by the same rule.
fn metrics_listen(args: &StartArgs, config: &Config) -> Result<Option<SocketAddr>> {
    Ok(match (&args.metrics_listen, &config.metrics.listen) {
        (Some(text), _) => Some(parse_metrics_listen(text).map_err(|found| {
            anyhow::anyhow!("--metrics-listen: expected {METRICS_LISTEN_EXPECTED}, found {found}")
        })?),
        (None, Some(text)) => Some(
            parse_metrics_listen(text)
                .map_err(|found| anyhow::anyhow!("metrics.listen: found {found}"))?,
        ),
        (None, None) => None,
    })
}

/// Runs the daemon here, or (`--detach`) forks it and reports once it serves or failed.
fn launch_in_place_or_detached(spec: LaunchSpec, detach: bool) -> Result<ExitCode> {
    let ready = if detach {
        let stdio_log = detach::stdio_log_path(&spec.paths.log_dir);
        match detach::detach(&stdio_log).context("detaching")? {
            Detached::Starter(verdict) => {
                if verdict.code == 0 {
                    println!("{}", verdict.text);
                    println!("  output:   {}", stdio_log.display());
                } else {
                    eprintln!("dflashd: {}", verdict.text);
                }
                return Ok(ExitCode::from(verdict.code));
            }
            Detached::Daemon(ready) => ready,
        }
    } else {
        Readiness::foreground()
    };
    Ok(ExitCode::from(launch(spec, ready)))
}
