//! The start's checkpoint gate: which checkpoint the run resumes from, read from the disk and
//! from the journal's record of what was written (`engine::train::recovery` is the rule).
//!
//! Leftovers of an interrupted prune are removed and journaled. A damaged or missing newest
//! checkpoint refuses the start, naming each damaged directory, the steps a fallback loses and
//! the `--resume-from` to type; with it, the damaged directories are moved aside
//! (`checkpoints/corrupt-step-…`) and the choice is journaled (`CheckpointFallback`), so the
//! next start resumes from the chosen step without asking again.
use std::path::{Path, PathBuf};

use dflash_engine::train::checkpoint::checkpoint_dir_name;
use dflash_engine::train::recovery::{self, Refusal};
use dflash_shared::events::{Event, EventKind, Severity};

use crate::run::handle::RunHandle;
use crate::run::journal::JournalQuery;

/// `--resume-from`: `step-12`, `step-0000000012` or `12`; `step-0` is the start of the run.
pub fn parse_resume_from(text: &str) -> Result<u64, String> {
    text.strip_prefix("step-")
        .unwrap_or(text)
        .parse()
        .map_err(|_| {
            format!(
                "--resume-from {text:?}: expected a checkpoint step such as step-1200 (the names \
                 under <run-dir>/checkpoints/), or step-0 to start the run over"
            )
        })
}

/// The newest checkpoint step the journal says the run has: the last one written, or the
/// step an explicit fallback went back to, whichever came later.
pub fn recorded_step(events: &[Event]) -> Option<u64> {
    events.iter().fold(None, |recorded, e| match &e.kind {
        EventKind::CheckpointWritten { step, .. } => Some(*step),
        EventKind::CheckpointFallback { to_step, .. } => Some(*to_step),
        _ => recorded,
    })
}

/// Applies the rule to `root`; `Ok` is the directory to resume from, `Err` the refusal text.
pub fn pass(
    root: &Path,
    run_dir: &Path,
    handle: &RunHandle,
    resume_from: Option<u64>,
) -> Result<Option<PathBuf>, String> {
    let found = recovery::inspect(root).map_err(|e| format!("reading the checkpoints: {e}"))?;
    let events = handle
        .with_journal(|j| j.query(&JournalQuery::default()))
        .map_err(|e| format!("reading the journal for its checkpoint record: {e}"))?;
    let decision = recovery::decide(&found, recorded_step(&events), resume_from)
        .map_err(|refusal| refusal_text(&refusal, run_dir))?;
    let applied = recovery::apply(root, &decision).map_err(|e| {
        format!("cleaning up the checkpoints: {e}. Nothing was trained; fix it and start again")
    })?;
    for dir in &applied.removed {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::Note {
                message: format!(
                    "removed {}: an incomplete checkpoint directory (no manifest) older than \
                     the newest complete one, left by a deletion that was interrupted",
                    dir.display()
                ),
            },
        );
    }
    for (from, to, why) in &applied.moved_aside {
        handle.record_event_logged(
            Severity::Warn,
            EventKind::Note {
                message: format!(
                    "moved the damaged checkpoint {} to {} ({why})",
                    from.display(),
                    to.display()
                ),
            },
        );
    }
    if let Some((from_step, to_step)) = decision.fallback {
        handle.record_event_logged(
            Severity::Crit,
            EventKind::CheckpointFallback { from_step, to_step },
        );
    }
    Ok(decision.resume.map(|(_, dir)| dir))
}

fn refusal_text(refusal: &Refusal, run_dir: &Path) -> String {
    let run = run_dir.display();
    match refusal {
        Refusal::BadChoice { asked, detail } => {
            format!("--resume-from step-{asked} cannot be used for the run in {run}: {detail}")
        }
        Refusal::Damaged {
            damaged,
            missing_recorded,
            fallback,
            newest,
        } => {
            let mut text = format!(
                "refusing to resume the run in {run}: its newest checkpoint is damaged, and \
                 nothing is skipped without your say:\n"
            );
            for (step, dir, why) in damaged {
                text.push_str(&format!("  - step {step} ({}): {why}\n", dir.display()));
            }
            if let Some(step) = missing_recorded {
                text.push_str(&format!(
                    "  - step {step}: the journal records it as written, but there is no \
                     checkpoints/{}\n",
                    checkpoint_dir_name(*step)
                ));
            }
            let lost = Refusal::lost_steps(*fallback, *newest);
            let choice = fallback.unwrap_or(0);
            let from = match fallback {
                Some(step) => format!("the newest intact checkpoint, step {step}"),
                None => "the start of the run (no intact checkpoint is left)".into(),
            };
            text.push_str(&format!(
                "Resuming from {from} loses {lost}, which are trained again. To do that, start \
                 again with --resume-from step-{choice}: the damaged directories are then moved \
                 to checkpoints/corrupt-step-… (kept, not deleted) and the choice is journaled. \
                 Or put the missing or damaged files back and start again as before."
            ));
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind) -> Event {
        Event {
            seq: 1,
            ts_ms: 0,
            severity: Severity::Info,
            kind,
        }
    }

    #[test]
    fn the_record_is_the_last_write_or_fallback() {
        let written = |step| {
            event(EventKind::CheckpointWritten {
                step,
                path: String::new(),
                bytes: 0,
            })
        };
        assert_eq!(recorded_step(&[]), None);
        assert_eq!(recorded_step(&[written(4), written(6)]), Some(6));
        let fallback = event(EventKind::CheckpointFallback {
            from_step: 6,
            to_step: 2,
        });
        assert_eq!(recorded_step(&[written(6), fallback.clone()]), Some(2));
        assert_eq!(recorded_step(&[written(6), fallback, written(3)]), Some(3));
    }

    #[test]
    fn resume_from_accepts_the_directory_name_or_the_step() {
        assert_eq!(parse_resume_from("step-0000000012"), Ok(12));
        assert_eq!(parse_resume_from("step-12"), Ok(12));
        assert_eq!(parse_resume_from("12"), Ok(12));
        let err = parse_resume_from("latest").unwrap_err();
        assert!(err.contains("step-1200"), "{err}");
    }

    #[test]
    fn the_refusal_says_what_is_lost_and_what_to_type() {
        let text = refusal_text(
            &Refusal::Damaged {
                damaged: vec![(
                    4,
                    PathBuf::from("/r/checkpoints/step-0000000004"),
                    "bad".into(),
                )],
                missing_recorded: Some(6),
                fallback: Some(2),
                newest: 6,
            },
            Path::new("/r"),
        );
        for part in [
            "step 4 (/r/checkpoints/step-0000000004): bad",
            "step 6: the journal records it as written",
            "loses steps 3–6 (4 steps)",
            "--resume-from step-2",
            "corrupt-step-",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
