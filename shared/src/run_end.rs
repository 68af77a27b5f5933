//! How a run ended, read from its journal: the one rule the console and `dflash-tui status`
//! share, so a run that trained to the end reads as finished, not as a daemon to restart.
use serde::{Deserialize, Serialize};

use crate::events::{Event, EventKind, TRAINING_COMPLETE};
use crate::metrics::TimestampMs;
use crate::run_dir::TARGET_DIR_NAME;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndKind {
    /// Every epoch trained.
    Finished,
    /// Stopped before the end on purpose: an operator, a signal, `--max-steps`, a shutdown.
    Stopped,
    /// A step, a worker or the final checkpoint failed.
    Failed,
}

impl EndKind {
    pub fn word(self) -> &'static str {
        match self {
            EndKind::Finished => "finished",
            EndKind::Stopped => "stopped",
            EndKind::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnding {
    pub kind: EndKind,
    /// The daemon's own sentence (`RunStopped.reason`).
    pub reason: String,
    /// The checkpoint the run ended on, if any.
    pub checkpoint: Option<String>,
    pub at_ms: TimestampMs,
}

/// The ending of the newest run in `events` (journal order), or `None` while it runs (no
/// `RunStopped` after its last `RunStarted`). A run that failed or paused after it started,
/// or whose final checkpoint could not be written, ended `Failed`.
pub fn run_ending(events: &[Event]) -> Option<RunEnding> {
    let start = events
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .unwrap_or(0);
    let this_run = &events[start..];
    let (at_ms, reason, checkpoint) = this_run.iter().rev().find_map(|e| match &e.kind {
        EventKind::RunStopped { reason, checkpoint } => {
            Some((e.ts_ms, reason.clone(), checkpoint.clone()))
        }
        _ => None,
    })?;
    let failed = this_run.iter().any(|e| {
        matches!(
            e.kind,
            EventKind::RunPaused { .. } | EventKind::WorkerFailed { .. }
        )
    }) || reason.starts_with("stopping without a final checkpoint")
        || reason.starts_with("the run did not start");
    let kind = if failed {
        EndKind::Failed
    } else if reason.starts_with(TRAINING_COMPLETE) {
        EndKind::Finished
    } else {
        EndKind::Stopped
    };
    Some(RunEnding {
        kind,
        reason,
        checkpoint,
        at_ms,
    })
}

/// The embedded default's held-out prompts as a checkout has them (the file the binary
/// compiles in): the online evaluation's input, none of them a training prompt. Its offline
/// held-out split is drawn from the compiled-in training data and has no file.
pub const EMBEDDED_HELD_OUT_PROMPTS: &str = "assets/tiny/heldout_prompts.jsonl";

/// What the run was started from, as far as the caller knows: it decides whether the evaluate
/// line can name the target and the held-out input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSource {
    /// `dflashd start` without `--config` (the status's `config_path` is `None`).
    EmbeddedDefault,
    /// A config file, or not known (the daemon is down): the target and the held-out data are
    /// the config's, which the caller does not hold, so the line names them as placeholders.
    ConfigOrUnknown,
}

/// The `dflashd eval` command for a run's exported drafter in `{run_dir}/export`.
pub fn eval_command(run_dir: &str, source: RunSource) -> String {
    match source {
        RunSource::EmbeddedDefault => format!(
            "dflashd eval --target {run_dir}/{TARGET_DIR_NAME} --drafter {run_dir}/export \
             --online --prompts {EMBEDDED_HELD_OUT_PROMPTS}"
        ),
        RunSource::ConfigOrUnknown => format!(
            "dflashd eval --target TARGET_DIR --drafter {run_dir}/export --data HELD_OUT.jsonl"
        ),
    }
}

/// What an operator does next after `ending`, as commands to paste: export and evaluate a
/// finished run, resume a stopped one, or look at why it failed and resume from the last
/// checkpoint. `run_dir` is the run's directory.
pub fn next_steps(ending: &RunEnding, run_dir: &str, source: RunSource) -> Vec<String> {
    let export = format!("dflashd export --checkpoint {run_dir} --out {run_dir}/export");
    let eval = eval_command(run_dir, source);
    let resume = format!("dflashd start --run-dir {run_dir} (resumes from its newest checkpoint)");
    match ending.kind {
        EndKind::Finished => vec![
            format!("export the drafter: {export}"),
            format!("evaluate it: {eval}"),
            "start the next run: dflashd start --config NEW.toml --run-dir NEW_DIR".into(),
        ],
        EndKind::Stopped => vec![
            format!("resume: {resume}"),
            format!("or export what it has learned: {export}"),
        ],
        EndKind::Failed => vec![
            "read why: dflash-tui tail --level warn".into(),
            format!("then resume: {resume}"),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Severity;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            ts_ms: seq as i64 * 1000,
            severity: Severity::Info,
            kind,
        }
    }

    fn started(seq: u64) -> Event {
        event(
            seq,
            EventKind::RunStarted {
                run_name: "r".into(),
                resumed_from_step: None,
            },
        )
    }

    fn stopped(seq: u64, reason: &str) -> Event {
        event(
            seq,
            EventKind::RunStopped {
                reason: reason.into(),
                checkpoint: Some("/r/checkpoints/step-0000000642".into()),
            },
        )
    }

    #[test]
    fn a_run_that_trained_every_epoch_finished_and_one_stopped_early_did_not() {
        let done = [
            started(1),
            stopped(2, "training complete: 6 epochs, 642 steps"),
        ];
        let e = run_ending(&done).unwrap();
        assert_eq!((e.kind, e.at_ms), (EndKind::Finished, 2000));
        let steps = next_steps(&e, "/r", RunSource::ConfigOrUnknown);
        assert!(steps[0].contains("dflashd export --checkpoint /r"));

        let stop = [started(1), stopped(2, "SIGTERM received at step 40")];
        assert_eq!(run_ending(&stop).unwrap().kind, EndKind::Stopped);
    }

    #[test]
    fn the_evaluate_line_names_the_embedded_defaults_target_and_held_out_prompts() {
        let done = [
            started(1),
            stopped(2, "training complete: 6 epochs, 642 steps"),
        ];
        let e = run_ending(&done).unwrap();
        let embedded = next_steps(&e, "runs/default", RunSource::EmbeddedDefault);
        assert_eq!(
            embedded[1],
            "evaluate it: dflashd eval --target runs/default/target --drafter \
             runs/default/export --online --prompts assets/tiny/heldout_prompts.jsonl"
        );
        let config = next_steps(&e, "/r", RunSource::ConfigOrUnknown);
        assert!(config[1].contains("--target TARGET_DIR"), "{}", config[1]);
        assert!(config[1].contains("--data HELD_OUT.jsonl"), "{}", config[1]);
        // The prompts the line names are the checkout's own file.
        let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert!(checkout.join(EMBEDDED_HELD_OUT_PROMPTS).is_file());
    }

    #[test]
    fn a_failure_after_the_start_makes_the_ending_failed() {
        let paused = [
            started(1),
            event(
                2,
                EventKind::RunPaused {
                    reason: "step 3 failed".into(),
                },
            ),
            stopped(3, "SIGTERM received while paused after a failed step"),
        ];
        assert_eq!(run_ending(&paused).unwrap().kind, EndKind::Failed);
        let unsaved = [
            started(1),
            stopped(2, "stopping without a final checkpoint: disk full"),
        ];
        assert_eq!(run_ending(&unsaved).unwrap().kind, EndKind::Failed);
    }

    #[test]
    fn a_running_run_has_no_ending_even_after_an_earlier_one_ended() {
        assert!(run_ending(&[started(1)]).is_none());
        let resumed = [
            started(1),
            stopped(2, "SIGTERM received at step 40"),
            started(3),
        ];
        assert!(run_ending(&resumed).is_none());
        assert!(run_ending(&[]).is_none());
    }
}
