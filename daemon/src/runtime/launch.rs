//! The daemon process from start to exit: logging, the control plane, the resume gates
//! (environment drift, locked keys), the trainer, the run loop on its own thread, and the
//! exit code.
//!
//! Exit codes: 0 when the run ended as asked (schedule done, `--max-steps`, a signal, an
//! operator's stop or kill); 1 for a failure (setup, or a step that paused the run); 2 when a
//! locked key changed; 3 when the environment drifted and `--accept-drift` was not given.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dflash_shared::config::{Config, DrafterHead, EMBEDDED_DATA, EMBEDDED_DEFAULT_TOML};
use dflash_shared::events::{EventKind, Severity, TRAINING_COMPLETE};
use dflash_shared::invocation;
use dflash_shared::last_run::LastRun;
use dflash_shared::metrics::{tree_label, TreeOracleTau};
use dflash_shared::run_dir;
use dflash_shared::status::RunState;

use super::alloc_conf::{self, AllocConf};
use super::detach::Readiness;
use super::ending::Ending;
use super::guard_rails::{ControlTuning, DaemonOptions, GuardRails};
use super::healthy_record::{recipe_digest, HealthyRecordKeeper, RecordIdentity};
use super::launch_nodes::{self, NodeJob};
use super::logging::{self, LoggingConfig, StderrFormat};
use super::metrics_out::say;
use super::run_loop::{RunLoop, RunLoopConfig};
use super::setup::{self, MemoryPlanPolicy, Prepared, SetupInputs};
use super::{checkpoint_gate, signals, telemetry_specs};
use crate::run::bus::FrameBus;
use crate::run::handle::RunHandle;
use crate::run::locked_keys::{self as locked, Gate};
use crate::run::paths::DaemonPaths;
use crate::telemetry::fingerprint::{ConfigSource, FingerprintInputs, ResumeDecision};
use dflash_shared::launch::NodeLaunch;

pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_LOCKED_KEY: u8 = 2;
pub const EXIT_DRIFT: u8 = 3;
/// Bad data lines journaled one by one; the rest are counted in one note.
const BAD_LINES_JOURNALED: usize = 100;

/// Everything `dflashd start` resolved before the daemon starts.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub config: Config,
    /// The config file; `None` for the embedded default.
    pub config_path: Option<PathBuf>,
    pub paths: DaemonPaths,
    pub run_dir: PathBuf,
    pub socket: PathBuf,
    /// Whether `socket` is the default one (then `dflash-tui` needs no `--socket`).
    pub socket_is_default: bool,
    pub max_steps: Option<u64>,
    pub metrics_path: PathBuf,
    pub log_every: u64,
    pub device_override: Option<dflash_shared::config::Device>,
    pub accept_drift: Option<String>,
    pub threads: i32,
    pub memory_plan: MemoryPlanPolicy,
    /// `--cpu-peak-flops`: the CPU's MFU peak given, not timed at start.
    pub cpu_peak_flops: Option<f64>,
    /// `--resume-from`: the operator's explicit choice of checkpoint step.
    pub resume_from: Option<u64>,
    /// Where to serve Prometheus `/metrics` (`--metrics-listen`, else `metrics.listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// Whether dflashd set `PYTORCH_CUDA_ALLOC_CONF` or the user did (journaled).
    pub alloc_conf: AllocConf,
    /// Which node of how many this daemon is ([`NodeLaunch::single`] for one node).
    pub node: NodeLaunch,
    /// Bounds the rendezvous, the start's agreement and every cross-node collective.
    pub collective_timeout: Duration,
}

/// Runs the daemon to the end; returns the process exit code.
pub fn launch(spec: LaunchSpec, mut ready: Readiness) -> u8 {
    signals::install();
    tch::set_num_threads(spec.threads);
    let bus = FrameBus::new(spec.config.control.client_buffer_frames);
    let _log_guards = match logging::init(&logging_config(&spec, &ready, &bus)) {
        Ok(g) => g,
        Err(e) => return fail(&mut ready, EXIT_FAILURE, &format!("logging: {e}")),
    };
    if let Some(notice) = spec
        .paths
        .socket_notice()
        .filter(|_| spec.socket_is_default)
    {
        tracing::warn!("{notice}");
        eprintln!("dflashd: {notice}");
    }
    let rt = match control_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let text = format!("starting the async runtime: {e}");
            return fail(&mut ready, EXIT_FAILURE, &text);
        }
    };
    let cp = match rt.block_on(GuardRails::start_with(
        daemon_options(&spec, bus),
        tuning(&spec),
    )) {
        Ok(cp) => cp,
        Err(e) => return fail(&mut ready, EXIT_FAILURE, &e.to_string()),
    };
    let (run_loop, banner) = match gate_and_prepare(&spec, &cp) {
        Ok(ready_to_run) => ready_to_run,
        Err(refusal) => return not_started(refusal, &rt, cp, &mut ready),
    };
    say(&banner);
    ready.ready(&banner);
    run_to_end(run_loop, rt, cp)
}

/// Why the run did not start: the exit code, the text for the operator, and the run state to
/// leave behind (`None` keeps the state the gate found).
struct Refusal {
    code: u8,
    text: String,
    state: Option<RunState>,
}

impl Refusal {
    fn new(code: u8, text: impl Into<String>, state: Option<RunState>) -> Self {
        Refusal {
            code,
            text: text.into(),
            state,
        }
    }
}

fn logging_config(spec: &LaunchSpec, ready: &Readiness, bus: &FrameBus) -> LoggingConfig {
    LoggingConfig {
        log_dir: spec.paths.log_dir.clone(),
        // A detached daemon's stderr is a file; the rolling logs already have every line.
        stderr: if ready.is_detached() {
            StderrFormat::Off
        } else {
            StderrFormat::Human
        },
        filter: "info".into(),
        bus: Some(bus.clone()),
    }
}

/// The control plane's runtime: two workers are plenty for the socket, the exporter and the
/// feeds, and leave the cores to training.
fn control_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("dflash-control")
        .enable_all()
        .build()
}

/// The resume gates in order (environment drift, locked keys, the checkpoint), then the
/// trainer, then the run loop; each refusal says why and leaves the fingerprint as it was.
fn gate_and_prepare(spec: &LaunchSpec, cp: &GuardRails) -> Result<(RunLoop, String), Refusal> {
    let handle = &cp.handle;
    if let ResumeDecision::Blocked {
        drifts,
        confirm_token,
    } = &cp.resume
    {
        let text = drift_refusal(drifts, confirm_token, spec);
        return Err(Refusal::new(EXIT_DRIFT, text, None));
    }
    let unlocked = locked_gate(spec, handle)
        .map_err(|text| Refusal::new(EXIT_LOCKED_KEY, text, Some(RunState::Paused)))?;
    let failed = |text: String| Refusal::new(EXIT_FAILURE, text, Some(RunState::Failed));
    let checkpoint_root = spec.run_dir.join(run_dir::CHECKPOINTS_DIR_NAME);
    let job = meet_the_job(spec, handle).map_err(failed)?;
    let resume_from = match &job {
        Some(job) => common_checkpoint(job, spec, handle, &checkpoint_root).map_err(failed)?,
        None => spec.resume_from,
    };
    let resume = checkpoint_gate::pass(&checkpoint_root, &spec.run_dir, handle, resume_from)
        .map_err(failed)?;
    if let Some(job) = &job {
        agree(job, spec, handle, resume.as_deref()).map_err(failed)?;
    }
    let inputs = SetupInputs {
        config: &spec.config,
        config_path: spec.config_path.as_deref(),
        run_dir: &spec.run_dir,
        device_override: spec.device_override,
        unlocked_keys: unlocked.carried.clone(),
        memory_plan: spec.memory_plan,
        cpu_peak_flops: spec.cpu_peak_flops,
        // A node's trainer joins its job as the build's last step, before this restore (which
        // checks the cursor against the job's global batch).
        resume: resume.clone(),
    };
    let node = job.as_ref().map(|job| {
        let handle = handle.clone();
        setup::NodeOfJob {
            job,
            journal: Box::new(move |severity, message| {
                handle.record_event_logged(severity, EventKind::Note { message });
            }),
        }
    });
    let prepared = setup::prepare(&inputs, node).map_err(|e| {
        if let setup::SetupError::MemoryPlan(refusal) = &e {
            // The stop reason keeps the first line; the journal keeps every device's need.
            handle.record_event_logged(
                Severity::Crit,
                EventKind::Note {
                    message: refusal.replace('\n', " "),
                },
            );
        }
        failed(format!("cannot start training: {e}"))
    })?;
    if let Some(job) = &job {
        // Each node loaded `drafter.init_from` from its own copy: the nodes compare the
        // digests of what they loaded before any step.
        if spec.config.drafter.init_from.is_some() && resume.is_none() {
            job.agree_init_from(prepared.warm_start.as_ref())
                .map_err(node_refusal(spec))
                .map_err(failed)?;
        }
        handle.set_job_node(job.node(), job.launch.nnodes);
        tracing::info!(node = %spec.node, "joined the job's gradient group");
    }
    // Only now, with the checkpoint accepted, do the unlocks count as used.
    apply_unlocks(spec, handle, &unlocked).map_err(failed)?;
    locked::save_effective(&spec.run_dir, &spec.config).map_err(|e| failed(e.to_string()))?;
    journal_start(handle, &prepared, spec);
    record_last_run(spec);
    build_run_loop(spec, cp, prepared, checkpoint_root)
        .map_err(|text| Refusal::new(EXIT_FAILURE, text, None))
}

fn node_refusal(spec: &LaunchSpec) -> impl Fn(String) -> String + '_ {
    move |e| format!("the run did not start: node {}: {e}", spec.node.node_rank)
}

/// A node of a multi-node job meets the others at the rendezvous; `None` for a single node.
fn meet_the_job(spec: &LaunchSpec, handle: &RunHandle) -> Result<Option<NodeJob>, String> {
    if !spec.node.is_multi_node() {
        return Ok(None);
    }
    let job =
        NodeJob::rendezvous(&spec.node, spec.collective_timeout).map_err(node_refusal(spec))?;
    let job = job.with_heartbeat_timeout(Duration::from_secs_f64(
        spec.config.nodes.heartbeat_timeout_s,
    ));
    handle.record_event_logged(
        Severity::Info,
        EventKind::Note {
            message: format!("{}: met the job's nodes", spec.node),
        },
    );
    Ok(Some(job))
}

/// The checkpoint every node resumes from (the newest all hold), this node's newer ones
/// moved aside and journaled; the operator's `--resume-from` wins when given.
fn common_checkpoint(
    job: &NodeJob,
    spec: &LaunchSpec,
    handle: &RunHandle,
    root: &std::path::Path,
) -> Result<Option<u64>, String> {
    let (step, moved) = job.align_checkpoints(root).map_err(node_refusal(spec))?;
    for message in moved {
        handle.record_event_logged(Severity::Warn, EventKind::Note { message });
    }
    Ok(spec.resume_from.or(step))
}

/// Every node's start facts agree (locked keys, the job config, its digest, the environment,
/// the drafter workers, the resume step); the refusal names the node and the key.
fn agree(
    job: &NodeJob,
    spec: &LaunchSpec,
    handle: &RunHandle,
    resume: Option<&std::path::Path>,
) -> Result<(), String> {
    let refused = node_refusal(spec);
    let workers = match spec.device_override {
        Some(_) => 1,
        None => spec.config.topology.drafter_devices.len() as u32,
    };
    let facts = launch_nodes::start_facts(&spec.node, &spec.config, &spec.run_dir, workers, resume)
        .map_err(&refused)?;
    job.agree(&facts).map_err(&refused)?;
    handle.record_event_logged(
        Severity::Info,
        EventKind::Note {
            message: format!(
                "{}: every node agrees on the job config (digest {}), the environment and \
                 the resume step {}",
                spec.node,
                &facts.config_digest[..12],
                facts.resume_step
            ),
        },
    );
    Ok(())
}

/// The run loop over the prepared trainer, and the banner that announces it.
fn build_run_loop(
    spec: &LaunchSpec,
    cp: &GuardRails,
    prepared: Prepared,
    checkpoint_root: PathBuf,
) -> Result<(RunLoop, String), String> {
    let handle = &cp.handle;
    let device = dflash_engine::device::name(prepared.device);
    let where_ = setup::describe_topology(prepared.trainer.topology());
    let mut banner = banner(spec, &prepared, &where_, cp.metrics_url.as_deref());
    if let Some(line) = environment_changes_line(&cp.resume) {
        banner.push_str(&line);
    }
    let cfg = RunLoopConfig {
        checkpoint_root,
        max_steps: spec.max_steps,
        metrics_path: spec.metrics_path.clone(),
        tensorboard_dir: spec
            .config
            .tensorboard
            .enabled
            .then(|| run_dir::tensorboard_dir(&spec.run_dir, &spec.config.tensorboard.dir)),
        log_every: spec.log_every,
        device,
        detectors: spec.config.detectors.clone(),
        healthy_record: Some(healthy_record_keeper(spec, &prepared, &where_, handle)),
    };
    let commands = handle.attach_run_loop();
    let run_loop = RunLoop::new(handle.clone(), prepared.trainer, commands, cfg)?;
    Ok((run_loop, banner))
}

/// A start that did not happen: the previous fingerprint back, a journal line, the control
/// plane shut down, and the refusal on stderr (and to a detached parent).
fn not_started(
    refusal: Refusal,
    rt: &tokio::runtime::Runtime,
    cp: GuardRails,
    ready: &mut Readiness,
) -> u8 {
    let handle = cp.handle.clone();
    if let Some(state) = refusal.state {
        handle.set_run_state(state);
    }
    if let Err(e) = cp.forget_fingerprint() {
        tracing::warn!(error = %e, "could not restore the previous environment fingerprint");
    }
    handle.record_event_logged(
        Severity::Crit,
        EventKind::RunStopped {
            reason: refusal.text.lines().next().unwrap_or_default().to_string(),
            checkpoint: None,
        },
    );
    handle.request_shutdown("the run did not start");
    rt.block_on(cp.wait());
    fail(ready, refusal.code, &refusal.text)
}

/// Trains on its own thread until the run ends and the control plane has drained; returns
/// the exit code of the ending.
fn run_to_end(run_loop: RunLoop, rt: tokio::runtime::Runtime, cp: GuardRails) -> u8 {
    let handle = cp.handle.clone();
    let h = handle.clone();
    let trainer_thread = std::thread::Builder::new()
        .name("dflash-train".into())
        .spawn(move || {
            let ending = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_loop.run()))
                .unwrap_or_else(|_| Ending::Failed {
                    error: "the run loop panicked; see the log".into(),
                });
            h.request_shutdown(format!("run ended: {ending:?}"));
            ending
        });
    let trainer_thread = match trainer_thread {
        Ok(t) => t,
        Err(e) => {
            handle.request_shutdown("the training thread could not start");
            rt.block_on(cp.wait());
            eprintln!("dflashd: starting the training thread: {e}");
            return EXIT_FAILURE;
        }
    };
    rt.block_on(cp.wait());
    let ending = trainer_thread.join().unwrap_or(Ending::Failed {
        error: "the training thread died".into(),
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    say(&farewell(&ending, &handle));
    ending.exit_code()
}

fn fail(ready: &mut Readiness, code: u8, text: &str) -> u8 {
    eprintln!("dflashd: {text}");
    ready.failed(code, text);
    code
}

fn daemon_options(spec: &LaunchSpec, bus: FrameBus) -> DaemonOptions {
    let cfg = &spec.config;
    let config = match &spec.config_path {
        Some(p) => ConfigSource::File(p.clone()),
        None => ConfigSource::Embedded(EMBEDDED_DEFAULT_TOML.into()),
    };
    let data_files = match cfg.data.train_file.as_str() {
        EMBEDDED_DATA => vec![],
        file => crate::run::paths::resolve_path(
            "data.train_file",
            file,
            spec.config_path.as_deref(),
            &spec.run_dir,
        )
        .map(|p| vec![p])
        .unwrap_or_default(),
    };
    let python_env = cfg.telemetry.python.as_deref().and_then(|p| {
        crate::run::paths::resolve_path(
            "telemetry.python",
            p,
            spec.config_path.as_deref(),
            &spec.run_dir,
        )
        .ok()
    });
    let interval = Duration::from_millis(cfg.telemetry.sample_interval_ms.max(100));
    DaemonOptions {
        run_name: cfg.run.name.clone(),
        run_dir: spec.run_dir.clone(),
        socket: spec.socket.clone(),
        bus,
        poweroff_command: cfg.control.poweroff_command.clone(),
        pending_ttl_ms: cfg.control.pending_action_expiry_s as i64 * 1000,
        telemetry_interval: interval,
        cache_interval: (interval * 15).max(Duration::from_secs(5)),
        cache_specs: Some(telemetry_specs::cache_specs(cfg, &spec.run_dir)),
        fingerprint: FingerprintInputs {
            config,
            data_files,
            python_env,
            cuda_alloc_conf: alloc_conf::in_effect(),
        },
        accepted_drift_token: spec.accept_drift.clone(),
        config: Arc::new(cfg.clone()),
        config_path: spec.config_path.as_ref().map(|p| p.display().to_string()),
    }
}

fn tuning(spec: &LaunchSpec) -> ControlTuning {
    ControlTuning {
        extra_allowed_uids: spec.config.control.allowed_uids.clone(),
        metrics_listen: spec.metrics_listen,
        max_connections: Some(spec.config.control.max_connections),
    }
}

fn drift_refusal(
    drifts: &[dflash_shared::health::EnvironmentDrift],
    token: &str,
    spec: &LaunchSpec,
) -> String {
    let mut text = format!(
        "refusing to resume the run in {}: the environment changed since its last start:\n",
        spec.run_dir.display()
    );
    for d in drifts.iter().filter(|d| d.blocks_resume) {
        text.push_str(&format!("  - {}\n", d.sentence()));
    }
    let informational: Vec<String> = drifts
        .iter()
        .filter(|d| !d.blocks_resume)
        .map(|d| d.sentence())
        .collect();
    if !informational.is_empty() {
        text.push_str(&format!(
            "Also changed (informational, does not hold the run): {}.\n",
            informational.join("; ")
        ));
    }
    text.push_str(&format!(
        "A silently swapped library or driver can wreck a run's throughput and results. If the \
         change is intended, start again with --accept-drift {token} (the token accepts exactly \
         this environment)."
    ));
    text
}

/// The banner line listing what changed since the last start and did not hold the resume
/// (a rebuild at a new commit, or a drift the operator accepted).
fn environment_changes_line(resume: &ResumeDecision) -> Option<String> {
    let ResumeDecision::Proceed { drifts, accepted } = resume else {
        return None;
    };
    let changes: Vec<String> = drifts
        .iter()
        .map(|d| {
            if d.blocks_resume && *accepted {
                format!("{} (accepted drift)", d.sentence())
            } else {
                d.sentence()
            }
        })
        .collect();
    Some(format!("\n  changed:  {}", changes.join("; ")))
}

/// What the locked-key gate let through.
#[derive(Debug, Default)]
struct Unlocked {
    /// Changes accepted at this start, with the unlock that covers each.
    accepted: Vec<(dflash_shared::config::LockedKeyChange, locked::Unlock)>,
    /// Locked keys the checkpoint check may let differ (this start's and earlier unlocks).
    carried: Vec<String>,
}

/// Compares locked keys with the previous start; `Err` is the refusal.
fn locked_gate(spec: &LaunchSpec, handle: &RunHandle) -> Result<Unlocked, String> {
    let previous = locked::load_effective(&spec.run_dir).map_err(|e| e.to_string())?;
    let unlocks = locked::load_unlocks(&spec.run_dir).map_err(|e| e.to_string())?;
    let refuse = |text: String| {
        handle.record_event_logged(
            Severity::Crit,
            EventKind::RunPaused {
                reason: text.replace('\n', " "),
            },
        );
        Err(text)
    };
    let carried = |used: &[locked::Unlock]| {
        locked::carried_keys(&spec.run_dir, used).map_err(|e| e.to_string())
    };
    match locked::judge(previous.as_ref(), &spec.config, &unlocks) {
        // Without a recorded config nothing was approved: the checkpoint must match exactly.
        Gate::NoPrevious => Ok(Unlocked::default()),
        Gate::Unchanged => Ok(Unlocked {
            accepted: Vec::new(),
            carried: carried(&[])?,
        }),
        Gate::CannotCarry { refusals } => {
            refuse(locked::cannot_carry_message(&refusals, &spec.run_dir))
        }
        Gate::Refused { changes, unlocked } => {
            refuse(locked::refusal_message(&changes, &unlocked, &spec.run_dir))
        }
        Gate::Accepted { changes, used } => Ok(Unlocked {
            carried: carried(&used)?,
            accepted: changes.into_iter().zip(used).collect(),
        }),
    }
}

/// Journals each accepted locked-key change and marks its unlock used.
fn apply_unlocks(spec: &LaunchSpec, handle: &RunHandle, unlocked: &Unlocked) -> Result<(), String> {
    if unlocked.accepted.is_empty() {
        return Ok(());
    }
    for (c, u) in &unlocked.accepted {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::Note {
                message: format!(
                    "locked key {} changed {} → {}, accepted by unlock {}",
                    c.key, c.before, c.after, u.action_id
                ),
            },
        );
    }
    let used: Vec<locked::Unlock> = unlocked.accepted.iter().map(|(_, u)| u.clone()).collect();
    locked::consume_unlocks(&spec.run_dir, &used).map_err(|e| e.to_string())
}

fn journal_start(handle: &RunHandle, p: &Prepared, spec: &LaunchSpec) {
    let report = &p.report;
    for bad in report.bad_lines.iter().take(BAD_LINES_JOURNALED) {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::BadDataLine {
                file: bad.file.display().to_string(),
                line: bad.line,
                reason: bad.reason.clone(),
            },
        );
    }
    let summary = format!("data {}: {}", p.data_source, report.summary());
    let extra = report.bad_lines.len().saturating_sub(BAD_LINES_JOURNALED);
    let message = if extra > 0 {
        format!(
            "{summary}; {extra} more bad lines are listed in {}",
            spec.run_dir.join(run_dir::DATA_REPORT_FILE_NAME).display()
        )
    } else {
        summary
    };
    handle.record_event_logged(Severity::Info, EventKind::Note { message });
    handle.record_event_logged(
        Severity::Info,
        EventKind::Note {
            message: spec.alloc_conf.journal_line(),
        },
    );
    if let Some(note) = &p.memory_plan_note {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::Note {
                message: note.clone(),
            },
        );
        tracing::warn!("{note}");
    }
    if let Some(message) = warm_start_line(p, spec) {
        handle.record_event_logged(Severity::Info, EventKind::Note { message });
    }
    for note in &p.peak_notes {
        handle.record_event_logged(
            Severity::Info,
            EventKind::Note {
                message: note.clone(),
            },
        );
    }
    if let Some(note) = &p.topology_note {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::Note {
                message: note.clone(),
            },
        );
        tracing::warn!("{note}");
    }
    handle.record_event_logged(
        Severity::Info,
        EventKind::RunStarted {
            run_name: spec.config.run.name.clone(),
            resumed_from_step: p.resumed_from.as_ref().map(|_| p.trainer.step_count()),
        },
    );
}

/// Where the drafter's weights came from, when `drafter.init_from` is set: what a fresh start
/// loaded (the weights files' SHA-256), or that a resume did not read it.
fn warm_start_line(p: &Prepared, spec: &LaunchSpec) -> Option<String> {
    if let Some(loaded) = &p.warm_start {
        return Some(loaded.summary());
    }
    let dir = spec.config.drafter.init_from.as_deref()?;
    p.resumed_from.as_ref().map(|checkpoint| {
        format!(
            "drafter.init_from = {dir:?} not read: the run resumes from {}, which carries its \
             weights on",
            checkpoint.display()
        )
    })
}

/// The keeper of this run's healthy record, with the record it is judged against loaded.
fn healthy_record_keeper(
    spec: &LaunchSpec,
    prepared: &Prepared,
    placement: &str,
    handle: &RunHandle,
) -> HealthyRecordKeeper {
    // Guard rails took the fingerprint before the launch got here.
    let fingerprint = handle.fingerprint().unwrap_or_default();
    let config = serde_json::to_value(&spec.config).unwrap_or_default();
    let identity = RecordIdentity {
        run_name: spec.config.run.name.clone(),
        run_dir: spec.run_dir.clone(),
        recipe: recipe_digest(&config, placement, &fingerprint.gpu_models),
        topology: placement.to_string(),
        device_models: fingerprint.gpu_models.clone(),
        basis: prepared.throughput_basis.clone(),
    };
    HealthyRecordKeeper::open(
        spec.config.detectors.healthy.clone(),
        identity,
        spec.paths.state_dir.clone(),
        fingerprint.hostname.as_deref(),
    )
}

/// `placement`: where the run trains, every worker by role (see `setup::describe_topology`).
/// Tells the console where this run lives for when the daemon is down (`--run-dir` may be
/// anywhere). Losing it only costs that convenience, so a failure is a warning.
fn record_last_run(spec: &LaunchSpec) {
    let record = LastRun {
        run_name: spec.config.run.name.clone(),
        run_dir: spec.run_dir.display().to_string(),
        socket: spec.socket.display().to_string(),
        pid: std::process::id(),
        started_ms: dflash_shared::clock::now_ms(),
    };
    let path = dflash_shared::run_dir::last_run_path(&spec.paths.state_dir);
    let written = serde_json::to_vec_pretty(&record)
        .map_err(std::io::Error::other)
        .and_then(|bytes| dflash_engine::files::atomic_write::write_atomic(&path, &bytes));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "could not record the last run");
    }
}

fn banner(spec: &LaunchSpec, p: &Prepared, placement: &str, metrics_url: Option<&str>) -> String {
    let t = &p.trainer;
    let resumed = match &p.resumed_from {
        Some(dir) => format!("resumed at step {} from {}", t.step_count(), dir.display()),
        None => "a new run".into(),
    };
    let on = invocation::socket_flag(&spec.socket, spec.socket_is_default);
    let tui = invocation::spell_sibling("dflash-tui");
    let mut text = format!(
        "dflashd started (pid {}): run '{}' on {placement}, {resumed}; {} steps in total ({} train / {} held-out samples)\n",
        std::process::id(),
        spec.config.run.name,
        t.total_steps(),
        t.split().train.len(),
        t.split().eval.len(),
    );
    text.push_str(&format!(
        "  data:     {}: {}\n",
        p.data_source,
        p.report.summary()
    ));
    if let Some(line) = warm_start_line(p, spec) {
        text.push_str(&format!("  init:     {line}\n"));
    }
    text.push_str(&format!("  run dir:  {}\n", spec.run_dir.display()));
    text.push_str(&format!("  socket:   {}\n", spec.socket.display()));
    text.push_str(&format!("  logs:     {}\n", spec.paths.log_dir.display()));
    if let Some(url) = metrics_url {
        text.push_str(&format!("  metrics:  {url}\n"));
    }
    text.push_str(&format!("  attach:   {tui} attach{on}\n"));
    text.push_str(&format!("  headless: {tui} tail --follow{on}\n"));
    text.push_str(&format!(
        "  stop:     {tui} stop{on}, then {tui} confirm-stop{on}"
    ));
    text
}

/// "tau chain 3.7200 · tree@32 4.4500": the held-out chain τ and, beside it, the oracle tree τ
/// at the serving budget, the figure the drafter is judged by when served with DDTree. Every
/// head's held-out τ is the teacher-forced greedy chain's (a DSpark drafter's too:
/// `train/eval/heads.rs`; its `tau_probabilistic` is in the evaluation's `dspark` figures).
fn held_out_words(
    tau: Option<f64>,
    tree: Option<&TreeOracleTau>,
    head: Option<DrafterHead>,
) -> Option<String> {
    let tau = tau?;
    let chain = match head {
        Some(DrafterHead::Dspark) => format!("tau chain {tau:.4} (every slot drafting)"),
        _ => format!("tau chain {tau:.4}"),
    };
    Some(match tree.and_then(TreeOracleTau::at_serve_budget) {
        Some((budget, t)) => format!("{chain} · {} {t:.4}", tree_label(budget)),
        None => chain,
    })
}

fn farewell(ending: &Ending, handle: &RunHandle) -> String {
    let s = handle.status_snapshot();
    let tau = held_out_words(s.last_tau, s.last_tau_tree.as_ref(), s.run.drafter_head)
        .map(|words| format!("; last held-out {words}"))
        .unwrap_or_default();
    let what = match ending {
        Ending::Finished { .. } => TRAINING_COMPLETE.to_string(),
        Ending::Killed { action_id } => format!("killed by {action_id}"),
        Ending::Failed { error } => format!("failed: {error}"),
        Ending::StepLimit { .. } => "stopped (--max-steps reached)".into(),
        Ending::Signal { signal, .. } => format!("stopped ({})", signals::name(*signal)),
        Ending::Stopped { action_id, .. } => format!("stopped by {action_id}"),
        Ending::Shutdown { .. } => "stopped (daemon shut down)".into(),
    };
    let checkpoint = ending.checkpoint().unwrap_or("none");
    format!(
        "{what} at step {}/{}; checkpoint {checkpoint}{tau}",
        s.run.step, s.run.total_steps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_farewell_names_the_tree_figure_with_its_budget_beside_chain_tau() {
        let tree = TreeOracleTau {
            serve_budget: 32,
            by_budget: [(8, 3.25), (32, 4.4531)].into_iter().collect(),
        };
        let domino = Some(DrafterHead::Domino);
        assert_eq!(
            held_out_words(Some(3.72), Some(&tree), domino).as_deref(),
            Some("tau chain 3.7200 · tree@32 4.4531")
        );
        assert_eq!(
            held_out_words(Some(3.72), None, None).as_deref(),
            Some("tau chain 3.7200")
        );
        assert_eq!(held_out_words(None, Some(&tree), domino), None);
    }

    #[test]
    fn a_dspark_farewell_names_its_tau_as_the_chain_of_every_slot() {
        assert_eq!(
            held_out_words(Some(3.72), None, Some(DrafterHead::Dspark)).as_deref(),
            Some("tau chain 3.7200 (every slot drafting)")
        );
    }
}
