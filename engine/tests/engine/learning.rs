//! The embedded default really learns: within 100 optimizer steps the held-out loss falls and
//! the offline acceptance length τ rises, measurably.
use dflash_engine::embedded;
use dflash_engine::train::online_prompts::OnlinePrompts;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::{CollectLines, RunOptions, Trainer, TrainerSpec};
use tch::Device;

#[test]
fn embedded_default_loss_falls_and_tau_rises() {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0; // evaluated explicitly below
                                 // online: after the 100th step (the cadence's), and explicitly before the first
    cfg.training.online_eval_every = Some(100);
    cfg.training.online_eval_max_prompts = 6;
    cfg.training.online_eval_max_new_tokens = 32;
    cfg.training.online_eval_tree_budgets = vec![8];
    cfg.training.serve_tree_budget = 8;
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let drafter_cfg = embedded::tiny_drafter_config(target.config());
    let mut trainer = Trainer::build(TrainerSpec {
        online_prompts: Some(OnlinePrompts {
            prompts: embedded::tiny_heldout_prompts(),
            stop_tokens: vec![embedded::TINY_END_OF_TURN],
        }),
        ..TrainerSpec::new(
            target,
            drafter_cfg,
            samples,
            cfg,
            TopologySpec::single(Device::Cpu),
        )
    })
    .unwrap();

    let before = trainer.evaluate_held_out().unwrap().unwrap();
    let online_before = trainer.evaluate_online(Some(before.tau)).unwrap().unwrap();
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

    // Online acceptance (real speculative decoding against the pre-trained tiny target) rises
    // too, and rides on the metrics line of the step the cadence chose.
    let online_lines: Vec<_> = lines.steps.iter().filter(|m| m.online.is_some()).collect();
    assert_eq!(online_lines.len(), 1, "only step 100 is due");
    let online_after = online_lines[0].online.clone().unwrap();
    eprintln!(
        "online chain tau {:.4} -> {:.4}, ddtree_8 {:?} -> {:?} ({} prompts, {:.1} s)",
        online_before.tau_chain,
        online_after.tau_chain,
        online_before.tau_ddtree.get(&8),
        online_after.tau_ddtree.get(&8),
        online_after.prompts,
        online_after.seconds
    );
    assert_eq!(online_after.prompts, 6);
    assert!(online_before.tau_chain < 1.1, "{online_before:?}");
    assert!(
        online_after.tau_chain > online_before.tau_chain + 0.15,
        "online chain tau {} -> {}",
        online_before.tau_chain,
        online_after.tau_chain
    );
    assert!(online_after.tau_ddtree.contains_key(&8));
    // The serving budget rides with the online figures, and the held-out evaluation scores the
    // tree oracle at it beside chain τ.
    assert_eq!(
        online_after.serve_tau_ddtree(),
        Some((8, online_after.tau_ddtree[&8]))
    );
    let tree = after
        .tree_oracle_tau()
        .expect("the serving budget is scored");
    assert_eq!(tree.at_serve_budget(), Some((8, after.tau_tree_oracle[&8])));
}
