//! Unlocked locked keys on resume, with the tiny embedded model on CPU: epochs, anchors, block
//! size and moved tap layers carry the checkpoint's weights and data position over when
//! unlocked and are refused (saying how to unlock) when not; a different number of tap layers
//! is refused even unlocked, because the drafter's fc input width changes.
use std::path::PathBuf;

use dflash_engine::embedded;
use dflash_engine::model::drafter::DrafterConfig;
use dflash_engine::train::unlocked::UnlockedKeys;
use dflash_engine::train::TrainConfig;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use tch::Device;

fn trainer(cfg: TrainConfig, edit_drafter: impl FnOnce(&mut DrafterConfig)) -> Trainer {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let mut drafter_cfg = embedded::tiny_drafter_config(target.config());
    edit_drafter(&mut drafter_cfg);
    Trainer::new(target, drafter_cfg, samples, cfg, Device::Cpu).unwrap()
}

fn small() -> TrainConfig {
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.batch_size = 2;
    cfg
}

/// A checkpoint after 2 steps, and the weights it holds.
fn checkpointed() -> (tempfile::TempDir, PathBuf, Vec<(String, tch::Tensor)>) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(small(), |_| {});
    let summary = t
        .run(
            &RunOptions {
                max_steps: Some(2),
                checkpoint_root: Some(dir.path().join("checkpoints")),
            },
            &mut CollectLines::default(),
        )
        .unwrap();
    let weights = t.master_weights();
    (dir, summary.last_checkpoint.unwrap(), weights)
}

fn keys(k: &[&str]) -> UnlockedKeys {
    UnlockedKeys::from_keys(k)
}

#[test]
fn unlocked_changes_carry_the_checkpoint_over_and_locked_ones_say_how_to_unlock() {
    let (_dir, ckpt, weights) = checkpointed();
    let base = small();
    let taps =
        embedded::tiny_drafter_config(embedded::tiny_target(None, Device::Cpu).unwrap().config())
            .target_layer_ids;
    let moved: Vec<usize> = taps.iter().map(|&l| l.saturating_sub(1)).collect();
    assert_ne!(moved, taps, "the test moves the taps");

    type Edit = Box<dyn Fn(&mut DrafterConfig)>;
    let with = |edit: &dyn Fn(&mut TrainConfig)| {
        let mut cfg = base.clone();
        edit(&mut cfg);
        cfg
    };
    let cases: Vec<(&str, TrainConfig, Edit, &str)> = vec![
        (
            "training.epochs",
            with(&|c| c.training.epochs += 2),
            Box::new(|_| {}),
            "`training.epochs`",
        ),
        (
            "training.num_anchors",
            with(&|c| c.training.num_anchors /= 2),
            Box::new(|_| {}),
            "`training.num_anchors`",
        ),
        (
            "drafter.block_size",
            with(&|c| c.gamma = None),
            Box::new(|d| d.block_size *= 2),
            "`block_size`",
        ),
        (
            "drafter.target_layer_ids",
            base.clone(),
            Box::new(move |d| d.target_layer_ids = moved.clone()),
            "`target_layer_ids`",
        ),
    ];
    for (key, cfg, edit, named) in cases {
        let mut locked = trainer(cfg.clone(), &edit);
        let err = locked.restore_checkpoint(&ckpt).unwrap_err().to_string();
        assert!(
            err.contains(named) && err.contains(key) && err.contains("dflash-tui attach"),
            "{key}: {err}"
        );

        let mut unlocked = trainer(cfg.clone(), &edit);
        let total = unlocked.total_steps();
        unlocked
            .restore_checkpoint_unlocked(&ckpt, &keys(&[key]))
            .unwrap_or_else(|e| panic!("{key} unlocked: {e}"));
        assert_eq!(unlocked.step_count(), 2, "{key}: the position is kept");
        assert_eq!(unlocked.total_steps(), total, "{key}: the new schedule");
        for ((n, a), (_, b)) in unlocked.master_weights().iter().zip(&weights) {
            assert!(a.equal(b), "{key}: weight {n} carried over");
        }
        // And it trains on from there.
        let summary = unlocked
            .run(
                &RunOptions {
                    max_steps: Some(1),
                    checkpoint_root: None,
                },
                &mut CollectLines::default(),
            )
            .unwrap();
        assert_eq!(summary.final_step, 3, "{key}");
    }
}

#[test]
fn epochs_unlocked_recompute_the_schedule_from_the_new_total() {
    let (_dir, ckpt, _) = checkpointed();
    let six = trainer(small(), |_| {}).total_steps();
    let mut cfg = small();
    cfg.training.epochs *= 2;
    let mut more = trainer(cfg, |_| {});
    more.restore_checkpoint_unlocked(&ckpt, &keys(&["training.epochs"]))
        .unwrap();
    assert_eq!(more.total_steps(), six * 2);
}

#[test]
fn a_different_number_of_tap_layers_is_refused_even_unlocked() {
    let (_dir, ckpt, _) = checkpointed();
    let mut wider = trainer(small(), |d| d.target_layer_ids.push(0));
    let err = wider
        .restore_checkpoint_unlocked(&ckpt, &keys(&["drafter.target_layer_ids"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("drafter.target_layer_ids") && err.contains("fc input"),
        "{err}"
    );
}
