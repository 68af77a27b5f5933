//! The start's checkpoint gate with the real binary: a half-deleted old checkpoint is removed
//! and journaled; a damaged or missing newest checkpoint refuses the start with the steps a
//! fallback loses and the `--resume-from` to type; the explicit choice moves the damaged
//! directory aside, is journaled, and holds for the next start.
use std::path::{Path, PathBuf};

use dflash_shared::events::EventKind;

use crate::support::binary::{checkpoint_steps, journal, start_for_steps};

/// `dflashd start` on `<root>/run` for `steps` more steps: (exit code, stdout, stderr).
fn start(root: &Path, steps: u64, extra: &[&str]) -> (i32, String, String) {
    start_for_steps(root, &root.join("run"), steps, extra)
}

fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join("run/checkpoints")
        .join(format!("step-{step:010}"))
}

/// A run dir with checkpoints at steps 2 and 4 (two starts of two steps).
fn two_checkpoints() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let (code, _, err) = start(root.path(), 2, &[]);
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(checkpoint_steps(&root.path().join("run")), vec![2, 4]);
    root
}

fn notes(root: &Path) -> Vec<String> {
    journal(&root.join("run"))
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Note { message } => Some(message),
            _ => None,
        })
        .collect()
}

#[test]
fn a_half_deleted_old_checkpoint_is_removed_and_journaled() {
    let root = two_checkpoints();
    // What a kill inside the deletion of an old checkpoint left (the report): a
    // `step-…` directory holding only config.json and trainer_state.json.
    let leaked = step_dir(root.path(), 1);
    std::fs::create_dir(&leaked).unwrap();
    for f in ["config.json", "trainer_state.json"] {
        std::fs::copy(step_dir(root.path(), 2).join(f), leaked.join(f)).unwrap();
    }
    let (code, out, err) = start(root.path(), 1, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed at step 4"), "{out}");
    assert!(!leaked.exists(), "the incomplete directory was left behind");
    let notes = notes(root.path());
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with(&format!("removed {}", leaked.display()))
                && n.contains("incomplete")),
        "{notes:?}"
    );
}

#[test]
fn a_corrupt_newest_checkpoint_needs_an_explicit_journaled_fallback() {
    let root = two_checkpoints();
    let newest = step_dir(root.path(), 4);
    let weights = newest.join("drafter.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&weights, &bytes).unwrap();

    let (code, _, err) = start(root.path(), 1, &[]);
    assert_ne!(code, 0, "started on a corrupt newest checkpoint");
    for part in [
        "drafter.safetensors",
        "loses steps 3–4 (2 steps)",
        "--resume-from step-2",
        "corrupt-step-",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    assert!(
        weights.is_file(),
        "the refusal moved or deleted the checkpoint"
    );

    // A step that is not the newest intact one is refused, naming the one that is.
    let (code, _, err) = start(root.path(), 1, &["--resume-from", "step-4"]);
    assert_ne!(code, 0);
    assert!(err.contains("newest intact checkpoint is step-2"), "{err}");

    let (code, out, err) = start(root.path(), 1, &["--resume-from", "step-2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed at step 2"), "{out}");
    let aside = root.path().join("run/checkpoints/corrupt-step-0000000004");
    assert_eq!(
        std::fs::read(aside.join("drafter.safetensors")).unwrap(),
        bytes,
        "the corrupt checkpoint was not kept as it was"
    );
    assert_eq!(checkpoint_steps(&root.path().join("run")), vec![2, 3]);
    let events = journal(&root.path().join("run"));
    assert!(
        events.iter().any(|e| e.kind
            == EventKind::CheckpointFallback {
                from_step: 4,
                to_step: 2
            }),
        "no fallback in the journal"
    );
    assert!(
        notes(root.path())
            .iter()
            .any(|n| n.contains("moved the damaged checkpoint") && n.contains("SHA-256")),
        "no set-aside note"
    );

    // The choice holds: the next start resumes from step 3 without asking again.
    let (code, out, err) = start(root.path(), 1, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed at step 3"), "{out}");
}

#[test]
fn a_newest_checkpoint_without_its_manifest_is_not_skipped_silently() {
    let root = two_checkpoints();
    std::fs::remove_file(step_dir(root.path(), 4).join("manifest.json")).unwrap();
    let (code, out, err) = start(root.path(), 1, &[]);
    assert_ne!(code, 0, "resumed from an older step silently:\n{out}");
    assert!(
        err.contains("step 4") && err.contains("no manifest.json"),
        "{err}"
    );
    assert!(err.contains("--resume-from step-2"), "{err}");
    assert!(step_dir(root.path(), 4).is_dir());
}

#[test]
fn a_newest_checkpoint_the_journal_records_but_the_disk_lacks_is_refused() {
    let root = two_checkpoints();
    std::fs::remove_dir_all(step_dir(root.path(), 4)).unwrap();
    let (code, out, err) = start(root.path(), 1, &[]);
    assert_ne!(code, 0, "resumed from an older step silently:\n{out}");
    assert!(
        err.contains("step 4: the journal records it as written"),
        "{err}"
    );
    assert!(
        err.contains("loses step 3–4") || err.contains("loses steps 3–4"),
        "{err}"
    );
}
