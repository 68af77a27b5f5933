//! Memory flatness per GPU: a healthy run's memory is flat once warm, because the caching
//! allocator keeps what it reserved. Volatile memory (the allocator freeing and re-reserving,
//! retrying failed allocations) is the signature of fragmentation or a changed stack.
//!
//! Statistic, over the samples of the last `window_s` seconds, after `warmup_s` from the first
//! sample of that GPU: the signal is NVML's `memory_used_bytes` (or the allocator's reserved
//! bytes when NVML cannot read it). The GPU is **volatile** when any of
//! - range (max − min) > `max_range_frac` × total memory,
//! - population stddev > `max_stddev_frac` × total memory,
//! - the allocator's cumulative `alloc_retries` grew inside the window;
//!
//! otherwise **flat**. "Total" is NVML's total memory, or the window's maximum when unknown.
//!
//! Hysteresis: a GPU enters volatile as soon as one of the limits above is crossed, and
//! returns to flat only once the range is below `clear_range_frac` × `max_range_frac`, the
//! stddev below `clear_stddev_frac` × `max_stddev_frac` and no retry grew, all of it held
//! for a whole `window_s`. With the defaults (0.8 of each limit) a GPU whose noise sits at
//! the 0.5 % stddev limit stays volatile instead of flipping at every sample that lands on
//! either side of it.
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::stats::mean_std;
use super::{secs_to_ms, HeldSince, Level, Transition};
use crate::format::format_bytes;
use crate::metrics::{GpuSample, TimestampMs};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    pub warmup_s: f64,
    pub window_s: f64,
    /// No verdict before the window holds this many samples.
    pub min_samples: usize,
    pub max_range_frac: f64,
    pub max_stddev_frac: f64,
    /// Volatile → flat needs the range below this fraction of `max_range_frac`, held for
    /// `window_s` (absent from older configs: 0.8).
    pub clear_range_frac: f64,
    /// Volatile → flat needs the stddev below this fraction of `max_stddev_frac`, held for
    /// `window_s` (absent from older configs: 0.8).
    pub clear_stddev_frac: f64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            warmup_s: 300.0,
            window_s: 600.0,
            min_samples: 20,
            max_range_frac: 0.02,
            max_stddev_frac: 0.005,
            clear_range_frac: 0.8,
            clear_stddev_frac: 0.8,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub samples: usize,
    pub window_ms: i64,
    pub mean_bytes: f64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub stddev_bytes: f64,
    pub total_bytes: u64,
    pub range_frac: f64,
    pub stddev_frac: f64,
    /// Growth of the allocator's retry counter inside the window; `None` without allocator stats.
    pub alloc_retries_delta: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum MemoryVerdict {
    /// Warming up, or too few samples in the window yet.
    Collecting {
        samples: usize,
    },
    /// Neither NVML nor the allocator reported memory for this GPU.
    Unavailable,
    Flat {
        stats: MemoryStats,
    },
    Volatile {
        stats: MemoryStats,
        reasons: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy)]
struct Point {
    ts: TimestampMs,
    used: u64,
    total: Option<u64>,
    retries: Option<u64>,
}

#[derive(Debug, Clone, Default)]
struct GpuWindow {
    first_ts: Option<TimestampMs>,
    points: VecDeque<Point>,
    volatile: bool,
    /// While volatile: since when every statistic has been below its clear threshold.
    clearing: HeldSince,
    saw_memory: bool,
}

/// Tracks every GPU it is fed samples of.
#[derive(Debug, Clone, Default)]
pub struct MemoryFlatness {
    cfg: MemoryConfig,
    gpus: BTreeMap<u32, GpuWindow>,
}

impl MemoryFlatness {
    pub fn new(cfg: MemoryConfig) -> Self {
        Self {
            cfg,
            gpus: BTreeMap::new(),
        }
    }

    pub fn detector_name(gpu_index: u32) -> String {
        format!("memory:gpu{gpu_index}")
    }

    pub fn observe(&mut self, sample: &GpuSample) -> Option<Transition> {
        let cfg = self.cfg.clone();
        let gpu = self.gpus.entry(sample.index).or_default();
        let first = *gpu.first_ts.get_or_insert(sample.ts_ms);
        let alloc = sample.allocator.as_ref();
        let used = sample.memory_used_bytes.or(alloc.map(|a| a.reserved_bytes));
        let used = used?;
        gpu.saw_memory = true;
        if gpu.points.back().is_some_and(|p| sample.ts_ms <= p.ts) {
            return None;
        }
        if sample.ts_ms - first < secs_to_ms(cfg.warmup_s) {
            return None;
        }
        gpu.points.push_back(Point {
            ts: sample.ts_ms,
            used,
            total: sample.memory_total_bytes,
            retries: alloc.map(|a| a.alloc_retries),
        });
        let horizon = sample.ts_ms - secs_to_ms(cfg.window_s);
        while gpu.points.front().is_some_and(|p| p.ts < horizon) {
            gpu.points.pop_front();
        }
        let judged = judge(&cfg, gpu)?;
        let volatile = if !judged.above.is_empty() {
            gpu.clearing.reset();
            true
        } else if gpu.volatile {
            gpu.clearing.update(judged.below_clear, sample.ts_ms);
            !gpu.clearing
                .held_for(sample.ts_ms, secs_to_ms(cfg.window_s))
        } else {
            false
        };
        if volatile == gpu.volatile {
            return None;
        }
        gpu.volatile = volatile;
        gpu.clearing.reset();
        let verdict = verdict_from(&cfg, gpu, judged);
        let (from, to) = if volatile {
            (Level::Ok, Level::Warn)
        } else {
            (Level::Warn, Level::Ok)
        };
        Some(Transition {
            detector: Self::detector_name(sample.index),
            from,
            to,
            at_ms: sample.ts_ms,
            message: describe(sample.index, &verdict),
        })
    }

    pub fn verdict(&self, gpu_index: u32) -> MemoryVerdict {
        match self.gpus.get(&gpu_index) {
            Some(gpu) if gpu.saw_memory => match judge(&self.cfg, gpu) {
                Some(judged) => verdict_from(&self.cfg, gpu, judged),
                None => MemoryVerdict::Collecting {
                    samples: gpu.points.len(),
                },
            },
            Some(_) => MemoryVerdict::Unavailable,
            None => MemoryVerdict::Collecting { samples: 0 },
        }
    }

    pub fn gpu_indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.gpus.keys().copied()
    }
}

/// The window's statistics, the limits they cross, and whether they are all below the clear
/// thresholds; `None` while the window holds too few samples.
struct Judged {
    stats: MemoryStats,
    /// Why the window is volatile by the entry limits (empty: within them).
    above: Vec<String>,
    /// Range and stddev below their clear thresholds and no retry in the window.
    below_clear: bool,
}

/// The verdict of a judged window: volatile when a limit is crossed, or while a GPU that
/// was volatile has not yet been below the clear thresholds for a whole window.
fn verdict_from(cfg: &MemoryConfig, gpu: &GpuWindow, judged: Judged) -> MemoryVerdict {
    let Judged { stats, above, .. } = judged;
    if !above.is_empty() {
        return MemoryVerdict::Volatile {
            stats,
            reasons: above,
        };
    }
    if gpu.volatile {
        let reason = format!(
            "not yet clear: flat again needs range under {:.1}% and stddev under {:.2}% of \
             total for {} (now {:.1}% and {:.2}%)",
            cfg.max_range_frac * cfg.clear_range_frac * 100.0,
            cfg.max_stddev_frac * cfg.clear_stddev_frac * 100.0,
            crate::format::format_duration_ms(secs_to_ms(cfg.window_s)),
            stats.range_frac * 100.0,
            stats.stddev_frac * 100.0,
        );
        return MemoryVerdict::Volatile {
            stats,
            reasons: vec![reason],
        };
    }
    MemoryVerdict::Flat { stats }
}

fn judge(cfg: &MemoryConfig, gpu: &GpuWindow) -> Option<Judged> {
    let n = gpu.points.len();
    if n < cfg.min_samples.max(2) {
        return None;
    }
    let used: Vec<f64> = gpu.points.iter().map(|p| p.used as f64).collect();
    let (mean, std) = mean_std(&used).unwrap_or((0.0, 0.0));
    let min = gpu.points.iter().map(|p| p.used).min().unwrap_or(0);
    let max = gpu.points.iter().map(|p| p.used).max().unwrap_or(0);
    let total = gpu
        .points
        .iter()
        .rev()
        .find_map(|p| p.total)
        .unwrap_or(max)
        .max(1);
    let retries: Vec<u64> = gpu.points.iter().filter_map(|p| p.retries).collect();
    let retries_delta = match (retries.first(), retries.last()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(*a)),
        _ => None,
    };
    let window_ms = gpu.points.back().map_or(0, |b| b.ts) - gpu.points.front().map_or(0, |f| f.ts);
    let stats = MemoryStats {
        samples: n,
        window_ms,
        mean_bytes: mean,
        min_bytes: min,
        max_bytes: max,
        stddev_bytes: std,
        total_bytes: total,
        range_frac: (max - min) as f64 / total as f64,
        stddev_frac: std / total as f64,
        alloc_retries_delta: retries_delta,
    };
    let mut reasons = Vec::new();
    if stats.range_frac > cfg.max_range_frac {
        reasons.push(format!(
            "range {} ({:.1}% of {}, limit {:.1}%)",
            format_bytes(max - min),
            stats.range_frac * 100.0,
            format_bytes(total),
            cfg.max_range_frac * 100.0
        ));
    }
    if stats.stddev_frac > cfg.max_stddev_frac {
        reasons.push(format!(
            "stddev {} ({:.2}% of total, limit {:.2}%)",
            format_bytes(std.round() as u64),
            stats.stddev_frac * 100.0,
            cfg.max_stddev_frac * 100.0
        ));
    }
    if let Some(d) = retries_delta.filter(|d| *d > 0) {
        reasons.push(format!(
            "{d} allocator retries (cache flushes) in the window"
        ));
    }
    let below_clear = stats.range_frac < cfg.max_range_frac * cfg.clear_range_frac
        && stats.stddev_frac < cfg.max_stddev_frac * cfg.clear_stddev_frac
        && retries_delta.unwrap_or(0) == 0;
    Some(Judged {
        stats,
        above: reasons,
        below_clear,
    })
}

fn describe(gpu_index: u32, verdict: &MemoryVerdict) -> String {
    match verdict {
        MemoryVerdict::Volatile { reasons, .. } => {
            format!("GPU {gpu_index} memory volatile: {}", reasons.join("; "))
        }
        MemoryVerdict::Flat { stats } => format!(
            "GPU {gpu_index} memory flat again: range {} over {} samples",
            format_bytes(stats.max_bytes - stats.min_bytes),
            stats.samples
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{AllocatorStats, DeviceRole};

    const TOTAL: u64 = 150_000_000_000;

    fn sample(ts_s: i64, used: Option<u64>, retries: Option<u64>) -> GpuSample {
        GpuSample {
            ts_ms: ts_s * 1000,
            index: 3,
            name: "NVIDIA H200".into(),
            uuid: None,
            role: DeviceRole::Drafter,
            memory_used_bytes: used,
            memory_total_bytes: used.map(|_| TOTAL),
            utilization_pct: None,
            power_w: None,
            temperature_c: None,
            allocator: retries.map(|r| AllocatorStats {
                alloc_retries: r,
                reserved_bytes: 90_000_000_000,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn flat_then_retries_make_it_volatile_then_a_clean_window_clears_it() {
        let mut m = MemoryFlatness::new(MemoryConfig::default());
        let mut transitions = Vec::new();
        for t in 0..1000 {
            transitions.extend(m.observe(&sample(t, Some(120_000_000_000), Some(4))));
        }
        assert!(transitions.is_empty());
        assert!(matches!(m.verdict(3), MemoryVerdict::Flat { .. }));
        transitions.extend(m.observe(&sample(1000, Some(120_000_000_000), Some(6))));
        assert_eq!(transitions.len(), 1);
        assert_eq!(transitions[0].detector, "memory:gpu3");
        assert_eq!(
            transitions[0].message,
            "GPU 3 memory volatile: 2 allocator retries (cache flushes) in the window"
        );
        // The retry stays inside the 600 s window until 1600 s; from then on the window is
        // clean, and flat again takes that held for a whole window more.
        let mut later = Vec::new();
        for t in 1001..2300 {
            later.extend(
                m.observe(&sample(t, Some(120_000_000_000), Some(6)))
                    .map(|t| (t.at_ms, t.to)),
            );
        }
        assert_eq!(later, [(2_200_000, Level::Ok)]);
        assert!(matches!(m.verdict(3), MemoryVerdict::Flat { .. }));
    }

    #[test]
    fn without_any_memory_reading_it_says_unavailable() {
        let mut m = MemoryFlatness::new(MemoryConfig::default());
        for t in 0..1000 {
            assert!(m.observe(&sample(t, None, None)).is_none());
        }
        assert_eq!(m.verdict(3), MemoryVerdict::Unavailable);
        assert_eq!(m.verdict(9), MemoryVerdict::Collecting { samples: 0 });
    }

    #[test]
    fn allocator_reserved_is_the_fallback_signal() {
        let mut m = MemoryFlatness::new(MemoryConfig::default());
        for t in 0..400 {
            m.observe(&sample(t, None, Some(0)));
        }
        let MemoryVerdict::Flat { stats } = m.verdict(3) else {
            panic!("{:?}", m.verdict(3))
        };
        assert_eq!(stats.max_bytes, 90_000_000_000);
        assert_eq!(stats.alloc_retries_delta, Some(0));
    }

    /// splitmix64 → a roughly normal deviate (Irwin–Hall of 12), seeded and portable.
    struct Noise(u64);
    impl Noise {
        fn unit(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            (0..12).map(|_| self.unit()).sum::<f64>() - 6.0
        }
    }

    #[test]
    fn noise_at_the_stddev_limit_enters_volatile_once_instead_of_flapping() {
        let cfg = MemoryConfig::default();
        let limit = cfg.max_stddev_frac;
        let mut m = MemoryFlatness::new(cfg);
        let mut noise = Noise(7);
        // One sample every 30 s for four hours, its spread right at the 0.5 % stddev limit
        // (and so near the 2 % range limit too), with no allocator retry.
        let sigma = limit * TOTAL as f64;
        let (mut transitions, mut crossings, mut above_before) = (Vec::new(), 0, None);
        for i in 0..480 {
            let used = (100e9 + sigma * noise.normal()) as u64;
            transitions.extend(m.observe(&sample(i * 30, Some(used), None)));
            let stats = match m.verdict(3) {
                MemoryVerdict::Flat { stats } | MemoryVerdict::Volatile { stats, .. } => stats,
                _ => continue,
            };
            let above = stats.stddev_frac > limit || stats.range_frac > 0.02;
            if above_before.is_some_and(|b| b != above) {
                crossings += 1;
            }
            above_before = Some(above);
        }
        // The window's statistics cross the limits again and again: a detector that judged
        // each window by the entry limits alone journaled every one of these crossings ...
        assert!(
            crossings >= 20,
            "{crossings} crossings: the trace is not at the limit"
        );
        // ... where this one went volatile once, and back to flat only after a whole window
        // under 0.8 of each limit, once in four hours.
        let levels: Vec<Level> = transitions.iter().map(|t| t.to).collect();
        assert_eq!(
            levels,
            [Level::Warn, Level::Ok, Level::Warn],
            "{crossings} crossings; {transitions:?}"
        );
        assert!(matches!(m.verdict(3), MemoryVerdict::Volatile { .. }));
    }

    #[test]
    fn a_volatile_gpu_between_the_clear_and_the_entry_threshold_says_why_it_is_not_flat() {
        let mut m = MemoryFlatness::new(MemoryConfig::default());
        let base = 100_000_000_000_u64;
        let frac = |f: f64| (f * TOTAL as f64) as u64;
        let mut levels = Vec::new();
        let mut feed = |m: &mut MemoryFlatness, i: i64, used: u64| {
            levels.extend(
                m.observe(&sample(i * 30, Some(used), None))
                    .map(|t| (t.at_ms / 30_000, t.to)),
            );
        };
        // ±1.25 % of total every other sample: far beyond both limits.
        for i in 0..40 {
            feed(
                &mut m,
                i,
                if i % 2 == 0 { base + frac(0.025) } else { base },
            );
        }
        // Then one sample in 21 (exactly one in every 600 s window) 1.8 % higher: a range
        // under the 2 % entry limit but over the 1.6 % clear threshold, stddev 0.38 %.
        for i in 40..200 {
            feed(
                &mut m,
                i,
                if i % 21 == 0 {
                    base + frac(0.018)
                } else {
                    base
                },
            );
        }
        let MemoryVerdict::Volatile { reasons, stats } = m.verdict(3) else {
            panic!("{:?}", m.verdict(3))
        };
        assert!(
            stats.range_frac < 0.02 && stats.range_frac > 0.016,
            "{stats:?}"
        );
        assert!(stats.stddev_frac < 0.004, "{stats:?}");
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(
            reasons[0].starts_with(
                "not yet clear: flat again needs range under 1.6% and stddev under 0.40%"
            ),
            "{reasons:?}"
        );
        // Flat from i = 200: the last spike (i = 189) leaves the window at i = 210, and the
        // window is clean for 600 s more at i = 230.
        for i in 200..260 {
            feed(&mut m, i, base);
        }
        assert_eq!(levels.len(), 2, "{levels:?}");
        assert_eq!(levels[0].1, Level::Warn);
        assert_eq!(levels[1], (230, Level::Ok));
        assert!(matches!(m.verdict(3), MemoryVerdict::Flat { .. }));
    }

    #[test]
    fn configs_written_before_the_clear_thresholds_still_load() {
        let old: MemoryConfig = serde_json::from_str(
            r#"{"warmup_s": 60, "window_s": 300, "min_samples": 10,
                "max_range_frac": 0.03, "max_stddev_frac": 0.01}"#,
        )
        .expect("an older config loads");
        assert_eq!((old.clear_range_frac, old.clear_stddev_frac), (0.8, 0.8));
        assert_eq!(old.window_s, 300.0);
    }
}
