//! [`RunHandle`]: the one shared object between the run loop and the control plane.
//!
//! The run loop (std threads) writes: state, step metrics, queue/GPU/host/cache telemetry,
//! checkpoints, journal events. The control plane (tokio tasks) reads snapshots, files and
//! confirms pending actions, and hands confirmed stop/kill commands to the run loop through a
//! channel the run loop attached. Every method is cheap and non-blocking except
//! [`RunHandle::record_event`], which `fsync`s one journal line.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock, RwLock};

use dflash_shared::best_checkpoint::{BestCheckpoint, NoBestCheckpoint};
use dflash_shared::config::{Config, DetectorsSection};
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::health::fingerprint::Fingerprint;
use dflash_shared::health::healthy_record::HealthyRecord;
use dflash_shared::metrics::{CacheState, GpuTelemetry, HostSample, QueueStats, StepMetrics};
use dflash_shared::protocol::{Response, Topic};
use dflash_shared::status::{
    Alert, CheckpointInfo, Dflash2Acceptance, DominoAcceptance, DsparkAcceptance, JobStatus,
    OnlineEvalStatus, RecordClock, RunInfo, RunState, StatusSnapshot, Throughput,
};
use tokio::sync::{broadcast, oneshot};

use crate::run::bus::FrameBus;
use crate::run::journal::{Journal, JournalError};
use crate::run::pending::{ActionPolicy, HealthyRecordView, PendingActions, StateView};
use crate::run::recorder::Recorder;
use crate::run::refusal_throttle::{self, RefusalThrottle, Verdict, REFUSALS_JOURNALED_PER_WINDOW};
use crate::run::withdrawn_requests::{Filing, WithdrawnRequests};
use dflash_engine::train::topology::QueueMonitor;
use dflash_shared::clock::now_ms;

/// Checkpoints listed in status; older ones are still on disk, just not in the snapshot.
const CHECKPOINTS_LISTED: usize = 32;

/// What the run loop reports back for a command: a sentence for the operator.
pub type CommandOutcome = Result<String, String>;

/// A confirmed command the run loop must carry out between steps.
#[derive(Debug)]
pub enum RunCommand {
    /// Write a checkpoint, then return from the run loop. Reply with where it went.
    Stop {
        action_id: String,
        reply: oneshot::Sender<CommandOutcome>,
    },
    /// Return from the run loop now, without a checkpoint.
    Kill {
        action_id: String,
        reply: oneshot::Sender<CommandOutcome>,
    },
    /// Forget the healthy record: the health feed, which writes it, removes its files and
    /// judges throughput anew. Reply with what was removed.
    ForgetHealthyRecord {
        action_id: String,
        reply: oneshot::Sender<CommandOutcome>,
    },
}

/// What the summary of kept-back filings counts.
const WITHDRAWN: &str = "requests filed and withdrawn (cancelled or expired) unconfirmed";

/// The run's state, grouped by who writes it together, one lock per group (mini-redis's
/// `Shared { state: Mutex<State> }`): a reader never sees half of one writer's update, and no
/// method holds two of these locks at once.
#[derive(Debug)]
struct Shared {
    run_name: String,
    run_dir: PathBuf,
    policy: ActionPolicy,
    bus: FrameBus,
    /// What the run loop, its health feed and the telemetry timer publish.
    status: RwLock<Status>,
    /// What the run started in, and what the live environment watch has seen change since.
    environment: RwLock<Environment>,
    /// Operator requests in flight and the bookkeeping that keeps their journal lines bounded.
    requests: Mutex<Requests>,
    /// What the run loop hands over when it starts: its command channel and its queues.
    run_loop: Mutex<RunLoopLink>,
    /// Apart from the rest: an append `fsync`s, and no reader of status should wait on a disk.
    journal: Mutex<Journal>,
    /// Apart for the same reason: recording writes a file.
    recorder: Option<Mutex<Recorder>>,
    shutdown: ShutdownSignal,
}

#[derive(Debug)]
struct Status {
    snapshot: StatusSnapshot,
    /// The last line the run loop published (a step, or the evaluation before the first step):
    /// what `/metrics` serves of loss, accuracy, lr, grad norm and step times. `None` before it.
    last_metrics: Option<StepMetrics>,
    /// The healthy record's files (the run dir's and its recipe's in the state dir), set with
    /// the record by the health feed: what a forget's consequences name (the feed itself
    /// removes them).
    healthy_record_files: Vec<PathBuf>,
}

#[derive(Debug)]
struct Environment {
    /// The run's effective config, as the `config` request serves it. `None` until guard
    /// rails set it.
    config: Option<Arc<Config>>,
    /// The fingerprint taken at start, with the Python packages as the live watch last saw
    /// them. `None` until guard rails take it.
    fingerprint: Option<Fingerprint>,
    /// What the live environment watch sees differ from the start, worded (empty: nothing).
    drift: Vec<String>,
}

#[derive(Debug, Default)]
struct Requests {
    pending: PendingActions,
    refusals: RefusalThrottle,
    withdrawn: WithdrawnRequests,
    /// Keys an operator unlocked in this daemon's lifetime.
    unlocked_keys: Vec<String>,
}

#[derive(Debug, Default)]
struct RunLoopLink {
    commands: Option<mpsc::Sender<RunCommand>>,
    /// The run's hidden-state queues, read by the telemetry timer between steps.
    queue_monitor: Option<QueueMonitor>,
}

#[derive(Debug)]
struct ShutdownSignal {
    tx: broadcast::Sender<()>,
    requested: AtomicBool,
    /// The first reason given; later requests keep it.
    reason: OnceLock<String>,
}

/// What the health feed judged of throughput at the latest step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThroughputJudgement {
    pub baseline_tokens_per_s: Option<f64>,
    pub stable_since_ms: Option<i64>,
    pub baseline_source: Option<String>,
    pub record_clock: Option<RecordClock>,
}

/// Cheap to clone; every clone is the same run.
#[derive(Debug, Clone)]
pub struct RunHandle {
    inner: Arc<Shared>,
}

/// Everything needed to build a [`RunHandle`].
#[derive(Debug)]
pub struct RunHandleParts {
    pub policy: ActionPolicy,
    pub run_dir: PathBuf,
    pub journal: Journal,
    pub bus: FrameBus,
    /// `None` disables the telemetry recording (tests that do not need it).
    pub recorder: Option<Recorder>,
    pub config_path: Option<String>,
}

impl RunHandle {
    pub fn new(parts: RunHandleParts) -> Self {
        let RunHandleParts {
            policy,
            run_dir,
            journal,
            bus,
            recorder,
            config_path,
        } = parts;
        let snapshot = StatusSnapshot {
            run: RunInfo {
                name: policy.run_name.clone(),
                state: RunState::Starting,
                step: 0,
                total_steps: 0,
                epoch: 0,
                epochs: 0,
                started_ms: now_ms(),
                eta_ms: None,
                run_dir: run_dir.display().to_string(),
                config_path,
                objective: None,
                drafter_head: None,
            },
            throughput: Throughput {
                tokens_per_s: 0.0,
                draft_positions_per_s: 0.0,
                mfu: None,
                baseline_tokens_per_s: None,
                stable_since_ms: None,
                baseline_source: None,
                record_clock: None,
            },
            gpus: GpuTelemetry::Unavailable {
                reason: "GPU telemetry not sampled yet".into(),
            },
            host: None,
            queue: QueueStats::default(),
            caches: Vec::new(),
            alerts: Vec::new(),
            pending_actions: Vec::new(),
            checkpoints: Vec::new(),
            best_checkpoint: None,
            no_best_checkpoint: None,
            last_loss: None,
            last_tau: None,
            last_tau_tree: None,
            last_online: None,
            last_domino: None,
            last_dspark: None,
            last_dflash2: None,
            detectors: None,
            healthy_record: None,
            job: None,
        };
        let (shutdown_tx, _) = broadcast::channel(1);
        RunHandle {
            inner: Arc::new(Shared {
                run_name: policy.run_name.clone(),
                run_dir,
                policy,
                bus,
                status: RwLock::new(Status {
                    snapshot,
                    last_metrics: None,
                    healthy_record_files: Vec::new(),
                }),
                environment: RwLock::new(Environment {
                    config: None,
                    fingerprint: None,
                    drift: Vec::new(),
                }),
                requests: Mutex::new(Requests::default()),
                run_loop: Mutex::new(RunLoopLink::default()),
                journal: Mutex::new(journal),
                recorder: recorder.map(Mutex::new),
                shutdown: ShutdownSignal {
                    tx: shutdown_tx,
                    requested: AtomicBool::new(false),
                    reason: OnceLock::new(),
                },
            }),
        }
    }

    pub fn run_name(&self) -> &str {
        &self.inner.run_name
    }

    pub fn run_dir(&self) -> &Path {
        &self.inner.run_dir
    }

    pub fn policy(&self) -> &ActionPolicy {
        &self.inner.policy
    }

    pub fn bus(&self) -> &FrameBus {
        &self.inner.bus
    }

    // ----- run loop side -------------------------------------------------------------------

    /// The run loop calls this once and polls the receiver between steps.
    pub fn attach_run_loop(&self) -> mpsc::Receiver<RunCommand> {
        let (tx, rx) = mpsc::channel();
        lock(&self.inner.run_loop).commands = Some(tx);
        rx
    }

    pub fn set_run_state(&self, state: RunState) {
        let changed = {
            let mut st = write(&self.inner.status);
            std::mem::replace(&mut st.snapshot.run.state, state) != state
        };
        if changed {
            self.record_status_frame();
        }
    }

    /// This daemon is node `node` of a job of `nnodes`: status carries the job from now on.
    pub fn set_job_node(&self, node: u32, nnodes: u32) {
        write(&self.inner.status).snapshot.job = Some(JobStatus {
            node,
            nnodes,
            view: None,
        });
    }

    pub fn update_run(&self, f: impl FnOnce(&mut RunInfo)) {
        f(&mut write(&self.inner.status).snapshot.run);
    }

    /// Records one optimizer step and streams it to metrics subscribers.
    pub fn publish_metrics(&self, m: StepMetrics) {
        {
            let mut st = write(&self.inner.status);
            let s = &mut st.snapshot;
            s.run.step = m.step;
            s.run.epoch = m.epoch;
            // The job's figures on a node of a job: what the throughput detector judges.
            s.throughput.tokens_per_s = m.judged_tokens_per_s();
            s.throughput.draft_positions_per_s = m.judged_draft_positions_per_s();
            if let (Some(job), Some(view)) = (s.job.as_mut(), &m.job) {
                job.view = Some(view.clone());
            }
            s.throughput.mfu = m.mfu;
            s.last_loss = Some(m.loss);
            if m.tau.is_some() {
                s.last_tau = m.tau;
            }
            if m.tau_tree.is_some() {
                s.last_tau_tree = m.tau_tree.clone();
            }
            if let Some(d) = &m.domino {
                s.last_domino = Some(DominoAcceptance {
                    step: m.step,
                    ts_ms: m.ts_ms,
                    accept_len: d.accept_len,
                    base_accept_len: d.base_accept_len,
                });
            }
            if let Some(d) = &m.dspark {
                s.last_dspark = Some(DsparkAcceptance::from_step(m.step, m.ts_ms, d));
            }
            if let Some(d) = &m.dflash2 {
                s.last_dflash2 = Some(Dflash2Acceptance::from_step(m.step, m.ts_ms, d));
            }
            if let Some(online) = &m.online {
                s.last_online = Some(OnlineEvalStatus {
                    step: m.step,
                    ts_ms: m.ts_ms,
                    acceptance: online.clone(),
                });
            }
            st.last_metrics = Some(m.clone());
        }
        self.publish(Topic::Metrics, Response::Metrics(Box::new(m)));
    }

    /// Baseline and stability come from the throughput detector and the healthy record's
    /// clock, not from a single step.
    pub fn set_throughput_judgement(&self, judgement: ThroughputJudgement) {
        let mut st = write(&self.inner.status);
        let t = &mut st.snapshot.throughput;
        t.baseline_tokens_per_s = judgement.baseline_tokens_per_s;
        t.stable_since_ms = judgement.stable_since_ms;
        t.baseline_source = judgement.baseline_source;
        t.record_clock = judgement.record_clock;
    }

    /// The healthy record this run is judged against, served in status, and the files a
    /// confirmed forget would remove (whether or not they exist yet).
    pub fn set_healthy_record(&self, record: Option<HealthyRecord>, files: Vec<PathBuf>) {
        let mut st = write(&self.inner.status);
        st.snapshot.healthy_record = record.map(Box::new);
        st.healthy_record_files = files;
    }

    /// The healthy record's files that exist now.
    pub fn healthy_record_files(&self) -> Vec<PathBuf> {
        let files = read(&self.inner.status).healthy_record_files.clone();
        files.into_iter().filter(|p| p.is_file()).collect()
    }

    pub fn publish_queue(&self, q: QueueStats) {
        write(&self.inner.status).snapshot.queue = q.clone();
        self.publish(Topic::Metrics, Response::Queue(q));
    }

    /// Hands the run's queues to the telemetry timer (`None`: the topology has no queue).
    pub fn set_queue_monitor(&self, monitor: Option<QueueMonitor>) {
        lock(&self.inner.run_loop).queue_monitor = monitor;
    }

    /// Publishes a fresh reading of the hidden-state queue, if the run has one. The telemetry
    /// timer calls it, so a stalled producer or consumer still shows its depth, bytes and
    /// blocked/starved time while no step completes.
    pub fn publish_queue_reading(&self) -> Option<QueueStats> {
        let stats = lock(&self.inner.run_loop).queue_monitor.as_ref()?.stats();
        self.publish_queue(stats.clone());
        Some(stats)
    }

    pub fn publish_gpus(&self, telemetry: GpuTelemetry) {
        write(&self.inner.status).snapshot.gpus = telemetry.clone();
        self.publish(Topic::Metrics, Response::Gpus { telemetry });
    }

    pub fn set_host(&self, host: HostSample) {
        write(&self.inner.status).snapshot.host = Some(host);
    }

    pub fn set_caches(&self, caches: Vec<CacheState>) {
        write(&self.inner.status).snapshot.caches = caches;
    }

    /// Replaces the alert list; a change of which alerts are active, or of their level, puts a
    /// status frame in the recording, so a replay shows each alert when the operator saw it.
    pub fn set_alerts(&self, alerts: Vec<Alert>) {
        let changed = {
            let mut st = write(&self.inner.status);
            let key = |list: &[Alert]| -> Vec<(String, dflash_shared::events::Severity, i64)> {
                list.iter()
                    .map(|a| (a.detector.clone(), a.level, a.since_ms))
                    .collect()
            };
            let changed = key(&st.snapshot.alerts) != key(&alerts);
            st.snapshot.alerts = alerts;
            changed
        };
        if changed {
            self.record_status_frame();
        }
    }

    /// Writes the current status snapshot to the recording (the sampler also calls it at a
    /// modest cadence), so a replay has the alerts, baseline and state as they were.
    pub fn record_status_frame(&self) {
        if let Some(rec) = &self.inner.recorder {
            let frame = Response::Status(Box::new(self.status_snapshot()));
            lock(rec).record(now_ms(), &frame);
        }
    }

    /// The thresholds the daemon's detectors judge with, served in status so the console
    /// judges memory and the queue with the same ones. The recording gets a status frame
    /// carrying them, so a replay judges as the daemon did.
    pub fn set_detectors(&self, detectors: DetectorsSection) {
        write(&self.inner.status).snapshot.detectors = Some(detectors);
        self.record_status_frame();
    }

    pub fn set_config(&self, config: Arc<Config>) {
        write(&self.inner.environment).config = Some(config);
    }

    /// The environment fingerprint guard rails took at start.
    pub fn set_fingerprint(&self, fingerprint: Fingerprint) {
        write(&self.inner.environment).fingerprint = Some(fingerprint);
    }

    /// The live environment watch's standing differences from the start, and the packages as
    /// they are now (folded into the fingerprint the healthy record is compared with; before
    /// a fingerprint is taken there is nothing to fold them into).
    pub fn set_live_environment(
        &self,
        differences: Vec<String>,
        packages_now: std::collections::BTreeMap<String, String>,
    ) {
        let mut env = write(&self.inner.environment);
        env.drift = differences;
        if let Some(fingerprint) = env.fingerprint.as_mut() {
            fingerprint.python_packages = packages_now;
        }
    }

    pub fn live_environment(&self) -> Vec<String> {
        read(&self.inner.environment).drift.clone()
    }

    /// Lists a checkpoint in status and journals it.
    pub fn add_checkpoint(&self, c: CheckpointInfo) -> Result<Event, JournalError> {
        {
            let mut st = write(&self.inner.status);
            let list = &mut st.snapshot.checkpoints;
            list.push(c.clone());
            let excess = list.len().saturating_sub(CHECKPOINTS_LISTED);
            list.drain(..excess);
        }
        self.record_event(
            Severity::Info,
            EventKind::CheckpointWritten {
                step: c.step,
                path: c.path,
                bytes: c.bytes,
            },
        )
    }

    /// Sets the run's best checkpoint in status (or why there is none), without journaling.
    pub fn set_best_checkpoint(&self, standing: Result<BestCheckpoint, NoBestCheckpoint>) {
        let mut st = write(&self.inner.status);
        let (best, none) = match standing {
            Ok(best) => (Some(best), None),
            Err(why) => (None, Some(why)),
        };
        st.snapshot.best_checkpoint = best;
        st.snapshot.no_best_checkpoint = none;
    }

    /// A checkpoint became the run's best: status names it and the journal records it.
    pub fn add_best_checkpoint(&self, best: BestCheckpoint) -> Result<Event, JournalError> {
        self.set_best_checkpoint(Ok(best.clone()));
        self.record_event(
            Severity::Info,
            EventKind::BestCheckpoint {
                step: best.step,
                tau_tree: best.tau_tree,
                budget: best.budget,
                path: best.path,
            },
        )
    }

    /// Replaces the listed checkpoints without journaling: what is on disk at start, or the
    /// list after old checkpoints were pruned.
    pub fn set_checkpoints(&self, mut list: Vec<CheckpointInfo>) {
        list.sort_by_key(|c| c.step);
        let excess = list.len().saturating_sub(CHECKPOINTS_LISTED);
        list.drain(..excess);
        write(&self.inner.status).snapshot.checkpoints = list;
    }

    /// Appends to the journal (durably) and streams the event to subscribers.
    pub fn record_event(&self, severity: Severity, kind: EventKind) -> Result<Event, JournalError> {
        let event = lock(&self.inner.journal).append(severity, kind)?;
        self.publish(Topic::Events, Response::Event(Box::new(event.clone())));
        Ok(event)
    }

    /// Journals an event; a journal failure is logged rather than propagated. For callers
    /// (connection handlers, samplers) that must go on regardless.
    pub fn record_event_logged(&self, severity: Severity, kind: EventKind) -> Option<Event> {
        match self.record_event(severity, kind) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::error!(error = %e, "journal append failed");
                None
            }
        }
    }

    /// Journals an operator request the daemon refused (a request, confirmation or cancel),
    /// through the per-uid [`RefusalThrottle`]: a flood of refusals becomes its first lines and
    /// one summary, not one fsynced line each.
    pub fn record_refused_request(&self, uid: u32, request: String, action_id: Option<String>) {
        let now = now_ms();
        let (summaries, verdict) = {
            let throttle = &mut lock(&self.inner.requests).refusals;
            (
                throttle.take_summaries(now, false),
                throttle.admit(uid, now, &request),
            )
        };
        self.journal_refusal_summaries(summaries);
        let request = match verdict {
            Verdict::Journal => request,
            Verdict::JournalAndThrottle { window_ends_ms } => format!(
                "{request}; uid {uid} has had {REFUSALS_JOURNALED_PER_WINDOW} refusals \
                 journaled in this minute: until {window_ends_ms} ms further ones are counted, \
                 and one line will say how many"
            ),
            Verdict::Count => return,
        };
        self.record_event_logged(
            Severity::Info,
            EventKind::OperatorRequest {
                uid,
                request,
                action_id,
            },
        );
    }

    fn journal_refusal_summaries(&self, summaries: Vec<refusal_throttle::Summary>) {
        self.journal_summaries(summaries, "refused requests");
    }

    fn journal_summaries(&self, summaries: Vec<refusal_throttle::Summary>, what: &str) {
        for s in summaries {
            self.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid: s.uid,
                    request: s.text_of(what),
                    action_id: None,
                },
            );
        }
    }

    /// Journals a granted filing of `action_id`, or keeps its line back until it is confirmed
    /// when `uid` has filed many within the minute ([`WithdrawnRequests`]: request/cancel
    /// cycles must not grow the journal without bound).
    pub fn record_filed_request(&self, uid: u32, request: String, action_id: String) {
        let now = now_ms();
        let (summaries, filing) = {
            let mut requests = lock(&self.inner.requests);
            let Requests {
                pending, withdrawn, ..
            } = &mut *requests;
            let pending: Vec<String> = pending.list().into_iter().map(|p| p.id).collect();
            (
                withdrawn.take_summaries(now, false),
                withdrawn.filed(uid, now, &action_id, &request, |id| {
                    pending.iter().any(|p| p == id)
                }),
            )
        };
        self.journal_summaries(summaries, WITHDRAWN);
        if let Filing::Journal(request) = filing {
            self.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid,
                    request,
                    action_id: Some(action_id),
                },
            );
        }
    }

    /// `action_id` was cancelled or expired unconfirmed (`how` says which): whether its line
    /// is to be journaled (its filing was) or it is only counted (its filing was kept back).
    pub fn withdrawal_gets_a_line(&self, action_id: &str, how: &str) -> bool {
        lock(&self.inner.requests)
            .withdrawn
            .withdrawn(now_ms(), action_id, how)
    }

    /// Before a granted confirmation of `action_id` is journaled: its filing, if that was
    /// kept back, so every confirmed action has both lines.
    pub fn journal_filing_before_confirmation(&self, action_id: &str) {
        let deferred = lock(&self.inner.requests).withdrawn.confirmed(action_id);
        if let Some(d) = deferred {
            self.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid: d.uid,
                    request: d.text(),
                    action_id: Some(action_id.to_string()),
                },
            );
        }
    }

    pub fn publish(&self, topic: Topic, frame: Response) {
        if let Some(rec) = &self.inner.recorder {
            if Recorder::records(&frame) {
                lock(rec).record(now_ms(), &frame);
            }
        }
        self.inner.bus.publish(topic, frame);
    }

    // ----- control plane side --------------------------------------------------------------

    pub fn status_snapshot(&self) -> StatusSnapshot {
        let mut s = read(&self.inner.status).snapshot.clone();
        s.pending_actions = self.pending_list();
        s
    }

    fn pending_list(&self) -> Vec<dflash_shared::actions::PendingAction> {
        lock(&self.inner.requests).pending.list()
    }

    /// The status snapshot and the last published metrics line, read together so a scrape
    /// never pairs one step's loss with another step's status.
    pub fn status_and_last_metrics(&self) -> (StatusSnapshot, Option<StepMetrics>) {
        let (mut s, m) = {
            let st = read(&self.inner.status);
            (st.snapshot.clone(), st.last_metrics.clone())
        };
        s.pending_actions = self.pending_list();
        (s, m)
    }

    pub fn config(&self) -> Option<Arc<Config>> {
        read(&self.inner.environment).config.clone()
    }

    /// The environment as the daemon knows it now: the start's fingerprint with the packages
    /// the live watch last saw. `None` before guard rails take it.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        read(&self.inner.environment).fingerprint.clone()
    }

    pub fn gpus(&self) -> GpuTelemetry {
        read(&self.inner.status).snapshot.gpus.clone()
    }

    pub fn caches(&self) -> Vec<CacheState> {
        read(&self.inner.status).snapshot.caches.clone()
    }

    pub fn checkpoints(&self) -> Vec<CheckpointInfo> {
        read(&self.inner.status).snapshot.checkpoints.clone()
    }

    pub fn state_view(&self) -> StateView {
        let unlocked_keys = self.unlocked_keys();
        let healthy_record_files = self
            .healthy_record_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let st = read(&self.inner.status);
        let s = &st.snapshot;
        StateView {
            now_ms: now_ms(),
            run_state: s.run.state,
            step: s.run.step,
            last_checkpoint: s.checkpoints.last().cloned(),
            tokens_per_s: st
                .last_metrics
                .is_some()
                .then_some(s.throughput.tokens_per_s),
            stable_since_ms: s.throughput.stable_since_ms,
            caches: s.caches.clone(),
            unlocked_keys,
            healthy_record: s.healthy_record.as_deref().map(|r| HealthyRecordView {
                tokens_per_s: r.throughput.tokens_per_s,
                recorded_ms: r.recorded_ms,
                run_name: r.run_name.clone(),
                step: r.step,
            }),
            healthy_record_files,
        }
    }

    pub fn with_journal<T>(&self, f: impl FnOnce(&mut Journal) -> T) -> T {
        f(&mut lock(&self.inner.journal))
    }

    pub fn with_pending<T>(&self, f: impl FnOnce(&mut PendingActions) -> T) -> T {
        f(&mut lock(&self.inner.requests).pending)
    }

    pub fn unlock_key(&self, key: &str) {
        let keys = &mut lock(&self.inner.requests).unlocked_keys;
        if !keys.iter().any(|k| k == key) {
            keys.push(key.to_string());
        }
    }

    /// Keys an operator unlocked in this daemon's lifetime; resume logic consults this.
    pub fn unlocked_keys(&self) -> Vec<String> {
        lock(&self.inner.requests).unlocked_keys.clone()
    }

    /// Hands a command to the run loop; `Err` returns it when no run loop is attached.
    pub fn send_command(&self, cmd: RunCommand) -> Result<(), RunCommand> {
        let link = lock(&self.inner.run_loop);
        match link.commands.as_ref() {
            Some(tx) => tx.send(cmd).map_err(|e| e.0),
            None => Err(cmd),
        }
    }

    // ----- shutdown ------------------------------------------------------------------------

    /// Tells every part of the daemon to wind down. Idempotent; the first reason is kept.
    pub fn request_shutdown(&self, reason: impl Into<String>) {
        // Refusals still being counted get their summary line before the daemon goes.
        let (refused, withdrawn) = {
            let mut requests = lock(&self.inner.requests);
            let now = now_ms();
            (
                requests.refusals.take_summaries(now, true),
                requests.withdrawn.take_summaries(now, true),
            )
        };
        self.journal_refusal_summaries(refused);
        self.journal_summaries(withdrawn, WITHDRAWN);
        // A later request finds the first reason set and leaves it.
        let _ = self.inner.shutdown.reason.set(reason.into());
        self.inner.shutdown.requested.store(true, Ordering::SeqCst);
        let _ = self.inner.shutdown.tx.send(());
    }

    pub fn is_shutdown_requested(&self) -> bool {
        self.inner.shutdown.requested.load(Ordering::SeqCst)
    }

    pub fn shutdown_reason(&self) -> Option<String> {
        self.inner.shutdown.reason.get().cloned()
    }

    /// A [`Shutdown`] listener; it also fires if shutdown was requested before subscribing.
    pub fn shutdown_listener(&self) -> Shutdown {
        Shutdown {
            rx: self.inner.shutdown.tx.subscribe(),
            handle: self.clone(),
        }
    }
}

/// Waits for the shutdown broadcast (mini-redis style).
#[derive(Debug)]
pub struct Shutdown {
    rx: broadcast::Receiver<()>,
    handle: RunHandle,
}

impl Shutdown {
    pub fn is_shutdown(&self) -> bool {
        self.handle.is_shutdown_requested()
    }

    /// Resolves once shutdown is requested (immediately if it already was).
    pub async fn recv(&mut self) {
        if self.is_shutdown() {
            return;
        }
        // Lagged or Closed both mean a shutdown was sent or the daemon is gone.
        let _ = self.rx.recv().await;
    }
}

// Poisoning only means another thread panicked mid-update; the data is plain telemetry and
// still usable, and refusing to serve status after a worker panic would hide the failure.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "handle_tests.rs"]
mod tests;
