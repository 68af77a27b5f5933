//! Observer of the distinct shapes the block-sparse attention hands its fused kernel.
//!
//! Why: on CUDA every new (rows, keys) shape of a biased SDPA call is a new kernel plan (cuDNN)
//! and a new allocation size (the caching allocator), so the piece 4 bounds the set of
//! shapes and a test has to be able to count them. Recording is process-wide (every thread,
//! every plan) and off by default; when off, [`record`] costs one relaxed atomic load, so the
//! hot path pays nothing measurable.
//!
//! A shape is the concatenation of q's and k's sizes at the kernel call (`[B, Hq', rows, D]`
//! then `[B, Hkv, keys, D]`, as the kernel sees them, after any grouped-head folding).
//! Because recording is process-wide, a test that uses it must not run attention on other
//! threads of the same process it does not mean to count.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tch::Tensor;

static RECORDING: AtomicBool = AtomicBool::new(false);
static SHAPES: Mutex<BTreeSet<Vec<i64>>> = Mutex::new(BTreeSet::new());

fn shapes() -> std::sync::MutexGuard<'static, BTreeSet<Vec<i64>>> {
    // A panic while holding the lock leaves a set of plain integers: still usable.
    SHAPES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Begins recording (process-wide) and clears what an earlier recording left.
pub fn start() {
    shapes().clear();
    RECORDING.store(true, Ordering::Relaxed);
}

/// Stops recording and returns the distinct shapes seen since [`start`].
pub fn stop() -> BTreeSet<Vec<i64>> {
    RECORDING.store(false, Ordering::Relaxed);
    std::mem::take(&mut *shapes())
}

/// How many distinct shapes the current recording has seen so far.
pub fn seen() -> usize {
    shapes().len()
}

/// Called at every fused attention call of `block_sparse.rs` with the kernel's q and k.
pub(crate) fn record(q: &Tensor, k: &Tensor) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let mut shape = q.size();
    shape.extend(k.size());
    shapes().insert(shape);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn records_distinct_shapes_only_while_started() {
        // Sizes no other test uses: unit tests share the process, and other tests may run
        // attention while this one records.
        let t = |s: [i64; 4]| Tensor::zeros(s, (Kind::Float, Device::Cpu));
        let (q, k, late) = (t([1, 2, 97, 4]), t([1, 1, 89, 4]), t([1, 1, 83, 4]));
        record(&late, &late); // not recording: dropped
        start();
        record(&q, &k);
        record(&q, &k);
        record(&k, &q);
        let seen = stop();
        record(&late, &q); // stopped: dropped
        let ours: Vec<_> = seen
            .iter()
            .filter(|s| s.iter().any(|&d| d == 97 || d == 89 || d == 83))
            .cloned()
            .collect();
        assert_eq!(
            ours,
            [
                vec![1, 1, 89, 4, 1, 2, 97, 4],
                vec![1, 2, 97, 4, 1, 1, 89, 4]
            ]
        );
        start();
        let again = stop();
        assert!(
            !again.contains(&vec![1, 2, 97, 4, 1, 1, 89, 4]),
            "start clears the previous recording"
        );
        assert!(!again.iter().any(|s| s.contains(&83)));
    }
}
