//! Daemon overhead: the embedded default's real training step, with the daemon's control plane
//! around it (run handle, journal, recorder, control socket) and N clients attached over the
//! socket streaming metrics, events and logs, with or without the telemetry sampler thread.
//! Every step's metrics are published to the bus, as the daemon's run loop does.
//!
//! The clients live in another process (`dflash-bench --child clients`), as consoles do, so
//! their CPU time shows up only as the contention it causes, not in this process's counters.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use dflash_shared::protocol::{Request, Topic, PROTOCOL_VERSION};
use serde::{Deserialize, Serialize};
use tch::Device;

use super::error::BenchError;
use super::process::engine_command;
use super::stats::median;
use super::timing::thread_cpu_ms;
use dflash_engine::embedded::{tiny_drafter_config, tiny_samples, tiny_target, tiny_train_config};
use dflash_engine::train::Trainer;
use dflashd::control::server::{ControlServer, ServerConfig};
use dflashd::run::bus::FrameBus;
use dflashd::run::handle::{RunHandle, RunHandleParts};
use dflashd::run::journal::Journal;
use dflashd::run::pending::ActionPolicy;
use dflashd::run::recorder::Recorder;
use dflashd::runtime::sampler::{SamplerConfig, TelemetrySampler};
use dflashd::telemetry::caches::{default_cache_specs, CacheEnv, CacheMonitor};
use dflashd::telemetry::GpuSampler;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OverheadRun {
    pub clients: usize,
    pub sampler: bool,
    /// Subscribers attached to the bus when the timed steps began.
    pub subscribed: usize,
    pub step_ms: Vec<f64>,
    pub median_step_ms: Option<f64>,
    /// Time the training thread spent publishing each step's metrics, µs.
    pub publish_us: Vec<f64>,
    pub median_publish_us: Option<f64>,
    /// CPU time of the training thread per step (training + publishing), ms: what the daemon
    /// costs the step itself, without the contention for cores that the wall time also shows.
    pub thread_cpu_ms: Vec<f64>,
    pub median_thread_cpu_ms: Option<f64>,
    pub threads: i64,
    pub error: Option<String>,
}

fn bench_error(detail: impl Into<String>) -> BenchError {
    BenchError::Process {
        program: "daemon overhead".into(),
        detail: detail.into(),
    }
}

fn start_server(handle: &RunHandle, socket: &Path) -> Result<thread::JoinHandle<()>, BenchError> {
    let cfg = ServerConfig::new(socket);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = handle.clone();
    let server = thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return drop(ready_tx.send(Err(e.to_string()))),
        };
        rt.block_on(async move {
            match ControlServer::bind(cfg, h) {
                Ok(server) => {
                    let _ = ready_tx.send(Ok(()));
                    server.run().await;
                }
                Err(e) => drop(ready_tx.send(Err(e.to_string()))),
            }
        });
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| bench_error("the control server did not start"))?
        .map_err(bench_error)?;
    Ok(server)
}

fn spawn_clients(socket: &Path, clients: usize) -> Result<Child, BenchError> {
    let mut cmd = engine_command()?;
    cmd.args([
        "--child",
        "clients",
        "--clients",
        &clients.to_string(),
        "--socket",
    ])
    .arg(socket);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| bench_error(format!("cannot start the clients process: {e}")))
}

/// The daemon side: trains `warmup + steps` steps of the embedded default with `clients`
/// attached. `run_dir` is a scratch directory (journal, recorder, socket).
pub fn run_overhead(
    run_dir: &Path,
    clients: usize,
    sampler: bool,
    warmup: usize,
    steps: usize,
) -> Result<OverheadRun, BenchError> {
    std::fs::create_dir_all(run_dir).map_err(BenchError::io(run_dir))?;
    let target = tiny_target(None, Device::Cpu)?;
    let train = tiny_train_config();
    let (samples, _) = tiny_samples(target.config().vocab_size(), train.training.max_length)?;
    let drafter = tiny_drafter_config(target.config());
    let mut trainer = Trainer::new(target, drafter, samples, train, Device::Cpu)?;

    let (journal, _) = Journal::open(run_dir).map_err(|e| bench_error(e.to_string()))?;
    let handle = RunHandle::new(RunHandleParts {
        policy: ActionPolicy::new("bench"),
        run_dir: run_dir.to_path_buf(),
        journal,
        bus: FrameBus::default(),
        recorder: Recorder::open(run_dir).ok(),
        config_path: None,
    });
    let socket = run_dir.join("dflashd.sock");
    let server = start_server(&handle, &socket)?;
    let sampler_thread = if sampler {
        let specs = default_cache_specs(&CacheEnv::from_environment(), run_dir);
        let cfg = SamplerConfig {
            interval: Duration::from_millis(1000),
            cache_interval: Duration::from_secs(30),
            run_dir: run_dir.to_path_buf(),
        };
        Some(
            TelemetrySampler::new(
                handle.clone(),
                GpuSampler::new(),
                CacheMonitor::new(specs, &[], 0),
                cfg,
            )
            .spawn()
            .map_err(|e| bench_error(e.to_string()))?,
        )
    } else {
        None
    };
    let mut client_process = if clients > 0 {
        Some(spawn_clients(&socket, clients)?)
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.bus().subscriber_count() < clients && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let mut run = OverheadRun {
        clients,
        sampler,
        subscribed: handle.bus().subscriber_count(),
        threads: tch::get_num_threads() as i64,
        ..OverheadRun::default()
    };
    let result = (|| -> Result<(), BenchError> {
        if run.subscribed < clients {
            return Err(bench_error(format!(
                "only {} of {clients} clients subscribed within 60 s",
                run.subscribed
            )));
        }
        for i in 0..warmup + steps {
            let (start, cpu) = (Instant::now(), thread_cpu_ms());
            let metrics = trainer.train_step()?;
            let published = Instant::now();
            handle.publish_metrics(metrics);
            if i >= warmup {
                run.publish_us.push(published.elapsed().as_secs_f64() * 1e6);
                run.step_ms.push(start.elapsed().as_secs_f64() * 1e3);
                run.thread_cpu_ms.push(thread_cpu_ms() - cpu);
            }
        }
        Ok(())
    })();
    handle.request_shutdown("benchmark over");
    let _ = server.join();
    if let Some(t) = sampler_thread {
        let _ = t.join();
    }
    if let Some(mut child) = client_process.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    run.median_step_ms = median(&run.step_ms);
    run.median_publish_us = median(&run.publish_us);
    run.median_thread_cpu_ms = median(&run.thread_cpu_ms);
    run.error = result.err().map(|e| e.to_string());
    Ok(run)
}

fn client_loop(socket: PathBuf, id: usize) -> std::io::Result<u64> {
    let stream = UnixStream::connect(&socket)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    for request in [
        Request::Hello {
            version: PROTOCOL_VERSION,
            client: format!("bench-{id}"),
            access: Default::default(),
        },
        Request::Subscribe {
            topics: vec![Topic::Metrics, Topic::Events, Topic::Logs],
        },
    ] {
        let mut bytes = serde_json::to_vec(&request).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        writer.write_all(&bytes)?;
        line.clear();
        reader.read_line(&mut line)?;
    }
    let mut frames = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(frames);
        }
        frames += 1;
    }
}

/// The clients side: `clients` connections that say hello, subscribe to every topic and read
/// frames until the daemon closes them.
pub fn run_clients(socket: &Path, clients: usize) -> Result<(), BenchError> {
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let socket = socket.to_path_buf();
            thread::spawn(move || client_loop(socket, i))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
