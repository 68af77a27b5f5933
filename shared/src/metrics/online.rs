//! Online acceptance on a metrics line: what real speculative decoding against the target
//! measured at that step, beside the offline τ the same line may carry.
//!
//! One metrics JSONL contract: these figures are fields of [`super::StepMetrics`], flattened
//! into the line under names that say what they are, so `jq`, TensorBoard (which derives its
//! scalars from the serialized line) and a reader who greps all see the same names:
//!
//! | key | meaning |
//! |---|---|
//! | `online_tau_chain` | mean over prompts of tokens per target forward, chain decoding |
//! | `online_tau_ddtree_<budget>` | the same with a DDTree of `<budget>` nodes, one per budget |
//! | `online_serve_tree_budget` | the DDTree budget the drafter is served with: its `online_tau_ddtree_<budget>` is the headline tree figure |
//! | `online_base_tau_chain` | a Domino drafter's chain τ drafting from the LM head alone |
//! | `online_base_tau_ddtree_<budget>` | the same with a DDTree, one per budget |
//! | `online_eval_offline_tau` | the offline τ of the same moment, when known |
//! | `online_eval_prompts` | prompts decoded |
//! | `online_eval_s` | wall seconds the online evaluation took |
//!
//! A line without `online_tau_chain` has no online evaluation (`None`), which is every line of
//! a file written before online evaluation existed. A line without `online_base_tau_chain` has
//! no base figures: a DFlash drafter's (its drafts are its LM head's), or one written before
//! they existed. The base figures are SpecForge's `base_accept_len` served: the same prompts
//! decoded by the same drafter with its Domino correction left out, so `tau_chain −
//! base.tau_chain` is what the correction adds to served acceptance.
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every key of an online evaluation starts with this.
pub const ONLINE_KEY_PREFIX: &str = "online_";
const TAU_CHAIN: &str = "online_tau_chain";
const TAU_DDTREE_PREFIX: &str = "online_tau_ddtree_";
const SERVE_TREE_BUDGET: &str = "online_serve_tree_budget";
const BASE_TAU_CHAIN: &str = "online_base_tau_chain";
const BASE_TAU_DDTREE_PREFIX: &str = "online_base_tau_ddtree_";
const OFFLINE_TAU: &str = "online_eval_offline_tau";
const PROMPTS: &str = "online_eval_prompts";
const SECONDS: &str = "online_eval_s";

/// One online evaluation: chain and DDTree speculative decoding over a small prompt set.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineAcceptance {
    /// Chain decoding (one block verified per target forward): mean over prompts of each
    /// prompt's mean tokens per target forward, bonus token included.
    pub tau_chain: f64,
    /// DDTree decoding, by node budget. Empty when only the chain ran.
    pub tau_ddtree: BTreeMap<usize, f64>,
    /// `training.serve_tree_budget`, the budget the drafter is served with, so the figure at
    /// it can be named without the config. `None` in lines written before it.
    pub serve_tree_budget: Option<usize>,
    /// The offline τ (anchors at every position) of the same drafter at the same moment, when
    /// one is known: what the train-versus-serve gap is measured against.
    pub offline_tau: Option<f64>,
    /// A Domino drafter's figures drafting from the LM head's logits alone (its correction
    /// left out), method for method; `None` for a DFlash drafter.
    pub base: Option<OnlineBase>,
    /// Prompts decoded.
    pub prompts: usize,
    /// Wall seconds the whole online evaluation took (the base decoding included).
    pub seconds: f64,
}

/// The uncorrected drafter's online τ: the same methods over the same prompts, drafting from
/// the LM head's logits alone (`dflashd eval --online`'s `base_tau`).
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineBase {
    /// Chain decoding, counted as [`OnlineAcceptance::tau_chain`] is.
    pub tau_chain: f64,
    /// DDTree decoding by node budget, the same budgets as the corrected figures'.
    pub tau_ddtree: BTreeMap<usize, f64>,
}

impl OnlineAcceptance {
    /// The metrics-line key of a DDTree budget: `online_tau_ddtree_16`.
    pub fn ddtree_key(budget: usize) -> String {
        format!("{TAU_DDTREE_PREFIX}{budget}")
    }

    /// Each method's τ by the name `dflashd eval --online` gives it: `chain` first, then
    /// `ddtree_<budget>` by growing budget.
    pub fn methods(&self) -> Vec<(String, f64)> {
        std::iter::once(("chain".to_string(), self.tau_chain))
            .chain(
                self.tau_ddtree
                    .iter()
                    .map(|(b, t)| (format!("ddtree_{b}"), *t)),
            )
            .collect()
    }

    /// The headline tree figure: the serving budget and the DDTree τ decoded at it; `None`
    /// when the budget is unknown or was not decoded.
    pub fn serve_tau_ddtree(&self) -> Option<(usize, f64)> {
        let budget = self.serve_tree_budget?;
        Some((budget, *self.tau_ddtree.get(&budget)?))
    }

    /// The base figures by the same names as [`Self::methods`], in the same order; empty for
    /// a DFlash drafter.
    pub fn base_methods(&self) -> Vec<(String, f64)> {
        self.base.as_ref().map_or_else(Vec::new, |b| {
            std::iter::once(("chain".to_string(), b.tau_chain))
                .chain(
                    b.tau_ddtree
                        .iter()
                        .map(|(k, t)| (format!("ddtree_{k}"), *t)),
                )
                .collect()
        })
    }

    /// How far online chain τ falls short of the offline τ, as a fraction of the offline τ
    /// (0.2: online is 20 % lower; negative: online is higher). `None` without a usable
    /// offline τ.
    pub fn gap_fraction(&self) -> Option<f64> {
        let offline = self.offline_tau.filter(|t| t.is_finite() && *t > 0.0)?;
        self.tau_chain
            .is_finite()
            .then(|| (offline - self.tau_chain) / offline)
    }
}

impl Serialize for OnlineAcceptance {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry(TAU_CHAIN, &self.tau_chain)?;
        for (budget, tau) in &self.tau_ddtree {
            map.serialize_entry(&Self::ddtree_key(*budget), tau)?;
        }
        if let Some(budget) = self.serve_tree_budget {
            map.serialize_entry(SERVE_TREE_BUDGET, &budget)?;
        }
        if let Some(base) = &self.base {
            map.serialize_entry(BASE_TAU_CHAIN, &base.tau_chain)?;
            for (budget, tau) in &base.tau_ddtree {
                map.serialize_entry(&format!("{BASE_TAU_DDTREE_PREFIX}{budget}"), tau)?;
            }
        }
        if let Some(offline) = self.offline_tau {
            map.serialize_entry(OFFLINE_TAU, &offline)?;
        }
        map.serialize_entry(PROMPTS, &self.prompts)?;
        map.serialize_entry(SECONDS, &self.seconds)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for OnlineAcceptance {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(OnlineVisitor)
    }
}

struct OnlineVisitor;

/// `budget` of the key `k` (what follows its prefix) as a whole number of nodes.
fn budget_of<E: serde::de::Error>(k: &str, budget: &str) -> Result<usize, E> {
    budget.parse::<usize>().map_err(|_| {
        E::custom(format!(
            "`{k}`: a DDTree budget must be a whole number of nodes"
        ))
    })
}

/// A figure serde_json wrote as `null` (a NaN) reads back as NaN, as the other figures do.
fn number_or_nan<'de, A: MapAccess<'de>>(map: &mut A) -> Result<f64, A::Error> {
    Ok(map.next_value::<Option<f64>>()?.unwrap_or(f64::NAN))
}

impl<'de> Visitor<'de> for OnlineVisitor {
    type Value = OnlineAcceptance;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a metrics line with `{TAU_CHAIN}`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut tau_chain = None;
        let (mut base_chain, mut base_ddtree) = (None, BTreeMap::new());
        let mut out = OnlineAcceptance {
            tau_chain: f64::NAN,
            tau_ddtree: BTreeMap::new(),
            serve_tree_budget: None,
            offline_tau: None,
            base: None,
            prompts: 0,
            seconds: 0.0,
        };
        // Flattened into a metrics line, this sees every key the line's own fields did not
        // take: the ones that are not ours are skipped.
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                TAU_CHAIN => tau_chain = Some(number_or_nan(&mut map)?),
                BASE_TAU_CHAIN => base_chain = Some(number_or_nan(&mut map)?),
                OFFLINE_TAU => out.offline_tau = map.next_value::<Option<f64>>()?,
                SERVE_TREE_BUDGET => out.serve_tree_budget = map.next_value()?,
                PROMPTS => out.prompts = map.next_value()?,
                SECONDS => out.seconds = number_or_nan(&mut map)?,
                k => {
                    if let Some(budget) = k.strip_prefix(TAU_DDTREE_PREFIX) {
                        let budget = budget_of(k, budget)?;
                        out.tau_ddtree.insert(budget, number_or_nan(&mut map)?);
                    } else if let Some(budget) = k.strip_prefix(BASE_TAU_DDTREE_PREFIX) {
                        let budget = budget_of(k, budget)?;
                        base_ddtree.insert(budget, number_or_nan(&mut map)?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
        }
        out.tau_chain = tau_chain.ok_or_else(|| serde::de::Error::missing_field(TAU_CHAIN))?;
        // Base tree figures without a base chain are not a base evaluation: every base
        // evaluation runs the chain first, so such a line was written by something else.
        out.base = base_chain.map(|tau_chain| OnlineBase {
            tau_chain,
            tau_ddtree: base_ddtree,
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{StepMetrics, StepTimes};

    fn line(online: Option<OnlineAcceptance>) -> StepMetrics {
        StepMetrics {
            ts_ms: 1_000,
            step: 100,
            epoch: 1,
            loss: 2.0,
            accuracy: 0.4,
            tau: Some(3.5),
            tau_tree: None,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 900.0,
            draft_positions_per_s: 4_000.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        }
    }

    fn acceptance() -> OnlineAcceptance {
        OnlineAcceptance {
            tau_chain: 2.75,
            tau_ddtree: BTreeMap::from([(8, 3.0), (32, 3.25)]),
            serve_tree_budget: Some(32),
            offline_tau: Some(3.5),
            base: None,
            prompts: 8,
            seconds: 1.5,
        }
    }

    fn domino_acceptance() -> OnlineAcceptance {
        OnlineAcceptance {
            base: Some(OnlineBase {
                tau_chain: 2.25,
                tau_ddtree: BTreeMap::from([(8, 2.5), (32, 2.625)]),
            }),
            ..acceptance()
        }
    }

    #[test]
    fn the_line_carries_flat_keys_named_after_the_method_and_reads_back_equal() {
        let m = line(Some(acceptance()));
        let value = serde_json::to_value(&m).unwrap();
        assert_eq!(value["online_tau_chain"], 2.75);
        assert_eq!(value["online_tau_ddtree_8"], 3.0);
        assert_eq!(value["online_tau_ddtree_32"], 3.25);
        assert_eq!(value["online_serve_tree_budget"], 32);
        assert_eq!(value["online_eval_offline_tau"], 3.5);
        assert_eq!(value["online_eval_prompts"], 8);
        assert_eq!(value["online_eval_s"], 1.5);
        assert!(value.get("online").is_none(), "flat, not nested: {value}");
        let back: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.online.unwrap().serve_tau_ddtree(), Some((32, 3.25)));
    }

    #[test]
    fn the_headline_tree_figure_needs_the_serving_budget_decoded_and_older_lines_lack_it() {
        let unknown = OnlineAcceptance {
            serve_tree_budget: None,
            ..acceptance()
        };
        assert_eq!(unknown.serve_tau_ddtree(), None);
        let undecoded = OnlineAcceptance {
            serve_tree_budget: Some(64),
            ..acceptance()
        };
        assert_eq!(undecoded.serve_tau_ddtree(), None);
        let mut value = serde_json::to_value(line(Some(acceptance()))).unwrap();
        value
            .as_object_mut()
            .unwrap()
            .remove("online_serve_tree_budget");
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        let online = read.online.expect("still an online evaluation");
        assert_eq!((online.serve_tree_budget, online.tau_chain), (None, 2.75));
    }

    #[test]
    fn a_line_without_online_figures_reads_as_none_and_writes_none() {
        let m = line(None);
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains(ONLINE_KEY_PREFIX), "{text}");
        assert_eq!(serde_json::from_str::<StepMetrics>(&text).unwrap(), m);
        // A line written before online evaluation existed (and before draft positions).
        let old = r#"{"ts_ms":5,"step":3,"epoch":1,"loss":1.5,"accuracy":0.2,"lr":0.001,
            "grad_norm":0.3,"tokens_per_s":10.0,"workers":[],"times":{"data_wait_ms":0.0,
            "target_forward_ms":0.0,"queue_wait_ms":0.0,"drafter_forward_backward_ms":0.0,
            "all_reduce_ms":0.0,"optimizer_ms":0.0,"total_ms":0.0}}"#;
        let read: StepMetrics = serde_json::from_str(old).unwrap();
        assert_eq!((read.step, read.online), (3, None));
    }

    #[test]
    fn chain_only_has_no_tree_keys_and_a_nan_reads_back_as_nan() {
        let chain_only = OnlineAcceptance {
            tau_ddtree: BTreeMap::new(),
            serve_tree_budget: None,
            offline_tau: None,
            tau_chain: f64::NAN,
            ..acceptance()
        };
        let text = serde_json::to_string(&line(Some(chain_only))).unwrap();
        assert!(
            !text.contains("ddtree") && !text.contains("offline_tau"),
            "{text}"
        );
        let back = serde_json::from_str::<StepMetrics>(&text).unwrap();
        let online = back.online.expect("null τ is still an online evaluation");
        assert!(online.tau_chain.is_nan());
    }

    #[test]
    fn methods_are_named_as_dflashd_eval_names_them_and_the_gap_is_relative_to_offline() {
        let a = acceptance();
        assert_eq!(
            a.methods(),
            vec![
                ("chain".to_string(), 2.75),
                ("ddtree_8".to_string(), 3.0),
                ("ddtree_32".to_string(), 3.25)
            ]
        );
        assert_eq!(a.gap_fraction(), Some((3.5 - 2.75) / 3.5));
        let above = OnlineAcceptance {
            tau_chain: 4.0,
            ..a.clone()
        };
        assert!(above.gap_fraction().unwrap() < 0.0);
        let unknown = OnlineAcceptance {
            offline_tau: None,
            ..a
        };
        assert_eq!(unknown.gap_fraction(), None);
    }

    #[test]
    fn a_domino_line_carries_its_base_figures_flat_and_reads_them_back() {
        let m = line(Some(domino_acceptance()));
        let value = serde_json::to_value(&m).unwrap();
        assert_eq!(value["online_base_tau_chain"], 2.25);
        assert_eq!(value["online_base_tau_ddtree_8"], 2.5);
        assert_eq!(value["online_base_tau_ddtree_32"], 2.625);
        // the corrected figures keep their own keys, unchanged by the base ones
        assert_eq!(value["online_tau_chain"], 2.75);
        assert_eq!(value["online_tau_ddtree_8"], 3.0);
        let back: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!(back, m);
        let online = back.online.unwrap();
        assert_eq!(
            online.base_methods(),
            vec![
                ("chain".to_string(), 2.25),
                ("ddtree_8".to_string(), 2.5),
                ("ddtree_32".to_string(), 2.625)
            ]
        );
        assert_eq!(online.tau_ddtree, acceptance().tau_ddtree);
    }

    #[test]
    fn a_dflash_line_has_no_base_keys_and_an_older_line_reads_without_base() {
        let text = serde_json::to_string(&line(Some(acceptance()))).unwrap();
        assert!(!text.contains("online_base"), "{text}");
        let back: StepMetrics = serde_json::from_str(&text).unwrap();
        let online = back.online.unwrap();
        assert_eq!((online.base.clone(), online.base_methods()), (None, vec![]));
        // a stray base tree key without the base chain is no base evaluation
        let mut value = serde_json::to_value(line(Some(acceptance()))).unwrap();
        value["online_base_tau_ddtree_8"] = serde_json::json!(2.0);
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!(read.online.unwrap().base, None);
    }

    #[test]
    fn a_budget_that_is_not_a_number_makes_the_online_figures_unreadable_not_the_line() {
        let mut value = serde_json::to_value(line(Some(acceptance()))).unwrap();
        value["online_tau_ddtree_big"] = serde_json::json!(3.0);
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!((read.step, read.online), (100, None));
        let mut value = serde_json::to_value(line(Some(domino_acceptance()))).unwrap();
        value["online_base_tau_ddtree_big"] = serde_json::json!(3.0);
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!((read.step, read.online), (100, None));
    }
}
