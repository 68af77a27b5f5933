//! A node holding a multi-node job back ([`crate::job`]): Warn once the same node has been the
//! straggler for `detectors.straggler.steps` ([`STRAGGLER_STEPS`] by default) steps in a row, Ok
//! again after as many steps without one. One slow step (a checkpoint, an evaluation, a long
//! row) names nobody. Which node is a straggler is the job view's rule, with
//! `detectors.straggler.behind_frac` ([`StragglerConfig`]).
use serde::{Deserialize, Serialize};

use super::{Level, Transition};
use crate::job::{JobView, STRAGGLER_BEHIND_FRAC};
use crate::metrics::TimestampMs;

/// The detector's name in alerts and the journal.
pub const STRAGGLER_DETECTOR: &str = "straggler";

/// Consecutive steps a node must be the straggler before it is named, and steps without one
/// before the alert ends: the default of `detectors.straggler.steps`.
pub const STRAGGLER_STEPS: usize = 5;

/// `[detectors.straggler]`: when a node of a multi-node job is named as holding it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StragglerConfig {
    /// How much longer than the next slowest node's a node's own work must take for the node
    /// to be the step's straggler, as a fraction of the next slowest node's (0.2: a fifth).
    pub behind_frac: f64,
    /// Consecutive steps the same node must be the straggler before it is named, and steps
    /// without one before the alert ends.
    pub steps: usize,
}

impl Default for StragglerConfig {
    /// A fifth ([`STRAGGLER_BEHIND_FRAC`], why in its doc) for 5 steps in a row: one slow step
    /// (a checkpoint, an evaluation, a long row) never names a node.
    fn default() -> Self {
        Self {
            behind_frac: STRAGGLER_BEHIND_FRAC,
            steps: STRAGGLER_STEPS,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct StragglerDetector {
    cfg: StragglerConfig,
    level: Level,
    /// The node behind in the current run of steps, and for how many steps.
    candidate: Option<(u32, usize)>,
    /// Steps in a row without a straggler while Warn.
    clear_steps: usize,
}

impl StragglerDetector {
    pub fn new(cfg: StragglerConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    pub fn level(&self) -> Level {
        self.level
    }

    /// One step's view of the job; the transition it makes, if any.
    pub fn observe(&mut self, ts_ms: TimestampMs, job: &JobView) -> Option<Transition> {
        let transition = |from, to, message| Transition {
            detector: STRAGGLER_DETECTOR.into(),
            from,
            to,
            at_ms: ts_ms,
            message,
        };
        match &job.straggler {
            Some(s) => {
                self.clear_steps = 0;
                let steps = match self.candidate {
                    Some((node, n)) if node == s.node => n + 1,
                    _ => 1,
                };
                self.candidate = Some((s.node, steps));
                if steps == self.cfg.steps.max(1) && self.level == Level::Ok {
                    self.level = Level::Warn;
                    return Some(transition(
                        Level::Ok,
                        Level::Warn,
                        format!("{} ({steps} steps in a row)", s.sentence()),
                    ));
                }
                None
            }
            None => {
                self.candidate = None;
                if self.level == Level::Ok {
                    return None;
                }
                self.clear_steps += 1;
                (self.clear_steps == self.cfg.steps.max(1)).then(|| {
                    self.level = Level::Ok;
                    transition(
                        Level::Warn,
                        Level::Ok,
                        format!(
                            "no node holds the job back any more: for {} steps the slowest \
                             node's own work was within {:.0} % of the next's",
                            self.cfg.steps.max(1),
                            self.cfg.behind_frac * 100.0
                        ),
                    )
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::NodeFigures;

    fn job(busy: [f64; 2]) -> JobView {
        let node = |n: u32| NodeFigures {
            node: n,
            tokens_per_s: 100.0,
            draft_positions_per_s: 50.0,
            busy_ms: busy[n as usize],
            step_ms: busy[0].max(busy[1]),
            queue_wait_share: None,
        };
        JobView::from_nodes(0, vec![node(0), node(1)], STRAGGLER_BEHIND_FRAC)
    }

    #[test]
    fn a_node_behind_for_five_steps_is_named_and_five_steps_without_clear_it() {
        let mut d = StragglerDetector::default();
        let (fine, behind) = (job([1000.0, 1050.0]), job([1000.0, 1500.0]));
        // Four slow steps, one normal one: nobody is named; the count starts again.
        for _ in 0..4 {
            assert_eq!(d.observe(0, &behind), None);
        }
        assert_eq!(d.observe(0, &fine), None);
        for step in 1..STRAGGLER_STEPS {
            assert_eq!(d.observe(step as i64, &behind), None);
        }
        let warn = d.observe(9, &behind).expect("named on the fifth");
        assert_eq!(
            (warn.detector.as_str(), warn.to),
            ("straggler", Level::Warn)
        );
        assert!(
            warn.message
                .starts_with("node 1 holds the job back: its own work takes 1.50 s"),
            "{}",
            warn.message
        );
        assert!(warn.message.ends_with("(+50 %) (5 steps in a row)"));
        assert_eq!(d.observe(10, &behind), None, "said once");
        for _ in 1..STRAGGLER_STEPS {
            assert_eq!(d.observe(11, &fine), None);
        }
        let ok = d.observe(12, &fine).expect("cleared");
        assert_eq!((ok.from, ok.to), (Level::Warn, Level::Ok));
        assert_eq!(d.level(), Level::Ok);
    }

    #[test]
    fn a_configured_step_count_names_the_node_and_clears_the_alert_after_as_many_steps() {
        let (fine, behind) = (job([1000.0, 1050.0]), job([1000.0, 1500.0]));
        // Two steps: named on the second, where the default waits for the fifth.
        let mut d = StragglerDetector::new(StragglerConfig {
            steps: 2,
            ..StragglerConfig::default()
        });
        assert_eq!(d.observe(0, &behind), None);
        let warn = d.observe(1, &behind).expect("named on the second");
        assert_eq!(warn.to, Level::Warn);
        assert!(
            warn.message.ends_with("(+50 %) (2 steps in a row)"),
            "{}",
            warn.message
        );
        assert_eq!(d.observe(2, &fine), None);
        let ok = d.observe(3, &fine).expect("cleared after two");
        assert_eq!((ok.from, ok.to), (Level::Warn, Level::Ok));
        assert!(ok.message.contains("for 2 steps"), "{}", ok.message);
        // Eight steps: the fifth names nobody yet, the eighth does.
        let mut d = StragglerDetector::new(StragglerConfig {
            steps: 8,
            ..StragglerConfig::default()
        });
        for step in 0..7 {
            assert_eq!(d.observe(step, &behind), None, "step {step}");
        }
        assert_eq!(d.level(), Level::Ok);
        assert!(d.observe(7, &behind).is_some(), "named on the eighth");
        assert_eq!(d.level(), Level::Warn);
    }
}
