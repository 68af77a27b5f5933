//! Carries out a confirmed, re-checked action. Stop and kill go to the run loop, which knows
//! how to checkpoint; the rest the control plane does itself. Every outcome is journaled.
use std::path::{Path, PathBuf};
use std::time::Duration;

use dflash_shared::actions::Action;
use dflash_shared::events::{EventKind, Severity};
use tokio::sync::oneshot;

use crate::run::handle::{CommandOutcome, RunCommand, RunHandle};
use crate::run::locked_keys as locked;
use crate::run::pending::Approved;
use dflash_shared::format::{format_bytes, format_duration_ms};

/// Runs `approved`; `Ok` is the outcome sentence, `Err` says why it could not be done.
/// `command_timeout`: how long a stop or kill may take in the run loop before the reply says so.
pub async fn execute(
    handle: &RunHandle,
    approved: Approved,
    command_timeout: Duration,
) -> Result<String, String> {
    let id = approved.pending.id.clone();
    let result = match &approved.pending.action {
        Action::StopRun => stop_run_loop(handle, &id, false, command_timeout).await,
        Action::Kill => stop_run_loop(handle, &id, true, command_timeout).await,
        Action::PowerOff => power_off(handle, &id, command_timeout).await,
        Action::DeleteCache { name } => match &approved.cache_path {
            Some(path) => delete_cache(handle, name, PathBuf::from(path)).await,
            None => Err(format!("no directory recorded for the {name} cache")),
        },
        Action::UnlockKey { key } => unlock_key(handle, key, &id),
        Action::ForgetHealthyRecord => forget_healthy_record(handle, &id, command_timeout).await,
    };
    let outcome = match &result {
        Ok(o) => o.clone(),
        Err(e) => format!("failed: {e}"),
    };
    let severity = if result.is_ok() {
        Severity::Warn
    } else {
        Severity::Crit
    };
    handle.record_event_logged(
        severity,
        EventKind::ActionExecuted {
            action_id: id,
            outcome,
        },
    );
    result
}

/// Unlocks `key` for this daemon and records it in the run dir, so the restart that brings
/// the changed value accepts it (see `runtime::locked`).
fn unlock_key(handle: &RunHandle, key: &str, id: &str) -> Result<String, String> {
    handle.unlock_key(key);
    let canonical = handle
        .policy()
        .canonical_locked_key(key)
        .unwrap_or_else(|| key.to_string());
    let unlock = locked::Unlock {
        key: canonical.clone(),
        action_id: id.to_string(),
        unlocked_ms: dflash_shared::clock::now_ms(),
    };
    locked::record_unlock(handle.run_dir(), unlock).map_err(|e| {
        format!("{canonical} is unlocked for this daemon only; recording the unlock failed: {e}")
    })?;
    Ok(format!(
        "{canonical} is unlocked; a changed value is accepted on the next resume"
    ))
}

/// Hands the forget to the run loop, whose health feed writes the record and so removes it
/// (`RunCommand::ForgetHealthyRecord`); answers with the files it removed.
async fn forget_healthy_record(
    handle: &RunHandle,
    id: &str,
    command_timeout: Duration,
) -> Result<String, String> {
    let (reply, rx) = oneshot::channel::<CommandOutcome>();
    let command = RunCommand::ForgetHealthyRecord {
        action_id: id.to_string(),
        reply,
    };
    if handle.send_command(command).is_err() {
        return Err("no training loop is running: there is no record being judged against".into());
    }
    await_reply(rx, command_timeout, |waited| {
        format!(
            "the run loop did not answer within {} s (a long step or evaluation); the forget \
             is still queued and happens at its next step",
            waited.as_secs()
        )
    })
    .await?
}

/// Waits up to `timeout` for the run loop's reply to a command it was handed. `Err` is the
/// sentence for a reply that never came: the run loop ended without one, or `timed_out` words
/// what the caller's command still does after the wait.
async fn await_reply(
    rx: oneshot::Receiver<CommandOutcome>,
    timeout: Duration,
    timed_out: impl FnOnce(Duration) -> String,
) -> Result<CommandOutcome, String> {
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(_)) => Err("the run loop ended without answering; check the journal".into()),
        Err(_) => Err(timed_out(timeout)),
    }
}

async fn stop_run_loop(
    handle: &RunHandle,
    id: &str,
    kill: bool,
    command_timeout: Duration,
) -> Result<String, String> {
    let (reply, rx) = oneshot::channel::<CommandOutcome>();
    let cmd = if kill {
        RunCommand::Kill {
            action_id: id.to_string(),
            reply,
        }
    } else {
        RunCommand::Stop {
            action_id: id.to_string(),
            reply,
        }
    };
    let verb = if kill { "killed" } else { "stopped" };
    let outcome = match handle.send_command(cmd) {
        Err(_) => {
            let outcome = "no training loop is running; the daemon exits".to_string();
            handle.record_event_logged(
                Severity::Warn,
                EventKind::RunStopped {
                    reason: format!("{verb} by operator ({id}); no run loop"),
                    checkpoint: None,
                },
            );
            outcome
        }
        Ok(()) => {
            let reply = await_reply(rx, command_timeout, |waited| {
                format!(
                    "the run loop did not answer within {}; it may still be checkpointing",
                    format_duration_ms(waited.as_millis() as i64)
                )
            })
            .await?;
            reply.map_err(|e| {
                format!(
                    "the run loop could not {}: {e}",
                    if kill { "stop" } else { "checkpoint and stop" }
                )
            })?
        }
    };
    handle.request_shutdown(format!("run {verb} by operator ({id})"));
    Ok(outcome)
}

async fn power_off(
    handle: &RunHandle,
    id: &str,
    command_timeout: Duration,
) -> Result<String, String> {
    let Some(argv) = handle.policy().poweroff_command.clone() else {
        return Err("power-off is disabled".into());
    };
    let stopped = stop_run_loop(handle, id, false, command_timeout).await?;
    let Some((program, args)) = argv.split_first() else {
        return Err(format!("{stopped}; the power-off command is empty"));
    };
    let status = tokio::process::Command::new(program)
        .args(args)
        .status()
        .await
        .map_err(|e| format!("{stopped}; running `{}` failed: {e}", argv.join(" ")))?;
    if status.success() {
        Ok(format!(
            "{stopped}; `{}` accepted the power-off",
            argv.join(" ")
        ))
    } else {
        Err(format!(
            "{stopped}; `{}` exited with {status}",
            argv.join(" ")
        ))
    }
}

async fn delete_cache(handle: &RunHandle, name: &str, path: PathBuf) -> Result<String, String> {
    let before = handle.caches().into_iter().find(|c| c.name == name);
    let p = path.clone();
    tokio::task::spawn_blocking(move || remove_cache_dir(&p))
        .await
        .map_err(|e| format!("deleting {}: {e}", path.display()))??;
    let size = before
        .map(|c| format!(" ({}, {} entries)", format_bytes(c.size_bytes), c.entries))
        .unwrap_or_default();
    handle.record_event_logged(
        Severity::Warn,
        EventKind::CacheChanged {
            name: name.to_string(),
            path: path.display().to_string(),
            change: format!("deleted by operator{size}"),
        },
    );
    Ok(format!(
        "deleted {}{size}; the next start compiles cold",
        path.display()
    ))
}

/// Removes a cache directory, refusing symlinks so a link cannot redirect the deletion.
fn remove_cache_dir(path: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "{} is a symlink; refusing to delete through it",
            path.display()
        ));
    }
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    std::fs::remove_dir_all(path).map_err(|e| format!("deleting {}: {e}", path.display()))
}
