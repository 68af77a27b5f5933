//! What the shape-bound tests measure around each training step, shared by
//! `shape_bound.rs` (the embedded default) and `shape_bound_real.rs` (the real structure).
//! Each test file is a binary of its own because both measures are process-wide: the
//! attention shape log, the resident set and glibc's heap statistics.
use dflash_bench::memory::{self, HeapUsage};
use dflash_engine::model::attention::shape_log;
use dflash_engine::train::micro::PreparedMicro;
use dflash_engine::train::trainer::Trainer;
use std::collections::BTreeSet;

const MIB: f64 = 1024.0 * 1024.0;

/// Per step: the resident set after it and its peak above the resident set before it (MiB),
/// glibc's live heap after it (bytes handed out and not freed: a leak shows here to the byte,
/// where the resident set also moves with fragmentation), how many attention shapes had been
/// seen by its end, and every distinct attention call shape over all the steps.
pub struct StepMemory {
    pub after: Vec<f64>,
    pub peaks: Vec<f64>,
    pub heap: Vec<HeapUsage>,
    pub shapes_seen: Vec<usize>,
    pub shapes: BTreeSet<Vec<i64>>,
}

/// Runs `steps` optimizer steps of `trainer`, reading the resident set the way the benchmark's
/// memory pass does (glibc's mmap threshold pinned low so it follows live allocations) and
/// glibc's heap statistics after each step.
pub fn run_steps(trainer: &mut Trainer, steps: usize) -> StepMemory {
    assert!(
        memory::follow_live_allocations(),
        "this test needs glibc to measure live memory"
    );
    heap_sees_a_small_leak();
    shape_log::start();
    let mut m = StepMemory {
        after: Vec::with_capacity(steps),
        peaks: Vec::with_capacity(steps),
        heap: Vec::with_capacity(steps),
        shapes_seen: Vec::with_capacity(steps),
        shapes: BTreeSet::new(),
    };
    for step in 0..steps {
        let before = memory::rss_mb().unwrap();
        assert!(
            memory::reset_peak(),
            "the kernel must allow resetting VmHWM"
        );
        trainer
            .train_step()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        m.peaks.push(memory::peak_rss_mb().unwrap() - before);
        m.after.push(memory::rss_mb().unwrap());
        m.heap.push(memory::heap_usage().unwrap());
        m.shapes_seen.push(shape_log::seen());
    }
    m.shapes = shape_log::stop();
    m
}

/// The instrument's own check: 1 MiB held in 1 KiB pieces (heap chunks, under the pinned mmap
/// threshold: what a small per-step leak looks like) raises glibc's in-use count by that
/// much, and freeing them brings it back.
fn heap_sees_a_small_leak() {
    let before = memory::heap_usage().unwrap().in_use as f64;
    let pieces: Vec<Vec<u8>> = (0..1024).map(|i| vec![i as u8; 1024]).collect();
    std::hint::black_box(&pieces);
    let held = memory::heap_usage().unwrap().in_use as f64 - before;
    drop(pieces);
    let left = memory::heap_usage().unwrap().in_use as f64 - before;
    assert!(
        (1.0 * MIB..1.2 * MIB).contains(&held) && left.abs() < 0.01 * MIB,
        "glibc's in-use count must follow 1 MiB of small pieces: +{held} held, {left} after freeing"
    );
}

/// The live heap's growth after `warmup`, split by whether a step met only shapes seen
/// before: no new attention call shape, and its micro-batch's `shape_keys[step]` (the sizes
/// outside attention that vary between micro-batches: rows, row length, weighted positions)
/// already met by an earlier step. A new shape may fill libtorch's per-shape caches once
/// (kernel and primitive caches), bounded by the set of shapes, not by the run's length; a
/// leak grows on known shapes too. Bytes.
pub struct HeapGrowth {
    /// Summed in-use growth of the steps that met only known shapes.
    pub on_known_shapes: i64,
    /// How many such steps there were.
    pub known_steps: usize,
    /// Summed in-use growth of the steps that met a new shape, and how many there were.
    pub on_new_shapes: i64,
    pub new_steps: usize,
    /// In-use bytes after the last step minus after the warmup.
    pub total: i64,
    /// The largest in-use growth of a single known-shape step, and which step.
    pub largest_known_step: (i64, usize),
}

pub fn heap_growth(m: &StepMemory, warmup: usize, shape_keys: &[Vec<i64>]) -> HeapGrowth {
    let in_use: Vec<i64> = m.heap.iter().map(|h| h.in_use as i64).collect();
    let mut g = HeapGrowth {
        on_known_shapes: 0,
        known_steps: 0,
        on_new_shapes: 0,
        new_steps: 0,
        total: in_use[in_use.len() - 1] - in_use[warmup - 1],
        largest_known_step: (0, warmup),
    };
    for step in warmup..in_use.len() {
        let d = in_use[step] - in_use[step - 1];
        let known = m.shapes_seen[step] == m.shapes_seen[step - 1]
            && shape_keys[..step].contains(&shape_keys[step]);
        if known {
            g.on_known_shapes += d;
            g.known_steps += 1;
            if d > g.largest_known_step.0 {
                g.largest_known_step = (d, step);
            }
        } else {
            g.on_new_shapes += d;
            g.new_steps += 1;
        }
    }
    g
}

impl std::fmt::Display for HeapGrowth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "live heap after warmup: {:+} B in all; {:+} B over {} steps of known shapes \
             (largest {:+} B at step {}), {:+} B over {} steps that met a new shape",
            self.total,
            self.on_known_shapes,
            self.known_steps,
            self.largest_known_step.0,
            self.largest_known_step.1,
            self.on_new_shapes,
            self.new_steps
        )
    }
}

/// The sizes of a micro-batch outside attention that vary between micro-batches: rows, row
/// length and the weighted positions the LM head projects.
pub fn shape_key(m: &PreparedMicro) -> Vec<i64> {
    let weighted = m.labels.weights.iter().filter(|w| **w > 0.0).count();
    vec![
        m.batch.batch as i64,
        m.batch.seq_len as i64,
        weighted as i64,
    ]
}

/// One line per step for the test's log: where a drift comes from is read off this.
pub fn log_steps(m: &StepMemory) {
    for (step, h) in m.heap.iter().enumerate() {
        eprintln!(
            "step {step:4}: rss {:8.2} MiB, heap in use {:12} B (mapped {:11}), free in arenas {:10} B, attention shapes {}",
            m.after[step], h.in_use, h.mapped, h.free_in_arenas, m.shapes_seen[step]
        );
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
