//! What the daemon measures besides training metrics: GPUs (NVML + libtorch allocator),
//! the host (sysinfo), compile caches, and the environment fingerprint.
//!
//! Samplers return what they could read and say why for what they could not; no number is
//! ever filled in by guess.
pub mod allocator;
pub mod caches;
pub mod cuda_order;
pub mod env_watch;
pub mod fingerprint;
mod git;
pub mod gpu;
pub mod host;
pub mod python_env;
pub mod warmup;

pub use gpu::GpuSampler;
pub use host::HostSampler;
