//! What the shape-bound tests measure around each training step, shared by
//! `shape_bound.rs` (the embedded default) and `shape_bound_real.rs` (the real structure).
//! Each test file is a binary of its own because both measures are process-wide: the
//! attention shape log and the resident set.
use dflash_bench::memory;
use dflash_engine::model::attention::shape_log;
use dflash_engine::train::trainer::Trainer;
use std::collections::BTreeSet;

/// Per step: the resident set after it and its peak above the resident set before it (MiB),
/// and every distinct attention call shape over all the steps.
pub struct StepMemory {
    pub after: Vec<f64>,
    pub peaks: Vec<f64>,
    pub shapes: BTreeSet<Vec<i64>>,
}

/// Runs `steps` optimizer steps of `trainer`, reading the resident set the way the benchmark's
/// memory pass does (glibc's mmap threshold pinned low so it follows live allocations).
pub fn run_steps(trainer: &mut Trainer, steps: usize) -> StepMemory {
    assert!(
        memory::follow_live_allocations(),
        "this test needs glibc to measure live memory"
    );
    shape_log::start();
    let mut after = Vec::with_capacity(steps);
    let mut peaks = Vec::with_capacity(steps);
    for step in 0..steps {
        let before = memory::rss_mb().unwrap();
        assert!(
            memory::reset_peak(),
            "the kernel must allow resetting VmHWM"
        );
        trainer
            .train_step()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        peaks.push(memory::peak_rss_mb().unwrap() - before);
        after.push(memory::rss_mb().unwrap());
    }
    StepMemory {
        after,
        peaks,
        shapes: shape_log::stop(),
    }
}

/// Largest minus smallest.
pub fn spread(v: &[f64]) -> f64 {
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    hi - lo
}

pub fn largest(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::MIN, f64::max)
}

pub fn smallest(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::MAX, f64::min)
}
