//! `dflashd export` writes the drafter in the published HF layout, and loading that layout
//! gives back exactly the checkpoint's weights and config.
use std::process::Command;

use dflashd::engine::train::drafter_io::{load_hf, named_parameters};
use dflashd::engine::train::resume::read_checkpoint_drafter;
use tch::{Device, Kind};

#[test]
fn export_round_trips_the_checkpoint_drafter() {
    let run = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_dflashd");
    let o = Command::new(bin)
        .args(["start", "--threads", "1", "--max-steps", "2", "--run-dir"])
        .arg(run.path())
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", run.path())
        .env("XDG_STATE_HOME", run.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = run.path().join("export");
    let o = Command::new(bin)
        .arg("export")
        .arg("--checkpoint")
        .arg(run.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "DFlashDraftModel");
    assert_eq!(config["block_size"], 8);
    assert_eq!(config["dflash_config"]["mask_token_id"], 511);
    assert_eq!(
        config["dflash_config"]["target_layer_ids"],
        serde_json::json!([1, 3])
    );
    assert_eq!(config["torch_dtype"], "float32");

    let (ckpt_cfg, ckpt_weights) =
        read_checkpoint_drafter(&run.path().join("checkpoints/step-0000000002")).unwrap();
    let loaded = load_hf(&out, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(loaded.config, ckpt_cfg);
    let exported = named_parameters(&loaded.vs);
    let names: Vec<&str> = exported.iter().map(|(n, _)| n.as_str()).collect();
    for key in [
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.1.mlp.down_proj.weight",
    ] {
        assert!(names.contains(&key), "missing {key} in {names:?}");
    }
    assert_eq!(exported.len(), ckpt_weights.len());
    for ((na, a), (nb, b)) in exported.iter().zip(&ckpt_weights) {
        assert_eq!(na, nb);
        assert!(a.equal(b), "{na} differs");
    }

    // bf16 export: same keys, bf16 tensors, config says so.
    let out16 = run.path().join("export-bf16");
    let o = Command::new(bin)
        .arg("export")
        .arg("--checkpoint")
        .arg(run.path())
        .arg("--out")
        .arg(&out16)
        .args(["--dtype", "bf16"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let tensors = tch::Tensor::read_safetensors(out16.join("model.safetensors")).unwrap();
    assert!(tensors.iter().all(|(_, t)| t.kind() == Kind::BFloat16));
    assert_eq!(tensors.len(), ckpt_weights.len());
}

#[test]
fn loading_a_drafter_with_a_missing_or_misshapen_tensor_names_it() {
    let run = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_dflashd");
    let o = Command::new(bin)
        .args(["start", "--threads", "1", "--max-steps", "1", "--run-dir"])
        .arg(run.path())
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", run.path())
        .env("XDG_STATE_HOME", run.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    dflashd::engine::train::drafter_io::write_hf(&dir, &cfg, &kept, Kind::Float).unwrap();
    let err = load_hf(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`norm.weight` is missing"), "{err}");

    let fc = weights.iter().position(|(n, _)| n == "fc.weight").unwrap();
    weights[fc].1 = tch::Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
    dflashd::engine::train::drafter_io::write_hf(&dir, &cfg, &weights, Kind::Float).unwrap();
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
