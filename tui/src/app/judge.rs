//! Verdicts the console draws from the history it keeps: is a GPU's memory flat, and which side
//! of the hidden-state queue bounds the run.
use dflash_shared::metrics::{QueueStats, TimestampMs};

use super::history::Series;

/// Memory is judged over this trailing window.
pub const MEMORY_WINDOW_MS: i64 = 10 * 60 * 1000;
/// A window needs this many samples over at least `MIN_SPAN_MS` before it is judged.
const MIN_SAMPLES: usize = 6;
const MIN_SPAN_MS: i64 = 2 * 60 * 1000;
/// Swings above this share of the device's memory (or of the peak, when the total is unknown)
/// are volatile. A healthy run on libtorch's caching allocator stays within a fraction of it.
pub const VOLATILE_SHARE: f64 = 0.02;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryVerdict {
    TooFewSamples,
    Flat { range_bytes: f64 },
    Volatile { range_bytes: f64, share: f64 },
}

pub fn memory_verdict(
    used_bytes: &Series,
    now_ms: TimestampMs,
    total_bytes: Option<u64>,
) -> MemoryVerdict {
    let window: Vec<(TimestampMs, f64)> = used_bytes
        .since(now_ms - MEMORY_WINDOW_MS)
        .copied()
        .collect();
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return MemoryVerdict::TooFewSamples;
    };
    if window.len() < MIN_SAMPLES || last.0 - first.0 < MIN_SPAN_MS {
        return MemoryVerdict::TooFewSamples;
    }
    let (lo, hi) = window
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &(_, v)| (lo.min(v), hi.max(v)));
    let range = hi - lo;
    let reference = total_bytes.map(|t| t as f64).unwrap_or(hi).max(1.0);
    let share = range / reference;
    if share > VOLATILE_SHARE {
        MemoryVerdict::Volatile {
            range_bytes: range,
            share,
        }
    } else {
        MemoryVerdict::Flat { range_bytes: range }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueueBound {
    Unknown,
    /// Neither side waits much on the other.
    Balanced,
    /// Drafters starve on an empty queue: the target workers are the bottleneck.
    TargetSide { starved_share: f64 },
    /// Target workers block on a full queue: the drafter workers are the bottleneck.
    DrafterSide { blocked_share: f64 },
}

/// Waiting below this share of wall time is noise.
const WAIT_NOISE_SHARE: f64 = 0.05;

/// Compares how much producers blocked and consumers starved between two samples; falls back
/// on the depth against the watermarks when the counters did not move.
pub fn queue_bound(previous: Option<&QueueStats>, current: &QueueStats) -> QueueBound {
    if let Some(previous) = previous {
        let elapsed = (current.ts_ms - previous.ts_ms) as f64;
        if elapsed > 0.0 {
            let blocked = (current.producer_blocked_ms - previous.producer_blocked_ms).max(0.0);
            let starved = (current.consumer_starved_ms - previous.consumer_starved_ms).max(0.0);
            let (blocked_share, starved_share) = (blocked / elapsed, starved / elapsed);
            if blocked_share.max(starved_share) >= WAIT_NOISE_SHARE {
                return if blocked_share >= starved_share {
                    QueueBound::DrafterSide { blocked_share }
                } else {
                    QueueBound::TargetSide { starved_share }
                };
            }
            return QueueBound::Balanced;
        }
    }
    if current.capacity == 0 {
        QueueBound::Unknown
    } else if current.depth >= current.high_watermark {
        QueueBound::DrafterSide { blocked_share: 0.0 }
    } else if current.depth == 0 {
        QueueBound::TargetSide { starved_share: 0.0 }
    } else {
        QueueBound::Balanced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    fn series(values: &[f64]) -> Series {
        let mut s = Series::new(100, i64::MAX);
        for (i, v) in values.iter().enumerate() {
            s.push(i as i64 * 30_000, *v);
        }
        s
    }

    #[test]
    fn steady_memory_is_flat_and_swinging_memory_is_volatile() {
        let steady = series(&[70.0 * GB, 70.1 * GB, 70.0 * GB, 70.05 * GB, 70.0 * GB, 70.1 * GB]);
        let now = 5 * 30_000;
        assert!(matches!(
            memory_verdict(&steady, now, Some(141_000_000_000)),
            MemoryVerdict::Flat { .. }
        ));
        let swinging = series(&[62.0 * GB, 75.0 * GB, 58.0 * GB, 80.0 * GB, 61.0 * GB, 77.0 * GB]);
        match memory_verdict(&swinging, now, Some(141_000_000_000)) {
            MemoryVerdict::Volatile { share, .. } => assert!((share - 22.0 / 141.0).abs() < 1e-6),
            other => panic!("expected volatile, got {other:?}"),
        }
    }

    #[test]
    fn a_short_or_sparse_window_is_not_judged() {
        let few = series(&[1.0, 100.0, 1.0]);
        assert_eq!(memory_verdict(&few, 60_000, None), MemoryVerdict::TooFewSamples);
        assert_eq!(memory_verdict(&Series::new(4, 1), 0, None), MemoryVerdict::TooFewSamples);
    }

    fn queue(ts_ms: i64, depth: usize, blocked: f64, starved: f64) -> QueueStats {
        QueueStats {
            ts_ms,
            depth,
            capacity: 64,
            high_watermark: 48,
            low_watermark: 8,
            producer_blocked_ms: blocked,
            consumer_starved_ms: starved,
            ..QueueStats::default()
        }
    }

    #[test]
    fn the_side_that_waits_less_bounds_the_run() {
        let a = queue(0, 40, 0.0, 0.0);
        let drafter_bound = queue(10_000, 48, 4_000.0, 0.0);
        assert!(matches!(
            queue_bound(Some(&a), &drafter_bound),
            QueueBound::DrafterSide { blocked_share } if (blocked_share - 0.4).abs() < 1e-9
        ));
        let target_bound = queue(10_000, 0, 0.0, 7_000.0);
        assert!(matches!(queue_bound(Some(&a), &target_bound), QueueBound::TargetSide { .. }));
        let balanced = queue(10_000, 20, 100.0, 100.0);
        assert_eq!(queue_bound(Some(&a), &balanced), QueueBound::Balanced);
    }

    #[test]
    fn without_a_previous_sample_the_depth_decides() {
        assert!(matches!(queue_bound(None, &queue(0, 60, 0.0, 0.0)), QueueBound::DrafterSide { .. }));
        assert!(matches!(queue_bound(None, &queue(0, 0, 0.0, 0.0)), QueueBound::TargetSide { .. }));
        assert_eq!(queue_bound(None, &queue(0, 20, 0.0, 0.0)), QueueBound::Balanced);
    }
}
