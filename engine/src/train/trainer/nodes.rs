//! A [`Trainer`] as one node of a data-parallel job (issue 23): joining the job's gradient
//! group (the last step of [`Trainer::build`]), the job's view summed after every step, and
//! the witness asked after every checkpoint. The single-process trainer never touches this
//! file's state.
use dflash_shared::job::{self, JobView, NodeFigures};
use dflash_shared::metrics::StepTimes;
use tch::Tensor;

use super::build::schedule_for;
use super::Trainer;
use crate::collective::allreduce::AllReduce;
use crate::train::error::TrainError;
use crate::train::shard::NodeShard;
use crate::train::topology::WorkerFailure;

/// Given a checkpoint's step and the fp32 master weights it holds; an `Err` (the nodes'
/// states disagree, or a node never answered) fails the checkpoint, which pauses the run.
pub type CheckpointWitness = Box<dyn FnMut(u64, &[(String, Tensor)]) -> Result<(), String> + Send>;

/// Opens this node's endpoints of the job's gradient group: one per local drafter worker in
/// worker order (worker `w` at `shard.global_rank(w)`), one for an inline trainer, one per
/// `topology.drafter_devices` entry for a threaded one. It meets the other nodes (it talks to
/// other processes), so [`Trainer::build`] calls it last, once the trainer's workers have
/// started.
pub type OpenGroup = Box<dyn FnOnce() -> Result<Vec<Box<dyn AllReduce>>, TrainError>>;

/// A trainer as one node of a data-parallel job (issue 23), [`super::TrainerSpec::job`]: it
/// trains `shard`'s share of every step, sums gradients and Σw over the job's one flat group
/// of every drafter worker of every node, and counts steps, epochs and the learning-rate
/// schedule over the global batch.
///
/// One flat group, each local drafter worker its own rank in it, rather than an in-process
/// reduce followed by a cross-node one: the flat sum over `N·L` ranks is the arithmetic of
/// one process of `N·L` drafter ranks up to the order of the additions, a lost rank is named
/// by the collective itself, and the local workers need no new synchronisation (each sums on
/// its own thread as it does in one process; only the endpoint differs). A two-level reduce
/// would move less over the inter-node link per GPU and is the later optimisation
/// (docs/SCALING.md).
pub struct JobMembership {
    /// This node's share of every step.
    pub shard: NodeShard,
    /// This node's endpoints of the job's gradient group, opened by the build ([`OpenGroup`]).
    pub open_group: OpenGroup,
    /// How far behind the next slowest node a node's own work must be, as a fraction of that
    /// node's, for the job's view to name it the straggler (`detectors.straggler.behind_frac`;
    /// [`job::STRAGGLER_BEHIND_FRAC`] from [`Self::new`]). Node-local: it only decides what
    /// this node's view calls a straggler, never what is trained.
    pub straggler_behind_frac: f64,
    /// Asked after every checkpoint this trainer writes ([`CheckpointWitness`]); `None`
    /// from [`Self::new`].
    pub checkpoint_witness: Option<CheckpointWitness>,
}

impl JobMembership {
    /// `shard`'s node, its group opened by `open_group`, the default straggler bar and no
    /// checkpoint witness.
    pub fn new(shard: NodeShard, open_group: OpenGroup) -> Self {
        Self {
            shard,
            open_group,
            straggler_behind_frac: job::STRAGGLER_BEHIND_FRAC,
            checkpoint_witness: None,
        }
    }
}

impl Trainer {
    /// The last step of [`Trainer::build`] for a node of a job: checks `job.shard` against
    /// this trainer's drafter workers and training config, opens the group
    /// ([`JobMembership::open_group`]: after the workers started, since it meets the other
    /// nodes), checks each endpoint's rank, hands every local worker its endpoint, and counts
    /// the schedule over the job's global batch. Before any step and any restore (whose
    /// cursor check uses the global assignment).
    pub(super) fn join_job(&mut self, job: JobMembership) -> Result<(), TrainError> {
        let JobMembership {
            shard,
            open_group,
            straggler_behind_frac,
            checkpoint_witness,
        } = job;
        let bad = |detail: String| {
            Err(TrainError::Config {
                key: "topology.drafter_devices".into(),
                detail,
            })
        };
        let local = self.assignment.ranks;
        if shard.workers() != local {
            return bad(format!(
                "lists {local} drafter worker(s) on this node, but the job's shard gives it {}: \
                 every node of a job runs the same number of drafter workers",
                shard.workers()
            ));
        }
        let assignment = shard.global_assignment();
        if assignment.accum != self.cfg.training.grad_accum {
            return bad(format!(
                "the shard trains {} micro-batches a step per worker, training.grad_accum is {}",
                assignment.accum, self.cfg.training.grad_accum
            ));
        }
        let endpoints = open_group()?;
        if endpoints.len() != local {
            return bad(format!(
                "lists {local} drafter worker(s) on this node, but the group gave {} \
                 endpoint(s): each drafter worker has its own endpoint",
                endpoints.len()
            ));
        }
        for (worker, endpoint) in endpoints.iter().enumerate() {
            let rank = shard.global_rank(worker);
            if endpoint.world_size() != assignment.ranks || endpoint.rank() != rank {
                return bad(format!(
                    "worker {worker}'s endpoint is rank {} of {}, the shard's rank {rank} of {}",
                    endpoint.rank(),
                    endpoint.world_size(),
                    assignment.ranks
                ));
            }
        }
        match self.cluster.as_mut() {
            Some(cluster) => cluster.join_job(&mut self.rank0, shard, endpoints)?,
            None => self.rank0.allreduce = endpoints.into_iter().next(),
        }
        self.assignment = assignment;
        self.rank0_global = shard.global_rank(0);
        self.job_node = Some(shard.node_of());
        self.schedule = schedule_for(&self.cfg, &self.source, assignment);
        self.straggler_behind_frac = straggler_behind_frac;
        self.checkpoint_witness = checkpoint_witness;
        Ok(())
    }

    /// On a node of a job: this step's figures summed over the job's group (every node's at
    /// its slot, `dflash_shared::job`), the job's view; `None` for a single process. The
    /// figures are the node's: every local drafter worker's tokens and draft positions over
    /// the node's step time. A lost node fails the step as a lost node in the gradient
    /// all-reduce does.
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
        // Every rank of the group makes the call: on a threaded node the other local ranks
        // add zeros (`Cluster::sum_f64_from_rank0`), so each node counts once.
        let summed = match self.cluster.as_mut() {
            Some(cluster) => cluster.sum_f64_from_rank0(&mut self.rank0, &mut buffer),
            None => match self.rank0.allreduce.as_mut() {
                Some(group) => group.sum_f64(&mut buffer).map_err(|e| {
                    WorkerFailure {
                        worker: self.rank0.id,
                        detail: e.to_string(),
                    }
                    .to_error()
                }),
                None => Err(WorkerFailure {
                    worker: self.rank0.id,
                    detail: "a node of a job has no process group".into(),
                }
                .to_error()),
            },
        };
        if let Err(e) = summed {
            return Err(self.note_failure(e));
        }
        Ok(Some(JobView::from_nodes(
            node,
            job::unpack(&buffer),
            self.straggler_behind_frac,
        )))
    }
}
