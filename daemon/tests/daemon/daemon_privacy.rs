//! Other users cannot read the run (issue 15, defect 3): the real binary, with the temp root
//! opened to everyone (0755) so nothing but dflashd's own modes stands in the way.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::binary::{checkpoint_steps, dflashd, Daemon};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        out.push(path.clone());
        if entry.file_type().unwrap().is_dir() {
            walk(&path, out);
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Whether `nobody` can read `path` (a file) or list it (a directory).
fn nobody_can_read(path: &Path) -> bool {
    let tool = if path.is_dir() { "ls" } else { "cat" };
    Command::new("runuser")
        .args(["-u", "nobody", "--", tool])
        .arg(path)
        .output()
        .expect("runuser")
        .status
        .success()
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn another_uid_cannot_read_the_run_dir_journal_checkpoints_or_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = Daemon::spawn(root, &["--max-steps", "3"]);
    assert!(d.wait_exit().success(), "{}", d.stderr());
    assert!(
        !checkpoint_steps(&d.run_dir).is_empty(),
        "a checkpoint was written"
    );

    let logs = root.join("xdg-state/dflash/logs");
    let mut made = vec![d.run_dir.clone(), logs.clone()];
    walk(&d.run_dir, &mut made);
    walk(&logs, &mut made);
    for name in ["journal.jsonl", "metrics.jsonl", "recording.jsonl"] {
        assert!(made.contains(&d.run_dir.join(name)), "{name} missing");
    }
    assert!(made
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "safetensors")));
    for p in &made {
        let m = mode(p);
        if std::fs::symlink_metadata(p)
            .unwrap()
            .file_type()
            .is_symlink()
        {
            continue;
        }
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{} is {m:04o}", p.display());
    }
    if is_root() {
        // The same files as another uid, which is what the modes are for.
        let journal = d.run_dir.join("journal.jsonl");
        std::fs::set_permissions(&d.run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            !nobody_can_read(&journal),
            "with only the file's own mode in the way, nobody still cannot read the journal"
        );
        std::fs::set_permissions(&d.run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        for p in [&d.run_dir, &logs, &journal, &d.run_dir.join("checkpoints")] {
            assert!(!nobody_can_read(p), "nobody can read {}", p.display());
        }
        // The check itself can fail: nobody reads what is open to it.
        let open = root.join("open.txt");
        std::fs::write(&open, "x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            nobody_can_read(&open),
            "runuser -u nobody must work for this test"
        );
    } else {
        eprintln!("not root: the `runuser -u nobody` half of this test needs root; modes checked");
    }
}

#[test]
fn a_socket_in_a_shared_directory_is_refused_and_the_directory_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let shared = root.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = dflashd(root)
        .args(["start", "--max-steps", "1", "--run-dir"])
        .arg(root.join("run"))
        .arg("--socket")
        .arg(shared.join("x.sock"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("never changes the mode"), "{stderr}");
    assert!(stderr.contains("dflashd/dflashd.sock"), "{stderr}");
    assert_eq!(mode(&shared), 0o1777, "the directory's mode is untouched");
}
