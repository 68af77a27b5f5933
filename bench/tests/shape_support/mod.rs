//! What the shape-bound tests measure around each training step, shared by
//! `shape_bound.rs` (the embedded default) and `shape_bound_real.rs` (the real structure).
//! Each test file is a binary of its own because both measures are process-wide: the
//! attention shape log, the resident set and glibc's heap statistics.
use dflash_bench::memory::{self, HeapUsage};
use dflash_engine::model::attention::shape_log;
use dflash_engine::train::trainer::Trainer;
use std::collections::BTreeSet;

const MIB: f64 = 1024.0 * 1024.0;

/// Per step: the resident set after it, once free heap pages went back to the kernel, and as
/// it stood before that (MiB), its peak above the resident set before it (MiB), glibc's live
/// heap after it (bytes handed out and not freed: a leak shows here to the byte, where the
/// untrimmed resident set also moves with fragmentation), how many attention shapes had been
/// seen by its end, and every distinct attention call shape over all the steps.
pub struct StepMemory {
    pub after: Vec<f64>,
    pub after_untrimmed: Vec<f64>,
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
        after_untrimmed: Vec::with_capacity(steps),
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
        m.after_untrimmed.push(memory::rss_mb().unwrap());
        m.heap.push(memory::heap_usage().unwrap());
        // Free chunks stranded between live ones keep their pages resident: without the tcache
        // the real structure's arenas kept more of them each step while the live heap stayed
        // flat (docs/BENCHMARKS.md#shape-bound-and-flat-memory-tests). What must stay
        // flat is what cannot be given back.
        assert!(memory::release_free_heap_pages());
        m.after.push(memory::rss_mb().unwrap());
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

/// The live heap's growth after `warmup`, split by whether a step met an attention call
/// shape not seen before. A new shape fills libtorch's per-shape kernel caches once
/// (docs/BENCHMARKS.md#shape-bound-and-flat-memory-tests), so that growth is
/// bounded by the shape bound, not by the run's length; a leak grows on
/// every step. Bytes.
pub struct HeapGrowth {
    /// Summed in-use growth of the steps that met only known attention shapes.
    pub on_known_shapes: i64,
    pub known_steps: usize,
    /// Summed in-use growth of the steps that met a new attention shape.
    pub on_new_shapes: i64,
    pub new_steps: usize,
    /// In-use bytes after the last step minus after the warmup.
    pub total: i64,
    /// The largest in-use growth of a single known-shape step, and which step.
    pub largest_known_step: (i64, usize),
}

pub fn heap_growth(m: &StepMemory, warmup: usize) -> HeapGrowth {
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
        if m.shapes_seen[step] == m.shapes_seen[step - 1] {
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
            "live heap after warmup: {:+} B in all; {:+} B over {} steps of known attention \
             shapes (largest {:+} B at step {}), {:+} B over {} steps that met a new one",
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

/// How much the live heap may grow, in all, over the steps that met no new attention shape
/// (bytes; tcache off): about twice the one step after a new shape's first that grew at all
/// (docs/BENCHMARKS.md#shape-bound-and-flat-memory-tests). A leak of 100 B a step
/// fails it within 200 steps.
pub const HEAP_KNOWN_SHAPE_TOLERANCE: i64 = 16 * 1024;

/// Environment marker of the child [`run_without_tcache`] starts.
const CHILD_MARKER: &str = "DFLASH_SHAPE_TEST_CHILD";

/// Runs the test `test_name` of this test binary again in a child process with glibc's
/// per-thread cache off, and returns `false` after it passed (its output is printed, so the
/// harness shows it when the parent fails); returns `true` in the child, which then measures.
///
/// Why: glibc keeps up to 7 freed chunks of each small size (to 1 KiB) per thread in its
/// tcache, and `mallinfo2` counts them as in use, so the live-heap reading would grow for a
/// few hundred steps as those bins fill (up to about 240 KiB per thread) and look like a slow
/// leak. With the tcache off (`GLIBC_TUNABLES=glibc.malloc.tcache_count=0`, read only at
/// process start) a step's reading moves by tens of bytes.
pub fn run_without_tcache(test_name: &str) -> bool {
    if std::env::var_os(CHILD_MARKER).is_some() {
        return true;
    }
    let tunables = match std::env::var("GLIBC_TUNABLES") {
        Ok(existing) if !existing.is_empty() => {
            format!("{existing}:glibc.malloc.tcache_count=0")
        }
        _ => "glibc.malloc.tcache_count=0".to_string(),
    };
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        // `--include-ignored`: the soak's tests are `#[ignore]`d in `make test`.
        .args([
            test_name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GLIBC_TUNABLES", tunables)
        .env(CHILD_MARKER, "1")
        .output()
        .expect("run this test binary again");
    eprintln!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the measuring child ({test_name}, tcache off) failed: {}",
        out.status
    );
    false
}

/// One line per step for the test's log: where a drift comes from is read off this.
pub fn log_steps(m: &StepMemory) {
    for (step, h) in m.heap.iter().enumerate() {
        eprintln!(
            "step {step:4}: rss {:8.2} MiB ({:8.2} before trimming), heap in use {:12} B (mapped {:11}), free in arenas {:10} B, attention shapes {}",
            m.after[step], m.after_untrimmed[step], h.in_use, h.mapped, h.free_in_arenas, m.shapes_seen[step]
        );
    }
}

/// The steps to run: `DFLASH_SHAPE_STEPS` when set (a longer run than `make test`'s, e.g. 200
/// for the real structure), else `default`; at least `warmup` plus two to compare.
pub fn steps_from_env(default: usize, warmup: usize) -> usize {
    const VAR: &str = "DFLASH_SHAPE_STEPS";
    match std::env::var(VAR) {
        Err(_) => default,
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n >= warmup + 2 => n,
            _ => panic!(
                "{VAR}={text:?}: set it to a whole number of steps of at least {} (warmup \
                 {warmup} plus two steps to compare)",
                warmup + 2
            ),
        },
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
