//! Per-GPU telemetry through NVML, with libtorch allocator statistics attached.
//!
//! The NVML handle is opened once and kept for the daemon's lifetime. A field NVML cannot
//! read is `None`; without NVML at all (no driver, as on CPU machines) the sampler returns
//! [`GpuTelemetry::Unavailable`] with the reason. No GPU number is ever made up.
//!
//! Memory semantics: nvml-wrapper >= 0.11 calls `nvmlDeviceGetMemoryInfo_v2`, whose `used`
//! excludes the driver/firmware `reserved` memory (it matches nvidia-smi). `memory_used_bytes`
//! is that v2 `used`, and the memory-flatness detector judges it.
use std::collections::BTreeMap;

use dflash_shared::metrics::{DeviceRole, GpuSample, GpuTelemetry, TimestampMs};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

use super::allocator;
use super::cuda_order::{map_cuda_devices, CudaGpu, CudaOrder, NvmlGpu};

pub struct GpuSampler {
    nvml: Result<Nvml, String>,
    roles: BTreeMap<u32, DeviceRole>,
    /// NVML index of each CUDA device index this process sees (CUDA_VISIBLE_DEVICES order).
    cuda_to_nvml: Vec<Option<u32>>,
    /// The same mapping in full (UUID, PCI bus id, MIG entries), for `dflashd doctor`.
    cuda_devices: Vec<String>,
    names: BTreeMap<u32, String>,
    /// UUIDs by NVML index, read once (they label the Prometheus series, to join with DCGM).
    uuids: BTreeMap<u32, Option<String>>,
    /// Reset allocator peaks after each reading so peaks are per window.
    reset_allocator_peaks: bool,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler")
            .field("nvml", &self.nvml.as_ref().map(|_| "open"))
            .field("roles", &self.roles)
            .field("cuda_to_nvml", &self.cuda_to_nvml)
            .finish()
    }
}

impl GpuSampler {
    /// Opens NVML once. Never fails: an unavailable NVML is a state, reported on every sample.
    pub fn new() -> Self {
        let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"));
        let mut sampler = GpuSampler {
            nvml,
            roles: BTreeMap::new(),
            cuda_to_nvml: Vec::new(),
            cuda_devices: Vec::new(),
            names: BTreeMap::new(),
            uuids: BTreeMap::new(),
            reset_allocator_peaks: true,
        };
        let (table, mapped) = sampler.compute_cuda_mapping();
        sampler.cuda_to_nvml = mapped.iter().map(CudaGpu::nvml_index).collect();
        sampler.cuda_devices = mapped.iter().map(|g| g.describe(&table)).collect();
        sampler
    }

    pub fn is_available(&self) -> bool {
        self.nvml.is_ok()
    }

    pub fn unavailable_reason(&self) -> Option<&str> {
        self.nvml.as_ref().err().map(String::as_str)
    }

    /// Roles by NVML index, from the topology (target/drafter GPUs).
    pub fn set_roles(&mut self, roles: BTreeMap<u32, DeviceRole>) {
        self.roles = roles;
    }

    /// Roles given by CUDA device index (how the config names devices), mapped to NVML.
    pub fn set_roles_by_cuda_index(&mut self, roles: &[(usize, DeviceRole)]) {
        self.roles = roles
            .iter()
            .filter_map(|&(cuda, role)| {
                self.cuda_to_nvml
                    .get(cuda)
                    .copied()
                    .flatten()
                    .map(|n| (n, role))
            })
            .collect();
    }

    /// One line per CUDA device of this process: the NVML device it is (UUID, PCI bus id), a
    /// MIG instance, or why it cannot be told.
    pub fn cuda_devices(&self) -> &[String] {
        &self.cuda_devices
    }

    /// Total memory of CUDA device `cuda_index` (this process's numbering), from NVML; `None`
    /// without NVML or when the device cannot be told (a MIG instance, an unmapped index).
    pub fn memory_total_bytes(&self, cuda_index: usize) -> Option<u64> {
        let nvml = self.nvml.as_ref().ok()?;
        let index = self.cuda_to_nvml.get(cuda_index).copied().flatten()?;
        let device = nvml.device_by_index(index).ok()?;
        device.memory_info().ok().map(|m| m.total)
    }

    /// NVML's model name of CUDA device `cuda_index` ("NVIDIA H200"); `None` as for
    /// [`Self::memory_total_bytes`].
    pub fn model_name(&self, cuda_index: usize) -> Option<String> {
        let nvml = self.nvml.as_ref().ok()?;
        let index = self.cuda_to_nvml.get(cuda_index).copied().flatten()?;
        nvml.device_by_index(index).ok()?.name().ok()
    }

    pub fn driver_version(&self) -> Option<String> {
        self.nvml.as_ref().ok()?.sys_driver_version().ok()
    }

    /// CUDA version the driver supports, e.g. "12.8".
    pub fn cuda_driver_version(&self) -> Option<String> {
        let v = self.nvml.as_ref().ok()?.sys_cuda_driver_version().ok()?;
        Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    /// Model names of every GPU NVML sees, in NVML order.
    pub fn gpu_models(&self) -> Vec<String> {
        let Ok(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .map(|i| {
                nvml.device_by_index(i)
                    .and_then(|d| d.name())
                    .unwrap_or_else(|e| format!("unknown ({e})"))
            })
            .collect()
    }

    pub fn sample(&mut self, ts_ms: TimestampMs) -> GpuTelemetry {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(reason) => {
                return GpuTelemetry::Unavailable {
                    reason: reason.clone(),
                }
            }
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                return GpuTelemetry::Unavailable {
                    reason: format!("NVML device count failed: {e}"),
                }
            }
        };
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(index, error = %e, "NVML device handle failed");
                    gpus.push(empty_sample(
                        ts_ms,
                        index,
                        format!("unreadable ({e})"),
                        self.role(index),
                    ));
                    continue;
                }
            };
            let name = match self.names.get(&index) {
                Some(n) => n.clone(),
                None => {
                    let n = device.name().unwrap_or_else(|e| format!("unknown ({e})"));
                    self.names.insert(index, n.clone());
                    n
                }
            };
            let uuid = self
                .uuids
                .entry(index)
                .or_insert_with(|| device.uuid().ok())
                .clone();
            let memory = device.memory_info().ok();
            gpus.push(GpuSample {
                ts_ms,
                index,
                name,
                uuid,
                role: self.role(index),
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
                utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
                power_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
                allocator: None,
            });
        }
        self.attach_allocator_stats(&mut gpus);
        GpuTelemetry::Available { gpus }
    }

    fn role(&self, index: u32) -> DeviceRole {
        self.roles.get(&index).copied().unwrap_or(DeviceRole::Idle)
    }

    fn attach_allocator_stats(&self, gpus: &mut [GpuSample]) {
        if !allocator::cuda_query_compiled() || !tch::Cuda::is_available() {
            return;
        }
        for (cuda, nvml_index) in self.cuda_to_nvml.iter().enumerate() {
            let Some(sample) = nvml_index.and_then(|n| gpus.iter_mut().find(|g| g.index == n))
            else {
                continue;
            };
            match allocator::cuda_stats(cuda) {
                Ok(stats) => {
                    sample.allocator = Some(stats);
                    if self.reset_allocator_peaks {
                        let _ = allocator::reset_peak(cuda);
                    }
                }
                Err(e) => tracing::debug!(cuda, error = %e, "allocator statistics unavailable"),
            }
        }
    }

    /// NVML's table and each CUDA device's place in it (see `cuda_order`).
    fn compute_cuda_mapping(&self) -> (Vec<NvmlGpu>, Vec<CudaGpu>) {
        let Ok(nvml) = &self.nvml else {
            return (Vec::new(), Vec::new());
        };
        let count = nvml.device_count().unwrap_or(0);
        let table: Vec<NvmlGpu> = (0..count)
            .map(|i| {
                let device = nvml.device_by_index(i).ok();
                NvmlGpu {
                    uuid: device
                        .as_ref()
                        .and_then(|d| d.uuid().ok())
                        .unwrap_or_default(),
                    pci_bus_id: device
                        .as_ref()
                        .and_then(|d| d.pci_info().ok())
                        .map(|p| p.bus_id)
                        .unwrap_or_default(),
                    name: device
                        .as_ref()
                        .and_then(|d| d.name().ok())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let order = CudaOrder::from_env(std::env::var("CUDA_DEVICE_ORDER").ok().as_deref());
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let mapped = map_cuda_devices(order, visible.as_deref(), &table);
        (table, mapped)
    }
}

impl Default for GpuSampler {
    fn default() -> Self {
        Self::new()
    }
}

fn empty_sample(ts_ms: TimestampMs, index: u32, name: String, role: DeviceRole) -> GpuSample {
    GpuSample {
        ts_ms,
        index,
        name,
        uuid: None,
        role,
        memory_used_bytes: None,
        memory_total_bytes: None,
        utilization_pct: None,
        power_w: None,
        temperature_c: None,
        allocator: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nvml_the_sampler_says_why_and_invents_nothing() {
        let mut s = GpuSampler::new();
        match s.sample(0) {
            GpuTelemetry::Unavailable { reason } => {
                assert!(!s.is_available());
                assert!(reason.starts_with("NVML unavailable"), "{reason}");
                assert!(s.gpu_models().is_empty());
                assert!(s.driver_version().is_none());
            }
            GpuTelemetry::Available { gpus } => {
                // A machine with a driver: every reading is NVML's or None.
                assert!(s.is_available());
                for g in gpus {
                    if let (Some(u), Some(t)) = (g.memory_used_bytes, g.memory_total_bytes) {
                        assert!(u <= t, "{g:?}");
                    }
                }
            }
        }
    }
}
