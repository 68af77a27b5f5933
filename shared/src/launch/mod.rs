//! The launch contract of a multi-node job (issue 23): which node this `dflashd` is, of how
//! many, and where the nodes meet. One `dflashd` runs per node; each keeps its own in-process
//! topology of target and drafter workers on its own GPUs.
//!
//! [`resolve`] is a pure function of the `start` flags and an environment map. The sources,
//! highest first, for each of the three facts:
//!
//! | fact | flag | environment |
//! |---|---|---|
//! | node count | `--nnodes` | `NNODES`, `SLURM_NNODES`, `WORLD_SIZE`* |
//! | node rank | `--node-rank` | `NODE_RANK`, `SLURM_NODEID`, `RANK`* |
//! | rendezvous | `--rendezvous HOST:PORT` | `MASTER_ADDR` + `MASTER_PORT`; under SLURM, the first host of `SLURM_JOB_NODELIST` and a port from `SLURM_JOB_ID` |
//!
//! Rules, chosen so that a node never silently takes a rank its launcher did not give it:
//! - Every source that states a fact must agree with every other: a flag that disagrees with
//!   a variable is refused, not preferred, naming both ([`LaunchError::Disagree`]). A flag
//!   hard-coded in a script and a launcher's variable disagreeing is exactly how two nodes end
//!   up with one rank.
//! - \* torchrun's `WORLD_SIZE`/`RANK` count processes (one per GPU), not nodes. They count
//!   nodes only when the launcher was asked for one process per node, which torchrun states as
//!   `LOCAL_WORLD_SIZE=1`; only then are they read. `LOCAL_WORLD_SIZE` above 1 is refused
//!   (several `dflashd` per node), and a `WORLD_SIZE` above 1 without `LOCAL_WORLD_SIZE` is
//!   refused as ambiguous unless a higher source states the node count.
//! - SLURM: `SLURM_NTASKS` (when set) must equal `SLURM_NNODES` (`srun --ntasks-per-node=1`).
//!   The SLURM-derived rendezvous host and port are defaults, not statements: `MASTER_ADDR`,
//!   `MASTER_PORT` or the flag replace them without a conflict (a cluster may name node 0 by
//!   its InfiniBand address). The derived port is `15000 + SLURM_JOB_ID mod 10000`, so two
//!   jobs whose first node is the same host rarely pick one port.
//! - With nothing set the job is one node, rank 0, no rendezvous: today's behaviour. A single
//!   node ignores a rendezvous it does not need (a stray `MASTER_ADDR` never fails it); more
//!   than one node requires a rank and a rendezvous.
//!
//! Once launched, the nodes check that they may train together: [`check_agreement`] over
//! every node's [`StartFacts`] (the job's config keys from [`job_config`], its digest, the
//! environment fingerprint, the drafter worker count, the resume step).
mod agreement;
mod endpoint;
mod error;
pub mod hostlist;
mod job_config;
mod resolve;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use agreement::{
    check_agreement, check_init_from, Disagreement, InitFromFacts, StartFacts, WeightFileFact,
    NODE_OWN_FINGERPRINT_FIELDS,
};
pub use endpoint::{parse_host, parse_port, parse_rendezvous, Rendezvous, RENDEZVOUS_EXPECTED};
pub use error::LaunchError;
pub use job_config::{job_config, job_config_text};
pub use resolve::resolve;

/// The variables [`resolve`] reads; the daemon copies exactly these from its environment.
pub const ENV_VARS: &[&str] = &[
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
];

/// Variable name → value, as the process saw them.
pub type EnvMap = BTreeMap<String, String>;

/// `dflashd start --nnodes N --node-rank R --rendezvous HOST:PORT`, as typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchFlags {
    pub nnodes: Option<u32>,
    pub node_rank: Option<u32>,
    pub rendezvous: Option<String>,
}

/// Where one fact of the launch came from, with the value as it was given: `--nnodes 2`,
/// `SLURM_NODEID=1`, or derived from other variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "from", rename_all = "snake_case")]
pub enum Origin {
    /// Nothing stated it: one node, rank 0.
    Default,
    Flag(String),
    Env(String),
    /// Computed from other variables (SLURM's rendezvous host and port).
    Derived(String),
}

impl Origin {
    pub fn is_default(&self) -> bool {
        matches!(self, Origin::Default)
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => write!(f, "the default (one node, rank 0)"),
            Origin::Flag(s) | Origin::Env(s) | Origin::Derived(s) => write!(f, "{s}"),
        }
    }
}

/// Which flags or variables decided each fact of a [`NodeLaunch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSource {
    pub nnodes: Origin,
    pub node_rank: Origin,
    pub rendezvous_host: Option<Origin>,
    pub rendezvous_port: Option<Origin>,
}

impl std::fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.nnodes.is_default() && self.node_rank.is_default() {
            return write!(f, "the default (no launch flag or variable set)");
        }
        write!(f, "{} and {}", self.nnodes, self.node_rank)?;
        if let (Some(host), Some(port)) = (&self.rendezvous_host, &self.rendezvous_port) {
            if host == port {
                write!(f, ", rendezvous from {host}")?;
            } else {
                write!(f, ", rendezvous from {host} and {port}")?;
            }
        }
        Ok(())
    }
}

/// The resolved launch of this node (named apart from the daemon's `runtime::launch::LaunchSpec`,
/// which is the whole start's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLaunch {
    pub nnodes: u32,
    pub node_rank: u32,
    /// `None` for a single node, which needs none.
    pub rendezvous: Option<Rendezvous>,
    pub source: LaunchSource,
}

impl NodeLaunch {
    /// One node, rank 0: what `dflashd start` does with no launch flag or variable.
    pub fn single() -> Self {
        NodeLaunch {
            nnodes: 1,
            node_rank: 0,
            rendezvous: None,
            source: LaunchSource {
                nnodes: Origin::Default,
                node_rank: Origin::Default,
                rendezvous_host: None,
                rendezvous_port: None,
            },
        }
    }

    pub fn is_multi_node(&self) -> bool {
        self.nnodes > 1
    }
}

impl std::fmt::Display for NodeLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} of {}", self.node_rank, self.nnodes)?;
        if let Some(r) = &self.rendezvous {
            write!(f, ", rendezvous {r}")?;
        }
        write!(f, " (via {})", self.source)
    }
}
