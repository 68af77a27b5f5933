//! The offline τ of a drafter on the target's own greedy continuations of an online prompt set
//! ([`crate::decode::run_online`]), so that the offline figure and the served one of the same
//! text sit side by side (the train-versus-serve gap, issue 13). The offline figure is the one
//! `dflashd eval --data` reports ([`evaluate`]): anchors at every continuation position, labels
//! past the row's end invalid.
use super::error::TrainError;
use super::eval::{evaluate, EvalOptions, EvalReport};
use crate::data::{has_consecutive_supervised, Sample};
use crate::decode::{generate_target_only, prompt_settings, OnlineReport, Sampling, Settings};
use crate::model::drafter::Drafter;
use crate::model::target::TargetModel;

/// Prompt + continuation, supervised (loss mask 1) on the continuation only.
pub fn continuation_sample(prompt: &[i64], continuation: &[i64]) -> Sample {
    let mut input_ids = prompt.to_vec();
    input_ids.extend_from_slice(continuation);
    let mut loss_mask = vec![0u8; prompt.len()];
    loss_mask.resize(input_ids.len(), 1);
    Sample {
        input_ids,
        loss_mask,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationEval {
    pub report: EvalReport,
    /// Prompts whose continuation is shorter than 2 tokens: no anchor, so not evaluated.
    pub too_short: usize,
}

impl ContinuationEval {
    /// The offline τ, `None` when no block was evaluated.
    pub fn tau(&self) -> Option<f64> {
        (self.report.blocks > 0).then_some(self.report.tau)
    }
}

/// The target's greedy continuations of `prompts`: the online run's own reference outputs when
/// it was greedy, else a greedy target-alone run with the same length limit and stop tokens.
pub fn greedy_continuations(
    target: &TargetModel,
    prompts: &[Vec<i64>],
    online: &OnlineReport,
) -> Result<Vec<Vec<i64>>, TrainError> {
    if online.settings.sampling == Sampling::Greedy {
        return Ok(online
            .target_only
            .generations
            .iter()
            .map(|g| g.output_ids.clone())
            .collect());
    }
    let greedy = Settings {
        sampling: Sampling::Greedy,
        ..online.settings.clone()
    };
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Ok(generate_target_only(target, p, &prompt_settings(&greedy, i))?.output_ids))
        .collect()
}

/// Offline evaluation of `drafter` on prompt + greedy continuation of every prompt.
pub fn evaluate_greedy_continuations(
    target: &TargetModel,
    drafter: &Drafter,
    prompts: &[Vec<i64>],
    online: &OnlineReport,
    opts: &EvalOptions,
) -> Result<ContinuationEval, TrainError> {
    let continuations = greedy_continuations(target, prompts, online)?;
    let samples: Vec<Sample> = prompts
        .iter()
        .zip(&continuations)
        .map(|(p, c)| continuation_sample(p, c))
        .collect();
    let usable: Vec<&Sample> = samples
        .iter()
        .filter(|s| has_consecutive_supervised(&s.loss_mask))
        .collect();
    let too_short = samples.len() - usable.len();
    let report = evaluate(target, drafter, &usable, opts)?;
    Ok(ContinuationEval { report, too_short })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continuation_alone_is_supervised() {
        let s = continuation_sample(&[5, 6, 7], &[8, 9]);
        assert_eq!(s.input_ids, vec![5, 6, 7, 8, 9]);
        assert_eq!(s.loss_mask, vec![0, 0, 0, 1, 1]);
        // one token of continuation gives no anchor pair
        assert!(!has_consecutive_supervised(
            &continuation_sample(&[5], &[8]).loss_mask
        ));
    }
}
