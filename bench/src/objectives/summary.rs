//! The objective tournament's arithmetic, pure: each run's figures, the median and min–max
//! spread of each figure across seeds per objective, and the verdict against DFlash.
//!
//! The verdict compares the figure the tournament ranks by ([`RankBy`]: online DDTree τ at the
//! serving budget by default, since DDTree is what users serve with; or online chain τ): an
//! objective beats DFlash only when its median over seeds exceeds DFlash's by more than the
//! wider of the two min–max spreads, so a gain inside seed-to-seed noise is never called a win.
//! The tree objective is also judged against the same head trained on DFlash's loss, with its
//! chain τ beside.
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
    /// DSpark's head and loss (`drafter.head = "dspark"`), as SpecForge's DSpark trains.
    Dspark,
    /// DFlash2's convolutions and selector (`drafter.head = "dflash2"`), DFlash's loss plus
    /// the selector's, as SpecForge trains DFlash2.
    Dflash2,
    /// DFlash2's head with the tree objective as its base loss (the selector's term added).
    #[serde(rename = "dflash2_tree")]
    Dflash2Tree,
}

impl Contender {
    pub const ALL: [Contender; 8] = [
        Contender::Dflash,
        Contender::Dpace,
        Contender::Domino,
        Contender::Tree,
        Contender::DominoTree,
        Contender::Dspark,
        Contender::Dflash2,
        Contender::Dflash2Tree,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Dflash => "dflash",
            Contender::Dpace => "dpace",
            Contender::Domino => "domino",
            Contender::Tree => "tree",
            Contender::DominoTree => "domino_tree",
            Contender::Dspark => "dspark",
            Contender::Dflash2 => "dflash2",
            Contender::Dflash2Tree => "dflash2_tree",
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
            Contender::Dspark => "DSpark",
            Contender::Dflash2 => "DFlash2",
            Contender::Dflash2Tree => "DFlash2 + Tree",
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
    /// The offline eval's DDTree oracle τ (`tau_tree_oracle`), by budget.
    pub offline_tree_oracle: BTreeMap<usize, f64>,
    /// The offline eval's top-K recall of the gold token (`topk_recall`), by K, averaged
    /// over the block's slots.
    pub offline_topk_recall: BTreeMap<usize, f64>,
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
    #[serde(default)]
    pub offline_tree_oracle: BTreeMap<usize, Spread>,
    #[serde(default)]
    pub offline_topk_recall: BTreeMap<usize, Spread>,
    pub loss_first: Option<Spread>,
    pub loss_median: Option<Spread>,
    pub loss_last: Option<Spread>,
    /// Epoch by epoch, over the epochs every run reached.
    #[serde(default)]
    pub loss_by_epoch: Vec<Spread>,
    pub median_step_ms: Option<Spread>,
    pub peak_rss_mib: Option<Spread>,
}

impl ContenderSummary {
    /// The figure the tournament ranks by.
    pub fn ranked(&self, by: RankBy) -> Option<Spread> {
        match by {
            RankBy::Chain => self.online_chain_tau,
            RankBy::Ddtree(budget) => self.online_ddtree_tau.get(&budget).copied(),
        }
    }
}

/// What the tournament ranks and judges objectives by: `--rank-by chain|ddtree_B`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RankBy {
    /// Online chain τ.
    Chain,
    /// Online DDTree τ at this node budget (the serving budget, `training.serve_tree_budget`).
    Ddtree(usize),
}

impl Default for RankBy {
    /// Results written before ranking was a choice were judged on the chain.
    fn default() -> Self {
        RankBy::Chain
    }
}

impl RankBy {
    pub fn parse(text: &str) -> Result<RankBy, String> {
        if text == "chain" {
            return Ok(RankBy::Chain);
        }
        match text.strip_prefix("ddtree_").map(str::parse::<usize>) {
            Some(Ok(b)) if b > 0 => Ok(RankBy::Ddtree(b)),
            _ => Err(format!(
                "expected chain or ddtree_<budget> (e.g. ddtree_32, the serving budget), found {text:?}"
            )),
        }
    }

    /// How the verdict names the figure.
    pub fn figure(self) -> String {
        match self {
            RankBy::Chain => "online chain τ".into(),
            RankBy::Ddtree(b) => format!("online DDTree τ at budget {b}"),
        }
    }
}

impl TryFrom<String> for RankBy {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        RankBy::parse(&text)
    }
}

impl From<RankBy> for String {
    fn from(by: RankBy) -> String {
        match by {
            RankBy::Chain => "chain".into(),
            RankBy::Ddtree(b) => format!("ddtree_{b}"),
        }
    }
}

fn spread_of(runs: &[&RunFigures], figure: impl Fn(&RunFigures) -> Option<f64>) -> Option<Spread> {
    let values: Option<Vec<f64>> = runs.iter().map(|r| figure(r)).collect();
    Spread::of(&values?)
}

/// Per key of the first run's `map`, the spread over the runs (keys some run lacks are left
/// out).
fn spreads_by_key(
    runs: &[&RunFigures],
    map: impl Fn(&RunFigures) -> &BTreeMap<usize, f64>,
) -> BTreeMap<usize, Spread> {
    let keys: Vec<usize> = runs
        .first()
        .map_or_else(Vec::new, |r| map(r).keys().copied().collect());
    keys.into_iter()
        .filter_map(|k| spread_of(runs, |r| map(r).get(&k).copied()).map(|s| (k, s)))
        .collect()
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
                online_ddtree_tau: spreads_by_key(&mine, |r| &r.online_ddtree_tau),
                offline_tree_oracle: spreads_by_key(&mine, |r| &r.offline_tree_oracle),
                offline_topk_recall: spreads_by_key(&mine, |r| &r.offline_topk_recall),
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

/// The tournament's conclusion on the figure it ranks by.
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
    /// Too few seeds, or DFlash's or a contender's figure is missing.
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

/// `ours` against `base`: the median gain and the wider spread it must exceed.
struct Gain {
    ours: f64,
    base: f64,
    gain: f64,
    spread: f64,
}

impl Gain {
    fn of(ours: Spread, base: Spread) -> Gain {
        Gain {
            ours: ours.median,
            base: base.median,
            gain: ours.median - base.median,
            spread: ours.width().max(base.width()),
        }
    }

    fn beyond_spread(&self) -> bool {
        self.gain > self.spread
    }

    /// `+4.1 %` of the base.
    fn percent(&self) -> f64 {
        100.0 * self.gain / self.base
    }
}

/// Judges every objective's ranked figure against DFlash's (see the module docs).
pub fn verdict(summaries: &[ContenderSummary], by: RankBy) -> Verdict {
    let find = |c: Contender| summaries.iter().find(|s| s.contender == c);
    let figure = by.figure();
    let Some(base) = find(Contender::Dflash).and_then(|s| s.ranked(by)) else {
        return Verdict::Undecided {
            sentence: format!("undecided: DFlash's {figure} was not measured"),
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
        let Some(other) = find(c).and_then(|s| s.ranked(by)) else {
            return Verdict::Undecided {
                sentence: format!("undecided: {}'s {figure} was not measured", c.label()),
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
        let g = Gain::of(other, base);
        if g.beyond_spread() {
            winners.push(c);
            lines.push(format!(
                "{} beats DFlash's {figure} by more than the seed spread \
                 ({:.3} vs {:.3}: +{:.3} > spread {:.3})",
                c.label(),
                g.ours,
                g.base,
                g.gain,
                g.spread
            ));
        } else {
            lines.push(format!(
                "{} {:.3} vs DFlash {:.3}: {:+.3}, within the seed spread {:.3}",
                c.label(),
                g.ours,
                g.base,
                g.gain,
                g.spread
            ));
        }
    }
    if winners.is_empty() {
        Verdict::NoneBeats {
            sentence: format!(
                "no objective beats DFlash's {figure} by more than the seed spread ({})",
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

/// The tree objective against the same head trained on DFlash's loss (Tree against DFlash,
/// Domino + Tree against Domino): the ranked figure's gain in percent and whether it is beyond
/// the seed spread, and the chain τ's change beside it. One sentence per pair that ran.
pub fn tree_objective_gains(summaries: &[ContenderSummary], by: RankBy) -> Vec<String> {
    let find = |c: Contender| summaries.iter().find(|s| s.contender == c);
    [
        (Contender::Tree, Contender::Dflash),
        (Contender::DominoTree, Contender::Domino),
    ]
    .into_iter()
    .filter_map(|(tree, base)| {
        let (t, b) = (find(tree)?, find(base)?);
        let ranked = Gain::of(t.ranked(by)?, b.ranked(by)?);
        let chain = match (t.online_chain_tau, b.online_chain_tau) {
            (Some(tc), Some(bc)) => {
                let c = Gain::of(tc, bc);
                let worse = -c.gain > c.spread;
                format!(
                    "chain τ {:.3} vs {:.3} ({:+.1} %, {})",
                    c.ours,
                    c.base,
                    c.percent(),
                    if worse {
                        "worse beyond the spread"
                    } else {
                        "no worse beyond the spread"
                    }
                )
            }
            _ => "chain τ not measured".into(),
        };
        Some(format!(
            "{} vs {}: {} {:.3} vs {:.3} ({:+.1} %, {} the seed spread {:.3}); {chain}",
            tree.label(),
            base.label(),
            by.figure(),
            ranked.ours,
            ranked.base,
            ranked.percent(),
            if ranked.beyond_spread() {
                "beyond"
            } else {
                "within"
            },
            ranked.spread
        ))
    })
    .collect()
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
