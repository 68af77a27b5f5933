//! [`ProcessGroupAllReduce`]: one rank's [`AllReduce`] endpoint of a group that spans processes
//! and machines, so `sum_in_buckets` and the trainer use it as they use the in-process groups.
//!
//! Every rank takes the same path up to the backend choice: it announces itself in the store,
//! waits (bounded) until every rank has, then joins the backend: Gloo (libtorch's
//! `ProcessGroupGloo`, CPU tensors) or NCCL (`ncclCommInitRank` with the unique id rank 0
//! published through the store, CUDA tensors). Sums are fp32 as in one process. Every
//! collective is bounded by the group's timeout and ends in an error, never a hang.
use std::sync::Arc;
use std::time::Duration;

use tch::{Kind, Tensor};

use super::gloo::{GlooGroup, GlooTransport};
use super::nccl_id;
use super::store::{StoreError, TcpStore};
use crate::collective::allreduce::{AbortGroup, AllReduce, AllReduceError};
use crate::collective::nccl::{self, NcclAllReduce};

/// Which engine sums the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollectiveBackend {
    /// CPU tensors through libtorch's Gloo, its transport bound as given.
    Gloo(GlooTransport),
    /// CUDA tensors of `cuda:device` through NCCL.
    Nccl { device: usize },
}

/// What one rank needs to join.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// Names the group's keys in the store (`drafter`), so groups never share keys.
    pub name: String,
    pub rank: usize,
    pub world_size: usize,
    /// Bounds the join and every collective.
    pub timeout: Duration,
    pub backend: CollectiveBackend,
}

enum Endpoint {
    Gloo(GlooGroup),
    Nccl(NcclAllReduce, Arc<nccl::NcclGroup>),
}

/// One rank's endpoint of a cross-process group.
pub struct ProcessGroupAllReduce {
    rank: usize,
    world: usize,
    timeout: Duration,
    endpoint: Endpoint,
}

/// Announces `spec.rank` in the store and waits until every rank has; a rank missing at the
/// timeout is named.
fn join_barrier(store: &TcpStore, spec: &GroupSpec) -> Result<(), AllReduceError> {
    let key = |r: usize| format!("{}/joined/{r}", spec.name);
    let store_err = |e: StoreError| AllReduceError::Join(e.to_string());
    store.set(&key(spec.rank), b"1").map_err(store_err)?;
    let keys: Vec<String> = (0..spec.world_size).map(key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    match store.wait(&refs, spec.timeout) {
        Ok(()) => Ok(()),
        Err(StoreError::Timeout { .. }) => {
            let mut missing = Vec::new();
            for (r, k) in refs.iter().enumerate() {
                if !store.check(&[k]).map_err(store_err)? {
                    missing.push(r.to_string());
                }
            }
            Err(AllReduceError::Join(format!(
                "rank {} of {}: rank(s) {} did not join group {:?} within {} ms; start every \
                 node with the same rendezvous address and world size",
                spec.rank,
                spec.world_size,
                missing.join(", "),
                spec.name,
                spec.timeout.as_millis()
            )))
        }
        Err(e) => Err(store_err(e)),
    }
}

impl ProcessGroupAllReduce {
    /// Joins the group `spec` describes through `store`, within `spec.timeout`.
    pub fn join(store: &TcpStore, spec: &GroupSpec) -> Result<Self, AllReduceError> {
        if spec.rank >= spec.world_size {
            return Err(AllReduceError::Join(format!(
                "rank {} is outside a world of {} ranks",
                spec.rank, spec.world_size
            )));
        }
        if spec.timeout.is_zero() {
            return Err(AllReduceError::Join(
                "a timeout of 0 is not allowed (there is no infinite wait)".into(),
            ));
        }
        join_barrier(store, spec)?;
        let endpoint = match &spec.backend {
            CollectiveBackend::Gloo(transport) => Endpoint::Gloo(GlooGroup::join(
                store,
                &format!("{}/gloo/", spec.name),
                spec.rank,
                spec.world_size,
                spec.timeout,
                transport,
            )?),
            CollectiveBackend::Nccl { device } => {
                let id = nccl_id::exchange_unique_id(
                    store,
                    &format!("{}/nccl_unique_id", spec.name),
                    spec.rank,
                    spec.timeout,
                )?;
                let (group, endpoint) = nccl::nccl_rank_endpoint(
                    &id,
                    spec.rank,
                    spec.world_size,
                    *device,
                    spec.timeout,
                )
                .map_err(AllReduceError::Join)?;
                Endpoint::Nccl(endpoint, group)
            }
        };
        Ok(ProcessGroupAllReduce {
            rank: spec.rank,
            world: spec.world_size,
            timeout: spec.timeout,
            endpoint,
        })
    }

    /// Joins this process's ranks of one group at once, one thread each, `specs` in the
    /// order of the returned endpoints (a node of `L` drafter workers joins its `L` global
    /// ranks). At once because each rank's join waits for every rank of the group, this
    /// process's too. Each rank past the first opens its own connection to `store`: a c10d
    /// TCPStore client holds its lock through a wait, so two ranks waiting on one connection
    /// would wait on each other until the timeout.
    pub fn join_local_ranks(
        store: &TcpStore,
        specs: &[GroupSpec],
    ) -> Result<Vec<Self>, AllReduceError> {
        if let [only] = specs {
            return Ok(vec![Self::join(store, only)?]);
        }
        let joined: Vec<Result<Self, AllReduceError>> = std::thread::scope(|scope| {
            let threads: Vec<_> = specs
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    scope.spawn(move || {
                        if i == 0 {
                            return Self::join(store, spec);
                        }
                        let own = TcpStore::connect(
                            store.host(),
                            store.port(),
                            spec.world_size,
                            spec.timeout,
                        )
                        .map_err(|e| AllReduceError::Join(format!("rank {}: {e}", spec.rank)))?;
                        Self::join(&own, spec)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join().unwrap_or_else(|p| {
                        Err(AllReduceError::Join(
                            crate::device::torch_panic::panic_text(p.as_ref()),
                        ))
                    })
                })
                .collect()
        });
        joined.into_iter().collect()
    }

    /// Aborts the group from any thread: a rank waiting in a collective returns
    /// [`AllReduceError::Aborted`], and so does every later call.
    pub fn abort_handle(&self) -> Arc<dyn AbortGroup> {
        match &self.endpoint {
            Endpoint::Gloo(g) => Arc::new(g.abort_handle()),
            Endpoint::Nccl(_, group) => Arc::clone(group) as Arc<dyn AbortGroup>,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl AllReduce for ProcessGroupAllReduce {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError> {
        match &mut self.endpoint {
            Endpoint::Gloo(g) => {
                if buffer.kind() != Kind::Float {
                    return Err(AllReduceError::BadBuffer(format!(
                        "expected an fp32 tensor, found {:?}",
                        buffer.kind()
                    )));
                }
                g.sum_in_place(buffer, self.timeout)
            }
            Endpoint::Nccl(e, _) => e.sum_tensor(buffer),
        }
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        match &mut self.endpoint {
            Endpoint::Gloo(g) => {
                let mut t = Tensor::from_slice(values);
                g.sum_in_place(&mut t, self.timeout)?;
                let back = Vec::<f64>::try_from(&t).map_err(|e| {
                    AllReduceError::BadBuffer(format!("reading the summed statistics: {e}"))
                })?;
                values.copy_from_slice(&back);
                Ok(())
            }
            Endpoint::Nccl(e, _) => e.sum_f64(values),
        }
    }

    fn endpoint_abort(&self) -> Option<Arc<dyn AbortGroup>> {
        Some(self.abort_handle())
    }
}
