//! Whether the nodes of a job may start together (issue 23, part 3): each node publishes its
//! [`StartFacts`] through the rendezvous store (serde, so they travel as bytes), and every
//! node runs [`check_agreement`] on all of them, so all refuse with the same sentence.
//!
//! Node 0 is the reference; nodes are compared in rank order and, within a node, facts in
//! this order: the launch (node count, ranks), locked config keys (in `LOCKED_KEYS` order),
//! the other job config keys (in key order), the config digest, the environment fingerprint,
//! the drafter worker count, the resume step. The first difference is the refusal.
//!
//! A fresh start that warm-starts (`drafter.init_from`) then compares what each node loaded,
//! after loading: every weights file's SHA-256 ([`InitFromFacts`], [`check_init_from`]). The
//! config compares only the path, and each node reads its own copy of it.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::LOCKED_KEYS;
use crate::health::fingerprint::{diff_fingerprints, Fingerprint};

/// What one node brings to the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartFacts {
    pub node_rank: u32,
    pub nnodes: u32,
    /// [`super::job_config`] of the node's config.
    pub config: BTreeMap<String, String>,
    /// SHA-256 of [`super::job_config_text`], hex.
    pub config_digest: String,
    pub fingerprint: Fingerprint,
    /// Drafter workers this node runs; every node must run as many, or the global ranks of
    /// the data shard (`engine/src/train/shard.rs`) do not tile.
    pub drafter_workers: u32,
    /// The checkpoint step the node resumes from; 0 for a fresh start.
    pub resume_step: u64,
}

/// Fingerprint fields that may differ between nodes: each node has its own host name and
/// interpreter path (the packages in it are compared), its config file may sit in another
/// checkout (the job config is compared key by key), and the allocator's layout changes no
/// number. Everything else, the dflashd build included (the nodes run one step together),
/// must agree.
pub const NODE_OWN_FINGERPRINT_FIELDS: &[&str] = &[
    "hostname",
    "python_executable",
    "config_git_commit",
    "config_hash",
    "cuda_alloc_conf",
];

/// The first way a node differs from node 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Disagreement {
    /// The facts do not name each rank of `0..nnodes` once.
    Ranks { detail: String },
    NodeCount {
        node: u32,
        nnodes: u32,
        reference: u32,
    },
    ConfigKey {
        node: u32,
        key: String,
        value: String,
        reference: String,
        locked: bool,
    },
    ConfigDigest {
        node: u32,
        digest: String,
        reference: String,
    },
    Environment {
        node: u32,
        field: String,
        value: String,
        reference: String,
    },
    DrafterWorkers {
        node: u32,
        workers: u32,
        reference: u32,
    },
    ResumeStep {
        node: u32,
        step: u64,
        reference: u64,
    },
    /// A weights file of `drafter.init_from` that differs from node 0's (`None`: the node has
    /// no such file).
    InitFromWeights {
        node: u32,
        file: String,
        digest: Option<String>,
        reference: Option<String>,
    },
}

/// One weights file of `drafter.init_from` as one node loaded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightFileFact {
    /// The file's name within the drafter directory (`model.safetensors`, a shard's name).
    pub name: String,
    pub bytes: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// What one node loaded from `drafter.init_from`: digests only, a few hundred bytes through
/// the store whatever the weights weigh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitFromFacts {
    pub node_rank: u32,
    /// In the order the node read them.
    pub files: Vec<WeightFileFact>,
}

const UNSET: &str = "(unset)";

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use Disagreement::*;
        match self {
            Ranks { detail } => write!(
                f,
                "the nodes' ranks do not tile the job: {detail}; give each node its own rank, \
                 0 to N-1"
            ),
            NodeCount {
                node,
                nnodes,
                reference,
            } => write!(
                f,
                "node {node} was launched as one of {nnodes} nodes, node 0 as one of \
                 {reference}: give every node the same node count"
            ),
            ConfigKey {
                node,
                key,
                value,
                reference,
                locked,
            } => {
                let kind = if *locked { " (a locked key)" } else { "" };
                write!(
                    f,
                    "node {node}'s {key} = {value} differs from node 0's {reference}{kind}: give \
                     every node the same config"
                )
            }
            ConfigDigest {
                node,
                digest,
                reference,
            } => write!(
                f,
                "node {node}'s config digest {} differs from node 0's {}: give every node the \
                 same config",
                short(digest),
                short(reference)
            ),
            Environment {
                node,
                field,
                value,
                reference,
            } => write!(
                f,
                "node {node}'s {field} = {value} differs from node 0's {reference} (the \
                 environment fingerprint): run every node on the same dflashd build, libraries \
                 and data"
            ),
            DrafterWorkers {
                node,
                workers,
                reference,
            } => write!(
                f,
                "node {node} runs {workers} drafter workers, node 0 runs {reference}: every \
                 node must run as many ([topology] drafter_devices)"
            ),
            ResumeStep {
                node,
                step,
                reference,
            } => write!(
                f,
                "node {node} resumes from step {step}, node 0 from step {reference}: every node \
                 must resume from the same step; give each the checkpoint of a step all have \
                 (--resume-from step-N), or start all fresh"
            ),
            InitFromWeights {
                node,
                file,
                digest,
                reference,
            } => {
                let held = |d: &Option<String>, who: &str| match d {
                    Some(d) => format!("SHA-256 {} on {who}", short(d)),
                    None => format!("no such file on {who}"),
                };
                write!(
                    f,
                    "node {node}'s drafter.init_from holds other weights than node 0's: {file} \
                     has {}, {}; the nodes would start from different drafters: copy node 0's \
                     drafter directory to every node at the path drafter.init_from names, or \
                     point drafter.init_from at one copy every node reads",
                    held(digest, &format!("node {node}")),
                    held(reference, "node 0")
                )
            }
        }
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// `Ok` when every node may start with node 0, else the first disagreement.
pub fn check_agreement(facts: &[StartFacts]) -> Result<(), Disagreement> {
    let by_rank = ordered(facts)?;
    let reference = by_rank[0];
    for node in &by_rank[1..] {
        compare(reference, node)?;
    }
    Ok(())
}

/// The facts in rank order, once each rank of `0..nnodes` is there exactly once.
fn ordered(facts: &[StartFacts]) -> Result<Vec<&StartFacts>, Disagreement> {
    let ranks = |detail: String| Disagreement::Ranks { detail };
    let Some(first) = facts.first() else {
        return Err(ranks("no node's facts arrived".into()));
    };
    if let Some(other) = facts.iter().find(|f| f.nnodes != first.nnodes) {
        let (low, high) = if first.node_rank <= other.node_rank {
            (first, other)
        } else {
            (other, first)
        };
        return Err(Disagreement::NodeCount {
            node: high.node_rank,
            nnodes: high.nnodes,
            reference: low.nnodes,
        });
    }
    let mut by_rank: BTreeMap<u32, &StartFacts> = BTreeMap::new();
    for f in facts {
        if f.node_rank >= f.nnodes {
            return Err(ranks(format!(
                "node {} is not a node of {}",
                f.node_rank, f.nnodes
            )));
        }
        if by_rank.insert(f.node_rank, f).is_some() {
            return Err(ranks(format!(
                "two nodes say they are node {}",
                f.node_rank
            )));
        }
    }
    if let Some(missing) = (0..first.nnodes).find(|r| !by_rank.contains_key(r)) {
        return Err(ranks(format!(
            "node {missing} of {} is missing",
            first.nnodes
        )));
    }
    Ok(by_rank.into_values().collect())
}

fn compare(reference: &StartFacts, node: &StartFacts) -> Result<(), Disagreement> {
    let n = node.node_rank;
    let value = |f: &StartFacts, key: &str| f.config.get(key).cloned().unwrap_or(UNSET.into());
    let others = reference
        .config
        .keys()
        .chain(node.config.keys())
        .filter(|k| !LOCKED_KEYS.contains(&k.as_str()));
    let keys: std::collections::BTreeSet<&str> = others.map(String::as_str).collect();
    let locked = LOCKED_KEYS.iter().map(|k| (*k, true));
    for (key, is_locked) in locked.chain(keys.into_iter().map(|k| (k, false))) {
        let (mine, theirs) = (value(node, key), value(reference, key));
        if mine != theirs {
            return Err(Disagreement::ConfigKey {
                node: n,
                key: key.into(),
                value: mine,
                reference: theirs,
                locked: is_locked,
            });
        }
    }
    if node.config_digest != reference.config_digest {
        return Err(Disagreement::ConfigDigest {
            node: n,
            digest: node.config_digest.clone(),
            reference: reference.config_digest.clone(),
        });
    }
    let drift = diff_fingerprints(&reference.fingerprint, &node.fingerprint)
        .into_iter()
        .find(|d| !NODE_OWN_FINGERPRINT_FIELDS.contains(&d.field.as_str()));
    if let Some(d) = drift {
        return Err(Disagreement::Environment {
            node: n,
            field: d.field,
            value: d.after.unwrap_or_else(|| "(absent)".into()),
            reference: d.before.unwrap_or_else(|| "(absent)".into()),
        });
    }
    if node.drafter_workers != reference.drafter_workers {
        return Err(Disagreement::DrafterWorkers {
            node: n,
            workers: node.drafter_workers,
            reference: reference.drafter_workers,
        });
    }
    if node.resume_step != reference.resume_step {
        return Err(Disagreement::ResumeStep {
            node: n,
            step: node.resume_step,
            reference: reference.resume_step,
        });
    }
    Ok(())
}

/// `Ok` when every node loaded the same `drafter.init_from` files as node 0 (same names, same
/// SHA-256), else the first difference, nodes in rank order, files in node 0's order and then
/// any the node has beyond them.
pub fn check_init_from(facts: &[InitFromFacts]) -> Result<(), Disagreement> {
    let mut by_rank: Vec<&InitFromFacts> = facts.iter().collect();
    by_rank.sort_by_key(|f| f.node_rank);
    let Some((reference, others)) = by_rank.split_first() else {
        return Ok(());
    };
    let digest_of = |f: &InitFromFacts, name: &str| {
        f.files
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.sha256.clone())
    };
    for node in others {
        let names = reference
            .files
            .iter()
            .chain(&node.files)
            .map(|w| w.name.as_str());
        for name in names {
            let (mine, theirs) = (digest_of(node, name), digest_of(reference, name));
            if mine != theirs {
                return Err(Disagreement::InitFromWeights {
                    node: node.node_rank,
                    file: name.to_string(),
                    digest: mine,
                    reference: theirs,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "agreement_tests.rs"]
mod tests;
