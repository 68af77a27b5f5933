//! A device's dense matmul rate as this process reaches it: the peak a CPU run's MFU is
//! measured against (a CPU has no datasheet figure that libtorch's threads actually reach).
//! CUDA devices are judged against their datasheet instead (`dflash_shared::gpu_peaks`).
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::plan::flops::square_matmul_flops;

/// A measured `[n, n] × [n, n]` matmul rate.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredPeak {
    pub n: i64,
    pub kind: Kind,
    /// libtorch's intra-op threads during the measurement (the training thread's count).
    pub threads: i64,
    /// The fastest of the timed matmuls: other work on the machine only ever slows one down,
    /// so the fastest is the nearest to what the device reaches (a median taken while another
    /// process shares the cores understates the peak and pushes MFU past 100 %).
    pub best_ms: f64,
    pub flops_per_s: f64,
}

/// Times `reps` matmuls of size `n` in `kind` on `device` (after one untimed) and returns the
/// best rate, or `None` when no timing came out positive.
pub fn measure_matmul(device: Device, kind: Kind, n: i64, reps: usize) -> Option<MeasuredPeak> {
    let opts = (kind, device);
    // The generator's lock for the draws only, not through the timed loop.
    let (a, b) = {
        let _rng = crate::device::global_rng::lock();
        (Tensor::randn([n, n], opts), Tensor::randn([n, n], opts))
    };
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let times_ms: Vec<f64> = tch::no_grad(|| {
        let _ = a.mm(&b);
        sync();
        (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                let _ = std::hint::black_box(a.mm(&b));
                sync();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect()
    });
    let best_ms = times_ms.iter().copied().fold(f64::INFINITY, f64::min);
    (best_ms > 0.0 && best_ms.is_finite()).then(|| MeasuredPeak {
        n,
        kind,
        threads: tch::get_num_threads() as i64,
        best_ms,
        flops_per_s: square_matmul_flops(n) / (best_ms * 1e-3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_matmul_has_a_positive_rate_consistent_with_its_time() {
        let peak = measure_matmul(Device::Cpu, Kind::Float, 256, 3).unwrap();
        assert!(peak.flops_per_s > 0.0);
        let implied = square_matmul_flops(256) / peak.flops_per_s * 1e3;
        assert!((implied - peak.best_ms).abs() < 1e-9 * peak.best_ms.max(1.0));
    }
}
