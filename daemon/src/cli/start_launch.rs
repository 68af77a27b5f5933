//! `dflashd start`'s multi-node flags (issue 23) and what the start does with them today.
//!
//! The launch is resolved by `dflash_shared::launch::resolve` from these flags and the
//! variables torchrun and SLURM set. Until the cross-node collective is wired into the
//! training loop, a launch of more than one node is refused before anything of the run is
//! opened; one node (the default) starts exactly as before.
use clap::Args;
use dflash_shared::launch::{self, EnvMap, LaunchFlags, NodeLaunch, Origin, ENV_VARS};

#[derive(Args, Debug, Default, Clone)]
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
}

impl LaunchArgs {
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

/// This node's launch when it is one `dflashd start` can run today, else the refusal's text:
/// a launch that does not resolve, or one of more than one node.
pub fn startable_launch(args: &LaunchArgs, env: &EnvMap) -> Result<NodeLaunch, String> {
    let launch = launch::resolve(&args.flags(), env)
        .map_err(|e| format!("the multi-node launch does not resolve: {e}"))?;
    if launch.is_multi_node() {
        return Err(not_wired(&launch));
    }
    Ok(launch)
}

fn not_wired(launch: &NodeLaunch) -> String {
    let rendezvous = launch
        .rendezvous
        .as_ref()
        .map_or(String::new(), |r| format!(", rendezvous {r},"));
    let mut text = format!(
        "multi-node training is not wired yet (issue 23): the launch resolved to node {} of \
         {}{rendezvous} via {}; run with --nnodes 1",
        launch.node_rank, launch.nnodes, launch.source
    );
    // A variable stated the count: --nnodes 1 alone would now disagree with it.
    if let Origin::Env(var) = &launch.source.nnodes {
        let name = var.split('=').next().unwrap_or(var);
        text.push_str(&format!(
            " outside the launcher that set {var} (or unset {name} and the node rank's variable)"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nnodes: Option<u32>, node_rank: Option<u32>, rendezvous: Option<&str>) -> LaunchArgs {
        LaunchArgs {
            nnodes,
            node_rank,
            rendezvous: rendezvous.map(String::from),
        }
    }

    #[test]
    fn one_node_starts_and_more_are_refused_naming_the_launch() {
        let none = EnvMap::new();
        assert_eq!(
            startable_launch(&LaunchArgs::default(), &none).unwrap(),
            NodeLaunch::single()
        );
        assert!(startable_launch(&args(Some(1), Some(0), None), &none).is_ok());
        let err = startable_launch(&args(Some(2), Some(1), Some("n0:29500")), &none).unwrap_err();
        assert_eq!(
            err,
            "multi-node training is not wired yet (issue 23): the launch resolved to node 1 of 2, \
             rendezvous n0:29500, via --nnodes 2 and --node-rank 1, rendezvous from --rendezvous n0:29500; run with \
             --nnodes 1"
        );
        let slurm: EnvMap = [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_ID", "42"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let err = startable_launch(&LaunchArgs::default(), &slurm).unwrap_err();
        assert!(
            err.contains("node 0 of 2, rendezvous n1:15042, via SLURM_NNODES=2")
                && err.contains("outside the launcher that set SLURM_NNODES=2"),
            "{err}"
        );
        let err = startable_launch(&args(Some(1), None, None), &slurm).unwrap_err();
        assert!(
            err.starts_with("the multi-node launch does not resolve: the node count")
                && err.contains("--nnodes 1 but SLURM_NNODES=2"),
            "{err}"
        );
    }
}
