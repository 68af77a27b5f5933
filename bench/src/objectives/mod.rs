//! `dflash-bench --cases objectives`: the objective tournament. The same drafter backbone is
//! trained from the same seed with DFlash, D-PACE and Domino by real `dflashd start` runs on
//! the embedded tiny default (each its own process, so its peak resident set is its own), and
//! each final drafter is scored by `dflashd eval --json` on the run's held-out samples and by
//! `dflashd eval --online --json` (chain and DDTree) on the embedded held-out prompts.
//!
//! [`summary`] is the pure arithmetic (spreads across seeds, the verdict); [`run_config`] the
//! config each run trains with; [`markdown`] the tables; this file the processes and files.
pub mod markdown;
pub mod run_config;
pub mod summary;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::BenchError;
use super::process::run_json;
use super::stats::median;
use dflash_engine::train::embedded::{tiny_heldout_prompts, tiny_samples, tiny_train_config};
use dflash_engine::train::loader::split_held_out;
use run_config::{run_config_toml, RunRecipe};
use summary::{summarise, verdict, Contender, ContenderSummary, RunFigures, Verdict};

/// The embedded target's vocabulary (`TargetConfig::tiny_default()`).
const TINY_VOCAB: i64 = 512;

/// What the tournament runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectivesOptions {
    /// The `dflashd` binary that trains and evaluates.
    pub dflashd: PathBuf,
    pub seeds: Vec<u64>,
    /// `training.epochs` of every run: the schedule spans them.
    pub epochs: u32,
    /// `dflashd start --max-steps`: each run stops here (or at the schedule's end).
    pub max_steps: u64,
    pub tree_budgets: Vec<usize>,
    pub max_new_tokens: usize,
    /// A child that runs longer than this is killed and its run reported failed.
    pub timeout_s: u64,
}

/// The tournament's results, as `results.json` holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectivesResult {
    pub options: ObjectivesOptions,
    /// Which data the runs trained on.
    pub data: String,
    /// `dflashd --version`.
    pub dflashd_version: String,
    pub runs: Vec<RunFigures>,
    pub summaries: Vec<ContenderSummary>,
    pub verdict: Verdict,
}

fn process_error(program: &str, detail: impl Into<String>) -> BenchError {
    BenchError::Process {
        program: program.into(),
        detail: detail.into(),
    }
}

/// The embedded held-out prompts as a prompts file for `dflashd eval --online`.
fn write_prompts(path: &Path) -> Result<(), BenchError> {
    let mut text = String::new();
    for ids in tiny_heldout_prompts() {
        text.push_str(&serde_json::json!({ "input_ids": ids }).to_string());
        text.push('\n');
    }
    fs::write(path, text).map_err(BenchError::io(path))
}

/// The samples a run of `seed` holds out (the trainer's own split of the embedded data), as a
/// pre-tokenized file for `dflashd eval --data`.
fn write_held_out(seed: u64, path: &Path) -> Result<usize, BenchError> {
    let train = tiny_train_config();
    let (samples, _) = tiny_samples(TINY_VOCAB, train.max_len)?;
    let split = split_held_out(samples.len(), train.held_out, seed)?;
    let mut text = String::new();
    for &i in &split.eval {
        let s = &samples[i];
        let row = serde_json::json!({ "input_ids": s.input_ids, "loss_mask": s.loss_mask });
        text.push_str(&row.to_string());
        text.push('\n');
    }
    fs::write(path, text).map_err(BenchError::io(path))?;
    Ok(split.eval.len())
}

/// Runs `cmd` with its output in `log`, and returns its exit code and peak resident set (MiB,
/// the kernel's `ru_maxrss` of that process alone, from `wait4`).
fn run_measured(mut cmd: Command, log: &Path, timeout: Duration) -> Result<(i32, f64), BenchError> {
    let program = format!("{:?}", cmd.get_program());
    let file = fs::File::create(log).map_err(BenchError::io(log))?;
    let err_file = file.try_clone().map_err(BenchError::io(log))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err_file)
        .spawn()
        .map_err(|e| process_error(&program, format!("cannot start: {e}")))?;
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + timeout;
    let mut killed = false;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain FFI out-parameters; `pid` is our own unreaped child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if killed { 0 } else { libc::WNOHANG };
        let reaped = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if reaped == pid {
            let rss_mib = usage.ru_maxrss as f64 / 1024.0;
            if killed {
                return Err(process_error(
                    &program,
                    format!(
                        "killed after {} s; its output: {}",
                        timeout.as_secs(),
                        log.display()
                    ),
                ));
            }
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
            return Ok((code, rss_mib));
        }
        if reaped < 0 {
            return Err(process_error(
                &program,
                format!("wait4: {}", std::io::Error::last_os_error()),
            ));
        }
        if !killed && Instant::now() >= deadline {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
            continue;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Per-step loss and step time, and the last held-out τ, from a run's `metrics.jsonl`.
fn read_metrics(path: &Path, figures: &mut RunFigures) -> Result<(), BenchError> {
    let text = fs::read_to_string(path).map_err(BenchError::io(path))?;
    let mut step_ms = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| BenchError::case(path, format!("a line is not JSON: {e}")))?;
        // The evaluation line before the first step is step 0 (its loss is the held-out
        // evaluation's, its times zero); training steps count from 1.
        let step = v["step"].as_u64().unwrap_or(0);
        if step == 0 {
            continue;
        }
        let total_ms = v.pointer("/times/total_ms").and_then(Value::as_f64);
        step_ms.push(total_ms.unwrap_or(f64::NAN));
        figures.loss.push(v["loss"].as_f64().unwrap_or(f64::NAN));
        figures.steps = step;
        if let Some(tau) = v["tau"].as_f64() {
            figures.trainer_tau = Some(tau);
            figures.trainer_tau_step = Some(step);
        }
    }
    figures.median_step_ms = median(&step_ms);
    Ok(())
}

struct RunPaths {
    dir: PathBuf,
    run: PathBuf,
    export: PathBuf,
}

fn dflashd(opts: &ObjectivesOptions, args: &[&str]) -> Command {
    let mut cmd = Command::new(&opts.dflashd);
    cmd.args(args);
    cmd
}

/// Trains one run, then scores its final drafter; every figure it could not read is `None`
/// and the first failure is its `error`.
fn run_one(
    opts: &ObjectivesOptions,
    recipe: &RunRecipe,
    paths: &RunPaths,
    held_out: &Path,
    prompts: &Path,
) -> RunFigures {
    let mut figures = RunFigures {
        contender: Some(recipe.contender),
        seed: recipe.seed,
        ..RunFigures::default()
    };
    if let Err(e) = train_and_score(opts, recipe, paths, held_out, prompts, &mut figures) {
        figures.error = Some(e.to_string());
    }
    figures
}

fn train_and_score(
    opts: &ObjectivesOptions,
    recipe: &RunRecipe,
    paths: &RunPaths,
    held_out: &Path,
    prompts: &Path,
    figures: &mut RunFigures,
) -> Result<(), BenchError> {
    let timeout = Duration::from_secs(opts.timeout_s);
    if paths.dir.exists() {
        fs::remove_dir_all(&paths.dir).map_err(BenchError::io(&paths.dir))?;
    }
    fs::create_dir_all(&paths.dir).map_err(BenchError::io(&paths.dir))?;
    let config = paths.dir.join("config.toml");
    let text = run_config_toml(recipe).map_err(|e| BenchError::case(&config, e))?;
    fs::write(&config, text).map_err(BenchError::io(&config))?;

    let started = Instant::now();
    // A directory of its own, which dflashd creates 0700 (it refuses a socket in a directory
    // others could reach).
    let socket = paths.dir.join("control").join("dflashd.sock");
    let mut start = dflashd(
        opts,
        &[
            "start",
            "--foreground",
            "--threads",
            "1",
            "--log-every",
            "0",
        ],
    );
    start
        .arg("--config")
        .arg(&config)
        .arg("--run-dir")
        .arg(&paths.run)
        .arg("--socket")
        .arg(&socket)
        .args(["--max-steps", &opts.max_steps.to_string()]);
    let log = paths.dir.join("start.log");
    let (code, rss_mib) = run_measured(start, &log, timeout)?;
    figures.wall_s = Some(started.elapsed().as_secs_f64());
    figures.peak_rss_mib = Some(rss_mib);
    if code != 0 {
        return Err(process_error(
            "dflashd start",
            format!("exited {code}; its output: {}", log.display()),
        ));
    }
    read_metrics(&paths.run.join("metrics.jsonl"), figures)?;

    let mut export = dflashd(opts, &["export", "--dtype", "f32"]);
    export
        .arg("--checkpoint")
        .arg(&paths.run)
        .arg("--out")
        .arg(&paths.export);
    let (code, _) = run_measured(export, &paths.dir.join("export.log"), timeout)?;
    if code != 0 {
        return Err(process_error("dflashd export", format!("exited {code}")));
    }
    let target = paths.run.join("target");
    let mut eval = dflashd(opts, &["eval", "--json", "--threads", "1"]);
    eval.arg("--target")
        .arg(&target)
        .arg("--drafter")
        .arg(&paths.export);
    eval.arg("--data").arg(held_out);
    let offline: Value = run_json(eval, timeout)?;
    save_json(&paths.dir.join("eval.json"), &offline)?;
    figures.offline_tau = offline["tau"].as_f64();
    figures.offline_base_tau = offline["base_tau"].as_f64();

    let budgets: Vec<String> = opts.tree_budgets.iter().map(usize::to_string).collect();
    let mut online = dflashd(opts, &["eval", "--online", "--json", "--threads", "1"]);
    online
        .arg("--target")
        .arg(&target)
        .arg("--drafter")
        .arg(&paths.export);
    online.arg("--prompts").arg(prompts);
    online.args(["--max-new-tokens", &opts.max_new_tokens.to_string()]);
    if !budgets.is_empty() {
        online.args(["--tree-budget", &budgets.join(",")]);
    }
    let decoded: Value = run_json(online, timeout)?;
    read_online(&decoded, figures);
    // The per-prompt outputs are kept beside the run; results.json holds the figures only.
    save_json(&paths.dir.join("online.json"), &decoded)
}

fn read_online(decoded: &Value, figures: &mut RunFigures) {
    let methods = &decoded["methods"];
    figures.online_chain_tau = methods["chain"]["tau"].as_f64();
    figures.online_chain_base_tau = methods["chain"]["base_tau"].as_f64();
    let mut lossless = methods.as_object().map(|m| !m.is_empty());
    for (name, method) in methods.as_object().into_iter().flatten() {
        if method["lossless"].as_bool() != Some(true) {
            lossless = Some(false);
        }
        let budget = name.strip_prefix("ddtree_").and_then(|b| b.parse().ok());
        if let (Some(budget), Some(tau)) = (budget, method["tau"].as_f64()) {
            figures.online_ddtree_tau.insert(budget, tau);
        }
    }
    figures.online_lossless = lossless;
}

fn save_json(path: &Path, value: &Value) -> Result<(), BenchError> {
    let mut file = fs::File::create(path).map_err(BenchError::io(path))?;
    writeln!(file, "{value}").map_err(BenchError::io(path))
}

fn dflashd_version(opts: &ObjectivesOptions) -> Result<String, BenchError> {
    let out = dflashd(opts, &["--version"]).output().map_err(|e| {
        process_error(
            &opts.dflashd.display().to_string(),
            format!("cannot run: {e}"),
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every contender on every seed, one after the other, under `out_dir/objectives/`.
pub fn run(
    opts: &ObjectivesOptions,
    out_dir: &Path,
    progress: &dyn Fn(&str),
) -> Result<ObjectivesResult, BenchError> {
    if opts.seeds.is_empty() {
        return Err(BenchError::case(
            out_dir,
            "--objectives-seeds: give at least one seed",
        ));
    }
    let dflashd_version = dflashd_version(opts)?;
    let root = out_dir.join("objectives").join("embedded");
    fs::create_dir_all(&root).map_err(BenchError::io(&root))?;
    let prompts = root.join("heldout_prompts.jsonl");
    write_prompts(&prompts)?;
    let mut runs = Vec::new();
    for &seed in &opts.seeds {
        let held_out = root.join(format!("held_out-seed{seed}.jsonl"));
        write_held_out(seed, &held_out)?;
        for contender in Contender::ALL {
            progress(&format!(
                "objectives: {} seed {seed} ({} epoch(s), at most {} steps)",
                contender.label(),
                opts.epochs,
                opts.max_steps
            ));
            let dir = root.join(format!("{}-seed{seed}", contender.name()));
            let paths = RunPaths {
                run: dir.join("run"),
                export: dir.join("export"),
                dir,
            };
            let recipe = RunRecipe {
                contender,
                seed,
                epochs: opts.epochs,
                data: None,
            };
            let figures = run_one(opts, &recipe, &paths, &held_out, &prompts);
            if let Some(e) = &figures.error {
                progress(&format!("objectives:   failed: {e}"));
            }
            runs.push(figures);
        }
    }
    let summaries = summarise(&runs);
    let verdict = verdict(&summaries);
    Ok(ObjectivesResult {
        options: opts.clone(),
        data: "embedded".into(),
        dflashd_version,
        runs,
        summaries,
        verdict,
    })
}
