//! The in-training online evaluation of a Domino drafter reports its base acceptance beside
//! the corrected one (SpecForge's `base_accept_len` beside `accept_len`, served): the same
//! prompts decoded from the LM head's logits alone, method for method, exactly as
//! `decode::run_online_with(.., DraftLogits::LmHeadOnly)` decodes them. A DFlash drafter has
//! no base figures.
use dflash_engine::decode::{run_online_with, DraftLogits, Method, Sampling, Settings};
use dflash_engine::embedded;
use dflash_engine::model::drafter::{DominoConfig, DrafterHead};
use dflash_engine::train::online_prompts::OnlinePrompts;
use dflash_engine::train::{CollectLines, RunOptions, Trainer, TrainerSpec};
use tch::Device;

use crate::support::topology::cpu_topology;

const PROMPTS: usize = 3;
const NEW_TOKENS: usize = 24;

fn trainer(head: DrafterHead, steps: u64) -> Trainer {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let mut drafter = embedded::tiny_drafter_config(target.config());
    drafter.head = head;
    let mut cfg = embedded::tiny_train_config();
    cfg.training.eval_every = 0;
    cfg.training.online_eval_every = Some(0); // evaluated explicitly below
    cfg.training.online_eval_max_prompts = PROMPTS;
    cfg.training.online_eval_max_new_tokens = NEW_TOKENS;
    cfg.training.online_eval_tree_budgets = vec![8];
    // the correction trains from the first step, so after a few steps it moves the drafts
    cfg.training.lambda_base_start = 0.0;
    let (samples, _) =
        embedded::tiny_samples(target.config().vocab_size(), cfg.training.max_length).unwrap();
    let mut trainer = Trainer::build(TrainerSpec {
        online_prompts: Some(OnlinePrompts {
            prompts: embedded::tiny_heldout_prompts(),
            stop_tokens: vec![embedded::TINY_END_OF_TURN],
        }),
        ..TrainerSpec::new(target, drafter, samples, cfg, cpu_topology(1, 1))
    })
    .unwrap();
    if steps > 0 {
        let options = RunOptions {
            max_steps: Some(steps),
            checkpoint_root: None,
        };
        trainer.run(&options, &mut CollectLines::default()).unwrap();
    }
    trainer
}

/// Chain τ and DDTree-8 τ of the trainer's drafter decoding from `logits`, computed here
/// without the online evaluation's code.
fn decoded(trainer: &Trainer, logits: DraftLogits) -> (f64, f64) {
    let prompts = embedded::tiny_heldout_prompts();
    let settings = Settings {
        max_new_tokens: NEW_TOKENS,
        stop_tokens: vec![embedded::TINY_END_OF_TURN],
        sampling: Sampling::Greedy,
        seed: 0,
    };
    let methods = [Method::Chain, Method::Tree { budget: 8 }];
    let report = run_online_with(
        trainer.target(),
        trainer.drafter(),
        &prompts[..PROMPTS],
        &settings,
        &methods,
        logits,
    )
    .unwrap();
    let tau = |i: usize| report.methods[i].acceptance.tau.unwrap();
    (tau(0), tau(1))
}

#[test]
fn a_domino_runs_online_evaluation_carries_the_uncorrected_drafters_tau_per_method() {
    let head = DrafterHead::Domino(DominoConfig {
        emb_dim: 16,
        gru_hidden_dim: 32,
        pure_draft_prefix_len: 0,
    });
    let trainer = trainer(head, 80);
    // Trained 80 steps, the backbone drafts something (chain τ ≈ 1.7) while the small,
    // young correction rarely flips an argmax; scaled up a thousandfold it dominates the
    // logits, so the corrected and the base drafts differ and a swap or a copy would show.
    tch::no_grad(|| {
        let mut w = trainer.var_store().variables()["embed_proj.2.weight"].shallow_clone();
        let _ = w.f_mul_scalar_(1000.0).unwrap();
    });
    let online = trainer.evaluate_online(Some(3.0)).unwrap().unwrap();
    let base = online
        .base
        .clone()
        .expect("a Domino drafter has base figures");
    assert_eq!(base.tau_ddtree.keys().collect::<Vec<_>>(), vec![&8]);

    let corrected = decoded(&trainer, DraftLogits::Drafter);
    let lm_head = decoded(&trainer, DraftLogits::LmHeadOnly);
    eprintln!(
        "online chain τ {:.4} (base {:.4}), ddtree_8 {:.4} (base {:.4})",
        online.tau_chain, base.tau_chain, online.tau_ddtree[&8], base.tau_ddtree[&8]
    );
    assert_eq!((online.tau_chain, online.tau_ddtree[&8]), corrected);
    assert_eq!((base.tau_chain, base.tau_ddtree[&8]), lm_head);
    assert_ne!(
        corrected, lm_head,
        "the scaled correction should change some draft"
    );
    assert_eq!(
        online.base_methods().len(),
        online.methods().len(),
        "one base figure per method"
    );
}

#[test]
fn a_dflash_runs_online_evaluation_has_no_base_figures() {
    let trainer = trainer(DrafterHead::Dflash, 0);
    let online = trainer.evaluate_online(None).unwrap().unwrap();
    assert_eq!(online.base, None);
    assert_eq!(
        (online.tau_chain, online.tau_ddtree[&8]),
        decoded(&trainer, DraftLogits::Drafter)
    );
}
