//! The held-out evaluation's DDTree oracle τ on a metrics line, beside the chain τ (`tau`) of
//! the same evaluation.
//!
//! The drafter is served with DDTree (tree verification), so a run is judged by the tree τ at
//! the budget it is served with (`training.serve_tree_budget`), and that budget travels with
//! the figure: a reader of the line, the console and a Prometheus scrape never need the config
//! to know which budget a tree τ is. Written flat into the line:
//!
//! | key | meaning |
//! |---|---|
//! | `serve_tree_budget` | the DDTree node budget the drafter is served with |
//! | `tau_tree_oracle_<budget>` | the best-first DDTree of `<budget>` nodes built from the drafter's own distributions at every held-out block, scored by the deepest gold prefix it holds, plus one (`dflashd eval`'s `tau_tree_oracle`); one per budget |
//!
//! A line without `serve_tree_budget` has no tree figures (`None`): a line of a step without
//! an evaluation, and every line of a file written before they existed.
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const SERVE_BUDGET: &str = "serve_tree_budget";
const ORACLE_PREFIX: &str = "tau_tree_oracle_";

/// How a tree figure is labelled wherever it stands beside chain τ: `tree@32`.
pub fn tree_label(budget: usize) -> String {
    format!("tree@{budget}")
}

/// "chain 3.72 · tree@32 4.45": chain τ and, beside it, the tree τ at the serving budget, two
/// decimals, as the console and `dflash-tui status` show them; the chain alone without a tree
/// figure.
pub fn chain_and_tree_words(chain: f64, tree: Option<(usize, f64)>) -> String {
    match tree {
        Some((budget, tau)) => format!("chain {chain:.2} · {} {tau:.2}", tree_label(budget)),
        None => format!("chain {chain:.2}"),
    }
}

/// The DDTree oracle τ of one held-out evaluation, by budget, and the budget serving uses.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeOracleTau {
    /// `training.serve_tree_budget`: the budget the drafter is served with.
    pub serve_budget: usize,
    /// Budget → oracle τ on the held-out blocks; holds the serving budget (the evaluation
    /// scores it whether or not it is among the configured budgets).
    pub by_budget: BTreeMap<usize, f64>,
}

impl TreeOracleTau {
    /// The metrics-line key of a budget's oracle τ: `tau_tree_oracle_32`.
    pub fn key(budget: usize) -> String {
        format!("{ORACLE_PREFIX}{budget}")
    }

    /// The headline: the serving budget and its oracle τ; `None` when the evaluation did not
    /// score that budget.
    pub fn at_serve_budget(&self) -> Option<(usize, f64)> {
        let tau = self.by_budget.get(&self.serve_budget)?;
        Some((self.serve_budget, *tau))
    }
}

impl Serialize for TreeOracleTau {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry(SERVE_BUDGET, &self.serve_budget)?;
        for (budget, tau) in &self.by_budget {
            map.serialize_entry(&Self::key(*budget), tau)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TreeOracleTau {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = TreeOracleTau;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a metrics line with `{SERVE_BUDGET}`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut serve_budget = None;
        let mut by_budget = BTreeMap::new();
        // Flattened into a metrics line, this sees every key the line's own fields did not
        // take: the ones that are not ours are skipped.
        while let Some(key) = map.next_key::<String>()? {
            if key == SERVE_BUDGET {
                serve_budget = Some(map.next_value::<usize>()?);
            } else if let Some(budget) = key.strip_prefix(ORACLE_PREFIX) {
                let budget = budget.parse::<usize>().map_err(|_| {
                    serde::de::Error::custom(format!(
                        "`{key}`: a DDTree budget must be a whole number of nodes"
                    ))
                })?;
                // A NaN was written as `null`; it reads back as NaN, as the other figures do.
                let tau = map.next_value::<Option<f64>>()?.unwrap_or(f64::NAN);
                by_budget.insert(budget, tau);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        let serve_budget =
            serve_budget.ok_or_else(|| serde::de::Error::missing_field(SERVE_BUDGET))?;
        Ok(TreeOracleTau {
            serve_budget,
            by_budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{StepMetrics, StepTimes};

    fn line(tau_tree: Option<TreeOracleTau>) -> StepMetrics {
        StepMetrics {
            ts_ms: 1_000,
            step: 100,
            epoch: 1,
            loss: 2.0,
            accuracy: 0.4,
            tau: Some(3.5),
            tau_tree,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 900.0,
            draft_positions_per_s: 4_000.0,
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

    fn oracle() -> TreeOracleTau {
        TreeOracleTau {
            serve_budget: 32,
            by_budget: BTreeMap::from([(8, 3.75), (32, 4.5)]),
        }
    }

    #[test]
    fn the_line_carries_the_serving_budget_and_each_budgets_oracle_flat_and_reads_back() {
        let m = line(Some(oracle()));
        let value = serde_json::to_value(&m).unwrap();
        assert_eq!(value["serve_tree_budget"], 32);
        assert_eq!(value["tau_tree_oracle_8"], 3.75);
        assert_eq!(value["tau_tree_oracle_32"], 4.5);
        assert_eq!(value["tau"], 3.5);
        assert!(value.get("tau_tree").is_none(), "flat, not nested: {value}");
        let back: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.tau_tree.unwrap().at_serve_budget(), Some((32, 4.5)));
    }

    #[test]
    fn a_line_without_the_serving_budget_has_no_tree_figures_and_writes_none() {
        let m = line(None);
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("tree"), "{text}");
        assert_eq!(serde_json::from_str::<StepMetrics>(&text).unwrap(), m);
        // A line written before the tree figures existed.
        let old = r#"{"ts_ms":5,"step":3,"epoch":1,"loss":1.5,"accuracy":0.2,"tau":2.5,
            "lr":0.001,"grad_norm":0.3,"tokens_per_s":10.0}"#;
        let read: StepMetrics = serde_json::from_str(old).unwrap();
        assert_eq!((read.tau, read.tau_tree), (Some(2.5), None));
    }

    #[test]
    fn the_headline_is_absent_when_the_serving_budget_was_not_scored_and_nan_reads_as_nan() {
        let unscored = TreeOracleTau {
            serve_budget: 64,
            ..oracle()
        };
        assert_eq!(unscored.at_serve_budget(), None);
        let nan = TreeOracleTau {
            serve_budget: 8,
            by_budget: BTreeMap::from([(8, f64::NAN)]),
        };
        let text = serde_json::to_string(&line(Some(nan))).unwrap();
        let back = serde_json::from_str::<StepMetrics>(&text).unwrap();
        let (budget, tau) = back.tau_tree.unwrap().at_serve_budget().unwrap();
        assert_eq!(budget, 8);
        assert!(tau.is_nan());
    }

    #[test]
    fn a_budget_that_is_not_a_number_makes_the_tree_figures_unreadable_not_the_line() {
        let mut value = serde_json::to_value(line(Some(oracle()))).unwrap();
        value["tau_tree_oracle_big"] = serde_json::json!(3.0);
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!((read.step, read.tau, read.tau_tree), (100, Some(3.5), None));
    }

    #[test]
    fn the_words_name_the_budget_beside_chain_tau() {
        assert_eq!(tree_label(32), "tree@32");
        assert_eq!(
            chain_and_tree_words(3.724, Some((32, 4.446))),
            "chain 3.72 · tree@32 4.45"
        );
        assert_eq!(chain_and_tree_words(3.724, None), "chain 3.72");
    }
}
