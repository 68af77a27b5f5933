//! A worker that fails stops the run with an error naming the worker and its device; nothing
//! continues on the remaining devices, and nothing hangs.

use std::time::Duration;

use crate::support::topology::{config, cpu_topology, tiny_samples, trainer_with, within};
use dflash_engine::train::loader::{split_held_out, Loader};
use dflash_engine::train::trainer::PAD_ID;
use dflash_engine::train::TrainError;
use dflash_shared::metrics::DeviceRole;

const BAD_TOKEN: i64 = 100_000;

/// The tiny samples with one token of the sample at `position` of epoch 0's order made
/// unreadable for the target (outside its vocabulary): a real error in the target forward.
fn samples_with_bad(position: usize, batch_size: usize) -> Vec<dflash_engine::data::Sample> {
    let mut samples = tiny_samples();
    let cfg = config(batch_size, 1);
    let split = split_held_out(samples.len(), cfg.held_out, cfg.seed).unwrap();
    let order = Loader::new(split.train, batch_size, cfg.seed, PAD_ID).epoch_order(0);
    samples[order[position]].input_ids[0] = BAD_TOKEN;
    samples
}

/// (worker, device, detail), after checking that the role and rank agree with the worker's name.
fn worker_error(err: TrainError) -> (String, String, String) {
    match err {
        TrainError::Worker(f) => {
            let role = match f.role {
                DeviceRole::Target => "target",
                DeviceRole::Drafter => "drafter",
                DeviceRole::Both => "target+drafter",
                DeviceRole::Idle => "idle",
            };
            assert_eq!(
                f.worker,
                format!("{role} worker {} on {}", f.rank, f.device),
                "role, rank and device name the failing worker"
            );
            (f.worker, f.device, f.detail)
        }
        other => panic!("expected a worker failure, got: {other}"),
    }
}

#[test]
fn a_target_worker_failing_mid_run_stops_training_with_its_name() {
    within(Duration::from_secs(60), || {
        // Micro-batch 1 (rows 4..8 of epoch 0) holds the bad sample; micro-batch 0 (the warmup)
        // is clean, so the failure happens while workers run concurrently.
        let mut t = trainer_with(config(4, 1), samples_with_bad(5, 4), cpu_topology(2, 2));
        let err = t.train_step().unwrap_err();
        let text = err.to_string();
        let (worker, device, detail) = worker_error(err);
        assert!(worker.starts_with("target worker "), "{text}");
        assert!(worker.ends_with(" on cpu"), "{text}");
        assert_eq!(device, "cpu");
        assert!(
            detail.contains("micro-batch 1") && detail.contains(&BAD_TOKEN.to_string()),
            "{text}"
        );
        assert!(
            text.contains("never continues with fewer devices"),
            "{text}"
        );
        assert_eq!(t.step_count(), 0);
        // Sticky: the next step does not quietly continue on the healthy workers.
        let again = t.train_step().unwrap_err().to_string();
        assert_eq!(again, text);
        assert_eq!(t.step_count(), 0);
    });
}

#[test]
fn a_failure_during_the_serialized_warmup_names_the_first_target_worker() {
    within(Duration::from_secs(60), || {
        let mut t = trainer_with(config(4, 1), samples_with_bad(0, 4), cpu_topology(2, 2));
        let err = t.warmup().unwrap_err();
        let (worker, device, detail) = worker_error(err);
        assert_eq!(worker, "target worker 0 on cpu");
        assert_eq!(device, "cpu");
        assert!(detail.contains("micro-batch 0"), "{detail}");
        assert!(t.warmup_records().is_empty());
        assert!(t.train_step().is_err());
    });
}

#[test]
fn the_inline_topology_reports_its_failure_the_same_way() {
    within(Duration::from_secs(60), || {
        let mut t = trainer_with(config(4, 1), samples_with_bad(5, 4), cpu_topology(1, 1));
        t.train_step().unwrap(); // micro-batch 0 is clean
        let (worker, device, detail) = worker_error(t.train_step().unwrap_err());
        assert_eq!(worker, "target+drafter worker 0 on cpu");
        assert_eq!(device, "cpu");
        assert!(detail.contains("micro-batch 1"), "{detail}");
        assert!(t.train_step().is_err(), "a failed run stays failed");
    });
}
