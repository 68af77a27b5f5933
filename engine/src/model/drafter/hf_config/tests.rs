use super::*;
use crate::model::drafter::config::{
    Dflash2Config, DominoConfig, DrafterHead, DsparkConfig, MarkovHeadType,
};

/// A Domino drafter's config as SpecForge's Qwen3.6-27B recipe writes one (its keys and
/// values; the architecture is the recipe's `DFlashDraftModel` with a Domino projector).
fn recipe_like() -> Value {
    json!({
        "architectures": ["DFlashDraftModel"],
        "block_size": 16,
        "dflash_config": {
            "mask_token_id": 248070,
            "target_layer_ids": [1, 16, 31, 46, 61],
            "projector_type": "domino",
            "pure_draft_prefix_len": 1,
            "emb_dim": 256,
            "gru_hidden_dim": 1024,
            "shift_label": false
        },
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000,
        "vocab_size": 248320
    })
}

fn domino(value: &Value) -> Result<DominoConfig, DrafterError> {
    let cfg = DrafterConfig::from_hf_value(value, "test")?;
    Ok(*cfg.head.domino().expect("a Domino head"))
}

#[test]
fn specforges_domino_recipe_reads_as_domino_and_writes_back_as_domino_draft_model() {
    let value = recipe_like();
    assert_eq!(
        domino(&value).unwrap(),
        DominoConfig {
            emb_dim: 256,
            gru_hidden_dim: 1024,
            pure_draft_prefix_len: 1
        }
    );
    let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
    let written = cfg.to_hf_json();
    assert_eq!(written["architectures"], json!(["DominoDraftModel"]));
    let d = &written["dflash_config"];
    assert_eq!(d["projector_type"], json!("domino"));
    assert_eq!(
        (&d["emb_dim"], &d["gru_hidden_dim"]),
        (&json!(256), &json!(1024))
    );
    assert_eq!(
        (&d["pure_draft_prefix_len"], &d["shift_label"]),
        (&json!(1), &json!(false))
    );
    assert_eq!(
        DrafterConfig::from_hf_value(&written, "written").unwrap(),
        cfg
    );
}

#[test]
fn the_architecture_alone_names_domino_and_defaults_follow_specforge() {
    let mut value = recipe_like();
    value["architectures"] = json!(["DominoDraftModel"]);
    let d = value["dflash_config"].as_object_mut().unwrap();
    for key in ["projector_type", "pure_draft_prefix_len", "shift_label"] {
        d.remove(key);
    }
    assert_eq!(domino(&value).unwrap().pure_draft_prefix_len, 0);
}

#[test]
fn a_plain_dflash_config_has_the_dflash_head_and_no_domino_keys() {
    let mut value = recipe_like();
    let d = value["dflash_config"].as_object_mut().unwrap();
    for key in [
        "projector_type",
        "pure_draft_prefix_len",
        "emb_dim",
        "gru_hidden_dim",
        "shift_label",
    ] {
        d.remove(key);
    }
    let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
    assert_eq!(cfg.head, DrafterHead::Dflash);
    let written = cfg.to_hf_json();
    assert_eq!(written["architectures"], json!(["DFlashDraftModel"]));
    assert!(written["dflash_config"].get("projector_type").is_none());
}

#[test]
fn what_dflashd_cannot_compute_is_refused_by_name() {
    let refuse = |edit: &dyn Fn(&mut Value), key: &str| {
        let mut value = recipe_like();
        edit(&mut value);
        let err = DrafterConfig::from_hf_value(&value, "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    };
    refuse(
        &|v| v["dflash_config"]["shift_label"] = json!(true),
        "dflash_config.shift_label",
    );
    refuse(
        &|v| v["dflash_config"]["projector_type"] = json!("eagle3"),
        "dflash_config.projector_type",
    );
    refuse(
        &|v| {
            v["architectures"] = json!(["DominoDraftModel"]);
            v["dflash_config"]["projector_type"] = json!("dspark");
        },
        "dflash_config.projector_type",
    );
    refuse(
        &|v| {
            v["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("emb_dim");
        },
        "dflash_config.emb_dim",
    );
    refuse(
        &|v| v["dflash_config"]["pure_draft_prefix_len"] = json!(15),
        "dflash_config.pure_draft_prefix_len",
    );
}

/// SpecForge's `configs/qwen3-8b-dspark.json` (a6b6b023), key for key.
fn specforge_dspark() -> Value {
    json!({
        "architectures": ["DSparkDraftModel"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
        "block_size": 7,
        "bos_token_id": 151643,
        "dflash_config": {
            "attention_mode": "gqa",
            "confidence_head_alpha": 1.0,
            "confidence_head_with_markov": true,
            "enable_confidence_head": true,
            "markov_head_type": "vanilla",
            "markov_rank": 256,
            "mask_token_id": 151669,
            "projector_type": "dspark",
            "target_layer_ids": [1, 9, 17, 25, 33]
        },
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "layer_types": ["full_attention", "full_attention", "full_attention",
                        "full_attention", "full_attention"],
        "max_position_embeddings": 40960,
        "max_window_layers": 5,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 36,
        "rms_norm_eps": 1e-06,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

fn dspark(value: &Value) -> Result<DsparkConfig, DrafterError> {
    let cfg = DrafterConfig::from_hf_value(value, "test")?;
    Ok(*cfg.head.dspark().expect("a DSpark head"))
}

#[test]
fn specforges_dspark_config_reads_as_dspark_and_writes_back_as_dspark_draft_model() {
    let value = specforge_dspark();
    let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
    assert_eq!(cfg.block_size, 7);
    assert_eq!(
        *cfg.head.dspark().unwrap(),
        DsparkConfig {
            markov_rank: 256,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head: true,
            confidence_head_with_markov: true,
        }
    );
    let written = cfg.to_hf_json();
    assert_eq!(written["architectures"], json!(["DSparkDraftModel"]));
    let d = &written["dflash_config"];
    for key in [
        "attention_mode",
        "confidence_head_with_markov",
        "enable_confidence_head",
        "markov_head_type",
        "markov_rank",
        "projector_type",
    ] {
        assert_eq!(d[key], value["dflash_config"][key], "{key}");
    }
    assert_eq!(
        DrafterConfig::from_hf_value(&written, "written").unwrap(),
        cfg
    );
}

#[test]
fn a_dspark_file_without_its_head_keys_takes_specforges_code_defaults() {
    let mut value = specforge_dspark();
    let d = value["dflash_config"].as_object_mut().unwrap();
    for key in [
        "attention_mode",
        "confidence_head_alpha",
        "confidence_head_with_markov",
        "enable_confidence_head",
        "markov_head_type",
        "markov_rank",
        "projector_type",
    ] {
        d.remove(key);
    }
    // `DSparkDraftModel` alone names the head; each left-out key is SpecForge's default:
    // no Markov head, and no confidence head without `confidence_head_alpha > 0`.
    let got = dspark(&value).unwrap();
    assert_eq!(
        got,
        DsparkConfig {
            markov_rank: 0,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head: false,
            confidence_head_with_markov: false,
        }
    );
    value["dflash_config"]["confidence_head_alpha"] = json!(0.5);
    assert!(dspark(&value).unwrap().confidence_head);
}

#[test]
fn sglangs_normalised_dspark_config_reads_its_keys_from_the_top_level() {
    // SpecForge's `scripts/gates/normalize_dflash_export.py` copies the head keys to the
    // top level and names SGLang's entry class.
    let mut value = specforge_dspark();
    value["architectures"] = json!(["Qwen3DSparkModel"]);
    let d = value["dflash_config"].as_object_mut().unwrap();
    let mut moved = Vec::new();
    for key in [
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "projector_type",
    ] {
        moved.push((key, d.remove(key).unwrap()));
    }
    for (key, v) in moved {
        if key != "projector_type" {
            value[key] = v;
        }
    }
    assert_eq!(
        dspark(&value).unwrap(),
        dspark(&specforge_dspark()).unwrap()
    );
}

#[test]
fn a_dspark_config_specforge_would_refuse_is_refused_by_name() {
    let refuse = |edit: &dyn Fn(&mut Value), key: &str| {
        let mut value = specforge_dspark();
        edit(&mut value);
        let err = DrafterConfig::from_hf_value(&value, "test")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    };
    refuse(
        &|v| v["dflash_config"]["projector_type"] = json!("domino"),
        "dflash_config.projector_type",
    );
    refuse(
        &|v| v["dflash_config"]["markov_head_type"] = json!("lstm"),
        "dflash_config.markov_head_type",
    );
    refuse(
        &|v| v["dflash_config"]["markov_rank"] = json!(0),
        "dflash_config.confidence_head_with_markov",
    );
    refuse(
        &|v| v["num_key_value_heads"] = json!(32),
        "dflash_config.attention_mode",
    );
    refuse(
        &|v| v["dflash_config"]["attention_mode"] = json!("mqa"),
        "dflash_config.attention_mode",
    );
    // Equal head counts are fine once the file opts into MHA.
    let mut mha = specforge_dspark();
    mha["num_key_value_heads"] = json!(32);
    mha["dflash_config"]["attention_mode"] = json!("mha");
    let cfg = DrafterConfig::from_hf_value(&mha, "mha").unwrap();
    assert_eq!(
        cfg.to_hf_json()["dflash_config"]["attention_mode"],
        json!("mha")
    );
}

/// A DFlash2 drafter's config with the keys of z-lab's published DFlash2 fixture
/// (`tests/fixtures/dflash2-config.json`: block 16, groups of 16, 2 taps, rank 256, top 16, a
/// multiplier and a soft cap), at Qwen3-8B's widths, `block_size` inside `dflash_config` as
/// PR #772 allows.
fn dflash2_value() -> Value {
    let mut value = specforge_dspark();
    let map = value.as_object_mut().unwrap();
    map.insert("architectures".into(), json!(["DFlash2DraftModel"]));
    map.remove("block_size");
    map.insert(
        "dflash_config".into(),
        json!({
            "block_size": 16,
            "conv_group_size": 16,
            "conv_kernel_size": 2,
            "final_logit_softcapping": 20.0,
            "output_multiplier": 0.196,
            "selector_rank": 256,
            "selector_top_k": 16,
            "mask_token_id": 151669,
            "target_layer_ids": [1, 9, 17, 25, 33],
        }),
    );
    value
}

#[test]
fn a_dflash2_config_reads_its_convolution_and_selector_and_writes_back_as_dflash2_draft_model() {
    let cfg = DrafterConfig::from_hf_value(&dflash2_value(), "test").unwrap();
    assert_eq!(cfg.block_size, 16);
    assert_eq!(
        cfg.head,
        DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 16,
            selector_rank: 256,
            selector_top_k: 16,
            output_multiplier: 0.196,
            final_logit_softcapping: Some(20.0),
        })
    );
    let written = cfg.to_hf_json();
    assert_eq!(written["architectures"], json!(["DFlash2DraftModel"]));
    assert_eq!(written["dflash_config"]["block_size"], json!(16));
    assert!(written["dflash_config"].get("projector_type").is_none());
    assert_eq!(
        DrafterConfig::from_hf_value(&written, "written").unwrap(),
        cfg
    );
    // Without a cap the key is left out, and the multiplier defaults to 1.
    let mut plain = dflash2_value();
    let d = plain["dflash_config"].as_object_mut().unwrap();
    d.remove("final_logit_softcapping");
    d.remove("output_multiplier");
    let plain = DrafterConfig::from_hf_value(&plain, "test").unwrap();
    let head = *plain.head.dflash2().unwrap();
    assert_eq!(
        (head.output_multiplier, head.final_logit_softcapping),
        (1.0, None)
    );
    assert!(plain.to_hf_json()["dflash_config"]
        .get("final_logit_softcapping")
        .is_none());
}

#[test]
fn a_dflash2_config_specforge_would_refuse_is_refused_by_name() {
    for key in [
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
    ] {
        let mut value = dflash2_value();
        value["dflash_config"].as_object_mut().unwrap().remove(key);
        let e = DrafterConfig::from_hf_value(&value, "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("dflash_config.{key}")), "{key}: {e}");
    }
    for (key, bad, expected) in [
        ("conv_kernel_size", json!(17), "1..=16 (block_size)"),
        ("conv_group_size", json!(100), "a divisor of hidden_size"),
        ("selector_top_k", json!(151937), "1..=151936 (vocab_size)"),
        ("final_logit_softcapping", json!(-1.0), "a positive number"),
        ("projector_type", json!("domino"), "has no projector"),
    ] {
        let mut value = dflash2_value();
        value["dflash_config"][key] = bad;
        let e = DrafterConfig::from_hf_value(&value, "test")
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{key}: {e}");
    }
    // The transform is DFlash2's: on another head it changes logits dflashd would not.
    let mut value = specforge_dspark();
    value["dflash_config"]["output_multiplier"] = json!(0.5);
    let e = DrafterConfig::from_hf_value(&value, "test")
        .unwrap_err()
        .to_string();
    assert!(e.contains("DFlash2DraftModel"), "{e}");
}

/// z-lab's loader reads a top-level `is_causal` for every layer (absent: causal exactly on
/// sliding layers). A value that says what the layer types already do is read; one that would
/// change a layer is refused.
#[test]
fn is_causal_is_read_where_it_agrees_with_the_layer_types_and_refused_where_it_would_not() {
    let read = |edit: &dyn Fn(&mut Value)| {
        let mut value = dflash2_value();
        edit(&mut value);
        DrafterConfig::from_hf_value(&value, "test").map(|c| c.layer_types)
    };
    let full = |v: &mut Value| {
        v["layer_types"] = json!(["full_attention", "full_attention"]);
        v["num_hidden_layers"] = json!(2);
    };
    // Every layer full: bidirectional in the block, which `is_causal: false` says too.
    let types = read(&|v| {
        full(v);
        v["is_causal"] = json!(false);
    })
    .unwrap();
    assert_eq!(types, [LayerType::Full, LayerType::Full]);
    read(&|v| {
        full(v);
        v["dflash_config"]["is_causal"] = json!(false);
    })
    .unwrap();
    for (value, layers) in [
        (true, json!(["full_attention", "full_attention"])),
        (false, json!(["sliding_attention", "full_attention"])),
    ] {
        let err = read(&|v| {
            v["layer_types"] = layers.clone();
            v["num_hidden_layers"] = json!(2);
            v["sliding_window"] = json!(32);
            v["use_sliding_window"] = json!(true);
            v["is_causal"] = json!(value);
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("is_causal") && err.contains("would change a layer"),
            "{err}"
        );
    }
}
