//! Throughput regression against a baseline, with Ok/Warn/Crit hysteresis.
//!
//! The judged value is the rolling median of the last `smoothing_samples` tok/s samples, as a
//! ratio of the baseline. The baseline is, in order:
//! - pinned by the config (`pinned_baseline_tokens_per_s`);
//! - the healthy record's figure ([`ThroughputReference`], from this run dir before a restart
//!   or from the last healthy run of the same recipe on this machine), or the rolling baseline
//!   when that is higher: a restarted daemon never learns a slow rate as normal, and a run
//!   that got faster is judged against its own new pace;
//! - the rolling baseline alone: the median of all post-warmup samples in the last
//!   `baseline_window_s` that were taken while the detector was Ok and no escalation was
//!   pending, so a regression never drags its own baseline down.
//!
//! With a pinned or recorded baseline there is nothing to learn: the first post-warmup sample
//! is judged.
//!
//! Levels are entered when the ratio has stayed below `warn_below` / `crit_below` for
//! `warn_after_s` / `crit_after_s`, and left only when it has stayed at or above the higher
//! `*_clear_above` thresholds for `clear_after_s`.
//!
//! Detection bound: with samples every `Δ` seconds and a step change at `t0`, the rolling
//! median crosses once more than half of the smoothing window holds post-change samples, i.e.
//! by `t0 + (⌊k/2⌋ + 1)·Δ` for `k = smoothing_samples`, and the level is raised at the first
//! sample at least `*_after_s` later (with a recorded or pinned baseline, `t0` is at the latest
//! the end of warmup for a run that starts slow). So a collapse is Crit no later than
//! `t0 + (⌊k/2⌋ + 2)·Δ + crit_after_s` (defaults, Δ = 1 s: 24 s), a drop below `warn_below`
//! is Warn no later than `t0 + (⌊k/2⌋ + 2)·Δ + warn_after_s` (64 s). Sample gaps longer than
//! `max_sample_gap_s` (a pause, an evaluation) restart the duration clocks.
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::healthy_record::ThroughputReference;
use super::stats::median;
use super::{secs_to_ms, HeldSince, Level, Transition};
use crate::format::format_tokens_per_s;
use crate::metrics::TimestampMs;

pub const DETECTOR: &str = "throughput";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ThroughputConfig {
    /// Samples in the first seconds after the first one are ignored (compilation, warmup).
    pub warmup_s: f64,
    /// Rolling-median width, in samples, applied before judging.
    pub smoothing_samples: usize,
    /// Rolling baseline: median of healthy samples in this window.
    pub baseline_window_s: f64,
    /// No judgement until the baseline rests on this many samples.
    pub min_baseline_samples: usize,
    /// Baseline pinned from an earlier run; when set, the rolling baseline is not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_baseline_tokens_per_s: Option<f64>,
    pub warn_below: f64,
    pub warn_clear_above: f64,
    pub crit_below: f64,
    pub crit_clear_above: f64,
    pub warn_after_s: f64,
    pub crit_after_s: f64,
    pub clear_after_s: f64,
    pub max_sample_gap_s: f64,
}

impl Default for ThroughputConfig {
    fn default() -> Self {
        Self {
            warmup_s: 120.0,
            smoothing_samples: 5,
            baseline_window_s: 1800.0,
            min_baseline_samples: 20,
            pinned_baseline_tokens_per_s: None,
            warn_below: 0.80,
            warn_clear_above: 0.90,
            crit_below: 0.40,
            crit_clear_above: 0.50,
            warn_after_s: 60.0,
            crit_after_s: 20.0,
            clear_after_s: 120.0,
            max_sample_gap_s: 60.0,
        }
    }
}

/// What the console shows next to the big tok/s number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThroughputStatus {
    pub level: Level,
    /// Since when the current level holds.
    pub since_ms: Option<TimestampMs>,
    pub smoothed_tokens_per_s: Option<f64>,
    pub baseline_tokens_per_s: Option<f64>,
    pub baseline_pinned: bool,
    /// Where the baseline came from when it is not learned in this process: "pinned by …", or
    /// the healthy record's "this recipe ran at 21.5K tok/s here on …" (and its adjustment for
    /// another length mix). `None` for a baseline learned from this process's own samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_source: Option<String>,
    /// True until warmup is over and the baseline has enough samples.
    pub learning: bool,
    /// The smoothed rate is below `warn_below` and its duration is being timed: no alert yet,
    /// but not healthy either. What the healthy record must not learn from: a collapse takes
    /// up to `warn_after_s` to be called, and those samples are the slow rate.
    #[serde(default)]
    pub escalating: bool,
}

#[derive(Debug, Clone)]
pub struct ThroughputDetector {
    cfg: ThroughputConfig,
    /// The healthy record's expectation, when one applies to this run.
    reference: Option<ThroughputReference>,
    first_ts: Option<TimestampMs>,
    last_ts: Option<TimestampMs>,
    recent: VecDeque<f64>,
    healthy: VecDeque<(TimestampMs, f64)>,
    level: Level,
    level_since: Option<TimestampMs>,
    below_warn: HeldSince,
    below_crit: HeldSince,
    above_warn_clear: HeldSince,
    above_crit_clear: HeldSince,
    smoothed: Option<f64>,
}

impl ThroughputDetector {
    pub fn new(cfg: ThroughputConfig) -> Self {
        Self {
            cfg,
            reference: None,
            first_ts: None,
            last_ts: None,
            recent: VecDeque::new(),
            healthy: VecDeque::new(),
            level: Level::Ok,
            level_since: None,
            below_warn: HeldSince::default(),
            below_crit: HeldSince::default(),
            above_warn_clear: HeldSince::default(),
            above_crit_clear: HeldSince::default(),
            smoothed: None,
        }
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// Judge against a healthy record's expectation from now on (`None`: learn as before).
    pub fn set_reference(&mut self, reference: Option<ThroughputReference>) {
        self.reference = reference.filter(|r| r.tokens_per_s.is_finite() && r.tokens_per_s > 0.0);
    }

    pub fn reference(&self) -> Option<&ThroughputReference> {
        self.reference.as_ref()
    }

    /// A confirmed forget of the healthy record at `ts_ms`: judge against this process's own
    /// rate from now on. Where that rate has no baseline yet (a run that came up slow against
    /// the record has recorded no healthy sample), the detector learns again from the next
    /// sample and an alert it raised ends now, since nothing is left to hold it against.
    /// Where this process has a baseline of its own (a collapse inside the run), the alert
    /// stays for it to judge.
    pub fn forget_reference(&mut self, ts_ms: TimestampMs) -> Option<Transition> {
        self.reference.take()?;
        self.reset_clocks();
        if self.rolling_baseline().is_some() || self.level == Level::Ok {
            return None;
        }
        let from = std::mem::replace(&mut self.level, Level::Ok);
        self.level_since = Some(ts_ms);
        Some(Transition {
            detector: DETECTOR.into(),
            from,
            to: Level::Ok,
            at_ms: ts_ms,
            message: "throughput judged anew: the healthy record was forgotten by a confirmed \
                      action, and the baseline is learned from this run's own rate"
                .into(),
        })
    }

    fn rolling_baseline(&self) -> Option<f64> {
        if self.healthy.len() < self.cfg.min_baseline_samples.max(1) {
            return None;
        }
        median(self.healthy.iter().map(|&(_, v)| v))
    }

    /// The baseline in force and, when it is not this process's own learning, where it came
    /// from.
    fn baseline_and_source(&self) -> (Option<f64>, Option<String>) {
        if let Some(pinned) = self.cfg.pinned_baseline_tokens_per_s {
            return (
                Some(pinned),
                Some("pinned by detectors.throughput.pinned_baseline_tokens_per_s".into()),
            );
        }
        let rolling = self.rolling_baseline();
        match (&self.reference, rolling) {
            (Some(r), Some(b)) if b > r.tokens_per_s => (Some(b), None),
            (Some(r), _) => (Some(r.tokens_per_s), Some(reference_sentence(r))),
            (None, b) => (b, None),
        }
    }

    pub fn baseline(&self) -> Option<f64> {
        self.baseline_and_source().0
    }

    pub fn status(&self) -> ThroughputStatus {
        let (baseline, baseline_source) = self.baseline_and_source();
        ThroughputStatus {
            level: self.level,
            since_ms: self.level_since,
            smoothed_tokens_per_s: self.smoothed,
            baseline_tokens_per_s: baseline,
            baseline_pinned: self.cfg.pinned_baseline_tokens_per_s.is_some(),
            baseline_source,
            learning: baseline.is_none() || self.in_warmup(self.last_ts.unwrap_or(0)),
            escalating: self.below_warn.since().is_some(),
        }
    }

    fn in_warmup(&self, ts_ms: TimestampMs) -> bool {
        match self.first_ts {
            Some(first) => ts_ms - first < secs_to_ms(self.cfg.warmup_s),
            None => true,
        }
    }

    /// Feeds one sample (all workers together). Non-finite or negative values are ignored.
    pub fn observe(&mut self, ts_ms: TimestampMs, tokens_per_s: f64) -> Option<Transition> {
        if !tokens_per_s.is_finite() || tokens_per_s < 0.0 {
            return None;
        }
        if self.last_ts.is_some_and(|last| ts_ms <= last) {
            return None; // out of order or duplicate: the clocks only move forward
        }
        let first = *self.first_ts.get_or_insert(ts_ms);
        if self.level_since.is_none() {
            self.level_since = Some(first);
        }
        if self
            .last_ts
            .is_some_and(|last| ts_ms - last > secs_to_ms(self.cfg.max_sample_gap_s))
        {
            self.reset_clocks();
        }
        self.last_ts = Some(ts_ms);
        if self.in_warmup(ts_ms) {
            return None;
        }

        self.recent.push_back(tokens_per_s);
        while self.recent.len() > self.cfg.smoothing_samples.max(1) {
            self.recent.pop_front();
        }
        let smoothed = median(self.recent.iter().copied())?;
        self.smoothed = Some(smoothed);

        let Some(baseline) = self.baseline().filter(|b| *b > 0.0) else {
            self.record_healthy(ts_ms, tokens_per_s);
            return None;
        };
        let ratio = smoothed / baseline;
        self.below_warn.update(ratio < self.cfg.warn_below, ts_ms);
        self.below_crit.update(ratio < self.cfg.crit_below, ts_ms);
        self.above_warn_clear
            .update(ratio >= self.cfg.warn_clear_above, ts_ms);
        self.above_crit_clear
            .update(ratio >= self.cfg.crit_clear_above, ts_ms);

        let next = self.next_level(ts_ms);
        if self.level == Level::Ok && next == Level::Ok && self.below_warn.since().is_none() {
            self.record_healthy(ts_ms, tokens_per_s);
        }
        if next == self.level {
            return None;
        }
        let from = std::mem::replace(&mut self.level, next);
        self.level_since = Some(ts_ms);
        Some(Transition {
            detector: DETECTOR.into(),
            from,
            to: next,
            at_ms: ts_ms,
            message: self.describe(from, next, smoothed, baseline),
        })
    }

    fn next_level(&self, ts: TimestampMs) -> Level {
        let c = &self.cfg;
        let crit = self.below_crit.held_for(ts, secs_to_ms(c.crit_after_s));
        let warn = self.below_warn.held_for(ts, secs_to_ms(c.warn_after_s));
        let clear_ms = secs_to_ms(c.clear_after_s);
        match self.level {
            _ if crit => Level::Crit,
            Level::Ok if warn => Level::Warn,
            Level::Ok => Level::Ok,
            _ if self.above_warn_clear.held_for(ts, clear_ms) => Level::Ok,
            Level::Crit if self.above_crit_clear.held_for(ts, clear_ms) => Level::Warn,
            level => level,
        }
    }

    fn record_healthy(&mut self, ts_ms: TimestampMs, tokens_per_s: f64) {
        self.healthy.push_back((ts_ms, tokens_per_s));
        let horizon = ts_ms - secs_to_ms(self.cfg.baseline_window_s);
        while self.healthy.front().is_some_and(|&(t, _)| t < horizon) {
            self.healthy.pop_front();
        }
    }

    fn reset_clocks(&mut self) {
        self.below_warn.reset();
        self.below_crit.reset();
        self.above_warn_clear.reset();
        self.above_crit_clear.reset();
    }

    fn describe(&self, from: Level, to: Level, smoothed: f64, baseline: f64) -> String {
        let pct = (smoothed / baseline * 100.0).round();
        let now = format_tokens_per_s(smoothed);
        let base = format_tokens_per_s(baseline);
        let headline = headline(from, to, &now, pct, &base);
        match self.baseline_and_source().1 {
            Some(source) if self.reference.is_some() => format!("{headline}; {source}"),
            _ => headline,
        }
    }
}

fn headline(from: Level, to: Level, now: &str, pct: f64, base: &str) -> String {
    match to {
        Level::Ok => format!("throughput recovered: {now} tok/s, {pct}% of baseline {base}"),
        _ if to > from => format!(
            "throughput {now} tok/s is {pct}% of baseline {base} ({})",
            to.label()
        ),
        _ => format!(
            "throughput eased to {now} tok/s, {pct}% of baseline {base} ({})",
            to.label()
        ),
    }
}

/// "this run ran at 21.5K tok/s here on …", with the length-mix adjustment when there was one.
fn reference_sentence(r: &ThroughputReference) -> String {
    match &r.adjustment {
        Some(a) => format!("{} ({a})", r.source),
        None => r.source.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> ThroughputDetector {
        ThroughputDetector::new(ThroughputConfig::default())
    }

    /// Feeds one sample per second for `secs` seconds starting at `t0_s`.
    fn feed(d: &mut ThroughputDetector, t0_s: i64, secs: i64, value: f64) -> Vec<Transition> {
        (0..secs)
            .filter_map(|i| d.observe((t0_s + i) * 1000, value))
            .collect()
    }

    #[test]
    fn learns_the_baseline_after_warmup() {
        let mut d = detector();
        assert!(feed(&mut d, 0, 130, 21_500.0).is_empty());
        assert_eq!(d.baseline(), None, "only 10 post-warmup samples");
        feed(&mut d, 130, 20, 21_500.0);
        assert_eq!(d.baseline(), Some(21_500.0));
        assert!(!d.status().learning);
    }

    #[test]
    fn pinned_baseline_judges_a_run_that_starts_slow() {
        let cfg = ThroughputConfig {
            pinned_baseline_tokens_per_s: Some(21_500.0),
            ..Default::default()
        };
        let mut d = ThroughputDetector::new(cfg);
        let t = feed(&mut d, 0, 400, 12_800.0);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].to, Level::Warn);
        assert_eq!(
            t[0].message,
            "throughput 12.8K tok/s is 60% of baseline 21.5K (Warn)"
        );
    }

    #[test]
    fn a_short_stall_is_not_a_regression() {
        let mut d = detector();
        feed(&mut d, 0, 600, 21_500.0);
        // A 15 s checkpoint stall at zero throughput: below Crit for < crit_after_s.
        assert!(feed(&mut d, 600, 15, 0.0).is_empty());
        assert!(feed(&mut d, 615, 300, 21_500.0).is_empty());
        assert_eq!(d.level(), Level::Ok);
    }

    #[test]
    fn hysteresis_holds_warn_between_the_thresholds() {
        let mut d = detector();
        feed(&mut d, 0, 600, 20_000.0);
        let t = feed(&mut d, 600, 120, 15_000.0); // 75%: below warn_below 80%
        assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), [Level::Warn]);
        // 85% is above warn_below but below warn_clear_above: stays Warn, no flapping.
        assert!(feed(&mut d, 720, 1_000, 17_000.0).is_empty());
        assert_eq!(d.level(), Level::Warn);
        let t = feed(&mut d, 1_720, 200, 19_000.0); // 95%
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].to, Level::Ok);
        assert_eq!(
            t[0].message,
            "throughput recovered: 19.0K tok/s, 95% of baseline 20.0K"
        );
    }

    #[test]
    fn a_gap_restarts_the_duration_clocks() {
        let mut d = detector();
        feed(&mut d, 0, 600, 21_500.0);
        // 50 s slow, a 5-minute silence, 50 s slow again: never 60 s continuous.
        assert!(feed(&mut d, 600, 50, 15_000.0).is_empty());
        assert!(feed(&mut d, 950, 50, 15_000.0).is_empty());
        assert_eq!(d.level(), Level::Ok);
    }

    #[test]
    fn bad_samples_are_ignored() {
        let mut d = detector();
        feed(&mut d, 0, 600, 21_500.0);
        assert_eq!(d.observe(601_000, f64::NAN), None);
        assert_eq!(d.observe(599_000, 1.0), None, "out of order");
        assert_eq!(d.observe(602_000, -3.0), None);
        assert_eq!(d.status().smoothed_tokens_per_s, Some(21_500.0));
    }

    fn reference(tokens_per_s: f64) -> ThroughputReference {
        use crate::health::healthy_record::RecordScope;
        ThroughputReference {
            tokens_per_s,
            scope: RecordScope::ThisRun,
            source: "this run ran at 21.5K tok/s here on 2026-12-03 20:40".into(),
            adjustment: None,
        }
    }

    #[test]
    fn a_restart_at_a_fifth_of_its_recorded_rate_is_crit_within_warmup_plus_the_bound() {
        let mut d = detector();
        d.set_reference(Some(reference(21_500.0)));
        // The restarted daemon comes up at 4.3K from its first sample.
        let t = feed(&mut d, 0, 400, 4_300.0);
        let crit = t.iter().find(|t| t.to == Level::Crit).expect("Crit");
        let cfg = ThroughputConfig::default();
        let bound_s = cfg.warmup_s + (cfg.smoothing_samples / 2 + 2) as f64 + cfg.crit_after_s;
        assert!(
            crit.at_ms as f64 <= bound_s * 1000.0,
            "Crit at {} ms, bound {bound_s} s",
            crit.at_ms
        );
        assert_eq!(
            crit.message,
            "throughput 4.3K tok/s is 20% of baseline 21.5K (Crit); this run ran at 21.5K tok/s \
             here on 2026-12-03 20:40"
        );
        let status = d.status();
        assert_eq!(
            status.baseline_tokens_per_s,
            Some(21_500.0),
            "never learned as normal"
        );
        assert!(!status.learning);
        assert!(status
            .baseline_source
            .unwrap()
            .starts_with("this run ran at"));
    }

    #[test]
    fn a_run_faster_than_its_record_is_judged_against_its_own_pace() {
        let mut d = detector();
        d.set_reference(Some(reference(1_000.0)));
        assert!(feed(&mut d, 0, 600, 2_000.0).is_empty());
        let status = d.status();
        assert_eq!(status.baseline_tokens_per_s, Some(2_000.0));
        assert_eq!(status.baseline_source, None, "its own learning");
        // A drop to the record's rate is a drop from this run's pace.
        let t = feed(&mut d, 600, 120, 1_000.0);
        assert_eq!(t.iter().map(|t| t.to).collect::<Vec<_>>(), [Level::Warn]);
    }

    #[test]
    fn forgetting_the_reference_learns_anew_and_ends_an_alert_with_nothing_left_to_judge_by() {
        let mut d = detector();
        d.set_reference(Some(reference(20_000.0)));
        let mut t = 0;
        let mut crit = None;
        // Warmup, then a slow start against the record: Crit.
        while t <= 200_000 {
            if let Some(tr) = d.observe(t, 4_000.0) {
                crit = Some(tr);
            }
            t += 1_000;
        }
        assert_eq!(crit.unwrap().to, Level::Crit);
        let cleared = d.forget_reference(t).expect("the alert ends");
        assert_eq!((cleared.from, cleared.to), (Level::Crit, Level::Ok));
        assert!(cleared.message.contains("forgotten"), "{}", cleared.message);
        assert!(d.forget_reference(t).is_none(), "nothing left to forget");
        // The slow rate is now this run's own: learned, then judged stable.
        for _ in 0..60 {
            t += 1_000;
            assert!(d.observe(t, 4_000.0).is_none());
        }
        assert_eq!(d.level(), Level::Ok);
        assert_eq!(d.baseline(), Some(4_000.0));
        assert!(d.status().baseline_source.is_none());
    }

    #[test]
    fn a_drop_being_timed_is_escalating_before_it_is_an_alert() {
        let mut d = detector();
        d.set_reference(Some(reference(20_000.0)));
        let mut t = 0;
        while t <= 130_000 {
            assert!(d.observe(t, 20_000.0).is_none());
            t += 1_000;
        }
        assert!(!d.status().escalating);
        // 70 %: below warn_below, Warn only after warn_after_s (60 s).
        for _ in 0..30 {
            t += 1_000;
            assert!(d.observe(t, 14_000.0).is_none());
        }
        let s = d.status();
        assert_eq!(s.level, Level::Ok);
        assert!(s.escalating, "{s:?}");
        // Back to full speed: no longer timed.
        for _ in 0..5 {
            t += 1_000;
            d.observe(t, 20_000.0);
        }
        assert!(!d.status().escalating);
    }
}
