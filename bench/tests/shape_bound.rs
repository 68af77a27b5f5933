//! The embedded default with fixed shapes (issue 11, piece 4): the micro-batches come in a
//! bounded set of (rows, row length, anchors) shapes, the attention kernel sees a bounded set
//! of shapes, and live memory stays flat after warmup. `make test` runs 40 steps (20 after
//! warmup: a leak of a micro-batch's tensors, ~1 MiB a step, leaves the flat band within a few
//! steps, and one of 1 KiB a step passes the live-heap tolerance within 16); `make soak` runs
//! the 200-step test (`#[ignore]`d here), where leaks of ~100 B a step show.
//! `DFLASH_SHAPE_STEPS` sets either test's count.
//!
//! It records attention shapes process-wide (`shape_log`) and reads the process's resident
//! set the way the benchmark's memory pass does (`dflash_bench::memory`: glibc's mmap
//! threshold pinned low so the resident set follows live allocations), so it is a test
//! binary of its own: nothing else runs attention or allocates in it.
mod shape_support;

use dflash_engine::model::attention::max_distinct_chunk_shapes;
use shape_support::{
    heap_growth, largest, log_steps, run_steps, run_without_tcache, smallest, spread,
    steps_from_env, HEAP_KNOWN_SHAPE_TOLERANCE,
};
use std::collections::BTreeSet;
use std::sync::Arc;

use dflash_engine::embedded;
use dflash_engine::train::micro::{MicroSource, MicroSpec};
use dflash_engine::train::trainer::Trainer;
use tch::Device;

/// Steps `make test` runs (`DFLASH_SHAPE_STEPS` sets another count).
const DEFAULT_STEPS: usize = 40;
/// Steps `make soak` runs.
const SOAK_STEPS: usize = 200;
/// Steps before memory must be flat: the first steps fault in libtorch's lazily created
/// state (thread pools, kernel caches, the optimizer's moments on the first update).
const WARMUP: usize = 20;
/// Flatness: after warmup the resident set after each step, free heap pages trimmed, may
/// spread by at most this much (MiB; a few times the measured spread:
/// docs/BENCHMARKS.md#shape-bound-and-flat-memory-tests). A leak of one micro-batch's
/// tensors per step (~1 MiB) leaves this band within a few steps; the live heap is held to
/// bytes ([`HEAP_KNOWN_SHAPE_TOLERANCE`]).
const FLAT_TOLERANCE_MIB: f64 = 4.0;
/// A step's peak above the resident set before it differs by row length (four buckets) and is
/// smaller on the short last batch of an epoch ({S}), so it is
/// not one value; it must not grow: the peaks of the second half stay within this much
/// (MiB) of the largest peak of the first half after warmup (the halves of the steps after
/// warmup).
const PEAK_GROWTH_TOLERANCE_MIB: f64 = 1.0;

#[test]
fn forty_steps_see_bounded_attention_shapes_and_flat_live_memory() {
    if !run_without_tcache("forty_steps_see_bounded_attention_shapes_and_flat_live_memory") {
        return; // the child measured, and passed
    }
    bounded_shapes_and_flat_memory(steps_from_env(DEFAULT_STEPS, WARMUP));
}

#[test]
#[ignore = "soak (make soak): 200 steps, about 100 s"]
fn two_hundred_steps_see_bounded_attention_shapes_and_flat_live_memory() {
    if !run_without_tcache("two_hundred_steps_see_bounded_attention_shapes_and_flat_live_memory") {
        return; // the child measured, and passed
    }
    bounded_shapes_and_flat_memory(steps_from_env(SOAK_STEPS, WARMUP));
}

fn bounded_shapes_and_flat_memory(steps: usize) {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    let samples = embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length)
        .unwrap()
        .0;
    // Outside attention: rows in at most `max_len / seq_len_multiple` lengths, always
    // `num_anchors` blocks; a batch is full or an epoch's short last one. The micro-batches
    // are the trainer's (`MicroSource` is a pure function of the spec and the index; built
    // here over the whole set, the trainer's own omits the held-out rows).
    let lengths = cfg
        .training
        .max_length
        .div_ceil(cfg.training.seq_len_multiple);
    // The chunk scheduler's set of shapes (`attention/chunk_schedule.rs`), for every row length the
    // buckets allow, at batch 1 (the loosest budget: a smaller batch fits wider chunks), once
    // per batch size (a full batch and an epoch's short last one differ in q's and k's first
    // size).
    let row_lengths: Vec<i64> = (1..=lengths)
        .map(|m| ((m * cfg.training.seq_len_multiple).min(cfg.training.max_length)) as i64)
        .collect();
    let bound = 2 * max_distinct_chunk_shapes(
        cfg.training.num_anchors,
        drafter_cfg.block_size,
        drafter_cfg.num_attention_heads,
        &row_lengths,
    );
    eprintln!("attention shape bound from the config: {bound}");
    let source = MicroSource::new(
        Arc::new(samples.clone()),
        (0..samples.len()).collect(),
        MicroSpec::for_training(&cfg, &drafter_cfg, 0),
    );
    let micro_shapes: BTreeSet<(usize, usize, usize)> = (0..steps as u64)
        .map(|seq| {
            let m = source.prepare(seq);
            (m.batch.batch, m.batch.seq_len, m.anchors.width)
        })
        .collect();
    eprintln!("micro-batch (rows, row length, anchors) shapes: {micro_shapes:?}");
    assert!(
        micro_shapes.len() <= 2 * lengths,
        "{} micro-batch shapes, more than 2 × {lengths}: {micro_shapes:?}",
        micro_shapes.len()
    );
    assert!(micro_shapes
        .iter()
        .all(|&(_, _, w)| w == cfg.training.num_anchors));
    let mut trainer = Trainer::new(target, drafter_cfg, samples, cfg, Device::Cpu).unwrap();
    let m = run_steps(&mut trainer, steps);
    log_steps(&m);
    let heap = heap_growth(&m, WARMUP);
    eprintln!("{heap}");
    let (after, peaks, shapes) = (m.after, m.peaks, m.shapes);

    let after_spread = spread(&after[WARMUP..]);
    let middle = (WARMUP + steps) / 2;
    let (first_half, second_half) = (largest(&peaks[WARMUP..middle]), largest(&peaks[middle..]));
    eprintln!(
        "{} distinct attention shapes over {steps} steps; after warmup: resident set after a step spreads {after_spread:.2} MiB \
         ({:.1}–{:.1}); a step's peak above its start: at most {first_half:.2} MiB in steps \
         {WARMUP}–{}, at most {second_half:.2} MiB after",
        shapes.len(),
        smallest(&after[WARMUP..]),
        largest(&after[WARMUP..]),
        middle - 1,
    );
    assert!(
        shapes.len() <= bound,
        "{} distinct attention shapes, more than the bound {bound}: {shapes:?}",
        shapes.len()
    );
    assert!(
        heap.on_known_shapes <= HEAP_KNOWN_SHAPE_TOLERANCE,
        "{heap}: more than {HEAP_KNOWN_SHAPE_TOLERANCE} B on steps that met no new shape"
    );
    assert!(
        after_spread <= FLAT_TOLERANCE_MIB,
        "resident set after each step spread {after_spread:.2} MiB after warmup: {after:?}"
    );
    assert!(
        second_half <= first_half + PEAK_GROWTH_TOLERANCE_MIB,
        "step peaks grew from {first_half:.2} to {second_half:.2} MiB: {peaks:?}"
    );
}
