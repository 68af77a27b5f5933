//! The healthy record's clock: when a run has been healthy long enough to be remembered, and
//! which of its samples the record may learn from.
//!
//! A run stands, at each step, in one of three ways ([`Standing`]):
//! - **healthy**: throughput judged Ok past its learning, no drop being timed, no alert;
//! - **drop timed**: the smoothed rate is below `warn_below` and the throughput detector is
//!   timing it, but no alert has been raised;
//! - **sick**: still learning, a throughput level other than Ok, or any active alert.
//!
//! A healthy step starts the stretch (or continues it) and its sample goes into the record's
//! window. A sick step ends the stretch and drops its samples. A timed drop does neither: the
//! stretch goes on, but its samples are held aside and no record is written while it lasts.
//! A short dip (a few slow steps of a noisy run) would otherwise restart the clock every few
//! minutes, and a run with real step-time spread would never reach `after_ok_s`.
//!
//! When the drop clears without an alert, its held samples join the window: they were the run's
//! ordinary spread, and leaving every dip's slow steps out would bias the record above the
//! rate the run really keeps (a restart judged against it would read noise as a regression).
//! When the drop becomes an alert, they are dropped with the rest of the stretch, so a record
//! never learns a rate that was being called slow.
//!
//! The record is due once the stretch has lasted `after_ok_s`, is not in a timed drop, holds
//! at least one sample, and `refresh_s` has passed since the last attempt.
use super::healthy_record::{HealthyRecordConfig, HealthyWindow};
use super::throughput::ThroughputStatus;
use super::{secs_to_ms, Level};
use crate::metrics::{GpuSample, QueueStats, StepMetrics, TimestampMs};

/// At most this many steps of one timed drop are held: `warn_after_s` of steps at any
/// realistic rate, and the window keeps no more than this of any kind either.
const HELD_CAP: usize = 4096;

/// How the run stands for its healthy record at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Judged Ok past learning, nothing being timed, no alert: the record learns from it.
    Healthy,
    /// A drop below `warn_below` is being timed and has not become an alert: the stretch
    /// holds, the record learns nothing from it.
    DropTimed,
    /// Learning, a throughput level above Ok, or an active alert: the stretch ends.
    Sick,
}

/// The standing a throughput judgement and the alert list give.
pub fn standing(throughput: &ThroughputStatus, alert_active: bool) -> Standing {
    if throughput.learning || throughput.level != Level::Ok || alert_active {
        Standing::Sick
    } else if throughput.escalating {
        Standing::DropTimed
    } else {
        Standing::Healthy
    }
}

/// The healthy stretch of one run and the window of samples its record is made from.
#[derive(Debug, Clone)]
pub struct HealthyStretch {
    cfg: HealthyRecordConfig,
    since_ms: Option<TimestampMs>,
    drop_timed: bool,
    window: HealthyWindow,
    /// The steps of the drop being timed: the window's if it clears, nobody's if it alerts.
    held: Vec<StepMetrics>,
    /// The last time a record was due, written or declined: the refresh clock.
    last_attempt_ms: Option<TimestampMs>,
    last_written_ms: Option<TimestampMs>,
}

impl HealthyStretch {
    pub fn new(cfg: HealthyRecordConfig) -> Self {
        HealthyStretch {
            cfg,
            since_ms: None,
            drop_timed: false,
            window: HealthyWindow::default(),
            held: Vec::new(),
            last_attempt_ms: None,
            last_written_ms: None,
        }
    }

    pub fn config(&self) -> &HealthyRecordConfig {
        &self.cfg
    }

    /// How the run stands at `now_ms`.
    pub fn observe(&mut self, now_ms: TimestampMs, standing: Standing) {
        match standing {
            Standing::Healthy => {
                self.since_ms.get_or_insert(now_ms);
                self.drop_timed = false;
                for m in self.held.drain(..) {
                    self.window.observe_step(&m);
                }
            }
            Standing::DropTimed => {
                self.drop_timed = self.since_ms.is_some();
            }
            Standing::Sick => {
                if self.since_ms.take().is_some() {
                    self.window.reset();
                }
                self.held.clear();
                self.drop_timed = false;
            }
        }
    }

    /// Starts over, as after a confirmed forget of the record: no stretch, no samples, nothing
    /// written.
    pub fn reset(&mut self) {
        *self = HealthyStretch::new(self.cfg.clone());
    }

    /// Whether samples now go into the record's window.
    fn takes_samples(&self) -> bool {
        self.since_ms.is_some() && !self.drop_timed
    }

    /// A step of the stretch: into the window, or held aside while a drop is timed.
    pub fn observe_step(&mut self, m: &StepMetrics) {
        if self.takes_samples() {
            self.window.observe_step(m);
        } else if self.drop_timed && self.held.len() < HELD_CAP {
            self.held.push(m.clone());
        }
    }

    pub fn observe_gpu(&mut self, g: &GpuSample) {
        if self.takes_samples() {
            self.window.observe_gpu(g);
        }
    }

    pub fn observe_queue(&mut self, q: &QueueStats) {
        if self.takes_samples() {
            self.window.observe_queue(q);
        }
    }

    /// When the stretch began; `None` outside one.
    pub fn since_ms(&self) -> Option<TimestampMs> {
        self.since_ms
    }

    /// A drop is being timed inside the stretch.
    pub fn drop_timed(&self) -> bool {
        self.drop_timed
    }

    /// When this process's first record falls due if the stretch holds; `None` outside a
    /// stretch and once a record has been written.
    pub fn first_due_ms(&self) -> Option<TimestampMs> {
        if self.last_written_ms.is_some() {
            return None;
        }
        self.since_ms
            .map(|since| since + secs_to_ms(self.cfg.after_ok_s))
    }

    /// When this process last wrote the record.
    pub fn last_written_ms(&self) -> Option<TimestampMs> {
        self.last_written_ms
    }

    /// Whether a record is due at `now_ms`.
    pub fn due(&self, now_ms: TimestampMs) -> bool {
        let Some(since) = self.since_ms else {
            return false;
        };
        !self.drop_timed
            && now_ms - since >= secs_to_ms(self.cfg.after_ok_s)
            && self
                .last_attempt_ms
                .is_none_or(|last| now_ms - last >= secs_to_ms(self.cfg.refresh_s))
            && self.window.step_samples() > 0
    }

    /// The samples the record is made from.
    pub fn window(&self) -> &HealthyWindow {
        &self.window
    }

    /// A due record was attempted at `now_ms` (written or declined): the refresh clock
    /// restarts.
    pub fn attempted(&mut self, now_ms: TimestampMs) {
        self.last_attempt_ms = Some(now_ms);
    }

    /// A record was written at `now_ms`; returns whether it was the first of this process.
    pub fn written(&mut self, now_ms: TimestampMs) -> bool {
        let first = self.last_written_ms.is_none();
        self.last_written_ms = Some(now_ms);
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::StepTimes;

    fn cfg() -> HealthyRecordConfig {
        HealthyRecordConfig {
            after_ok_s: 10.0,
            refresh_s: 5.0,
            use_recipe_record: true,
        }
    }

    fn step(ts_ms: TimestampMs, tokens_per_s: f64) -> StepMetrics {
        StepMetrics {
            ts_ms,
            step: 1,
            epoch: 1,
            loss: 1.0,
            accuracy: 0.5,
            tau: None,
            tau_tree: None,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_s,
            draft_positions_per_s: tokens_per_s,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        }
    }

    fn feed(s: &mut HealthyStretch, secs: std::ops::Range<i64>, standing: Standing, rate: f64) {
        for t in secs {
            s.observe(t * 1000, standing);
            s.observe_step(&step(t * 1000, rate));
        }
    }

    #[test]
    fn a_timed_drop_holds_the_stretch_and_its_samples_join_once_it_clears() {
        let mut s = HealthyStretch::new(cfg());
        feed(&mut s, 0..4, Standing::Healthy, 1_000.0);
        feed(&mut s, 4..7, Standing::DropTimed, 300.0);
        assert_eq!(s.since_ms(), Some(0), "the stretch goes on");
        assert!(s.drop_timed());
        assert_eq!(
            s.window().step_samples(),
            4,
            "the dip's samples are held aside"
        );
        feed(&mut s, 7..10, Standing::Healthy, 1_000.0);
        assert!(!s.due(9_999));
        assert!(
            s.due(10_000),
            "10 s after the stretch began, the dip included"
        );
        assert_eq!(
            s.window().step_samples(),
            10,
            "a dip that cleared was the run's own spread"
        );
        let figures = s.window().figures(None).unwrap();
        assert_eq!(figures.throughput.tokens_per_s, 1_000.0);
    }

    #[test]
    fn nothing_is_due_while_a_drop_is_timed() {
        let mut s = HealthyStretch::new(cfg());
        feed(&mut s, 0..12, Standing::Healthy, 1_000.0);
        assert!(s.due(12_000));
        s.observe(12_000, Standing::DropTimed);
        assert!(!s.due(12_000));
        s.observe(13_000, Standing::Healthy);
        assert!(s.due(13_000));
    }

    #[test]
    fn an_alert_ends_the_stretch_and_drops_its_samples() {
        let mut s = HealthyStretch::new(cfg());
        feed(&mut s, 0..5, Standing::Healthy, 1_000.0);
        feed(&mut s, 5..8, Standing::DropTimed, 300.0);
        feed(&mut s, 8..9, Standing::Sick, 300.0);
        assert_eq!(s.since_ms(), None);
        assert_eq!(s.window().step_samples(), 0);
        assert_eq!(s.first_due_ms(), None);
        feed(&mut s, 9..20, Standing::Healthy, 900.0);
        assert_eq!(s.since_ms(), Some(9_000));
        assert_eq!(s.first_due_ms(), Some(19_000));
        assert!(!s.due(18_999) && s.due(19_000));
        assert_eq!(
            s.window().step_samples(),
            11,
            "the alerted drop's samples are gone"
        );
        let figures = s.window().figures(None).unwrap();
        assert_eq!(figures.throughput.tokens_per_s, 900.0);
    }

    #[test]
    fn a_drop_timed_outside_a_stretch_starts_none() {
        let mut s = HealthyStretch::new(cfg());
        feed(&mut s, 0..3, Standing::DropTimed, 300.0);
        assert_eq!(s.since_ms(), None);
        assert!(!s.drop_timed());
        assert_eq!(s.window().step_samples(), 0);
    }

    #[test]
    fn the_refresh_clock_and_the_first_due_time() {
        let mut s = HealthyStretch::new(cfg());
        feed(&mut s, 0..11, Standing::Healthy, 1_000.0);
        assert_eq!(s.first_due_ms(), Some(10_000));
        assert!(s.due(10_000));
        s.attempted(10_000);
        assert!(s.written(10_000), "the first write");
        assert_eq!(s.first_due_ms(), None, "written");
        assert!(!s.due(14_999) && s.due(15_000));
        s.attempted(15_000);
        assert!(!s.written(15_000));
        assert_eq!(s.last_written_ms(), Some(15_000));
        s.reset();
        assert_eq!((s.since_ms(), s.last_written_ms()), (None, None));
    }

    #[test]
    fn standing_reads_the_judgement() {
        let ok = ThroughputStatus {
            level: Level::Ok,
            since_ms: Some(0),
            smoothed_tokens_per_s: Some(1.0),
            baseline_tokens_per_s: Some(1.0),
            baseline_pinned: false,
            baseline_source: None,
            learning: false,
            escalating: false,
        };
        assert_eq!(standing(&ok, false), Standing::Healthy);
        assert_eq!(standing(&ok, true), Standing::Sick);
        let timed = ThroughputStatus {
            escalating: true,
            ..ok.clone()
        };
        assert_eq!(standing(&timed, false), Standing::DropTimed);
        assert_eq!(standing(&timed, true), Standing::Sick);
        let learning = ThroughputStatus {
            learning: true,
            ..ok.clone()
        };
        assert_eq!(standing(&learning, false), Standing::Sick);
        let warn = ThroughputStatus {
            level: Level::Warn,
            ..ok
        };
        assert_eq!(standing(&warn, false), Standing::Sick);
    }
}
