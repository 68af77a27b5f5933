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
//! | `online_eval_offline_tau` | the offline τ of the same moment, when known |
//! | `online_eval_prompts` | prompts decoded |
//! | `online_eval_s` | wall seconds the online evaluation took |
//!
//! A line without `online_tau_chain` has no online evaluation (`None`), which is every line of
//! a file written before online evaluation existed.
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every key of an online evaluation starts with this.
pub const ONLINE_KEY_PREFIX: &str = "online_";
const TAU_CHAIN: &str = "online_tau_chain";
const TAU_DDTREE_PREFIX: &str = "online_tau_ddtree_";
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
    /// The offline τ (anchors at every position) of the same drafter at the same moment, when
    /// one is known: what the train-versus-serve gap is measured against.
    pub offline_tau: Option<f64>,
    /// Prompts decoded.
    pub prompts: usize,
    /// Wall seconds the whole online evaluation took.
    pub seconds: f64,
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
        let mut out = OnlineAcceptance {
            tau_chain: f64::NAN,
            tau_ddtree: BTreeMap::new(),
            offline_tau: None,
            prompts: 0,
            seconds: 0.0,
        };
        // Flattened into a metrics line, this sees every key the line's own fields did not
        // take: the ones that are not ours are skipped.
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                TAU_CHAIN => tau_chain = Some(number_or_nan(&mut map)?),
                OFFLINE_TAU => out.offline_tau = map.next_value::<Option<f64>>()?,
                PROMPTS => out.prompts = map.next_value()?,
                SECONDS => out.seconds = number_or_nan(&mut map)?,
                k => match k.strip_prefix(TAU_DDTREE_PREFIX) {
                    Some(budget) => {
                        let budget = budget.parse::<usize>().map_err(|_| {
                            serde::de::Error::custom(format!(
                                "`{k}`: a DDTree budget must be a whole number of nodes"
                            ))
                        })?;
                        let tau = number_or_nan(&mut map)?;
                        out.tau_ddtree.insert(budget, tau);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
            }
        }
        out.tau_chain = tau_chain.ok_or_else(|| serde::de::Error::missing_field(TAU_CHAIN))?;
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
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 900.0,
            draft_positions_per_s: 4_000.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online,
            domino: None,
        }
    }

    fn acceptance() -> OnlineAcceptance {
        OnlineAcceptance {
            tau_chain: 2.75,
            tau_ddtree: BTreeMap::from([(8, 3.0), (32, 3.25)]),
            offline_tau: Some(3.5),
            prompts: 8,
            seconds: 1.5,
        }
    }

    #[test]
    fn the_line_carries_flat_keys_named_after_the_method_and_reads_back_equal() {
        let m = line(Some(acceptance()));
        let value = serde_json::to_value(&m).unwrap();
        assert_eq!(value["online_tau_chain"], 2.75);
        assert_eq!(value["online_tau_ddtree_8"], 3.0);
        assert_eq!(value["online_tau_ddtree_32"], 3.25);
        assert_eq!(value["online_eval_offline_tau"], 3.5);
        assert_eq!(value["online_eval_prompts"], 8);
        assert_eq!(value["online_eval_s"], 1.5);
        assert!(value.get("online").is_none(), "flat, not nested: {value}");
        let back: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!(back, m);
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
    fn a_budget_that_is_not_a_number_makes_the_online_figures_unreadable_not_the_line() {
        let mut value = serde_json::to_value(line(Some(acceptance()))).unwrap();
        value["online_tau_ddtree_big"] = serde_json::json!(3.0);
        let read: StepMetrics = serde_json::from_value(value).unwrap();
        assert_eq!((read.step, read.online), (100, None));
    }
}
