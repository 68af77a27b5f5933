//! The threaded topology: worker threads, queues, dispatcher and all-reduce group, driven one
//! optimizer step at a time by the trainer's thread (which is drafter rank 0).
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

use tch::Device;

use super::pipeline::{Dispatcher, Inbox, ItemQueue, QueueMonitor};
use super::rank::{RankReport, RankState};
use super::step::{per_rank_queue, WorkerNames};
use super::warmup::WorkerWarmup;
use super::workers::{
    fetch_from, guarded, spawn_drafter, spawn_target, DrafterCommand, DrafterWorker,
    ProducerShared, TargetCommand, TargetWorker,
};
use super::{TopologySpec, Tripwire, WorkerFailure, WorkerId};
use crate::collective::allreduce::{AbortGroup, AllReduce, CpuGroup};
use crate::collective::nccl::nccl_group;
use crate::device;
use crate::model::target::{FeatureRequest, TargetModel};
use crate::train::error::TrainError;
use crate::train::micro::MicroSource;
use crate::train::replica::{StepSchedule, TargetStates};
use crate::train::shard::NodeShard;
use dflash_shared::metrics::DeviceRole;

pub struct Cluster {
    /// Which micro-batches of each step this process's drafter ranks train: the whole step,
    /// or this node's shard once the trainer joined a job ([`Self::join_job`]).
    shard: NodeShard,
    names: WorkerNames,
    targets: Vec<TargetWorker>,
    /// Drafter ranks 1.. (rank 0 is the trainer's thread).
    drafters: Vec<DrafterWorker>,
    rank0_inbox: Inbox,
    queues: Vec<Arc<ItemQueue>>,
    dispatcher: Arc<Dispatcher>,
    tripwire: Arc<Tripwire>,
    /// How far (in this process's micro-batches) target workers may run ahead of the current
    /// step's end.
    window: u64,
}

fn topology_error(what: impl std::fmt::Display) -> TrainError {
    TrainError::Topology(what.to_string())
}

type Group = (Option<Arc<dyn AbortGroup>>, Vec<Box<dyn AllReduce>>);

/// The all-reduce group of the drafter ranks: none for one rank, NCCL for GPUs, threads for CPUs.
fn all_reduce_group(devices: &[Device]) -> Result<Group, TrainError> {
    if devices.len() < 2 {
        return Ok((None, Vec::new()));
    }
    if devices.iter().all(|d| d.is_cuda()) {
        let indices: Vec<usize> = devices
            .iter()
            .map(|d| match d {
                Device::Cuda(i) => *i,
                _ => 0,
            })
            .collect();
        let (group, ranks) = nccl_group(&indices).map_err(topology_error)?;
        let ranks = ranks
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn AllReduce>)
            .collect();
        return Ok((Some(group as Arc<dyn AbortGroup>), ranks));
    }
    let (group, ranks) = CpuGroup::new(devices.len());
    let ranks = ranks
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn AllReduce>)
        .collect();
    Ok((Some(group as Arc<dyn AbortGroup>), ranks))
}

impl Cluster {
    /// Creates the queues, the all-reduce group (rank 0's endpoint goes into `rank0`), one
    /// target replica per target device and one drafter replica (a copy of rank 0's) per
    /// further drafter device, each on its own thread. Nothing is computed until
    /// [`Self::warmup`]. `next` is the first micro-batch to train.
    pub fn start(
        spec: &TopologySpec,
        accum: usize,
        target: &TargetModel,
        source: Arc<MicroSource>,
        request: FeatureRequest,
        rank0: &mut RankState,
        next: u64,
    ) -> Result<Self, TrainError> {
        spec.validate()?;
        let ranks = spec.drafter_devices.len();
        let shard = NodeShard::single_process(ranks, accum);
        let queue_cfg = per_rank_queue(spec.queue, ranks);
        let queues = (0..ranks)
            .map(|_| ItemQueue::new(queue_cfg).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Config {
                key: "queue".into(),
                detail: e.to_string(),
            })?;
        let dispatcher = Arc::new(Dispatcher::new(next, shard));
        let (abort, mut endpoints) = all_reduce_group(&spec.drafter_devices)?;
        let tripwire = Arc::new(Tripwire {
            first: Mutex::new(None),
            dispatcher: Arc::clone(&dispatcher),
            queues: queues.clone(),
            abort: Mutex::new(abort.into_iter().collect()),
        });
        let mut endpoints = endpoints.drain(..);
        rank0.allreduce = endpoints.next();
        let mut cluster = Cluster {
            shard,
            names: WorkerNames {
                targets: spec
                    .target_devices
                    .iter()
                    .map(|&d| device::name(d))
                    .collect(),
                drafters: spec
                    .drafter_devices
                    .iter()
                    .map(|&d| device::name(d))
                    .collect(),
                inline: false,
            },
            targets: Vec::new(),
            drafters: Vec::new(),
            rank0_inbox: Inbox::new(Arc::clone(&queues[0])),
            // Room for every queue to fill and every target worker to hold one more item, so
            // the queues' watermarks (which the statistics see) are what holds producers back;
            // the limit only bounds how far ahead a straggler lets the others run.
            window: (queue_cfg.capacity * ranks + spec.target_devices.len()) as u64,
            queues,
            dispatcher,
            tripwire,
        };
        for (rank, &device) in spec.drafter_devices.iter().enumerate().skip(1) {
            let id = WorkerId {
                role: DeviceRole::Drafter,
                index: rank,
                device,
            };
            let replica = rank0
                .replica
                .replicate(device)
                .map_err(|e| topology_error(format!("replicating the drafter onto {id}: {e}")))?;
            let mut state = RankState::new(
                id,
                replica,
                rank0.backend,
                rank0.chunk_positions,
                rank0.activation_checkpointing,
            );
            state.objective = rank0.objective;
            state.dspark = rank0.dspark;
            state.selector_stop_gradient = rank0.selector_stop_gradient;
            state.allreduce = endpoints.next();
            let inbox = Inbox::new(Arc::clone(&cluster.queues[rank]));
            let worker = spawn_drafter(state, inbox, shard, rank, Arc::clone(&cluster.tripwire))
                .map_err(|e| topology_error(format!("starting {id}: {e}")))?;
            cluster.drafters.push(worker);
        }
        let shared = Arc::new(ProducerShared {
            source,
            request,
            dispatcher: Arc::clone(&cluster.dispatcher),
            queues: cluster.queues.clone(),
            drafter_devices: spec.drafter_devices.clone(),
            tripwire: Arc::clone(&cluster.tripwire),
        });
        for (index, &device) in spec.target_devices.iter().enumerate() {
            let id = WorkerId {
                role: DeviceRole::Target,
                index,
                device,
            };
            let replica = target
                .replicate(device)
                .map_err(|e| topology_error(format!("loading the target onto {id}: {e}")))?;
            let worker = spawn_target(id, replica, Arc::clone(&shared))
                .map_err(|e| topology_error(format!("starting {id}: {e}")))?;
            cluster.targets.push(worker);
        }
        Ok(cluster)
    }

    pub fn names(&self) -> &WorkerNames {
        &self.names
    }

    pub fn queue_monitor(&self) -> QueueMonitor {
        QueueMonitor::new(self.queues.clone())
    }

    /// The first failure, if any worker failed.
    pub fn failure(&self) -> Option<WorkerFailure> {
        self.tripwire.failure()
    }

    fn fail(&self, worker: WorkerId, detail: String) -> TrainError {
        self.tripwire.trip(WorkerFailure { worker, detail });
        self.tripwire
            .failure()
            .map_or_else(|| topology_error("a worker failed"), |f| f.to_error())
    }

    /// Waits for a worker's answer; a thread that ended without one failed.
    fn receive<T>(&self, id: WorkerId, rx: Receiver<Result<T, String>>) -> Result<T, TrainError> {
        match rx.recv() {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(detail)) => Err(self.fail(id, detail)),
            Err(_) => Err(self.fail(id, "the worker thread ended without answering".into())),
        }
    }

    /// The serialized warmup on micro-batch `seq`: each target worker runs it alone, in
    /// order; then each drafter rank runs forward+backward on its features alone (gradients
    /// discarded); then the target workers start producing concurrently.
    pub fn warmup(
        &mut self,
        rank0: &mut RankState,
        seq: u64,
    ) -> Result<Vec<WorkerWarmup>, TrainError> {
        let mut records = Vec::new();
        let mut first = None;
        for w in &self.targets {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(TargetCommand::Warmup { seq, reply: tx });
            }
            let (micro, hidden, ms) = self.receive(w.id, rx)?;
            records.push(WorkerWarmup::new(w.id, ms));
            first.get_or_insert((micro, hidden));
        }
        let (micro, hidden) = first.ok_or_else(|| topology_error("no target worker"))?;
        let own = hidden.to_device(rank0.replica.device());
        let ms = guarded(|| Ok(rank0.warmup(TargetStates::from(&own), &micro)))
            .map_err(|detail| self.fail(rank0.id, detail))?;
        records.push(WorkerWarmup::new(rank0.id, ms));
        for w in &self.drafters {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::Warmup {
                    hidden: hidden.to_device(w.id.device),
                    micro: micro.clone(),
                    reply: tx,
                });
            }
            let ms = self.receive(w.id, rx)?;
            records.push(WorkerWarmup::new(w.id, ms));
        }
        for w in &self.targets {
            if let Some(c) = &w.commands {
                let _ = c.send(TargetCommand::Run);
            }
        }
        Ok(records)
    }

    /// One optimizer step over micro-batches `base..base + assignment.micro_per_step()`; `end` is
    /// where the schedule's data ends (target workers stop there). Returns every rank's
    /// report, rank 0 first.
    pub fn step(
        &mut self,
        rank0: &mut RankState,
        base: u64,
        lr: f64,
        schedule: StepSchedule,
        end: u64,
    ) -> Result<Vec<RankReport>, TrainError> {
        if let Some(f) = self.tripwire.failure() {
            return Err(f.to_error());
        }
        let n = self.shard.global_assignment().micro_per_step();
        // The window counts this process's micro-batches; on a node of `N`, one index in `N`
        // is this node's, so the same lead reaches `N` times as far in global indices.
        let (_, nodes) = self.shard.node_of();
        let ahead = self.window * u64::from(nodes);
        let limit = (base + n + ahead).min(end).max(base + n);
        self.dispatcher.advance(base, limit);
        let mut pending = Vec::new();
        for w in &self.drafters {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::Step {
                    base,
                    lr,
                    schedule,
                    reply: tx,
                });
            }
            pending.push((w.id, rx));
        }
        let seqs = self.shard.worker_seqs(base, 0);
        let inbox = &mut self.rank0_inbox;
        let own = guarded(|| rank0.step(&seqs, lr, schedule, &mut |seq| fetch_from(inbox, seq)));
        let mut reports = Vec::with_capacity(self.shard.workers());
        match own {
            Ok(r) => reports.push(r),
            Err(detail) => {
                self.tripwire.trip(WorkerFailure {
                    worker: rank0.id,
                    detail,
                });
            }
        }
        // Every rank answers (an abort releases ranks waiting for a failed peer).
        for (id, rx) in pending {
            if let Ok(r) = self.receive(id, rx) {
                reports.push(r);
            }
        }
        match self.tripwire.failure() {
            Some(f) => Err(f.to_error()),
            None => Ok(reports),
        }
    }

    /// Makes this process's drafter ranks the node `shard` describes of a job: from now on
    /// the target workers produce only `shard`'s micro-batches, and drafter rank `w` trains
    /// worker `w`'s share of every step and sums over `endpoints[w]` (its endpoint of the
    /// job's gradient group, global rank `shard.global_rank(w)`) instead of the in-process
    /// group, which is dropped. A failure of any worker here aborts every endpoint, so no
    /// local rank waits for a peer that will not come. Before the warmup and any step.
    pub fn join_job(
        &mut self,
        rank0: &mut RankState,
        shard: NodeShard,
        endpoints: Vec<Box<dyn AllReduce>>,
    ) -> Result<(), TrainError> {
        if endpoints.len() != self.shard.workers() || shard.workers() != self.shard.workers() {
            return Err(topology_error(format!(
                "joining a job: {} drafter rank(s) here, {} endpoint(s) of the job's group and \
                 a shard of {} worker(s)",
                self.shard.workers(),
                endpoints.len(),
                shard.workers()
            )));
        }
        let aborts = endpoints
            .iter()
            .filter_map(|e| e.endpoint_abort())
            .collect();
        self.tripwire.replace_aborts(aborts);
        self.dispatcher.set_shard(shard);
        self.shard = shard;
        let mut endpoints = endpoints.into_iter();
        rank0.allreduce = endpoints.next();
        for (w, endpoint) in self.drafters.iter().zip(endpoints) {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::JoinJob {
                    shard,
                    endpoint,
                    reply: tx,
                });
            }
            self.receive(w.id, rx)?;
        }
        Ok(())
    }

    /// `values` summed over every rank of the drafters' group, rank 0 giving `values` and
    /// every other rank of this process zeros (all ranks of a group make every call; the job
    /// view's figures are rank 0's alone). A failure trips the cluster as a step's would.
    pub fn sum_f64_from_rank0(
        &mut self,
        rank0: &mut RankState,
        values: &mut [f64],
    ) -> Result<(), TrainError> {
        if let Some(f) = self.tripwire.failure() {
            return Err(f.to_error());
        }
        let mut pending = Vec::new();
        for w in &self.drafters {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::SumF64 {
                    values: vec![0.0; values.len()],
                    reply: tx,
                });
            }
            pending.push((w.id, rx));
        }
        let own = match rank0.allreduce.as_mut() {
            Some(group) => group.sum_f64(values).map_err(|e| e.to_string()),
            None => Err("drafter rank 0 has no all-reduce group".to_string()),
        };
        if let Err(detail) = own {
            self.tripwire.trip(WorkerFailure {
                worker: rank0.id,
                detail,
            });
        }
        // Every rank answers (an abort releases ranks waiting for a failed peer).
        for (id, rx) in pending {
            let _ = self.receive(id, rx);
        }
        match self.tripwire.failure() {
            Some(f) => Err(f.to_error()),
            None => Ok(()),
        }
    }

    /// Hands rank 0's weights and optimizer state to every other rank (after a restore).
    pub fn sync_replicas(&mut self, rank0: &RankState) -> Result<(), TrainError> {
        for w in &self.drafters {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::Load {
                    state: rank0.replica.state(),
                    reply: tx,
                });
            }
            self.receive(w.id, rx)?;
        }
        Ok(())
    }

    /// Continues from micro-batch `next` (after a restore); may move backwards.
    pub fn restart_at(&mut self, next: u64) {
        self.dispatcher.reset(next, next);
    }

    /// The fp32 master weights of ranks 1.. (copies), in rank order.
    pub fn replica_weights(&mut self) -> Result<Vec<Vec<(String, tch::Tensor)>>, TrainError> {
        let mut out = Vec::new();
        for w in &self.drafters {
            let (tx, rx) = channel();
            if let Some(c) = &w.commands {
                let _ = c.send(DrafterCommand::Snapshot { reply: tx });
            }
            match rx.recv() {
                Ok(weights) => out.push(weights),
                Err(_) => {
                    return Err(self.fail(w.id, "the worker thread ended without answering".into()))
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.dispatcher.stop();
        for q in &self.queues {
            q.shutdown();
        }
        for w in &mut self.targets {
            w.commands = None;
        }
        for w in &mut self.drafters {
            w.commands = None;
        }
        for handle in self
            .targets
            .iter_mut()
            .filter_map(|w| w.handle.take())
            .chain(self.drafters.iter_mut().filter_map(|w| w.handle.take()))
        {
            let _ = handle.join();
        }
    }
}
