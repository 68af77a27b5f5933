//! The telemetry loop: samples GPUs, the host and the hidden-state queue every interval and
//! the caches every cache interval, updates the [`RunHandle`], streams GPU frames to metrics subscribers and
//! journals cache changes. Runs on its own std thread, so a slow NVML call or a large cache
//! walk never delays a training step or a control reply.
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dflash_shared::events::Severity;

use crate::run::handle::RunHandle;
use crate::telemetry::caches::{save_inventory, CacheMonitor};
use crate::telemetry::env_watch::{EnvChange, EnvWatch};
use crate::telemetry::{GpuSampler, HostSampler};
use dflash_shared::clock::now_ms;
use dflash_shared::events::EventKind;

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    pub interval: Duration,
    /// Cache walks touch many files; they run less often.
    pub cache_interval: Duration,
    /// Where the cache inventory is saved for the next daemon.
    pub run_dir: PathBuf,
}

#[derive(Debug)]
pub struct TelemetrySampler {
    gpu: GpuSampler,
    host: HostSampler,
    caches: CacheMonitor,
    handle: RunHandle,
    cfg: SamplerConfig,
    last_cache_scan: Option<Instant>,
    last_status_frame: Option<Instant>,
    /// The live environment watch, checked on the cache scan's cadence.
    env: Option<EnvWatch>,
}

/// Besides every change of state or alerts, the recording gets a status frame this often, so a
/// replay's baseline and figures never lag the run by more.
const STATUS_FRAME_EVERY: Duration = Duration::from_secs(30);

impl TelemetrySampler {
    pub fn new(
        handle: RunHandle,
        gpu: GpuSampler,
        caches: CacheMonitor,
        cfg: SamplerConfig,
    ) -> Self {
        // Guard rails take the fingerprint before the sampler starts; without one (tests that
        // build no guard rails) the watch has no start to compare with.
        let fingerprint = handle.fingerprint().unwrap_or_default();
        let libtorch = dflash_engine::device::loaded_libtorch_dir();
        let env = EnvWatch::from_fingerprint(&fingerprint, libtorch.as_deref());
        TelemetrySampler {
            env,
            gpu,
            host: HostSampler::new(),
            caches,
            handle,
            cfg,
            last_cache_scan: None,
            last_status_frame: None,
        }
    }

    /// One round of sampling.
    pub fn tick(&mut self) {
        let now = now_ms();
        self.handle.publish_gpus(self.gpu.sample(now));
        self.handle.set_host(self.host.sample(now));
        // Steps publish the queue too, but a stalled side means no step completes.
        self.handle.publish_queue_reading();
        let due = self
            .last_cache_scan
            .is_none_or(|t| t.elapsed() >= self.cfg.cache_interval);
        if due {
            self.watch_environment();
            self.scan_caches(now);
            self.last_cache_scan = Some(Instant::now());
        }
        if self
            .last_status_frame
            .is_none_or(|t| t.elapsed() >= STATUS_FRAME_EVERY)
        {
            self.handle.record_status_frame();
            self.last_status_frame = Some(Instant::now());
        }
    }

    /// Journals each change to the training environment as it happens (an install while the
    /// daemon runs), and hands the standing differences to the health feed's alert.
    fn watch_environment(&mut self) {
        let Some(env) = self.env.as_mut() else { return };
        let (changes, standing) = env.check();
        for c in &changes {
            let absent = || "(absent)".to_string();
            self.handle.record_event_logged(
                Severity::Warn,
                EventKind::EnvironmentDrift {
                    field: c.field.clone(),
                    before: c.before.clone().unwrap_or_else(absent),
                    after: c.after.clone().unwrap_or_else(absent),
                },
            );
        }
        if !changes.is_empty() {
            let standing: Vec<String> = standing.iter().map(EnvChange::sentence).collect();
            self.handle
                .set_live_environment(standing, env.packages_now());
        }
    }

    fn scan_caches(&mut self, now: i64) {
        let scan = self.caches.scan_all(now);
        for change in &scan.changes {
            let severity = match change.kind {
                dflash_shared::health::CacheChangeKind::Deleted
                | dflash_shared::health::CacheChangeKind::WentCold => Severity::Warn,
                _ => Severity::Info,
            };
            self.handle
                .record_event_logged(severity, change.to_event_kind());
        }
        for t in &scan.transitions {
            self.handle
                .record_event_logged(t.severity(), t.to_event_kind());
        }
        if let Err(e) = save_inventory(&self.cfg.run_dir, &scan.states) {
            tracing::warn!(error = %e, "could not save the cache inventory; a deletion while the daemon is down will go unnoticed");
        }
        self.handle.set_caches(scan.states);
    }

    /// Runs `tick` every interval on a named thread until shutdown is requested.
    pub fn spawn(mut self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("dflash-telemetry".into())
            .spawn(move || {
                while !self.handle.is_shutdown_requested() {
                    let started = Instant::now();
                    self.tick();
                    // Sleep in short slices so shutdown is not delayed by a whole interval.
                    while started.elapsed() < self.cfg.interval
                        && !self.handle.is_shutdown_requested()
                    {
                        std::thread::sleep(Duration::from_millis(50).min(self.cfg.interval));
                    }
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dflash_engine::train::topology::pipeline::{HiddenItem, ItemQueue};
    use dflash_engine::train::topology::queue::{ByteSized, QueueConfig};
    use dflash_engine::train::topology::QueueMonitor;
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::run::bus::FrameBus;
    use crate::run::handle::RunHandleParts;
    use crate::run::journal::Journal;
    use crate::run::pending::ActionPolicy;

    fn item(seq: u64) -> HiddenItem {
        HiddenItem::features_only(seq, Tensor::zeros([4], (Kind::Float, Device::Cpu)))
    }

    #[test]
    fn the_telemetry_timer_publishes_a_stalled_queue_while_no_step_completes() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let handle = RunHandle::new(RunHandleParts {
            policy: ActionPolicy::new("r"),
            run_dir: dir.path().to_path_buf(),
            journal,
            bus: FrameBus::new(16),
            recorder: None,
            config_path: None,
        });
        let mut sampler = TelemetrySampler::new(
            handle.clone(),
            GpuSampler::new(),
            CacheMonitor::new(vec![], &[], 0),
            SamplerConfig {
                interval: Duration::from_millis(10),
                cache_interval: Duration::from_secs(3600),
                run_dir: dir.path().to_path_buf(),
            },
        );
        sampler.tick();
        assert_eq!(handle.status_snapshot().queue.capacity, 0, "no queue yet");

        // A producer stalls on a full queue nobody consumes: no step can complete.
        let q = Arc::new(
            ItemQueue::new(QueueConfig {
                capacity: 2,
                high_watermark: 2,
                low_watermark: 1,
                byte_cap: 1 << 20,
            })
            .unwrap(),
        );
        handle.set_queue_monitor(Some(QueueMonitor::new(vec![Arc::clone(&q)])));
        q.push(item(0)).unwrap();
        q.push(item(1)).unwrap();
        let producer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || q.push(item(2)).is_err())
        };
        std::thread::sleep(Duration::from_millis(60));
        sampler.tick();
        let first = handle.status_snapshot().queue;
        assert_eq!((first.depth, first.capacity), (2, 2), "{first:?}");
        let one = ByteSized::byte_size(&item(9));
        assert!(one > 0);
        assert_eq!(first.bytes_resident, 2 * one, "{first:?}");
        assert!(first.producer_blocked_ms >= 40.0, "{first:?}");
        std::thread::sleep(Duration::from_millis(60));
        sampler.tick();
        let second = handle.status_snapshot().queue;
        assert!(
            second.producer_blocked_ms >= first.producer_blocked_ms + 40.0,
            "the blocked time keeps growing between readings: {first:?} then {second:?}"
        );
        q.shutdown();
        assert!(
            producer.join().unwrap(),
            "the blocked push returns at shutdown"
        );
    }
}
