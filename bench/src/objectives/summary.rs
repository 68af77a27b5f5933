//! The objective tournament's arithmetic, pure: each run's figures, the median and min–max
//! spread of each figure across seeds per objective, and the verdict against DFlash.
//!
//! The verdict compares online chain τ, the served figure: an objective beats DFlash only when
//! its median over seeds exceeds DFlash's by more than the wider of the two min–max spreads,
//! so a gain inside seed-to-seed noise is never called a win.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::stats::median;

/// Seeds each objective needs before the verdict judges it.
pub const MIN_SEEDS_FOR_VERDICT: usize = 3;

/// What a run trains: the loss and the drafter head, on the same drafter backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Contender {
    /// DFlash's γ-decayed cross-entropy, DFlash head: the baseline.
    Dflash,
    /// D-PACE (`training.objective = "dpace"`), DFlash head.
    Dpace,
    /// Domino head (`drafter.head = "domino"`) with DFlash's loss, as SpecForge's Domino trains.
    Domino,
    /// The tree objective (`training.objective = "tree"`), DFlash head.
    Tree,
    /// The tree objective with a Domino head.
    #[serde(rename = "domino_tree")]
    DominoTree,
}

impl Contender {
    pub const ALL: [Contender; 5] = [
        Contender::Dflash,
        Contender::Dpace,
        Contender::Domino,
        Contender::Tree,
        Contender::DominoTree,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Dflash => "dflash",
            Contender::Dpace => "dpace",
            Contender::Domino => "domino",
            Contender::Tree => "tree",
            Contender::DominoTree => "domino_tree",
        }
    }

    /// How the tables name it.
    pub fn label(self) -> &'static str {
        match self {
            Contender::Dflash => "DFlash",
            Contender::Dpace => "D-PACE",
            Contender::Domino => "Domino",
            Contender::Tree => "Tree",
            Contender::DominoTree => "Domino + Tree",
        }
    }

    /// `--objectives-contenders`' spelling: [`Self::name`].
    pub fn parse(name: &str) -> Result<Contender, String> {
        Contender::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Contender::ALL.iter().map(|c| c.name()).collect();
                format!("unknown contender {name:?}: one of {}", names.join(", "))
            })
    }
}

/// One training run's measured figures; `None` where the figure could not be read (the
/// run's `error` says why).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunFigures {
    pub contender: Option<Contender>,
    pub seed: u64,
    pub steps: u64,
    /// `dflashd eval --json` on the run's held-out samples.
    pub offline_tau: Option<f64>,
    /// The same eval's `base_tau` (Domino only: the LM head's logits alone).
    pub offline_base_tau: Option<f64>,
    /// The trainer's own held-out τ at its last evaluation (a cross-check of `offline_tau`).
    pub trainer_tau: Option<f64>,
    /// The step of that evaluation (every `training.eval_every` steps, not always the last).
    pub trainer_tau_step: Option<u64>,
    /// `dflashd eval --online --json`: `methods.chain.tau`.
    pub online_chain_tau: Option<f64>,
    /// `methods.chain.base_tau`: a Domino drafter's chain decoded again on the LM head's
    /// logits alone (absent for the others, and from a `dflashd` that does not report it).
    pub online_chain_base_tau: Option<f64>,
    /// `methods.ddtree_<budget>.tau`, by budget.
    pub online_ddtree_tau: BTreeMap<usize, f64>,
    /// Whether every online method's output equalled the target alone's.
    pub online_lossless: Option<bool>,
    /// The training loss of every step, in order.
    pub loss: Vec<f64>,
    /// The mean training loss of each epoch (`epoch` of the metrics lines), in order: the
    /// loss curve at the schedule's own scale.
    pub loss_by_epoch: Vec<f64>,
    /// The median of the steps' `times.total_ms`.
    pub median_step_ms: Option<f64>,
    /// The training process's peak resident set (the kernel's `ru_maxrss`), MiB.
    pub peak_rss_mib: Option<f64>,
    pub wall_s: Option<f64>,
    pub error: Option<String>,
}

/// A figure across seeds: median and min–max.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// `None` when no value is given or one is not finite.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let median = median(values)?;
        Some(Spread {
            median,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: values.len(),
        })
    }

    pub fn width(&self) -> f64 {
        self.max - self.min
    }
}

/// The loss curve of one run in three numbers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossCurve {
    pub first: f64,
    pub median: f64,
    pub last: f64,
}

impl LossCurve {
    pub fn of(loss: &[f64]) -> Option<LossCurve> {
        Some(LossCurve {
            first: *loss.first()?,
            median: median(loss)?,
            last: *loss.last()?,
        })
    }
}

/// One objective over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContenderSummary {
    pub contender: Contender,
    /// Seeds whose run produced figures (failed runs are left out and listed as errors).
    pub seeds: Vec<u64>,
    pub offline_tau: Option<Spread>,
    pub offline_base_tau: Option<Spread>,
    pub online_chain_tau: Option<Spread>,
    pub online_chain_base_tau: Option<Spread>,
    pub online_ddtree_tau: BTreeMap<usize, Spread>,
    pub loss_first: Option<Spread>,
    pub loss_median: Option<Spread>,
    pub loss_last: Option<Spread>,
    /// Epoch by epoch, over the epochs every run reached.
    #[serde(default)]
    pub loss_by_epoch: Vec<Spread>,
    pub median_step_ms: Option<Spread>,
    pub peak_rss_mib: Option<Spread>,
}

fn spread_of(runs: &[&RunFigures], figure: impl Fn(&RunFigures) -> Option<f64>) -> Option<Spread> {
    let values: Option<Vec<f64>> = runs.iter().map(|r| figure(r)).collect();
    Spread::of(&values?)
}

/// Per objective, in [`Contender::ALL`]'s order, over the runs without an error. A figure
/// missing from any of those runs is `None` for the objective rather than a median of fewer
/// seeds than the others.
pub fn summarise(runs: &[RunFigures]) -> Vec<ContenderSummary> {
    Contender::ALL
        .iter()
        .filter_map(|&c| {
            let mine: Vec<&RunFigures> = runs
                .iter()
                .filter(|r| r.contender == Some(c) && r.error.is_none())
                .collect();
            if mine.is_empty() {
                return None;
            }
            let budgets: Vec<usize> = mine[0].online_ddtree_tau.keys().copied().collect();
            let online_ddtree_tau = budgets
                .into_iter()
                .filter_map(|b| {
                    spread_of(&mine, |r| r.online_ddtree_tau.get(&b).copied()).map(|s| (b, s))
                })
                .collect();
            let curve = |f: fn(&LossCurve) -> f64| {
                spread_of(&mine, move |r| LossCurve::of(&r.loss).map(|l| f(&l)))
            };
            Some(ContenderSummary {
                contender: c,
                seeds: mine.iter().map(|r| r.seed).collect(),
                offline_tau: spread_of(&mine, |r| r.offline_tau),
                offline_base_tau: spread_of(&mine, |r| r.offline_base_tau),
                online_chain_tau: spread_of(&mine, |r| r.online_chain_tau),
                online_chain_base_tau: spread_of(&mine, |r| r.online_chain_base_tau),
                online_ddtree_tau,
                loss_first: curve(|l| l.first),
                loss_median: curve(|l| l.median),
                loss_last: curve(|l| l.last),
                loss_by_epoch: (0..mine
                    .iter()
                    .map(|r| r.loss_by_epoch.len())
                    .min()
                    .unwrap_or(0))
                    .filter_map(|e| spread_of(&mine, |r| r.loss_by_epoch.get(e).copied()))
                    .collect(),
                median_step_ms: spread_of(&mine, |r| r.median_step_ms),
                peak_rss_mib: spread_of(&mine, |r| r.peak_rss_mib),
            })
        })
        .collect()
}

/// The tournament's conclusion on online chain τ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// These objectives' median beat DFlash's by more than the wider seed spread.
    Beats {
        winners: Vec<Contender>,
        sentence: String,
    },
    NoneBeats {
        sentence: String,
    },
    /// Too few seeds, or DFlash's or a contender's online chain τ is missing.
    Undecided {
        sentence: String,
    },
}

impl Verdict {
    pub fn sentence(&self) -> &str {
        match self {
            Verdict::Beats { sentence, .. }
            | Verdict::NoneBeats { sentence }
            | Verdict::Undecided { sentence } => sentence,
        }
    }
}

/// Judges every objective's online chain τ against DFlash's (see the module docs).
pub fn verdict(summaries: &[ContenderSummary]) -> Verdict {
    let find = |c: Contender| summaries.iter().find(|s| s.contender == c);
    let Some(base) = find(Contender::Dflash).and_then(|s| s.online_chain_tau) else {
        return Verdict::Undecided {
            sentence: "undecided: DFlash's online chain τ was not measured".into(),
        };
    };
    let mut lines = Vec::new();
    let mut winners = Vec::new();
    // Every contender the tournament ran; D-PACE and Domino, the published contenders, always.
    let judged = Contender::ALL.into_iter().filter(|&c| {
        matches!(c, Contender::Dpace | Contender::Domino)
            || (c != Contender::Dflash && find(c).is_some())
    });
    for c in judged {
        let Some(other) = find(c).and_then(|s| s.online_chain_tau) else {
            return Verdict::Undecided {
                sentence: format!("undecided: {}'s online chain τ was not measured", c.label()),
            };
        };
        let seeds = base.n.min(other.n);
        if seeds < MIN_SEEDS_FOR_VERDICT {
            return Verdict::Undecided {
                sentence: format!(
                    "undecided: {seeds} seed(s); the verdict needs {MIN_SEEDS_FOR_VERDICT}"
                ),
            };
        }
        let gain = other.median - base.median;
        let spread = base.width().max(other.width());
        if gain > spread {
            winners.push(c);
            lines.push(format!(
                "{} beats DFlash's online chain τ by more than the seed spread \
                 ({:.3} vs {:.3}: +{gain:.3} > spread {spread:.3})",
                c.label(),
                other.median,
                base.median
            ));
        } else {
            lines.push(format!(
                "{} {:.3} vs DFlash {:.3}: {gain:+.3}, within the seed spread {spread:.3}",
                c.label(),
                other.median,
                base.median
            ));
        }
    }
    if winners.is_empty() {
        Verdict::NoneBeats {
            sentence: format!(
                "no objective beats DFlash's online chain τ by more than the seed spread ({})",
                lines.join("; ")
            ),
        }
    } else {
        Verdict::Beats {
            winners,
            sentence: lines.join("; "),
        }
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
