//! The prose sections of the status report: goal, constraints, progress, next steps.
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::format::{format_bytes, format_si};

use super::StatusReport;
use crate::actions::LOCKED_KEYS;
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
    let locked: Vec<String> = LOCKED_KEYS
        .iter()
        .filter_map(|key| {
            let value = config.and_then(|c| value_at(c, key))?;
            Some(format!("{key} = {value}"))
        })
        .collect();
    if locked.is_empty() {
        lines.push(format!(
            "Locked keys ({}) change only through a confirmed, audited unlock.",
            LOCKED_KEYS.join(", ")
        ));
    } else {
        lines.push(format!(
            "Locked: {}; they change only through a confirmed, audited unlock.",
            locked.join(", ")
        ));
    }
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
    for alert in report.alerts.iter().filter(|a| a.level >= Severity::Warn) {
        p.blocked
            .push(format!("{} (detector {}).", alert.headline, alert.detector));
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

pub fn next_steps(report: &StatusReport, events: &[Event]) -> Vec<String> {
    let mut steps = Vec::new();
    let alert_start = report.alerts.iter().map(|a| a.since.as_str()).min();
    for event in events {
        match &event.kind {
            EventKind::EnvironmentDrift {
                field,
                before,
                after,
            } => {
                let label = field.strip_prefix("python.").unwrap_or(field);
                steps.push(format!(
                    "Restore {label} {before} (now {after}), or confirm the drift on purpose, \
                     before resuming."
                ))
            }
            EventKind::CacheChanged { name, change, .. }
                if change.contains("delet") || change.contains("cold") =>
            {
                steps.push(format!(
                    "Let the {} re-warm through the serialized warmup; leave caches alone while \
                     workers run.",
                    wording::cache_label(name)
                ))
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
        for step in dflash_shared::run_end::next_steps(&ending, run_dir) {
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
}
