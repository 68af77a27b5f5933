//! One value of every message, for the round-trip tests.
use super::*;
use crate::actions::{Action, PendingAction};
use crate::config::{DrafterHead, Objective};
use crate::events::{Event, EventKind, Severity};
use crate::metrics::{
    AllocatorStats, CacheState, DeviceRole, GpuSample, GpuTelemetry, HostSample, QueueStats,
    StepMetrics, StepTimes, WorkerThroughput,
};
use crate::status::{
    Alert, CheckpointInfo, DominoAcceptance, RunInfo, RunObjective, RunState, StatusSnapshot,
    Throughput as RunThroughput,
};

pub(super) fn step_metrics() -> StepMetrics {
    StepMetrics {
        ts_ms: 1_767_000_000_000,
        step: 1234,
        epoch: 2,
        loss: 3.52,
        accuracy: 0.21,
        tau: Some(3.1),
        tau_tree: None,
        lr: 6e-4,
        grad_norm: 0.87,
        tokens_per_s: 21_500.0,
        draft_positions_per_s: 0.0,
        mfu: None,
        workers: vec![WorkerThroughput {
            device: "cuda:5".into(),
            role: DeviceRole::Drafter,
            tokens_per_s: 7_166.7,
            mfu: None,
        }],
        times: StepTimes {
            total_ms: 812.5,
            drafter_forward_backward_ms: 600.0,
            ..Default::default()
        },
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

pub(super) fn gpu_sample() -> GpuSample {
    GpuSample {
        ts_ms: 1_767_000_000_000,
        index: 0,
        name: "NVIDIA H200".into(),
        uuid: None,
        role: DeviceRole::Target,
        memory_used_bytes: Some(96_000_000_000),
        memory_total_bytes: Some(150_754_820_096),
        utilization_pct: Some(97),
        power_w: Some(612.5),
        temperature_c: Some(61),
        allocator: Some(AllocatorStats {
            allocated_bytes: 80_000_000_000,
            reserved_bytes: 90_000_000_000,
            peak_allocated_bytes: 85_000_000_000,
            alloc_retries: 0,
            ooms: 0,
        }),
    }
}

pub(super) fn event(kind: EventKind) -> Event {
    Event {
        seq: 7,
        ts_ms: 1_767_000_000_000,
        severity: Severity::Warn,
        kind,
    }
}

pub(super) fn pending() -> PendingAction {
    PendingAction {
        id: "act-3f2a".into(),
        action: Action::DeleteCache {
            name: "torchinductor".into(),
        },
        requested_by_uid: 1000,
        created_ms: 1_767_000_000_000,
        expires_ms: 1_767_000_300_000,
        consequences: vec!["last checkpoint 14 min ago".into(), "2.1 GB cache".into()],
    }
}

pub(super) fn queue_stats() -> QueueStats {
    QueueStats {
        ts_ms: 1_767_000_000_000,
        depth: 12,
        capacity: 64,
        high_watermark: 48,
        low_watermark: 8,
        bytes_resident: 3 << 30,
        byte_cap: 32 << 30,
        producer_rate: 5.5,
        consumer_rate: 5.4,
        producer_blocked_ms: 100.0,
        consumer_starved_ms: 20.0,
    }
}

pub(super) fn status() -> StatusSnapshot {
    StatusSnapshot {
        run: RunInfo {
            name: "qwen36-27b".into(),
            state: RunState::Training,
            step: 1234,
            total_steps: 20_000,
            epoch: 2,
            epochs: 6,
            started_ms: 1_766_990_000_000,
            eta_ms: Some(1_767_100_000_000),
            run_dir: "/srv/runs/qwen36-27b".into(),
            config_path: Some("configs/qwen3.6-27b-8gpu.toml".into()),
            objective: Some(RunObjective::new(Objective::Dpace, 0.5)),
            drafter_head: Some(DrafterHead::Domino),
        },
        throughput: RunThroughput {
            tokens_per_s: 12_800.0,
            draft_positions_per_s: 102_400.0,
            mfu: Some(0.25),
            baseline_tokens_per_s: Some(21_500.0),
            stable_since_ms: Some(1_766_999_000_000),
            baseline_source: None,
            record_clock: None,
        },
        gpus: GpuTelemetry::Available {
            gpus: vec![gpu_sample()],
        },
        host: Some(HostSample {
            ts_ms: 1_767_000_000_000,
            process_rss_bytes: 1 << 34,
            host_memory_used_bytes: 1 << 36,
            host_memory_total_bytes: 1 << 40,
            process_cpu_pct: 312.5,
        }),
        queue: queue_stats(),
        caches: vec![CacheState {
            name: "triton".into(),
            path: "/home/op/.triton/cache".into(),
            present: true,
            size_bytes: 2_100_000_000,
            entries: 418,
            last_change_ms: None,
            warm: true,
        }],
        alerts: vec![Alert {
            detector: "throughput".into(),
            level: Severity::Crit,
            since_ms: 1_767_000_000_000,
            message: "4.3K tok/s".into(),
            preceded_by: vec!["torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52".into()],
            since_healthy: Vec::new(),
        }],
        pending_actions: vec![pending()],
        checkpoints: vec![CheckpointInfo {
            step: 1000,
            path: "/srv/runs/qwen36-27b/checkpoints/step-1000".into(),
            written_ms: 1_766_999_500_000,
            bytes: 20_800_000_000,
        }],
        best_checkpoint: Some(crate::best_checkpoint::BestCheckpoint {
            step: 1000,
            tau_tree: 4.45,
            budget: 32,
            path: "/srv/runs/qwen36-27b/checkpoints/step-1000".into(),
        }),
        no_best_checkpoint: None,
        last_loss: Some(3.5),
        last_tau: None,
        last_tau_tree: None,
        last_online: None,
        last_domino: Some(DominoAcceptance {
            step: 1234,
            ts_ms: 1_767_000_000_000,
            accept_len: 2.87,
            base_accept_len: 2.31,
        }),
        last_dspark: None,
        last_dflash2: None,
        detectors: Some(crate::config::DetectorsSection::default()),
        healthy_record: None,
        job: None,
    }
}

pub(super) fn all_requests() -> Vec<Request> {
    vec![
        hello("dflash-tui 0.1.0"),
        Request::Subscribe {
            topics: vec![Topic::Metrics, Topic::Events, Topic::Logs],
        },
        Request::Status,
        Request::Config,
        Request::Fingerprint,
        Request::Caches,
        Request::Checkpoints,
        Request::Events {
            after_seq: Some(41),
            last: None,
        },
        Request::Events {
            after_seq: None,
            last: None,
        },
        Request::Events {
            after_seq: None,
            last: Some(20),
        },
        Request::RequestAction {
            action: Action::StopRun,
        },
        Request::RequestAction {
            action: Action::Kill,
        },
        Request::RequestAction {
            action: Action::PowerOff,
        },
        Request::RequestAction {
            action: Action::DeleteCache {
                name: "triton".into(),
            },
        },
        Request::RequestAction {
            action: Action::UnlockKey {
                key: "training.epochs".into(),
            },
        },
        Request::RequestAction {
            action: Action::ForgetHealthyRecord,
        },
        Request::Confirm {
            action_id: "act-1".into(),
            run_name: "qwen36-27b".into(),
            via: "tui".into(),
        },
        Request::Cancel {
            action_id: "act-1".into(),
        },
    ]
}

pub(super) fn all_responses() -> Vec<Response> {
    let kinds = vec![
        EventKind::RunStarted {
            run_name: "r".into(),
            resumed_from_step: Some(10),
        },
        EventKind::WarmupDone {
            device: "cuda:0".into(),
            role: DeviceRole::Target,
            duration_ms: 5_300.5,
        },
        EventKind::AttentionKernel {
            device: "cuda:0".into(),
            role: DeviceRole::Drafter,
            call_site: "drafter block-sparse (bias)".into(),
            backend: "memory-efficient".into(),
        },
        EventKind::Fingerprint {
            summary: "torch 2.11.0".into(),
        },
        EventKind::EnvironmentDrift {
            field: "python.torch".into(),
            before: "2.11.0+cu128".into(),
            after: "2.9.1+cu130".into(),
        },
        EventKind::CacheChanged {
            name: "torchinductor".into(),
            path: "/tmp/x".into(),
            change: "deleted".into(),
        },
        EventKind::CheckpointWritten {
            step: 5,
            path: "/r/c".into(),
            bytes: 9,
        },
        EventKind::RegressionStarted {
            detector: "throughput".into(),
            level: Severity::Crit,
            message: "m".into(),
        },
        EventKind::RegressionEnded {
            detector: "throughput".into(),
            message: "m".into(),
        },
        EventKind::OperatorRequest {
            uid: 1000,
            request: "stop".into(),
            action_id: None,
        },
        EventKind::OperatorConfirmed {
            uid: 1000,
            action_id: "a".into(),
            via: "run name matched on full connection 3 from pid 4242".into(),
            client_says: Some("tui".into()),
        },
        EventKind::ActionExecuted {
            action_id: "a".into(),
            outcome: "done".into(),
        },
        EventKind::WorkerFailed {
            device: "cuda:3".into(),
            error: "CUDA out of memory".into(),
            role: Some(crate::metrics::DeviceRole::Drafter),
            rank: Some(0),
        },
        EventKind::RunPaused {
            reason: "worker failed".into(),
        },
        EventKind::RunStopped {
            reason: "operator".into(),
            checkpoint: Some("/r/c".into()),
        },
        EventKind::CheckpointFallback {
            from_step: 6,
            to_step: 2,
        },
        EventKind::BadDataLine {
            file: "train.jsonl".into(),
            line: 12,
            reason: "not JSON".into(),
        },
        EventKind::Note {
            message: "multi\nline \"quoted\" ✓".into(),
        },
    ];
    let mut out = vec![
        Welcome {
            version: PROTOCOL_VERSION,
            run_name: "r".into(),
            daemon_pid: 4242,
        }
        .into(),
        Response::Ok,
        Response::Status(Box::new(status())),
        Response::Json {
            value: serde_json::json!({"training": {"epochs": 6}}),
        },
        Response::Events {
            events: kinds.iter().cloned().map(event).collect(),
        },
        Response::Pending { action: pending() },
        Response::Executed {
            action_id: "act-1".into(),
            outcome: "checkpoint step-1234 written".into(),
        },
        ErrorReply::new(ErrorCode::WrongRunName, "typed 'x', the run is 'r'").into(),
        Response::Metrics(Box::new(step_metrics())),
        Response::Gpus {
            telemetry: GpuTelemetry::Available {
                gpus: vec![gpu_sample()],
            },
        },
        Response::Gpus {
            telemetry: GpuTelemetry::Unavailable {
                reason: "NVML unavailable: libnvidia-ml.so.1 not found".into(),
            },
        },
        Response::Queue(queue_stats()),
        Response::Log {
            level: "INFO".into(),
            line: "step 5\tdone".into(),
        },
        Response::Dropped {
            reason: "client too slow".into(),
        },
    ];
    out.extend(
        kinds
            .into_iter()
            .map(|k| Response::Event(Box::new(event(k)))),
    );
    out
}
