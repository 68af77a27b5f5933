//! A [`Trainer`] as one node of a data-parallel job (issue 23): joining the job's gradient
//! group, the job's view summed after every step, and the witness asked after every
//! checkpoint. The single-process trainer never touches this file's state.
use dflash_shared::job::{self, JobView, NodeFigures};
use dflash_shared::metrics::StepTimes;
use tch::Tensor;

use super::{schedule_for, Trainer};
use crate::train::error::TrainError;
use crate::train::shard::NodeShard;
use crate::train::topology::allreduce::AllReduce;
use crate::train::topology::WorkerFailure;

/// Given a checkpoint's step and the fp32 master weights it holds; an `Err` (the nodes'
/// states disagree, or a node never answered) fails the checkpoint, which pauses the run.
pub type CheckpointWitness = Box<dyn FnMut(u64, &[(String, Tensor)]) -> Result<(), String> + Send>;

impl Trainer {
    /// Makes this fresh trainer one node of a data-parallel job (issue 23): it trains
    /// `shard`'s share of every step, sums gradients and Σw over `group` (one flat group of
    /// every drafter worker of every node, this node's worker at `shard.global_rank(0)`), and
    /// counts steps, epochs and the learning-rate schedule over the global batch.
    ///
    /// One flat group rather than an in-process reduce followed by a cross-node one: a flat
    /// sum of `N·L` ranks is the same arithmetic one process of `N·L` drafter ranks does, so
    /// the equivalence with a single process holds by construction, and a lost rank is named
    /// by the collective itself. This build joins a node that runs its drafter inline (one
    /// device for both roles, one drafter worker); a threaded topology per node would hand
    /// each local rank its own endpoint of the same group and is refused until it does.
    /// Call before any step and before a restore (whose cursor check uses the global plan).
    pub fn join_nodes(
        &mut self,
        shard: NodeShard,
        group: Box<dyn AllReduce>,
    ) -> Result<(), TrainError> {
        let bad = |detail: String| {
            Err(TrainError::Config {
                key: "topology.drafter_devices".into(),
                detail,
            })
        };
        if self.cluster.is_some() || self.plan.ranks != 1 {
            return bad(format!(
                "lists {} drafter worker(s) on a threaded topology; a node of a multi-node job \
                 runs target and drafter inline on one device in this build",
                self.plan.ranks
            ));
        }
        if self.step != 0 || self.warmup.is_some() {
            return bad("a trainer joins its job before its first step".into());
        }
        let plan = shard.global_plan();
        let rank = shard.global_rank(0);
        if group.world_size() != plan.ranks || group.rank() != rank {
            return bad(format!(
                "the process group is rank {} of {}, the shard rank {rank} of {}",
                group.rank(),
                group.world_size(),
                plan.ranks
            ));
        }
        if plan.accum != self.cfg.grad_accum {
            return bad(format!(
                "the shard trains {} micro-batches a step per worker, training.grad_accum is {}",
                plan.accum, self.cfg.grad_accum
            ));
        }
        self.plan = plan;
        self.rank0_global = rank;
        self.job_node = Some(shard.node_of());
        self.schedule = schedule_for(&self.cfg, &self.source, plan);
        self.rank0.allreduce = Some(group);
        Ok(())
    }

    /// On a node of a job: this step's figures summed over the job's group (every node's at
    /// its slot, `dflash_shared::job`), the job's view; `None` for a single process. A lost
    /// node fails the step as a lost node in the gradient all-reduce does.
    pub(super) fn job_view(
        &mut self,
        tokens_per_s: f64,
        draft_positions_per_s: f64,
        times: &StepTimes,
    ) -> Result<Option<JobView>, TrainError> {
        let Some((node, nnodes)) = self.job_node else {
            return Ok(None);
        };
        let figures = NodeFigures {
            node,
            tokens_per_s,
            draft_positions_per_s,
            busy_ms: (times.total_ms - times.all_reduce_ms).max(0.0),
            step_ms: times.total_ms,
            queue_wait_share: self
                .cluster
                .as_ref()
                .map(|_| times.queue_wait_ms / times.total_ms.max(1e-9)),
        };
        let mut buffer = job::pack(nnodes, &figures);
        let summed = match self.rank0.allreduce.as_mut() {
            Some(group) => group.sum_f64(&mut buffer).map_err(|e| e.to_string()),
            None => Err("a node of a job has no process group".to_string()),
        };
        if let Err(detail) = summed {
            let failed = WorkerFailure {
                worker: self.rank0.id,
                detail,
            };
            return Err(self.note_failure(failed.to_error()));
        }
        Ok(Some(JobView::from_nodes(node, job::unpack(&buffer))))
    }

    /// Sets what is asked after every checkpoint ([`CheckpointWitness`]).
    pub fn set_checkpoint_witness(&mut self, witness: CheckpointWitness) {
        self.checkpoint_witness = Some(witness);
    }
}
