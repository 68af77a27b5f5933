//! Exact resume: N steps straight equal N/2 steps, checkpoint, restart from disk, N/2 steps —
//! bit for bit on CPU, both in-process and across `dflashd start` processes (with online
//! evaluations whose new bests write checkpoints of their own, and the best carried over).
use std::path::Path;
use std::process::Command;

use dflash_engine::embedded;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use tch::{Device, Tensor};

fn trainer() -> Trainer {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = 4;
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    Trainer::new(target, drafter_cfg, samples, cfg, Device::Cpu).unwrap()
}

fn run(t: &mut Trainer, steps: u64, root: Option<&Path>) {
    let opts = RunOptions {
        max_steps: Some(steps),
        checkpoint_root: root.map(Path::to_path_buf),
    };
    t.run(&opts, &mut CollectLines::default()).unwrap();
}

fn assert_bitwise_equal(a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "parameter {na} differs after resume");
    }
}

#[test]
fn resumed_run_is_bitwise_identical_to_a_straight_run() {
    const N: u64 = 8;
    let mut straight = trainer();
    run(&mut straight, N, None);

    let dir = tempfile::tempdir().unwrap();
    let mut first_half = trainer();
    run(&mut first_half, N / 2, Some(dir.path()));
    let halfway = first_half
        .master_weights()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect::<Vec<_>>();
    drop(first_half);

    // A fresh trainer (freshly initialised weights, fresh RNG, data position 0) restores
    // everything from disk.
    let mut resumed = trainer();
    let from = resumed
        .resume_latest(dir.path())
        .unwrap()
        .expect("a checkpoint was written");
    assert!(from.ends_with("step-0000000004"), "{}", from.display());
    assert_eq!(resumed.step_count(), N / 2);
    assert_bitwise_equal(&resumed.master_weights(), &halfway);
    run(&mut resumed, N / 2, None);

    assert_eq!(resumed.step_count(), straight.step_count());
    assert_eq!(resumed.data_position(), straight.data_position());
    assert_bitwise_equal(&resumed.master_weights(), &straight.master_weights());
    // And the test can fail: the second half really changed the weights.
    let moved = halfway
        .iter()
        .zip(straight.master_weights())
        .any(|((_, a), (_, b))| !a.equal(&b));
    assert!(moved);
}

fn start(run_dir: &Path, steps: u64, metrics: &Path, config: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .args([
            "start",
            "--foreground",
            "--threads",
            "1",
            "--log-every",
            "0",
            "--max-steps",
            &steps.to_string(),
            "--run-dir",
        ])
        .arg(run_dir)
        .arg("--config")
        .arg(config)
        .arg("--metrics-jsonl")
        .arg(metrics)
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", run_dir)
        .env("XDG_STATE_HOME", run_dir)
        .env(
            crate::support::binary::CPU_PEAK_VAR,
            crate::support::binary::CPU_PEAK_FLOPS,
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dflashd start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn restarting_the_process_continues_exactly() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let metrics = b.path().join("logs/metrics.jsonl");
    // Online evaluations every 2 steps: each new best is checkpointed at its step.
    let config = a.path().join("online.toml");
    crate::support::binary::write_config(&config, |c| {
        c.training.online_eval_every = Some(2);
        c.training.online_eval_max_prompts = 2;
        c.training.online_eval_max_new_tokens = 16;
    });
    start(a.path(), 6, &a.path().join("metrics.jsonl"), &config);
    start(b.path(), 3, &metrics, &config);
    start(b.path(), 3, &metrics, &config);
    let ckpt =
        |d: &Path, f: &str| std::fs::read(d.join("checkpoints/step-0000000006").join(f)).unwrap();
    for file in ["drafter.safetensors", "optimizer.safetensors"] {
        assert!(
            ckpt(a.path(), file) == ckpt(b.path(), file),
            "{file} differs between 6 straight steps and 3 + 3"
        );
    }
    // The restarted run restored the best of step 3 and judged steps 4 and 6 against it.
    let best = |d: &Path| {
        let state: serde_json::Value =
            serde_json::from_slice(&ckpt(d, "trainer_state.json")).unwrap();
        state["best"].clone()
    };
    assert!(
        best(a.path())["step"].as_u64().is_some(),
        "{}",
        best(a.path())
    );
    assert_eq!(best(a.path()), best(b.path()));
    // One JSON object per line; the restarted run continues the step count; the first line
    // is the evaluation of the untrained drafter (τ = 1: it predicts nothing yet).
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<u64> = lines.iter().map(|v| v["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2, 3, 4, 5, 6]);
    for v in &lines {
        for key in [
            "epoch",
            "loss",
            "tokens_per_s",
            "lr",
            "grad_norm",
            "accuracy",
        ] {
            assert!(v[key].is_number(), "{key} missing in {v}");
        }
    }
    assert!(lines[0]["tau"].as_f64().unwrap() < 1.1, "{}", lines[0]);
    assert!(lines[1..].iter().all(|v| v.get("tau").is_none()));
    assert!(lines[1..]
        .iter()
        .all(|v| v["tokens_per_s"].as_f64().unwrap() > 0.0));
}
