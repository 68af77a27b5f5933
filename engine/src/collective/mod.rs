//! The all-reduce contract and its in-process endpoints, beneath both the single-process
//! topology ([`crate::train::topology`]) and the cross-process groups ([`crate::dist`]):
//!
//! - [`allreduce`]: [`allreduce::AllReduce`] (one rank's endpoint of a group),
//!   [`allreduce::AbortGroup`], [`allreduce::AllReduceError`], the bucketed gradient sum and the
//!   CPU endpoint that sums across threads;
//! - [`bucket`]: the size of the gradient bucket, which the memory plan counts too;
//! - [`nccl`], [`nccl_lib`], [`nccl_watchdog`]: the CUDA endpoint, NCCL opened at run time from
//!   the torch wheel (its unique id, [`nccl_lib::NcclUniqueId`], is what `dist/` exchanges), and
//!   the watchdog that aborts a communicator whose peer is gone.
pub mod allreduce;
pub mod bucket;
pub mod nccl;
pub mod nccl_lib;
pub mod nccl_watchdog;
