use super::*;
use crate::events::{worker_failed_sentence, Severity};

fn record(tokens_per_s: f64, basis: Option<ThroughputBasis>) -> HealthyRecord {
    let mut fingerprint = Fingerprint {
        libtorch_version: Some("2.11.0".into()),
        code_git_commit: Some("aaaaaaaaaaaaaaaaaaaa".into()),
        ..Default::default()
    };
    fingerprint
        .python_packages
        .insert("torch".into(), "2.11.0+cu130".into());
    HealthyRecord {
        format: FORMAT,
        recorded_ms: 1_000,
        healthy_since_ms: 500,
        run_name: "qwen".into(),
        run_dir: "/runs/a".into(),
        recipe: "r1".into(),
        step: 40,
        throughput: HealthyThroughput {
            tokens_per_s,
            draft_positions_per_s: 2.0 * tokens_per_s,
            samples: 30,
            basis,
        },
        memory: Vec::new(),
        queue: None,
        step_times: StepTimes::default(),
        fingerprint,
        caches: vec![CacheState {
            name: "torchinductor".into(),
            path: "/tmp/ti".into(),
            present: true,
            size_bytes: 2_100_000_000,
            entries: 418,
            last_change_ms: None,
            warm: true,
        }],
        config_digest: None,
        data_digest: None,
        mean_row_tokens: Some(2068.0),
        commit: None,
        topology: "inline on cpu".into(),
        device_models: Vec::new(),
    }
}

#[test]
fn the_record_round_trips_and_another_format_is_ignored() {
    let r = record(21_500.0, None);
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(HealthyRecord::parse(&text), Some(r.clone()));
    let mut other = serde_json::to_value(&r).unwrap();
    other["format"] = serde_json::json!(FORMAT + 1);
    assert_eq!(HealthyRecord::parse(&other.to_string()), None);
    assert_eq!(
        HealthyRecord::parse("{\"format\": 1"),
        None,
        "a partial write"
    );
}

#[test]
fn the_same_length_mix_is_judged_against_the_figure_as_recorded() {
    let basis = ThroughputBasis {
        mean_row_tokens: 2068.0,
        model_flops_per_token: 1.0e9,
    };
    let r = record(21_500.0, Some(basis.clone()));
    let e =
        expected_throughput(&r, RecordScope::ThisRun, Some(&basis), "2026-12-03 21:03").unwrap();
    assert_eq!(e.tokens_per_s, 21_500.0);
    assert_eq!(e.adjustment, None);
    assert_eq!(
        e.source,
        "this run ran at 21.5K tok/s here on 2026-12-03 21:03"
    );
    let e = expected_throughput(&r, RecordScope::Recipe, None, "2026-12-03 21:03").unwrap();
    assert_eq!(
        e.source,
        "this recipe ran at 21.5K tok/s here on 2026-12-03 21:03 (run qwen, /runs/a)"
    );
}

#[test]
fn longer_rows_lower_the_expected_rate_by_the_cost_of_a_token_and_say_so() {
    let then = ThroughputBasis {
        mean_row_tokens: 2068.0,
        model_flops_per_token: 1.00e9,
    };
    let now = ThroughputBasis {
        mean_row_tokens: 2202.0,
        model_flops_per_token: 1.05e9,
    };
    let r = record(21_500.0, Some(then));
    let e = expected_throughput(&r, RecordScope::Recipe, Some(&now), "d").unwrap();
    assert!(
        (e.tokens_per_s - 21_500.0 / 1.05).abs() < 1e-6,
        "{}",
        e.tokens_per_s
    );
    assert_eq!(
        e.adjustment.as_deref(),
        Some(
            "adjusted for longer rows (mean 2068 → 2202 tokens, 1.05× the model FLOPs per \
             token): expects 20.5K tok/s"
        )
    );
    // Within 1 %: no adjustment, the figure as recorded.
    let close = ThroughputBasis {
        mean_row_tokens: 2070.0,
        model_flops_per_token: 1.005e9,
    };
    let e = expected_throughput(&r, RecordScope::Recipe, Some(&close), "d").unwrap();
    assert_eq!((e.tokens_per_s, e.adjustment), (21_500.0, None));
    assert!(expected_throughput(&record(0.0, None), RecordScope::ThisRun, None, "d").is_none());
}

#[test]
fn the_window_takes_medians_and_queue_shares_of_its_samples() {
    let mut w = HealthyWindow::default();
    assert!(w.figures(None).is_none());
    for (i, tps) in [100.0, 300.0, 200.0].into_iter().enumerate() {
        let mut m = step_at(1_000 * i as i64, tps);
        m.times.total_ms = tps;
        w.observe_step(&m);
    }
    w.observe_step(&step_at(5_000, 0.0)); // a stall is not a sample
    let q = |ts: i64, depth: usize, blocked: f64| QueueStats {
        ts_ms: ts,
        depth,
        capacity: 8,
        producer_blocked_ms: blocked,
        ..Default::default()
    };
    w.observe_queue(&q(0, 2, 0.0));
    w.observe_queue(&q(10_000, 4, 2_500.0));
    let f = w.figures(None).unwrap();
    assert_eq!(f.throughput.tokens_per_s, 200.0);
    assert_eq!(f.throughput.samples, 3);
    assert_eq!(f.step_times.total_ms, 200.0);
    let queue = f.queue.unwrap();
    assert_eq!((queue.capacity, queue.median_depth), (8, 3.0));
    assert!((queue.producer_blocked_frac - 0.25).abs() < 1e-9);
    assert_eq!(w.since_ms(), Some(0));
    w.reset();
    assert_eq!(w.step_samples(), 0);
}

fn step_at(ts_ms: i64, tokens_per_s: f64) -> StepMetrics {
    StepMetrics {
        ts_ms,
        step: 1,
        epoch: 1,
        loss: 1.0,
        accuracy: 0.5,
        tau: None,
        tau_tree: None,
        lr: 1e-4,
        grad_norm: 1.0,
        tokens_per_s,
        draft_positions_per_s: tokens_per_s,
        mfu: None,
        workers: Vec::new(),
        times: StepTimes::default(),
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

fn event(ts_ms: i64, kind: EventKind) -> Event {
    Event {
        seq: 0,
        ts_ms,
        severity: Severity::Info,
        kind,
    }
}

#[test]
fn differences_name_the_environment_the_caches_and_what_happened_since() {
    let r = record(21_500.0, None);
    let mut now = r.fingerprint.clone();
    now.python_packages
        .insert("torch".into(), "2.9.1+cu128".into());
    now.code_git_commit = Some("bbbbbbbbbbbbbbbbbbbb".into());
    let caches_now = vec![CacheState {
        present: false,
        size_bytes: 0,
        entries: 0,
        warm: false,
        ..r.caches[0].clone()
    }];
    let events = vec![
        // Before the record: not "since".
        event(
            900,
            EventKind::RunStarted {
                run_name: "qwen".into(),
                resumed_from_step: None,
            },
        ),
        event(
            2_000,
            EventKind::WorkerFailed {
                device: "cuda:6".into(),
                error: "compile failed".into(),
                role: None,
                rank: None,
            },
        ),
        event(
            3_000,
            EventKind::RunStarted {
                run_name: "qwen".into(),
                resumed_from_step: Some(40),
            },
        ),
    ];
    let d = differences_since(&r, &now, &caches_now, &events);
    assert_eq!(
        d,
        [
            "code commit aaaaaaaaaaaa → bbbbbbbbbbbb".to_string(),
            "torch 2.11.0+cu130 → 2.9.1+cu128".into(),
            "TorchInductor compile cache warm then (2.1 GB, 418 entries), missing now: deleted \
             outside dflash; no confirmation on record"
                .into(),
            "1 daemon start since the record".into(),
            worker_failed_sentence("cuda:6", None, None, "compile failed"),
        ]
    );
    // A confirmed delete is named as such.
    let mut confirmed = events.clone();
    confirmed.push(event(
        2_500,
        EventKind::CacheChanged {
            name: "torchinductor".into(),
            path: "/tmp/ti".into(),
            change: "deleted by operator (2.1 GB, 418 entries)".into(),
        },
    ));
    let d = differences_since(&r, &now, &caches_now, &confirmed);
    assert!(
        d[2].ends_with("missing now: deleted by a confirmed dflash action"),
        "{d:?}"
    );
    // Nothing differs: nothing is said.
    assert!(differences_since(&r, &r.fingerprint, &r.caches, &[]).is_empty());
}
