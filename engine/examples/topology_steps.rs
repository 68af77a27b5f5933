//! Step time of the embedded tiny default on a CPU topology: `T` target workers and `D` drafter
//! ranks (`1 1` runs inline on the calling thread), one intra-op thread per worker.
//!
//! ```text
//! cargo run --release -p dflash-engine --example topology_steps -- 2 2 30
//! ```
//! Arguments: target workers, drafter ranks, steps (default `1 1 30`). The global batch is 8
//! sequences per step whatever the topology: micro-batches of 4, `2 / D` of them per rank.
//! Prints the median step time and its breakdown over all steps but the first; with
//! `TOPOLOGY_STEPS_DEBUG=1` also each step's tokens and time.
use std::time::Instant;

use anyhow::{bail, Result};
use dflash_engine::embedded;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::trainer::Trainer;
use tch::Device;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let (targets, drafters, steps) = match args[..] {
        [] => (1, 1, 30),
        [t, d] => (t, d, 30),
        [t, d, s] => (t, d, s),
        _ => bail!("usage: topology_steps [TARGETS DRAFTERS [STEPS]]"),
    };
    if drafters == 0 || 2 % drafters != 0 || targets == 0 || steps < 2 {
        bail!("need >= 1 target worker, 1 or 2 drafter ranks and >= 2 steps");
    }
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu)?;
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = 4;
    cfg.training.grad_accum = 2 / drafters;
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length)?;
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut topology = TopologySpec::single(Device::Cpu);
    topology.target_devices = vec![Device::Cpu; targets];
    topology.drafter_devices = vec![Device::Cpu; drafters];
    let mut trainer = Trainer::with_topology(target, drafter_cfg, samples, cfg, topology)?;
    let start = Instant::now();
    let mut rows = Vec::new();
    for _ in 0..steps {
        rows.push(trainer.train_step()?);
    }
    let wall = start.elapsed().as_secs_f64();
    if std::env::var_os("TOPOLOGY_STEPS_DEBUG").is_some() {
        for m in &rows {
            let tokens = m.tokens_per_s * m.times.total_ms / 1e3;
            eprintln!(
                "step {} epoch {} tokens {tokens:.0} total {:.1} ms",
                m.step, m.epoch, m.times.total_ms
            );
        }
    }
    let rest = &rows[1..];
    let pick =
        |f: fn(&dflash_shared::metrics::StepMetrics) -> f64| median(rest.iter().map(f).collect());
    println!(
        "{targets}+{drafters}: {steps} steps in {wall:.2} s; median step {:.1} ms (data {:.1}, target {:.1}, queue wait {:.1}, drafter f/b {:.1}, all-reduce {:.1}, optimizer {:.1}); {:.0} tok/s",
        pick(|m| m.times.total_ms),
        pick(|m| m.times.data_wait_ms),
        pick(|m| m.times.target_forward_ms),
        pick(|m| m.times.queue_wait_ms),
        pick(|m| m.times.drafter_forward_backward_ms),
        pick(|m| m.times.all_reduce_ms),
        pick(|m| m.times.optimizer_ms),
        pick(|m| m.tokens_per_s),
    );
    Ok(())
}
