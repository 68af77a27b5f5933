use super::*;
use crate::embedded::{tiny_dflash_drafter_config, tiny_drafter_config, write_tiny_target};
use crate::model::drafter::{Dflash2Config, DrafterHead, DsparkConfig, MarkovHeadType};
use crate::model::target::TargetConfig;
use serde_json::json;

fn dflash() -> DrafterConfig {
    let mut cfg = tiny_dflash_drafter_config(&TargetConfig::tiny_default());
    cfg.num_target_layers = Some(6);
    cfg
}

fn verifier() -> Verifier {
    Verifier {
        name_or_path: "/t".into(),
        architectures: vec!["Qwen3_5ForConditionalGeneration".into()],
        num_layers: 6,
        hidden_size: 128,
        vocab_size: 512,
    }
}

fn dflash2(output_multiplier: f64, cap: Option<f64>) -> DrafterConfig {
    let mut cfg = dflash();
    cfg.head = DrafterHead::Dflash2(Dflash2Config {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 64,
        selector_top_k: 16,
        output_multiplier,
        final_logit_softcapping: cap,
    });
    cfg
}

#[test]
fn a_dflash_config_names_speculators_model_its_shifted_tap_layers_and_the_verifier() {
    let cfg = dflash();
    assert_eq!(refusal(&cfg, &verifier()), None);
    let json = speculators_json(&cfg, &verifier(), "float32");
    assert_eq!(json["speculators_model_type"], "dflash");
    assert_eq!(json["speculators_version"], SPECULATORS_VERSION);
    // Our tap ids are z-lab's (the output of layer i); speculators counts the embeddings as 0.
    let shifted: Vec<usize> = cfg.target_layer_ids.iter().map(|i| i + 1).collect();
    assert_eq!(json["aux_hidden_state_layer_ids"], json!(shifted));
    assert_eq!(json["sample_from_anchor"], false);
    assert_eq!(json["sliding_window_non_causal"], false);
    let proposal = &json["speculators_config"]["proposal_methods"][0];
    assert_eq!(proposal["speculative_tokens"], json!(cfg.block_size - 1));
    assert_eq!(json["speculators_config"]["verifier"]["name_or_path"], "/t");
    let layer = &json["transformer_layer_config"];
    assert_eq!(layer["model_type"], "qwen3");
    assert_eq!(layer["hidden_size"], 128);
    for stripped in [
        "architectures",
        "block_size",
        "dflash_config",
        "num_target_layers",
    ] {
        assert!(layer.get(stripped).is_none(), "{stripped} kept");
    }
}

#[test]
fn dspark_drafts_from_the_anchor_and_dflash2_keeps_its_selector_keys() {
    let mut cfg = dflash();
    cfg.head = DrafterHead::Dspark(DsparkConfig {
        markov_rank: 32,
        markov_head_type: MarkovHeadType::Gated,
        confidence_head: true,
        confidence_head_with_markov: true,
    });
    let json = speculators_json(&cfg, &verifier(), "float32");
    assert_eq!(json["speculators_model_type"], "dspark");
    assert_eq!(json["sample_from_anchor"], true);
    assert_eq!(
        json["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
        json!(cfg.block_size)
    );
    assert_eq!(
        (
            &json["markov_rank"],
            &json["markov_head_type"],
            &json["enable_confidence_head"],
            &json["confidence_head_with_markov"]
        ),
        (&json!(32), &json!("gated"), &json!(true), &json!(true))
    );
    let json = speculators_json(&dflash2(1.0, None), &verifier(), "float32");
    assert_eq!(json["speculators_model_type"], "dflash2");
    assert_eq!(json["sample_from_anchor"], false);
    assert_eq!(json["selector_top_k"], 16);
    assert_eq!(json["conv_group_size"], 16);
}

#[test]
fn what_speculators_cannot_carry_is_refused_with_what_to_do() {
    let domino = tiny_drafter_config(&TargetConfig::tiny_default());
    assert!(domino.head.domino().is_some());
    let why = refusal(&domino, &verifier()).unwrap();
    assert!(
        why.contains("no Domino model") && why.contains("--format hf"),
        "{why}"
    );
    let why = refusal(&dflash2(1.0, Some(30.0)), &verifier()).unwrap();
    assert!(why.contains("final_logit_softcapping"), "{why}");
    let mut last = dflash();
    last.target_layer_ids = vec![1, 5];
    let why = refusal(&last, &verifier()).unwrap();
    assert!(why.contains("last layer (5)"), "{why}");
    let wider = Verifier {
        hidden_size: 256,
        ..verifier()
    };
    let why = refusal(&dflash(), &wider).unwrap();
    assert!(why.contains("--target the drafter's own target"), "{why}");
}

#[test]
fn the_embedded_target_is_read_as_a_verifier_and_a_missing_one_says_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_target(dir.path()).unwrap();
    let v = read_verifier(dir.path()).unwrap();
    assert_eq!((v.num_layers, v.hidden_size, v.vocab_size), (6, 128, 512));
    assert_eq!(v.architectures, ["Qwen3_5ForConditionalGeneration"]);
    assert!(Path::new(&v.name_or_path).is_absolute());
    let err = read_verifier(&dir.path().join("none"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--target takes the target's Hugging Face directory"),
        "{err}"
    );
}
