//! The GPU check's multi-device step (`scripts/gpu-check.sh`, step 5): the all-reduce the
//! drafter group runs (NCCL on CUDA, the engine's CPU group on the CPU), timed at the drafter's
//! gradient size, with NCCL's bus-bandwidth convention; and a 2-rank training step of the
//! embedded tiny default against the 1-rank step over the same global batch (the losses must
//! agree within the dtype's tolerance).
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::compare::loss_tolerance;
use super::error::BenchError;
use super::stats::median;
use super::timing::sync;
use dflash_engine::collective::allreduce::{AllReduce, CpuGroup};
use dflash_engine::collective::nccl::nccl_group;
use dflash_engine::embedded;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::trainer::Trainer;

/// NCCL's bus bandwidth of an all-reduce (`nccl-tests` PERFORMANCE.md): the algorithm
/// bandwidth `bytes / seconds` times `2 (n - 1) / n`, comparable across world sizes.
pub fn bus_bandwidth(bytes: f64, world: usize, seconds: f64) -> f64 {
    let n = world.max(1) as f64;
    bytes / seconds * 2.0 * (n - 1.0) / n
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllReduceResult {
    pub devices: Vec<String>,
    pub elements: i64,
    pub bytes: f64,
    pub times_ms: Vec<f64>,
    pub median_ms: Option<f64>,
    pub algo_gb_per_s: Option<f64>,
    pub bus_gb_per_s: Option<f64>,
}

fn endpoints(devices: &[Device]) -> Result<Vec<Box<dyn AllReduce>>, String> {
    if devices.iter().all(|d| *d == Device::Cpu) {
        let (_group, ranks) = CpuGroup::new(devices.len());
        return Ok(ranks
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn AllReduce>)
            .collect());
    }
    let indices: Vec<usize> = devices
        .iter()
        .map(|d| match d {
            Device::Cuda(i) => Ok(*i),
            other => Err(format!("all-reduce: {other:?} is neither cpu nor cuda")),
        })
        .collect::<Result<_, _>>()?;
    let (_group, ranks) = nccl_group(&indices)?;
    Ok(ranks
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn AllReduce>)
        .collect())
}

/// Times `iters` all-reduces (after `warmup`) of an fp32 buffer of `elements` on every device.
pub fn measure_all_reduce(
    devices: &[Device],
    elements: i64,
    warmup: usize,
    iters: usize,
) -> Result<AllReduceResult, BenchError> {
    let fail = |e: String| BenchError::case(std::path::Path::new("."), e);
    let ranks = endpoints(devices).map_err(fail)?;
    let per_rank: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .zip(devices)
            .map(|(mut rank, &device)| {
                s.spawn(move || {
                    let mut buffer = Tensor::ones([elements], (Kind::Float, device));
                    let mut times = Vec::new();
                    for i in 0..warmup + iters {
                        sync(device);
                        let t = Instant::now();
                        rank.sum_tensor(&mut buffer).map_err(|e| e.to_string())?;
                        sync(device);
                        if i >= warmup {
                            times.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    Ok(times)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    // The slowest rank's time is the collective's.
    let mut times = vec![0.0f64; iters];
    for r in per_rank {
        for (t, x) in times.iter_mut().zip(r.map_err(fail)?) {
            *t = t.max(x);
        }
    }
    let bytes = elements as f64 * 4.0;
    let med = median(&times);
    Ok(AllReduceResult {
        devices: devices
            .iter()
            .map(|d| dflash_engine::device::name(*d))
            .collect(),
        elements,
        bytes,
        median_ms: med,
        algo_gb_per_s: med.map(|m| bytes / (m / 1e3) / 1e9),
        bus_gb_per_s: med.map(|m| bus_bandwidth(bytes, devices.len(), m / 1e3) / 1e9),
        times_ms: times,
    })
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankParity {
    pub devices: Vec<String>,
    pub one_rank_losses: Vec<f64>,
    pub two_rank_losses: Vec<f64>,
    pub max_rel_diff: f64,
    pub tolerance: f64,
    pub ok: bool,
}

fn losses(
    drafters: Vec<Device>,
    target_device: Device,
    steps: usize,
) -> Result<Vec<f64>, BenchError> {
    let target = embedded::tiny_target(None, target_device)?;
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    // The same global batch of 8 sequences: micro-batches of 4, 2 per rank on one rank, 1 on
    // each of two.
    cfg.training.batch_size = 4;
    cfg.training.grad_accum = 2 / drafters.len();
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length)?;
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut topology = TopologySpec::single(target_device);
    topology.drafter_devices = drafters;
    let mut trainer = Trainer::with_topology(target, drafter_cfg, samples, cfg, topology)?;
    (0..steps).map(|_| Ok(trainer.train_step()?.loss)).collect()
}

/// Relative difference of two loss curves, step by step, the largest.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-12))
        .fold(
            if a.len() == b.len() {
                0.0
            } else {
                f64::INFINITY
            },
            f64::max,
        )
}

/// The 2-rank step on `devices` against the 1-rank step on `devices[0]`.
pub fn two_rank_parity(devices: [Device; 2], steps: usize) -> Result<RankParity, BenchError> {
    let one = losses(vec![devices[0]], devices[0], steps)?;
    let two = losses(devices.to_vec(), devices[0], steps)?;
    let dtype = super::step::kind_name(dflash_engine::device::compute_kind(devices[1]));
    let tolerance = loss_tolerance(dtype);
    let diff = max_rel_diff(&two, &one);
    Ok(RankParity {
        devices: devices
            .iter()
            .map(|d| dflash_engine::device::name(*d))
            .collect(),
        ok: diff <= tolerance,
        one_rank_losses: one,
        two_rank_losses: two,
        max_rel_diff: diff,
        tolerance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_nccl_tests_convention() {
        // 8 GB in 1 s over 2 ranks: algbw 8 GB/s, busbw 8 · 2 · 1 / 2 = 8 GB/s; over 8 ranks
        // 8 · 2 · 7 / 8 = 14 GB/s.
        assert_eq!(bus_bandwidth(8e9, 2, 1.0), 8e9);
        assert_eq!(bus_bandwidth(8e9, 8, 1.0), 14e9);
    }

    #[test]
    fn curves_of_different_lengths_never_agree() {
        assert_eq!(max_rel_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(max_rel_diff(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!((max_rel_diff(&[1.1], &[1.0]) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn the_cpu_group_sums_and_two_cpu_ranks_train_as_one() {
        // Each rank seeds and draws its replica under the engine's generator lock itself:
        // holding it here would keep the rank threads from drawing.
        let r = measure_all_reduce(&[Device::Cpu, Device::Cpu], 1 << 12, 1, 2).unwrap();
        assert_eq!(r.times_ms.len(), 2);
        assert!(r.bus_gb_per_s.unwrap() > 0.0);
        let p = two_rank_parity([Device::Cpu, Device::Cpu], 2).unwrap();
        assert!(p.ok, "{p:?}");
        assert_eq!(p.two_rank_losses.len(), 2);
    }
}
