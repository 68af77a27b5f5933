//! Beyond one process: the rendezvous and the collective engines that data-parallel nodes (one
//! `dflashd` per node) share. Existing engines only, none written here:
//!
//! - [`store`]: libtorch's `c10d::TCPStore`, the rendezvous (rank 0 serves it).
//! - [`gloo`]: the CPU collective, libtorch's own `c10d::ProcessGroupGloo`.
//! - [`nccl_id`]: NCCL's unique id through the store, for `ncclCommInitRank`
//!   ([`crate::train::topology::nccl::nccl_rank_endpoint`]).
//! - [`process_group`]: [`ProcessGroupAllReduce`], one rank's
//!   [`AllReduce`](crate::train::topology::allreduce::AllReduce) over either backend.
//!
//! Why not under `train/topology/`: the topology runs the workers of one process; this module
//! is the boundary between processes and machines, and the store also carries what is not a
//! collective (the NCCL unique id, and later the agreement checks between nodes). It uses
//! `train/topology/`'s `AllReduce` trait and NCCL endpoint; nothing in `train/` uses it yet.
pub mod gloo;
pub mod nccl_id;
pub mod process_group;
pub mod store;

pub use gloo::{GlooTransport, GLOO_MISSING};
pub use process_group::{CollectiveBackend, GroupSpec, ProcessGroupAllReduce};
pub use store::{StoreError, TcpStore};
