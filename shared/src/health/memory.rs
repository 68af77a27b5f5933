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
//! Volatile → flat needs a whole window of flat samples, which is the hysteresis.
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::stats::mean_std;
use super::{secs_to_ms, Level, Transition};
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
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            warmup_s: 300.0,
            window_s: 600.0,
            min_samples: 20,
            max_range_frac: 0.02,
            max_stddev_frac: 0.005,
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
        let verdict = verdict_of(&cfg, gpu);
        let volatile = match &verdict {
            MemoryVerdict::Volatile { .. } => true,
            MemoryVerdict::Flat { .. } => false,
            _ => return None,
        };
        if volatile == gpu.volatile {
            return None;
        }
        gpu.volatile = volatile;
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
            Some(gpu) if gpu.saw_memory => verdict_of(&self.cfg, gpu),
            Some(_) => MemoryVerdict::Unavailable,
            None => MemoryVerdict::Collecting { samples: 0 },
        }
    }

    pub fn gpu_indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.gpus.keys().copied()
    }
}

fn verdict_of(cfg: &MemoryConfig, gpu: &GpuWindow) -> MemoryVerdict {
    let n = gpu.points.len();
    if n < cfg.min_samples.max(2) {
        return MemoryVerdict::Collecting { samples: n };
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
    if reasons.is_empty() {
        MemoryVerdict::Flat { stats }
    } else {
        MemoryVerdict::Volatile { stats, reasons }
    }
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
        // The retry stays inside the 600 s window; it clears once it has left.
        let mut later = Vec::new();
        for t in 1001..1700 {
            later.extend(
                m.observe(&sample(t, Some(120_000_000_000), Some(6)))
                    .map(|t| (t.at_ms, t.to)),
            );
        }
        assert_eq!(later, [(1_600_000, Level::Ok)]);
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
}
