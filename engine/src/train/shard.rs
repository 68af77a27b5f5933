//! Each node's share of every optimizer step, for data-parallel nodes (issue 23, part 3).
//!
//! The single-process run already fixes the data order: micro-batch `seq` is a pure function
//! of the seed and `seq` ([`crate::train::micro`]: batch `seq mod E` of epoch `seq / E`, in the
//! seeded epoch order), and a step that starts at micro-batch `base` hands micro-batch `seq`
//! to drafter rank `seq mod R` ([`MicroBatchAssignment::rank_of`]). Nodes add nothing to that
//! order: the job's `N` nodes of `L` drafter workers each are the `N·L` ranks of one global
//! assignment, node `n`'s worker `w` being global rank `n·L + w`. So
//! - the nodes' shards of a step are disjoint and together are exactly the micro-batches the
//!   single process with `N·L` workers trains in that step (2 nodes × 1 worker train what
//!   1 node × 2 workers trains, rank for rank, in the same accumulation order);
//! - over an epoch the shards cover every training sample once, as the single process does;
//! - the order is a function of (seed, epoch, node, worker) and nothing else: no node reads
//!   another's, and a resume at cursor `c` (the micro-batches consumed, which the checkpoint
//!   stores as its data position) continues with exactly the shards the uninterrupted run
//!   would have trained.
//!
//! Every node must run the same number of drafter workers (the start's agreement check
//! compares it), or the global ranks would not tile.
use super::error::TrainError;
use super::topology::step::MicroBatchAssignment;

/// Node `node` of `nodes`, each running `workers` drafter workers of `accum` micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShard {
    nodes: usize,
    node: usize,
    workers: usize,
    accum: usize,
}

impl NodeShard {
    pub fn new(
        nodes: usize,
        node: usize,
        workers: usize,
        accum: usize,
    ) -> Result<Self, TrainError> {
        let bad = |key: &str, detail: String| {
            Err(TrainError::Config {
                key: key.into(),
                detail,
            })
        };
        if nodes == 0 {
            return bad("nnodes", "is 0: a job has at least one node".into());
        }
        if node >= nodes {
            return bad(
                "node_rank",
                format!("is {node}, not a node of {nodes} (0 to {})", nodes - 1),
            );
        }
        if workers == 0 {
            return bad(
                "topology.drafter_devices",
                "is empty: a node trains with at least one drafter worker".into(),
            );
        }
        if accum == 0 {
            return bad(
                "training.grad_accum",
                "is 0: a worker trains at least one micro-batch a step".into(),
            );
        }
        Ok(Self {
            nodes,
            node,
            workers,
            accum,
        })
    }

    /// The whole step in one process of `workers` drafter workers (no job): what a threaded
    /// topology trains before it joins one. `workers` and `accum` are at least 1 (the
    /// topology and the training config were validated).
    pub fn single_process(workers: usize, accum: usize) -> Self {
        debug_assert!(workers > 0 && accum > 0);
        Self {
            nodes: 1,
            node: 0,
            workers,
            accum,
        }
    }

    /// This node's rank in the job and the job's node count.
    pub fn node_of(&self) -> (u32, u32) {
        (self.node as u32, self.nodes as u32)
    }

    /// The drafter workers of this node (`L`).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The job's micro-batch assignment: every drafter worker of every node, as one
    /// single-process run would have them.
    pub fn global_assignment(&self) -> MicroBatchAssignment {
        MicroBatchAssignment {
            ranks: self.nodes * self.workers,
            accum: self.accum,
        }
    }

    /// The global rank of this node's worker `worker`.
    pub fn global_rank(&self, worker: usize) -> usize {
        debug_assert!(worker < self.workers);
        self.node * self.workers + worker
    }

    /// Where a fresh run's step `step` starts, in micro-batches. A resumed run continues from
    /// the cursor its checkpoint stores, which equals this when the assignment never
    /// changed.
    pub fn step_base(&self, step: u64) -> u64 {
        step * self.global_assignment().micro_per_step()
    }

    /// The micro-batches worker `worker` of this node trains in the step starting at `base`,
    /// ascending (its accumulation order).
    pub fn worker_seqs(&self, base: u64, worker: usize) -> Vec<u64> {
        self.global_assignment()
            .rank_seqs(base, self.global_rank(worker))
    }

    /// The local worker that trains micro-batch `seq`, or `None` when another node's does.
    pub fn worker_of(&self, seq: u64) -> Option<usize> {
        let first = self.node * self.workers;
        let rank = self.global_assignment().rank_of(seq);
        (first..first + self.workers)
            .contains(&rank)
            .then(|| rank - first)
    }

    /// This node's shard of the step starting at `base`: one list per local worker.
    pub fn node_seqs(&self, base: u64) -> Vec<Vec<u64>> {
        (0..self.workers)
            .map(|w| self.worker_seqs(base, w))
            .collect()
    }
}

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
