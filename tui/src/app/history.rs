//! Bounded time series for charts: points older than the retention, or beyond the capacity,
//! fall off the front.
use std::collections::VecDeque;

use dflash_shared::metrics::TimestampMs;

#[derive(Debug, Clone)]
pub struct Series {
    points: VecDeque<(TimestampMs, f64)>,
    capacity: usize,
    retention_ms: i64,
}

impl Series {
    pub fn new(capacity: usize, retention_ms: i64) -> Self {
        Self {
            points: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
            retention_ms,
        }
    }

    /// Appends a point. A point older than the newest one (a replayed or reordered frame) is
    /// dropped, so the series stays sorted by time.
    pub fn push(&mut self, ts_ms: TimestampMs, value: f64) {
        if !value.is_finite() {
            return;
        }
        if let Some(&(last_ts, _)) = self.points.back() {
            if ts_ms < last_ts {
                return;
            }
        }
        self.points.push_back((ts_ms, value));
        while self.points.len() > self.capacity {
            self.points.pop_front();
        }
        while let Some(&(first_ts, _)) = self.points.front() {
            if ts_ms - first_ts > self.retention_ms {
                self.points.pop_front();
            } else {
                break;
            }
        }
    }

    pub fn last(&self) -> Option<(TimestampMs, f64)> {
        self.points.back().copied()
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &(TimestampMs, f64)> {
        self.points.iter()
    }

    /// Points with `ts >= since_ms`.
    pub fn since(&self, since_ms: TimestampMs) -> impl Iterator<Item = &(TimestampMs, f64)> {
        let start = self.points.partition_point(|&(ts, _)| ts < since_ms);
        self.points.range(start..)
    }

    /// (min, max) of the values, or `None` when empty.
    pub fn bounds(&self) -> Option<(f64, f64)> {
        self.points.iter().fold(None, |acc, &(_, v)| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
    }

    /// Points as (seconds relative to `now_ms`, value), for a chart whose x axis ends at now.
    pub fn relative_to(&self, now_ms: TimestampMs) -> Vec<(f64, f64)> {
        self.points
            .iter()
            .map(|&(ts, v)| ((ts - now_ms) as f64 / 1000.0, v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_retention_both_trim_the_front() {
        let mut series = Series::new(3, 10_000);
        for (ts, v) in [(0, 1.0), (1_000, 2.0), (2_000, 3.0), (3_000, 4.0)] {
            series.push(ts, v);
        }
        assert_eq!(
            series.iter().map(|p| p.1).collect::<Vec<_>>(),
            vec![2.0, 3.0, 4.0]
        );
        series.push(12_500, 5.0);
        assert_eq!(
            series.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![3_000, 12_500]
        );
    }

    #[test]
    fn out_of_order_and_non_finite_points_are_dropped() {
        let mut series = Series::new(10, i64::MAX);
        series.push(5, 1.0);
        series.push(4, 2.0);
        series.push(6, f64::NAN);
        assert_eq!(series.len(), 1);
        assert_eq!(series.last(), Some((5, 1.0)));
    }

    #[test]
    fn since_and_bounds_and_relative_times() {
        let mut series = Series::new(10, i64::MAX);
        for (ts, v) in [(1_000, 4.0), (2_000, -1.0), (3_000, 9.0)] {
            series.push(ts, v);
        }
        assert_eq!(series.since(2_000).count(), 2);
        assert_eq!(series.bounds(), Some((-1.0, 9.0)));
        assert_eq!(series.relative_to(3_000)[0], (-2.0, 4.0));
    }
}
