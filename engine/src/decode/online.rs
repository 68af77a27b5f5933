//! Online acceptance: every decoding method on every prompt of a set, beside the target alone,
//! with the summary figures the DFlash reference benchmark reports (per-prompt mean acceptance
//! length averaged over prompts) and the pooled one (all lengths over all rounds).
//!
//! Used by `dflashd eval --online`, and written to be called from the training loop too: it
//! takes loaded models and token ids and does no I/O.
use std::fmt;
use std::time::Instant;

use super::chain::{generate_chain_with, generate_target_only, Generation, Settings};
use super::draft::DraftLogits;
use super::error::DecodeError;
use super::sampling::Sampling;
use super::tree::generate_tree_with;
use crate::model::drafter::Drafter;
use crate::model::target::TargetModel;

/// A way of decoding with the drafter. Reports are keyed by [`Method::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// One block drafted and verified per target forward (z-lab `dflash_generate`).
    Chain,
    /// A best-first tree of at most `budget` drafted nodes verified per target forward
    /// (liranringel/ddtree `ddtree_generate`; greedy only).
    Tree { budget: usize },
}

impl Method {
    /// The report key: `chain`, `ddtree_<budget>`.
    pub fn name(&self) -> String {
        match self {
            Method::Chain => "chain".to_string(),
            Method::Tree { budget } => format!("ddtree_{budget}"),
        }
    }

    fn generate(
        &self,
        target: &TargetModel,
        drafter: &Drafter,
        prompt: &[i64],
        settings: &Settings,
        logits: DraftLogits,
    ) -> Result<Generation, DecodeError> {
        match self {
            Method::Chain => generate_chain_with(target, drafter, prompt, settings, logits),
            Method::Tree { budget } => {
                generate_tree_with(target, drafter, prompt, settings, *budget, logits)
                    .map(|t| t.generation)
            }
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The acceptance figures of one method over a prompt set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    /// Mean over prompts of each prompt's mean acceptance length (the reference benchmark's
    /// figure). Prompts without a round (their output ended at the prefill's token) have no
    /// mean and are left out; `None` when no prompt has a round.
    pub tau: Option<f64>,
    /// Σ acceptance lengths / Σ rounds over all prompts; `None` with no round.
    pub tau_pooled: Option<f64>,
    /// Verifying target forwards, all prompts together.
    pub rounds: usize,
    /// Tokens the rounds produced (Σ acceptance lengths; the prefill's tokens are not counted).
    pub round_tokens: usize,
    /// Prompts that had at least one round (the ones `tau` averages).
    pub prompts_with_rounds: usize,
}

/// Aggregates per-prompt acceptance lengths (`per_prompt[i]`: the rounds of prompt `i`).
pub fn acceptance<'a>(per_prompt: impl IntoIterator<Item = &'a [usize]>) -> Acceptance {
    let (mut rounds, mut round_tokens) = (0usize, 0usize);
    let (mut sum_of_means, mut prompts_with_rounds) = (0.0f64, 0usize);
    for lengths in per_prompt {
        if lengths.is_empty() {
            continue;
        }
        let produced: usize = lengths.iter().sum();
        rounds += lengths.len();
        round_tokens += produced;
        sum_of_means += produced as f64 / lengths.len() as f64;
        prompts_with_rounds += 1;
    }
    Acceptance {
        tau: (prompts_with_rounds > 0).then(|| sum_of_means / prompts_with_rounds as f64),
        tau_pooled: (rounds > 0).then(|| round_tokens as f64 / rounds as f64),
        rounds,
        round_tokens,
        prompts_with_rounds,
    }
}

/// Output tokens over wall seconds; 0 when no time was measured.
fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// One method over the prompt set.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodRun {
    pub method: Method,
    /// Over the output's rounds ([`Generation::acceptance_lengths`]: clipped where the output
    /// stops).
    pub acceptance: Acceptance,
    /// Over the rounds as z-lab's `dflash_generate` and DDTree's `ddtree_generate` count them
    /// ([`Generation::peer_acceptance_lengths`]: every round in full, and the round they run
    /// after an output that filled `max_new_tokens` exactly). Its `tau` is the figure to hold
    /// against a published acceptance length.
    pub acceptance_peer_counting: Acceptance,
    /// Output tokens of all prompts (the prefill's token included).
    pub tokens: usize,
    /// Wall time of all prompts, one after the other.
    pub seconds: f64,
    /// Per prompt, in the prompt set's order.
    pub generations: Vec<Generation>,
    /// Greedy only: every prompt's output equals the target alone's. `None` when sampling,
    /// where losslessness holds in distribution and no single run can show it.
    pub lossless: Option<bool>,
    /// Greedy only: the prompts (indices) whose output differs from the target alone's.
    pub mismatched_prompts: Vec<usize>,
}

impl MethodRun {
    pub fn tokens_per_s(&self) -> f64 {
        rate(self.tokens, self.seconds)
    }
}

/// The target alone over the prompt set: the reference output and the baseline speed.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetOnlyRun {
    pub tokens: usize,
    pub seconds: f64,
    pub generations: Vec<Generation>,
}

impl TargetOnlyRun {
    pub fn tokens_per_s(&self) -> f64 {
        rate(self.tokens, self.seconds)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct OnlineReport {
    /// As given; prompt `i` was decoded with seed `settings.seed + i` (see [`prompt_settings`]).
    pub settings: Settings,
    pub target_only: TargetOnlyRun,
    /// In the order asked for.
    pub methods: Vec<MethodRun>,
}

/// The settings prompt `index` is decoded with: its own seed, so that prompts do not share one
/// stream of draws, and every method and the target alone see the same seed for a prompt.
pub fn prompt_settings(settings: &Settings, index: usize) -> Settings {
    Settings {
        seed: settings.seed.wrapping_add(index as u64),
        ..settings.clone()
    }
}

/// Runs the target alone and then every method in `methods` on every prompt, one prompt at a
/// time, timing each method over the whole set. The drafter drafts from its own logits (a
/// Domino drafter's corrected ones).
pub fn run_online(
    target: &TargetModel,
    drafter: &Drafter,
    prompts: &[Vec<i64>],
    settings: &Settings,
    methods: &[Method],
) -> Result<OnlineReport, DecodeError> {
    run_online_with(
        target,
        drafter,
        prompts,
        settings,
        methods,
        DraftLogits::Drafter,
    )
}

/// [`run_online`] with the drafter drafting from `logits` (a Domino drafter's base acceptance:
/// [`DraftLogits::LmHeadOnly`]).
pub fn run_online_with(
    target: &TargetModel,
    drafter: &Drafter,
    prompts: &[Vec<i64>],
    settings: &Settings,
    methods: &[Method],
    logits: DraftLogits,
) -> Result<OnlineReport, DecodeError> {
    settings.sampling.validate()?;
    if prompts.is_empty() {
        return Err(DecodeError::NoPrompts);
    }
    // refused before any decoding, not after the chain's minutes
    for method in methods {
        match *method {
            Method::Tree { .. } if settings.sampling != Sampling::Greedy => {
                return Err(DecodeError::TreeNeedsGreedy)
            }
            Method::Tree { budget: 0 } => return Err(DecodeError::BadBudget { budget: 0 }),
            _ => {}
        }
    }
    let clock = Instant::now();
    let reference = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| generate_target_only(target, p, &prompt_settings(settings, i)))
        .collect::<Result<Vec<_>, _>>()?;
    let target_only = TargetOnlyRun {
        tokens: reference.iter().map(|g| g.output_ids.len()).sum(),
        seconds: clock.elapsed().as_secs_f64(),
        generations: reference,
    };
    let mut runs = Vec::with_capacity(methods.len());
    for &method in methods {
        let clock = Instant::now();
        let generations = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                method.generate(target, drafter, p, &prompt_settings(settings, i), logits)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seconds = clock.elapsed().as_secs_f64();
        let greedy = settings.sampling == Sampling::Greedy;
        let mismatched_prompts: Vec<usize> = if greedy {
            mismatches(&generations, &target_only.generations)
        } else {
            Vec::new()
        };
        runs.push(MethodRun {
            method,
            acceptance: acceptance(generations.iter().map(|g| g.acceptance_lengths.as_slice())),
            acceptance_peer_counting: acceptance(
                generations
                    .iter()
                    .map(|g| g.peer_acceptance_lengths.as_slice()),
            ),
            tokens: generations.iter().map(|g| g.output_ids.len()).sum(),
            seconds,
            lossless: greedy.then_some(mismatched_prompts.is_empty()),
            mismatched_prompts,
            generations,
        });
    }
    Ok(OnlineReport {
        settings: settings.clone(),
        target_only,
        methods: runs,
    })
}

/// Indices of the prompts whose output differs from the reference's.
fn mismatches(generations: &[Generation], reference: &[Generation]) -> Vec<usize> {
    generations
        .iter()
        .zip(reference)
        .enumerate()
        .filter(|(_, (g, r))| g.output_ids != r.output_ids)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_of_prompt_means_and_the_pooled_mean_differ() {
        // prompt 0: one round of 7; prompt 1: three rounds of 1.
        let a = acceptance([&[7usize][..], &[1, 1, 1]]);
        assert_eq!(a.tau, Some(4.0)); // (7 + 1) / 2
        assert_eq!(a.tau_pooled, Some(2.5)); // 10 / 4
        assert_eq!(a.rounds, 4);
        assert_eq!(a.round_tokens, 10);
        assert_eq!(a.prompts_with_rounds, 2);
    }

    #[test]
    fn prompts_without_rounds_are_left_out_of_the_mean() {
        let a = acceptance([&[][..], &[3usize, 5], &[]]);
        assert_eq!(a.tau, Some(4.0));
        assert_eq!(a.tau_pooled, Some(4.0));
        assert_eq!(a.prompts_with_rounds, 1);
    }

    #[test]
    fn no_round_at_all_gives_no_figure() {
        let a = acceptance([&[][..], &[]]);
        assert_eq!((a.tau, a.tau_pooled, a.rounds), (None, None, 0));
        let none = acceptance(std::iter::empty::<&[usize]>());
        assert_eq!((none.tau, none.tau_pooled), (None, None));
    }

    #[test]
    fn rates_and_mismatches() {
        assert_eq!(rate(10, 0.0), 0.0);
        assert_eq!(rate(10, 2.0), 5.0);
        let g = |ids: &[i64]| Generation {
            output_ids: ids.to_vec(),
            acceptance_lengths: vec![],
            peer_acceptance_lengths: vec![],
        };
        let reference = [g(&[1, 2]), g(&[3]), g(&[4, 5])];
        assert_eq!(
            mismatches(&[g(&[1, 2]), g(&[3, 9]), g(&[4])], &reference),
            vec![1, 2]
        );
        assert!(mismatches(&reference, &reference).is_empty());
    }

    #[test]
    fn methods_are_named_for_their_report_keys() {
        assert_eq!(Method::Chain.name(), "chain");
        assert_eq!(Method::Chain.to_string(), "chain");
        assert_eq!(Method::Tree { budget: 16 }.name(), "ddtree_16");
    }

    #[test]
    fn each_prompt_gets_its_own_seed() {
        let s = Settings {
            max_new_tokens: 4,
            stop_tokens: vec![],
            sampling: Sampling::Greedy,
            seed: u64::MAX,
        };
        assert_eq!(prompt_settings(&s, 0).seed, u64::MAX);
        assert_eq!(prompt_settings(&s, 2).seed, 1);
        assert_eq!(prompt_settings(&s, 2).max_new_tokens, 4);
    }
}
