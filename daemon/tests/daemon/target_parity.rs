//! Parity of our target models with Hugging Face transformers (the fixtures in
//! `tests/fixtures/target/` are made by `scripts/make_fixtures.py` with transformers 5.24), and the
//! loader's error paths on damaged copies of those checkpoints.
//!
//! Tolerance: max |ours − HF| ≤ 1e-4 on every tap, f32 on CPU (hidden states have std 0.6–1.2,
//! max ~5). Measured on x86-64 with libtorch 2.11: 0 (bit-identical), since both sides run the
//! same fp32 ops in the same order; the margin is for other CPUs' kernel dispatch.
use std::path::{Path, PathBuf};

use dflash_engine::model::error::ModelError;
use dflash_engine::model::target::{CheckpointLayout, TargetConfig, TargetModel};
use tch::{Device, Kind, Tensor};

const TOLERANCE: f64 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/target")
        .join(name)
}

struct Reference {
    input_ids: Tensor,
    layer_ids: Vec<usize>,
    hidden_states: Tensor,
}

fn reference_tensor(dir: &Path, name: &str) -> Tensor {
    let tensors =
        Tensor::read_safetensors(dir.join("parity.safetensors")).expect("parity.safetensors");
    tensors
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("fixture lacks {name}"))
}

fn reference(dir: &Path) -> Reference {
    let get = |name: &str| reference_tensor(dir, name);
    let layer_ids = Vec::<i64>::try_from(&get("layer_ids"))
        .unwrap()
        .into_iter()
        .map(|l| l as usize)
        .collect();
    Reference {
        input_ids: get("input_ids"),
        layer_ids,
        hidden_states: get("hidden_states"),
    }
}

/// Max abs difference per tap layer.
fn parity(dir: &Path) -> Vec<(usize, f64)> {
    let model = TargetModel::load(dir, Device::Cpu, None).unwrap();
    assert_eq!(model.kind(), Kind::Float);
    let r = reference(dir);
    let ours = model.features(&r.input_ids, &r.layer_ids).unwrap();
    assert_eq!(ours.size(), r.hidden_states.size());
    let hidden = model.config().hidden_size();
    r.layer_ids
        .iter()
        .enumerate()
        .map(|(i, &layer)| {
            let a = ours.narrow(-1, i as i64 * hidden, hidden);
            let b = r.hidden_states.narrow(-1, i as i64 * hidden, hidden);
            (layer, (a - b).abs().max().double_value(&[]))
        })
        .collect()
}

#[test]
fn qwen3_5_multimodal_checkpoint_matches_transformers() {
    let dir = fixture("qwen3_5");
    let model = TargetModel::load(&dir, Device::Cpu, None).unwrap();
    assert_eq!(model.layout(), CheckpointLayout::Qwen3_5Multimodal);
    let TargetConfig::Qwen3_5(c) = model.config() else {
        panic!("expected Qwen3.5")
    };
    // the fixture must exercise both layer kinds and more than one delta-rule chunk
    assert!(
        c.layer_types
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            == 2
    );
    assert!(reference(&dir).input_ids.size()[1] > 64);
    for (layer, diff) in parity(&dir) {
        eprintln!("qwen3_5 tap layer {layer}: max |ours - HF| = {diff:.3e}");
        assert!(diff <= TOLERANCE, "layer {layer}: {diff} > {TOLERANCE}");
    }
}

#[test]
fn qwen3_sharded_tied_checkpoint_matches_transformers() {
    let dir = fixture("qwen3");
    assert!(dir.join("model.safetensors.index.json").exists());
    let model = TargetModel::load(&dir, Device::Cpu, None).unwrap();
    assert!(model.config().tie_word_embeddings());
    assert!(model.lm_head().equal(model.embed_tokens()));
    for (layer, diff) in parity(&dir) {
        eprintln!("qwen3 tap layer {layer}: max |ours - HF| = {diff:.3e}");
        assert!(diff <= TOLERANCE, "layer {layer}: {diff} > {TOLERANCE}");
    }
}

/// bf16 is checked against transformers loading the same checkpoint with `dtype=bfloat16`.
/// The tiny fixture's large random weights amplify every bf16 rounding (HF bf16 is up to ~1.8
/// away from HF f32), so a different rounding order anywhere shows up as a visible gap: the bound
/// is a quarter of HF's own bf16 error per tap. (Measured: bit-identical on x86-64 CPU.)
fn bf16_parity(name: &str) {
    let dir = fixture(name);
    let model = TargetModel::load(&dir, Device::Cpu, Some(Kind::BFloat16)).unwrap();
    let r = reference(&dir);
    let hf_bf16 = reference_tensor(&dir, "hidden_states_bf16").to_kind(Kind::Float);
    let ours = model.features(&r.input_ids, &r.layer_ids).unwrap();
    assert_eq!(ours.kind(), Kind::BFloat16);
    let ours = ours.to_kind(Kind::Float);
    let hidden = model.config().hidden_size();
    for (i, layer) in r.layer_ids.iter().enumerate() {
        let tap = |t: &Tensor| t.narrow(-1, i as i64 * hidden, hidden);
        let vs_hf_bf16 = (tap(&ours) - tap(&hf_bf16)).abs().max().double_value(&[]);
        let hf_rounding = (tap(&hf_bf16) - tap(&r.hidden_states))
            .abs()
            .max()
            .double_value(&[]);
        let vs_f32 = (tap(&ours) - tap(&r.hidden_states))
            .abs()
            .max()
            .double_value(&[]);
        eprintln!(
            "{name} bf16 tap {layer}: |ours-HF bf16| {vs_hf_bf16:.3e}, |ours-HF f32| {vs_f32:.3e}, |HF bf16-HF f32| {hf_rounding:.3e}"
        );
        assert!(
            vs_hf_bf16 <= 0.25 * hf_rounding,
            "tap {layer}: {vs_hf_bf16} vs HF's own bf16 error {hf_rounding}"
        );
    }
}

#[test]
fn qwen3_5_bf16_tracks_transformers_bf16() {
    bf16_parity("qwen3_5");
}

#[test]
fn qwen3_bf16_tracks_transformers_bf16() {
    bf16_parity("qwen3");
}

/// A writable copy of a fixture to damage.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
    }
    tmp
}

fn load_err(dir: &Path) -> ModelError {
    match TargetModel::load(dir, Device::Cpu, None) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_shard_names_index_shard_and_tensor() {
    let tmp = copy_fixture("qwen3");
    std::fs::remove_file(tmp.path().join("model-00003-of-00005.safetensors")).unwrap();
    let err = load_err(tmp.path());
    let msg = err.to_string();
    assert!(matches!(err, ModelError::MissingShard { .. }), "{msg}");
    assert!(
        msg.contains("model.safetensors.index.json")
            && msg.contains("model-00003-of-00005.safetensors"),
        "{msg}"
    );
    assert!(msg.contains("tensor `model.layers."), "{msg}");
}

#[test]
fn wrong_shape_names_tensor_expected_and_found() {
    let tmp = copy_fixture("qwen3_5");
    let config_path = tmp.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["text_config"]["intermediate_size"] = serde_json::json!(80);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = load_err(tmp.path());
    let msg = err.to_string();
    assert!(matches!(err, ModelError::WrongShape { .. }), "{msg}");
    assert!(
        msg.contains("model.safetensors") && msg.contains("mlp."),
        "{msg}"
    );
    assert!(
        msg.contains("[80, 32]") || msg.contains("[32, 80]"),
        "{msg}"
    );
    assert!(
        msg.contains("[64, 32]") || msg.contains("[32, 64]"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_fixture("qwen3_5");
    // drop one GDN tensor by rewriting the checkpoint without it
    let path = tmp.path().join("model.safetensors");
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(&path)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "model.language_model.layers.1.linear_attn.A_log")
        .collect();
    Tensor::write_safetensors(&kept, &path).unwrap();
    let msg = load_err(tmp.path()).to_string();
    assert!(
        msg.contains("model.language_model.layers.1.linear_attn.A_log") && msg.contains("missing"),
        "{msg}"
    );
}

#[test]
fn unknown_architecture_is_refused() {
    let tmp = copy_fixture("qwen3");
    let config_path = tmp.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["model_type"] = serde_json::json!("mistral");
    config["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let err = load_err(tmp.path());
    let msg = err.to_string();
    assert!(
        matches!(err, ModelError::UnknownArchitecture { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("config.json") && msg.contains("MistralForCausalLM"),
        "{msg}"
    );
}

#[test]
fn out_of_range_token_is_refused_with_its_position() {
    let model = TargetModel::load(&fixture("qwen3_5"), Device::Cpu, None).unwrap();
    let ids = Tensor::from_slice(&[1i64, 2, 3, 160, 4]).view([1, 5]);
    let err = model.features(&ids, &[0]).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ModelError::TokenOutOfRange { token: 160, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("[0, 3]") && msg.contains("vocab_size 160"),
        "{msg}"
    );
}

#[test]
fn no_checkpoint_and_bad_dtype_are_errors() {
    let tmp = copy_fixture("qwen3_5");
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    assert!(matches!(
        load_err(tmp.path()),
        ModelError::NoCheckpoint { .. }
    ));
    let err = TargetModel::load(&fixture("qwen3_5"), Device::Cpu, Some(Kind::Int64))
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::UnsupportedDtype { .. }), "{err}");
}

fn dflashd(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .args(args)
        .output()
        .expect("run dflashd")
}

#[test]
fn features_cli_writes_the_reference_hidden_states() {
    let dir = fixture("qwen3_5");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("f.safetensors");
    let model = dir.to_str().unwrap();
    let ids = dir.join("input_ids.txt");
    let args = [
        "features",
        "--model",
        model,
        "--input-ids",
        ids.to_str().unwrap(),
        "--layers",
        "0,2,3",
        "--out",
        out.to_str().unwrap(),
    ];
    let run = dflashd(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got = dflashd::cli::features::read_hidden_states(&out).unwrap();
    let want = reference(&dir).hidden_states.get(0);
    assert_eq!(got.size(), vec![100, 96]);
    let diff = (got - want).abs().max().double_value(&[]);
    assert!(diff <= TOLERANCE, "{diff}");

    // never overwritten silently
    let before = std::fs::read(&out).unwrap();
    let again = dflashd(&args);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert_eq!(std::fs::read(&out).unwrap(), before);

    // bf16 output, replacing with --force
    let mut forced = args.to_vec();
    forced.extend(["--dtype", "bf16", "--force"]);
    let run = dflashd(&forced);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        dflashd::cli::features::read_hidden_states(&out)
            .unwrap()
            .kind(),
        Kind::BFloat16
    );
}

#[test]
fn features_cli_reports_bad_tokens_and_layers_without_writing() {
    let dir = fixture("qwen3");
    let tmp = tempfile::tempdir().unwrap();
    let ids = tmp.path().join("ids.txt");
    let out = tmp.path().join("f.safetensors");
    std::fs::write(&ids, "5 6 7 999").unwrap();
    let base = [
        "features",
        "--model",
        dir.to_str().unwrap(),
        "--input-ids",
        ids.to_str().unwrap(),
        "--out",
    ];
    let mut args = base.to_vec();
    args.extend([out.to_str().unwrap(), "--layers", "1"]);
    let run = dflashd(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success()
            && stderr.contains("token id 999")
            && stderr.contains("vocab_size 160"),
        "{stderr}"
    );

    std::fs::write(&ids, "5 6 7").unwrap();
    let mut args = base.to_vec();
    args.extend([out.to_str().unwrap(), "--layers", "1,7"]);
    let run = dflashd(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && stderr.contains("layer id 7"),
        "{stderr}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "no temp files left behind"
    );
}
