//! A damaged checkpoint never loads: truncated files, flipped bytes, a missing manifest and a
//! changed locked key all fail with an error naming the file or key; the CLI exits non-zero.
use std::path::{Path, PathBuf};
use std::process::Command;

use dflash_engine::embedded;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use dflash_engine::train::{TrainConfig, TrainError};
use tch::Device;

fn trainer_with(cfg: TrainConfig) -> Trainer {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    Trainer::new(target, drafter_cfg, samples, cfg, Device::Cpu).unwrap()
}

fn small_config() -> TrainConfig {
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = 2;
    cfg
}

/// A run dir with one checkpoint after 2 steps; returns (tempdir, checkpoint dir).
fn checkpointed() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer_with(small_config());
    let root = dir.path().join("checkpoints");
    let summary = t
        .run(
            &RunOptions {
                max_steps: Some(2),
                checkpoint_root: Some(root),
            },
            &mut CollectLines::default(),
        )
        .unwrap();
    let ckpt = summary.last_checkpoint.unwrap();
    (dir, ckpt)
}

fn restore_error(ckpt: &Path) -> String {
    let mut fresh = trainer_with(small_config());
    let err: TrainError = fresh.restore_checkpoint(ckpt).unwrap_err();
    err.to_string()
}

fn export_stderr(ckpt: &Path, out: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .arg("export")
        .arg("--checkpoint")
        .arg(ckpt)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "export of a corrupt checkpoint succeeded"
    );
    assert!(
        !out.join("model.safetensors").exists(),
        "a corrupt checkpoint was exported"
    );
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn flipped_byte_is_a_checksum_error() {
    let (dir, ckpt) = checkpointed();
    let path = ckpt.join("drafter.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = restore_error(&ckpt);
    assert!(
        err.contains("drafter.safetensors") && err.contains("SHA-256"),
        "{err}"
    );
    let stderr = export_stderr(&ckpt, &dir.path().join("export"));
    assert!(
        stderr.contains("drafter.safetensors") && stderr.contains("corrupt"),
        "{stderr}"
    );
}

#[test]
fn truncated_file_is_a_size_error() {
    let (dir, ckpt) = checkpointed();
    let path = ckpt.join("optimizer.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    let err = restore_error(&ckpt);
    assert!(
        err.contains("optimizer.safetensors") && err.contains(&format!("has {} bytes", len / 3)),
        "{err}"
    );
    // `start` refuses to resume from it rather than silently starting over.
    let o = Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .args(["start", "--threads", "1", "--max-steps", "1", "--run-dir"])
        .arg(dir.path())
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", dir.path())
        .env("XDG_STATE_HOME", dir.path())
        .env(
            crate::support::binary::CPU_PEAK_VAR,
            crate::support::binary::CPU_PEAK_FLOPS,
        )
        .output()
        .unwrap();
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("optimizer.safetensors"), "{stderr}");
}

#[test]
fn missing_manifest_and_corrupt_state_are_refused() {
    let (_dir, ckpt) = checkpointed();
    std::fs::write(ckpt.join("trainer_state.json"), b"{\"step\": 99}").unwrap();
    let err = restore_error(&ckpt);
    assert!(err.contains("trainer_state.json"), "{err}");
    std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
    let err = restore_error(&ckpt);
    assert!(err.contains("not a complete checkpoint"), "{err}");
}

#[test]
fn a_changed_locked_key_blocks_resume() {
    let (_dir, ckpt) = checkpointed();
    let mut cfg = small_config();
    cfg.training.lr = 1e-3;
    let mut other = trainer_with(cfg);
    let err = other.restore_checkpoint(&ckpt).unwrap_err().to_string();
    assert!(
        err.contains("`training.lr`") && err.contains("0.002") && err.contains("0.001"),
        "{err}"
    );
    // Runtime keys may change.
    let mut cfg = small_config();
    cfg.training.eval_every = 7;
    cfg.training.checkpoint_every = 3;
    let mut relaxed = trainer_with(cfg);
    relaxed.restore_checkpoint(&ckpt).unwrap();
    assert_eq!(relaxed.step_count(), 2);
}
