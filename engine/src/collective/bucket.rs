//! The size of the gradient all-reduce bucket, declared once: the rank allocates it
//! (`train/topology/rank.rs`, filled by `allreduce.rs::sum_in_buckets`) and the memory plan
//! counts it (`plan/drafter.rs`). It sits outside both because `plan/` uses no `train/` code.

/// Bytes of the bucket: 25 MiB, the bucket size of PyTorch DDP's default (`bucket_cap_mb=25`):
/// large enough that NCCL runs at bandwidth, small enough to be noise next to the gradients
/// themselves.
pub const ALLREDUCE_BUCKET_BYTES: i64 = 25 << 20;

/// Elements of the bucket: it holds fp32 sums.
pub const ALLREDUCE_BUCKET_ELEMENTS: i64 = ALLREDUCE_BUCKET_BYTES / 4;
