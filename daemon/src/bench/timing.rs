//! The timed loop every engine case uses: warmup iterations, timed iterations, the device
//! synchronised around each, and the process memory of the loop separated from loading.
use std::time::Instant;

use tch::Device;

use super::error::BenchError;
use super::memory;
use super::stats::median;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timed {
    pub step_ms: Vec<f64>,
    pub median_step_ms: Option<f64>,
    pub baseline_rss_mb: Option<f64>,
    pub load_peak_rss_mb: Option<f64>,
    pub step_peak_rss_mb: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub peak_reset: bool,
}

pub fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Runs `body(i)` for `i in 0..warmup + steps`; times the last `steps`.
pub fn timed_loop(
    warmup: usize,
    steps: usize,
    device: Device,
    mut body: impl FnMut(usize) -> Result<(), BenchError>,
) -> Result<Timed, BenchError> {
    let mut t = Timed { baseline_rss_mb: memory::rss_mb(), load_peak_rss_mb: memory::peak_rss_mb(), ..Timed::default() };
    t.peak_reset = memory::reset_peak();
    for i in 0..warmup + steps {
        sync(device);
        let start = Instant::now();
        body(i)?;
        sync(device);
        if i >= warmup {
            t.step_ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    t.step_peak_rss_mb = memory::peak_rss_mb();
    t.median_step_ms = median(&t.step_ms);
    t.peak_rss_mb = [t.load_peak_rss_mb, t.step_peak_rss_mb].into_iter().flatten().reduce(f64::max);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_only_the_steps_after_warmup() {
        let mut calls = Vec::new();
        let t = timed_loop(2, 3, Device::Cpu, |i| {
            calls.push(i);
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, [0, 1, 2, 3, 4]);
        assert_eq!(t.step_ms.len(), 3);
        assert!(t.median_step_ms.is_some());
        assert!(t.peak_rss_mb.unwrap() > 0.0);
    }

    #[test]
    fn an_error_in_a_step_stops_the_loop() {
        let err = timed_loop(0, 3, Device::Cpu, |i| if i == 1 { Err(BenchError::case(std::path::Path::new("x"), "boom")) } else { Ok(()) });
        assert!(err.unwrap_err().to_string().contains("boom"));
    }
}
