use std::collections::{BTreeMap, BTreeSet};

use dflash_shared::events::Severity;
use dflash_shared::metrics::{
    AllocatorStats, CacheState, DeviceRole, GpuSample, HostSample, QueueStats, StepTimes,
    WorkerThroughput,
};
use dflash_shared::status::{Alert, CheckpointInfo, RunInfo, Throughput};

use super::*;

fn cpu_status() -> StatusSnapshot {
    StatusSnapshot {
        run: RunInfo {
            name: "tiny-cpu".into(),
            state: RunState::Training,
            step: 42,
            total_steps: 600,
            epoch: 2,
            epochs: 6,
            started_ms: 1_767_000_000_000,
            eta_ms: None,
            run_dir: "/runs/tiny".into(),
            config_path: None,
            objective: None,
            drafter_head: None,
        },
        throughput: Throughput {
            tokens_per_s: 900.0,
            draft_positions_per_s: 7_200.0,
            mfu: Some(0.25),
            baseline_tokens_per_s: None,
            stable_since_ms: None,
            baseline_source: None,
            record_clock: None,
        },
        gpus: GpuTelemetry::Unavailable {
            reason: "NVML unavailable: libnvidia-ml.so.1 not found".into(),
        },
        host: None,
        queue: QueueStats::default(),
        caches: Vec::new(),
        alerts: Vec::new(),
        pending_actions: Vec::new(),
        checkpoints: Vec::new(),
        best_checkpoint: None,
        no_best_checkpoint: None,
        last_loss: Some(3.25),
        last_tau: None,
        last_tau_tree: None,
        last_online: None,
        last_domino: None,
        last_dspark: None,
        last_dflash2: None,
        detectors: None,
        healthy_record: None,
        job: None,
    }
}

fn step(step: u64) -> StepMetrics {
    StepMetrics {
        ts_ms: 1_767_000_100_000,
        step,
        epoch: 2,
        loss: 3.25,
        accuracy: 0.375,
        tau: None,
        tau_tree: None,
        lr: 0.0006,
        grad_norm: 1.5,
        tokens_per_s: 900.0,
        draft_positions_per_s: 7_200.0,
        mfu: Some(0.25),
        workers: vec![WorkerThroughput {
            device: "cpu".into(),
            role: DeviceRole::Both,
            tokens_per_s: 900.0,
            mfu: Some(0.25),
        }],
        times: StepTimes {
            data_wait_ms: 1.0,
            target_forward_ms: 20.0,
            queue_wait_ms: 0.0,
            drafter_forward_backward_ms: 150.0,
            all_reduce_ms: 0.0,
            optimizer_ms: 4.0,
            total_ms: 175.0,
        },
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

/// Two GPUs of an 8-GPU topology, a queue, two alerts of one detector, caches, checkpoints.
fn gpu_status() -> StatusSnapshot {
    let mut s = cpu_status();
    s.run.name = "qwen36-27b".into();
    s.run.eta_ms = Some(1_767_086_400_000);
    s.throughput.baseline_tokens_per_s = Some(12_800.0);
    let gpu = |index: u32, role, used, retries| GpuSample {
        ts_ms: 1_767_000_100_000,
        index,
        name: "NVIDIA H200".into(),
        uuid: Some(format!("GPU-5e8f7a1c-0000-0000-0000-00000000000{index}")),
        role,
        memory_used_bytes: Some(used),
        memory_total_bytes: Some(150_754_820_096),
        utilization_pct: Some(97),
        power_w: Some(650.5),
        temperature_c: Some(61),
        allocator: Some(AllocatorStats {
            allocated_bytes: used - 4_000_000_000,
            reserved_bytes: used - 1_000_000_000,
            peak_allocated_bytes: used - 2_000_000_000,
            alloc_retries: retries,
            ooms: 0,
        }),
    };
    s.gpus = GpuTelemetry::Available {
        gpus: vec![
            gpu(0, DeviceRole::Target, 96_000_000_000, 0),
            gpu(7, DeviceRole::Drafter, 120_000_000_000, 3),
        ],
    };
    s.host = Some(HostSample {
        ts_ms: 1_767_000_100_000,
        process_rss_bytes: 8_000_000_000,
        host_memory_used_bytes: 200_000_000_000,
        host_memory_total_bytes: 2_000_000_000_000,
        process_cpu_pct: 350.0,
    });
    s.queue = QueueStats {
        ts_ms: 1_767_000_100_000,
        depth: 9,
        capacity: 16,
        high_watermark: 12,
        low_watermark: 4,
        bytes_resident: 3_000_000_000,
        byte_cap: 17_179_869_184,
        producer_rate: 5.5,
        consumer_rate: 5.25,
        producer_blocked_ms: 12_500.0,
        consumer_starved_ms: 250.0,
    };
    let alert = |detector: &str, level| Alert {
        detector: detector.into(),
        level,
        since_ms: 1_767_000_050_000,
        message: "m".into(),
        preceded_by: Vec::new(),
        since_healthy: Vec::new(),
    };
    s.alerts = vec![
        alert("memory", Severity::Warn),
        alert("memory", Severity::Warn),
        alert("throughput", Severity::Crit),
    ];
    s.caches = vec![CacheState {
        name: "triton".into(),
        path: "/home/op/.triton/cache".into(),
        present: true,
        size_bytes: 2_100_000_000,
        entries: 812,
        last_change_ms: None,
        warm: true,
    }];
    s.checkpoints = vec![
        CheckpointInfo {
            step: 2000,
            path: "/runs/q/checkpoints/step-2000".into(),
            written_ms: 1_767_000_000_000,
            bytes: 5_000_000_000,
        },
        CheckpointInfo {
            step: 3000,
            path: "/runs/q/checkpoints/step-3000".into(),
            written_ms: 1_767_000_040_000,
            bytes: 5_000_000_001,
        },
    ];
    s.last_tau = Some(4.625);
    s.last_tau_tree = Some(dflash_shared::metrics::TreeOracleTau {
        serve_budget: 16,
        by_budget: BTreeMap::from([(16, 5.125), (64, 5.5)]),
    });
    s.last_online = Some(dflash_shared::status::OnlineEvalStatus {
        step: 3000,
        ts_ms: 1_767_000_050_000,
        acceptance: dflash_shared::metrics::OnlineAcceptance {
            tau_chain: 3.0,
            tau_ddtree: BTreeMap::from([(16, 4.25), (64, 4.75)]),
            serve_tree_budget: Some(16),
            // The offline τ of the step-3000 evaluation (4.625 is a later one's).
            offline_tau: Some(4.0),
            base: None,
            prompts: 16,
            seconds: 42.5,
        },
    });
    s
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        captured_ms: 0,
        hostname: Some("node-7".into()),
        dflashd_version: Some("0.1.0".into()),
        code_git_commit: Some("1ad01c3".into()),
        config_git_commit: None,
        config_hash: Some("cafe".into()),
        data_hash: Some("beef".into()),
        libtorch_version: Some("2.11.0".into()),
        tch_version: Some("0.24.0".into()),
        cuda_runtime: Some("13.0".into()),
        cuda_driver: Some("580.65".into()),
        gpu_models: vec!["NVIDIA H200".into(), "NVIDIA H200".into()],
        cuda_alloc_conf: Some("expandable_segments:True".into()),
        python_executable: None,
        python_packages: BTreeMap::from([("torch".to_string(), "2.11.0".to_string())]),
    }
}

fn render_at(
    status: &StatusSnapshot,
    last: Option<&StepMetrics>,
    fp: Option<&Fingerprint>,
) -> String {
    render(&Scrape {
        status,
        last,
        environment: fp,
        now_ms: 1_767_000_100_000,
    })
}

fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

fn missing<'a>(text: &str, expected: &[&'a str]) -> Vec<&'a str> {
    let have: BTreeSet<&str> = samples(text).into_iter().collect();
    expected
        .iter()
        .copied()
        .filter(|l| !have.contains(l))
        .collect()
}

#[test]
fn a_cpu_run_serves_its_training_figures_and_no_gpu_or_queue_series() {
    let status = cpu_status();
    let m = step(42);
    let text = render_at(&status, Some(&m), None);
    let expected = [
        r#"dflash_train_step{run="tiny-cpu"} 42.0"#,
        r#"dflash_train_total_steps{run="tiny-cpu"} 600.0"#,
        r#"dflash_train_epoch{run="tiny-cpu"} 2.0"#,
        r#"dflash_train_epochs{run="tiny-cpu"} 6.0"#,
        r#"dflash_train_loss{run="tiny-cpu"} 3.25"#,
        r#"dflash_train_accuracy_ratio{run="tiny-cpu"} 0.375"#,
        r#"dflash_train_learning_rate{run="tiny-cpu"} 0.0006"#,
        r#"dflash_train_grad_norm{run="tiny-cpu"} 1.5"#,
        r#"dflash_train_tokens_per_second{run="tiny-cpu"} 900.0"#,
        r#"dflash_train_worker_tokens_per_second{run="tiny-cpu",device="cpu",role="both"} 900.0"#,
        r#"dflash_train_draft_positions_per_second{run="tiny-cpu"} 7200.0"#,
        r#"dflash_train_mfu_ratio{run="tiny-cpu"} 0.25"#,
        r#"dflash_train_worker_mfu_ratio{run="tiny-cpu",device="cpu",role="both"} 0.25"#,
        r#"dflash_train_step_phase_seconds{run="tiny-cpu",phase="drafter_forward_backward"} 0.15"#,
        r#"dflash_train_step_duration_seconds{run="tiny-cpu"} 0.175"#,
        r#"dflash_run_state{run="tiny-cpu",state="training"} 1.0"#,
        r#"dflash_run_state{run="tiny-cpu",state="paused"} 0.0"#,
        r#"dflash_run_start_time_seconds{run="tiny-cpu"} 1767000000.0"#,
        r#"dflash_pending_actions{run="tiny-cpu"} 0.0"#,
    ];
    assert_eq!(missing(&text, &expected), Vec::<&str>::new(), "{text}");
    // No NVML, no queue (one device for both roles), no evaluation, no checkpoint yet:
    // nothing is made up for them, not even a description.
    for absent in [
        "dflash_gpu_",
        "dflash_queue_",
        "dflash_eval_",
        "dflash_checkpoint_",
        "dflash_alerts_",
        "dflash_run_eta_",
        "dflash_train_baseline_",
        "dflash_host_",
    ] {
        assert!(
            !text.lines().any(|l| l.contains(absent)),
            "{absent}: {text}"
        );
    }
    assert!(
        samples(&text).contains(&r#"dflash_environment_info{run="tiny-cpu"} 1"#),
        "{text}"
    );
}

#[test]
fn before_the_first_step_no_step_figure_is_claimed() {
    let text = render_at(&cpu_status(), None, None);
    for absent in [
        "dflash_train_loss",
        "dflash_train_tokens_per_second",
        "dflash_train_grad_norm",
        "dflash_train_step_phase_seconds",
    ] {
        assert!(
            !samples(&text).iter().any(|l| l.starts_with(absent)),
            "{absent}: {text}"
        );
    }
    assert!(samples(&text).contains(&r#"dflash_train_step{run="tiny-cpu"} 42.0"#));
}

#[test]
fn gpus_queue_alerts_caches_checkpoints_and_the_environment_are_series() {
    let status = gpu_status();
    let m = step(3001);
    let fp = fingerprint();
    let text = render_at(&status, Some(&m), Some(&fp));
    let target = r#"gpu="0",UUID="GPU-5e8f7a1c-0000-0000-0000-000000000000",role="target""#;
    let drafter = r#"gpu="7",UUID="GPU-5e8f7a1c-0000-0000-0000-000000000007",role="drafter""#;
    let run = r#"run="qwen36-27b""#;
    let expected: Vec<String> = [
        format!("dflash_gpu_memory_used_bytes{{{run},{target}}} 96000000000.0"),
        format!("dflash_gpu_memory_used_bytes{{{run},{drafter}}} 120000000000.0"),
        format!("dflash_gpu_memory_total_bytes{{{run},{drafter}}} 150754820096.0"),
        format!("dflash_gpu_allocator_reserved_bytes{{{run},{drafter}}} 119000000000.0"),
        format!("dflash_gpu_allocator_allocated_bytes{{{run},{drafter}}} 116000000000.0"),
        format!("dflash_gpu_allocator_retries_total{{{run},{drafter}}} 3.0"),
        format!("dflash_gpu_allocator_retries_total{{{run},{target}}} 0.0"),
        format!("dflash_gpu_allocator_ooms_total{{{run},{drafter}}} 0.0"),
        format!("dflash_gpu_utilization_ratio{{{run},{drafter}}} 0.97"),
        format!("dflash_gpu_power_watts{{{run},{drafter}}} 650.5"),
        format!("dflash_gpu_temperature_celsius{{{run},{drafter}}} 61.0"),
        format!("dflash_gpu_info{{{run},{drafter},model=\"NVIDIA H200\"}} 1.0"),
        format!("dflash_queue_depth{{{run}}} 9.0"),
        format!("dflash_queue_capacity{{{run}}} 16.0"),
        format!("dflash_queue_resident_bytes{{{run}}} 3000000000.0"),
        format!("dflash_queue_capacity_bytes{{{run}}} 17179869184.0"),
        format!("dflash_queue_producer_items_per_second{{{run}}} 5.5"),
        format!("dflash_queue_consumer_items_per_second{{{run}}} 5.25"),
        format!("dflash_queue_producer_blocked_seconds_total{{{run}}} 12.5"),
        format!("dflash_queue_consumer_starved_seconds_total{{{run}}} 0.25"),
        format!("dflash_alerts_active{{{run},detector=\"memory\",severity=\"warn\"}} 2.0"),
        format!("dflash_alerts_active{{{run},detector=\"throughput\",severity=\"crit\"}} 1.0"),
        format!("dflash_cache_warm{{{run},cache=\"triton\"}} 1.0"),
        format!("dflash_cache_present{{{run},cache=\"triton\"}} 1.0"),
        format!("dflash_cache_size_bytes{{{run},cache=\"triton\"}} 2100000000.0"),
        format!("dflash_cache_entries{{{run},cache=\"triton\"}} 812.0"),
        // The newest checkpoint, 60 s before the scrape.
        format!("dflash_checkpoint_last_step{{{run}}} 3000.0"),
        format!("dflash_checkpoint_age_seconds{{{run}}} 60.0"),
        format!("dflash_checkpoint_last_success_timestamp_seconds{{{run}}} 1767000040.0"),
        format!("dflash_checkpoint_last_size_bytes{{{run}}} 5000000001.0"),
        format!("dflash_eval_acceptance_length{{{run},mode=\"offline\"}} 4.625"),
        format!("dflash_eval_acceptance_length{{{run},mode=\"online\",method=\"chain\"}} 3.0"),
        format!(
            "dflash_eval_acceptance_length{{{run},mode=\"online\",method=\"ddtree_16\"}} 4.25"
        ),
        format!(
            "dflash_eval_acceptance_length{{{run},mode=\"online\",method=\"ddtree_64\"}} 4.75"
        ),
        format!(
            "dflash_eval_acceptance_length{{{run},mode=\"offline_tree_oracle\",method=\"ddtree_16\"}} 5.125"
        ),
        format!(
            "dflash_eval_acceptance_length{{{run},mode=\"offline_tree_oracle\",method=\"ddtree_64\"}} 5.5"
        ),
        format!(
            "dflash_eval_serve_tree_acceptance_length{{{run},mode=\"offline_tree_oracle\",budget=\"16\"}} 5.125"
        ),
        format!(
            "dflash_eval_serve_tree_acceptance_length{{{run},mode=\"online\",budget=\"16\"}} 4.25"
        ),
        format!("dflash_eval_online_step{{{run}}} 3000.0"),
        format!("dflash_eval_online_prompts{{{run}}} 16.0"),
        format!("dflash_eval_online_duration_seconds{{{run}}} 42.5"),
        format!("dflash_eval_serve_gap_ratio{{{run}}} 0.25"),
        format!("dflash_train_baseline_tokens_per_second{{{run}}} 12800.0"),
        format!("dflash_run_eta_timestamp_seconds{{{run}}} 1767086400.0"),
        format!("dflash_host_process_resident_memory_bytes{{{run}}} 8000000000.0"),
        format!(
            "dflash_environment_info{{{run},hostname=\"node-7\",dflashd_version=\"0.1.0\",\
             code_git_commit=\"1ad01c3\",libtorch_version=\"2.11.0\",tch_version=\"0.24.0\",\
             cuda_runtime=\"13.0\",cuda_driver=\"580.65\",gpu_models=\"NVIDIA H200,NVIDIA H200\",\
             cuda_alloc_conf=\"expandable_segments:True\",python_torch=\"2.11.0\",config_hash=\"cafe\",data_hash=\"beef\"}} 1"
        ),
    ]
    .into();
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(missing(&text, &expected), Vec::<&str>::new(), "{text}");
}

#[test]
fn a_label_value_with_quotes_or_a_newline_is_escaped() {
    let mut status = cpu_status();
    status.caches = vec![CacheState {
        name: "odd \"name\"\nhere\\".into(),
        path: String::new(),
        present: false,
        size_bytes: 0,
        entries: 0,
        last_change_ms: None,
        warm: false,
    }];
    let text = render_at(&status, None, None);
    assert!(
        samples(&text)
            .contains(&r#"dflash_cache_warm{run="tiny-cpu",cache="odd \"name\"\nhere\\"} 0.0"#),
        "{text}"
    );
}

/// The names of the samples `render` writes (counters with `_total`, the info metric with
/// `_info`) when every figure is known: read off the `# TYPE` lines of the full fixture.
fn sample_names() -> BTreeSet<String> {
    let (status, m, fp) = (gpu_status(), step(3001), fingerprint());
    let text = render_at(&status, Some(&m), Some(&fp));
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// Every `dflash_…` name in the dashboard's queries.
fn dashboard_metric_names(dashboard: &serde_json::Value) -> BTreeSet<String> {
    fn exprs<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(s)) => out.push(s),
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| exprs(i, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    exprs(dashboard, &mut found);
    found
        .iter()
        .flat_map(|e| {
            e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("dflash_"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

const DASHBOARD: &str = include_str!("../../../assets/grafana/dflash.json");

#[test]
fn every_metric_the_dashboard_queries_is_one_the_exporter_serves() {
    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("assets/grafana/dflash.json is JSON");
    let used = dashboard_metric_names(&dashboard);
    let served = sample_names();
    let unknown: Vec<&String> = used.difference(&served).collect();
    assert!(
        unknown.is_empty(),
        "assets/grafana/dflash.json queries metrics /metrics does not serve: {unknown:?}\n\
         served: {served:?}"
    );
    // The dashboard shows what an operator looks at first.
    for needed in [
        "dflash_train_tokens_per_second",
        "dflash_train_loss",
        "dflash_eval_acceptance_length",
        "dflash_eval_serve_tree_acceptance_length",
        "dflash_gpu_memory_used_bytes",
        "dflash_queue_depth",
        "dflash_checkpoint_age_seconds",
        "dflash_alerts_active",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard has no panel on {needed}"
        );
    }
}

#[test]
fn the_dashboard_check_catches_a_name_the_exporter_does_not_serve() {
    let dashboard = serde_json::json!({
        "panels": [{"targets": [{"expr": "rate(dflash_train_tokens_total[5m]) / dflash_train_step"}]}]
    });
    let used = dashboard_metric_names(&dashboard);
    assert_eq!(
        used,
        BTreeSet::from([
            "dflash_train_tokens_total".to_string(),
            "dflash_train_step".to_string()
        ])
    );
    assert!(!sample_names().contains("dflash_train_tokens_total"));
}

#[test]
fn a_node_of_a_job_labels_every_series_with_its_node_and_serves_the_jobs_figures() {
    use dflash_shared::job::{JobView, NodeFigures};
    use dflash_shared::status::JobStatus;
    let node = |n: u32, tokens_per_s: f64, busy_ms: f64| NodeFigures {
        node: n,
        tokens_per_s,
        draft_positions_per_s: tokens_per_s * 8.0,
        busy_ms,
        step_ms: 1500.0,
        queue_wait_share: None,
    };
    let mut status = cpu_status();
    status.job = Some(JobStatus {
        node: 1,
        nnodes: 2,
        view: None,
    });
    // Before the first step: the node label and the node count, no figure.
    let text = render_at(&status, None, None);
    assert!(
        samples(&text).contains(&r#"dflash_job_nodes{run="tiny-cpu",node="1"} 2.0"#),
        "{text}"
    );
    assert!(!text.contains("dflash_job_tokens_per_second{"), "{text}");
    let view = JobView::from_nodes(
        1,
        vec![node(0, 900.0, 1000.0), node(1, 600.0, 1500.0)],
        dflash_shared::job::STRAGGLER_BEHIND_FRAC,
    );
    status.job.as_mut().unwrap().view = Some(view);
    let text = render_at(&status, Some(&step(42)), None);
    let expected = [
        r#"dflash_train_step{run="tiny-cpu",node="1"} 42.0"#,
        r#"dflash_train_tokens_per_second{run="tiny-cpu",node="1"} 900.0"#,
        r#"dflash_job_tokens_per_second{run="tiny-cpu",node="1"} 1500.0"#,
        r#"dflash_job_draft_positions_per_second{run="tiny-cpu",node="1"} 12000.0"#,
        r#"dflash_job_node_tokens_per_second{run="tiny-cpu",node="1",job_node="0"} 900.0"#,
        r#"dflash_job_node_busy_seconds{run="tiny-cpu",node="1",job_node="1"} 1.5"#,
        r#"dflash_job_straggler{run="tiny-cpu",node="1",job_node="0"} 0.0"#,
        r#"dflash_job_straggler{run="tiny-cpu",node="1",job_node="1"} 1.0"#,
    ];
    assert_eq!(missing(&text, &expected), Vec::<&str>::new(), "{text}");
    // A single node's series carry no node label and no job family.
    let single = render_at(&cpu_status(), Some(&step(42)), None);
    assert!(
        !single.contains("node=") && !single.contains("dflash_job_"),
        "{single}"
    );
}
