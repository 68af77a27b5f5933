//! A Domino run's first gradient norm. On the embedded default it reads 108 (107.886), far
//! above the 2–5 DFlash settles at; this holds where it comes from. At step 0 the curriculum's λ is
//! `lambda_base_start` (default 1), so the loss is the base logits' alone: the head receives
//! no gradient and the backbone receives DFlash's. The first norm is then the randomly
//! initialised backbone's own, the same as a DFlash run's first step from the same weights.
use dflash_engine::embedded;
use dflash_engine::model::drafter::{DominoConfig, DrafterHead};
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use tch::Device;

use crate::support::topology::cpu_topology;

/// The embedded default's first step, with or without a Domino head (its widths as SpecForge's
/// 27B recipe would scale them down: emb 16, GRU 32).
fn first_step_grad_norm(domino: bool) -> f64 {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut drafter = embedded::tiny_drafter_config(target.config());
    if domino {
        drafter.head = DrafterHead::Domino(DominoConfig {
            emb_dim: 16,
            gru_hidden_dim: 32,
            pure_draft_prefix_len: 0,
        });
    }
    let cfg = embedded::tiny_train_config();
    assert_eq!(
        cfg.training.lambda_base_start, 1.0,
        "the embedded default's λ at step 0"
    );
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let mut trainer =
        Trainer::with_topology(target, drafter, samples, cfg, cpu_topology(1, 1)).unwrap();
    let mut lines = CollectLines::default();
    let options = RunOptions {
        max_steps: Some(1),
        checkpoint_root: None,
    };
    trainer.run(&options, &mut lines).unwrap();
    lines.steps[0].grad_norm
}

#[test]
fn a_domino_runs_first_gradient_is_the_backbones_dflash_gradient() {
    let (dflash, domino) = (first_step_grad_norm(false), first_step_grad_norm(true));
    eprintln!("first-step grad norm: DFlash {dflash:.3}, Domino {domino:.3}");
    assert!(
        dflash > 10.0,
        "the random backbone's first gradient: {dflash}"
    );
    assert!(
        (domino - dflash).abs() < 1e-3 * dflash,
        "Domino {domino} ≠ DFlash {dflash}: at λ = 1 the head should get no gradient"
    );
}
