//! `dflashd start` sets `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` when the user set
//! neither it nor `PYTORCH_ALLOC_CONF`, keeps the user's value otherwise, and journals and
//! fingerprints which it was (issue 11, piece 4).
use std::path::Path;

use dflash_shared::events::EventKind;

use crate::support::binary::{dflashd, journal};

/// One step of the embedded default in `run_dir` with `conf` as the user's
/// `PYTORCH_CUDA_ALLOC_CONF` (`None`: unset); returns the journal's notes and the
/// fingerprint's `cuda_alloc_conf`.
fn start_once(root: &Path, run_dir: &Path, conf: Option<&str>) -> (Vec<String>, Option<String>) {
    let mut cmd = dflashd(root);
    cmd.env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    if let Some(conf) = conf {
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let out = cmd
        .args(["start", "--max-steps", "1", "--log-every", "0", "--run-dir"])
        .arg(run_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = journal(run_dir)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Note { message } => Some(message),
            _ => None,
        })
        .collect();
    let fp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("fingerprint.json")).unwrap())
            .unwrap();
    let recorded = fp["cuda_alloc_conf"].as_str().map(String::from);
    (notes, recorded)
}

#[test]
fn unset_it_is_set_to_expandable_segments_and_a_user_value_is_kept_both_journaled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();

    let (notes, recorded) = start_once(root, &root.join("unset"), None);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("dflashd set it to expandable_segments:True")),
        "{notes:#?}"
    );
    assert_eq!(
        recorded.as_deref(),
        Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    );

    let (notes, recorded) = start_once(root, &root.join("user"), Some("max_split_size_mb:64"));
    assert!(
        notes.iter().any(|n| n.contains(
            "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 is the user's; dflashd left it"
        )),
        "{notes:#?}"
    );
    assert_eq!(
        recorded.as_deref(),
        Some("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64")
    );
}
