//! Host-side telemetry through `sysinfo`: this process's RSS and CPU, and host memory.
//!
//! Always available, so on CPU machines (no NVML) this is the memory figure consoles show.
use dflash_shared::metrics::{HostSample, TimestampMs};
use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

#[derive(Debug)]
pub struct HostSampler {
    system: System,
    pid: Pid,
}

impl HostSampler {
    pub fn new() -> Self {
        let mut sampler = HostSampler {
            system: System::new(),
            pid: Pid::from_u32(std::process::id()),
        };
        // CPU usage is a difference between two refreshes; prime the first one.
        sampler.refresh();
        sampler
    }

    fn refresh(&mut self) {
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[self.pid]),
            false,
            ProcessRefreshKind::nothing().with_memory().with_cpu(),
        );
    }

    /// One reading. `process_cpu_pct` is relative to one core (400 = four cores busy) and
    /// covers the time since the previous call.
    pub fn sample(&mut self, ts_ms: TimestampMs) -> HostSample {
        self.refresh();
        let (rss, cpu) = self
            .system
            .process(self.pid)
            .map(|p| (p.memory(), p.cpu_usage()))
            .unwrap_or((0, 0.0));
        HostSample {
            ts_ms,
            process_rss_bytes: rss,
            host_memory_used_bytes: self.system.used_memory(),
            host_memory_total_bytes: self.system.total_memory(),
            process_cpu_pct: cpu,
        }
    }
}

/// Total memory of this host, bytes (what a CPU run's tensors share).
pub fn host_memory_total_bytes() -> u64 {
    let mut system = System::new();
    system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
    system.total_memory()
}

impl Default for HostSampler {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_grows_when_this_process_touches_memory() {
        let mut s = HostSampler::new();
        let before = s.sample(0);
        assert!(before.process_rss_bytes > 0);
        assert!(before.host_memory_total_bytes >= before.host_memory_used_bytes);
        assert!(before.host_memory_used_bytes > 0);
        // Touch 256 MiB so the pages are resident, then read again.
        let big = vec![1u8; 256 << 20];
        let after = s.sample(1);
        assert!(
            after.process_rss_bytes >= before.process_rss_bytes + (200 << 20),
            "rss {} -> {}",
            before.process_rss_bytes,
            after.process_rss_bytes
        );
        assert_eq!(big.iter().map(|&b| b as u64).sum::<u64>(), 256 << 20);
    }
}
