//! Stale is never live: how old the newest sample of a stream is, and when that makes the
//! stream stale.
//!
//! **The rule.** A stream (the metrics lines, the GPU readings, the queue readings, the status
//! the daemon answers) is *stale* once its newest sample is older than
//!
//! `max(STALE_INTERVALS × the median interval between its last MEDIAN_OF samples, STALE_FLOOR_MS)`
//!
//! that is, three expected intervals and never under 10 s, so a stream sampled every 15 s is
//! stale after 45 s, one sampled every second after 10 s. A stream with fewer than two samples
//! has no interval yet and is judged against `FALLBACK_STALE_MS` (60 s). The median makes the
//! rule blind to the gaps it is there to find: one 14-minute gap among twenty 15-second
//! intervals leaves the expected interval at 15 s.
//!
//! The same threshold splits a chart's line: two consecutive samples further apart than it are
//! drawn with a gap between them, not joined by a ramp across it.
//!
//! "Now" is the console's clock: the wall clock when attached, the recording's clock in a replay
//! (`AppEvent::Tick`), so a replay shows staleness as it was at that moment of the recording.
use dflash_shared::metrics::TimestampMs;

use super::history::Series;

/// Stale after this many expected intervals without a sample.
pub const STALE_INTERVALS: i64 = 3;
/// Never stale sooner than this after the newest sample.
pub const STALE_FLOOR_MS: i64 = 10_000;
/// The threshold of a stream with no interval yet (fewer than two samples).
pub const FALLBACK_STALE_MS: i64 = 60_000;
/// The expected interval is the median of this many newest intervals.
pub const MEDIAN_OF: usize = 32;

/// How old a stream's newest sample is, and the age beyond which it is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    pub last_ms: TimestampMs,
    pub age_ms: i64,
    pub stale_after_ms: i64,
}

impl Freshness {
    pub fn is_stale(&self) -> bool {
        self.age_ms > self.stale_after_ms
    }
}

/// The median interval between the newest `MEDIAN_OF + 1` timestamps (oldest first); `None`
/// with fewer than two.
pub fn median_interval_ms(timestamps: &[TimestampMs]) -> Option<i64> {
    let from = timestamps.len().saturating_sub(MEDIAN_OF + 1);
    let mut gaps: Vec<i64> = timestamps[from..]
        .windows(2)
        .map(|w| (w[1] - w[0]).max(0))
        .collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    Some(gaps[gaps.len() / 2])
}

/// The staleness threshold for a stream whose expected interval is `median_ms`.
pub fn stale_after_ms(median_ms: Option<i64>) -> i64 {
    match median_ms {
        Some(median) => (STALE_INTERVALS * median).max(STALE_FLOOR_MS),
        None => FALLBACK_STALE_MS,
    }
}

/// The series' newest timestamps, oldest first (at most `MEDIAN_OF + 1`).
fn newest_timestamps(series: &Series) -> Vec<TimestampMs> {
    let skip = series.len().saturating_sub(MEDIAN_OF + 1);
    series.iter().skip(skip).map(|p| p.0).collect()
}

/// The threshold a series is judged by (and its chart split at).
pub fn series_threshold_ms(series: &Series) -> i64 {
    stale_after_ms(median_interval_ms(&newest_timestamps(series)))
}

/// The freshness of a series at `now_ms`; `None` before its first sample.
pub fn of_series(series: &Series, now_ms: TimestampMs) -> Option<Freshness> {
    let (last_ms, _) = series.last()?;
    Some(Freshness {
        last_ms,
        age_ms: (now_ms - last_ms).max(0),
        stale_after_ms: series_threshold_ms(series),
    })
}

/// Runs of consecutive points no more than `gap_ms` apart: the pieces a chart draws as lines.
/// Points are (time, value) sorted by time, in any time unit as long as `gap` is in the same.
pub fn split_at_gaps<T: Copy>(points: &[(f64, T)], gap: f64) -> Vec<&[(f64, T)]> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for i in 1..points.len() {
        if points[i].0 - points[i - 1].0 > gap {
            pieces.push(&points[start..i]);
            start = i;
        }
    }
    if start < points.len() {
        pieces.push(&points[start..]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(timestamps: &[i64]) -> Series {
        let mut s = Series::new(1000, i64::MAX);
        for &t in timestamps {
            s.push(t, 1.0);
        }
        s
    }

    #[test]
    fn three_expected_intervals_and_never_under_ten_seconds() {
        let every_15s: Vec<i64> = (0..40).map(|i| i * 15_000).collect();
        let s = series(&every_15s);
        assert_eq!(series_threshold_ms(&s), 45_000);
        let last = *every_15s.last().unwrap();
        assert!(!of_series(&s, last + 45_000).unwrap().is_stale());
        assert!(of_series(&s, last + 45_001).unwrap().is_stale());

        let every_second: Vec<i64> = (0..40).map(|i| i * 1_000).collect();
        assert_eq!(series_threshold_ms(&series(&every_second)), STALE_FLOOR_MS);

        assert_eq!(series_threshold_ms(&series(&[5])), FALLBACK_STALE_MS);
        assert!(of_series(&series(&[]), 0).is_none());
    }

    #[test]
    fn a_long_gap_does_not_move_the_expected_interval() {
        let mut t: Vec<i64> = (0..20).map(|i| i * 15_000).collect();
        let resumed = t.last().unwrap() + 14 * 60_000;
        t.extend((0..5).map(|i| resumed + i * 15_000));
        assert_eq!(median_interval_ms(&t), Some(15_000));
    }

    #[test]
    fn charts_split_where_samples_are_further_apart_than_the_threshold() {
        let points = [
            (0.0, 1.0),
            (15.0, 1.0),
            (30.0, 1.0),
            (900.0, 2.0),
            (915.0, 2.0),
        ];
        let pieces = split_at_gaps(&points, 45.0);
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].len(), 3);
        assert_eq!(pieces[1], &points[3..]);
        assert_eq!(split_at_gaps(&points, 1_000.0).len(), 1);
        assert!(split_at_gaps::<f64>(&[], 1.0).is_empty());
    }
}
