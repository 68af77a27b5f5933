//! The train-versus-serve gap: online chain τ (real speculative decoding against the target)
//! below the offline τ of the same moment by more than a fraction of the offline τ.
//!
//! Offline τ is measured with an anchor at every position of held-out data, continuing the
//! data's own text; online τ follows the target's own greedy continuation, as serving does.
//! A drafter whose training data the target did not write can score well on the first and
//! poorly on the second: that is the gap this detector reports.
//!
//! Judged per online evaluation, not per second: the level becomes Warn after `fire_after`
//! evaluations in a row whose gap exceeds `gap_fraction`, and returns to Ok only after
//! `clear_after` evaluations in a row back within the smaller `clear_fraction`. A gap between
//! the two fractions changes nothing, so a run hovering at the threshold never flaps.
use serde::{Deserialize, Serialize};

use super::{Level, Transition};
use crate::metrics::TimestampMs;

pub const DETECTOR: &str = "serve_gap";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeGapConfig {
    /// The gap that counts towards the alert: online chain τ lower than offline τ by more
    /// than this fraction of offline τ (0.15: online below 85 % of offline).
    pub gap_fraction: f64,
    /// The gap an alert clears within; smaller than `gap_fraction`, for hysteresis.
    pub clear_fraction: f64,
    /// Consecutive online evaluations beyond `gap_fraction` that raise the alert.
    pub fire_after: usize,
    /// Consecutive online evaluations within `clear_fraction` that clear it.
    pub clear_after: usize,
}

impl Default for ServeGapConfig {
    /// 15 %: an online τ is a mean over a small prompt set (16 by default), noisier from one
    /// evaluation to the next than the offline τ over every held-out position, so the
    /// threshold sits well above that noise and below the gaps the alert exists for (a drafter
    /// trained on text the target did not write). Two evaluations in a row: one unlucky prompt
    /// set never alerts. Clearing within 8 %, about half the threshold, keeps a gap that
    /// hovers at 15 % from flapping.
    fn default() -> Self {
        Self {
            gap_fraction: 0.15,
            clear_fraction: 0.08,
            fire_after: 2,
            clear_after: 2,
        }
    }
}

/// The figures of one judged online evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServeGapReading {
    pub step: u64,
    pub online_tau: f64,
    pub offline_tau: f64,
    /// `(offline − online) / offline`; negative when online is the higher.
    pub gap_fraction: f64,
}

#[derive(Debug, Clone)]
pub struct ServeGapDetector {
    cfg: ServeGapConfig,
    level: Level,
    /// Evaluations in a row beyond `gap_fraction` (while Ok).
    beyond: usize,
    /// Evaluations in a row within `clear_fraction` (while Warn).
    within: usize,
    last: Option<ServeGapReading>,
}

impl ServeGapDetector {
    pub fn new(cfg: ServeGapConfig) -> Self {
        Self {
            cfg,
            level: Level::Ok,
            beyond: 0,
            within: 0,
            last: None,
        }
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// The last evaluation judged.
    pub fn last(&self) -> Option<ServeGapReading> {
        self.last
    }

    /// One online evaluation at `step`: its chain τ and the offline τ it is compared with.
    /// A non-finite figure or an offline τ that is not positive is not judged.
    pub fn observe(
        &mut self,
        ts_ms: TimestampMs,
        step: u64,
        online_tau: f64,
        offline_tau: f64,
    ) -> Option<Transition> {
        if !(online_tau.is_finite() && offline_tau.is_finite() && offline_tau > 0.0) {
            return None;
        }
        let gap = (offline_tau - online_tau) / offline_tau;
        let reading = ServeGapReading {
            step,
            online_tau,
            offline_tau,
            gap_fraction: gap,
        };
        self.last = Some(reading);
        let next = match self.level {
            Level::Ok => {
                self.beyond = if gap > self.cfg.gap_fraction {
                    self.beyond + 1
                } else {
                    0
                };
                if self.beyond >= self.cfg.fire_after.max(1) {
                    Level::Warn
                } else {
                    Level::Ok
                }
            }
            _ => {
                self.within = if gap <= self.cfg.clear_fraction {
                    self.within + 1
                } else {
                    0
                };
                if self.within >= self.cfg.clear_after.max(1) {
                    Level::Ok
                } else {
                    self.level
                }
            }
        };
        if next == self.level {
            return None;
        }
        self.beyond = 0;
        self.within = 0;
        let from = std::mem::replace(&mut self.level, next);
        Some(Transition {
            detector: DETECTOR.into(),
            from,
            to: next,
            at_ms: ts_ms,
            message: self.describe(next, &reading),
        })
    }

    fn describe(&self, to: Level, r: &ServeGapReading) -> String {
        let pct = |f: f64| format!("{:.0}%", 100.0 * f);
        let (online, offline) = (r.online_tau, r.offline_tau);
        if to == Level::Ok {
            let relation = if r.gap_fraction > 0.0 {
                format!("{} below", pct(r.gap_fraction))
            } else {
                format!("{} above", pct(-r.gap_fraction))
            };
            format!(
                "serve gap closed: online chain τ {online:.2} is {relation} offline τ \
                 {offline:.2} at step {} (clears within {})",
                r.step,
                pct(self.cfg.clear_fraction)
            )
        } else {
            format!(
                "serve gap: online chain τ {online:.2} is {} below offline τ {offline:.2} at \
                 step {} (limit {}, {} online evaluations in a row); the drafter predicts the \
                 training data better than the target's own continuations",
                pct(r.gap_fraction),
                r.step,
                pct(self.cfg.gap_fraction),
                self.cfg.fire_after.max(1)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> ServeGapDetector {
        ServeGapDetector::new(ServeGapConfig::default())
    }

    /// Feeds one online evaluation per 100 steps: `(online, offline)` pairs.
    fn feed(d: &mut ServeGapDetector, from_step: u64, pairs: &[(f64, f64)]) -> Vec<Transition> {
        pairs
            .iter()
            .enumerate()
            .filter_map(|(i, &(on, off))| {
                let step = from_step + 100 * i as u64;
                d.observe(step as i64 * 1000, step, on, off)
            })
            .collect()
    }

    #[test]
    fn a_constructed_gap_fires_after_two_evaluations_with_its_figures() {
        let mut d = detector();
        let t = feed(&mut d, 100, &[(3.4, 3.5), (2.1, 3.5)]);
        assert!(
            t.is_empty(),
            "one evaluation beyond the limit is not enough"
        );
        let t = feed(&mut d, 300, &[(2.1, 3.5)]);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].from, t[0].to), (Level::Ok, Level::Warn));
        assert_eq!(
            t[0].message,
            "serve gap: online chain τ 2.10 is 40% below offline τ 3.50 at step 300 (limit 15%, \
             2 online evaluations in a row); the drafter predicts the training data better than \
             the target's own continuations"
        );
        assert_eq!(d.last().unwrap().gap_fraction, (3.5 - 2.1) / 3.5);
    }

    #[test]
    fn a_normal_run_stays_quiet() {
        let mut d = detector();
        // Online τ tracking offline τ as both rise, a little below, equal, or above it.
        let run: Vec<(f64, f64)> = (0..40)
            .map(|i| {
                let offline = 1.0 + 0.07 * f64::from(i);
                let online = offline * [0.92, 1.0, 1.04, 0.95][i as usize % 4];
                (online, offline)
            })
            .collect();
        assert!(feed(&mut d, 0, &run).is_empty());
        assert_eq!(d.level(), Level::Ok);
    }

    #[test]
    fn hysteresis_at_the_boundary() {
        let mut d = detector();
        // Exactly at the limit does not count; just beyond it does, but not when interrupted.
        let t = feed(
            &mut d,
            0,
            &[(8.5, 10.0), (8.49, 10.0), (8.6, 10.0), (8.49, 10.0)],
        );
        assert!(t.is_empty());
        let t = feed(&mut d, 400, &[(8.49, 10.0)]);
        assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), [Level::Warn]);
        // Between the clear and fire fractions: stays Warn however long.
        assert!(feed(&mut d, 500, &[(9.0, 10.0); 10]).is_empty());
        assert_eq!(d.level(), Level::Warn);
        // One evaluation back within 8 % is not enough; an interruption restarts the count.
        assert!(feed(&mut d, 1500, &[(9.3, 10.0), (9.0, 10.0), (9.3, 10.0)]).is_empty());
        let t = feed(&mut d, 1800, &[(10.5, 10.0)]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].to, Level::Ok);
        assert_eq!(
            t[0].message,
            "serve gap closed: online chain τ 10.50 is 5% above offline τ 10.00 at step 1800 \
             (clears within 8%)"
        );
    }

    #[test]
    fn unusable_figures_are_not_judged() {
        let mut d = detector();
        for (on, off) in [
            (f64::NAN, 3.0),
            (2.0, 0.0),
            (2.0, f64::INFINITY),
            (1.0, -1.0),
        ] {
            assert_eq!(d.observe(1, 1, on, off), None);
        }
        assert_eq!(d.last(), None);
        // They do not break a run of evaluations beyond the limit either.
        feed(&mut d, 0, &[(1.0, 3.0)]);
        d.observe(1, 1, f64::NAN, 3.0);
        assert_eq!(feed(&mut d, 200, &[(1.0, 3.0)]).len(), 1);
    }
}
