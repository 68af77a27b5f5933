//! Serialized warmup: before workers run concurrently, each runs its first forward (target) or
//! forward+backward (drafter) alone, one device at a time, so first-use costs (allocator
//! growth, kernel selection and compilation, lazy library loading) never race. The engine only
//! measures it; the daemon journals it and writes the run's warmup record.
use dflash_shared::metrics::{DeviceRole, TimestampMs};
use serde::{Deserialize, Serialize};

use super::WorkerId;
use crate::device;

/// One worker's serialized warmup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerWarmup {
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub role: DeviceRole,
    /// Index among the workers of this role.
    pub worker: usize,
    pub duration_ms: f64,
    pub finished_ms: TimestampMs,
}

impl WorkerWarmup {
    pub fn new(worker: WorkerId, duration_ms: f64) -> Self {
        Self {
            device: device::name(worker.device),
            role: worker.role,
            worker: worker.index,
            duration_ms,
            finished_ms: dflash_shared::clock::now_ms(),
        }
    }
}
