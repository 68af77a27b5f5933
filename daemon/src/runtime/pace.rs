//! The run's pace: smoothed wall time per step, for the ETA to the end of the schedule.
use std::time::Instant;

/// Wall time per step, smoothed, for the ETA. The first step (warmup) is not counted.
#[derive(Debug, Default, Clone)]
pub struct Pace {
    last: Option<Instant>,
    ms_per_step: Option<f64>,
}

impl Pace {
    const ALPHA: f64 = 0.1;

    /// A step finished `elapsed_ms` after the previous one.
    pub fn observe_ms(&mut self, elapsed_ms: f64) {
        self.ms_per_step = Some(match self.ms_per_step {
            Some(avg) => avg + Self::ALPHA * (elapsed_ms - avg),
            None => elapsed_ms,
        });
    }

    pub fn step_done(&mut self) {
        let now = Instant::now();
        if let Some(last) = self.last.replace(now) {
            self.observe_ms((now - last).as_secs_f64() * 1e3);
        }
    }

    /// When `remaining` more steps will be done, from `now_ms`.
    pub fn eta_ms(&self, now_ms: i64, remaining: u64) -> Option<i64> {
        self.ms_per_step
            .map(|ms| now_ms + (ms * remaining as f64).round() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_smooths_step_times_into_an_eta() {
        let mut p = Pace::default();
        assert_eq!(p.eta_ms(0, 10), None, "no ETA before a step is measured");
        p.observe_ms(100.0);
        assert_eq!(p.eta_ms(1_000, 10), Some(2_000));
        p.observe_ms(200.0);
        assert_eq!(
            p.eta_ms(0, 100),
            Some(11_000),
            "moves 10% towards the new time"
        );
        assert_eq!(p.eta_ms(5, 0), Some(5));
    }
}
