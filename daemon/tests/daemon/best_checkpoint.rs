//! The run keeps its best checkpoint (the highest online DDTree τ at the serving budget) beside
//! the newest through rotation and a restart, journals it, and `dflashd export --best` exports
//! it; a run without online evaluation says it has none.
use std::path::Path;

use dflash_engine::train::drafter_io::{load_hf, named_parameters};
use dflash_engine::train::resume::read_checkpoint_drafter;
use dflash_shared::events::EventKind;
use tch::{Device, Kind};

use crate::support::binary::{checkpoint_steps, journal, run, start_for_steps, write_config};

/// The embedded default, evaluated online every `online_every` steps on two short prompts,
/// checkpointed every step and keeping only the newest.
fn config(path: &Path, online_every: u64) {
    write_config(path, |c| {
        c.training.online_eval_every = Some(online_every);
        c.training.online_eval_max_prompts = 2;
        c.training.online_eval_max_new_tokens = 16;
        c.training.checkpoint_every = 1;
        c.training.keep_checkpoints = 1;
    });
}

/// Every best the journal records: (step, τ, budget).
fn bests(run_dir: &Path) -> Vec<(u64, f64, usize)> {
    journal(run_dir)
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::BestCheckpoint {
                step,
                tau_tree,
                budget,
                ..
            } => Some((step, tau_tree, budget)),
            _ => None,
        })
        .collect()
}

fn export_best(root: &Path, run_dir: &Path, out: &Path) -> (i32, String, String) {
    run(
        root,
        &[
            "export",
            "--best",
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--dtype",
            "f32",
        ],
    )
}

#[test]
fn the_best_checkpoint_survives_rotation_and_a_restart_and_exports() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (cfg, run_dir) = (root.join("best.toml"), root.join("run"));
    config(&cfg, 4);
    let cfg_arg = ["--config", cfg.to_str().unwrap()];

    // Step 4's online evaluation is the only one: the best, kept while rotation (keep 1)
    // deletes steps 1–3 and 5.
    let (code, _, err) = start_for_steps(root, &run_dir, 6, &cfg_arg);
    assert_eq!(code, 0, "{err}");
    let first = bests(&run_dir);
    assert_eq!(first.len(), 1, "{first:?}");
    let (step, tau, budget) = first[0];
    assert_eq!((step, budget), (4, 32));
    assert!(tau.is_finite() && tau >= 1.0, "{tau}");
    assert_eq!(checkpoint_steps(&run_dir), [4, 6]);

    let out = root.join("export");
    let (code, stdout, err) = export_best(root, &run_dir, &out);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains(&format!("best checkpoint: step 4, tree τ@32 {tau:.2}")),
        "{stdout}"
    );
    let (_, best_weights) =
        read_checkpoint_drafter(&run_dir.join("checkpoints/step-0000000004")).unwrap();
    let (_, newest_weights) =
        read_checkpoint_drafter(&run_dir.join("checkpoints/step-0000000006")).unwrap();
    let exported = named_parameters(&load_hf(&out, Device::Cpu, Kind::Float).unwrap().vs);
    assert_eq!(exported.len(), best_weights.len());
    for ((name, e), (_, b)) in exported.iter().zip(&best_weights) {
        assert!(e.equal(b), "{name} is not the best checkpoint's");
    }
    assert!(
        exported
            .iter()
            .zip(&newest_weights)
            .any(|((_, e), (_, n))| !e.equal(n)),
        "the newest checkpoint differs, so the export really chose"
    );

    // A restart restores the best: step 8's evaluation replaces it only by beating its τ.
    let (code, _, err) = start_for_steps(root, &run_dir, 2, &cfg_arg);
    assert_eq!(code, 0, "{err}");
    let after = bests(&run_dir);
    match after.as_slice() {
        [_] => assert_eq!(checkpoint_steps(&run_dir), [4, 8]),
        [_, (8, tau8, 32)] => {
            assert!(*tau8 > tau, "{tau8} replaced {tau} without beating it");
            assert_eq!(checkpoint_steps(&run_dir), [8]);
        }
        other => panic!("unexpected bests {other:?}"),
    }
}

#[test]
fn without_online_evaluation_export_best_says_there_is_none_and_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (cfg, run_dir) = (root.join("off.toml"), root.join("run"));
    config(&cfg, 0);
    let (code, _, err) = start_for_steps(root, &run_dir, 1, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = export_best(root, &run_dir, &root.join("export"));
    assert_eq!(code, 1, "{err}");
    for wanted in [
        "has no best checkpoint: online evaluation is off (training.online_eval_every = 0)",
        "newest checkpoint is step 1",
        "dflashd export --checkpoint",
    ] {
        assert!(err.contains(wanted), "{wanted:?} missing from {err}");
    }
    assert!(bests(&run_dir).is_empty());
}
