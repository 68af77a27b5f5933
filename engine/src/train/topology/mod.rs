//! The multi-device topology behind [`crate::train::Trainer`].
//!
//! - **Target workers** (one thread per `topology.target_devices` entry) each hold a frozen
//!   target replica. They take micro-batch indices from one shared [`pipeline::Dispatcher`] in
//!   order, build the micro-batch (a pure function of its index), run the target under no_grad
//!   and push the tap-layer features, tagged with the index, into the hidden-state queue of
//!   the drafter rank that trains it (`index mod ranks`), already on that rank's device.
//! - **Drafter ranks** (one per `topology.drafter_devices` entry) hold data-parallel replicas.
//!   Rank 0 runs on the thread that calls `Trainer::train_step`; the others are worker threads.
//!   Each step every rank trains its micro-batches in index order (arrival order never matters),
//!   then gradients and Σw are summed across ranks ([`allreduce`]: CPU threads, or NCCL on
//!   CUDA), normalised by the global Σw, clipped and applied identically on every replica.
//! - One device for both roles runs **inline** on the calling thread: no thread, no queue, no
//!   copy (the embedded CPU default).
//! - Before concurrent training, each worker runs its first forward (target) or
//!   forward+backward (drafter) alone, one device at a time ([`warmup`]).
//! - A worker error or panic stops everything: the first failure is kept, queues are shut
//!   down, the all-reduce group is aborted, and every later step returns the error naming the
//!   worker and its device. Training never continues with fewer devices.
mod cluster;
pub mod pipeline;
pub mod queue;
pub mod rank;
pub mod step;
pub mod warmup;
mod workers;

use std::fmt;
use std::sync::{Arc, Mutex};

use dflash_shared::config::{Config, QueueSection};
use dflash_shared::metrics::DeviceRole;
use tch::Device;

pub use cluster::Cluster;
pub use pipeline::QueueMonitor;
pub use warmup::WorkerWarmup;

use self::pipeline::{Dispatcher, ItemQueue};
use crate::collective::allreduce::AbortGroup;
use crate::device;
use crate::train::error::{TrainError, WorkerFailed};
use crate::train::topology::queue::QueueConfig;

/// Where each role runs, and the queue between them.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologySpec {
    pub target_devices: Vec<Device>,
    pub drafter_devices: Vec<Device>,
    /// The whole hidden-state budget; split evenly over the drafter ranks' queues.
    pub queue: QueueConfig,
}

impl TopologySpec {
    /// Both roles on one device, run inline.
    pub fn single(device: Device) -> Self {
        Self {
            target_devices: vec![device],
            drafter_devices: vec![device],
            queue: step::queue_config(&QueueSection::default()),
        }
    }

    /// `[topology]` and `[queue]` of a run config.
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            target_devices: cfg
                .topology
                .target_devices
                .iter()
                .map(|&d| device::from_config(d))
                .collect(),
            drafter_devices: cfg
                .topology
                .drafter_devices
                .iter()
                .map(|&d| device::from_config(d))
                .collect(),
            queue: step::queue_config(&cfg.queue),
        }
    }

    /// Every device the run trains on, targets first (each once): the devices whose peaks
    /// `TrainerSpec::device_peaks` wants.
    pub fn devices(&self) -> Vec<Device> {
        let mut out: Vec<Device> = Vec::new();
        for d in self.target_devices.iter().chain(&self.drafter_devices) {
            if !out.contains(d) {
                out.push(*d);
            }
        }
        out
    }

    /// One device runs both roles on the calling thread.
    pub fn is_inline(&self) -> bool {
        self.target_devices.len() == 1 && self.target_devices == self.drafter_devices
    }

    /// Non-empty device lists, each GPU present and used by at most one drafter rank, all
    /// drafters of one kind (their gradients are summed with one mechanism).
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |key: &str, detail: String| {
            Err(TrainError::Config {
                key: format!("topology.{key}"),
                detail,
            })
        };
        for (key, list) in [
            ("target_devices", &self.target_devices),
            ("drafter_devices", &self.drafter_devices),
        ] {
            if list.is_empty() {
                return bad(key, "must list at least one device, found none".into());
            }
            let visible = tch::Cuda::device_count().max(0) as usize;
            for d in list {
                match d {
                    Device::Cpu => {}
                    Device::Cuda(i) if *i < visible => {}
                    Device::Cuda(i) => {
                        return bad(
                            key,
                            format!("names cuda:{i}, but libtorch sees {visible} CUDA device(s)"),
                        )
                    }
                    other => {
                        return bad(
                            key,
                            format!("names {other:?}: only cpu and cuda:N are supported"),
                        )
                    }
                }
            }
        }
        let drafters = &self.drafter_devices;
        if drafters.iter().any(|d| d.is_cuda()) && drafters.iter().any(|d| !d.is_cuda()) {
            return bad(
                "drafter_devices",
                "must be all \"cpu\" or all \"cuda:N\", found a mix".into(),
            );
        }
        for (i, d) in drafters.iter().enumerate() {
            if d.is_cuda() && drafters[..i].contains(d) {
                return bad(
                    "drafter_devices",
                    format!("lists {} twice: one drafter rank per GPU", device::name(*d)),
                );
            }
        }
        self.queue.validate().map_err(|e| TrainError::Config {
            key: "queue".into(),
            detail: e.to_string(),
        })
    }
}

/// A worker thread: its role, its index among the workers of that role, and its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerId {
    pub role: DeviceRole,
    pub index: usize,
    pub device: Device,
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            DeviceRole::Target => "target",
            DeviceRole::Drafter => "drafter",
            DeviceRole::Both => "target+drafter",
            DeviceRole::Idle => "idle",
        };
        write!(
            f,
            "{role} worker {} on {}",
            self.index,
            device::name(self.device)
        )
    }
}

/// What stopped a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerFailure {
    pub worker: WorkerId,
    pub detail: String,
}

impl WorkerFailure {
    pub fn to_error(&self) -> TrainError {
        TrainError::Worker(Box::new(WorkerFailed {
            worker: self.worker.to_string(),
            device: device::name(self.worker.device),
            role: self.worker.role,
            rank: self.worker.index,
            detail: self.detail.clone(),
        }))
    }
}

/// The first failure of any worker, and what it takes down with it.
pub(crate) struct Tripwire {
    first: Mutex<Option<WorkerFailure>>,
    dispatcher: Arc<Dispatcher>,
    queues: Vec<Arc<ItemQueue>>,
    /// What releases the drafter ranks waiting in their gradient group: the in-process
    /// group's one handle, or one per rank's endpoint of a job's cross-process group.
    abort: Mutex<Vec<Arc<dyn AbortGroup>>>,
}

impl Tripwire {
    /// Records `failure` unless one is already recorded, then stops every worker: no more
    /// dispatch, queues shut down (blocked pushes and pops return), all-reduce aborted.
    pub fn trip(&self, failure: WorkerFailure) {
        {
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some(failure);
            }
        }
        self.dispatcher.stop();
        for q in &self.queues {
            q.shutdown();
        }
        let aborts = self.abort.lock().unwrap_or_else(|p| p.into_inner());
        for abort in aborts.iter() {
            abort.abort();
        }
    }

    /// The ranks now sum over other groups (a trainer joined a job): a failure aborts these.
    /// Aborted at once when a failure came first.
    pub fn replace_aborts(&self, aborts: Vec<Arc<dyn AbortGroup>>) {
        // Under the lock: a trip that records its failure after the check below aborts
        // through this lock, so it finds the new handles.
        let mut held = self.abort.lock().unwrap_or_else(|p| p.into_inner());
        if self.failure().is_some() {
            for abort in &aborts {
                abort.abort();
            }
        }
        *held = aborts;
    }

    pub fn failure(&self) -> Option<WorkerFailure> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_from_config_and_their_checks() {
        let cfg = Config::embedded_default();
        let spec = TopologySpec::from_config(&cfg);
        assert!(spec.is_inline());
        spec.validate().unwrap();
        assert_eq!(spec.queue.capacity, cfg.queue.capacity);

        let mut two = TopologySpec::single(Device::Cpu);
        two.target_devices.push(Device::Cpu);
        assert!(!two.is_inline());
        two.validate().unwrap();

        let mut none = TopologySpec::single(Device::Cpu);
        none.drafter_devices.clear();
        let err = none.validate().unwrap_err().to_string();
        assert!(err.contains("topology.drafter_devices"), "{err}");

        let mut missing = TopologySpec::single(Device::Cpu);
        missing.target_devices = vec![Device::Cuda(63)];
        let err = missing.validate().unwrap_err().to_string();
        assert!(
            err.contains("cuda:63") && err.contains("topology.target_devices"),
            "{err}"
        );
    }

    /// Counts the aborts it receives.
    #[derive(Default)]
    struct Counted(std::sync::atomic::AtomicUsize);

    impl AbortGroup for Counted {
        fn abort(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A trainer that joined a job hands its ranks' cross-process endpoints to the tripwire:
    /// a failure aborts those (and no longer the dropped in-process group), and handles given
    /// after a failure are aborted at once.
    #[test]
    fn a_failure_aborts_the_endpoints_that_replaced_the_in_process_group() {
        let count = |c: &Arc<Counted>| c.0.load(std::sync::atomic::Ordering::SeqCst);
        let in_process = Arc::new(Counted::default());
        let tripwire = Tripwire {
            first: Mutex::new(None),
            dispatcher: Arc::new(Dispatcher::new(
                0,
                crate::train::shard::NodeShard::single_process(2, 1),
            )),
            queues: Vec::new(),
            abort: Mutex::new(vec![Arc::clone(&in_process) as Arc<dyn AbortGroup>]),
        };
        let endpoints: Vec<Arc<Counted>> = (0..2).map(|_| Arc::default()).collect();
        tripwire.replace_aborts(
            endpoints
                .iter()
                .map(|e| Arc::clone(e) as Arc<dyn AbortGroup>)
                .collect(),
        );
        assert!(endpoints.iter().all(|e| count(e) == 0), "no failure yet");
        tripwire.trip(WorkerFailure {
            worker: WorkerId {
                role: DeviceRole::Drafter,
                index: 1,
                device: Device::Cpu,
            },
            detail: "lost the peer".into(),
        });
        assert_eq!(count(&in_process), 0, "the in-process group was replaced");
        assert!(endpoints.iter().all(|e| count(e) == 1));
        let late = Arc::new(Counted::default());
        tripwire.replace_aborts(vec![Arc::clone(&late) as Arc<dyn AbortGroup>]);
        assert_eq!(
            count(&late),
            1,
            "handed over after the failure: aborted at once"
        );
    }

    #[test]
    fn failures_name_the_worker_and_its_device() {
        let f = WorkerFailure {
            worker: WorkerId {
                role: DeviceRole::Target,
                index: 3,
                device: Device::Cuda(4),
            },
            detail: "CUDA out of memory".into(),
        };
        let text = f.to_error().to_string();
        assert!(
            text.starts_with("target worker 3 on cuda:4 failed: CUDA out of memory"),
            "{text}"
        );
        assert!(
            text.contains("never continues with fewer devices"),
            "{text}"
        );
    }
}
