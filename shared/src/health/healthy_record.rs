//! The healthy record: what a run looked like once it had been healthy for a while, kept on
//! disk so that it outlives the daemon.
//!
//! Without it a restarted daemon learns whatever rate it comes up at as its baseline. That is
//! how the incident this product exists for went unflagged: 21.5K tok/s, then a torch swap, a
//! deleted compile cache and a restart, and every run after came up at 4.3K and read "stable".
//!
//! The daemon keeps two copies (`daemon/src/runtime/healthy_record.rs` does the I/O):
//! - `<run_dir>/healthy.json`, which a resumed run is judged against;
//! - `<state_dir>/healthy/<recipe>.json`, the last healthy record of each recipe (the config
//!   without the keys that may change freely, the topology and the device models), which a new
//!   run dir of the same recipe on the same machine is judged against.
//!
//! This module is pure: the record's shape, how it is accumulated from samples
//! ([`HealthyWindow`]), the throughput a run is expected to reach against it
//! ([`expected_throughput`], adjusted like with like for another length mix), and the list of
//! what differs between it and now ([`differences_since`]).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fingerprint::{diff_fingerprints, Fingerprint};
use super::stats::median;
use crate::events::wording::cache_label;
use crate::events::{Event, EventKind};
use crate::format::{format_bytes, format_tokens_per_s};
use crate::metrics::{CacheState, GpuSample, QueueStats, StepMetrics, StepTimes, TimestampMs};

/// Bumped when a field's meaning changes; a record of another format is ignored, not misread.
pub const FORMAT: u32 = 1;

/// `[detectors.healthy]`: when a run counts as healthy enough to be remembered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthyRecordConfig {
    /// The record is first written once the throughput detector has judged the run Ok (past
    /// its warmup and baseline learning) with no active alert for this long.
    pub after_ok_s: f64,
    /// While the run stays healthy, the record is rewritten this often.
    pub refresh_s: f64,
    /// Judge a new run dir against the last healthy record of the same recipe on this machine.
    pub use_recipe_record: bool,
}

impl Default for HealthyRecordConfig {
    fn default() -> Self {
        Self {
            after_ok_s: 300.0,
            refresh_s: 60.0,
            use_recipe_record: true,
        }
    }
}

/// What throughput is compared with: the work a token costs, so that another length mix is not
/// read as a regression.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThroughputBasis {
    /// Mean tokens per training row of the data.
    pub mean_row_tokens: f64,
    /// Model FLOPs (target forward + drafter step, `engine/src/plan/flops.rs`) per training
    /// token at the data's mean row length. Longer rows cost more per token (attention), so
    /// tokens/s falls with them on a healthy machine.
    pub model_flops_per_token: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthyThroughput {
    /// Medians over the healthy samples.
    pub tokens_per_s: f64,
    pub draft_positions_per_s: f64,
    pub samples: usize,
    /// The work a token cost when this was measured; `None` when it was not known.
    pub basis: Option<ThroughputBasis>,
}

/// A GPU's memory while healthy: where it sat and how far it moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPlateau {
    pub index: u32,
    pub name: String,
    pub median_used_bytes: u64,
    pub min_used_bytes: u64,
    pub max_used_bytes: u64,
    pub total_bytes: Option<u64>,
}

/// The hidden-state queue while healthy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueBalance {
    pub capacity: usize,
    pub median_depth: f64,
    /// Share of wall time producers were blocked on a full queue, and consumers starved on an
    /// empty one, over the healthy window.
    pub producer_blocked_frac: f64,
    pub consumer_starved_frac: f64,
}

/// Everything a later daemon needs to judge a run against how it once ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthyRecord {
    pub format: u32,
    /// When this record was last written (the run was still healthy then).
    pub recorded_ms: TimestampMs,
    /// Since when the run had been healthy.
    pub healthy_since_ms: TimestampMs,
    pub run_name: String,
    pub run_dir: String,
    /// The recipe digest ([`crate::config::recipe::recipe_text`] hashed, with the topology and
    /// device models).
    pub recipe: String,
    pub step: u64,
    pub throughput: HealthyThroughput,
    pub memory: Vec<GpuPlateau>,
    pub queue: Option<QueueBalance>,
    /// Median step-time breakdown over the healthy steps.
    pub step_times: StepTimes,
    pub fingerprint: Fingerprint,
    pub caches: Vec<CacheState>,
    pub config_digest: Option<String>,
    pub data_digest: Option<String>,
    pub mean_row_tokens: Option<f64>,
    pub commit: Option<String>,
    /// "inline on cpu", "targets cuda:0–4, drafters cuda:5–7".
    pub topology: String,
    pub device_models: Vec<String>,
}

impl HealthyRecord {
    /// `None` for a file this build did not write (another format, a partial write).
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str::<Self>(text)
            .ok()
            .filter(|r| r.format == FORMAT)
    }
}

/// Which record a run is judged against, for the sentence that says where the figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordScope {
    /// This run dir's own record: a resumed run.
    ThisRun,
    /// The last healthy record of the same recipe on this machine, from another run dir.
    Recipe,
}

/// The tok/s a run is expected to reach, from a healthy record, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThroughputReference {
    pub tokens_per_s: f64,
    pub scope: RecordScope,
    /// "this run ran at 21.5K tok/s here on 2026-12-03 21:03" or "this recipe ran at …".
    pub source: String,
    /// Set when the record's figure was scaled for another length mix: what and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<String>,
}

/// Below this relative difference in cost per token, the record's figure is used as it is.
const BASIS_TOLERANCE: f64 = 0.01;

/// The throughput expected now from `record`, like with like: when the cost of a token differs
/// (longer or shorter rows), the record's tok/s is scaled by the ratio of model FLOPs per token,
/// so the comparison is in achieved FLOPs/s. `date` is the record's time as the caller words it.
pub fn expected_throughput(
    record: &HealthyRecord,
    scope: RecordScope,
    now: Option<&ThroughputBasis>,
    date: &str,
) -> Option<ThroughputReference> {
    let recorded = record.throughput.tokens_per_s;
    if !(recorded.is_finite() && recorded > 0.0) {
        return None;
    }
    let whose = match scope {
        RecordScope::ThisRun => "this run",
        RecordScope::Recipe => "this recipe",
    };
    let mut source = format!(
        "{whose} ran at {} tok/s here on {date}",
        format_tokens_per_s(recorded)
    );
    if scope == RecordScope::Recipe {
        source.push_str(&format!(" (run {}, {})", record.run_name, record.run_dir));
    }
    let (expected, adjustment) = match (record.throughput.basis.as_ref(), now) {
        (Some(then), Some(now))
            if then.model_flops_per_token > 0.0
                && now.model_flops_per_token > 0.0
                && (now.model_flops_per_token / then.model_flops_per_token - 1.0).abs()
                    > BASIS_TOLERANCE =>
        {
            let scale = then.model_flops_per_token / now.model_flops_per_token;
            let expected = recorded * scale;
            let longer = if now.mean_row_tokens >= then.mean_row_tokens {
                "longer"
            } else {
                "shorter"
            };
            (
                expected,
                Some(format!(
                    "adjusted for {longer} rows (mean {:.0} → {:.0} tokens, {:.2}× the model \
                     FLOPs per token): expects {} tok/s",
                    then.mean_row_tokens,
                    now.mean_row_tokens,
                    now.model_flops_per_token / then.model_flops_per_token,
                    format_tokens_per_s(expected)
                )),
            )
        }
        _ => (recorded, None),
    };
    Some(ThroughputReference {
        tokens_per_s: expected,
        scope,
        source,
        adjustment,
    })
}

/// Accumulates the samples of a healthy stretch of a run; [`HealthyWindow::record`] turns them
/// into the record's figures. Reset whenever the run stops being healthy.
#[derive(Debug, Clone, Default)]
pub struct HealthyWindow {
    since_ms: Option<TimestampMs>,
    tokens_per_s: Vec<f64>,
    draft_positions_per_s: Vec<f64>,
    step_times: Vec<StepTimes>,
    gpus: BTreeMap<u32, (String, Option<u64>, Vec<u64>)>,
    queue_first: Option<QueueStats>,
    queue_last: Option<QueueStats>,
    queue_depths: Vec<f64>,
}

/// At most this many samples of each kind are kept (the newest): a week-long run must not grow
/// the window without bound.
const WINDOW_CAP: usize = 4096;

fn push_capped<T>(v: &mut Vec<T>, x: T) {
    if v.len() >= WINDOW_CAP {
        v.remove(0);
    }
    v.push(x);
}

impl HealthyWindow {
    pub fn since_ms(&self) -> Option<TimestampMs> {
        self.since_ms
    }

    pub fn step_samples(&self) -> usize {
        self.tokens_per_s.len()
    }

    pub fn reset(&mut self) {
        *self = Self::default();
    }

    pub fn observe_step(&mut self, m: &StepMetrics) {
        let tokens_per_s = m.judged_tokens_per_s();
        if !(tokens_per_s.is_finite() && tokens_per_s > 0.0) {
            return;
        }
        self.since_ms.get_or_insert(m.ts_ms);
        push_capped(&mut self.tokens_per_s, tokens_per_s);
        push_capped(
            &mut self.draft_positions_per_s,
            m.judged_draft_positions_per_s(),
        );
        push_capped(&mut self.step_times, m.times.clone());
    }

    pub fn observe_gpu(&mut self, g: &GpuSample) {
        let used = g
            .memory_used_bytes
            .or(g.allocator.as_ref().map(|a| a.reserved_bytes));
        let Some(used) = used else { return };
        let entry = self
            .gpus
            .entry(g.index)
            .or_insert_with(|| (g.name.clone(), g.memory_total_bytes, Vec::new()));
        push_capped(&mut entry.2, used);
    }

    pub fn observe_queue(&mut self, q: &QueueStats) {
        if q.capacity == 0 {
            return;
        }
        self.queue_first.get_or_insert_with(|| q.clone());
        self.queue_last = Some(q.clone());
        push_capped(&mut self.queue_depths, q.depth as f64);
    }

    /// The throughput, memory, queue and step-time figures of the window; `None` before any
    /// step was seen.
    pub fn figures(&self, basis: Option<ThroughputBasis>) -> Option<HealthyFigures> {
        let tokens_per_s = median(self.tokens_per_s.iter().copied())?;
        let memory = self
            .gpus
            .iter()
            .filter_map(|(index, (name, total, used))| {
                let med = median(used.iter().map(|&u| u as f64))?;
                Some(GpuPlateau {
                    index: *index,
                    name: name.clone(),
                    median_used_bytes: med as u64,
                    min_used_bytes: *used.iter().min()?,
                    max_used_bytes: *used.iter().max()?,
                    total_bytes: *total,
                })
            })
            .collect();
        let queue = match (&self.queue_first, &self.queue_last) {
            (Some(a), Some(b)) if b.ts_ms > a.ts_ms => {
                let wall = (b.ts_ms - a.ts_ms) as f64;
                Some(QueueBalance {
                    capacity: b.capacity,
                    median_depth: median(self.queue_depths.iter().copied()).unwrap_or(0.0),
                    producer_blocked_frac: ((b.producer_blocked_ms - a.producer_blocked_ms) / wall)
                        .max(0.0),
                    consumer_starved_frac: ((b.consumer_starved_ms - a.consumer_starved_ms) / wall)
                        .max(0.0),
                })
            }
            _ => None,
        };
        let times = |f: fn(&StepTimes) -> f64| median(self.step_times.iter().map(f)).unwrap_or(0.0);
        Some(HealthyFigures {
            throughput: HealthyThroughput {
                tokens_per_s,
                draft_positions_per_s: median(self.draft_positions_per_s.iter().copied())
                    .unwrap_or(0.0),
                samples: self.tokens_per_s.len(),
                basis,
            },
            memory,
            queue,
            step_times: StepTimes {
                data_wait_ms: times(|t| t.data_wait_ms),
                target_forward_ms: times(|t| t.target_forward_ms),
                queue_wait_ms: times(|t| t.queue_wait_ms),
                drafter_forward_backward_ms: times(|t| t.drafter_forward_backward_ms),
                all_reduce_ms: times(|t| t.all_reduce_ms),
                optimizer_ms: times(|t| t.optimizer_ms),
                total_ms: times(|t| t.total_ms),
            },
        })
    }
}

/// The measured part of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthyFigures {
    pub throughput: HealthyThroughput,
    pub memory: Vec<GpuPlateau>,
    pub queue: Option<QueueBalance>,
    pub step_times: StepTimes,
}

/// A cache deletion the journal shows was confirmed by an operator (the daemon's own delete
/// action words it "deleted by operator").
fn deletion_confirmed(name: &str, events: &[Event]) -> bool {
    events.iter().any(|e| {
        matches!(&e.kind, EventKind::CacheChanged { name: n, change, .. }
            if n == name && change.starts_with("deleted by operator"))
    })
}

/// Everything that differs between the healthy record and now, worded for people, in a fixed
/// order: the environment (blocking fields first, as [`diff_fingerprints`] orders them), the
/// caches that were warm then and are missing or cold now, and what happened in the journal
/// since the record (`events` may hold older lines; only those after the record count).
pub fn differences_since(
    record: &HealthyRecord,
    now: &Fingerprint,
    caches_now: &[CacheState],
    events: &[Event],
) -> Vec<String> {
    let mut out: Vec<String> = diff_fingerprints(&record.fingerprint, now)
        .iter()
        .filter(|d| d.field != "hostname" || record.fingerprint.hostname.is_some())
        .map(|d| d.sentence())
        .collect();
    let after: Vec<&Event> = events
        .iter()
        .filter(|e| e.ts_ms > record.recorded_ms)
        .collect();
    let after_owned: Vec<Event> = after.iter().map(|e| (*e).clone()).collect();
    for then in record.caches.iter().filter(|c| c.present && c.warm) {
        let label = cache_label(&then.name);
        let now = caches_now.iter().find(|c| c.name == then.name);
        let gone = match now {
            None => continue, // not watched any more: nothing to say
            Some(c) if !c.present => "missing",
            Some(c) if !c.warm => "cold",
            Some(_) => continue,
        };
        let confirmation = if deletion_confirmed(&then.name, &after_owned) {
            "deleted by a confirmed dflash action"
        } else {
            "deleted outside dflash; no confirmation on record"
        };
        out.push(format!(
            "{label} warm then ({}, {} entries), {gone} now: {confirmation}",
            format_bytes(then.size_bytes),
            then.entries
        ));
    }
    let restarts = after
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    if restarts > 0 {
        out.push(format!(
            "{restarts} daemon start{} since the record",
            if restarts == 1 { "" } else { "s" }
        ));
    }
    for e in &after {
        if matches!(e.kind, EventKind::WorkerFailed { .. }) {
            out.push(e.kind.describe());
        }
    }
    out
}

#[cfg(test)]
#[path = "healthy_record_tests.rs"]
mod tests;
