//! The daemon's own warmup record: which devices ran their serialized first forward/backward,
//! how long it took, and under which environment. Listed with the compile caches, since a
//! missing or foreign record means the next start warms up cold.
use std::path::Path;

use dflash_shared::metrics::{DeviceRole, TimestampMs};
use serde::{Deserialize, Serialize};

use dflash_shared::run_dir::WARMUP_FILE_NAME;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmupDevice {
    pub device: String,
    pub role: DeviceRole,
    pub duration_ms: f64,
    pub finished_ms: TimestampMs,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupRecord {
    /// Digest of the environment fingerprint the warmup ran under.
    pub fingerprint_digest: Option<String>,
    pub devices: Vec<WarmupDevice>,
}

impl WarmupRecord {
    pub fn load(run_dir: &Path) -> Option<Self> {
        Self::load_file(&run_dir.join(WARMUP_FILE_NAME))
    }

    pub fn load_file(path: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// Adds or replaces one device's entry and writes the record atomically.
    pub fn record_device(&mut self, run_dir: &Path, entry: WarmupDevice) -> std::io::Result<()> {
        self.devices.retain(|d| d.device != entry.device);
        self.devices.push(entry);
        self.save(run_dir)
    }

    pub fn save(&self, run_dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        dflash_engine::files::atomic_write::write_atomic(&run_dir.join(WARMUP_FILE_NAME), &bytes)
    }

    /// Whether this record was made under the given environment.
    pub fn matches(&self, fingerprint_digest: &str) -> bool {
        self.fingerprint_digest.as_deref() == Some(fingerprint_digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_devices_atomically_and_reloads_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = WarmupRecord {
            fingerprint_digest: Some("abc".into()),
            devices: vec![],
        };
        for (d, ms) in [("cuda:0", 6300.0), ("cuda:1", 5900.0), ("cuda:0", 6100.0)] {
            r.record_device(
                dir.path(),
                WarmupDevice {
                    device: d.into(),
                    role: DeviceRole::Target,
                    duration_ms: ms,
                    finished_ms: 1,
                },
            )
            .unwrap();
        }
        let back = WarmupRecord::load(dir.path()).unwrap();
        assert_eq!(
            back.devices.len(),
            2,
            "re-warming a device replaces its entry"
        );
        assert_eq!(back.devices[1].duration_ms, 6100.0);
        assert!(back.matches("abc") && !back.matches("def"));
    }
}
