//! The daemon's state as one snapshot: what `status` queries return and consoles render.
use serde::{Deserialize, Serialize};

use crate::actions::PendingAction;
use crate::best_checkpoint::{BestCheckpoint, NoBestCheckpoint};
use crate::config::{DetectorsSection, DpaceNormalization, DrafterHead, Objective};
use crate::health::healthy_record::HealthyRecord;
use crate::metrics::{
    CacheState, GpuTelemetry, HostSample, OnlineAcceptance, QueueStats, TimestampMs, TreeOracleTau,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Starting,
    WarmingUp,
    Training,
    Evaluating,
    Checkpointing,
    Paused,
    Stopping,
    Finished,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub name: String,
    pub state: RunState,
    pub step: u64,
    pub total_steps: u64,
    /// The epoch in progress, counted from 1 (0 before the run has a trainer).
    pub epoch: u32,
    pub epochs: u32,
    pub started_ms: TimestampMs,
    pub eta_ms: Option<TimestampMs>,
    pub run_dir: String,
    pub config_path: Option<String>,
    /// The loss the run trains with, from its config. `None` from a daemon older than this
    /// field, one that has not built its trainer yet, or one whose objective this build does
    /// not know: the console then says it is unknown.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub objective: Option<RunObjective>,
    /// The drafter's head (`drafter.head`), from its config; `None` as for `objective`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub drafter_head: Option<DrafterHead>,
}

/// `training.objective` and, for D-PACE, its α and normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunObjective {
    pub objective: Objective,
    /// `training.dpace_alpha`; `None` for DFlash, whose loss has no α.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpace_alpha: Option<f64>,
    /// `training.dpace_normalization`; `None` off D-PACE, and from a daemon that does not
    /// report it (or reports one this build does not know).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub dpace_normalization: Option<DpaceNormalization>,
}

impl RunObjective {
    /// The α is kept only where the objective reads it.
    pub fn new(objective: Objective, dpace_alpha: f64) -> Self {
        let dpace_alpha = (objective == Objective::Dpace).then_some(dpace_alpha);
        RunObjective {
            objective,
            dpace_alpha,
            dpace_normalization: None,
        }
    }

    /// The same with D-PACE's normalisation, kept only where the objective reads it.
    pub fn with_dpace_normalization(self, normalization: DpaceNormalization) -> Self {
        RunObjective {
            dpace_normalization: (self.objective == Objective::Dpace).then_some(normalization),
            ..self
        }
    }

    /// "DFlash", "D-PACE (α 0.5)", and D-PACE's normalisation where it is not the default:
    /// "D-PACE (α 0.5, normalised by weight_sum)".
    pub fn words(&self) -> String {
        let normalised = match self.dpace_normalization {
            Some(n) if !n.is_default() => format!(", normalised by {}", n.as_str()),
            _ => String::new(),
        };
        match (self.objective, self.dpace_alpha) {
            (Objective::Dflash, _) => "DFlash".into(),
            (Objective::Dpace, Some(alpha)) => format!("D-PACE (α {alpha}{normalised})"),
            (Objective::Dpace, None) => format!("D-PACE (α unknown{normalised})"),
            (Objective::Tree, _) => "tree (DDTree acceptance)".into(),
        }
    }
}

/// "objective: D-PACE (α 0.5)"; "objective: unknown" from a daemon that does not say.
pub fn objective_words(objective: Option<&RunObjective>) -> String {
    let what = objective.map_or_else(
        || "unknown (the daemon did not report it)".to_string(),
        RunObjective::words,
    );
    format!("objective: {what}")
}

/// "DFlash", "Domino", "DSpark", "DFlash2": the drafter head by its paper's name.
pub fn head_name(head: DrafterHead) -> &'static str {
    match head {
        DrafterHead::Dflash => "DFlash",
        DrafterHead::Domino => "Domino",
        DrafterHead::Dspark => "DSpark",
        DrafterHead::Dflash2 => "DFlash2",
    }
}

/// A Domino drafter's acceptance on its training batch at one step, as its metrics line
/// reports it (SpecForge's `accept_len` and `base_accept_len`: 1 + the leading slots whose
/// argmax is the label, teacher-forced, from the corrected and from the LM head's logits).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DominoAcceptance {
    pub step: u64,
    pub ts_ms: TimestampMs,
    /// `accept_len`: from the corrected logits.
    pub accept_len: f64,
    /// `base_accept_len`: from the LM head's logits alone.
    pub base_accept_len: f64,
}

impl DominoAcceptance {
    /// "acceptance: base 2.31 → final 2.87 (Domino correction +0.56)".
    pub fn words(&self) -> String {
        let (base, last, correction) = self.shown();
        format!("acceptance: base {base:.2} → final {last:.2} (Domino correction {correction:+.2})")
    }

    /// "base 2.31 → final 2.87 (+0.56)", for a narrow panel.
    pub fn short_words(&self) -> String {
        let (base, last, correction) = self.shown();
        format!("base {base:.2} → final {last:.2} ({correction:+.2})")
    }

    /// Base, final and the correction as shown: the correction is the difference of the
    /// two rounded figures, so the line adds up.
    fn shown(&self) -> (f64, f64, f64) {
        let (base, last) = (round2(self.base_accept_len), round2(self.accept_len));
        (base, last, last - base)
    }
}

/// A DSpark drafter's acceptance on its training batch at one step (SpecForge's
/// `tau_probabilistic`, from the Markov-corrected logits and from the LM head's alone) and how
/// well its confidence head predicts each slot's acceptance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DsparkAcceptance {
    pub step: u64,
    pub ts_ms: TimestampMs,
    /// `tau_probabilistic` from the corrected logits.
    pub tau: f64,
    /// The same with the Markov head off.
    pub base_tau: f64,
    /// Mean acceptance probability `a` of the step's slots.
    pub acceptance_mean: f64,
    /// Mean σ(confidence logit); `None` without a confidence head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_mean: Option<f64>,
    /// Mean |σ(confidence logit) − a|; `None` without a confidence head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_abs_error: Option<f64>,
}

impl DsparkAcceptance {
    /// The figures of a step's metrics line.
    pub fn from_step(step: u64, ts_ms: TimestampMs, m: &crate::metrics::DsparkStepMetrics) -> Self {
        Self {
            step,
            ts_ms,
            tau: m.tau_probabilistic,
            base_tau: m.base_tau_probabilistic,
            acceptance_mean: m.acceptance_mean,
            confidence_mean: m.confidence_mean,
            confidence_abs_error: m.confidence_abs_error,
        }
    }

    /// "τ base 2.31 → Markov 2.87 (+0.56)": the head's gain is the difference of the two
    /// rounded figures, so the line adds up.
    pub fn acceptance_words(&self) -> String {
        let (base, last) = (round2(self.base_tau), round2(self.tau));
        format!("τ base {base:.2} → Markov {last:.2} ({:+.2})", last - base)
    }

    /// "0.61 for 0.58 accepted (err 0.07)": the confidence head's mean prediction, the mean
    /// acceptance it predicts and its mean absolute error; "no head (0.58 accepted)".
    pub fn calibration_words(&self) -> String {
        match (self.confidence_mean, self.confidence_abs_error) {
            (Some(mean), Some(error)) => format!(
                "{mean:.2} for {:.2} accepted (err {error:.2})",
                self.acceptance_mean
            ),
            _ => format!("no head ({:.2} accepted)", self.acceptance_mean),
        }
    }
}

/// A DFlash2 drafter's acceptance on its training batch at one step: the greedy chain walked
/// by its selector and by the unary argmax alone (teacher-forced), and how much the selector
/// could reach (the unary top-K's recall and the oracle chain).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dflash2Acceptance {
    pub step: u64,
    pub ts_ms: TimestampMs,
    /// `serving_accepted_length`.
    pub tau: f64,
    /// `unary_accepted_length`: the selector off.
    pub base_tau: f64,
    /// `oracle_accepted_length`: a perfect selector.
    pub oracle_tau: f64,
    pub topk_recall: f64,
    /// `α_eff` at this step.
    pub selector_alpha: f64,
}

impl Dflash2Acceptance {
    /// The figures of a step's metrics line.
    pub fn from_step(
        step: u64,
        ts_ms: TimestampMs,
        m: &crate::metrics::Dflash2StepMetrics,
    ) -> Self {
        Self {
            step,
            ts_ms,
            tau: m.serving_accepted_length,
            base_tau: m.unary_accepted_length,
            oracle_tau: m.oracle_accepted_length,
            topk_recall: m.unary_topk_recall,
            selector_alpha: m.selector_alpha,
        }
    }

    /// "τ unary 2.31 → selector 2.87 (+0.56)": the selector's gain is the difference of the two
    /// rounded figures, so the line adds up.
    pub fn acceptance_words(&self) -> String {
        let (base, last) = (round2(self.base_tau), round2(self.tau));
        format!(
            "τ unary {base:.2} → selector {last:.2} ({:+.2})",
            last - base
        )
    }

    /// "top-K 0.82, oracle τ 3.90, α 1.00": the unary top-K's recall and the oracle chain (what
    /// the selector could reach) and its weight at this step.
    pub fn reach_words(&self) -> String {
        format!(
            "top-K {:.2}, oracle τ {:.2}, α {:.2}",
            self.topk_recall, self.oracle_tau, self.selector_alpha
        )
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub tokens_per_s: f64,
    /// Draft positions (kept anchors × block size) per second, the latest step's.
    #[serde(default)]
    pub draft_positions_per_s: f64,
    /// The latest step's model FLOPs utilisation, where every device's peak is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    pub baseline_tokens_per_s: Option<f64>,
    /// Since when the run has been stable: with a healthy record kept, the healthy stretch's
    /// start (a drop being timed does not break it, an alert does), so "stable for" and the
    /// record's clock agree; otherwise since when the Ok level has held. `None` when not stable.
    pub stable_since_ms: Option<TimestampMs>,
    /// Where the baseline came from when this daemon did not learn it itself: the healthy
    /// record ("this recipe ran at 21.5K tok/s here on …") or the config's pinned figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_source: Option<String>,
    /// The healthy record's clock, where the daemon keeps a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_clock: Option<RecordClock>,
}

/// When the run's healthy record is written (`health::healthy_stretch`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordClock {
    /// When the current healthy stretch began; `None` outside one.
    pub stretch_since_ms: Option<TimestampMs>,
    /// When the record is first written if the stretch holds; `None` outside a stretch and
    /// once this daemon has written it.
    pub due_ms: Option<TimestampMs>,
    /// When this daemon last wrote the record.
    pub written_ms: Option<TimestampMs>,
    /// A drop below the Warn line is being timed: no alert yet; the stretch holds, but the
    /// record learns nothing from it and is not written meanwhile.
    #[serde(default)]
    pub drop_timed: bool,
}

/// An active alert as the snapshot carries it; the health monitor makes it (`health/monitor.rs`).
pub use crate::health::Alert;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub step: u64,
    pub path: String,
    pub written_ms: TimestampMs,
    pub bytes: u64,
}

/// Everything a console needs to draw one frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusSnapshot {
    pub run: RunInfo,
    pub throughput: Throughput,
    pub gpus: GpuTelemetry,
    pub host: Option<HostSample>,
    pub queue: QueueStats,
    pub caches: Vec<CacheState>,
    pub alerts: Vec<Alert>,
    pub pending_actions: Vec<PendingAction>,
    pub checkpoints: Vec<CheckpointInfo>,
    /// The run's best checkpoint by online DDTree τ at the serving budget; kept on disk beside
    /// the newest ones whatever `keep_checkpoints` says. Absent before the first online
    /// evaluation that scored one, and from a daemon that does not send it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub best_checkpoint: Option<BestCheckpoint>,
    /// Why there is no best checkpoint, once the daemon knows the run's config; absent while
    /// `best_checkpoint` is set.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub no_best_checkpoint: Option<NoBestCheckpoint>,
    pub last_loss: Option<f64>,
    pub last_tau: Option<f64>,
    /// The newest held-out evaluation's DDTree oracle τ by budget, with the budget the drafter
    /// is served with: the tree figure beside `last_tau`. Absent before the first evaluation
    /// that scored trees, and from a daemon that does not send it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub last_tau_tree: Option<TreeOracleTau>,
    /// The newest online evaluation (speculative decoding against the target) and the step it
    /// ran at; absent before the first, and from a daemon that does not run them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online: Option<OnlineEvalStatus>,
    /// A Domino run's newest `accept_len` / `base_accept_len` (its metrics lines); absent for
    /// a DFlash head and from a daemon that does not send it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub last_domino: Option<DominoAcceptance>,
    /// A DSpark run's newest training-batch acceptance and confidence calibration. `None` for
    /// another head, before the first step, and from a daemon that does not report it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub last_dspark: Option<DsparkAcceptance>,
    /// A DFlash2 run's newest training-batch acceptance (selector against unary argmax). `None`
    /// for another head, before the first step, and from a daemon that does not report it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub last_dflash2: Option<Dflash2Acceptance>,
    /// The thresholds the daemon's health detectors judge this run by: the run's effective
    /// `[detectors]` section. A console judges memory flatness and the queue with these, never
    /// with defaults of its own. `None` until the daemon's detectors run, and from a daemon
    /// that does not send them (or sends them in a shape this build cannot read).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub detectors: Option<DetectorsSection>,
    /// The healthy record this run is judged against (its own, or the last of its recipe on
    /// this machine), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_record: Option<Box<HealthyRecord>>,
    /// On a node of a multi-node job: which node, and the job's view after the latest step.
    /// Absent for a single node and from a daemon that does not send it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::serde_util::none_if_unreadable"
    )]
    pub job: Option<JobStatus>,
}

impl JobStatus {
    /// "node 1 of 2 · job 1.5K tok/s · node 1 holds it back (+50 %)", or "· slowest node 1,
    /// +4 %" when no node is far enough behind to name.
    pub fn words(&self) -> String {
        match self.behind() {
            Some(behind) => format!("{} · {behind}", self.place_and_rate()),
            None => self.place_and_rate(),
        }
    }

    /// "node 1 of 2 · job 1.5K tok/s" ("· no step yet" before the first).
    pub fn place_and_rate(&self) -> String {
        let place = format!("node {} of {}", self.node, self.nnodes);
        match &self.view {
            Some(view) => format!(
                "{place} · job {} tok/s",
                crate::format::format_tokens_per_s(view.tokens_per_s)
            ),
            None => format!("{place} · no step yet"),
        }
    }

    /// "node 1 holds it back (+50 %)", or "slowest node 1, +4 %" when no node is far enough
    /// behind to name; `None` before the first step.
    pub fn behind(&self) -> Option<String> {
        let view = self.view.as_ref()?;
        match (&view.straggler, view.lag()) {
            (Some(s), _) => Some(format!(
                "node {} holds it back (+{:.0} %)",
                s.node,
                s.behind_frac * 100.0
            )),
            (None, Some(l)) => Some(format!(
                "slowest node {}, +{:.0} %",
                l.node,
                l.behind_frac * 100.0
            )),
            (None, None) => None,
        }
    }
}

/// This daemon's place in a multi-node job and the job as seen after the latest step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub node: u32,
    pub nnodes: u32,
    /// Every node's figures, the job's totals and its straggler; `None` before the first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<crate::job::JobView>,
}

/// An online evaluation and when it ran: the figures of its metrics line, flat, beside the
/// line's `step` and `ts_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnlineEvalStatus {
    pub step: u64,
    pub ts_ms: TimestampMs,
    #[serde(flatten)]
    pub acceptance: OnlineAcceptance,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::QueueStats;

    #[test]
    fn a_jobs_words_name_the_node_the_rate_and_who_holds_it_back() {
        use crate::job::{JobView, NodeFigures};
        let node = |n: u32, busy_ms: f64| NodeFigures {
            node: n,
            tokens_per_s: 750.0,
            draft_positions_per_s: 6000.0,
            busy_ms,
            step_ms: 1500.0,
            queue_wait_share: None,
        };
        let mut job = JobStatus {
            node: 0,
            nnodes: 2,
            view: None,
        };
        assert_eq!(job.words(), "node 0 of 2 · no step yet");
        job.view = Some(JobView::from_nodes(
            0,
            vec![node(0, 1000.0), node(1, 1040.0)],
            crate::job::STRAGGLER_BEHIND_FRAC,
        ));
        assert_eq!(
            job.words(),
            "node 0 of 2 · job 1.5K tok/s · slowest node 1, +4 %"
        );
        job.view = Some(JobView::from_nodes(
            0,
            vec![node(0, 1000.0), node(1, 1500.0)],
            crate::job::STRAGGLER_BEHIND_FRAC,
        ));
        assert_eq!(
            job.words(),
            "node 0 of 2 · job 1.5K tok/s · node 1 holds it back (+50 %)"
        );
    }

    fn snapshot() -> StatusSnapshot {
        StatusSnapshot {
            run: RunInfo {
                name: "r".into(),
                state: RunState::Training,
                step: 1,
                total_steps: 2,
                epoch: 1,
                epochs: 6,
                started_ms: 0,
                eta_ms: None,
                run_dir: "/runs/r".into(),
                config_path: None,
                objective: None,
                drafter_head: None,
            },
            throughput: Throughput {
                tokens_per_s: 1.0,
                draft_positions_per_s: 0.0,
                mfu: None,
                baseline_tokens_per_s: None,
                stable_since_ms: None,
                baseline_source: None,
                record_clock: None,
            },
            gpus: GpuTelemetry::Unavailable {
                reason: "no NVML".into(),
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
        }
    }

    #[test]
    fn the_detector_thresholds_travel_and_a_frame_without_them_still_reads() {
        let mut tuned = snapshot();
        let mut detectors = DetectorsSection::default();
        detectors.memory.max_range_frac = 0.07;
        detectors.queue.starved_frac = 0.3;
        tuned.detectors = Some(detectors);
        let text = serde_json::to_string(&tuned).unwrap();
        assert_eq!(
            serde_json::from_str::<StatusSnapshot>(&text).unwrap(),
            tuned
        );

        // An older daemon's snapshot has no `detectors` key; this one writes none either.
        let old = serde_json::to_value(snapshot()).unwrap();
        assert!(old.get("detectors").is_none(), "{old}");
        let read: StatusSnapshot = serde_json::from_value(old).unwrap();
        assert_eq!(read.detectors, None);
    }

    #[test]
    fn the_last_online_evaluation_travels_flat_and_an_older_frame_has_none() {
        let mut s = snapshot();
        s.last_online = Some(OnlineEvalStatus {
            step: 50,
            ts_ms: 7,
            acceptance: OnlineAcceptance {
                tau_chain: 2.5,
                tau_ddtree: [(16, 3.0)].into_iter().collect(),
                serve_tree_budget: None,
                offline_tau: Some(3.1),
                base: None,
                prompts: 8,
                seconds: 0.8,
            },
        });
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(value["last_online"]["online_tau_ddtree_16"], 3.0);
        assert_eq!(value["last_online"]["step"], 50);
        assert_eq!(serde_json::from_value::<StatusSnapshot>(value).unwrap(), s);
        let old = serde_json::to_value(snapshot()).unwrap();
        assert!(old.get("last_online").is_none(), "{old}");
    }

    #[test]
    fn thresholds_in_a_shape_this_build_does_not_know_read_as_none_not_as_a_lost_frame() {
        let mut value = serde_json::to_value(snapshot()).unwrap();
        let mut detectors = serde_json::to_value(DetectorsSection::default()).unwrap();
        detectors["memory"]["max_range_frac_per_role"] = serde_json::json!(0.01);
        value["detectors"] = detectors;
        let read: StatusSnapshot = serde_json::from_value(value).unwrap();
        assert_eq!(read.detectors, None);
        assert_eq!(read.run.name, "r");
    }

    #[test]
    fn the_objective_and_head_travel_and_an_older_daemons_line_reads_them_as_unknown() {
        let mut s = snapshot();
        s.run.objective = Some(RunObjective::new(Objective::Dpace, 0.5));
        s.run.drafter_head = Some(DrafterHead::Domino);
        s.last_domino = Some(DominoAcceptance {
            step: 40,
            ts_ms: 9,
            accept_len: 2.87,
            base_accept_len: 2.31,
        });
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(value["run"]["objective"]["objective"], "dpace");
        assert_eq!(value["run"]["objective"]["dpace_alpha"], 0.5);
        assert_eq!(value["run"]["drafter_head"], "domino");
        assert_eq!(serde_json::from_value::<StatusSnapshot>(value).unwrap(), s);

        // A line as a daemon before these fields wrote it, verbatim.
        let old = r#"{"run":{"name":"r","state":"training","step":1,"total_steps":2,"epoch":1,
            "epochs":6,"started_ms":0,"eta_ms":null,"run_dir":"/runs/r","config_path":null},
            "throughput":{"tokens_per_s":1.0,"baseline_tokens_per_s":null,"stable_since_ms":null},
            "gpus":{"state":"unavailable","reason":"no NVML"},"host":null,
            "queue":{"ts_ms":0,"depth":0,"capacity":0,"high_watermark":0,"low_watermark":0,
            "bytes_resident":0,"byte_cap":0,"producer_rate":0.0,"consumer_rate":0.0,
            "producer_blocked_ms":0.0,"consumer_starved_ms":0.0},
            "caches":[],"alerts":[],"pending_actions":[],"checkpoints":[],
            "last_loss":null,"last_tau":null}"#;
        let read: StatusSnapshot = serde_json::from_str(old).unwrap();
        assert_eq!(read.run.objective, None);
        assert_eq!(read.run.drafter_head, None);
        assert_eq!(read.last_domino, None);
        assert_eq!(
            objective_words(read.run.objective.as_ref()),
            "objective: unknown (the daemon did not report it)"
        );
    }

    #[test]
    fn an_objective_or_head_this_build_does_not_know_reads_as_unknown_not_as_a_lost_frame() {
        let mut value = serde_json::to_value(snapshot()).unwrap();
        value["run"]["objective"] = serde_json::json!({"objective": "medusa"});
        value["run"]["drafter_head"] = serde_json::json!("medusa");
        let read: StatusSnapshot = serde_json::from_value(value).unwrap();
        assert_eq!((read.run.objective, read.run.drafter_head), (None, None));
        assert_eq!(read.run.name, "r");
    }

    #[test]
    fn the_objective_is_named_with_its_alpha_and_dflash_has_none() {
        let dflash = RunObjective::new(Objective::Dflash, 0.5);
        assert_eq!(dflash.dpace_alpha, None);
        assert_eq!(objective_words(Some(&dflash)), "objective: DFlash");
        let dpace = RunObjective::new(Objective::Dpace, 0.5);
        assert_eq!(objective_words(Some(&dpace)), "objective: D-PACE (α 0.5)");
        assert_eq!(
            RunObjective::new(Objective::Dpace, 0.25).words(),
            "D-PACE (α 0.25)"
        );
        assert_eq!(head_name(DrafterHead::Dflash), "DFlash");
        assert_eq!(head_name(DrafterHead::Domino), "Domino");
    }

    #[test]
    fn dpace_names_its_normalisation_unless_it_is_the_default() {
        let dpace = |n| RunObjective::new(Objective::Dpace, 0.5).with_dpace_normalization(n);
        assert_eq!(
            dpace(DpaceNormalization::Sequences).words(),
            "D-PACE (α 0.5)"
        );
        assert_eq!(
            dpace(DpaceNormalization::WeightSum).words(),
            "D-PACE (α 0.5, normalised by weight_sum)"
        );
        assert_eq!(
            dpace(DpaceNormalization::TokensPerSequence).words(),
            "D-PACE (α 0.5, normalised by tokens_per_sequence)"
        );
        // Kept only where D-PACE reads it.
        let dflash = RunObjective::new(Objective::Dflash, 0.5)
            .with_dpace_normalization(DpaceNormalization::WeightSum);
        assert_eq!(dflash.dpace_normalization, None);
        // Over the wire, and from a daemon that names one this build does not know.
        let sent = dpace(DpaceNormalization::AnchorsPerSequence);
        let json = serde_json::to_value(sent).unwrap();
        assert_eq!(json["dpace_normalization"], "anchors_per_sequence");
        assert_eq!(
            serde_json::from_value::<RunObjective>(json.clone()).unwrap(),
            sent
        );
        let mut newer = json;
        newer["dpace_normalization"] = serde_json::json!("per_galaxy");
        let read: RunObjective = serde_json::from_value(newer).unwrap();
        assert_eq!(read.dpace_normalization, None);
        assert_eq!(read.words(), "D-PACE (α 0.5)");
    }

    #[test]
    fn domino_acceptance_shows_base_final_and_a_correction_that_adds_up() {
        let a = DominoAcceptance {
            step: 1,
            ts_ms: 0,
            accept_len: 2.874,
            base_accept_len: 2.306,
        };
        assert_eq!(
            a.words(),
            "acceptance: base 2.31 → final 2.87 (Domino correction +0.56)"
        );
        let worse = DominoAcceptance {
            accept_len: 1.9,
            base_accept_len: 2.0,
            ..a
        };
        assert_eq!(
            worse.words(),
            "acceptance: base 2.00 → final 1.90 (Domino correction -0.10)"
        );
        assert_eq!(a.short_words(), "base 2.31 → final 2.87 (+0.56)");
    }
}
