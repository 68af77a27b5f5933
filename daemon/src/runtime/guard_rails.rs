//! Assembles the daemon's guard rails around a run: run-dir lock, journal, environment
//! fingerprint and resume decision, control socket, telemetry sampler and systemd
//! readiness. The `start` command builds a [`GuardRails`], then hands its
//! [`RunHandle`] to the run loop (which attaches to the command channel) when
//! [`GuardRails::resume_allowed`] says so.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use dflash_shared::config::Config;
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::status::RunState;
use thiserror::Error;

use crate::control::server::{ControlServer, ServerConfig, ServerError};
use crate::exporter::{ExporterError, MetricsServer};
use crate::run::bus::FrameBus;
use crate::run::handle::{RunHandle, RunHandleParts};
use crate::run::journal::{Journal, JournalError};
use crate::run::pending::ActionPolicy;
use crate::run::recorder::Recorder;
use crate::runtime::notify;
use crate::runtime::run_dir_lock::{LockError, RunDirLock};
use crate::runtime::sampler::{SamplerConfig, TelemetrySampler};
use crate::telemetry::caches::{
    default_cache_specs, load_inventory, CacheEnv, CacheMonitor, CacheSpec,
};
use crate::telemetry::fingerprint::{self, FingerprintError, FingerprintInputs, ResumeDecision};
use crate::telemetry::GpuSampler;
use dflash_shared::clock::now_ms;

#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub run_name: String,
    pub run_dir: PathBuf,
    pub socket: PathBuf,
    /// The live-frame bus; created before logging so log lines reach `logs` subscribers.
    pub bus: FrameBus,
    pub poweroff_command: Option<Vec<String>>,
    pub pending_ttl_ms: i64,
    pub telemetry_interval: Duration,
    pub cache_interval: Duration,
    /// `None`: the default TorchInductor, Triton, CUDA and warmup-record caches.
    pub cache_specs: Option<Vec<CacheSpec>>,
    pub fingerprint: FingerprintInputs,
    /// The token an operator gave to accept an environment drift (`--accept-drift`).
    pub accepted_drift_token: Option<String>,
    /// The effective config, served by the `config` query.
    pub config: Arc<Config>,
    pub config_path: Option<String>,
}

/// Control-plane settings with defaults, kept apart from [`DaemonOptions`].
#[derive(Debug, Clone, Default)]
pub struct ControlTuning {
    /// Users besides the daemon's own that may use the socket (`control.allowed_uids`).
    pub extra_allowed_uids: Vec<u32>,
    /// Where to serve Prometheus `/metrics` (`metrics.listen`, `--metrics-listen`); `None`:
    /// nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Connections held at once (`control.max_connections`); `None`: the server's default.
    pub max_connections: Option<usize>,
}

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Exporter(#[from] ExporterError),
    #[error("starting the telemetry thread: {0}")]
    Thread(std::io::Error),
}

#[derive(Debug)]
pub struct GuardRails {
    pub handle: RunHandle,
    pub resume: ResumeDecision,
    pub socket: PathBuf,
    run_dir: PathBuf,
    /// What the previous start recorded, and whether this start replaced it.
    previous_fingerprint: Option<dflash_shared::health::Fingerprint>,
    saved_fingerprint: bool,
    server: tokio::task::JoinHandle<()>,
    /// The `/metrics` server, when one was asked for.
    exporter: Option<tokio::task::JoinHandle<()>>,
    /// Its scrape URL (`http://ADDR/metrics`, with the port actually bound).
    pub metrics_url: Option<String>,
    sampler: JoinHandle<()>,
    _lock: RunDirLock,
}

impl GuardRails {
    /// Starts everything but training. Must run inside a tokio runtime.
    pub async fn start(opts: DaemonOptions) -> Result<Self, StartError> {
        Self::start_with(opts, ControlTuning::default()).await
    }

    /// [`GuardRails::start`] with non-default control settings.
    pub async fn start_with(
        opts: DaemonOptions,
        tuning: ControlTuning,
    ) -> Result<Self, StartError> {
        let (lock, handle) = open_run(&opts)?;
        // Bound before anything of this start is recorded as the run's (the fingerprint): an
        // address in use refuses the start with nothing to undo.
        let metrics = match tuning.metrics_listen {
            Some(addr) => Some(bind_metrics(addr, &handle)?),
            None => None,
        };
        let gate = fingerprint_gate(&opts, &handle).await?;
        let server = tokio::spawn(bind_control(&opts, &tuning, &handle)?.run());
        let metrics_url = metrics.as_ref().map(MetricsServer::url);
        let exporter = metrics.map(|m| tokio::spawn(m.run()));
        let sampler = spawn_sampler(&opts, &handle, gate.gpus)?;

        let status = match &gate.resume {
            ResumeDecision::Blocked { .. } => {
                "waiting for an operator to accept an environment drift"
            }
            _ => "control socket up",
        };
        notify::ready(status);
        tracing::info!(socket = %opts.socket.display(), run_dir = %opts.run_dir.display(), "dflashd control plane up");
        Ok(GuardRails {
            handle,
            resume: gate.resume,
            socket: opts.socket,
            run_dir: opts.run_dir,
            previous_fingerprint: gate.previous,
            saved_fingerprint: gate.saved,
            server,
            exporter,
            metrics_url,
            sampler,
            _lock: lock,
        })
    }

    /// Whether the run loop may start: the environment matches, or its drift was accepted.
    pub fn resume_allowed(&self) -> bool {
        !matches!(self.resume, ResumeDecision::Blocked { .. })
    }

    /// Puts back the environment the previous start recorded. For a start that trained nothing
    /// (setup failed, a locked key was refused): the next start must still be compared with the
    /// environment the run last ran in, not with this failed attempt's.
    pub fn forget_fingerprint(&self) -> Result<(), FingerprintError> {
        if !self.saved_fingerprint {
            return Ok(());
        }
        match &self.previous_fingerprint {
            Some(previous) => fingerprint::save(&self.run_dir, previous),
            None => fingerprint::remove(&self.run_dir),
        }
    }

    /// Waits until shutdown is requested on the handle and every part has stopped.
    pub async fn wait(self) {
        let GuardRails {
            handle,
            server,
            exporter,
            sampler,
            _lock,
            ..
        } = self;
        let _ = server.await;
        if let Some(exporter) = exporter {
            let _ = exporter.await;
        }
        notify::stopping(
            &handle
                .shutdown_reason()
                .unwrap_or_else(|| "stopping".into()),
        );
        let _ = tokio::task::spawn_blocking(move || sampler.join()).await;
        // `_lock` is released last, once nothing of this daemon touches the run dir.
    }
}

/// Binds the `/metrics` listener and journals where it is, with a warning when other machines
/// can reach it; a failure is journaled as the reason the run did not start.
/// The run dir taken (its lock) and its journal open, with the notices of how it was found.
fn open_run(opts: &DaemonOptions) -> Result<(RunDirLock, RunHandle), StartError> {
    let lock = RunDirLock::acquire(&opts.run_dir)?;
    let takeover = lock.takeover().notice(lock.path());
    let (journal, recovery) = Journal::open(&opts.run_dir)?;
    let recorder = Recorder::open(&opts.run_dir)
        .inspect_err(|e| tracing::warn!(error = %e, "telemetry recording disabled"))
        .ok();
    let mut policy = ActionPolicy::new(opts.run_name.clone());
    policy.poweroff_command = opts.poweroff_command.clone();
    policy.ttl_ms = opts.pending_ttl_ms;
    let handle = RunHandle::new(RunHandleParts {
        policy,
        run_dir: opts.run_dir.clone(),
        journal,
        bus: opts.bus.clone(),
        recorder,
        config_path: opts.config_path.clone(),
    });
    handle.set_config(Arc::clone(&opts.config));
    if let Some(notice) = takeover {
        tracing::warn!("{notice}");
        handle.record_event_logged(Severity::Warn, EventKind::Note { message: notice });
    }
    if !recovery.is_clean() {
        let message = format!(
            "journal recovered: dropped a torn last line of {} bytes, skipped unreadable lines {:?}",
            recovery.torn_tail_bytes, recovery.unreadable_lines
        );
        tracing::warn!("{message}");
        handle.record_event_logged(Severity::Warn, EventKind::Note { message });
    }
    Ok((lock, handle))
}

/// What the environment fingerprint decided: whether this start may resume, the fingerprint
/// the previous start left (put back by a start that trains nothing), and whether this one's
/// was saved in its place.
struct FingerprintGate {
    gpus: GpuSampler,
    resume: ResumeDecision,
    previous: Option<dflash_shared::health::Fingerprint>,
    saved: bool,
}

/// Fingerprints the environment, journals it and the resume decision, and saves it unless the
/// start is blocked on a drift.
async fn fingerprint_gate(
    opts: &DaemonOptions,
    handle: &RunHandle,
) -> Result<FingerprintGate, StartError> {
    // Fingerprinting hashes data files: keep it off the async workers.
    let inputs = opts.fingerprint.clone();
    let (gpus, current) = tokio::task::spawn_blocking(move || {
        let gpus = GpuSampler::new();
        let fp = fingerprint::collect(&inputs, &gpus, now_ms());
        (gpus, fp)
    })
    .await
    .expect("fingerprint task does not panic");
    // The journal is open: a start refused this early stays in the run's history.
    let current = current.inspect_err(|e| journal_not_started(handle, e))?;
    let previous = fingerprint::load(&opts.run_dir)?;
    let resume = fingerprint::resume_decision(
        previous.as_ref(),
        &current,
        opts.accepted_drift_token.as_deref(),
    );
    handle.set_fingerprint(current.clone());
    handle.record_event(
        Severity::Info,
        EventKind::Fingerprint {
            summary: current.summary(),
        },
    )?;
    journal_resume_decision(handle, &resume)?;
    let saved = !matches!(resume, ResumeDecision::Blocked { .. });
    if saved {
        fingerprint::save(&opts.run_dir, &current)?;
    }
    Ok(FingerprintGate {
        gpus,
        resume,
        previous,
        saved,
    })
}

/// The control socket bound (a stale one from a dead daemon replaced, and journaled).
fn bind_control(
    opts: &DaemonOptions,
    tuning: &ControlTuning,
    handle: &RunHandle,
) -> Result<ControlServer, StartError> {
    let mut server_cfg = ServerConfig::new(&opts.socket);
    server_cfg.dispatch.command_timeout = Duration::from_secs(600);
    if let Some(n) = tuning.max_connections {
        server_cfg.max_connections = n;
    }
    for &uid in &tuning.extra_allowed_uids {
        if !server_cfg.allowed_uids.contains(&uid) {
            server_cfg.allowed_uids.push(uid);
        }
    }
    let server = ControlServer::bind(server_cfg, handle.clone())?;
    if server.removed_stale_socket() {
        handle.record_event_logged(
            Severity::Info,
            EventKind::Note {
                message: format!(
                    "replaced a stale control socket at {}",
                    opts.socket.display()
                ),
            },
        );
    }
    Ok(server)
}

/// The telemetry thread: GPUs and compile caches, sampled on their cadences.
fn spawn_sampler(
    opts: &DaemonOptions,
    handle: &RunHandle,
    gpus: GpuSampler,
) -> Result<JoinHandle<()>, StartError> {
    let specs = opts
        .cache_specs
        .clone()
        .unwrap_or_else(|| default_cache_specs(&CacheEnv::from_environment(), &opts.run_dir));
    let (previous_caches, saved_ms) = load_inventory(&opts.run_dir);
    TelemetrySampler::new(
        handle.clone(),
        gpus,
        CacheMonitor::new(specs, &previous_caches, saved_ms),
        SamplerConfig {
            interval: opts.telemetry_interval,
            cache_interval: opts.cache_interval,
            run_dir: opts.run_dir.clone(),
        },
    )
    .spawn()
    .map_err(|e| {
        handle.request_shutdown("the telemetry thread could not start");
        StartError::Thread(e)
    })
}

/// A start refused after the journal opened: the reason stays in the run's history.
fn journal_not_started(handle: &RunHandle, why: &dyn std::fmt::Display) {
    handle.record_event_logged(
        Severity::Crit,
        EventKind::RunStopped {
            reason: format!("the run did not start: {why}"),
            checkpoint: None,
        },
    );
}

fn bind_metrics(addr: SocketAddr, handle: &RunHandle) -> Result<MetricsServer, StartError> {
    let server = MetricsServer::bind(addr, handle.clone())
        .inspect_err(|e| journal_not_started(handle, e))?;
    let (severity, message) = crate::exporter::listening_note(server.local_addr());
    if severity == Severity::Warn {
        tracing::warn!("{message}");
    } else {
        tracing::info!("{message}");
    }
    handle.record_event_logged(severity, EventKind::Note { message });
    Ok(server)
}

fn journal_resume_decision(
    handle: &RunHandle,
    resume: &ResumeDecision,
) -> Result<(), JournalError> {
    match resume {
        ResumeDecision::FirstStart | ResumeDecision::Unchanged => {}
        ResumeDecision::Proceed { drifts, accepted } => {
            for d in drifts {
                let severity = if d.blocks_resume {
                    Severity::Warn
                } else {
                    Severity::Info
                };
                handle.record_event(severity, d.to_event_kind())?;
            }
            if *accepted {
                handle.record_event(
                    Severity::Warn,
                    EventKind::Note {
                        message: "environment drift accepted by the operator's token; resuming"
                            .into(),
                    },
                )?;
            }
        }
        ResumeDecision::Blocked {
            drifts,
            confirm_token,
        } => {
            for d in drifts {
                let severity = if d.blocks_resume {
                    Severity::Crit
                } else {
                    Severity::Info
                };
                handle.record_event(severity, d.to_event_kind())?;
            }
            let changes: Vec<String> = drifts
                .iter()
                .filter(|d| d.blocks_resume)
                .map(|d| d.sentence())
                .collect();
            let reason = format!(
                "environment drift since the last start ({}); resume is held. Accept it with --accept-drift {confirm_token}",
                changes.join("; ")
            );
            tracing::error!("{reason}");
            handle.set_run_state(RunState::Paused);
            handle.record_event(Severity::Crit, EventKind::RunPaused { reason })?;
        }
    }
    Ok(())
}
