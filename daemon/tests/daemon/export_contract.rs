//! The export contract: what `dflashd export` writes with its defaults, held against what the
//! DFlash loaders of the authors' reference, SGLang and vLLM read.
//!
//! The table below is written from the loaders' public code, file by file at the commits
//! named. The key-by-key reading is in the project's serving review. If a loader changes,
//! update its row and its commit here first, then the export.
//! - z-lab/dflash `dflash/model.py` @44947fb: `DFlashDraftModel` on a transformers
//!   `Qwen3Config`; `dflash_config.{mask_token_id, target_layer_ids}`, `block_size`.
//! - SGLang `python/sglang/srt/models/dflash.py` @003b23d and
//!   `speculative/dflash_utils.py` @00731f0 (`parse_dflash_draft_config`): arch
//!   `DFlashDraftModel`; `num_target_layers` range-checks the tap ids; `dtype` feeds
//!   `_get_and_verify_dtype` (@001adf5), where a float32 config under `--dtype auto` becomes fp16.
//! - vLLM `vllm/model_executor/models/qwen3_dflash.py` @036a00d: registry
//!   `DFlashDraftModel`; `dflash_config.mask_token_id` (`get_parallel_drafting_token_id`
//!   raises without it); `layer_types`, `sliding_window`; q/k/v and gate/up stacked on load.
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const DFLASHD: &str = env!("CARGO_BIN_EXE_dflashd");

/// Config keys each loader requires (a load fails without them), by where they sit.
const REQUIRED_KEYS: &[(&str, &[&str])] = &[
    (
        "z-lab dflash/model.py @44947fb",
        &[
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "dflash_config.mask_token_id",
            "dflash_config.target_layer_ids",
        ],
    ),
    (
        "SGLang models/dflash.py @003b23d + dflash_utils.py @00731f0",
        &[
            "architectures",
            "model_type",
            "hidden_act",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "dflash_config.target_layer_ids",
            "num_target_layers",
            "dtype",
        ],
    ),
    (
        "vLLM qwen3_dflash.py @036a00d",
        &[
            "architectures",
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "dflash_config.mask_token_id",
            "layer_types",
        ],
    ),
];

/// Tensor names every loader maps (per layer `{i}`); none of them loads `embed_tokens` or
/// `lm_head` from the drafter (they are the target's).
const TENSORS: &[&str] = &[
    "fc.weight",
    "hidden_norm.weight",
    "norm.weight",
    "layers.{i}.input_layernorm.weight",
    "layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.mlp.up_proj.weight",
    "layers.{i}.mlp.down_proj.weight",
];

fn lookup<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

/// The safetensors header (JSON after its little-endian u64 length), as the loaders parse it.
fn safetensors_header(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + len]).unwrap()
}

/// The run trains DFlash's head (`configs/tiny-cpu-dflash.toml`): the layout these loaders
/// read. The embedded default's Domino head exports as `DominoDraftModel`, which needs a
/// server that applies its correction (`cli/export.rs`'s serving hints say which).
#[test]
fn a_default_dflash_export_is_what_every_loader_takes_unchanged() {
    let run = tempfile::tempdir().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/tiny-cpu-dflash.toml");
    let o = Command::new(DFLASHD)
        .args(["start", "--threads", "1", "--max-steps", "1", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(run.path())
        .env("XDG_RUNTIME_DIR", run.path())
        .env("XDG_STATE_HOME", run.path())
        .env(
            crate::support::binary::CPU_PEAK_VAR,
            crate::support::binary::CPU_PEAK_FLOPS,
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = run.path().join("tiny-dflash");
    let o = Command::new(DFLASHD)
        .arg("export")
        .arg("--checkpoint")
        .arg(run.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8_lossy(&o.stdout);

    let config: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    for (loader, keys) in REQUIRED_KEYS {
        for key in *keys {
            assert!(
                lookup(&config, key).is_some_and(|v| !v.is_null()),
                "{loader} requires `{key}`, which the export lacks:\n{config:#}"
            );
        }
    }
    assert_eq!(
        config["architectures"],
        serde_json::json!(["DFlashDraftModel"])
    );
    assert_eq!(config["model_type"], "qwen3");
    assert!(
        config.get("auto_map").is_none(),
        "auto_map would point transformers at a dflash.py that is not shipped"
    );
    assert!(!out.join("dflash.py").exists());
    assert_eq!(
        (&config["dtype"], &config["torch_dtype"]),
        (&"bfloat16".into(), &"bfloat16".into())
    );
    // The embedded target's limit (4096), not a constant.
    assert_eq!(config["max_position_embeddings"], 4096);
    let block = config["block_size"].as_i64().unwrap();
    let layers = config["num_hidden_layers"].as_u64().unwrap() as usize;
    let num_target = config["num_target_layers"].as_u64().unwrap();
    for id in config["dflash_config"]["target_layer_ids"]
        .as_array()
        .unwrap()
    {
        assert!(
            id.as_u64().unwrap() < num_target,
            "SGLang's range check: {config}"
        );
    }

    let header = safetensors_header(&out.join("model.safetensors"));
    assert_eq!(
        header["__metadata__"]["format"], "pt",
        "older transformers require it"
    );
    let mut names: Vec<&str> = header
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "__metadata__")
        .collect();
    names.sort_unstable();
    let mut expected: Vec<String> = TENSORS
        .iter()
        .flat_map(|t| {
            if t.contains("{i}") {
                (0..layers)
                    .map(|i| t.replace("{i}", &i.to_string()))
                    .collect()
            } else {
                vec![t.to_string()]
            }
        })
        .collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    for name in &names {
        assert_eq!(header[*name]["dtype"], "BF16", "{name}");
    }

    // What to tell each engine.
    assert!(
        printed.contains(&format!("--speculative-num-draft-tokens {block}"))
            && printed.contains(&format!("\"num_speculative_tokens\": {}", block - 1)),
        "{printed}"
    );
    assert!(
        printed.contains("VLLM_USE_V2_MODEL_RUNNER=1"),
        "the tiny drafter mixes layer types: {printed}"
    );
}
