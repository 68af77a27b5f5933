//! Beyond one process: the rendezvous and the collective engine that data-parallel nodes (one
//! `dflashd` per node) share. Existing engines only, none written here:
//!
//! - [`store`]: libtorch's `c10d::TCPStore`, the rendezvous (rank 0 serves it).
//!
//! Why not under `train/topology/`: the topology runs the workers of one process; this module
//! is the boundary between processes and machines, and the store also carries what is not a
//! collective (the NCCL unique id, and later the agreement checks between nodes).
pub mod store;

pub use store::{StoreError, TcpStore};
