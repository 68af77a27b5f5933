//! This machine's matmul peak, measured in the same run as the cases, so engine throughput can
//! be given as a fraction of what the hardware (as libtorch drives it, with the same threads)
//! actually reaches on a large dense matmul.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::error::BenchError;
use super::flops::square_matmul_flops;
use super::step::kind_name;
use super::timing::timed_loop;
use dflash_engine::device;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MatmulPeak {
    pub n: i64,
    pub device: String,
    pub dtype: String,
    pub threads: i64,
    pub step_ms: Vec<f64>,
    pub median_ms: Option<f64>,
    /// `2n³ / median time`, GFLOP/s.
    pub gflops: Option<f64>,
}

/// Times `[n, n] x [n, n]` matmuls (`warmup` untimed, then `reps`) and reports the median rate.
pub fn measure(
    n: i64,
    device: Device,
    kind: Kind,
    warmup: usize,
    reps: usize,
) -> Result<MatmulPeak, BenchError> {
    // The generator's lock for the draws only, not through the timed loop.
    let (a, b) = {
        let _rng = dflash_engine::device::global_rng::seeded(0);
        let draw = || Tensor::randn([n, n], (kind, device));
        (draw(), draw())
    };
    let mut out = Tensor::empty([n, n], (kind, device));
    let timed = tch::no_grad(|| {
        timed_loop(warmup, reps, device, |_| {
            out = a.mm(&b);
            Ok(())
        })
    })?;
    std::hint::black_box(&out);
    let gflops = timed
        .median_step_ms
        .map(|ms| square_matmul_flops(n) / (ms * 1e-3) / 1e9);
    Ok(MatmulPeak {
        n,
        device: device::name(device),
        dtype: kind_name(kind).into(),
        threads: tch::get_num_threads() as i64,
        step_ms: timed.step_ms,
        median_ms: timed.median_step_ms,
        gflops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_matmul_reports_a_positive_rate() {
        let _rng = dflash_engine::device::global_rng::lock();
        let peak = measure(128, Device::Cpu, Kind::Float, 1, 3).unwrap();
        assert_eq!(peak.step_ms.len(), 3);
        assert!(peak.gflops.unwrap() > 0.0);
        assert_eq!(peak.dtype, "f32");
    }
}
