//! The prose sections of the status report: goal, constraints, progress, next steps.
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::format::{format_bytes, format_si};

use std::collections::BTreeMap;

use dflash_shared::health::healthy_record::HealthyRecord;
use dflash_shared::health::{diff_fingerprints, Fingerprint};

use super::{timeline, StatusReport};
use crate::actions::UNLOCKABLE_KEYS;
use crate::app::wording;
use crate::fmt::{self, DisplayClock};

pub fn goal(report: &StatusReport) -> String {
    let name = report.run.name.as_deref().unwrap_or("the current run");
    let epochs = report.run.epochs.unwrap_or(6);
    format!(
        "Train the DFlash drafter of run {name} for {epochs} full epochs (no early stopping) \
         without losing a checkpoint or the throughput the run had when it was healthy."
    )
}

/// The value at a dotted config path such as `training.precision`.
fn value_at<'a>(config: &'a serde_json::Value, dotted: &str) -> Option<&'a serde_json::Value> {
    config.pointer(&format!("/{}", dotted.replace('.', "/")))
}

/// The data files the config names (`[data]` of the shared config schema).
pub fn data_paths(config: &serde_json::Value) -> Vec<String> {
    ["data.train_file", "data.tokenizer", "data.chat_template"]
        .iter()
        .filter_map(|key| value_at(config, key)?.as_str().map(str::to_string))
        .collect()
}

pub fn constraints(report: &StatusReport, config: Option<&serde_json::Value>) -> Vec<String> {
    let mut lines = vec![
        "Precision BF16, never FP8 (locked).".to_string(),
        format!(
            "{} full epochs, no early stopping (locked).",
            report.run.epochs.unwrap_or(6)
        ),
    ];
    let locked: Vec<String> = UNLOCKABLE_KEYS
        .iter()
        .filter_map(|key| {
            let value = config.and_then(|c| value_at(c, key))?;
            Some(format!("{key} = {value}"))
        })
        .collect();
    if locked.is_empty() {
        lines.push(format!(
            "Locked keys ({}) change only through a confirmed, audited unlock.",
            UNLOCKABLE_KEYS.join(", ")
        ));
    } else {
        lines.push(format!(
            "Locked: {}; they change only through a confirmed, audited unlock.",
            locked.join(", ")
        ));
    }
    lines.push(
        "The training signal (data order and split, architecture, optimiser, loss) never changes \
         within a run."
            .into(),
    );
    lines.push(
        "Destructive actions (stop, kill, power off, delete a cache, unlock) need the run name \
         typed; scripts use --token ID --yes-i-know, which the journal records."
            .into(),
    );
    lines.push(
        "Do not delete compile caches while workers run; do not stop a stable run to \"fix\" \
         throughput before the timeline says what changed."
            .into(),
    );
    lines
}

pub fn progress(report: &StatusReport, events: &[Event], clock: DisplayClock) -> super::Progress {
    let mut p = super::Progress::default();
    let run = &report.run;
    if let Some(epoch) = run.epoch.filter(|e| *e > 1) {
        p.done.push(format!("Epochs 1–{} complete.", epoch - 1));
    }
    if let Some(last) = report.checkpoints.last() {
        // With the daemon up the list is what is on disk; with it down it is every checkpoint
        // the journal says was written, of which only the newest `keep_checkpoints` are kept.
        let how = if report.daemon.reachable {
            "kept"
        } else {
            "written"
        };
        p.done.push(format!(
            "{} checkpoint(s) {how}; latest at step {} ({}, {}).",
            report.checkpoints.len(),
            fmt::thousands(last.step),
            clock.date_hm(last.written_ms),
            format_bytes(last.bytes)
        ));
    }
    let warmups = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::WarmupDone { .. }))
        .count();
    if warmups > 0 {
        p.done.push(format!(
            "Serialized warmup recorded for {warmups} device(s)."
        ));
    }
    if let (Some(step), Some(epoch)) = (run.step, run.epoch) {
        let mut line = format!(
            "{}: epoch {epoch}/{}, step {}",
            run.state,
            run.epochs.unwrap_or(6),
            fmt::thousands(step)
        );
        if let Some(total) = run.total_steps.filter(|t| *t > 0) {
            line.push_str(&format!(
                " of {} ({:.1}%)",
                fmt::thousands(total),
                100.0 * step as f64 / total as f64
            ));
        }
        if let Some(tokens) = report.throughput.tokens_per_s {
            line.push_str(&format!(" at {} tok/s", format_si(tokens)));
        }
        if let Some(eta) = &run.eta {
            line.push_str(&format!(
                "; ETA end of epoch {}: {eta}",
                run.epochs.unwrap_or(6)
            ));
        }
        p.in_progress.push(format!("{line}."));
    }
    let finished = run.state == "finished";
    if finished {
        let how = events.iter().rev().find_map(|e| match &e.kind {
            EventKind::RunStopped { reason, .. } => Some(reason.as_str()),
            _ => None,
        });
        p.done.push(match how {
            Some(reason) => format!("Run finished: {reason}."),
            None => "Run finished.".into(),
        });
    }
    if !report.daemon.reachable && !finished {
        p.blocked.push(format!(
            "The daemon is unreachable: {}.",
            report.daemon.error.as_deref().unwrap_or("no answer")
        ));
    }
    if matches!(run.state.as_str(), "paused" | "failed") {
        p.blocked.push(format!("The run is {}.", run.state));
    }
    // One line per alert, sibling GPUs folded ("GPU 5–7 memory volatile (detectors
    // memory:gpu5, …)"), as the console's Alerts panel folds them.
    let serious: Vec<&super::AlertReport> = report
        .alerts
        .iter()
        .filter(|a| a.level >= Severity::Warn)
        .collect();
    let items: Vec<(&str, &str)> = serious
        .iter()
        .map(|a| (a.detector.as_str(), a.message.trim_end_matches('.')))
        .collect();
    for group in dflash_shared::health::grouping::group(&items) {
        let first = serious[group.members[0]];
        if group.members.len() == 1 {
            p.blocked
                .push(format!("{} (detector {}).", first.headline, first.detector));
        } else {
            let detectors: Vec<&str> = group
                .members
                .iter()
                .map(|&m| serious[m].detector.as_str())
                .collect();
            p.blocked.push(format!(
                "{}, {} (detectors {}).",
                group.headline,
                wording::severity_word(first.level),
                detectors.join(", ")
            ));
        }
    }
    for pending in &report.pending_actions {
        p.blocked.push(format!(
            "Pending {} ({}) waits for a typed confirmation.",
            pending.id,
            pending.action.title()
        ));
    }
    p
}

/// One field of the environment the run was last known healthy on, and where that is known
/// from.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthyValue {
    pub value: String,
    /// "the healthy record of 2026-03-14 20:40", "what the run trained on before 20:52".
    pub source: String,
}

/// The environment the run was last known healthy on, field by field (fields as the journal's
/// `EnvironmentDrift` names them: `python.torch`, `cuda_runtime`, …). The one place next
/// steps learn which way "restore" points:
/// - the daemon's healthy record (`StatusSnapshot::healthy_record`), where it has the field;
/// - else the `before` of the *first* drift of the field in the journal window: what the run
///   trained on before the changes began. Never a later drift's `before`, which may be the
///   broken state a revert left.
pub fn healthy_environment(
    record: Option<&HealthyRecord>,
    events: &[Event],
    clock: DisplayClock,
) -> BTreeMap<String, HealthyValue> {
    let mut healthy = BTreeMap::new();
    for event in events {
        if let EventKind::EnvironmentDrift { field, before, .. } = &event.kind {
            healthy
                .entry(field.clone())
                .or_insert_with(|| HealthyValue {
                    value: before.clone(),
                    source: format!("what the run trained on before {}", clock.hm(event.ts_ms)),
                });
        }
    }
    if let Some(record) = record {
        // Every field the record has a value for: its drift from an empty fingerprint.
        let empty = Fingerprint::default();
        for drift in diff_fingerprints(&record.fingerprint, &empty) {
            if let Some(value) = drift.before {
                healthy.insert(
                    drift.field,
                    HealthyValue {
                        value,
                        source: format!(
                            "as in the healthy record of {}",
                            clock.date_hm(record.recorded_ms)
                        ),
                    },
                );
            }
        }
    }
    healthy
}

/// Each drifted field's value now: the `after` of its last drift in the journal, in the order
/// the fields first drifted.
fn current_environment(events: &[Event]) -> Vec<(String, String)> {
    let mut current: Vec<(String, String)> = Vec::new();
    for event in events {
        if let EventKind::EnvironmentDrift { field, after, .. } = &event.kind {
            match current.iter_mut().find(|(f, _)| f == field) {
                Some(entry) => entry.1 = after.clone(),
                None => current.push((field.clone(), after.clone())),
            }
        }
    }
    current
}

/// "Restore torch 2.11.0+cu128 (now 2.9.1+cu130), what the run trained on before 20:52, …":
/// one line per drifted field whose value now differs from the healthy one, always towards
/// the healthy one; none for a field already back on it.
pub fn restore_steps(healthy: &BTreeMap<String, HealthyValue>, events: &[Event]) -> Vec<String> {
    current_environment(events)
        .into_iter()
        .filter_map(|(field, now)| {
            let good = healthy.get(&field)?;
            if good.value == now {
                return None;
            }
            let label = field.strip_prefix("python.").unwrap_or(&field);
            Some(format!(
                "Restore {label} {} (now {now}), {}, or confirm the drift on purpose, before \
                 resuming.",
                good.value, good.source
            ))
        })
        .collect()
}

pub fn next_steps(
    report: &StatusReport,
    events: &[Event],
    healthy: &BTreeMap<String, HealthyValue>,
) -> Vec<String> {
    let mut steps = restore_steps(healthy, events);
    let alert_start = report.alerts.iter().map(|a| a.since.as_str()).min();
    for event in events {
        match &event.kind {
            EventKind::CacheChanged { name, change, .. }
                if change.contains("delet") || change.contains("cold") =>
            {
                let outside = timeline::deletion_origin(events, event)
                    == Some(timeline::DeletionOrigin::Outside);
                let label = wording::cache_label(name);
                steps.push(if outside {
                    format!(
                        "The {label} was deleted outside dflash (no confirmation on record): \
                         find who or what removed it, then let it re-warm through the \
                         serialized warmup; leave caches alone while workers run."
                    )
                } else {
                    format!(
                        "Let the {label} re-warm through the serialized warmup; leave caches \
                         alone while workers run."
                    )
                })
            }
            EventKind::WorkerFailed {
                device, role, rank, ..
            } => steps.push(format!(
                "Read the failure of the {} in the journal, fix it, then resume from the last \
                 checkpoint.",
                dflash_shared::events::worker_subject(device, *role, *rank)
            )),
            _ => {}
        }
    }
    steps.dedup();
    if alert_start.is_some() && steps.is_empty() {
        steps.push(
            "Find what changed before the alert (Critical Context) before touching the run.".into(),
        );
    }
    for pending in &report.pending_actions {
        steps.push(format!(
            "Confirm or let expire {} ({}): `dflash-tui confirm-stop`.",
            pending.id,
            pending.action.title()
        ));
    }
    let ending = dflash_shared::run_end::run_ending(events).filter(|_| !report.daemon.reachable);
    if let Some(ending) = ending {
        let run_dir = report.files.run_dir.as_deref().unwrap_or("RUN_DIR");
        // The daemon is down, so what it was started from is not known here.
        let source = dflash_shared::run_end::RunSource::ConfigOrUnknown;
        for step in dflash_shared::run_end::next_steps(&ending, run_dir, source) {
            steps.push(format!("{}{}.", step[..1].to_uppercase(), &step[1..]));
        }
    } else if !report.daemon.reachable {
        steps.push(
            "Start the daemon again (`dflashd start`); it resumes from the latest checkpoint."
                .into(),
        );
    } else if steps.is_empty() {
        steps.push(format!(
            "Keep training to the end of epoch {}; watch with `dflash-tui attach`.",
            report.run.epochs.unwrap_or(6)
        ));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keys_and_data_paths_are_read_by_dotted_path() {
        let config = serde_json::json!({
            "training": {"precision": "bf16", "epochs": 6, "num_anchors": 1024},
            "drafter": {"block_size": 32, "target_layer_ids": [1, 16, 31, 46, 61]},
            "data": {"train_file": "/data/chat.jsonl", "tokenizer": "/models/tokenizer.json"}
        });
        assert_eq!(
            value_at(&config, "training.num_anchors"),
            Some(&serde_json::json!(1024))
        );
        assert_eq!(value_at(&config, "training.missing"), None);
        assert_eq!(
            data_paths(&config),
            vec![
                "/data/chat.jsonl".to_string(),
                "/models/tokenizer.json".to_string()
            ]
        );
    }

    fn drift(seq: u64, ts_ms: i64, before: &str, after: &str) -> Event {
        Event {
            seq,
            ts_ms,
            severity: Severity::Warn,
            kind: EventKind::EnvironmentDrift {
                field: "python.torch".into(),
                before: before.into(),
                after: after.into(),
            },
        }
    }

    fn record(torch: &str) -> HealthyRecord {
        use dflash_shared::health::healthy_record::{HealthyThroughput, FORMAT};
        HealthyRecord {
            format: FORMAT,
            recorded_ms: 1_773_518_400_000, // 2026-03-14 20:00 UTC
            healthy_since_ms: 1_773_514_800_000,
            run_name: "r".into(),
            run_dir: "/r".into(),
            recipe: "abc".into(),
            step: 30_000,
            throughput: HealthyThroughput {
                tokens_per_s: 21_500.0,
                draft_positions_per_s: 0.0,
                samples: 100,
                basis: None,
            },
            memory: Vec::new(),
            queue: None,
            step_times: Default::default(),
            fingerprint: Fingerprint {
                python_packages: [("torch".to_string(), torch.to_string())].into(),
                cuda_runtime: Some("12.8".into()),
                ..Fingerprint::default()
            },
            caches: Vec::new(),
            config_digest: None,
            data_digest: None,
            mean_row_tokens: None,
            commit: None,
            topology: "inline on cpu".into(),
            device_models: Vec::new(),
        }
    }

    #[test]
    fn the_healthy_environment_is_the_record_else_the_first_drifts_before() {
        let clock = DisplayClock::utc();
        // 20:52 a → b, 21:20 b → a: the first drift's `before` is the healthy value.
        let events = [
            drift(1, 1_773_521_520_000, "2.11.0+cu128", "2.9.1+cu130"),
            drift(2, 1_773_523_200_000, "2.9.1+cu130", "2.11.0+cu128"),
        ];
        let healthy = healthy_environment(None, &events, clock);
        assert_eq!(healthy["python.torch"].value, "2.11.0+cu128");
        assert_eq!(
            healthy["python.torch"].source,
            "what the run trained on before 20:52"
        );
        assert!(restore_steps(&healthy, &events).is_empty());

        // A healthy record wins over the journal, field by field.
        let record = record("2.10.0+cu128");
        let healthy = healthy_environment(Some(&record), &events, clock);
        assert_eq!(healthy["python.torch"].value, "2.10.0+cu128");
        assert_eq!(healthy["cuda_runtime"].value, "12.8");
        assert_eq!(
            restore_steps(&healthy, &events),
            [
                "Restore torch 2.10.0+cu128 (now 2.11.0+cu128), as in the healthy record of \
              2026-03-14 20:00, or confirm the drift on purpose, before resuming."
            ]
        );
        // A field the run is back on gets no line.
        let healthy = healthy_environment(Some(&self::record("2.11.0+cu128")), &events, clock);
        assert!(restore_steps(&healthy, &events).is_empty());
    }
}
