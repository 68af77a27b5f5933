//! Throughput that compares across configs: draft positions/s and MFU on the steps of a real
//! (tiny, CPU) run, inline and on a 2 + 2 topology.

use std::time::Duration;

use crate::support::topology::{config, cpu_topology, spec_with, tiny_samples, trainer, within};
use dflash_engine::train::peak::measure_matmul;
use dflash_engine::train::throughput::DevicePeaks;
use dflash_engine::train::{Trainer, TrainerSpec};
use dflash_shared::metrics::DeviceRole;
use tch::{Device, Kind};

#[test]
fn steps_report_draft_positions_and_mfu_against_the_measured_cpu_peak() {
    within(Duration::from_secs(120), || {
        let mut t = trainer(config(4, 1), cpu_topology(1, 1));
        let block = t.drafter_config().block_size as f64;
        let most = (4 * t.config().training.num_anchors) as f64 * block;

        // No peak set: tokens and positions, but no MFU (never a guessed one).
        let m = t.train_step().unwrap();
        assert!(m.mfu.is_none() && m.workers.iter().all(|w| w.mfu.is_none()));
        let positions = m.draft_positions_per_s * m.times.total_ms / 1e3;
        assert!(positions > 0.0 && positions <= most + 1e-6, "{positions}");
        let blocks = positions / block;
        assert!((blocks - blocks.round()).abs() < 1e-6, "{blocks} blocks");

        // The same run with the CPU's measured peak: an MFU.
        let peak = measure_matmul(Device::Cpu, Kind::Float, 512, 3).unwrap();
        let mut peaks = DevicePeaks::new();
        peaks.insert("cpu", peak.flops_per_s);
        let mut t = Trainer::build(TrainerSpec {
            device_peaks: peaks,
            ..spec_with(config(4, 1), tiny_samples(), cpu_topology(1, 1))
        })
        .unwrap();
        let m = t.train_step().unwrap();
        let mfu = m.mfu.expect("every device has a peak");
        assert!(mfu > 0.0 && mfu.is_finite(), "{mfu}");
        // One device runs both sides inline: its MFU is the step's.
        assert_eq!(m.workers.len(), 1);
        assert_eq!(m.workers[0].mfu, Some(mfu));
    });
}

#[test]
fn a_topology_reports_mfu_per_worker_and_none_for_the_step_without_every_peak() {
    within(Duration::from_secs(120), || {
        let mut t = trainer(config(2, 1), cpu_topology(2, 2));
        let m = t.train_step().unwrap();
        assert!(m.draft_positions_per_s > 0.0);
        assert!(m.mfu.is_none());
        drop(t);
        let mut peaks = DevicePeaks::new();
        peaks.insert("cpu", 1e11);
        let mut t = Trainer::build(TrainerSpec {
            device_peaks: peaks,
            ..spec_with(config(2, 1), tiny_samples(), cpu_topology(2, 2))
        })
        .unwrap();
        let m = t.train_step().unwrap();
        assert_eq!(m.workers.len(), 4);
        // Every worker's device has a peak, so every worker has an MFU. Drafter ranks each
        // trained a micro-batch; the target workers pull from one shared queue of sequences,
        // so one of them may have handled none of this step's (its MFU is then exactly 0),
        // but between them they ran every sequence's target forward.
        assert!(m.workers.iter().all(|w| w.mfu.is_some_and(|u| u >= 0.0)));
        let mfu_of = |role: DeviceRole| -> Vec<f64> {
            m.workers
                .iter()
                .filter(|w| w.role == role)
                .filter_map(|w| w.mfu)
                .collect()
        };
        assert!(mfu_of(DeviceRole::Drafter).iter().all(|&u| u > 0.0));
        assert!(mfu_of(DeviceRole::Target).iter().sum::<f64>() > 0.0);
        // Four workers share one CPU: the step's MFU counts its peak once, so it is the sum
        // of the workers' (each measured against the whole CPU).
        let sum: f64 = m.workers.iter().filter_map(|w| w.mfu).sum();
        assert!(
            (m.mfu.unwrap() - sum).abs() < 1e-9 * sum,
            "{:?} vs {sum}",
            m.mfu
        );
    });
}
