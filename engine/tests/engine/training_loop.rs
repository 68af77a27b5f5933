//! THE training loop ([`Trainer::run`], the one `dflashd start` drives through its hooks):
//! evaluation and checkpoint cadence, the final save, stops asked by the hooks with and
//! without a checkpoint, typed evaluation lines, and a run that stops and resumes through the
//! loop landing bit for bit where a straight run lands.
use std::path::Path;

use dflash_engine::train::checkpoint;
use dflash_engine::train::config::Objective;
use dflash_engine::train::{
    CollectLines, LoopEnd, LoopEvent, Next, RunHooks, RunOptions, TrainConfig, Trainer,
};

use dflash_engine::embedded;
use dflash_engine::model::drafter::{
    Dflash2Config, DominoConfig, DrafterHead, DsparkConfig, MarkovHeadType,
};
use tch::Device;

use crate::support::topology::{config, cpu_topology, tiny_samples, trainer};

fn one_device(cfg: TrainConfig) -> Trainer {
    trainer(cfg, cpu_topology(1, 1))
}

/// A Domino head (a GRU of 32 over embeddings of 16, slot 1 left uncorrected).
const DOMINO: DrafterHead = DrafterHead::Domino(DominoConfig {
    emb_dim: 16,
    gru_hidden_dim: 32,
    pure_draft_prefix_len: 1,
});

/// A DSpark head: a gated Markov head, the confidence head reading its embedding.
const DSPARK: DrafterHead = DrafterHead::Dspark(DsparkConfig {
    markov_rank: 16,
    markov_head_type: MarkovHeadType::Gated,
    confidence_head: true,
    confidence_head_with_markov: true,
});

/// A DFlash2 head with an output multiplier and a soft-cap, so both transforms are trained.
const DFLASH2: DrafterHead = DrafterHead::Dflash2(Dflash2Config {
    conv_kernel_size: 2,
    conv_group_size: 16,
    selector_rank: 16,
    selector_top_k: 8,
    output_multiplier: 0.5,
    final_logit_softcapping: Some(20.0),
});

/// The embedded default's drafter with `head`, on one device.
fn one_device_with(head: DrafterHead) -> impl Fn(TrainConfig) -> Trainer {
    move |cfg| {
        tch::set_num_threads(1);
        let target = embedded::tiny_target(None, Device::Cpu).unwrap();
        let mut drafter_cfg = embedded::tiny_drafter_config(target.config());
        drafter_cfg.head = head;
        Trainer::with_topology(target, drafter_cfg, tiny_samples(), cfg, cpu_topology(1, 1))
            .unwrap()
    }
}

fn steps_on_disk(root: &Path) -> Vec<u64> {
    checkpoint::list(root)
        .unwrap()
        .iter()
        .map(|(s, _)| *s)
        .collect()
}

/// Hooks that stop the loop before step `at + 1`, with or without the final checkpoint, and
/// record every event in order.
struct StopAt {
    at: u64,
    checkpoint: bool,
    events: Vec<String>,
}

impl RunHooks for StopAt {
    fn next(&mut self, trainer: &Trainer) -> Next {
        if trainer.step_count() >= self.at {
            Next::Stop {
                checkpoint: self.checkpoint,
            }
        } else {
            Next::Train
        }
    }

    fn on_event(&mut self, _trainer: &Trainer, event: LoopEvent<'_>) {
        self.events.push(match event {
            LoopEvent::Evaluated(line) => format!("eval@{}", line.step),
            LoopEvent::Stepped(m) => match m.tau {
                Some(_) => format!("step{}+tau", m.step),
                None => format!("step{}", m.step),
            },
            LoopEvent::CheckpointStarted { step } => format!("saving{step}"),
            LoopEvent::CheckpointSaved { step, .. } => format!("saved{step}"),
        });
    }
}

#[test]
fn the_loop_evaluates_and_checkpoints_on_its_cadence_and_saves_the_rest_when_stopped() {
    let mut cfg = config(4, 1);
    cfg.training.eval_every = 3;
    cfg.training.checkpoint_every = 2;
    cfg.training.eval_max_samples = 4;
    let mut t = one_device(cfg);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let opts = RunOptions {
        max_steps: None,
        checkpoint_root: Some(root.clone()),
    };
    let mut hooks = StopAt {
        at: 5,
        checkpoint: true,
        events: Vec::new(),
    };
    let summary = t.run(&opts, &mut hooks).unwrap();
    assert_eq!(
        hooks.events,
        [
            "eval@0",
            "step1",
            "step2",
            "saving2",
            "saved2",
            "step3+tau",
            "step4",
            "saving4",
            "saved4",
            "step5",
            "saving5",
            "saved5"
        ]
    );
    assert_eq!((summary.end, summary.steps_run), (LoopEnd::Stopped, 5));
    assert!(matches!(&summary.final_checkpoint, Some(Ok(dir)) if dir.ends_with("step-0000000005")));
    assert_eq!(steps_on_disk(&root), [2, 4, 5]);
    assert!(summary.first_eval.is_some() && summary.last_eval.is_some());
}

#[test]
fn a_stop_without_checkpoint_leaves_the_unsaved_steps_unsaved() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 2;
    let mut t = one_device(cfg);
    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        max_steps: None,
        checkpoint_root: Some(dir.path().to_path_buf()),
    };
    let mut kill = StopAt {
        at: 3,
        checkpoint: false,
        events: Vec::new(),
    };
    let summary = t.run(&opts, &mut kill).unwrap();
    assert_eq!(summary.end, LoopEnd::Stopped);
    assert!(summary.final_checkpoint.is_none(), "a kill writes nothing");
    assert_eq!(steps_on_disk(dir.path()), [2]);
    assert_eq!(t.step_count(), 3);
}

#[test]
fn the_evaluation_line_is_its_own_type_and_reads_as_an_evaluation_on_the_wire() {
    let mut cfg = config(4, 1);
    cfg.training.eval_every = 100;
    cfg.training.eval_max_samples = 4;
    let mut t = one_device(cfg);
    let mut lines = CollectLines::default();
    let opts = RunOptions {
        max_steps: Some(1),
        checkpoint_root: None,
    };
    let summary = t.run(&opts, &mut lines).unwrap();
    assert_eq!(summary.end, LoopEnd::StepLimit(1));
    let [eval] = lines.evals.as_slice() else {
        panic!("one evaluation before the first step: {:?}", lines.evals)
    };
    assert_eq!((eval.step, eval.epoch), (0, 1));
    let wire = eval.metrics_line();
    assert_eq!(wire.tau, Some(eval.report.tau));
    assert_eq!((wire.tokens_per_s, wire.grad_norm), (0.0, 0.0));
    assert_eq!(lines.steps.len(), 1);
    assert!(lines.steps[0].tokens_per_s > 0.0 && lines.steps[0].tau.is_none());
}

#[test]
fn stopping_and_resuming_through_the_loop_lands_where_a_straight_run_lands() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    resume_lands_where_a_straight_run_lands(cfg);
}

#[test]
fn a_dpace_run_resumes_bit_for_bit_too() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    cfg.training.objective = Objective::Dpace;
    cfg.training.dpace_alpha = 0.5;
    resume_lands_where_a_straight_run_lands(cfg);
}

#[test]
fn a_tree_objective_run_resumes_bit_for_bit_with_either_head() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    cfg.training.objective = Objective::Tree;
    cfg.training.tree.budget = Some(8);
    resume_lands_where_a_straight_run_lands(cfg.clone());
    resume_lands_where_a_straight_run_lands_with(cfg, one_device_with(DOMINO));
}

#[test]
fn a_domino_run_journals_its_curriculum_and_resumes_bit_for_bit_with_either_objective() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    cfg.training.lambda_base_start = 0.8;
    let mut lines = CollectLines::default();
    let mut trainer = one_device_with(DOMINO)(cfg.clone());
    trainer
        .run(
            &RunOptions {
                max_steps: Some(2),
                checkpoint_root: None,
            },
            &mut lines,
        )
        .unwrap();
    let total = trainer.total_steps() as f64;
    let decay_steps = (total * cfg.training.lambda_base_decay_ratio).floor();
    for (i, line) in lines.steps.iter().enumerate() {
        let d = line.domino.expect("a Domino step reports its curriculum");
        let expected = 0.8 * (1.0 - i as f64 / decay_steps);
        assert!(
            (d.lambda_base - expected).abs() < 1e-12,
            "step {}",
            line.step
        );
        assert!(
            (line.loss - ((1.0 - d.lambda_base) * d.final_loss + d.lambda_base * d.base_loss))
                .abs()
                < 1e-4 * line.loss,
            "the loss is the curriculum's blend"
        );
        assert!(d.accept_len >= 1.0 && d.base_accept_len >= 1.0);
    }
    let json = serde_json::to_value(&lines.steps[0]).unwrap();
    for key in [
        "lambda_base",
        "final_loss",
        "base_loss",
        "accept_len",
        "base_accept_len",
    ] {
        assert!(json.get(key).is_some(), "{key} in the metrics line");
    }

    resume_lands_where_a_straight_run_lands_with(cfg.clone(), one_device_with(DOMINO));
    cfg.training.objective = Objective::Dpace;
    resume_lands_where_a_straight_run_lands_with(cfg, one_device_with(DOMINO));
}

#[test]
fn a_dspark_run_reports_its_terms_and_calibration_and_resumes_bit_for_bit() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    let mut lines = CollectLines::default();
    let mut trainer = one_device_with(DSPARK)(cfg.clone());
    trainer
        .run(
            &RunOptions {
                max_steps: Some(2),
                checkpoint_root: None,
            },
            &mut lines,
        )
        .unwrap();
    let w = &cfg.training.dspark;
    for line in &lines.steps {
        let d = line.dspark.expect("a DSpark step reports its terms");
        assert!(line.domino.is_none());
        // The loss is the three terms at their weights, each over the same Σw.
        let blend = w.ce * d.ce_loss + w.l1 * d.l1_loss + w.confidence * d.confidence_loss;
        assert!(
            (line.loss - blend).abs() < 1e-4 * line.loss,
            "step {}: {} vs {blend}",
            line.step,
            line.loss
        );
        assert!(d.tau_probabilistic >= 1.0 && d.base_tau_probabilistic >= 1.0);
        assert!((0.0..=1.0).contains(&d.acceptance_mean));
        assert!(d.confidence_mean.is_some() && d.confidence_abs_error.is_some());
    }
    let json = serde_json::to_value(&lines.steps[0]).unwrap();
    for key in [
        "ce_loss",
        "l1_loss",
        "confidence_loss",
        "tau_probabilistic",
        "base_tau_probabilistic",
        "confidence_mean",
    ] {
        assert!(json.get(key).is_some(), "{key} in the metrics line");
    }
    resume_lands_where_a_straight_run_lands_with(cfg, one_device_with(DSPARK));
}

/// The embedded default's drafter with DFlash2's convolutions and selector, on one device.

#[test]
fn a_dflash2_run_warms_its_selector_up_reports_its_figures_and_resumes_bit_for_bit() {
    let mut cfg = config(4, 1);
    cfg.training.checkpoint_every = 4;
    // One warm-up step, then a ramp of two: α_eff is 0, 0, α/2, α from step 0.
    let total = one_device_with(DFLASH2)(cfg.clone()).total_steps();
    cfg.training.dflash2.selector_warmup_ratio = 1.5 / total as f64;
    cfg.training.dflash2.selector_ramp_ratio = 1.5 / total as f64;
    let mut lines = CollectLines::default();
    let mut trainer = one_device_with(DFLASH2)(cfg.clone());
    trainer
        .run(
            &RunOptions {
                max_steps: Some(3),
                checkpoint_root: None,
            },
            &mut lines,
        )
        .unwrap();
    for line in &lines.steps {
        let d = line.dflash2.expect("a DFlash2 step reports its figures");
        assert!(line.domino.is_none() && line.dspark.is_none());
        let alpha = cfg.training.dflash2.effective_alpha(line.step - 1, total);
        assert_eq!(d.selector_alpha, alpha, "step {}", line.step);
        if alpha == 0.0 {
            assert!((line.loss - d.base_loss).abs() < 1e-9 * line.loss);
        }
        assert!(d.selector_loss > 0.0);
        assert!((0.0..=1.0).contains(&d.unary_topk_recall));
        assert!(d.oracle_accepted_length >= d.serving_accepted_length.max(1.0));
        assert!(d.unary_accepted_length >= 1.0);
    }
    let alphas: Vec<f64> = lines
        .steps
        .iter()
        .map(|l| l.dflash2.unwrap().selector_alpha)
        .collect();
    assert_eq!(alphas, [0.0, 0.0, 0.5]);
    let json = serde_json::to_value(&lines.steps[0]).unwrap();
    for key in [
        "selector_alpha",
        "selector_loss",
        "unary_topk_recall",
        "oracle_accepted_length",
        "serving_accepted_length",
    ] {
        assert!(json.get(key).is_some(), "{key} in the metrics line");
    }
    // The warm-up and the ramp cross the resume at step 3.
    resume_lands_where_a_straight_run_lands_with(cfg, one_device_with(DFLASH2));
}

fn resume_lands_where_a_straight_run_lands(cfg: TrainConfig) {
    resume_lands_where_a_straight_run_lands_with(cfg, one_device);
}

/// Six steps straight, against three, a stop with a checkpoint, a fresh trainer resumed from
/// it and three more: the weights and the data position agree to the bit.
fn resume_lands_where_a_straight_run_lands_with(
    cfg: TrainConfig,
    one_device: impl Fn(TrainConfig) -> Trainer,
) {
    const N: u64 = 6;
    let mut straight = one_device(cfg.clone());
    let s = straight
        .run(
            &RunOptions {
                max_steps: Some(N),
                checkpoint_root: None,
            },
            &mut CollectLines::default(),
        )
        .unwrap();
    assert_eq!(s.end, LoopEnd::StepLimit(N));

    let dir = tempfile::tempdir().unwrap();
    let opts = RunOptions {
        max_steps: None,
        checkpoint_root: Some(dir.path().to_path_buf()),
    };
    let mut first = one_device(cfg.clone());
    let mut stop = StopAt {
        at: 3,
        checkpoint: true,
        events: Vec::new(),
    };
    first.run(&opts, &mut stop).unwrap();
    drop(first);
    assert_eq!(steps_on_disk(dir.path()), [3]);

    let mut resumed = one_device(cfg);
    resumed.resume_latest(dir.path()).unwrap().unwrap();
    let mut rest = StopAt {
        at: N,
        checkpoint: true,
        events: Vec::new(),
    };
    let summary = resumed.run(&opts, &mut rest).unwrap();
    assert_eq!(
        rest.events,
        ["step4", "saving4", "saved4", "step5", "step6", "saving6", "saved6"],
        "the resumed step-3 checkpoint is not rewritten; the cadence continues at 4"
    );
    assert_eq!(summary.steps_run, N - 3);
    for ((name, a), (_, b)) in straight
        .master_weights()
        .iter()
        .zip(resumed.master_weights())
    {
        assert!(a.equal(&b), "{name} differs from the straight run");
    }
    assert_eq!(straight.data_position(), resumed.data_position());
}
