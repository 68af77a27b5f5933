//! The drafter `config.json` in the published DFlash layout: round trip, the transformers 5
//! `rope_parameters` form, published configs, and clear errors for bad or missing fields.

use std::path::Path;

use crate::support::drafter::tiny_config;
use dflash_engine::model::drafter::{DrafterConfig, DrafterError, LayerType};
use serde_json::{json, Value};

fn write(dir: &Path, value: &Value) -> std::path::PathBuf {
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
    path
}

/// The Qwen3.6-27B drafter of spec §1.2 (z-lab / SpecForge layout).
fn qwen36_27b() -> Value {
    json!({
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": false,
        "block_size": 16,
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
        "dtype": "bfloat16",
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": null,
        "rope_theta": 10000000,
        "sliding_window": 2048,
        "use_sliding_window": true,
        "tie_word_embeddings": false,
        "vocab_size": 248320
    })
}

fn parse(value: &Value) -> Result<DrafterConfig, DrafterError> {
    let dir = tempfile::tempdir().unwrap();
    DrafterConfig::from_hf_json(&write(dir.path(), value))
}

fn error_text(value: &Value) -> String {
    parse(value)
        .expect_err("config must be rejected")
        .to_string()
}

#[test]
fn published_qwen36_drafter_config_reads_as_the_spec_says() {
    let cfg = parse(&qwen36_27b()).unwrap();
    assert_eq!(cfg.hidden_size, 5120);
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim
        ),
        (32, 8, 128)
    );
    assert_eq!(
        cfg.layer_types,
        [[LayerType::Sliding; 4].as_slice(), &[LayerType::Full]].concat()
    );
    assert_eq!(cfg.sliding_window, Some(2048));
    assert_eq!((cfg.block_size, cfg.mask_token_id), (16, 248070));
    assert_eq!(cfg.target_layer_ids, [1, 16, 31, 46, 61]);
    assert_eq!(cfg.target_hidden_size, 5120);
    assert_eq!(cfg.feature_size(), 25600);
    assert_eq!(cfg.rope_theta, 1e7);
    assert_eq!(cfg.num_target_layers, Some(64));
}

#[test]
fn round_trip_through_the_hf_layout_is_lossless() {
    let dir = tempfile::tempdir().unwrap();
    let mut plain = tiny_config(vec![LayerType::Full, LayerType::Full]);
    plain.target_hidden_size = plain.hidden_size;
    plain.num_target_layers = None;
    plain.sliding_window = None;
    for cfg in [
        tiny_config(vec![
            LayerType::Sliding,
            LayerType::Full,
            LayerType::Sliding,
        ]),
        plain,
    ] {
        let json = cfg.to_hf_json();
        assert_eq!(json["architectures"], json!(["DFlashDraftModel"]));
        assert_eq!(json["model_type"], "qwen3");
        assert!(
            json.get("auto_map").is_none(),
            "no auto_map without a dflash.py beside it"
        );
        assert_eq!(
            json["dflash_config"]["mask_token_id"],
            json!(cfg.mask_token_id)
        );
        assert_eq!(
            json["dflash_config"]["target_layer_ids"],
            json!(cfg.target_layer_ids)
        );
        assert_eq!(json["rope_parameters"]["rope_theta"], json!(cfg.rope_theta));
        let back = DrafterConfig::from_hf_json(&write(dir.path(), &json)).unwrap();
        assert_eq!(back, cfg);
    }
}

#[test]
fn rope_parameters_form_is_read_with_or_without_rope_theta() {
    let mut v = qwen36_27b();
    let map = v.as_object_mut().unwrap();
    map.remove("rope_theta");
    map.remove("rope_scaling");
    map.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": 1000000.0}),
    );
    assert_eq!(parse(&v).unwrap().rope_theta, 1e6);
    // Per layer type, as transformers 5 writes it for mixed models: accepted when they agree.
    v["rope_parameters"] = json!({
        "full_attention": {"rope_type": "default", "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}
    });
    assert_eq!(parse(&v).unwrap().rope_theta, 5e5);
    // SpecForge's test form: theta inside a default-type rope_scaling.
    let mut w = qwen36_27b();
    w["rope_theta"] = Value::Null;
    w["rope_scaling"] = json!({"rope_type": "default", "rope_theta": 10000000});
    assert_eq!(parse(&w).unwrap().rope_theta, 1e7);
}

#[test]
fn dflash_keys_are_found_at_the_top_level_too_and_layer_ids_default_per_spec() {
    // SpecForge's Qwen3-8B layout: no dflash_config, no layer ids, all-full layers.
    let mut v = qwen36_27b();
    let map = v.as_object_mut().unwrap();
    map.remove("dflash_config");
    map.insert("mask_token_id".into(), json!(151669));
    map.insert("num_target_layers".into(), json!(36));
    map.insert("layer_types".into(), json!(vec!["full_attention"; 5]));
    map.insert("vocab_size".into(), json!(151936));
    let cfg = parse(&v).unwrap();
    assert_eq!(cfg.mask_token_id, 151669);
    assert_eq!(cfg.target_layer_ids, [1, 9, 17, 25, 33]);
    assert_eq!(cfg.layer_types, [LayerType::Full; 5]);
}

#[test]
fn missing_or_bad_fields_get_errors_naming_file_key_expected_and_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &json!({}));
    let shown = path.display().to_string();

    let mut v = qwen36_27b();
    v.as_object_mut().unwrap().remove("hidden_size");
    let text = DrafterConfig::from_hf_json(&write(dir.path(), &v))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(&shown) && text.contains("`hidden_size`") && text.contains("missing"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["hidden_size"] = json!("big");
    let text = error_text(&v);
    assert!(
        text.contains("`hidden_size`") && text.contains("an integer") && text.contains("\"big\""),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["layer_types"][2] = json!("linear_attention");
    let text = error_text(&v);
    assert!(
        text.contains("`layer_types[2]`") && text.contains("linear_attention"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["dflash_config"]
        .as_object_mut()
        .unwrap()
        .remove("mask_token_id");
    let text = error_text(&v);
    assert!(
        text.contains("dflash_config.mask_token_id") && text.contains("missing"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
    let text = error_text(&v);
    assert!(
        text.contains("rope_scaling.rope_type")
            && text.contains("yarn")
            && text.contains("not supported"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v.as_object_mut().unwrap().remove("rope_theta");
    assert!(error_text(&v).contains("rope_theta"));

    let mut v = qwen36_27b();
    v["num_key_value_heads"] = json!(5);
    let text = error_text(&v);
    assert!(
        text.contains("num_key_value_heads") && text.contains("divisor"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["layer_types"] = json!(["full_attention"]);
    assert!(error_text(&v).contains("5 entries"));

    let mut v = qwen36_27b();
    v["sliding_window"] = Value::Null;
    assert!(error_text(&v).contains("sliding_window"));

    let mut v = qwen36_27b();
    v["dflash_config"]["target_layer_ids"] = json!([1, 16, 64]);
    let text = error_text(&v);
    assert!(
        text.contains("target_layer_ids") && text.contains("64"),
        "{text}"
    );

    let mut v = qwen36_27b();
    v["dflash_config"]["is_causal"] = json!(false);
    assert!(error_text(&v).contains("dflash_config.is_causal"));

    let mut v = qwen36_27b();
    v["hidden_act"] = json!("gelu");
    assert!(error_text(&v).contains("hidden_act"));
}

#[test]
fn unreadable_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope/config.json");
    let err = DrafterConfig::from_hf_json(&missing).unwrap_err();
    assert!(matches!(err, DrafterError::Io { .. }));
    assert!(err.to_string().contains("nope/config.json"));
    let broken = dir.path().join("config.json");
    std::fs::write(&broken, "{ \"hidden_size\": 5120,").unwrap();
    let err = DrafterConfig::from_hf_json(&broken).unwrap_err();
    assert!(matches!(err, DrafterError::Json { .. }), "{err}");
    std::fs::write(&broken, "[1, 2]").unwrap();
    assert!(DrafterConfig::from_hf_json(&broken)
        .unwrap_err()
        .to_string()
        .contains("a JSON object"));
}
