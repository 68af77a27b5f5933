//! Beyond one process: the rendezvous and the collective engines that data-parallel nodes (one
//! `dflashd` per node) share. Existing engines only, none written here:
//!
//! - [`store`]: libtorch's `c10d::TCPStore`, the rendezvous (rank 0 serves it).
//! - [`gloo`]: the CPU collective, libtorch's own `c10d::ProcessGroupGloo`.
//! - [`nccl_id`]: NCCL's unique id through the store, for `ncclCommInitRank`
//!   ([`crate::collective::nccl::nccl_rank_endpoint`]).
//! - [`process_group`]: [`ProcessGroupAllReduce`], one rank's
//!   [`AllReduce`](crate::collective::allreduce::AllReduce) over either backend.
//! - [`liveness`]: each node's heartbeat through the store and the judge that names a node
//!   that died or hung, within a bound of its own (liveness only, no collective).
//! - [`node_group`]: [`NodeEndpoint`], a local rank's endpoint with its peers named as nodes.
//!
//! Why not under `train/topology/`: the topology runs the workers of one process; this module
//! is the boundary between processes and machines, and the store also carries what is not a
//! collective (the NCCL unique id, and later the agreement checks between nodes). It uses
//! `train/topology/`'s `AllReduce` trait and NCCL endpoint; nothing in `train/` uses it yet.
pub mod gloo;
pub mod liveness;
pub mod nccl_id;
pub mod node_group;
pub mod process_group;
pub mod store;

pub use gloo::{GlooTransport, GLOO_MISSING};
pub use liveness::{Liveness, LivenessBounds, OnSilence, Silence};
pub use node_group::NodeEndpoint;
pub use process_group::{CollectiveBackend, GroupSpec, ProcessGroupAllReduce};
pub use store::{StoreError, TcpStore};
