//! The online evaluation of a training run: chain and DDTree speculative decoding of the
//! drafter being trained against the run's target, over a small held-out prompt set, between
//! two steps on the device that holds both (rank 0's, where the offline evaluation runs too).
//! Greedy, so its figures are reproducible and comparable with offline τ.
//!
//! A Domino drafter, or a DSpark drafter with a Markov head, is decoded twice: with its
//! correction (what serving gets) and from its LM head's logits alone (`base`), method for method, as `dflashd eval --online` reports
//! `base_tau` and SpecForge logs `base_accept_len` beside `accept_len`. The second decoding
//! doubles the evaluation's time for a Domino run; `online_eval_s` counts both.
use std::collections::BTreeMap;
use std::time::Instant;

use dflash_shared::metrics::{OnlineAcceptance, OnlineBase};

use crate::decode::{run_online_with, DraftLogits, Method, OnlineReport, Sampling, Settings};
use crate::train::error::TrainError;
use crate::train::trainer::Trainer;

impl Trainer {
    /// The methods a run evaluates online: the chain, then DDTree at each configured budget.
    pub fn online_methods(&self) -> Vec<Method> {
        std::iter::once(Method::Chain)
            .chain(
                self.config()
                    .training
                    .online_eval_tree_budgets
                    .iter()
                    .map(|&budget| Method::Tree { budget }),
            )
            .collect()
    }

    /// Runs the online evaluation now (`None` without prompts, or when no prompt produced a
    /// verification round: every output ended at its first token). `offline_tau` is the offline
    /// τ of the same moment, when the caller has one.
    pub fn evaluate_online(
        &self,
        offline_tau: Option<f64>,
    ) -> Result<Option<OnlineAcceptance>, TrainError> {
        let Some(set) = self.online_prompts() else {
            return Ok(None);
        };
        let count = set
            .prompts
            .len()
            .min(self.config().training.online_eval_max_prompts);
        if count == 0 {
            return Ok(None);
        }
        let settings = Settings {
            max_new_tokens: self.config().training.online_eval_max_new_tokens,
            stop_tokens: set.stop_tokens.clone(),
            sampling: Sampling::Greedy,
            seed: 0,
        };
        let clock = Instant::now();
        let methods = self.online_methods();
        let decode = |logits| {
            run_online_with(
                self.target(),
                self.drafter(),
                &set.prompts[..count],
                &settings,
                &methods,
                logits,
            )
        };
        let Some((tau_chain, tau_ddtree)) = method_taus(&decode(DraftLogits::Drafter)?) else {
            return Ok(None);
        };
        let base = if self.drafter().corrects_lm_head() {
            method_taus(&decode(DraftLogits::LmHeadOnly)?).map(|(tau_chain, tau_ddtree)| {
                OnlineBase {
                    tau_chain,
                    tau_ddtree,
                }
            })
        } else {
            None
        };
        Ok(Some(OnlineAcceptance {
            tau_chain,
            tau_ddtree,
            serve_tree_budget: Some(self.config().training.serve_tree_budget),
            offline_tau,
            base,
            prompts: count,
            seconds: clock.elapsed().as_secs_f64(),
        }))
    }
}

/// The chain's τ and each DDTree budget's; `None` when a method had no verification round
/// (every output ended at its first token), which leaves nothing to average.
fn method_taus(report: &OnlineReport) -> Option<(f64, BTreeMap<usize, f64>)> {
    let mut tau_chain = None;
    let mut tau_ddtree = BTreeMap::new();
    for run in &report.methods {
        let tau = run.acceptance.tau?;
        match run.method {
            Method::Chain => tau_chain = Some(tau),
            Method::Tree { budget } => {
                tau_ddtree.insert(budget, tau);
            }
        }
    }
    tau_chain.map(|chain| (chain, tau_ddtree))
}
