use super::*;
use crate::train::checkpoint::CheckpointWriter;

fn write(root: &Path, step: u64) -> PathBuf {
    let mut w = CheckpointWriter::begin(root, step).unwrap();
    w.write_bytes("state.json", format!("{{\"step\": {step}}}").as_bytes())
        .unwrap();
    w.commit().unwrap()
}

fn found(step: u64, state: DirState) -> Found {
    Found {
        step,
        dir: PathBuf::from(format!("/c/{}", checkpoint_dir_name(step))),
        state,
    }
}

#[test]
fn inspect_verifies_newest_first_until_one_is_intact() {
    let root = tempfile::tempdir().unwrap();
    for s in [1, 2, 3, 4] {
        write(root.path(), s);
    }
    fs::remove_file(root.path().join("step-0000000001").join(MANIFEST)).unwrap();
    fs::write(root.path().join("step-0000000004").join("state.json"), b"x").unwrap();
    let states: Vec<(u64, DirState)> = inspect(root.path())
        .unwrap()
        .into_iter()
        .map(|f| (f.step, f.state))
        .collect();
    assert_eq!(states[0], (1, DirState::Incomplete));
    assert_eq!(states[1], (2, DirState::NotVerified));
    assert_eq!(states[2], (3, DirState::Intact));
    assert_eq!(states[3].0, 4);
    assert!(
        matches!(&states[3].1, DirState::Corrupt(why) if why.contains("state.json")),
        "{:?}",
        states[3]
    );
}

#[test]
fn an_incomplete_directory_older_than_the_newest_intact_one_is_removed() {
    let list = [found(2, DirState::Incomplete), found(4, DirState::Intact)];
    let d = decide(&list, Some(4), None).unwrap();
    assert_eq!(d.resume.unwrap().0, 4);
    assert_eq!(d.remove, vec![PathBuf::from("/c/step-0000000002")]);
    assert!(d.set_aside.is_empty() && d.fallback.is_none());
}

#[test]
fn a_damaged_newest_checkpoint_is_refused_with_the_steps_a_fallback_loses() {
    let list = [
        found(2, DirState::Intact),
        found(4, DirState::Corrupt("bad hash".into())),
        found(6, DirState::Incomplete),
    ];
    match decide(&list, Some(6), None).unwrap_err() {
        Refusal::Damaged {
            damaged,
            missing_recorded,
            fallback,
            newest,
        } => {
            assert_eq!(damaged.len(), 2);
            assert_eq!(damaged[0].2, "bad hash");
            assert!(
                damaged[1].2.contains("no manifest.json"),
                "{}",
                damaged[1].2
            );
            assert_eq!((missing_recorded, fallback, newest), (None, Some(2), 6));
            assert_eq!(Refusal::lost_steps(fallback, newest), "steps 3–6 (4 steps)");
        }
        other => panic!("{other:?}"),
    }
    // The explicit choice of the newest intact step sets both aside and removes nothing.
    let d = decide(&list, Some(6), Some(2)).unwrap();
    assert_eq!(d.resume.unwrap().0, 2);
    assert_eq!(d.set_aside.len(), 2);
    assert!(d.remove.is_empty());
    assert_eq!(d.fallback, Some((6, 2)));
}

#[test]
fn a_recorded_checkpoint_missing_from_disk_is_refused() {
    let list = [found(2, DirState::Intact)];
    match decide(&list, Some(4), None).unwrap_err() {
        Refusal::Damaged {
            damaged,
            missing_recorded,
            fallback,
            newest,
        } => {
            assert!(damaged.is_empty());
            assert_eq!((missing_recorded, fallback, newest), (Some(4), Some(2), 4));
        }
        other => panic!("{other:?}"),
    }
    // A checkpoint published but killed before its journal line is newer than the record.
    assert_eq!(decide(&list, Some(1), None).unwrap().resume.unwrap().0, 2);
    // No checkpoint left at all: only step-0 is an explicit choice.
    let refusal = decide(&[], Some(4), None).unwrap_err();
    assert!(matches!(
        refusal,
        Refusal::Damaged {
            fallback: None,
            newest: 4,
            ..
        }
    ));
    let d = decide(&[], Some(4), Some(0)).unwrap();
    assert_eq!((d.resume, d.fallback), (None, Some((4, 0))));
    assert_eq!(Refusal::lost_steps(None, 4), "steps 1–4 (4 steps)");
}

#[test]
fn resume_from_must_name_the_newest_intact_checkpoint() {
    let list = [
        found(2, DirState::NotVerified),
        found(4, DirState::Intact),
        found(6, DirState::Corrupt("bad".into())),
    ];
    for (asked, says) in [
        (2, "older than the newest intact"),
        (6, "is damaged"),
        (5, "there is no step-0000000005"),
        (0, "step-0 starts the run over"),
    ] {
        match decide(&list, None, Some(asked)).unwrap_err() {
            Refusal::BadChoice { detail, .. } => {
                assert!(detail.contains(says), "{asked}: {detail}");
                assert!(
                    detail.contains("newest intact checkpoint is step-4"),
                    "{detail}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Nothing damaged: naming the newest is no fallback.
    let d = decide(&list[..2], None, Some(4)).unwrap();
    assert_eq!((d.resume.unwrap().0, d.fallback), (4, None));
}

#[test]
fn apply_moves_damaged_directories_aside_and_points_latest_at_the_target() {
    let root = tempfile::tempdir().unwrap();
    write(root.path(), 1);
    write(root.path(), 2);
    write(root.path(), 3);
    fs::remove_file(root.path().join("step-0000000001").join(MANIFEST)).unwrap();
    fs::write(root.path().join("step-0000000003").join("state.json"), b"x").unwrap();
    // An earlier set-aside of the same step keeps its name.
    fs::create_dir(root.path().join("corrupt-step-0000000003")).unwrap();
    let found = inspect(root.path()).unwrap();
    let d = decide(&found, Some(3), Some(2)).unwrap();
    let applied = apply(root.path(), &d).unwrap();
    assert_eq!(applied.removed, vec![root.path().join("step-0000000001")]);
    assert_eq!(
        applied.moved_aside[0].1,
        root.path().join("corrupt-step-0000000003-2")
    );
    assert!(root
        .path()
        .join("corrupt-step-0000000003-2/state.json")
        .is_file());
    let steps: Vec<u64> = checkpoint::list(root.path())
        .unwrap()
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(steps, vec![2]);
    assert_eq!(
        fs::read_link(root.path().join("latest")).unwrap(),
        PathBuf::from("step-0000000002")
    );
}
