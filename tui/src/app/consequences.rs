//! What the console itself can say about an action before the daemon answers: the last
//! checkpoint, the current throughput and how long it held, and what a deletion removes.
use dflash_shared::actions::Action;
use dflash_shared::format::{format_bytes, format_si};

use super::App;
use crate::fmt;

pub(super) fn local_consequences(action: &Action, app: &App) -> Vec<String> {
    let mut lines = Vec::new();
    let status = app.status.as_ref();
    let stops_run = matches!(action, Action::StopRun | Action::Kill | Action::PowerOff);
    if stops_run {
        let last_checkpoint = status.and_then(|s| s.checkpoints.iter().max_by_key(|c| c.step));
        lines.push(match last_checkpoint {
            Some(c) => format!(
                "last checkpoint {} ago, at step {}",
                fmt::duration_ms(app.now_ms - c.written_ms),
                fmt::thousands(c.step)
            ),
            None => "no checkpoint yet in this run".into(),
        });
        if let Some(tokens) = app.tokens_per_s() {
            let held = status
                .and_then(|s| s.throughput.stable_since_ms)
                .map(|since| format!(", stable for {}", fmt::duration_ms(app.now_ms - since)))
                .unwrap_or_else(|| ", not stable".into());
            lines.push(format!("now {} tok/s{held}", format_si(tokens)));
        }
    }
    match action {
        Action::StopRun => {
            lines.push("the daemon writes a checkpoint, then exits; resume continues from it".into())
        }
        Action::Kill => lines.push(match (app.step_epoch(), status.and_then(|s| s.checkpoints.iter().map(|c| c.step).max())) {
            (Some((step, _)), Some(saved)) => format!(
                "no final checkpoint: the {} steps since step {} are lost",
                fmt::thousands(step.saturating_sub(saved)),
                fmt::thousands(saved)
            ),
            _ => "no final checkpoint: progress since the last checkpoint is lost".into(),
        }),
        Action::PowerOff => lines.push(
            "after the checkpoint the machine powers off; nothing runs until someone powers it on"
                .into(),
        ),
        Action::DeleteCache { name } => {
            match status.and_then(|s| s.caches.iter().find(|c| c.name == *name)) {
                Some(cache) => {
                    lines.push(format!(
                        "deletes {}: {}, {} entries ({})",
                        cache.path,
                        format_bytes(cache.size_bytes),
                        fmt::thousands(cache.entries),
                        if cache.warm { "warm" } else { "cold" }
                    ));
                    lines.push(
                        "the next start compiles from cold: slower warmup, and first-compile races \
                         become possible"
                            .into(),
                    );
                }
                None => lines.push(format!("deletes the {name} cache (size unknown)")),
            }
        }
        Action::UnlockKey { .. } => lines.push(
            "the key may then change on resume; the locked value is what the run was validated with"
                .into(),
        ),
        Action::ForgetHealthyRecord => {
            if let Some(record) = status.and_then(|s| s.healthy_record.as_deref()) {
                lines.push(format!(
                    "throughput is judged against {} tok/s, recorded {} ago by run {} at step {}",
                    format_si(record.throughput.tokens_per_s),
                    fmt::duration_ms(app.now_ms - record.recorded_ms),
                    record.run_name,
                    fmt::thousands(record.step)
                ));
            }
            lines.push(
                "the baseline is then learned from this run's own rate: a slow rate now reads \
                 as normal"
                    .into(),
            );
        }
    }
    lines
}
