//! Serialized warmup records: before workers run concurrently, each runs its first forward
//! (target) or forward+backward (drafter) alone, one device at a time, so first-use costs
//! (allocator growth, kernel selection and compilation, lazy library loading) never race.
use std::path::Path;

use dflash_shared::metrics::{DeviceRole, TimestampMs};
use serde::{Deserialize, Serialize};

use super::WorkerId;
use crate::engine::train::trainer::device_name;
use crate::telemetry::warmup::{WarmupDevice, WarmupRecord as WarmupFile};

/// One worker's warmup, for the daemon's journal (`WarmupDone`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmupRecord {
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub role: DeviceRole,
    /// Index among the workers of this role.
    pub worker: usize,
    pub duration_ms: f64,
    pub finished_ms: TimestampMs,
}

impl WarmupRecord {
    pub fn new(worker: WorkerId, duration_ms: f64) -> Self {
        Self {
            device: device_name(worker.device),
            role: worker.role,
            worker: worker.index,
            duration_ms,
            finished_ms: chrono::Utc::now().timestamp_millis(),
        }
    }
}

/// Writes the records as the daemon's warmup record (`<run_dir>/warmup.json`, atomically),
/// keeping the environment digest an earlier record carries.
pub fn write_warmup_file(run_dir: &Path, records: &[WarmupRecord]) -> std::io::Result<()> {
    let mut file = WarmupFile::load(run_dir).unwrap_or_default();
    file.devices = records
        .iter()
        .map(|r| WarmupDevice {
            device: r.device.clone(),
            role: r.role,
            duration_ms: r.duration_ms,
            finished_ms: r.finished_ms,
        })
        .collect();
    file.save(run_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn the_file_lists_every_worker_and_keeps_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        WarmupFile {
            fingerprint_digest: Some("env-1".into()),
            devices: vec![],
        }
        .save(dir.path())
        .unwrap();
        let id = |role, index, device| WorkerId {
            role,
            index,
            device,
        };
        let records = vec![
            WarmupRecord::new(id(DeviceRole::Target, 0, Device::Cuda(0)), 6300.0),
            WarmupRecord::new(id(DeviceRole::Drafter, 0, Device::Cuda(5)), 900.0),
        ];
        write_warmup_file(dir.path(), &records).unwrap();
        let back = WarmupFile::load(dir.path()).unwrap();
        assert!(back.matches("env-1"));
        let devices: Vec<(&str, DeviceRole)> = back
            .devices
            .iter()
            .map(|d| (d.device.as_str(), d.role))
            .collect();
        assert_eq!(
            devices,
            vec![
                ("cuda:0", DeviceRole::Target),
                ("cuda:5", DeviceRole::Drafter)
            ]
        );
    }
}
