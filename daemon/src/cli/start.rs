//! `dflashd start --foreground`: trains in this process. With no config it uses the embedded
//! default (tiny random target, small drafter, `assets/tiny` data) on the CPU.
//!
//! The run directory holds the target (`target/`, HF layout), checkpoints (`checkpoints/`),
//! `metrics.jsonl` (unless `--metrics-jsonl` points elsewhere) and `data_report.json`. If it
//! already has a checkpoint, training resumes from the newest one, exactly.
//!
//! Metrics lines carry the step's training loss; lines with `tau` also ran a held-out
//! evaluation after that step. The line of step 0 (fresh runs only) is the evaluation of the
//! untrained drafter: its `loss` and `accuracy` are held-out figures and it has no throughput.
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::eval::load_report_json;
use crate::engine::train::embedded;
use crate::engine::train::trainer::{RunOptions, Trainer};
use anyhow::{bail, Context, Result};
use clap::Args;
use tch::Device;

#[derive(Args, Debug)]
pub struct StartArgs {
    /// Train in this process (the default; accepted so service files can say so explicitly).
    #[arg(long)]
    pub foreground: bool,
    /// Run directory: target, checkpoints, metrics.
    #[arg(long, default_value = "runs/default")]
    pub run_dir: PathBuf,
    /// Stop after this many optimizer steps in this invocation (default: until 6 epochs are done).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Append one JSON object per step here (default: <run-dir>/metrics.jsonl).
    #[arg(long)]
    pub metrics_jsonl: Option<PathBuf>,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU threads for libtorch's intra-op parallelism. The tiny default's tensors are too small
    /// to gain from more than one, and spinning threads collapse throughput on a shared machine.
    #[arg(long, default_value_t = 1)]
    pub threads: i32,
    /// Print a progress line every this many steps (0: only evaluations).
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
}

/// `cpu`, `cuda` (device 0) or `cuda:N`.
pub fn parse_device(name: &str) -> Result<Device> {
    let device = match name {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Device::Cuda(i),
            _ => bail!("--device: expected `cpu`, `cuda` or `cuda:N`, found `{other}`"),
        },
    };
    if let Device::Cuda(i) = device {
        let count = tch::Cuda::device_count() as usize;
        if i >= count {
            bail!("--device {name}: this machine has {count} CUDA device(s) visible to libtorch (see `dflashd doctor`)");
        }
    }
    Ok(device)
}

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(signal: libc::c_int) {
    STOP_REQUESTED.store(true, Ordering::SeqCst);
    // A second Ctrl-C kills at once, as users expect. `signal` is async-signal-safe.
    // SAFETY: restoring the default disposition has no preconditions.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
    }
}

/// The first SIGINT/SIGTERM finishes the current step, writes a checkpoint and exits 0.
fn install_stop_handlers() {
    let handler = request_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn run(args: StartArgs) -> Result<()> {
    let device = parse_device(&args.device)?;
    if args.threads < 1 {
        bail!("--threads: expected at least 1, found {}", args.threads);
    }
    tch::set_num_threads(args.threads);
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("cannot create run dir {}", args.run_dir.display()))?;
    let cfg = embedded::tiny_train_config();
    let target = embedded::tiny_target(Some(&args.run_dir), device)?;
    let (samples, report) = embedded::tiny_samples(target.config().vocab_size(), cfg.max_len)?;
    let report_path = args.run_dir.join("data_report.json");
    let report_json = load_report_json(embedded::TINY_DATASET_NAME, &report);
    std::fs::write(&report_path, serde_json::to_vec_pretty(&report_json)?)
        .with_context(|| format!("cannot write {}", report_path.display()))?;
    println!(
        "data: {}: {}",
        embedded::TINY_DATASET_NAME,
        report.summary()
    );

    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut trainer = Trainer::new(target, drafter_cfg, samples, cfg, device)?;
    let checkpoints = args.run_dir.join("checkpoints");
    if let Some(dir) = trainer.resume_latest(&checkpoints)? {
        let pos = trainer.data_position();
        println!(
            "resumed from {} (step {}, epoch {}, sample {} of the epoch)",
            dir.display(),
            trainer.step_count(),
            pos.epoch,
            pos.index
        );
    }
    println!(
        "training on {} for {} steps in total ({} train / {} held-out samples); run dir {}",
        args.device,
        trainer.total_steps(),
        trainer.split().train.len(),
        trainer.split().eval.len(),
        args.run_dir.display()
    );

    let metrics_path = args
        .metrics_jsonl
        .clone()
        .unwrap_or_else(|| args.run_dir.join("metrics.jsonl"));
    if let Some(parent) = metrics_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut metrics = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("cannot open metrics file {}", metrics_path.display()))?;

    install_stop_handlers();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let total = trainer.total_steps();
    let log_every = args.log_every;
    let mut write_error = None;
    let mut sink = |m: &dflash_shared::metrics::StepMetrics| {
        if STOP_REQUESTED.load(Ordering::SeqCst) {
            stop_flag.store(true, Ordering::SeqCst);
        }
        let line = serde_json::to_string(m).map_err(std::io::Error::other);
        if let Err(e) = line
            .and_then(|l| writeln!(metrics, "{l}"))
            .and_then(|_| metrics.flush())
        {
            write_error.get_or_insert(e);
        }
        let show = m.tau.is_some() || (log_every > 0 && m.step % log_every == 0);
        if show {
            let tau = m.tau.map(|t| format!(" tau {t:.3}")).unwrap_or_default();
            println!(
                "step {}/{} epoch {} loss {:.4} acc {:.3}{tau} lr {:.2e} grad_norm {:.3} tok/s {:.0}",
                m.step, total, m.epoch, m.loss, m.accuracy, m.lr, m.grad_norm, m.tokens_per_s
            );
        }
        Ok(())
    };
    let opts = RunOptions {
        max_steps: args.max_steps,
        checkpoint_root: Some(checkpoints),
        stop: Some(stop),
    };
    let summary = trainer.run(&opts, &mut sink)?;
    if let Some(e) = write_error {
        bail!("writing metrics to {} failed: {e}", metrics_path.display());
    }
    let saved = summary
        .last_checkpoint
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "none (no step taken)".into());
    let state = if summary.finished {
        "training complete"
    } else {
        "stopped"
    };
    println!(
        "{state} at step {}/{}; {} steps this run; checkpoint {saved}",
        summary.final_step, total, summary.steps_run
    );
    if let Some(e) = summary.last_eval.as_ref() {
        println!(
            "held-out evaluation: tau {:.4}, loss {:.4}, top-1 accuracy {:.4}",
            e.tau, e.loss, e.accuracy
        );
    }
    Ok(())
}
