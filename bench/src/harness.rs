//! Runs the cases side by side: prepares each case once, then the engine (this binary again,
//! `bench --child ...`) and the Python reference on it, each in its own process, alternating
//! them for `rounds` rounds so the machine's noise falls on both.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::attention::{backend_name, AttentionMeta};
use super::case::StepMeta;
use super::compare::{compare_step, loss_tolerance, merge_rounds, StepComparison};
use super::error::BenchError;
use super::matmul::MatmulPeak;
use super::memory;
use super::overhead::OverheadRun;
use super::presets::AttentionPreset;
use super::process::{engine_command, run_json, Python};
use super::queue::QueueRun;
use super::stats::{ratio, rel_diff};
use super::step::StepRun;
use super::target_pass::TargetMeta;
use dflash_engine::model::drafter::AttentionBackend;

/// How the reference runs: attention back-end and `torch.compile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceMode {
    pub attention: String,
    pub compile: bool,
}

pub struct Harness {
    pub out_dir: PathBuf,
    pub warmup: usize,
    pub steps: usize,
    /// Steps of the memory pass of each step case on CPU (0: no memory pass).
    pub memory_steps: usize,
    /// The engine's steps recompute their layers in the backward (`--activation-checkpointing`).
    pub activation_checkpointing: bool,
    pub rounds: usize,
    pub threads: i32,
    pub device: String,
    pub dtype: String,
    /// `Err(reason)` when the reference cannot run at all (reported in every comparison).
    pub python: Result<Python, String>,
    pub reference: ReferenceMode,
    pub timeout: Duration,
}

/// What one drafter-step child process measures.
#[derive(Clone, Copy, Debug)]
pub enum StepPass<'a> {
    /// Timed steps on `device` in `dtype`, with the allocator as a run has it.
    Timing { device: &'a str, dtype: &'a str },
    /// A step's live memory on CPU: one warmup step, no timed steps, then the harness's
    /// memory steps with the resident set following live allocations. Never timed.
    Memory,
    /// One step on CPU with its executed FLOPs counted op by op (engine only). Never timed.
    Flops,
}

/// Parses a child's JSON: an object with a string `error` is that child's failure.
fn child_json<T: DeserializeOwned>(cmd: Command, timeout: Duration) -> Result<T, BenchError> {
    let program = format!("{:?}", cmd.get_args().take(3).collect::<Vec<_>>());
    let value: Value = run_json(cmd, timeout)?;
    if let Some(err) = value.get("error").and_then(Value::as_str) {
        return Err(BenchError::Process {
            program,
            detail: err.to_string(),
        });
    }
    serde_json::from_value(value).map_err(|e| BenchError::Process {
        program,
        detail: format!("unexpected JSON: {e}"),
    })
}

fn failed_run(implementation: &str, error: String) -> StepRun {
    StepRun {
        implementation: implementation.into(),
        error: Some(error),
        ..StepRun::default()
    }
}

impl Harness {
    fn engine(&self, task: &str, dir: &Path) -> Result<Command, BenchError> {
        self.engine_threads(task, dir, self.threads)
    }

    fn engine_threads(&self, task: &str, dir: &Path, threads: i32) -> Result<Command, BenchError> {
        let mut cmd = engine_command()?;
        cmd.args(["--child", task, "--work-dir"])
            .arg(dir)
            .args(["--threads", &threads.to_string()]);
        Ok(cmd)
    }

    /// `warmup` untimed and `steps` timed iterations of a child on `device` in `dtype`.
    fn repetition_args(
        cmd: &mut Command,
        (warmup, steps): (usize, usize),
        device: &str,
        dtype: &str,
    ) {
        cmd.args([
            "--warmup",
            &warmup.to_string(),
            "--steps",
            &steps.to_string(),
            "--device",
            device,
            "--dtype",
            dtype,
        ]);
    }

    fn timed_args(&self, cmd: &mut Command, device: &str, dtype: &str) {
        Self::repetition_args(cmd, (self.warmup, self.steps), device, dtype);
    }

    /// Repetitions for cases whose single iteration takes seconds (attention, target pass).
    fn heavy(&self) -> (usize, usize) {
        (self.warmup.min(1), self.steps.min(3))
    }

    fn heavy_args(&self, cmd: &mut Command, device: &str, dtype: &str) {
        Self::repetition_args(cmd, self.heavy(), device, dtype);
    }

    fn reference_script(&self, script: &str) -> Result<Command, String> {
        let python = self.python.as_ref().map_err(Clone::clone)?;
        let mut cmd = python.script(script);
        cmd.args(["--threads", &self.threads.to_string()]);
        Ok(cmd)
    }

    pub fn matmul(&self, n: i64, device: &str, dtype: &str) -> Result<MatmulPeak, BenchError> {
        let mut cmd = self.engine("matmul", &self.out_dir)?;
        self.timed_args(&mut cmd, device, dtype);
        cmd.args(["--matmul-n", &n.to_string()]);
        child_json(cmd, self.timeout)
    }

    pub fn prepare_step(&self, config: &str) -> Result<(PathBuf, StepMeta), BenchError> {
        let dir = self.out_dir.join(format!("step-{config}"));
        let mut cmd = self.engine("prepare-step", &dir)?;
        cmd.args(["--config", config]);
        Ok((dir.clone(), child_json(cmd, self.timeout)?))
    }

    /// The arguments that make a step child do `pass`.
    fn step_pass_args(&self, cmd: &mut Command, pass: StepPass<'_>) {
        match pass {
            StepPass::Timing { device, dtype } => {
                self.timed_args(cmd, device, dtype);
                // The allocator left as a run has it: the memory pass is a process of its own.
                cmd.args(["--memory-steps", "0"]);
            }
            // One warmup step (one-time initialisation), no timed steps, the memory steps.
            StepPass::Memory => {
                Self::repetition_args(cmd, (1, 0), "cpu", &self.dtype);
                cmd.args(["--memory-steps", &self.memory_steps.to_string()]);
            }
            // No other step: the counted one is the process's first (FLOPs do not depend on
            // warmup).
            StepPass::Flops => {
                Self::repetition_args(cmd, (0, 0), "cpu", &self.dtype);
                cmd.args(["--memory-steps", "0", "--count-flops"]);
            }
        }
    }

    pub fn engine_step(&self, dir: &Path, pass: StepPass<'_>) -> StepRun {
        let run = || -> Result<StepRun, BenchError> {
            let mut cmd = self.engine("run-step", dir)?;
            self.step_pass_args(&mut cmd, pass);
            if self.activation_checkpointing {
                cmd.arg("--activation-checkpointing");
            }
            child_json(cmd, self.timeout)
        };
        run().unwrap_or_else(|e| failed_run("engine", e.to_string()))
    }

    pub fn reference_step(&self, dir: &Path, pass: StepPass<'_>, forward_only: bool) -> StepRun {
        let name = format!("reference-{}", self.reference.attention);
        let mut cmd = match self.reference_script("bench_step.py") {
            Ok(cmd) => cmd,
            Err(why) => return failed_run(&name, format!("reference not run: {why}")),
        };
        cmd.arg("--case")
            .arg(dir)
            .args(["--attention", &self.reference.attention]);
        self.step_pass_args(&mut cmd, pass);
        if self.reference.compile {
            cmd.arg("--compile");
        }
        if forward_only {
            cmd.arg("--forward-only");
        }
        // The script reports its own failures in the JSON (`error`), so parse, don't bail.
        run_json(cmd, self.timeout).unwrap_or_else(|e: BenchError| failed_run(&name, e.to_string()))
    }

    /// Whether the step cases end with a memory pass: on CPU, unless `--memory-steps 0`. On
    /// CUDA the device allocator's own peak (`cuda_max_allocated_mb`) says what a step holds.
    pub fn measures_live_memory(&self) -> bool {
        self.device == "cpu" && self.memory_steps > 0
    }

    /// One drafter-step configuration: prepare, then `rounds` x (engine, reference).
    pub fn step(
        &self,
        config: &str,
        peak: Option<&MatmulPeak>,
    ) -> Result<StepComparison, BenchError> {
        let (dir, meta) = self.prepare_step(config)?;
        let (mut engine, mut reference) = (Vec::new(), Vec::new());
        let timing = StepPass::Timing {
            device: &self.device,
            dtype: &self.dtype,
        };
        for _ in 0..self.rounds.max(1) {
            engine.push(self.engine_step(&dir, timing));
            reference.push(self.reference_step(&dir, timing, false));
        }
        let mut engine = merge_rounds(engine).unwrap_or_default();
        let mut reference = merge_rounds(reference).unwrap_or_default();
        if self.measures_live_memory() {
            let engine_memory = self.engine_step(&dir, StepPass::Memory);
            let reference_memory = self.reference_step(&dir, StepPass::Memory, false);
            for (run, pass) in [
                (&mut engine, engine_memory),
                (&mut reference, reference_memory),
            ] {
                run.live_step_mb = pass.live_step_mb;
                if let (None, Some(error)) = (&run.error, pass.error) {
                    run.error = Some(format!("memory pass: {error}"));
                }
            }
        }
        Ok(compare_step(meta, engine, reference, peak))
    }

    /// The attention case at `anchors` anchors: engine block-sparse and dense mask, reference
    /// eager (dense SDPA) and flex (forward only on CPU). Dense runs are skipped, with the
    /// reason, when the machine cannot hold them.
    pub fn attention(&self, anchors: usize) -> Result<AttentionResult, BenchError> {
        let preset = AttentionPreset::at(anchors);
        let dir = self.out_dir.join(format!("attention-{anchors}"));
        let mut cmd = self.engine("prepare-attention", &dir)?;
        cmd.args(["--anchors", &anchors.to_string()]);
        let meta: AttentionMeta = child_json(cmd, self.timeout)?;
        let mut result = AttentionResult {
            meta,
            runs: Vec::new(),
            skipped: Vec::new(),
            dense_over_sparse_peak: None,
            dense_over_sparse_time: None,
        };
        let need = preset.dense_bytes_estimate();
        let fits = || memory::available_bytes().map(|avail| need < avail / 10 * 6);
        for backend in [AttentionBackend::BlockSparse, AttentionBackend::DenseMask] {
            let name = format!("engine-{}", backend_name(backend));
            if backend == AttentionBackend::DenseMask && fits() == Some(false) {
                result.skip(&name, need);
                continue;
            }
            let mut cmd = self.engine("run-attention", &dir)?;
            self.heavy_args(&mut cmd, "cpu", "f32");
            cmd.args(["--backend", backend_name(backend)]);
            result.runs.push(
                child_json(cmd, self.timeout).unwrap_or_else(|e| failed_run(&name, e.to_string())),
            );
        }
        for (attention, forward_only) in [("eager", false), ("flex", true)] {
            let name = format!(
                "reference-{attention}{}",
                if forward_only { "-forward" } else { "" }
            );
            // Uncompiled `create_block_mask` (CPU) evaluates the mask over the whole grid with
            // int64 intermediates: more than the estimate's 8 bytes per grid element
            // (docs/BENCHMARKS.md#dense-mask-memory-per-grid-element).
            let need = if attention == "flex" {
                need * 7 / 4
            } else {
                need
            };
            if memory::available_bytes().is_some_and(|avail| need >= avail / 10 * 6) {
                result.skip(&name, need);
                continue;
            }
            let mut cmd = match self.reference_script("bench_attention.py") {
                Ok(cmd) => cmd,
                Err(why) => {
                    result
                        .runs
                        .push(failed_run(&name, format!("reference not run: {why}")));
                    continue;
                }
            };
            let (warmup, steps) = self.heavy();
            cmd.arg("--case").arg(&dir).args([
                "--attention",
                attention,
                "--warmup",
                &warmup.to_string(),
                "--steps",
                &steps.to_string(),
            ]);
            if forward_only {
                cmd.arg("--forward-only");
            }
            result.runs.push(
                run_json(cmd, self.timeout)
                    .unwrap_or_else(|e: BenchError| failed_run(&name, e.to_string())),
            );
        }
        let get = |name: &str| {
            result
                .runs
                .iter()
                .find(|r| r.implementation == name && r.error.is_none())
        };
        if let (Some(sparse), Some(dense)) = (get("engine-block_sparse"), get("engine-dense_mask"))
        {
            result.dense_over_sparse_peak = ratio(dense.step_growth_mb(), sparse.step_growth_mb());
            result.dense_over_sparse_time = ratio(dense.median_step_ms, sparse.median_step_ms);
        }
        Ok(result)
    }

    /// The target feature pass: engine vs `transformers` on the same checkpoint and ids.
    pub fn target(&self, quick: bool) -> Result<TargetResult, BenchError> {
        let dir = self.out_dir.join("target");
        let mut cmd = self.engine("prepare-target", &dir)?;
        if quick {
            cmd.arg("--quick");
        }
        let meta: TargetMeta = child_json(cmd, self.timeout)?;
        let (mut engine, mut reference) = (Vec::new(), Vec::new());
        for _ in 0..self.rounds.max(1) {
            let mut cmd = self.engine("run-target", &dir)?;
            self.heavy_args(&mut cmd, "cpu", "f32");
            engine.push(
                child_json(cmd, self.timeout)
                    .unwrap_or_else(|e| failed_run("engine", e.to_string())),
            );
            let run = match self.reference_script("bench_target.py") {
                Ok(mut cmd) => {
                    let (warmup, steps) = self.heavy();
                    cmd.arg("--case").arg(&dir).args([
                        "--warmup",
                        &warmup.to_string(),
                        "--steps",
                        &steps.to_string(),
                    ]);
                    run_json(cmd, self.timeout)
                        .unwrap_or_else(|e: BenchError| failed_run("transformers", e.to_string()))
                }
                Err(why) => failed_run("transformers", format!("reference not run: {why}")),
            };
            reference.push(run);
        }
        let engine = merge_rounds(engine).unwrap_or_default();
        let transformers = merge_rounds(reference).unwrap_or_default();
        Ok(TargetResult {
            ratio: ratio(engine.median_step_ms, transformers.median_step_ms),
            peak_rss_ratio: ratio(engine.peak_rss_mb, transformers.peak_rss_mb),
            meta,
            engine,
            transformers,
        })
    }

    /// Daemon overhead: the embedded default's step (1 thread) with 0 or `clients` clients attached and
    /// the telemetry sampler off or on; `rounds` rounds of all four, interleaved.
    pub fn overhead(&self, clients: usize) -> Result<OverheadResult, BenchError> {
        let variants = [(0, false), (clients, false), (0, true), (clients, true)];
        let mut runs: Vec<Vec<OverheadRun>> = vec![Vec::new(); variants.len()];
        for round in 0..self.rounds.max(1) {
            for (slot, &(n, sampler)) in variants.iter().enumerate() {
                let dir = self.out_dir.join(format!("overhead-{round}-{n}-{sampler}"));
                let _ = std::fs::remove_dir_all(&dir);
                // One intra-op thread, as `dflashd start` trains the embedded default (its
                // tensors gain nothing from more, and the last core serves the clients).
                let mut cmd = self.engine_threads("overhead", &dir, 1)?;
                cmd.args([
                    "--clients",
                    &n.to_string(),
                    "--warmup",
                    &self.warmup.to_string(),
                    "--steps",
                    &self.steps.to_string(),
                ]);
                if sampler {
                    cmd.arg("--sampler");
                }
                let run = child_json(cmd, self.timeout).unwrap_or_else(|e| OverheadRun {
                    clients: n,
                    sampler,
                    error: Some(e.to_string()),
                    ..OverheadRun::default()
                });
                runs[slot].push(run);
            }
        }
        let merged: Vec<OverheadRun> = runs
            .into_iter()
            .filter_map(|rounds| {
                let mut it = rounds.into_iter();
                let mut m = it.next()?;
                for r in it {
                    m.step_ms.extend(r.step_ms);
                    m.publish_us.extend(r.publish_us);
                    m.thread_cpu_ms.extend(r.thread_cpu_ms);
                    m.error = m.error.or(r.error);
                }
                m.median_step_ms = super::stats::median(&m.step_ms);
                m.median_publish_us = super::stats::median(&m.publish_us);
                m.median_thread_cpu_ms = super::stats::median(&m.thread_cpu_ms);
                Some(m)
            })
            .collect();
        let over_base = |of: fn(&OverheadRun) -> Option<f64>, i: usize| {
            let base = merged.first().and_then(of);
            ratio(merged.get(i).and_then(of), base).map(|r| r - 1.0)
        };
        let wall = |r: &OverheadRun| r.median_step_ms;
        let cpu = |r: &OverheadRun| r.median_thread_cpu_ms;
        Ok(OverheadResult {
            clients_overhead: over_base(wall, 1),
            sampler_overhead: over_base(wall, 2),
            both_overhead: over_base(wall, 3),
            clients_cpu_overhead: over_base(cpu, 1),
            sampler_cpu_overhead: over_base(cpu, 2),
            both_cpu_overhead: over_base(cpu, 3),
            runs: merged,
        })
    }

    /// Hidden-state queue throughput (one process, producer and consumer threads).
    pub fn queue(&self, items: usize) -> Result<QueueRun, BenchError> {
        let mut cmd = self.engine("queue", &self.out_dir)?;
        cmd.args(["--steps", &items.to_string()]);
        child_json(cmd, self.timeout)
    }

    /// GPU correctness: the tiny case on CUDA vs the CPU (fp32, same weights and batch), and
    /// CUDA bf16 engine vs the reference in bf16.
    /// CUDA f32 against CPU f32 and engine bf16 against the reference bf16 on `config`'s
    /// case. On `cpu` it is the GPU check's self-test: CPU against CPU, plumbing only.
    pub fn parity(&self, device: &str, config: &str) -> Result<ParityResult, BenchError> {
        let (dir, _) = self.prepare_step(config)?;
        let pass = |device, dtype| StepPass::Timing { device, dtype };
        let cpu = self.engine_step(&dir, pass("cpu", "f32"));
        let cuda = self.engine_step(&dir, pass(device, "f32"));
        let engine_bf16 = self.engine_step(&dir, pass(device, "bf16"));
        let reference_bf16 = self.reference_step(&dir, pass(device, "bf16"), false);
        let cuda_vs_cpu =
            super::compare::check_losses(&cuda, &cpu, super::compare::F32_LOSS_TOLERANCE);
        let bf16_vs_reference =
            super::compare::check_losses(&engine_bf16, &reference_bf16, loss_tolerance("bf16"));
        let norm_rel_diff = match (
            cuda.grad_norms.first().copied().flatten(),
            cpu.grad_norms.first().copied().flatten(),
        ) {
            (Some(a), Some(b)) => rel_diff(a, b),
            _ => None,
        };
        Ok(ParityResult {
            cuda_vs_cpu,
            first_grad_norm_rel_diff: norm_rel_diff,
            bf16_vs_reference,
            cpu,
            cuda,
            engine_bf16,
            reference_bf16,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionResult {
    pub meta: AttentionMeta,
    pub runs: Vec<StepRun>,
    /// `(implementation, reason)` of runs not attempted.
    pub skipped: Vec<(String, String)>,
    /// Engine dense-mask / block-sparse: growth of resident memory during the steps, and time.
    pub dense_over_sparse_peak: Option<f64>,
    pub dense_over_sparse_time: Option<f64>,
}

impl AttentionResult {
    fn skip(&mut self, name: &str, need: u64) {
        let avail = memory::available_bytes().unwrap_or(0);
        self.skipped.push((
            name.into(),
            format!(
                "not run: the dense [Q, S+Q] grid needs ~{:.1} GB (estimate), {:.1} GB available",
                need as f64 / 1e9,
                avail as f64 / 1e9
            ),
        ));
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverheadResult {
    /// (0 clients, no sampler), (N clients), (sampler), (N clients + sampler).
    pub runs: Vec<OverheadRun>,
    /// Median step time relative to the first variant, minus 1.
    pub clients_overhead: Option<f64>,
    pub sampler_overhead: Option<f64>,
    pub both_overhead: Option<f64>,
    /// The same for the training thread's CPU time per step.
    pub clients_cpu_overhead: Option<f64>,
    pub sampler_cpu_overhead: Option<f64>,
    pub both_cpu_overhead: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetResult {
    pub meta: TargetMeta,
    pub engine: StepRun,
    pub transformers: StepRun,
    pub ratio: Option<f64>,
    pub peak_rss_ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParityResult {
    pub cuda_vs_cpu: super::compare::LossCheck,
    pub first_grad_norm_rel_diff: Option<f64>,
    pub bf16_vs_reference: super::compare::LossCheck,
    pub cpu: StepRun,
    pub cuda: StepRun,
    pub engine_bf16: StepRun,
    pub reference_bf16: StepRun,
}
