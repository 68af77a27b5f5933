//! `dflashd start`'s multi-node flags (issue 23).
//!
//! The launch is resolved by `dflash_shared::launch::resolve` from these flags and the
//! variables torchrun and SLURM set, before anything of the run is opened; one node (the
//! default) starts exactly as before. A node of several meets the others at start
//! (`runtime/launch_nodes.rs`).
use clap::Args;
use dflash_shared::launch::{self, EnvMap, LaunchFlags, NodeLaunch, ENV_VARS};

#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Nodes in the job, one dflashd per node. Default: NNODES, SLURM_NNODES, or torchrun's
    /// WORLD_SIZE under `--nproc-per-node 1`; else 1. A flag and a variable that disagree are
    /// refused.
    #[arg(long, value_name = "N")]
    pub nnodes: Option<u32>,
    /// This node's rank, 0 to N-1; node 0 hosts the rendezvous. Default: NODE_RANK,
    /// SLURM_NODEID, or torchrun's RANK under `--nproc-per-node 1`.
    #[arg(long, value_name = "R")]
    pub node_rank: Option<u32>,
    /// Where the nodes meet: node 0's HOST:PORT. Default: MASTER_ADDR and MASTER_PORT, or
    /// under SLURM the first host of SLURM_JOB_NODELIST.
    #[arg(long, value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,
    /// Seconds a node waits for the others: the rendezvous, the start's agreement, and every
    /// cross-node gradient all-reduce (a lost or stalled node pauses the run within it).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_COLLECTIVE_TIMEOUT_S,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub collective_timeout_s: u64,
}

/// Long enough for a large drafter's bucketed all-reduce on a slow link and for a node
/// loading its target before the rendezvous; short enough that a lost node pauses the job
/// within a minute (a closed connection is noticed at once, this bounds a silent stall).
pub const DEFAULT_COLLECTIVE_TIMEOUT_S: u64 = 60;

impl Default for LaunchArgs {
    fn default() -> Self {
        LaunchArgs {
            nnodes: None,
            node_rank: None,
            rendezvous: None,
            collective_timeout_s: DEFAULT_COLLECTIVE_TIMEOUT_S,
        }
    }
}

impl LaunchArgs {
    pub fn collective_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.collective_timeout_s)
    }

    fn flags(&self) -> LaunchFlags {
        LaunchFlags {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            rendezvous: self.rendezvous.clone(),
        }
    }
}

/// The launch variables of this process's environment (only those the contract reads).
pub fn launch_environment() -> EnvMap {
    ENV_VARS
        .iter()
        .filter_map(|var| Some((var.to_string(), std::env::var(var).ok()?)))
        .collect()
}

/// This node's launch, else the refusal's text (a launch that does not resolve).
pub fn startable_launch(args: &LaunchArgs, env: &EnvMap) -> Result<NodeLaunch, String> {
    launch::resolve(&args.flags(), env)
        .map_err(|e| format!("the multi-node launch does not resolve: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nnodes: Option<u32>, node_rank: Option<u32>, rendezvous: Option<&str>) -> LaunchArgs {
        LaunchArgs {
            nnodes,
            node_rank,
            rendezvous: rendezvous.map(String::from),
            ..LaunchArgs::default()
        }
    }

    #[test]
    fn launches_resolve_and_those_that_do_not_are_refused_naming_why() {
        let none = EnvMap::new();
        assert_eq!(
            startable_launch(&LaunchArgs::default(), &none).unwrap(),
            NodeLaunch::single()
        );
        assert!(startable_launch(&args(Some(1), Some(0), None), &none).is_ok());
        let two = startable_launch(&args(Some(2), Some(1), Some("n0:29500")), &none).unwrap();
        assert_eq!((two.nnodes, two.node_rank), (2, 1));
        assert_eq!(two.rendezvous.unwrap().to_string(), "n0:29500");
        let slurm: EnvMap = [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_ID", "42"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let node = startable_launch(&LaunchArgs::default(), &slurm).unwrap();
        assert_eq!(node.rendezvous.unwrap().to_string(), "n1:15042");
        let err = startable_launch(&args(Some(1), None, None), &slurm).unwrap_err();
        assert!(
            err.starts_with("the multi-node launch does not resolve: the node count")
                && err.contains("--nnodes 1 but SLURM_NNODES=2"),
            "{err}"
        );
    }
}
