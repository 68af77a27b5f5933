//! `/metrics` in-process: a real `MetricsServer` on loopback over a real `RunHandle`, fed
//! through the same calls the run loop and the telemetry sampler make.
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dflash_shared::metrics::{
    AllocatorStats, DeviceRole, GpuSample, GpuTelemetry, StepMetrics, StepTimes,
};
use dflashd::exporter::{ExporterError, MetricsServer};
use dflashd::run::bus::FrameBus;
use dflashd::run::handle::{RunHandle, RunHandleParts};
use dflashd::run::journal::Journal;
use dflashd::run::pending::ActionPolicy;

use crate::support::in_process::RUN_NAME;
use crate::support::prometheus::{self, get, http};

struct Served {
    handle: RunHandle,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
    dir: tempfile::TempDir,
}

impl Served {
    fn start() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let handle = RunHandle::new(RunHandleParts {
            policy: ActionPolicy::new(RUN_NAME),
            run_dir: dir.path().to_path_buf(),
            journal,
            bus: FrameBus::new(64),
            recorder: None,
            config_path: None,
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let h = handle.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), h).unwrap();
                tx.send(server.local_addr()).unwrap();
                server.run().await;
            });
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("bound");
        Served {
            handle,
            addr,
            thread: Some(thread),
            dir,
        }
    }

    fn scrape(&self) -> String {
        let reply = get(self.addr, "/metrics").unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            reply.content_type,
            "text/plain; version=0.0.4; charset=utf-8"
        );
        reply.body
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.handle.request_shutdown("test over");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn step(step: u64, tokens_per_s: f64) -> StepMetrics {
    StepMetrics {
        ts_ms: 0,
        step,
        epoch: 1,
        loss: 2.5,
        accuracy: 0.25,
        tau: (step == 20).then_some(3.5),
        tau_tree: None,
        lr: 0.0006,
        grad_norm: 0.75,
        tokens_per_s,
        draft_positions_per_s: 0.0,
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

/// What `GpuSampler::sample` returns on a machine with NVML, for one drafter GPU.
fn drafter_gpu() -> GpuTelemetry {
    GpuTelemetry::Available {
        gpus: vec![GpuSample {
            ts_ms: 0,
            index: 3,
            name: "NVIDIA H200".into(),
            uuid: Some("GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0".into()),
            role: DeviceRole::Drafter,
            memory_used_bytes: Some(120_000_000_000),
            memory_total_bytes: Some(150_754_820_096),
            utilization_pct: None,
            power_w: None,
            temperature_c: None,
            allocator: Some(AllocatorStats {
                allocated_bytes: 100_000_000_000,
                reserved_bytes: 110_000_000_000,
                peak_allocated_bytes: 105_000_000_000,
                alloc_retries: 7,
                ooms: 0,
            }),
        }],
    }
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn a_scrape_reads_what_the_run_handle_holds_now() {
    let s = Served::start();
    let before = s.scrape();
    assert!(
        !before.contains("dflash_train_tokens_per_second"),
        "no throughput before the first step:\n{before}"
    );
    assert!(!before.contains("dflash_gpu_"), "{before}");

    s.handle.publish_metrics(step(20, 1234.5));
    s.handle.publish_gpus(drafter_gpu());
    let text = s.scrape();
    let gpu = r#"gpu="3",UUID="GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",role="drafter""#;
    for line in [
        format!(r#"dflash_train_tokens_per_second{{run="{RUN_NAME}"}} 1234.5"#),
        format!(r#"dflash_train_step{{run="{RUN_NAME}"}} 20.0"#),
        format!(r#"dflash_train_grad_norm{{run="{RUN_NAME}"}} 0.75"#),
        format!(r#"dflash_eval_acceptance_length{{run="{RUN_NAME}",mode="offline"}} 3.5"#),
        format!(r#"dflash_gpu_memory_used_bytes{{run="{RUN_NAME}",{gpu}}} 120000000000.0"#),
        format!(r#"dflash_gpu_allocator_reserved_bytes{{run="{RUN_NAME}",{gpu}}} 110000000000.0"#),
        format!(r#"dflash_gpu_allocator_retries_total{{run="{RUN_NAME}",{gpu}}} 7.0"#),
    ] {
        assert!(has_line(&text, &line), "{line}\n{text}");
    }

    // The next step replaces the figures; τ stays the last evaluation's.
    s.handle.publish_metrics(step(21, 1300.0));
    let text = s.scrape();
    assert!(has_line(
        &text,
        &format!(r#"dflash_train_tokens_per_second{{run="{RUN_NAME}"}} 1300.0"#)
    ));
    assert!(has_line(
        &text,
        &format!(r#"dflash_eval_acceptance_length{{run="{RUN_NAME}",mode="offline"}} 3.5"#)
    ));

    if let Some(tools) = prometheus::tools() {
        prometheus::promtool_check(&tools.promtool, &text, s.dir.path())
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

#[test]
fn other_paths_and_methods_are_refused_saying_where_the_metrics_are() {
    let s = Served::start();
    let missing = get(s.addr, "/metric").unwrap();
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("/metrics"), "{}", missing.body);
    let post = http(s.addr, "POST", "/metrics").unwrap();
    assert_eq!(post.status, 405, "{}", post.body);
    let root = get(s.addr, "/").unwrap();
    assert_eq!(root.status, 200);
    assert!(root.body.contains("/metrics"), "{}", root.body);
}

#[test]
fn the_endpoint_closes_with_the_run() {
    let mut s = Served::start();
    assert_eq!(get(s.addr, "/metrics").unwrap().status, 200);
    s.handle.request_shutdown("test: the run ended");
    let thread = s.thread.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !thread.is_finished() {
        assert!(Instant::now() < deadline, "the metrics server did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    thread.join().unwrap();
    assert!(
        std::net::TcpStream::connect(s.addr).is_err(),
        "still listening on {} after the run ended",
        s.addr
    );
}

#[test]
fn an_address_in_use_is_refused_naming_the_key_the_flag_and_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    let handle = RunHandle::new(RunHandleParts {
        policy: ActionPolicy::new(RUN_NAME),
        run_dir: dir.path().to_path_buf(),
        journal,
        bus: FrameBus::new(4),
        recorder: None,
        config_path: None,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(async { MetricsServer::bind(addr, handle) })
        .unwrap_err();
    let ExporterError::Bind { addr: refused, .. } = &err;
    assert_eq!(*refused, addr);
    let text = err.to_string();
    for part in [
        &format!("cannot serve Prometheus metrics on {addr}"),
        "metrics.listen",
        "--metrics-listen",
        "port 0 takes any free port",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
}
