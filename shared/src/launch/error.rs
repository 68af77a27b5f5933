//! Why a launch could not be resolved; each message names the flags or variables involved
//! and what to set.
use super::Origin;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("{origin}: {problem}")]
    Invalid { origin: String, problem: String },
    #[error(
        "{what} is stated twice and the two disagree: {first} but {second}. Give every source \
         the same value, or keep one: drop the flag, or unset the variable your launcher did \
         not mean to set"
    )]
    Disagree {
        what: &'static str,
        first: Origin,
        second: Origin,
    },
    #[error(
        "LOCAL_WORLD_SIZE={local_world_size}: the launcher started {local_world_size} processes \
         on this node, but dflashd runs one process per node and drives every GPU of it itself. \
         Launch one process per node (torchrun --nproc-per-node 1)"
    )]
    SeveralProcessesPerNode { local_world_size: u32 },
    #[error(
        "WORLD_SIZE={world_size} is set without LOCAL_WORLD_SIZE, so it is unclear whether it \
         counts nodes or processes (torchrun's counts processes, one per GPU). dflashd runs one \
         process per node: set NNODES and NODE_RANK (or pass --nnodes and --node-rank), or \
         launch with torchrun --nproc-per-node 1"
    )]
    AmbiguousWorldSize { world_size: u32 },
    #[error(
        "SLURM_NTASKS={ntasks} on SLURM_NNODES={nnodes}: dflashd runs exactly one task per node \
         (it drives every GPU of its node itself). Launch it with srun --ntasks-per-node=1"
    )]
    SlurmTaskCount { ntasks: u32, nnodes: u32 },
    #[error(
        "{nnodes} names {value} nodes but nothing says which one this is: pass --node-rank R \
         (0 on the node that hosts the rendezvous), or set NODE_RANK"
    )]
    MissingNodeRank { nnodes: Origin, value: u32 },
    #[error(
        "{node_rank} is not a node of {nnodes}: node ranks run from 0 to {last}",
        last = nnodes_value.saturating_sub(1)
    )]
    RankOutOfRange {
        node_rank: Origin,
        nnodes: Origin,
        nnodes_value: u32,
    },
    #[error(
        "node {node_rank} of {nnodes} needs a rendezvous, node 0's address: pass --rendezvous \
         HOST:PORT, or set MASTER_ADDR and MASTER_PORT"
    )]
    NoRendezvous { nnodes: u32, node_rank: u32 },
    #[error("{have} gives the rendezvous {have_what} but nothing gives its {missing}: {fix}")]
    HalfRendezvous {
        have: Origin,
        have_what: &'static str,
        missing: &'static str,
        fix: &'static str,
    },
}
