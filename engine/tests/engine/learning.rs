//! The embedded default really learns: within 100 optimizer steps the held-out loss falls and
//! the offline acceptance length τ rises, measurably.
use dflash_engine::train::embedded;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use tch::Device;

#[test]
fn embedded_default_loss_falls_and_tau_rises() {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut cfg = embedded::tiny_train_config();
    cfg.eval_every = 0; // evaluated explicitly below
    let (samples, _) = embedded::tiny_samples(target.config().vocab_size(), cfg.max_len).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut trainer = Trainer::new(target, drafter_cfg, samples, cfg, Device::Cpu).unwrap();

    let before = trainer.evaluate_held_out().unwrap().unwrap();
    let mut lines = CollectLines::default();
    let summary = trainer
        .run(
            &RunOptions {
                max_steps: Some(100),
                ..Default::default()
            },
            &mut lines,
        )
        .unwrap();
    for m in &lines.steps {
        assert!(
            m.loss.is_finite() && m.grad_norm.is_finite(),
            "step {}: {m:?}",
            m.step
        );
    }
    let losses: Vec<f64> = lines.steps.iter().map(|m| m.loss).collect();
    let epochs: Vec<u32> = lines.steps.iter().map(|m| m.epoch).collect();
    assert_eq!(summary.steps_run, 100);
    // 100 steps stay inside the first of 6 epochs (107 steps each); epochs count from 1.
    assert!(epochs.iter().all(|&e| e == 1), "{epochs:?}");
    assert_eq!(trainer.epoch_in_progress(), 1);
    let after = trainer.evaluate_held_out().unwrap().unwrap();
    eprintln!(
        "held-out before: loss {:.4} tau {:.4} acc {:.4}; after 100 steps: loss {:.4} tau {:.4} acc {:.4}",
        before.loss, before.tau, before.accuracy, after.loss, after.tau, after.accuracy
    );

    // A random drafter predicts nothing: CE near ln(512) = 6.24 and τ = 1.
    assert!(before.loss > 5.8, "{before:?}");
    assert!(before.tau < 1.1, "{before:?}");
    assert!(
        after.loss < before.loss - 0.6,
        "loss {} -> {}",
        before.loss,
        after.loss
    );
    assert!(
        after.tau > before.tau + 0.2,
        "tau {} -> {}",
        before.tau,
        after.tau
    );
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[90..]));
    assert!(last < first - 0.5, "training loss {first} -> {last}");
}
