//! Trainers on the embedded tiny target and data, on a chosen CPU topology.

use std::time::Duration;

use dflash_engine::data::Sample;
use dflash_engine::embedded;
use dflash_engine::train::config::TrainConfig;
use dflash_engine::train::topology::queue::QueueConfig;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::trainer::{Trainer, TrainerSpec};
use tch::{Device, Tensor};

/// `targets` target workers and `drafters` drafter ranks, all on the CPU.
pub fn cpu_topology(targets: usize, drafters: usize) -> TopologySpec {
    TopologySpec {
        target_devices: vec![Device::Cpu; targets],
        drafter_devices: vec![Device::Cpu; drafters],
        queue: QueueConfig {
            capacity: 8,
            high_watermark: 6,
            low_watermark: 2,
            byte_cap: 1 << 30,
        },
    }
}

/// The embedded default's config, no evaluation, `batch_size` sequences per micro-batch.
pub fn config(batch_size: usize, grad_accum: usize) -> TrainConfig {
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = batch_size;
    cfg.training.grad_accum = grad_accum;
    cfg
}

pub fn tiny_samples() -> Vec<Sample> {
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let cfg = embedded::tiny_train_config();
    embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length)
        .unwrap()
        .0
}

/// The spec of [`trainer_with`]'s trainer, for a test that sets more of it.
pub fn spec_with(cfg: TrainConfig, samples: Vec<Sample>, topology: TopologySpec) -> TrainerSpec {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    TrainerSpec::new(target, drafter_cfg, samples, cfg, topology)
}

pub fn trainer_with(cfg: TrainConfig, samples: Vec<Sample>, topology: TopologySpec) -> Trainer {
    Trainer::build(spec_with(cfg, samples, topology)).unwrap()
}

pub fn trainer(cfg: TrainConfig, topology: TopologySpec) -> Trainer {
    trainer_with(cfg, tiny_samples(), topology)
}

/// Largest absolute difference between two weight lists (same names, same order).
pub fn max_abs_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

pub fn copies(weights: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    weights.into_iter().map(|(n, t)| (n, t.copy())).collect()
}

/// Runs `body` on a thread and fails the test if it takes longer than `limit` (a topology
/// that deadlocks must fail, not hang CI).
pub fn within<T: Send + 'static>(limit: Duration, body: impl FnOnce() -> T + Send + 'static) -> T {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(body());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the body ended without a value or a panic"),
        },
        Err(RecvTimeoutError::Timeout) => panic!("did not finish within {limit:?} (deadlock?)"),
    }
}
