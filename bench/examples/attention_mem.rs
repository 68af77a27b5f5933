//! Time and peak memory of DFlash attention, block-sparse vs dense-mask, forward + backward.
//!
//! Each back-end is measured in a fresh process (peak RSS is a process-wide high-water mark,
//! `VmHWM` in /proc/self/status). Without `--backend`, this program runs itself once per
//! back-end and prints a comparison; with `--backend` it measures in-process and prints one
//! JSON line.
//!
//! ```text
//! cargo run --release -p dflash-bench --example attention_mem -- \
//!     --anchors 1024 --block 32 --context 2048 --heads 4 --kv-heads 4 --head-dim 32 --reps 3
//! ```
//! Options: `--batch N`, `--rule full|sliding:W`, `--warmup N`, `--backend block-sparse|dense`,
//! `--chunk-elements N` (block-sparse chunk budget), `--force` (run the dense back-end even when its mask looks too big for free memory).
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dflash_engine::model::attention::{
    block_sparse_attention, dense_mask_attention, AttentionBackend, BlockAttentionInputs,
    LayerRule, DEFAULT_CHUNK_SCORE_ELEMENTS,
};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

#[derive(Clone, Debug)]
struct Args {
    anchors: i64,
    block: i64,
    context: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    batch: i64,
    reps: usize,
    warmup: usize,
    rule: LayerRule,
    backend: Option<AttentionBackend>,
    chunk_elements: i64,
    force: bool,
}

fn parse_args() -> Result<(Args, Vec<String>)> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut a = Args {
        anchors: 1024,
        block: 32,
        context: 2048,
        heads: 4,
        kv_heads: 4,
        head_dim: 32,
        batch: 1,
        reps: 3,
        warmup: 1,
        rule: LayerRule::Full,
        backend: None,
        chunk_elements: DEFAULT_CHUNK_SCORE_ELEMENTS,
        force: false,
    };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        if flag == "--force" {
            a.force = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let int = || {
            value
                .parse::<i64>()
                .with_context(|| format!("{flag}: expected an integer, found {value:?}"))
        };
        match flag.as_str() {
            "--anchors" => a.anchors = int()?,
            "--block" => a.block = int()?,
            "--context" => a.context = int()?,
            "--heads" => a.heads = int()?,
            "--kv-heads" => a.kv_heads = int()?,
            "--head-dim" => a.head_dim = int()?,
            "--batch" => a.batch = int()?,
            "--reps" => a.reps = int()? as usize,
            "--warmup" => a.warmup = int()? as usize,
            "--chunk-elements" => a.chunk_elements = int()?,
            "--rule" => {
                a.rule = match value.split_once(':') {
                    None if value == "full" => LayerRule::Full,
                    Some(("sliding", w)) => LayerRule::Sliding {
                        window: w.parse().context("--rule sliding:W")?,
                    },
                    _ => bail!("--rule: expected full or sliding:W, found {value:?}"),
                }
            }
            "--backend" => {
                a.backend = Some(match value.as_str() {
                    "block-sparse" => AttentionBackend::BlockSparse,
                    "dense" => AttentionBackend::DenseMask,
                    _ => bail!("--backend: expected block-sparse or dense, found {value:?}"),
                })
            }
            _ => bail!("unknown option {flag}"),
        }
    }
    if a.context < 2 || a.anchors < 1 || a.anchors > a.context - 1 || a.reps == 0 {
        bail!("need context >= 2, 1 <= anchors <= context - 1, reps >= 1");
    }
    Ok((a, raw))
}

/// A `kB` field of /proc/self/status (VmRSS, VmHWM), in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn mem_available_mib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

/// CPU seconds of this process, all threads: on a shared machine wall time mostly measures
/// the neighbours, CPU time measures the work.
fn process_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn measure(a: &Args, backend: AttentionBackend) -> Result<Value> {
    let queries = a.anchors * a.block;
    let keys = a.context + queries;
    // The dense path holds its bool mask and the float copy SDPA makes of it.
    let dense_mask_mib = (a.batch * queries * keys) as f64 * 5.0 / (1 << 20) as f64;
    if backend == AttentionBackend::DenseMask && !a.force {
        if let Some(free) = mem_available_mib() {
            if dense_mask_mib > 0.7 * free {
                bail!(
                    "dense: its masks alone need ~{dense_mask_mib:.0} MiB, the machine has {free:.0} MiB available \
                     (shared machine: not risking the OOM killer; --force overrides)"
                );
            }
        }
    }
    let _rng = dflash_engine::device::global_rng::seeded(0);
    let opts = (Kind::Float, Device::Cpu);
    let leaf = |shape: &[i64]| Tensor::randn(shape, opts).set_requires_grad(true);
    let q = leaf(&[a.batch, queries, a.heads, a.head_dim]);
    let ck = leaf(&[a.batch, a.context, a.kv_heads, a.head_dim]);
    let cv = leaf(&[a.batch, a.context, a.kv_heads, a.head_dim]);
    let bk = leaf(&[a.batch, queries, a.kv_heads, a.head_dim]);
    let bv = leaf(&[a.batch, queries, a.kv_heads, a.head_dim]);
    // §2.2: anchors uniformly without replacement from 0..=S-2, sorted; all valid.
    let anchors = Tensor::stack(
        &(0..a.batch)
            .map(|_| {
                Tensor::randperm(a.context - 1, (Kind::Int64, Device::Cpu))
                    .narrow(0, 0, a.anchors)
                    .sort(0, false)
                    .0
            })
            .collect::<Vec<_>>(),
        0,
    );
    let keep = Tensor::ones([a.batch, a.anchors], (Kind::Bool, Device::Cpu));
    let probe = Tensor::randn([a.batch, queries, a.heads, a.head_dim], opts);
    let inputs = BlockAttentionInputs {
        query: &q,
        context_key: &ck,
        context_value: &cv,
        block_key: &bk,
        block_value: &bv,
        anchors: &anchors,
        keep: &keep,
        block_size: a.block,
        rule: a.rule,
        scale: (a.head_dim as f64).powf(-0.5),
    };
    let baseline_mib = status_mib("VmRSS:").unwrap_or(f64::NAN);
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    for rep in 0..a.warmup + a.reps {
        let start = Instant::now();
        let cpu_start = process_cpu_s();
        let out = match backend {
            AttentionBackend::BlockSparse => block_sparse_attention(&inputs, a.chunk_elements),
            AttentionBackend::DenseMask => dense_mask_attention(&inputs),
        };
        let loss = (out * &probe).sum(Kind::Float);
        let grads = Tensor::run_backward(&[loss], &[&q, &ck, &cv, &bk, &bv], false, false);
        let _checksum = grads[0].sum(Kind::Float).double_value(&[]); // forces completion
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let cpu_ms = (process_cpu_s() - cpu_start) * 1e3;
        if rep >= a.warmup {
            times.push(ms);
            cpu_times.push(cpu_ms);
        }
    }
    let peak_mib = status_mib("VmHWM:").unwrap_or(f64::NAN);
    Ok(json!({
        "backend": match backend { AttentionBackend::BlockSparse => "block-sparse", AttentionBackend::DenseMask => "dense" },
        "anchors": a.anchors, "block": a.block, "context": a.context, "batch": a.batch,
        "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
        "rule": format!("{:?}", a.rule),
        "threads": tch::get_num_threads(),
        "reps": a.reps,
        "times_ms": times.clone(),
        "median_ms": median(times),
        "cpu_times_ms": cpu_times.clone(),
        "median_cpu_ms": median(cpu_times),
        "chunk_elements": a.chunk_elements,
        "baseline_rss_mib": baseline_mib,
        "peak_rss_mib": peak_mib,
        "attention_peak_mib": peak_mib - baseline_mib,
    }))
}

fn compare(raw: &[String]) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut results = Vec::new();
    for backend in ["block-sparse", "dense"] {
        let out = Command::new(&exe)
            .args(raw)
            .args(["--backend", backend])
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
        {
            Some(v) if out.status.success() => results.push(v),
            _ => {
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                let why = if why.is_empty() {
                    format!("exited with {}", out.status)
                } else {
                    why
                };
                eprintln!("{backend}: not measured: {why}");
                results.push(json!({ "backend": backend, "skipped": why }));
            }
        }
    }
    for r in &results {
        if r.get("skipped").is_none() {
            println!(
                "{:>12}: median {:>9.1} ms wall, {:>9.1} ms CPU fwd+bwd; peak RSS {:>8.1} MiB ({:>8.1} MiB above the inputs)",
                r["backend"].as_str().unwrap_or("?"),
                r["median_ms"].as_f64().unwrap_or(f64::NAN),
                r["median_cpu_ms"].as_f64().unwrap_or(f64::NAN),
                r["peak_rss_mib"].as_f64().unwrap_or(f64::NAN),
                r["attention_peak_mib"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    let ratio = |key: &str| {
        let get = |r: &Value| r.get(key).and_then(Value::as_f64);
        Some(get(&results[1])? / get(&results[0])?)
    };
    let summary = json!({
        "block_sparse": results[0],
        "dense": results[1],
        "dense_over_sparse_peak_rss": ratio("peak_rss_mib"),
        "dense_over_sparse_attention_peak": ratio("attention_peak_mib"),
        "dense_over_sparse_time": ratio("median_ms"),
        "dense_over_sparse_cpu_time": ratio("median_cpu_ms"),
    });
    println!("{summary}");
    Ok(())
}

fn main() -> Result<()> {
    let (args, raw) = parse_args()?;
    match args.backend {
        Some(backend) => println!("{}", measure(&args, backend)?),
        None => compare(&raw)?,
    }
    Ok(())
}
