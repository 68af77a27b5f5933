//! What a start does with the checkpoint directories it finds.
//!
//! Three kinds of `step-…/` directory can be on disk: intact (its manifest verifies),
//! incomplete (no manifest) and corrupt (a file's size or hash differs, or the manifest is
//! unreadable). A publish is a rename of a complete directory, so an incomplete one is always
//! the remains of a deletion: older than the newest intact checkpoint it is the leftover of an
//! interrupted prune and is removed; newer, it is a checkpoint someone damaged. A damaged
//! newest checkpoint is never skipped silently: the start is refused with the steps a fallback
//! would lose, and only an explicit `resume_from` naming the newest intact step goes back to
//! it, moving each damaged directory aside (`corrupt-step-…`), never deleting it.
//!
//! [`inspect`] reads the disk, [`decide`] is the pure rule, [`apply`] moves and removes.
use std::fs;
use std::path::{Path, PathBuf};

use super::checkpoint::{self, checkpoint_dir_name, CheckpointError, MANIFEST};

/// Prefix of a damaged checkpoint directory moved aside; [`checkpoint::list`] never lists it.
pub const SET_ASIDE_PREFIX: &str = "corrupt-";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    Intact,
    /// No manifest.
    Incomplete,
    /// Why verification failed.
    Corrupt(String),
    /// Older than the newest intact checkpoint and has a manifest: not read (verifying every
    /// old checkpoint would hash gigabytes on every start).
    NotVerified,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub step: u64,
    pub dir: PathBuf,
    pub state: DirState,
}

/// Every `step-…` directory under `root`, oldest first. Leftovers of a killed writer are
/// cleaned first ([`checkpoint::recover`]); then directories are verified newest first until
/// one is intact.
pub fn inspect(root: &Path) -> Result<Vec<Found>, CheckpointError> {
    checkpoint::recover(root)?;
    let mut found = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: root.to_path_buf(),
                cause: source,
            })
        }
    };
    for entry in entries {
        let entry = entry.map_err(|source| CheckpointError::Io {
            path: root.to_path_buf(),
            cause: source,
        })?;
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(step) = name.strip_prefix("step-").and_then(|s| s.parse().ok()) else {
            continue;
        };
        if entry.path().is_dir() {
            found.push(Found {
                step,
                dir: entry.path(),
                state: DirState::NotVerified,
            });
        }
    }
    found.sort_by_key(|f| f.step);
    let mut intact_seen = false;
    for f in found.iter_mut().rev() {
        if !f.dir.join(MANIFEST).is_file() {
            f.state = DirState::Incomplete;
        } else if !intact_seen {
            f.state = match checkpoint::verify(&f.dir) {
                Ok(_) => {
                    intact_seen = true;
                    DirState::Intact
                }
                Err(e) => DirState::Corrupt(e.to_string()),
            };
        }
    }
    Ok(found)
}

/// What the start does, once allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// The checkpoint to resume from; `None` starts at step 0.
    pub resume: Option<(u64, PathBuf)>,
    /// Incomplete directories older than the newest intact checkpoint (an interrupted prune).
    pub remove: Vec<PathBuf>,
    /// Damaged directories skipped by the operator's choice, with why each is damaged.
    pub set_aside: Vec<(PathBuf, String)>,
    /// `(newest step the run had, the step it goes back to)` when the choice skips steps.
    pub fallback: Option<(u64, u64)>,
}

/// Why the start is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The newest checkpoint is damaged or missing. `damaged` lists each damaged directory
    /// newer than `fallback` (the newest intact step, `None` when there is none); `recorded`
    /// is the newest step the journal says was written when no directory of it is left.
    Damaged {
        damaged: Vec<(u64, PathBuf, String)>,
        missing_recorded: Option<u64>,
        fallback: Option<u64>,
        newest: u64,
    },
    /// `resume_from` names a step that cannot be resumed from; `detail` says why.
    BadChoice { asked: u64, detail: String },
}

impl Refusal {
    /// The steps a fallback re-trains: "steps 3–6 (4 steps)".
    pub fn lost_steps(fallback: Option<u64>, newest: u64) -> String {
        let from = fallback.unwrap_or(0) + 1;
        let n = newest + 1 - from;
        if n == 1 {
            format!("step {newest} (1 step)")
        } else {
            format!("steps {from}–{newest} ({n} steps)")
        }
    }
}

/// The rule. `recorded` is the newest checkpoint step the run's journal records as written
/// (or as the explicit fallback target); `resume_from` the operator's `--resume-from` (0: the
/// start of the run, allowed only when no intact checkpoint is left).
pub fn decide(
    found: &[Found],
    recorded: Option<u64>,
    resume_from: Option<u64>,
) -> Result<Decision, Refusal> {
    let intact = found
        .iter()
        .rev()
        .find(|f| f.state == DirState::Intact)
        .map(|f| (f.step, f.dir.clone()));
    let intact_step = intact.as_ref().map(|(s, _)| *s);
    let is_newer = |step: u64| intact_step.is_none_or(|i| step > i);
    let damaged: Vec<(u64, PathBuf, String)> = found
        .iter()
        .filter(|f| is_newer(f.step))
        .map(|f| {
            let why = match &f.state {
                DirState::Corrupt(why) => why.clone(),
                _ => format!("it has no {MANIFEST}: its files were deleted after it was published"),
            };
            (f.step, f.dir.clone(), why)
        })
        .collect();
    let newest_on_disk = found.last().map(|f| f.step);
    let missing_recorded =
        recorded.filter(|&r| is_newer(r) && newest_on_disk.is_none_or(|n| r > n));
    let newest = damaged
        .iter()
        .map(|d| d.0)
        .chain(missing_recorded)
        .max()
        .or(intact_step)
        .unwrap_or(0);
    let remove = found
        .iter()
        .filter(|f| f.state == DirState::Incomplete && !is_newer(f.step))
        .map(|f| f.dir.clone())
        .collect();
    let is_damaged = !damaged.is_empty() || missing_recorded.is_some();
    match resume_from {
        None if is_damaged => Err(Refusal::Damaged {
            damaged,
            missing_recorded,
            fallback: intact_step,
            newest,
        }),
        None => Ok(Decision {
            resume: intact,
            remove,
            ..Decision::default()
        }),
        Some(asked) if Some(asked) == intact_step || (asked == 0 && intact_step.is_none()) => {
            Ok(Decision {
                resume: intact,
                remove,
                fallback: is_damaged.then_some((newest, asked)),
                set_aside: damaged
                    .into_iter()
                    .map(|(_, dir, why)| (dir, why))
                    .collect(),
            })
        }
        Some(asked) => Err(Refusal::BadChoice {
            asked,
            detail: bad_choice(found, asked, intact_step),
        }),
    }
}

fn bad_choice(found: &[Found], asked: u64, intact: Option<u64>) -> String {
    let newest_intact = match intact {
        Some(step) => format!("the newest intact checkpoint is step-{step}"),
        None => "no intact checkpoint is left, so only step-0 (the start of the run) can be \
                 chosen"
            .to_string(),
    };
    match found.iter().find(|f| f.step == asked) {
        None if asked == 0 => format!("step-0 starts the run over, and {newest_intact}"),
        None => format!(
            "there is no {}; {newest_intact}",
            checkpoint_dir_name(asked)
        ),
        Some(f) if intact.is_some_and(|i| asked < i) => format!(
            "{} is older than the newest intact checkpoint; --resume-from only steps back past \
             damaged checkpoints, and {newest_intact}",
            f.dir.display()
        ),
        Some(f) => format!("{} is damaged; {newest_intact}", f.dir.display()),
    }
}

/// What [`apply`] did, for the journal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    pub removed: Vec<PathBuf>,
    /// `(from, to, why it was damaged)`.
    pub moved_aside: Vec<(PathBuf, PathBuf, String)>,
}

/// Removes and moves aside what `decision` says; the resume target is left alone.
pub fn apply(root: &Path, decision: &Decision) -> Result<Applied, CheckpointError> {
    let mut applied = Applied::default();
    for dir in &decision.remove {
        fs::remove_dir_all(dir).map_err(|source| CheckpointError::Io {
            path: dir.clone(),
            cause: source,
        })?;
        applied.removed.push(dir.clone());
    }
    for (dir, why) in &decision.set_aside {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let base = root.join(format!("{SET_ASIDE_PREFIX}{name}"));
        let mut dest = base.clone();
        let mut n = 2;
        while dest.exists() {
            dest = PathBuf::from(format!("{}-{n}", base.display()));
            n += 1;
        }
        fs::rename(dir, &dest).map_err(|source| CheckpointError::Io {
            path: dir.clone(),
            cause: source,
        })?;
        applied.moved_aside.push((dir.clone(), dest, why.clone()));
    }
    if !applied.moved_aside.is_empty() {
        // `latest` named a directory that was just moved; point it at the resume target.
        match &decision.resume {
            Some((step, _)) => checkpoint::point_latest(root, &checkpoint_dir_name(*step))?,
            None => {
                let _ = fs::remove_file(root.join("latest"));
            }
        }
    }
    if !applied.removed.is_empty() || !applied.moved_aside.is_empty() {
        fs::File::open(root)
            .and_then(|f| f.sync_all())
            .map_err(|source| CheckpointError::Io {
                path: root.to_path_buf(),
                cause: source,
            })?;
    }
    Ok(applied)
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
