//! Queue diagnosis: which side of the hidden-state queue bounds the run.
//!
//! Over the last `window_s` seconds of [`QueueStats`] samples (whose blocked/starved times are
//! cumulative), the detector computes
//! - `consumer_starved_frac` = Δ consumer_starved_ms / (Δt · consumers): the share of drafter
//!   worker time spent waiting for hidden states,
//! - `producer_blocked_frac` = Δ producer_blocked_ms / (Δt · producers): the share of target
//!   worker time spent blocked on a full queue,
//! - the mean depth, against the midpoint of the low and high watermarks.
//!
//! **Target-bound**: drafters starved ≥ `starved_frac` and the queue mostly below the midpoint.
//! **Drafter-bound**: targets blocked ≥ `blocked_frac` and the queue mostly above it.
//! Otherwise **balanced**. One side always bounds a pipeline, so being bound is not an alert by
//! itself; the level goes to Warn only when the idle side wastes ≥ `waste_warn_frac` of its time
//! for `min_duration_s`, and back to Ok only after the same duration below the lower
//! `clear_waste_frac` × `waste_warn_frac` (0.8 × 50 % = 40 % by default), so a run whose waste
//! hovers at the warning threshold does not flap between Warn and Ok.
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{secs_to_ms, HeldSince, Level, Transition};
use crate::metrics::QueueStats;

pub const DETECTOR: &str = "queue";

/// When the diagnosis calls a side bound and when that is worth a warning: `[detectors.queue]`.
/// (Not the queue's own capacity and watermarks, which are `[queue]`.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueThresholds {
    pub window_s: f64,
    pub starved_frac: f64,
    pub blocked_frac: f64,
    pub waste_warn_frac: f64,
    pub min_duration_s: f64,
    /// Warn → Ok needs the waste below this fraction of `waste_warn_frac` for
    /// `min_duration_s` (absent from older configs: 0.8).
    pub clear_waste_frac: f64,
}

impl Default for QueueThresholds {
    fn default() -> Self {
        Self {
            window_s: 120.0,
            starved_frac: 0.10,
            blocked_frac: 0.10,
            waste_warn_frac: 0.5,
            min_duration_s: 120.0,
            clear_waste_frac: 0.8,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueBound {
    /// Target workers cannot produce hidden states fast enough; drafters wait.
    TargetBound,
    /// Drafter workers cannot consume fast enough; targets block on a full queue.
    DrafterBound,
    Balanced,
}

impl QueueBound {
    pub fn label(self) -> &'static str {
        match self {
            QueueBound::TargetBound => "target-bound",
            QueueBound::DrafterBound => "drafter-bound",
            QueueBound::Balanced => "balanced",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDiagnosis {
    pub bound: QueueBound,
    pub consumer_starved_frac: f64,
    pub producer_blocked_frac: f64,
    pub mean_depth: f64,
    pub low_watermark: usize,
    pub high_watermark: usize,
    pub window_ms: i64,
    /// e.g. "drafter workers waited for hidden states 42% of the time; queue mean depth 0.3
    /// (low watermark 4): target-bound".
    pub explanation: String,
}

#[derive(Debug, Clone)]
pub struct QueueDiagnoser {
    cfg: QueueThresholds,
    producers: usize,
    consumers: usize,
    samples: VecDeque<QueueStats>,
    level: Level,
    wasteful: HeldSince,
    not_wasteful: HeldSince,
}

impl QueueDiagnoser {
    /// `producers` = target workers, `consumers` = drafter workers.
    pub fn new(cfg: QueueThresholds, producers: usize, consumers: usize) -> Self {
        Self {
            cfg,
            producers: producers.max(1),
            consumers: consumers.max(1),
            samples: VecDeque::new(),
            level: Level::Ok,
            wasteful: HeldSince::default(),
            not_wasteful: HeldSince::default(),
        }
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn observe(&mut self, stats: &QueueStats) -> Option<Transition> {
        if let Some(last) = self.samples.back() {
            if stats.ts_ms <= last.ts_ms {
                return None;
            }
            // Counters went backwards: the daemon restarted its queue. Start a fresh window.
            if stats.producer_blocked_ms < last.producer_blocked_ms
                || stats.consumer_starved_ms < last.consumer_starved_ms
            {
                self.samples.clear();
            }
        }
        self.samples.push_back(stats.clone());
        let horizon = stats.ts_ms - secs_to_ms(self.cfg.window_s);
        // Keep one sample at or before the horizon so the deltas span the whole window.
        while self.samples.len() > 2 && self.samples[1].ts_ms <= horizon {
            self.samples.pop_front();
        }
        let diagnosis = self.diagnosis()?;
        let waste = match diagnosis.bound {
            QueueBound::TargetBound => diagnosis.consumer_starved_frac,
            QueueBound::DrafterBound => diagnosis.producer_blocked_frac,
            QueueBound::Balanced => 0.0,
        };
        let ts = stats.ts_ms;
        self.wasteful.update(waste >= self.cfg.waste_warn_frac, ts);
        self.not_wasteful.update(
            waste < self.cfg.waste_warn_frac * self.cfg.clear_waste_frac,
            ts,
        );
        let hold = secs_to_ms(self.cfg.min_duration_s);
        let next = match self.level {
            Level::Ok if self.wasteful.held_for(ts, hold) => Level::Warn,
            Level::Ok => Level::Ok,
            _ if self.not_wasteful.held_for(ts, hold) => Level::Ok,
            level => level,
        };
        if next == self.level {
            return None;
        }
        let from = std::mem::replace(&mut self.level, next);
        let message = match next {
            Level::Ok => format!("queue no longer wasteful: {}", diagnosis.explanation),
            _ => format!("queue imbalance: {}", diagnosis.explanation),
        };
        Some(Transition {
            detector: DETECTOR.into(),
            from,
            to: next,
            at_ms: ts,
            message,
        })
    }

    /// `None` until the window spans at least two samples.
    pub fn diagnosis(&self) -> Option<QueueDiagnosis> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let dt = (last.ts_ms - first.ts_ms) as f64;
        if dt <= 0.0 {
            return None;
        }
        let starved = (last.consumer_starved_ms - first.consumer_starved_ms).max(0.0)
            / (dt * self.consumers as f64);
        let blocked = (last.producer_blocked_ms - first.producer_blocked_ms).max(0.0)
            / (dt * self.producers as f64);
        // The first sample only anchors the deltas; depth is averaged over the rest.
        let depths: Vec<f64> = self
            .samples
            .iter()
            .skip(1)
            .map(|s| s.depth as f64)
            .collect();
        let mean_depth = depths.iter().sum::<f64>() / depths.len().max(1) as f64;
        let (low, high) = (last.low_watermark, last.high_watermark);
        let midpoint = (low + high) as f64 / 2.0;
        let bound =
            if starved >= self.cfg.starved_frac && mean_depth < midpoint && starved >= blocked {
                QueueBound::TargetBound
            } else if blocked >= self.cfg.blocked_frac && mean_depth >= midpoint {
                QueueBound::DrafterBound
            } else {
                QueueBound::Balanced
            };
        let explanation = format!(
            "drafter workers waited for hidden states {:.0}% of the time, target workers were \
             blocked on a full queue {:.0}%; mean depth {:.1} (watermarks {low}/{high}): {}",
            starved.min(1.0) * 100.0,
            blocked.min(1.0) * 100.0,
            mean_depth,
            bound.label()
        );
        Some(QueueDiagnosis {
            bound,
            consumer_starved_frac: starved,
            producer_blocked_frac: blocked,
            mean_depth,
            low_watermark: low,
            high_watermark: high,
            window_ms: last.ts_ms - first.ts_ms,
            explanation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drafters starved `starved` of each 10 s with the queue near empty (target-bound).
    fn run(
        q: &mut QueueDiagnoser,
        from_s: i64,
        to_s: i64,
        starved: impl Fn(i64) -> f64,
    ) -> Vec<Level> {
        let mut out = Vec::new();
        for s in (from_s..to_s).step_by(10) {
            let before = q.samples.back().map_or(0.0, |l| l.consumer_starved_ms);
            let stats = QueueStats {
                ts_ms: s * 1000,
                depth: 1,
                capacity: 64,
                high_watermark: 48,
                low_watermark: 8,
                consumer_starved_ms: before + starved(s) * 10_000.0,
                ..QueueStats::default()
            };
            out.extend(q.observe(&stats).map(|t| t.to));
        }
        out
    }

    #[test]
    fn waste_hovering_at_the_warning_threshold_warns_once_and_clears_only_well_below_it() {
        let mut q = QueueDiagnoser::new(QueueThresholds::default(), 1, 1);
        // 60 % wasted for 10 minutes: a warning.
        assert_eq!(run(&mut q, 0, 600, |_| 0.6), [Level::Warn]);
        // Then 45 % or 55 % in turn, five minutes each, for an hour: around the 50 % line,
        // never 2 minutes under the 40 % clear threshold.
        let hover = |s: i64| if (s / 300) % 2 == 0 { 0.45 } else { 0.55 };
        assert_eq!(run(&mut q, 600, 4200, hover), []);
        assert_eq!(q.level(), Level::Warn);
        // Under 40 % for two minutes: Ok.
        assert_eq!(run(&mut q, 4200, 4800, |_| 0.2), [Level::Ok]);
    }

    #[test]
    fn thresholds_written_before_the_clear_fraction_still_load() {
        let old: QueueThresholds = serde_json::from_str(
            r#"{"window_s": 60, "starved_frac": 0.2, "blocked_frac": 0.2,
                "waste_warn_frac": 0.6, "min_duration_s": 30}"#,
        )
        .expect("older thresholds load");
        assert_eq!(old.clear_waste_frac, 0.8);
    }
}
