//! The worker threads: target workers (produce hidden states) and drafter ranks 1.. (train).
//! Both wait for commands first, so the warmup can run them one at a time; a target worker
//! then produces until stopped, a drafter rank serves one step per command. Any error or
//! panic trips the [`Tripwire`] with the worker's identity and ends the thread.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tch::{Device, Tensor};

use super::pipeline::{produce_item, Dispatcher, Inbox, ItemQueue};
use super::rank::{RankReport, RankState};
use super::{Tripwire, WorkerFailure, WorkerId};
use crate::collective::allreduce::AllReduce;
use crate::device::torch_panic::panic_text;
use crate::model::target::{FeatureRequest, TargetHidden, TargetModel};
use crate::train::micro::{MicroSource, PreparedMicro};
use crate::train::replica::{ReplicaState, StepSchedule, TargetStates};
use crate::train::shard::NodeShard;

/// Runs `body`, turning a panic into an error text.
pub(crate) fn guarded<T>(body: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(payload) => Err(panic_text(payload.as_ref())),
    }
}

/// What every target worker shares.
pub(crate) struct ProducerShared {
    pub source: Arc<MicroSource>,
    /// What every item asks of the target (the drafter's taps, and its last hidden state
    /// when the head needs it).
    pub request: FeatureRequest,
    pub dispatcher: Arc<Dispatcher>,
    /// One queue per drafter rank.
    pub queues: Vec<Arc<ItemQueue>>,
    pub drafter_devices: Vec<Device>,
    pub tripwire: Arc<Tripwire>,
}

/// The warmup's output: the micro-batch and the target's states on the worker's device.
pub(crate) type WarmupOutput = Result<(PreparedMicro, TargetHidden, f64), String>;

pub(crate) enum TargetCommand {
    /// Run the target once on micro-batch `seq`, alone; reply with its states.
    Warmup {
        seq: u64,
        reply: Sender<WarmupOutput>,
    },
    /// Produce until the dispatcher stops.
    Run,
}

pub(crate) struct TargetWorker {
    pub id: WorkerId,
    pub commands: Option<Sender<TargetCommand>>,
    pub handle: Option<JoinHandle<()>>,
}

/// libtorch's intra-op thread count is per thread (OpenMP): a new thread would use every
/// core. Workers take the count of the thread that created them, so `--threads` (and a test's
/// `set_num_threads(1)`) holds on every worker and results do not depend on which thread ran.
fn inherit_threads(count: i32) {
    if count > 0 {
        tch::set_num_threads(count);
    }
}

pub(crate) fn spawn_target(
    id: WorkerId,
    target: TargetModel,
    shared: Arc<ProducerShared>,
) -> std::io::Result<TargetWorker> {
    let (tx, rx) = channel();
    let threads = tch::get_num_threads();
    let handle = std::thread::Builder::new()
        .name(format!("dflash-target-{}", id.index))
        .spawn(move || {
            inherit_threads(threads);
            target_main(id, target, shared, rx)
        })?;
    Ok(TargetWorker {
        id,
        commands: Some(tx),
        handle: Some(handle),
    })
}

fn target_main(
    id: WorkerId,
    target: TargetModel,
    shared: Arc<ProducerShared>,
    commands: Receiver<TargetCommand>,
) {
    let fail = |detail: String| {
        shared.tripwire.trip(WorkerFailure { worker: id, detail });
    };
    while let Ok(command) = commands.recv() {
        match command {
            TargetCommand::Warmup { seq, reply } => {
                let outcome = guarded(|| {
                    let t = Instant::now();
                    let item = produce_item(
                        &target,
                        &shared.source,
                        &shared.request,
                        seq,
                        id.device,
                        id.index,
                    )?;
                    let hidden = TargetHidden {
                        features: item.features,
                        last_hidden: item.last_hidden,
                    };
                    Ok((item.micro, hidden, t.elapsed().as_secs_f64() * 1e3))
                });
                if let Err(e) = &outcome {
                    fail(e.clone());
                }
                let failed = outcome.is_err();
                let _ = reply.send(outcome);
                if failed {
                    return;
                }
            }
            TargetCommand::Run => {
                while let Some((seq, rank)) = shared.dispatcher.next() {
                    let dest = shared.drafter_devices[rank];
                    let item = guarded(|| {
                        produce_item(
                            &target,
                            &shared.source,
                            &shared.request,
                            seq,
                            dest,
                            id.index,
                        )
                    });
                    match item {
                        Ok(item) => {
                            if shared.queues[rank].push(item).is_err() {
                                return; // shut down: another worker failed or training ended
                            }
                        }
                        Err(e) => return fail(e),
                    }
                }
                return;
            }
        }
    }
}

pub(crate) enum DrafterCommand {
    Warmup {
        hidden: TargetHidden,
        micro: PreparedMicro,
        reply: Sender<Result<f64, String>>,
    },
    Step {
        base: u64,
        lr: f64,
        /// This step's scheduled weights.
        schedule: StepSchedule,
        reply: Sender<Result<RankReport, String>>,
    },
    Load {
        state: ReplicaState,
        reply: Sender<Result<(), String>>,
    },
    Snapshot {
        reply: Sender<Vec<(String, Tensor)>>,
    },
    /// Train `shard`'s share of every step from now on and sum over `endpoint` (this rank's
    /// endpoint of the job's gradient group): the trainer joined a job, before any step.
    JoinJob {
        shard: NodeShard,
        endpoint: Box<dyn AllReduce>,
        reply: Sender<Result<(), String>>,
    },
    /// Take part in a sum over the group that is not a step's (the job view after each step:
    /// every rank of the group must call every collective, this one with zeros).
    SumF64 {
        values: Vec<f64>,
        reply: Sender<Result<Vec<f64>, String>>,
    },
}

pub(crate) struct DrafterWorker {
    pub id: WorkerId,
    pub commands: Option<Sender<DrafterCommand>>,
    pub handle: Option<JoinHandle<()>>,
}

/// Drafter rank `worker` of this process (1..), training `shard`'s share of every step.
pub(crate) fn spawn_drafter(
    state: RankState,
    inbox: Inbox,
    shard: NodeShard,
    worker: usize,
    tripwire: Arc<Tripwire>,
) -> std::io::Result<DrafterWorker> {
    let id = state.id;
    let (tx, rx) = channel();
    let threads = tch::get_num_threads();
    let handle = std::thread::Builder::new()
        .name(format!("dflash-drafter-{worker}"))
        .spawn(move || {
            inherit_threads(threads);
            drafter_main(state, inbox, shard, worker, tripwire, rx)
        })?;
    Ok(DrafterWorker {
        id,
        commands: Some(tx),
        handle: Some(handle),
    })
}

/// Fetches from an inbox, timing the wait; a shut-down queue is an error.
pub(crate) fn fetch_from(
    inbox: &mut Inbox,
    seq: u64,
) -> Result<(super::pipeline::HiddenItem, f64), String> {
    let t = Instant::now();
    match inbox.take(seq) {
        Some(item) => Ok((item, t.elapsed().as_secs_f64() * 1e3)),
        None => Err(format!(
            "the hidden-state queue was shut down while waiting for micro-batch {seq}"
        )),
    }
}

/// Records a failure (first) and only then answers, so whoever reads the answer finds the
/// tripwire already set. Returns whether the thread must end.
fn answer<T>(
    tripwire: &Tripwire,
    id: WorkerId,
    outcome: Result<T, String>,
    reply: &Sender<Result<T, String>>,
) -> bool {
    let failed = outcome.is_err();
    if let Err(detail) = &outcome {
        tripwire.trip(WorkerFailure {
            worker: id,
            detail: detail.clone(),
        });
    }
    let _ = reply.send(outcome);
    failed
}

fn drafter_main(
    mut state: RankState,
    mut inbox: Inbox,
    mut shard: NodeShard,
    worker: usize,
    tripwire: Arc<Tripwire>,
    commands: Receiver<DrafterCommand>,
) {
    let id = state.id;
    while let Ok(command) = commands.recv() {
        let end = match command {
            DrafterCommand::Warmup {
                hidden,
                micro,
                reply,
            } => {
                let outcome = guarded(|| Ok(state.warmup(TargetStates::from(&hidden), &micro)));
                answer(&tripwire, id, outcome, &reply)
            }
            DrafterCommand::Step {
                base,
                lr,
                schedule,
                reply,
            } => {
                let seqs = shard.worker_seqs(base, worker);
                let outcome = guarded(|| {
                    state.step(&seqs, lr, schedule, &mut |seq| fetch_from(&mut inbox, seq))
                });
                answer(&tripwire, id, outcome, &reply)
            }
            DrafterCommand::Load { state: s, reply } => {
                let outcome = guarded(|| state.replica.load_state(&s).map_err(|e| e.to_string()));
                answer(&tripwire, id, outcome, &reply)
            }
            DrafterCommand::Snapshot { reply } => {
                let weights = state
                    .replica
                    .optimizer()
                    .master_weights()
                    .into_iter()
                    .map(|(n, t)| (n, t.to_device(Device::Cpu).copy()))
                    .collect();
                let _ = reply.send(weights);
                false
            }
            DrafterCommand::JoinJob {
                shard: joined,
                endpoint,
                reply,
            } => {
                shard = joined;
                state.allreduce = Some(endpoint);
                answer(&tripwire, id, Ok(()), &reply)
            }
            DrafterCommand::SumF64 { mut values, reply } => {
                let outcome = guarded(|| match state.allreduce.as_mut() {
                    Some(group) => group
                        .sum_f64(&mut values)
                        .map(|()| values)
                        .map_err(|e| e.to_string()),
                    None => Err("this drafter rank has no all-reduce group".into()),
                });
                answer(&tripwire, id, outcome, &reply)
            }
        };
        if end {
            return;
        }
    }
}
