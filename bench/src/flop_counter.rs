//! The FLOPs libtorch executes, counted op by op (`csrc/flop_counter.cpp`): the measured side
//! of the FLOP model (`dflash_engine::plan::flops`), as the memory pass is the measured side
//! of the memory model.
//!
//! Counted at the dispatcher, so it sees what really runs (forward, the recomputation of
//! checkpointed layers, every backward formula, attention over all the keys a fused call is
//! handed, masked or not) and nothing else: matmuls (`mm`, `addmm`, `bmm`, `baddbmm`) and the
//! fused attention kernels (`_scaled_dot_product_*`, forward and backward), with the
//! conventions of `torch.utils.flop_counter`. Elementwise work, norms and softmax are not
//! counted, as the model leaves them out.
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

unsafe extern "C" {
    fn dflash_flop_counter_start() -> i32;
    fn dflash_flop_counter_stop(out: *mut u64) -> i32;
}

/// FLOPs (and kernel calls) counted while a closure ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CountedFlops {
    pub matmul: f64,
    pub attention_forward: f64,
    pub attention_backward: f64,
    pub matmul_calls: u64,
    pub attention_calls: u64,
}

impl CountedFlops {
    pub fn total(&self) -> f64 {
        self.matmul + self.attention_forward + self.attention_backward
    }
}

/// The shim's totals are process-wide: one count at a time.
static COUNTING: Mutex<()> = Mutex::new(());

/// Runs `f` on this thread with every matmul and attention kernel it runs counted (and those
/// the autograd engine runs for it on its device threads; other threads' work is not).
pub fn count_flops<R>(f: impl FnOnce() -> R) -> (R, CountedFlops) {
    let _one_at_a_time = COUNTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: plain C calls; `stop` writes exactly six u64 into the buffer it is given.
    let started = unsafe { dflash_flop_counter_start() };
    assert_eq!(
        started, 0,
        "the FLOP counter was already running on this thread"
    );
    /// Stops the count even when `f` panics, so the thread-local callback never outlives it.
    struct Stop([u64; 6]);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: as above; a second stop on this thread returns 1 and writes nothing.
            unsafe { dflash_flop_counter_stop(self.0.as_mut_ptr()) };
        }
    }
    let mut stop = Stop([0; 6]);
    let result = f();
    // SAFETY: as above.
    let stopped = unsafe { dflash_flop_counter_stop(stop.0.as_mut_ptr()) };
    assert_eq!(
        stopped, 0,
        "the FLOP counter stopped before its closure ended"
    );
    let [matmul, forward, backward, matmul_calls, forward_calls, backward_calls] = stop.0;
    (
        result,
        CountedFlops {
            matmul: matmul as f64,
            attention_forward: forward as f64,
            attention_backward: backward as f64,
            matmul_calls,
            attention_calls: forward_calls + backward_calls,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    fn randn(shape: &[i64]) -> Tensor {
        let _rng = dflash_engine::device::global_rng::lock();
        Tensor::randn(shape, (Kind::Float, Device::Cpu))
    }

    #[test]
    fn a_matmul_and_its_backward_count_two_flops_per_multiply_add() {
        let (x, w) = (randn(&[8, 16]).set_requires_grad(true), randn(&[32, 16]));
        let w = w.set_requires_grad(true);
        let ((), counted) = count_flops(|| {
            // [8,16]·[16,32]: 2·8·16·32 forward; the input and weight gradients twice that.
            x.matmul(&w.tr()).sum(Kind::Float).backward();
        });
        assert_eq!(counted.matmul, 3.0 * 2.0 * 8.0 * 16.0 * 32.0);
        assert_eq!(counted.matmul_calls, 3);
        assert_eq!(counted.attention_forward + counted.attention_backward, 0.0);
        // A batched product through `matmul` lands on bmm: 2·4·3·5·6.
        // Drawn outside the count: a test that counts holds the generator's lock first.
        let (a, b) = (randn(&[4, 3, 5]), randn(&[4, 5, 6]));
        let ((), batched) = count_flops(|| {
            let _ = a.matmul(&b);
        });
        assert_eq!(batched.matmul, 2.0 * 4.0 * 3.0 * 5.0 * 6.0);
    }

    #[test]
    fn fused_attention_counts_every_key_it_is_handed_and_twice_that_backward() {
        // q [1, 4, 6, 8] over k, v [1, 4, 10, 8] with a mask hiding half the keys: the kernel
        // still multiplies all of them, and the count says so (4·1·4·6·10·8 forward).
        let q = randn(&[1, 4, 6, 8]).set_requires_grad(true);
        let (k, v) = (randn(&[1, 4, 10, 8]), randn(&[1, 4, 10, 8]));
        let mask = Tensor::zeros([1, 1, 6, 10], (Kind::Float, Device::Cpu)).index_fill(
            3,
            &Tensor::arange(5, (Kind::Int64, Device::Cpu)),
            f64::NEG_INFINITY,
        );
        let ((), counted) = count_flops(|| {
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false)
                .sum(Kind::Float)
                .backward();
        });
        let forward = 4.0 * 4.0 * 6.0 * 10.0 * 8.0;
        // Whichever kernel libtorch picks: a fused one reports forward and backward apart,
        // the math fallback runs them as batched matmuls.
        assert_eq!(counted.total(), 3.0 * forward, "{counted:?}");
        assert!(
            counted.attention_forward == forward && counted.attention_backward == 2.0 * forward
                || counted.matmul == 3.0 * forward,
            "{counted:?}"
        );
    }

    #[test]
    fn work_outside_the_closure_and_on_other_threads_is_not_counted() {
        let (a, b) = (randn(&[64, 64]), randn(&[64, 64]));
        let busy = std::thread::spawn(|| {
            let (x, y) = (randn(&[128, 128]), randn(&[128, 128]));
            for _ in 0..200 {
                let _ = x.mm(&y);
            }
        });
        let ((), counted) = count_flops(|| {
            let _ = a.mm(&b);
        });
        busy.join().unwrap();
        let _ = a.mm(&b); // after the count: not in it
        assert_eq!(counted.matmul, 2.0 * 64.0 * 64.0 * 64.0);
        assert_eq!(counted.matmul_calls, 1);
    }
}
