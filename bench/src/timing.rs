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
    /// CPU time of the whole process per timed iteration (all threads), ms. On a shared
    /// machine it moves much less with other people's load than wall time does.
    pub cpu_ms: Vec<f64>,
    pub median_cpu_ms: Option<f64>,
    pub baseline_rss_mb: Option<f64>,
    pub load_peak_rss_mb: Option<f64>,
    pub step_peak_rss_mb: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub peak_reset: bool,
}

fn cpu_clock_ms(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; both CPU-time clocks exist on Linux.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// CPU time consumed by this process so far (all threads), ms.
pub fn process_cpu_ms() -> f64 {
    cpu_clock_ms(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time consumed by the calling thread so far, ms: the work one thread did, whatever the
/// other threads (or processes) competing for the cores were doing.
pub fn thread_cpu_ms() -> f64 {
    cpu_clock_ms(libc::CLOCK_THREAD_CPUTIME_ID)
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
    let mut t = Timed {
        baseline_rss_mb: memory::rss_mb(),
        load_peak_rss_mb: memory::peak_rss_mb(),
        ..Timed::default()
    };
    t.peak_reset = memory::reset_peak();
    for i in 0..warmup + steps {
        sync(device);
        let (start, cpu) = (Instant::now(), process_cpu_ms());
        body(i)?;
        sync(device);
        if i >= warmup {
            t.step_ms.push(start.elapsed().as_secs_f64() * 1e3);
            t.cpu_ms.push(process_cpu_ms() - cpu);
        }
    }
    t.step_peak_rss_mb = memory::peak_rss_mb();
    t.median_step_ms = median(&t.step_ms);
    t.median_cpu_ms = median(&t.cpu_ms);
    t.peak_rss_mb = [t.load_peak_rss_mb, t.step_peak_rss_mb]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    Ok(t)
}

/// Peak live memory of `steps` more calls of `body` (indices from `first_index`), MiB: the peak
/// resident set above the resident set right before them, once the resident set follows live
/// allocations ([`memory::follow_live_allocations`]). Unlike the growth over the timed loop it
/// counts neither what the allocator kept from earlier steps nor one-time library
/// initialisation (done in warmup), so the engine and the Python reference compare on what one
/// step holds at once. Run it last and untimed; `None` where the peak cannot be separated.
pub fn live_step_memory(
    first_index: usize,
    steps: usize,
    mut body: impl FnMut(usize) -> Result<(), BenchError>,
) -> Result<Option<f64>, BenchError> {
    if steps == 0 || !memory::follow_live_allocations() {
        return Ok(None);
    }
    let start = memory::rss_mb();
    if !memory::reset_peak() {
        return Ok(None);
    }
    for i in first_index..first_index + steps {
        body(i)?;
    }
    Ok(start
        .zip(memory::peak_rss_mb())
        .map(|(start, peak)| (peak - start).max(0.0)))
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
        assert_eq!(t.cpu_ms.len(), 3);
        assert!(t.median_step_ms.is_some() && t.median_cpu_ms.is_some_and(|c| c >= 0.0));
        assert!(t.peak_rss_mb.unwrap() > 0.0);
    }

    #[test]
    fn process_cpu_time_advances_with_work() {
        let before = process_cpu_ms();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_ms() > before);
    }

    #[test]
    fn thread_cpu_time_counts_this_thread_and_not_another() {
        let spin = |ms: u64| {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            let mut x = 0u64;
            while std::time::Instant::now() < until {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        };
        let before = thread_cpu_ms();
        std::thread::spawn(move || spin(200)).join().unwrap();
        let while_another_worked = thread_cpu_ms() - before;
        assert!(
            while_another_worked < 50.0,
            "another thread's 200 ms counted as {while_another_worked} ms of this one"
        );
        let before = thread_cpu_ms();
        spin(100);
        assert!(
            thread_cpu_ms() - before > 10.0,
            "this thread's own work must count"
        );
    }

    #[test]
    fn an_error_in_a_step_stops_the_loop() {
        let err = timed_loop(0, 3, Device::Cpu, |i| {
            if i == 1 {
                Err(BenchError::case(std::path::Path::new("x"), "boom"))
            } else {
                Ok(())
            }
        });
        assert!(err.unwrap_err().to_string().contains("boom"));
    }
}
