//! When the training loop evaluates and checkpoints: one rule each, read from the config
//! (torchtitan's `should_validate` / `CheckpointManager._should_save`). The loop asks these;
//! nothing else decides.
use super::config::TrainConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Evaluate every this many steps, before the first step of a fresh run and at the end
    /// (0: never).
    pub eval_every: u64,
    /// Checkpoint every this many steps (0: only when the loop ends).
    pub checkpoint_every: u64,
    /// Evaluate online (speculative decoding against the target) every this many steps and
    /// at the end, never before the first step (0: never).
    pub online_eval_every: u64,
}

impl Cadence {
    pub fn of(cfg: &TrainConfig) -> Self {
        Self {
            eval_every: cfg.training.eval_every,
            checkpoint_every: cfg.training.checkpoint_every,
            online_eval_every: cfg.online_eval_every(),
        }
    }

    /// The evaluation before any training: a fresh run's baseline τ.
    pub fn eval_before_start(&self, step: u64) -> bool {
        self.eval_every > 0 && step == 0
    }

    /// After optimizer step `step`: every `eval_every` steps, and after the last one.
    pub fn eval_due(&self, step: u64, finished: bool) -> bool {
        self.eval_every > 0 && (step % self.eval_every == 0 || finished)
    }

    /// After optimizer step `step`: every `online_eval_every` steps, and after the last one,
    /// as [`Self::eval_due`]. With the same interval both land on the same steps, so the line
    /// carries the offline τ of the same moment.
    pub fn online_eval_due(&self, step: u64, finished: bool) -> bool {
        self.online_eval_every > 0 && (step % self.online_eval_every == 0 || finished)
    }

    /// After optimizer step `step`, on the cadence, unless that step is already saved.
    pub fn checkpoint_due(&self, step: u64, last_saved: Option<u64>) -> bool {
        self.checkpoint_every > 0 && step % self.checkpoint_every == 0 && last_saved != Some(step)
    }

    /// When the loop ends at `step`: whatever has not been saved yet (nothing before step 1).
    pub fn final_checkpoint_due(&self, step: u64, last_saved: Option<u64>) -> bool {
        step > 0 && last_saved != Some(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Cadence = Cadence {
        eval_every: 5,
        checkpoint_every: 4,
        online_eval_every: 6,
    };

    #[test]
    fn evaluates_at_start_on_the_cadence_and_at_the_end() {
        assert!(C.eval_before_start(0));
        assert!(
            !C.eval_before_start(3),
            "a resumed run has its baseline already"
        );
        let due: Vec<u64> = (1..=12).filter(|&s| C.eval_due(s, s == 12)).collect();
        assert_eq!(due, vec![5, 10, 12]);
        let never = Cadence { eval_every: 0, ..C };
        assert!(!never.eval_before_start(0) && !never.eval_due(5, true));
    }

    #[test]
    fn evaluates_online_on_its_own_cadence_and_at_the_end() {
        let due: Vec<u64> = (1..=14)
            .filter(|&s| C.online_eval_due(s, s == 14))
            .collect();
        assert_eq!(due, vec![6, 12, 14]);
        let aligned = Cadence {
            online_eval_every: 5,
            ..C
        };
        let both: Vec<u64> = (1..=12)
            .filter(|&s| aligned.online_eval_due(s, s == 12) && aligned.eval_due(s, s == 12))
            .collect();
        assert_eq!(both, vec![5, 10, 12], "the same interval: the same steps");
        let off = Cadence {
            online_eval_every: 0,
            ..C
        };
        assert!(!off.online_eval_due(6, true));
        assert!(
            off.eval_due(5, false),
            "offline evaluation does not depend on it"
        );
    }

    #[test]
    fn checkpoints_on_the_cadence_once_and_saves_the_rest_at_the_end() {
        let due: Vec<u64> = (1..=10).filter(|&s| C.checkpoint_due(s, None)).collect();
        assert_eq!(due, vec![4, 8]);
        assert!(
            !C.checkpoint_due(8, Some(8)),
            "a resumed step-8 checkpoint is not rewritten"
        );
        assert!(C.final_checkpoint_due(10, Some(8)));
        assert!(!C.final_checkpoint_due(8, Some(8)));
        assert!(
            !C.final_checkpoint_due(0, None),
            "nothing trained, nothing to save"
        );
        let end_only = Cadence {
            checkpoint_every: 0,
            ..C
        };
        assert!(!end_only.checkpoint_due(4, None) && end_only.final_checkpoint_due(4, None));
    }
}
