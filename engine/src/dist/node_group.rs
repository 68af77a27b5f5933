//! [`NodeEndpoint`]: one local drafter worker's endpoint of a job's flat gradient group, with
//! its peers named as nodes (issue 23). Global rank `r` is worker `r mod L` of node `r / L`
//! (`L` drafter workers per node), and the operator reads "lost node 1", not a rank of a group
//! or an address.
//!
//! Gloo names the lost peer by rank only in a group of two; with more ranks it gives the
//! peer's address, which says nothing about which node it was (every node of a loopback test
//! is 127.0.0.1). There the node's [`Liveness`] names it: a failure that names no node waits
//! (bounded) for the heartbeat judge's verdict, and a collective the judge aborted (a node
//! stopped without closing its sockets) reads as the node the judge named.
use std::sync::Arc;

use tch::Tensor;

use super::liveness::Liveness;
use super::process_group::ProcessGroupAllReduce;
use crate::collective::allreduce::{AbortGroup, AllReduce, AllReduceError};

/// One local rank's endpoint of the job's group.
pub struct NodeEndpoint {
    group: ProcessGroupAllReduce,
    /// Drafter workers per node.
    workers: usize,
    liveness: Option<Arc<Liveness>>,
}

impl NodeEndpoint {
    /// `group` is global rank `node·workers + worker`; `liveness`, when given, names the
    /// nodes Gloo cannot.
    pub fn new(
        group: ProcessGroupAllReduce,
        workers: usize,
        liveness: Option<Arc<Liveness>>,
    ) -> Self {
        NodeEndpoint {
            group,
            workers: workers.max(1),
            liveness,
        }
    }

    fn name(&self, e: AllReduceError) -> AllReduceError {
        name_failure(
            e,
            (self.group.rank(), self.group.world_size()),
            self.workers,
            self.liveness.as_deref(),
        )
    }
}

/// `e` (at rank `me.0` of `me.1`) with its peer named as a node: a peer named by rank maps to its node; a failure that
/// names no node (a peer named by address, an abort, a timeout, an NCCL failure) takes the
/// liveness verdict.
/// Only a lost peer named by address waits for one, for at most twice the heartbeat's bound:
/// its node died (its sockets closed), so its heartbeat has stopped and the judge names it
/// within the bound; the second bound is for a judge starved of the CPU, which restarts its
/// count: on a loaded machine a single bound is often too short
/// (docs/BENCHMARKS.md#naming-a-lost-node-under-load). An abort or a timeout takes only a verdict already given: the judge gives its
/// verdict before it aborts, and an abort without one is this node's own failure.
pub fn name_failure(
    e: AllReduceError,
    me: (usize, usize),
    workers: usize,
    liveness: Option<&Liveness>,
) -> AllReduceError {
    let node_of = |peer: &str| {
        peer.strip_prefix("rank ")
            .and_then(|r| r.parse::<usize>().ok())
            .map(|r| r / workers.max(1))
    };
    match e {
        AllReduceError::PeerLost {
            rank,
            world,
            peer,
            detail,
        } => {
            if let Some(node) = node_of(&peer) {
                if let Some(l) = liveness {
                    l.note_lost(node as u32);
                }
                return AllReduceError::PeerLost {
                    rank,
                    world,
                    peer: format!("node {node}"),
                    detail,
                };
            }
            let verdict = liveness.and_then(|l| l.wait_verdict(l.bounds().bound() * 2));
            match verdict {
                Some(v) => AllReduceError::PeerLost {
                    rank,
                    world,
                    peer: format!("node {}", v.node()),
                    detail: format!("{v}; {detail}"),
                },
                None => AllReduceError::PeerLost {
                    rank,
                    world,
                    peer,
                    detail,
                },
            }
        }
        AllReduceError::Aborted | AllReduceError::Timeout { .. } | AllReduceError::Nccl(_) => {
            match liveness.and_then(Liveness::verdict).filter(|v| v.aborts()) {
                Some(v) => AllReduceError::PeerLost {
                    rank: me.0,
                    world: me.1,
                    peer: format!("node {}", v.node()),
                    detail: match &e {
                        AllReduceError::Timeout { detail, .. } => format!("{v}; {detail}"),
                        AllReduceError::Nccl(detail) => format!("{v}; NCCL: {detail}"),
                        _ => v.to_string(),
                    },
                },
                None => e,
            }
        }
        other => other,
    }
}

/// Marks this node as having quit before aborting its endpoint: the tripwire aborts every
/// local endpoint on the first failure of a local worker, and the other nodes then read,
/// at their next beat, that this node left the group, instead of waiting for it until the
/// collective timeout.
struct QuitThenAbort {
    liveness: Arc<Liveness>,
    inner: Arc<dyn AbortGroup>,
}

impl AbortGroup for QuitThenAbort {
    fn abort(&self) {
        self.liveness
            .quit("it stopped after a failure on that node");
        self.inner.abort();
    }
}

impl AllReduce for NodeEndpoint {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn sum_tensor(&mut self, buffer: &mut Tensor) -> Result<(), AllReduceError> {
        self.group.sum_tensor(buffer).map_err(|e| self.name(e))
    }

    fn sum_f64(&mut self, values: &mut [f64]) -> Result<(), AllReduceError> {
        self.group.sum_f64(values).map_err(|e| self.name(e))
    }

    fn endpoint_abort(&self) -> Option<Arc<dyn AbortGroup>> {
        let inner = self.group.abort_handle();
        Some(match &self.liveness {
            Some(liveness) => Arc::new(QuitThenAbort {
                liveness: Arc::clone(liveness),
                inner,
            }),
            None => inner,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(peer: &str, workers: usize) -> String {
        name_failure(
            AllReduceError::PeerLost {
                rank: 0,
                world: 2 * workers,
                peer: peer.into(),
                detail: "closed".into(),
            },
            (0, 2 * workers),
            workers,
            None,
        )
        .to_string()
    }

    #[test]
    fn a_peer_named_by_rank_is_named_by_its_node_and_an_address_stays_without_a_heartbeat() {
        assert_eq!(
            lost("rank 1", 1),
            "rank 0 of 2: lost node 1 during an all-reduce (closed)"
        );
        // Two drafter workers per node: global ranks 2 and 3 are node 1's.
        assert_eq!(
            lost("rank 3", 2),
            "rank 0 of 4: lost node 1 during an all-reduce (closed)"
        );
        assert_eq!(
            lost("the peer at [10.0.0.2]:4100", 2),
            "rank 0 of 4: lost the peer at [10.0.0.2]:4100 during an all-reduce (closed)"
        );
        assert_eq!(
            name_failure(AllReduceError::Aborted, (0, 4), 2, None),
            AllReduceError::Aborted
        );
    }
}
