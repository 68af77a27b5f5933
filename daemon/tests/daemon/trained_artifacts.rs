//! What a trained run leaves behind, used through the CLI: `dflashd export` writes the drafter in
//! the published HF layout (loading it gives back exactly the checkpoint's weights and config),
//! and `dflashd eval --json` prints exactly one JSON object with τ, loss, per-position acceptance
//! and recall@k, reporting bad data lines on stderr with their line numbers.
use std::path::Path;
use std::process::{Command, Output};

use dflash_engine::embedded::TINY_DATASET;
use dflash_engine::train::drafter_io::{load_hf, named_parameters};
use dflash_engine::train::resume::read_checkpoint_drafter;
use tch::{Device, Kind};

const DFLASHD: &str = env!("CARGO_BIN_EXE_dflashd");

/// A run dir after `steps` steps of the embedded default.
fn trained_run(steps: u32) -> tempfile::TempDir {
    trained_run_of(None, steps)
}

/// A run dir after `steps` steps of `config` (a file under `configs/`; the embedded default
/// without one).
pub(crate) fn trained_run_of(config: Option<&str>, steps: u32) -> tempfile::TempDir {
    let run = tempfile::tempdir().unwrap();
    let mut start = Command::new(DFLASHD);
    if let Some(name) = config {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs")
            .join(name);
        start.arg("start").arg("--config").arg(file);
    } else {
        start.arg("start");
    }
    let o = start
        .args([
            "--threads",
            "1",
            "--max-steps",
            &steps.to_string(),
            "--run-dir",
        ])
        .arg(run.path())
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", run.path())
        .env("XDG_STATE_HOME", run.path())
        .env(
            crate::support::binary::CPU_PEAK_VAR,
            crate::support::binary::CPU_PEAK_FLOPS,
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run
}

/// `dflashd export --checkpoint RUN --out OUT [extra...]`.
pub(crate) fn export(run: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(DFLASHD)
        .arg("export")
        .arg("--checkpoint")
        .arg(run)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// Loads the f32 export `out` and checks it against the run's step-2 checkpoint: the same
/// config, every tensor equal and in the same order, `keys` among them. Returns the tensors.
fn assert_loads_back_as_step_2(
    run: &Path,
    out: &Path,
    keys: &[&str],
) -> Vec<(String, tch::Tensor)> {
    let (ckpt_cfg, ckpt_weights) =
        read_checkpoint_drafter(&run.join("checkpoints/step-0000000002")).unwrap();
    let loaded = load_hf(out, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(loaded.config, ckpt_cfg);
    let exported = named_parameters(&loaded.vs);
    let names: Vec<&str> = exported.iter().map(|(n, _)| n.as_str()).collect();
    for key in keys {
        assert!(names.contains(key), "missing {key} in {names:?}");
    }
    assert_eq!(exported.len(), ckpt_weights.len());
    for ((na, a), (nb, b)) in exported.iter().zip(&ckpt_weights) {
        assert_eq!(na, nb);
        assert!(a.equal(b), "{na} differs");
    }
    exported
}

#[test]
fn export_round_trips_the_checkpoint_drafter() {
    let run = trained_run(2);
    let out = run.path().join("export");
    let o = export(run.path(), &out, &["--dtype", "f32"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    // The embedded default's head is Domino, exported in SpecForge's layout.
    assert_eq!(config["architectures"][0], "DominoDraftModel");
    assert_eq!(config["block_size"], 8);
    assert_eq!(config["dflash_config"]["mask_token_id"], 511);
    assert_eq!(
        config["dflash_config"]["target_layer_ids"],
        serde_json::json!([1, 3])
    );
    assert_eq!(config["torch_dtype"], "float32");

    let ckpt_weights = assert_loads_back_as_step_2(
        run.path(),
        &out,
        &[
            "fc.weight",
            "hidden_norm.weight",
            "norm.weight",
            "layers.0.self_attn.q_proj.weight",
            "layers.1.mlp.down_proj.weight",
        ],
    )
    .len();

    // The default export is bf16: same keys, bf16 tensors.
    let out16 = run.path().join("export-bf16");
    let o = export(run.path(), &out16, &[]);
    assert!(o.status.success());
    let tensors = tch::Tensor::read_safetensors(out16.join("model.safetensors")).unwrap();
    assert!(tensors.iter().all(|(_, t)| t.kind() == Kind::BFloat16));
    assert_eq!(tensors.len(), ckpt_weights);
}

/// A DFlash2 drafter exports in SpecForge's `DFlash2DraftModel` layout, its convolutions and
/// selector under SpecForge's names, and loads back to exactly the checkpoint's weights.
#[test]
fn a_dflash2_export_round_trips_bit_for_bit_in_specforges_layout() {
    let run = trained_run_of(Some("tiny-cpu-dflash2.toml"), 2);
    let out = run.path().join("export");
    let o = export(run.path(), &out, &["--dtype", "f32"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("DFlash2DraftModel"), "{stdout}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "DFlash2DraftModel");
    let d = &config["dflash_config"];
    assert_eq!(
        (
            &d["conv_kernel_size"],
            &d["conv_group_size"],
            &d["selector_rank"],
            &d["selector_top_k"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!(16),
            &serde_json::json!(64),
            &serde_json::json!(16)
        )
    );
    let exported = assert_loads_back_as_step_2(
        run.path(),
        &out,
        &[
            "candidate_selector.predecessor_codebook",
            "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight",
            "layers.0.attention_conv.base_kernel",
            "layers.1.mlp_conv.kernel_projection.weight",
        ],
    );
    // Two steps moved the zero-initialised successor codebook: the selector trains.
    let b = &exported
        .iter()
        .find(|(n, _)| n == "candidate_selector.successor_codebook")
        .unwrap()
        .1;
    assert!(b.abs().sum(Kind::Double).double_value(&[]) > 0.0);
}

#[test]
fn loading_a_drafter_with_a_missing_or_misshapen_tensor_names_it() {
    let run = trained_run(1);
    let (cfg, mut weights) =
        read_checkpoint_drafter(&run.path().join("checkpoints/step-0000000001")).unwrap();

    let dir = run.path().join("broken");
    let removed = weights
        .iter()
        .position(|(n, _)| n == "norm.weight")
        .unwrap();
    let kept: Vec<_> = weights
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != removed)
        .map(|(_, (n, t))| (n.clone(), t.shallow_clone()))
        .collect();
    dflash_engine::train::drafter_io::write_hf(&dir, &cfg, &kept, Kind::Float).unwrap();
    let err = load_hf(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`norm.weight` is missing"), "{err}");

    let fc = weights.iter().position(|(n, _)| n == "fc.weight").unwrap();
    weights[fc].1 = tch::Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
    dflash_engine::train::drafter_io::write_hf(&dir, &cfg, &weights, Kind::Float).unwrap();
    let err = load_hf(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("`fc.weight` has shape [3, 3], expected [128, 256]")
            && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn eval_json_shape_and_bad_line_reporting() {
    let run = trained_run(3);
    let drafter = run.path().join("drafter");
    let o = export(run.path(), &drafter, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // 10 good samples with two bad lines among them (lines 4 and 8).
    let mut lines: Vec<String> = TINY_DATASET.lines().take(10).map(str::to_string).collect();
    lines.insert(3, r#"{"input_ids":[1,2,3],"loss_mask":[0,1]}"#.to_string());
    lines.insert(
        7,
        r#"{"input_ids":[1,2,9999],"loss_mask":[1,1,1]}"#.to_string(),
    );
    let data = run.path().join("eval.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();

    let o = Command::new(DFLASHD)
        .args(["eval", "--json", "--threads", "1", "--target"])
        .arg(run.path().join("target"))
        .arg("--drafter")
        .arg(&drafter)
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("eval.jsonl:4: input_ids has 3 tokens but loss_mask has 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains("eval.jsonl:8: input_ids[2] is 9999; expected 0..512"),
        "{stderr}"
    );

    let stdout = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "expected one JSON line, got {stdout:?}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let tau = v["tau"].as_f64().unwrap();
    assert!((1.0..=8.0).contains(&tau), "{tau}");
    assert!(v["loss"].as_f64().unwrap().is_finite());
    // Both objectives' losses, whatever the drafter trained with: DFlash's is `loss` itself,
    // D-PACE's a per-row sum (with α 0.5 by default), far larger than a per-position mean.
    assert_eq!(v["loss_dflash"], v["loss"]);
    assert_eq!(v["dpace_alpha"].as_f64(), Some(0.5));
    let dpace = v["loss_dpace"].as_f64().unwrap();
    assert!(
        dpace.is_finite() && dpace > v["loss"].as_f64().unwrap(),
        "{dpace}"
    );
    let acceptance = v["per_position_acceptance"].as_array().unwrap();
    assert_eq!(acceptance.len(), 7, "block size 8 has 7 draft slots");
    // Acceptance of slot k needs every earlier slot accepted: non-increasing.
    let acc: Vec<f64> = acceptance.iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(acc.windows(2).all(|w| w[1] <= w[0] + 1e-12), "{acc:?}");
    let recall = v["topk_recall"].as_object().unwrap();
    let mut keys: Vec<usize> = recall.keys().map(|k| k.parse().unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![1, 2, 4, 8, 16]);
    // the DDTree oracle at the default budgets, headed by the serving budget's
    let tree = v["tau_tree_oracle"].as_object().unwrap();
    let taus: Vec<f64> = ["8", "16", "32", "64"]
        .iter()
        .map(|b| tree[*b].as_f64().unwrap())
        .collect();
    assert!(taus.iter().all(|t| (1.0..=8.0).contains(t)), "{taus:?}");
    assert_eq!(v["serve_tree_budget"], 32);
    assert_eq!(v["tau_tree_serve"], tree["32"]);
    for slot in 0..7 {
        let r: Vec<f64> = ["1", "2", "4", "8", "16"]
            .iter()
            .map(|k| recall[*k][slot].as_f64().unwrap())
            .collect();
        assert!(
            r.windows(2).all(|w| w[0] <= w[1]) && r.iter().all(|x| (0.0..=1.0).contains(x)),
            "slot {slot}: {r:?}"
        );
    }
    // recall@1 at slot 1 is the same event as acceptance at slot 1.
    assert!((recall["1"][0].as_f64().unwrap() - acc[0]).abs() < 1e-12);
    assert_eq!(v["samples"], 10);
    let bad: Vec<u64> = v["data"]["bad_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(bad, vec![4, 8]);
    assert_eq!(v["data"]["samples"], 10);
}

#[test]
fn eval_with_a_missing_drafter_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    std::fs::write(&data, TINY_DATASET.lines().next().unwrap()).unwrap();
    let o = Command::new(DFLASHD)
        .args(["eval", "--target"])
        .arg(dir.path().join("no-target"))
        .arg("--drafter")
        .arg(dir.path().join("no-drafter"))
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("no-target"), "{stderr}");
}

/// `--format speculators` writes speculators' own config for a DFlash drafter, naming the run's
/// target as the verifier; it refuses a missing target, saying what to do, and `--target` with
/// the default format; `--format sglang` refuses a head other than DSpark. (The refusals of a
/// Domino drafter: the engine's `speculators` and `sglang` unit tests; loading the export with
/// speculators: `loaders.rs`, `make soak`.)
#[test]
fn export_format_speculators_names_the_target_and_refuses_what_it_cannot_carry() {
    let run = trained_run_of(Some("tiny-cpu-dflash.toml"), 2);
    let out = run.path().join("speculators");
    let o = export(run.path(), &out, &["--format", "speculators"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("speculators 0.9.0's own format"));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["speculators_model_type"], "dflash");
    // The tiny drafter taps target layers 1 and 3; speculators counts the embeddings as 0.
    assert_eq!(
        config["aux_hidden_state_layer_ids"],
        serde_json::json!([2, 4])
    );
    let target = std::fs::canonicalize(run.path().join("target")).unwrap();
    assert_eq!(
        config["speculators_config"]["verifier"]["name_or_path"],
        target.display().to_string()
    );

    let o = export(run.path(), &run.path().join("x"), &["--target", "/nowhere"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--format speculators only"),
        "{err}"
    );
    std::fs::rename(&target, run.path().join("moved")).unwrap();
    let o = export(
        run.path(),
        &run.path().join("y"),
        &["--format", "speculators"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("Give --target DIR"),
        "{err}"
    );
    // The sglang form is DSpark's: another head is pointed at the hf layout.
    let o = export(run.path(), &run.path().join("z"), &["--format", "sglang"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("DFlash drafter in the layout `--format hf`"),
        "{err}"
    );
}

/// `--format sglang` writes a DSpark drafter with its head's keys at the top level too (where
/// SGLang's DSpark model builds its heads from) under SGLang's architecture name, and it loads
/// back to exactly the checkpoint's weights.
#[test]
fn a_dspark_export_for_sglang_carries_its_head_keys_at_the_top_level_and_loads_back_bit_for_bit() {
    let run = trained_run_of(Some("tiny-cpu-dspark.toml"), 2);
    let out = run.path().join("sglang");
    let o = export(run.path(), &out, &["--format", "sglang", "--dtype", "f32"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("--speculative-algorithm DSPARK"),
        "{stdout}"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen3DSparkModel");
    assert_eq!(config["sample_from_anchor"], true);
    for key in ["markov_rank", "markov_head_type", "enable_confidence_head"] {
        assert!(!config[key].is_null(), "{key}");
        assert_eq!(config[key], config["dflash_config"][key], "{key}");
    }
    assert_loads_back_as_step_2(
        run.path(),
        &out,
        &[
            "markov_head.markov_w1.weight",
            "confidence_head.proj.weight",
        ],
    );
}
