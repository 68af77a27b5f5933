//! A node holding a multi-node job back ([`crate::job`]): Warn once the same node has been the
//! straggler for [`STRAGGLER_STEPS`] steps in a row, Ok again after as many steps without one.
//! One slow step (a checkpoint, an evaluation, a long row) names nobody.
use super::{Level, Transition};
use crate::job::JobView;
use crate::metrics::TimestampMs;

/// The detector's name in alerts and the journal.
pub const STRAGGLER_DETECTOR: &str = "straggler";

/// Consecutive steps a node must be the straggler before it is named, and steps without one
/// before the alert ends.
pub const STRAGGLER_STEPS: u32 = 5;

#[derive(Debug, Clone, Default)]
pub struct StragglerDetector {
    level: Level,
    /// The node behind in the current run of steps, and for how many steps.
    candidate: Option<(u32, u32)>,
    /// Steps in a row without a straggler while Warn.
    clear_steps: u32,
}

impl StragglerDetector {
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
                if steps == STRAGGLER_STEPS && self.level == Level::Ok {
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
                (self.clear_steps == STRAGGLER_STEPS).then(|| {
                    self.level = Level::Ok;
                    transition(
                        Level::Warn,
                        Level::Ok,
                        format!(
                            "no node holds the job back any more: for {STRAGGLER_STEPS} steps \
                             the slowest node's own work was within {:.0} % of the next's",
                            crate::job::STRAGGLER_BEHIND_FRAC * 100.0
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
        JobView::from_nodes(0, vec![node(0), node(1)])
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
}
