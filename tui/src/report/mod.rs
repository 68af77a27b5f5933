//! The status checkpoint: a pure function of the daemon's snapshot, its journal and its config.
//! `dflash-tui status` prints it as markdown (for people and for handing a run over) or JSON.
mod markdown;
mod prose;
pub mod timeline;

use std::collections::BTreeMap;

use dflash_shared::actions::PendingAction;
use dflash_shared::best_checkpoint::BestCheckpoint;
use dflash_shared::events::{Event, EventKind};
use dflash_shared::format::format_si;
use dflash_shared::health;
use dflash_shared::metrics::{
    CacheState, GpuSample, GpuTelemetry, HostSample, TimestampMs, TreeOracleTau,
};
use dflash_shared::status::{
    head_name, CheckpointInfo, DominoAcceptance, DsparkAcceptance, RunObjective, StatusSnapshot,
};
use serde::Serialize;

use crate::app::alerts::{self, ActiveAlerts, ThroughputNow};
use crate::app::journal::Journal;
use crate::fmt::{self, DisplayClock};
use crate::paths::DaemonFiles;

pub use markdown::render as render_markdown;

/// Everything the report is built from.
pub struct ReportInput<'a> {
    /// `None` when the daemon could not be reached; the report then rests on the journal.
    pub snapshot: Option<&'a StatusSnapshot>,
    pub events: &'a [Event],
    pub config: Option<&'a serde_json::Value>,
    pub files: &'a DaemonFiles,
    pub daemon_error: Option<String>,
    pub now_ms: TimestampMs,
    pub clock: DisplayClock,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    pub generated_at: String,
    pub daemon: Daemon,
    pub goal: String,
    pub run: Run,
    pub throughput: Throughput,
    pub acceptance: Acceptance,
    pub gpus: Vec<GpuSample>,
    /// Why `gpus` is empty, when NVML gave nothing.
    pub gpus_unavailable: Option<String>,
    pub host: Option<HostSample>,
    pub queue: Queue,
    pub caches: Vec<CacheState>,
    /// Per missing cache, who deleted it ("deleted outside dflash; no confirmation on
    /// record"), by cache name.
    pub cache_notes: Vec<(String, String)>,
    pub alerts: Vec<AlertReport>,
    pub pending_actions: Vec<PendingAction>,
    pub checkpoints: Vec<CheckpointInfo>,
    pub constraints: Vec<String>,
    pub progress: Progress,
    pub key_decisions: Vec<timeline::Entry>,
    /// Operator requests that decided nothing: filed and never confirmed (cancelled,
    /// expired, or still waiting), or refused.
    pub unconfirmed_requests: Vec<String>,
    pub next_steps: Vec<String>,
    pub timeline: Vec<timeline::Entry>,
    pub files: Files,
    /// The healthy record the daemon judges the run against, when it has one.
    pub healthy_record: Option<dflash_shared::health::healthy_record::HealthyRecord>,
    /// That record in one sentence, and how to forget it.
    pub healthy_record_summary: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Daemon {
    pub reachable: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    pub name: Option<String>,
    /// The daemon's run state, or "unknown (daemon unreachable)".
    pub state: String,
    pub step: Option<u64>,
    pub epoch: Option<u32>,
    pub epochs: Option<u32>,
    pub total_steps: Option<u64>,
    pub eta: Option<String>,
    /// "D-PACE (α 0.5)", "DFlash"; `None` when the daemon did not report it.
    pub objective: Option<String>,
    /// "DFlash" or "Domino"; `None` when the daemon did not report it.
    pub drafter_head: Option<String>,
    /// A node of a multi-node job: its place, every node's figures and the straggler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<dflash_shared::status::JobStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Throughput {
    pub tokens_per_s: Option<f64>,
    /// Kept anchors × block size per second.
    pub draft_positions_per_s: Option<f64>,
    /// Model FLOPs utilisation; `None` where a device's peak is unknown.
    pub mfu: Option<f64>,
    pub baseline_tokens_per_s: Option<f64>,
    pub share_of_baseline: Option<f64>,
    pub stable_since: Option<String>,
    /// Where the baseline came from when the daemon did not learn it itself ("this recipe ran
    /// at 21.5K tok/s here on …", the pinned figure).
    pub baseline_source: Option<String>,
    /// When the healthy record is first written if the healthy stretch holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_record_due: Option<String>,
    /// When this daemon last wrote the healthy record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_record_written: Option<String>,
    /// A drop below the Warn line is being timed (no alert yet; the record waits).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub drop_timed: bool,
}

/// Offline τ and, beside it, the newest online evaluation: the train-versus-serve gap in one
/// place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Acceptance {
    /// The last held-out (offline) τ.
    pub offline_tau: Option<f64>,
    /// The same evaluation's DDTree oracle τ at the budget the drafter is served with: the tree
    /// figure beside `offline_tau`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offline_serve_tree: Option<ServeTreeTau>,
    /// That evaluation's DDTree oracle τ by budget (the metrics line's
    /// `tau_tree_oracle_<budget>`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub offline_tree_oracle: BTreeMap<usize, f64>,
    pub online: Option<OnlineReport>,
    /// A Domino run's newest training-batch acceptance, base and corrected.
    pub domino: Option<DominoAcceptance>,
    /// A DSpark run's newest training-batch acceptance, with and without its Markov head, and
    /// its confidence head's calibration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dspark: Option<DsparkAcceptance>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OnlineReport {
    pub step: u64,
    pub at: String,
    /// `chain` first, then `ddtree_<budget>` by budget, as `dflashd eval --online` names them
    /// (the metrics line's `online_tau_chain`, `online_tau_ddtree_<budget>`).
    pub methods: Vec<MethodTau>,
    /// The DDTree τ at the budget the drafter is served with, when that budget was decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serve_tree: Option<ServeTreeTau>,
    /// The offline τ it was compared with, when known.
    pub offline_tau: Option<f64>,
    /// `(offline − online chain) / offline`.
    pub gap_fraction: Option<f64>,
    pub prompts: usize,
    pub seconds: f64,
}

/// A tree τ at the budget the drafter is served with (`training.serve_tree_budget`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServeTreeTau {
    pub budget: usize,
    pub tau: f64,
}

impl ServeTreeTau {
    fn of((budget, tau): (usize, f64)) -> Self {
        ServeTreeTau { budget, tau }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodTau {
    pub method: String,
    pub tau: f64,
    /// A Domino drafter's τ for the same method drafting from the LM head alone (the metrics
    /// line's `online_base_tau_*`, `dflashd eval --online`'s `base_tau`); absent for DFlash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_tau: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Queue {
    pub depth: Option<usize>,
    pub capacity: Option<usize>,
    pub low_watermark: Option<usize>,
    pub high_watermark: Option<usize>,
    pub bytes_resident: Option<u64>,
    pub bound_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlertReport {
    pub detector: String,
    pub level: dflash_shared::events::Severity,
    pub since: String,
    pub message: String,
    /// "4.3K tok/s, Crit since 21:03 (baseline 21.5K)"
    pub headline: String,
    /// The sentence the console shows: what, since when, and what changed just before.
    pub explanation: String,
    /// What differs between the run's healthy record and now.
    pub since_healthy: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Progress {
    pub done: Vec<String>,
    pub in_progress: Vec<String>,
    pub blocked: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Files {
    pub config: Option<String>,
    pub run_dir: Option<String>,
    pub latest_checkpoint: Option<String>,
    pub checkpoints: Vec<String>,
    /// The run's best checkpoint (online DDTree τ at the serving budget): the daemon's, or with
    /// the daemon down the journal's last.
    pub best_checkpoint: Option<BestCheckpoint>,
    /// Why there is none, when the daemon says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_best_checkpoint: Option<String>,
    pub journal: String,
    pub logs: String,
    pub data: Vec<String>,
}

pub fn build(input: &ReportInput) -> StatusReport {
    let snapshot = input.snapshot;
    let mut journal = Journal::default();
    journal.extend(input.events.iter().cloned());
    let events = journal.events();

    let run = run_section(input, events);
    let mut throughput = throughput_section(input);
    let alerts = alert_section(input, &journal, &throughput);
    // No "stable since" while a throughput alert is active: the sections agree with the alerts.
    if alerts
        .iter()
        .any(|a| alerts::is_throughput_detector(&a.detector))
    {
        throughput.stable_since = None;
    }
    let (gpus, gpus_unavailable) = match snapshot.map(|s| &s.gpus) {
        Some(GpuTelemetry::Available { gpus }) => (gpus.clone(), None),
        Some(GpuTelemetry::Unavailable { reason }) => (Vec::new(), Some(reason.clone())),
        None => (Vec::new(), Some("daemon unreachable".into())),
    };
    let checkpoints = checkpoint_list(snapshot, events);
    let queue = queue_section(snapshot);
    let files = files_section(input, &checkpoints);
    let mut report = StatusReport {
        generated_at: fmt::rfc3339(input.now_ms),
        daemon: Daemon {
            reachable: snapshot.is_some(),
            error: input.daemon_error.clone(),
        },
        goal: String::new(),
        run,
        throughput,
        acceptance: acceptance_section(snapshot),
        gpus,
        gpus_unavailable,
        host: snapshot.and_then(|s| s.host.clone()),
        queue,
        caches: snapshot.map(|s| s.caches.clone()).unwrap_or_default(),
        cache_notes: Vec::new(),
        alerts,
        pending_actions: snapshot
            .map(|s| s.pending_actions.clone())
            .unwrap_or_default(),
        checkpoints,
        constraints: Vec::new(),
        progress: Progress::default(),
        key_decisions: timeline::decisions(events),
        unconfirmed_requests: timeline::unconfirmed_requests(events, input.clock),
        next_steps: Vec::new(),
        timeline: timeline::changes(events),
        healthy_record: snapshot.and_then(|s| s.healthy_record.as_deref().cloned()),
        healthy_record_summary: snapshot
            .and_then(|s| s.healthy_record.as_deref())
            .map(|r| healthy_record_summary(r, input.clock)),
        files,
    };
    report.goal = prose::goal(&report);
    report.constraints = prose::constraints(&report, input.config);
    report.progress = prose::progress(&report, events, input.clock);
    let healthy = prose::healthy_environment(
        snapshot.and_then(|s| s.healthy_record.as_deref()),
        events,
        input.clock,
    );
    report.next_steps = prose::next_steps(&report, events, &healthy);
    report.cache_notes = cache_notes(&report.caches, events);
    report
}

/// "Healthy record: 21.5K tok/s and 3.1K draft positions/s over 240 healthy steps, recorded
/// 2026-03-14 20:40 by run qwen-a at step 30,000 (recipe 3fa9c2d1e0b47a65, inline on cpu); …"
fn healthy_record_summary(
    r: &dflash_shared::health::healthy_record::HealthyRecord,
    clock: DisplayClock,
) -> String {
    let positions = if r.throughput.draft_positions_per_s > 0.0 {
        format!(
            " and {} draft positions/s",
            format_si(r.throughput.draft_positions_per_s)
        )
    } else {
        String::new()
    };
    format!(
        "Healthy record: {} tok/s{positions} over {} healthy steps, recorded {} by run {} at \
         step {} (recipe {}, {}); throughput is judged against it. To forget it (a slowdown \
         that is on purpose): F in `dflash-tui attach`, with typed confirmation.",
        format_si(r.throughput.tokens_per_s),
        r.throughput.samples,
        clock.date_hm(r.recorded_ms),
        r.run_name,
        fmt::thousands(r.step),
        r.recipe,
        r.topology
    )
}

/// For each cache that is missing now, or whose last journaled change is a deletion: whose
/// deletion the journal records (`timeline::deletion_origin`).
fn cache_notes(caches: &[CacheState], events: &[Event]) -> Vec<(String, String)> {
    let mut names: Vec<&str> = caches.iter().map(|c| c.name.as_str()).collect();
    for e in events {
        if let EventKind::CacheChanged { name, .. } = &e.kind {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let deletion = events.iter().rev().find(|e| {
                matches!(&e.kind, EventKind::CacheChanged { name: n, change, .. }
                    if n == name && change.starts_with("deleted"))
            })?;
            let origin = timeline::deletion_origin(events, deletion)?;
            Some((
                name.to_string(),
                match origin {
                    timeline::DeletionOrigin::Outside => format!(
                        "deleted outside dflash at {}; no confirmation on record",
                        fmt::rfc3339(deletion.ts_ms)
                    ),
                    confirmed => format!(
                        "deleted at {} {}",
                        fmt::rfc3339(deletion.ts_ms),
                        confirmed.words()
                    ),
                },
            ))
        })
        .collect()
}

fn run_section(input: &ReportInput, events: &[Event]) -> Run {
    match input.snapshot {
        Some(s) => Run {
            name: Some(s.run.name.clone()),
            state: format!("{:?}", s.run.state).to_lowercase(),
            step: Some(s.run.step),
            epoch: Some(s.run.epoch),
            epochs: Some(s.run.epochs),
            total_steps: Some(s.run.total_steps),
            eta: s.run.eta_ms.map(fmt::rfc3339),
            objective: s.run.objective.as_ref().map(RunObjective::words),
            drafter_head: s.run.drafter_head.map(|h| head_name(h).to_string()),
            job: s.job.clone(),
        },
        None => {
            let name = events.iter().rev().find_map(|e| match &e.kind {
                EventKind::RunStarted { run_name, .. } => Some(run_name.clone()),
                _ => None,
            });
            let step = events.iter().rev().find_map(|e| match &e.kind {
                EventKind::CheckpointWritten { step, .. } => Some(*step),
                _ => None,
            });
            Run {
                name,
                state: offline_state(events),
                step,
                epoch: None,
                epochs: None,
                total_steps: None,
                eta: None,
                objective: None,
                drafter_head: None,
                job: None,
            }
        }
    }
}

/// What the journal says of a run whose daemon does not answer: how it ended (the rule the
/// console shares, `dflash_shared::run_end`). A run that trained to the end is `finished`, not
/// something to restart.
fn offline_state(events: &[Event]) -> String {
    use dflash_shared::run_end::{run_ending, EndKind};
    match run_ending(events) {
        Some(e) if e.kind == EndKind::Finished => "finished".into(),
        Some(e) => format!("{} ({})", e.kind.word(), e.reason),
        None => "unknown (daemon unreachable)".into(),
    }
}

fn throughput_section(input: &ReportInput) -> Throughput {
    let Some(s) = input.snapshot else {
        return Throughput {
            tokens_per_s: None,
            draft_positions_per_s: None,
            mfu: None,
            baseline_tokens_per_s: None,
            share_of_baseline: None,
            stable_since: None,
            baseline_source: None,
            healthy_record_due: None,
            healthy_record_written: None,
            drop_timed: false,
        };
    };
    let t = &s.throughput;
    let clock = t.record_clock.as_ref();
    Throughput {
        tokens_per_s: Some(t.tokens_per_s),
        draft_positions_per_s: Some(t.draft_positions_per_s),
        mfu: t.mfu,
        baseline_tokens_per_s: t.baseline_tokens_per_s,
        share_of_baseline: t
            .baseline_tokens_per_s
            .filter(|b| *b > 0.0)
            .map(|b| t.tokens_per_s / b),
        stable_since: t.stable_since_ms.map(fmt::rfc3339),
        baseline_source: t.baseline_source.clone(),
        healthy_record_due: clock.and_then(|c| c.due_ms).map(fmt::rfc3339),
        healthy_record_written: clock.and_then(|c| c.written_ms).map(fmt::rfc3339),
        drop_timed: clock.is_some_and(|c| c.drop_timed),
    }
}

fn acceptance_section(snapshot: Option<&StatusSnapshot>) -> Acceptance {
    let online = snapshot.and_then(|s| s.last_online.as_ref()).map(|o| {
        let a = &o.acceptance;
        let base: BTreeMap<String, f64> = a.base_methods().into_iter().collect();
        OnlineReport {
            step: o.step,
            at: fmt::rfc3339(o.ts_ms),
            methods: a
                .methods()
                .into_iter()
                .map(|(method, tau)| MethodTau {
                    base_tau: base.get(&method).copied(),
                    method,
                    tau,
                })
                .collect(),
            serve_tree: a.serve_tau_ddtree().map(ServeTreeTau::of),
            offline_tau: a.offline_tau,
            gap_fraction: a.gap_fraction(),
            prompts: a.prompts,
            seconds: a.seconds,
        }
    });
    let tree = snapshot.and_then(|s| s.last_tau_tree.as_ref());
    Acceptance {
        offline_tau: snapshot.and_then(|s| s.last_tau),
        offline_serve_tree: tree
            .and_then(TreeOracleTau::at_serve_budget)
            .map(ServeTreeTau::of),
        offline_tree_oracle: tree.map_or_else(BTreeMap::new, |t| t.by_budget.clone()),
        online,
        domino: snapshot.and_then(|s| s.last_domino),
        dspark: snapshot.and_then(|s| s.last_dspark),
    }
}

fn alert_section(
    input: &ReportInput,
    journal: &Journal,
    throughput: &Throughput,
) -> Vec<AlertReport> {
    let mut active = ActiveAlerts::default();
    match input.snapshot {
        Some(s) => active.replace_all(&s.alerts),
        // Without the daemon, the journal's regression events say what was active.
        None => journal.events().iter().for_each(|e| active.apply_event(e)),
    }
    let now = ThroughputNow {
        tokens_per_s: throughput.tokens_per_s,
        baseline_tokens_per_s: throughput.baseline_tokens_per_s,
    };
    active
        .sorted()
        .into_iter()
        .map(|a| {
            let explained = alerts::explain(a, now, journal, input.clock);
            AlertReport {
                detector: a.detector.clone(),
                level: a.level,
                since: fmt::rfc3339(a.since_ms),
                message: a.message.clone(),
                headline: explained.head.clone(),
                explanation: explained.sentence(),
                since_healthy: a.since_healthy.clone(),
            }
        })
        .collect()
}

fn checkpoint_list(snapshot: Option<&StatusSnapshot>, events: &[Event]) -> Vec<CheckpointInfo> {
    let mut list: Vec<CheckpointInfo> = match snapshot {
        Some(s) => s.checkpoints.clone(),
        None => events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::CheckpointWritten { step, path, bytes } => Some(CheckpointInfo {
                    step: *step,
                    path: path.clone(),
                    written_ms: e.ts_ms,
                    bytes: *bytes,
                }),
                _ => None,
            })
            .collect(),
    };
    list.sort_by_key(|c| c.step);
    list
}

/// The daemon's best checkpoint, or with the daemon down the last one the journal records.
fn best_checkpoint(snapshot: Option<&StatusSnapshot>, events: &[Event]) -> Option<BestCheckpoint> {
    match snapshot {
        Some(s) => s.best_checkpoint.clone(),
        None => events.iter().rev().find_map(|e| match &e.kind {
            EventKind::BestCheckpoint {
                step,
                tau_tree,
                budget,
                path,
            } => Some(BestCheckpoint {
                step: *step,
                tau_tree: *tau_tree,
                budget: *budget,
                path: path.clone(),
            }),
            _ => None,
        }),
    }
}

fn queue_section(snapshot: Option<&StatusSnapshot>) -> Queue {
    match snapshot.map(|s| &s.queue) {
        Some(q) => Queue {
            depth: Some(q.depth),
            capacity: Some(q.capacity),
            low_watermark: Some(q.low_watermark),
            high_watermark: Some(q.high_watermark),
            bytes_resident: Some(q.bytes_resident),
            bound_by: match snapshot.and_then(|s| {
                if q.capacity == 0 {
                    return Some(crate::fmt::INLINE_QUEUE_NOTE.to_string());
                }
                s.alerts
                    .iter()
                    .find(|a| a.detector == health::queue::DETECTOR)
                    .map(|a| a.message.clone())
            }) {
                Some(message) => message,
                None => "no queue alert; which side bounds the run needs a time window \
                         (`dflash-tui attach`, view 3)"
                    .into(),
            },
        },
        None => Queue {
            depth: None,
            capacity: None,
            low_watermark: None,
            high_watermark: None,
            bytes_resident: None,
            bound_by: "unknown (daemon unreachable)".into(),
        },
    }
}

fn files_section(input: &ReportInput, checkpoints: &[CheckpointInfo]) -> Files {
    let run = input.snapshot.map(|s| &s.run);
    Files {
        config: run.and_then(|r| r.config_path.clone()),
        run_dir: Some(match run {
            Some(r) => r.run_dir.clone(),
            None => input.files.run_dir.display().to_string(),
        }),
        latest_checkpoint: checkpoints.last().map(|c| c.path.clone()),
        checkpoints: checkpoints.iter().map(|c| c.path.clone()).collect(),
        best_checkpoint: best_checkpoint(input.snapshot, input.events),
        no_best_checkpoint: input
            .snapshot
            .and_then(|s| s.no_best_checkpoint)
            .map(|why| why.words()),
        journal: match run {
            Some(r) => dflash_shared::run_dir::journal_path(std::path::Path::new(&r.run_dir))
                .display()
                .to_string(),
            None => input.files.journal.display().to_string(),
        },
        logs: input.files.logs_dir.display().to_string(),
        data: input.config.map(prose::data_paths).unwrap_or_default(),
    }
}
