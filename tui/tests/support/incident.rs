//! Test helper: generates `tests/fixtures/incident.jsonl`, a recording of the incident the daemon
//! issue describes, as `dflashd` would have recorded it (one `RecordedFrame` per line).
//!
//! The run's telemetry is simulated from a seeded generator; everything the daemon derives from
//! it (throughput regression, memory flatness, queue diagnosis, cache changes, the active alerts
//! and their explanations in its status snapshots) comes from the shared `HealthMonitor` the
//! daemon runs, fed the simulated samples. Timeline (UTC, 2026-03-14):
//!
//! - 20:30–21:01 stable at 21.5K tok/s (±1.2%), GPU memory flat;
//! - 20:52 a package install replaces torch 2.11.0+cu128 by 2.9.1+cu130 (EnvironmentDrift);
//! - 21:00 the TorchInductor compile cache is deleted (cache missing, CacheChanged);
//! - from 21:01:40 throughput collapses to 4.3K tok/s, drafter GPU memory turns volatile and the
//!   queue fills (drafter-bound); the cache reappears cold at 21:06;
//! - recording ends 21:15 with a checkpoint.
//!
//! `cargo test -p dflash-tui --test replay_incident` fails when the committed file differs from
//! what this generator produces; regenerate with `DFLASH_REGENERATE_FIXTURES=1`.
use chrono::{FixedOffset, TimeZone, Utc};
use dflash_shared::config::{DetectorsSection, DrafterHead, Objective};
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::health::{self, HealthMonitor, Transition};
use dflash_shared::metrics::{
    AllocatorStats, CacheState, DeviceRole, GpuSample, GpuTelemetry, HostSample, QueueStats,
    StepMetrics, StepTimes, TimestampMs,
};
use dflash_shared::protocol::Response;
use dflash_shared::recording::RecordedFrame;
use dflash_shared::status::{
    CheckpointInfo, RunInfo, RunObjective, RunState, StatusSnapshot, Throughput,
};
use dflash_tui::app::{App, AppEvent, Source};
use dflash_tui::client::supervisor::LinkEvent;
use dflash_tui::client::Welcome;
use dflash_tui::fmt::DisplayClock;

pub const SEED: u64 = 0x2026_0314_2103;
pub const RUN_NAME: &str = "qwen36-27b-dflash";
pub const RUN_DIR: &str = "/srv/dflash/runs/qwen36-27b-dflash";
pub const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/incident.jsonl");

pub fn at(h: u32, m: u32, s: u32) -> TimestampMs {
    Utc.with_ymd_and_hms(2026, 3, 14, h, m, s)
        .single()
        .expect("valid time")
        .timestamp_millis()
}

pub fn start_ms() -> TimestampMs {
    at(20, 30, 0)
}
pub fn end_ms() -> TimestampMs {
    at(21, 15, 0)
}
pub fn torch_swap_ms() -> TimestampMs {
    at(20, 52, 0)
}
pub fn cache_deleted_ms() -> TimestampMs {
    at(21, 0, 0)
}
fn collapse_ms() -> TimestampMs {
    at(21, 1, 40)
}
fn cache_reappears_ms() -> TimestampMs {
    at(21, 6, 0)
}

const HEALTHY_TOK_S: f64 = 21_500.0;
const COLLAPSED_TOK_S: f64 = 4_300.0;
const TOKENS_PER_STEP: f64 = 65_536.0;
const STEPS_PER_EPOCH: u64 = 12_000;
const EPOCHS: u32 = 6;
const H200_TOTAL: u64 = 150_754_820_096;
const GB: f64 = 1e9;
const ITEM_BYTES: u64 = 420_000_000;
const TARGETS: u32 = 5;

/// splitmix64: tiny, seeded, identical on every platform.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal, mean 0, standard deviation 1 (Irwin–Hall of 12).
    fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.unit()).sum::<f64>() - 6.0
    }
}

/// Rounds to 3 decimals so the file stays short and diffs stay readable.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

struct Sim {
    rng: Rng,
    frames: Vec<RecordedFrame>,
    events: Vec<Event>,
    next_seq: u64,
    step_f: f64,
    /// The run's `[detectors]` thresholds, which its status snapshots carry.
    detectors: DetectorsSection,
    /// The daemon's detectors, fed what the daemon would feed them.
    health: HealthMonitor,
    checkpoints: Vec<CheckpointInfo>,
    last_metrics: Option<StepMetrics>,
    last_gpus: Vec<GpuSample>,
    queue: QueueStats,
    retries: [u64; 8],
    last_tau: Option<f64>,
}

impl Sim {
    fn frame(&mut self, ts_ms: TimestampMs, frame: Response) {
        self.frames.push(RecordedFrame { ts_ms, frame });
    }

    fn event(&mut self, ts_ms: TimestampMs, severity: Severity, kind: EventKind) {
        let event = Event {
            seq: self.next_seq,
            ts_ms,
            severity,
            kind,
        };
        self.next_seq += 1;
        self.events.push(event.clone());
        self.frame(ts_ms, Response::Event(Box::new(event)));
    }

    /// A detector transition becomes a journal event, as the daemon journals it.
    fn transition(&mut self, t: Transition) {
        self.event(t.at_ms, t.severity(), t.to_event_kind());
    }

    fn tokens_per_s(&mut self, ts: TimestampMs) -> f64 {
        let healthy = HEALTHY_TOK_S * (1.0 + 0.012 * self.rng.normal());
        let collapsed = COLLAPSED_TOK_S * (1.0 + 0.08 * self.rng.normal());
        let fall = ((ts - collapse_ms()) as f64 / 30_000.0).clamp(0.0, 1.0);
        r3(healthy * (1.0 - fall) + collapsed * fall)
    }

    fn metrics(&mut self, ts: TimestampMs) {
        let tokens_per_s = self.tokens_per_s(ts);
        self.step_f += tokens_per_s * 15.0 / TOKENS_PER_STEP;
        let step = self.step_f as u64;
        let progress = (step - 31_000) as f64;
        let tau =
            (ts % 300_000 == 0).then(|| r3(3.91 + progress * 1e-5 + 0.02 * self.rng.normal()));
        if tau.is_some() {
            self.last_tau = tau;
        }
        let step_ms = TOKENS_PER_STEP / tokens_per_s * 1000.0;
        let drafter_share = if ts >= collapse_ms() { 0.9 } else { 0.55 };
        let metrics = StepMetrics {
            ts_ms: ts,
            step,
            epoch: (step / STEPS_PER_EPOCH) as u32 + 1,
            loss: r3(1.92 - progress * 2e-5 + 0.01 * self.rng.normal()),
            accuracy: r3(0.41 + progress * 4e-6 + 0.004 * self.rng.normal()),
            tau,
            tau_tree: None,
            lr: 1.6e-4,
            grad_norm: r3(0.9 + 0.05 * self.rng.normal()),
            tokens_per_s,
            draft_positions_per_s: 0.0,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes {
                data_wait_ms: r3(step_ms * 0.01),
                target_forward_ms: r3(step_ms * 0.3),
                queue_wait_ms: r3(step_ms * 0.02),
                drafter_forward_backward_ms: r3(step_ms * drafter_share),
                all_reduce_ms: r3(step_ms * 0.05),
                optimizer_ms: r3(step_ms * 0.02),
                total_ms: r3(step_ms),
            },
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        };
        self.frame(ts, Response::Metrics(Box::new(metrics.clone())));
        self.last_metrics = Some(metrics);
        for t in self
            .health
            .observe_step(&self.last_metrics.clone().expect("just set"))
        {
            self.transition(t);
        }
    }

    fn gpus(&mut self, ts: TimestampMs) {
        let broken = ts >= collapse_ms();
        let mut samples = Vec::new();
        for index in 0..8u32 {
            let target = index < TARGETS;
            let flat = if target { 112.4 * GB } else { 68.2 * GB };
            let used = if target || !broken {
                flat + 4e6 * self.rng.normal()
            } else {
                (58.0 + 22.0 * self.rng.unit()) * GB
            };
            if broken && !target {
                self.retries[index as usize] += 1 + (self.rng.unit() * 3.0) as u64;
            }
            let reserved = used - 0.9 * GB;
            let allocated = reserved * (0.82 + 0.06 * self.rng.unit());
            let busy = if target {
                if broken {
                    22.0
                } else {
                    96.0
                }
            } else if broken {
                35.0 + 55.0 * self.rng.unit()
            } else {
                98.0
            };
            let util = (busy + 2.0 * self.rng.normal()).clamp(0.0, 100.0);
            samples.push(GpuSample {
                ts_ms: ts,
                index,
                name: "NVIDIA H200".into(),
                uuid: None,
                role: if target {
                    DeviceRole::Target
                } else {
                    DeviceRole::Drafter
                },
                memory_used_bytes: Some(used as u64),
                memory_total_bytes: Some(H200_TOTAL),
                utilization_pct: Some(util.round() as u32),
                power_w: Some((120.0 + 5.4 * util).round()),
                temperature_c: Some((38.0 + 0.33 * util).round() as u32),
                allocator: Some(AllocatorStats {
                    allocated_bytes: allocated as u64,
                    reserved_bytes: reserved as u64,
                    peak_allocated_bytes: (flat * 0.95) as u64,
                    alloc_retries: self.retries[index as usize],
                    ooms: 0,
                }),
            });
        }
        let telemetry = GpuTelemetry::Available {
            gpus: samples.clone(),
        };
        self.frame(
            ts,
            Response::Gpus {
                telemetry: telemetry.clone(),
            },
        );
        for t in self.health.observe_gpus(&telemetry) {
            self.transition(t);
        }
        self.last_gpus = samples;
    }

    fn queue(&mut self, ts: TimestampMs) {
        let broken = ts >= collapse_ms();
        let dt = (ts - self.queue.ts_ms).max(0) as f64;
        let depth = if broken {
            64
        } else {
            (28.0 + 4.0 * self.rng.normal()).round().clamp(9.0, 47.0) as usize
        };
        let rate = self
            .last_metrics
            .as_ref()
            .map_or(0.33, |m| m.tokens_per_s / TOKENS_PER_STEP);
        let (blocked, starved) = if broken { (0.9, 0.0) } else { (0.02, 0.03) };
        self.queue = QueueStats {
            ts_ms: ts,
            depth,
            capacity: 64,
            high_watermark: 48,
            low_watermark: 8,
            bytes_resident: depth as u64 * ITEM_BYTES,
            byte_cap: 64 * ITEM_BYTES,
            producer_rate: r3(rate),
            consumer_rate: r3(rate),
            producer_blocked_ms: r3(self.queue.producer_blocked_ms + blocked * dt * TARGETS as f64),
            consumer_starved_ms: r3(self.queue.consumer_starved_ms + starved * dt * 3.0),
        };
        self.frame(ts, Response::Queue(self.queue.clone()));
        for t in self.health.observe_queue(&self.queue.clone()) {
            self.transition(t);
        }
    }

    fn cache_states(&self, ts: TimestampMs) -> Vec<CacheState> {
        let deleted = ts >= cache_deleted_ms();
        let back = ts >= cache_reappears_ms();
        let growth = ((ts - cache_reappears_ms()).max(0) / 60_000) as u64;
        let inductor = match (deleted, back) {
            (false, _) => (true, 2_100_000_000, 418, true, at(19, 40, 0)),
            (true, false) => (false, 0, 0, false, cache_deleted_ms()),
            (true, true) => (true, 40_000_000 * (growth + 1), 9 * (growth + 1), false, ts),
        };
        vec![
            CacheState {
                name: "torchinductor".into(),
                path: "/srv/dflash/cache/torchinductor".into(),
                present: inductor.0,
                size_bytes: inductor.1,
                entries: inductor.2,
                last_change_ms: Some(inductor.4),
                warm: inductor.3,
            },
            CacheState {
                name: "triton".into(),
                path: "/srv/dflash/cache/triton".into(),
                present: true,
                size_bytes: 850_000_000,
                entries: 1_204,
                last_change_ms: Some(at(19, 41, 0)),
                warm: true,
            },
            CacheState {
                name: "cuda_compute_cache".into(),
                path: "/home/op/.nv/ComputeCache".into(),
                present: true,
                size_bytes: 310_000_000,
                entries: 96,
                last_change_ms: Some(at(19, 41, 30)),
                warm: true,
            },
            CacheState {
                name: "dflash_warmup".into(),
                path: format!("{RUN_DIR}/warmup.json"),
                present: true,
                size_bytes: 4_200,
                entries: 8,
                last_change_ms: Some(at(19, 42, 0)),
                warm: true,
            },
        ]
    }

    fn caches(&mut self, ts: TimestampMs) {
        let states = self.cache_states(ts);
        let (changes, transitions) = self.health.observe_caches(ts, &states);
        for change in changes {
            self.event(ts, Severity::Warn, change.to_event_kind());
        }
        for t in transitions {
            self.transition(t);
        }
    }

    fn checkpoint(&mut self, ts: TimestampMs) {
        let step = self.step_f as u64;
        let path = format!("{RUN_DIR}/checkpoints/step-{step:08}");
        let bytes = 5_800_000_000;
        self.checkpoints.push(CheckpointInfo {
            step,
            path: path.clone(),
            written_ms: ts,
            bytes,
        });
        if self.checkpoints.len() > 3 {
            self.checkpoints.remove(0);
        }
        self.event(
            ts,
            Severity::Info,
            EventKind::CheckpointWritten { step, path, bytes },
        );
    }

    fn status(&mut self, ts: TimestampMs) {
        let metrics = self.last_metrics.clone().expect("metrics come first");
        let detector = self.health.throughput();
        let utc = FixedOffset::east_opt(0).expect("utc");
        let steps_left = (EPOCHS as u64 * STEPS_PER_EPOCH).saturating_sub(metrics.step) as f64;
        let steps_per_ms = metrics.tokens_per_s / TOKENS_PER_STEP / 1000.0;
        let snapshot = StatusSnapshot {
            run: RunInfo {
                name: RUN_NAME.into(),
                state: RunState::Training,
                step: metrics.step,
                total_steps: EPOCHS as u64 * STEPS_PER_EPOCH,
                epoch: metrics.epoch,
                epochs: EPOCHS,
                started_ms: at(19, 38, 0) - 2 * 86_400_000,
                eta_ms: Some(ts + (steps_left / steps_per_ms) as i64),
                run_dir: RUN_DIR.into(),
                config_path: Some("/srv/dflash/configs/qwen3.6-27b-8gpu.toml".into()),
                objective: Some(RunObjective::new(Objective::Dflash, 0.5)),
                drafter_head: Some(DrafterHead::Dflash),
            },
            throughput: Throughput {
                draft_positions_per_s: 0.0,
                mfu: None,
                tokens_per_s: metrics.tokens_per_s,
                baseline_tokens_per_s: detector.baseline_tokens_per_s.map(r3),
                stable_since_ms: (detector.level == health::Level::Ok)
                    .then_some(detector.since_ms)
                    .flatten(),
                baseline_source: detector.baseline_source.clone(),
                record_clock: None,
            },
            gpus: GpuTelemetry::Available {
                gpus: self.last_gpus.clone(),
            },
            host: Some(HostSample {
                ts_ms: ts,
                process_rss_bytes: 38_400_000_000,
                host_memory_used_bytes: 611_000_000_000,
                host_memory_total_bytes: 2_015_000_000_000,
                process_cpu_pct: 310.0,
            }),
            queue: self.queue.clone(),
            caches: self.cache_states(ts),
            alerts: self.health.alerts(&self.events, utc),
            pending_actions: Vec::new(),
            checkpoints: self.checkpoints.clone(),
            best_checkpoint: None,
            no_best_checkpoint: None,
            last_loss: Some(metrics.loss),
            last_tau: self.last_tau,
            last_tau_tree: None,
            last_online: None,
            last_domino: None,
            last_dspark: None,
            last_dflash2: None,
            detectors: Some(self.detectors.clone()),
            healthy_record: None,
            job: None,
        };
        self.frame(ts, Response::Status(Box::new(snapshot)));
    }
}

/// The whole recording, deterministic for a given seed.
pub fn generate(seed: u64) -> Vec<RecordedFrame> {
    let detectors = DetectorsSection::default();
    let mut sim = Sim {
        rng: Rng(seed),
        frames: Vec::new(),
        events: Vec::new(),
        next_seq: 4_812,
        step_f: 31_000.0,
        health: HealthMonitor::new(&detectors, TARGETS as usize, 3),
        detectors,
        checkpoints: vec![
            CheckpointInfo {
                step: 30_112,
                path: format!("{RUN_DIR}/checkpoints/step-00030112"),
                written_ms: at(19, 45, 0),
                bytes: 5_800_000_000,
            },
            CheckpointInfo {
                step: 30_706,
                path: format!("{RUN_DIR}/checkpoints/step-00030706"),
                written_ms: at(20, 15, 0),
                bytes: 5_800_000_000,
            },
        ],
        last_metrics: None,
        last_gpus: Vec::new(),
        queue: QueueStats {
            ts_ms: start_ms() - 30_000,
            producer_blocked_ms: 2_950_000.0,
            consumer_starved_ms: 2_480_000.0,
            ..QueueStats::default()
        },
        retries: [0; 8],
        last_tau: Some(3.9),
    };
    let mut ts = start_ms();
    while ts <= end_ms() {
        let second = (ts - start_ms()) / 1000;
        if second % 15 == 0 {
            sim.metrics(ts);
        }
        if second % 30 == 0 {
            sim.gpus(ts);
            sim.queue(ts);
        }
        if ts == torch_swap_ms() {
            let kind = health::EnvironmentDrift {
                field: "python.torch".into(),
                before: Some("2.11.0+cu128".into()),
                after: Some("2.9.1+cu130".into()),
                blocks_resume: true,
            }
            .to_event_kind();
            sim.event(ts, Severity::Warn, kind);
        }
        if second % 60 == 0 {
            sim.caches(ts);
        }
        if ts == at(20, 45, 0) || ts == end_ms() {
            sim.checkpoint(ts);
        }
        if second % 120 == 0 || ts == end_ms() {
            sim.status(ts);
        }
        ts += 5_000;
    }
    sim.frames
}

/// The recording as JSONL, exactly as the fixture file holds it.
pub fn to_jsonl(frames: &[RecordedFrame]) -> String {
    let mut out = String::new();
    for frame in frames {
        out.push_str(&serde_json::to_string(frame).expect("frames serialize"));
        out.push('\n');
    }
    out
}

/// The socket path the console tests attach to (redacted nowhere: it is the XDG default's shape).
pub const SOCKET: &str = "/run/user/1000/dflash/dflashd.sock";

/// A console attached over the socket that has received `frames`.
pub fn live_from(frames: Vec<RecordedFrame>, read_only: bool) -> App {
    let mut app = App::new(
        Source::Live {
            socket: SOCKET.into(),
        },
        read_only,
        frames[0].ts_ms,
        DisplayClock::utc(),
    );
    app.handle(AppEvent::Link(LinkEvent::Connected(Welcome {
        version: 1,
        run_name: RUN_NAME.into(),
        daemon_pid: 4242,
    })));
    for frame in frames {
        app.handle(AppEvent::Tick(frame.ts_ms));
        app.handle(AppEvent::Link(LinkEvent::Frame(frame.frame)));
    }
    app
}
