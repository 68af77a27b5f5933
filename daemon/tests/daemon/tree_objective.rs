//! `training.objective = "tree"` end to end through the real binary: `config validate` accepts
//! it and refuses a bad `[training.tree]` naming the key; `start` trains it, resumes from its
//! checkpoint to the same weights, bit for bit, as a run that never stopped; a changed budget is
//! refused on resume; the run exports. (The loss itself is held to its dense oracle in
//! `engine/src/train/tree_objective_tests.rs`.)
use std::path::Path;

use dflash_engine::train::drafter_io::{load_hf, named_parameters};
use dflash_engine::train::resume::read_checkpoint_drafter;
use dflash_shared::config::Objective;
use tch::{Device, Kind};

use crate::support::binary::{checkpoint_steps, run, start_for_steps, write_config};

fn start(root: &Path, config: &Path, run_dir: &Path, steps: u64) -> (i32, String, String) {
    start_for_steps(
        root,
        run_dir,
        steps,
        &["--config", config.to_str().unwrap()],
    )
}

fn tree_config(path: &Path, budget: usize) {
    write_config(path, |c| {
        c.training.objective = Objective::Tree;
        c.training.tree.budget = Some(budget);
    });
}

#[test]
fn a_tree_objective_run_trains_resumes_bit_for_bit_keeps_its_budget_and_exports() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let config = root.join("tree.toml");
    tree_config(&config, 8);
    let (code, out, err) = run(root, &["config", "validate", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    // Two steps, a stop, two more; against four straight.
    let (resumed, straight) = (root.join("resumed"), root.join("straight"));
    let (code, _, err) = start(root, &config, &resumed, 2);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = start(root, &config, &resumed, 2);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed at step 2"), "{out}");
    assert_eq!(checkpoint_steps(&resumed), [2, 4]);
    let (code, _, err) = start(root, &config, &straight, 4);
    assert_eq!(code, 0, "{err}");
    let step4 = "checkpoints/step-0000000004";
    let (_, a) = read_checkpoint_drafter(&resumed.join(step4)).unwrap();
    let (_, b) = read_checkpoint_drafter(&straight.join(step4)).unwrap();
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.equal(y), "{name} differs after the resume");
    }
    let metrics = std::fs::read_to_string(resumed.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(
        !losses.is_empty() && losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{losses:?}"
    );

    // The budget is locked: another one is refused before anything trains.
    tree_config(&config, 16);
    let (code, _, err) = start(root, &config, &resumed, 1);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("training.tree.budget") && err.contains("8 → 16"),
        "{err}"
    );
    assert_eq!(checkpoint_steps(&resumed), [2, 4]);

    let export = root.join("export");
    let (code, _, err) = run(
        root,
        &[
            "export",
            "--checkpoint",
            resumed.to_str().unwrap(),
            "--out",
            export.to_str().unwrap(),
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let exported = load_hf(&export, Device::Cpu, Kind::Float).unwrap();
    let exported = named_parameters(&exported.vs);
    assert_eq!(exported.len(), a.len());
    for ((name, x), (_, y)) in exported.iter().zip(&a) {
        assert!(x.equal(y), "{name} changed in the export");
    }
}

#[test]
fn config_validate_refuses_a_bad_tree_section_naming_the_key() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let config = root.join("bad.toml");
    write_config(&config, |c| {
        c.training.objective = Objective::Tree;
        c.training.tree.temperature = 0.0;
    });
    let (code, out, err) = run(root, &["config", "validate", config.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(
        format!("{out}{err}").contains("training.tree.temperature"),
        "{out}{err}"
    );
}
