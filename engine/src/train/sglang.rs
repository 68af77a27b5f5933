//! A DSpark drafter in the form SGLang's DSpark models read (`Qwen3DSparkModel`, sglang
//! 0.5.23, `srt/models/dspark.py` and `srt/speculative/dspark_components/dspark_config.py`).
//!
//! SGLang parses a DSpark checkpoint's keys from `dflash_config`, where SpecForge's layout
//! puts them, but builds the Markov and confidence heads from the same keys read at the top
//! level of the config, falling back to defaults where they are missing (a Markov rank of 0,
//! which it refuses). So the form is SpecForge's layout ([`hf_json`]) with every
//! `dflash_config` key also at the top level, `sample_from_anchor` written out (slot k drafts
//! anchor + k + 1, DSpark's training alignment; SGLang's default too), and SGLang's
//! architecture name. Our reader reads it back as the same drafter.
use std::path::Path;

use serde_json::Value;
use tch::{Kind, Tensor};

use super::drafter_io::{hf_json, write_layout};
use super::error::TrainError;
use crate::model::drafter::{DrafterConfig, DrafterHead};

/// The sglang release whose reading this form follows.
pub const SGLANG_VERSION: &str = "0.5.23";
/// The architecture SGLang registers for a Qwen3-shaped DSpark drafter.
pub const SGLANG_DSPARK_ARCHITECTURE: &str = "Qwen3DSparkModel";

/// Why `cfg` cannot be written in SGLang's DSpark form, saying what to do instead; `None`
/// when it can.
pub fn refusal(cfg: &DrafterConfig) -> Option<String> {
    match &cfg.head {
        DrafterHead::Dspark(_) => None,
        DrafterHead::Dflash => Some(not_dspark("DFlash")),
        DrafterHead::Domino(_) => Some(not_dspark("Domino")),
        DrafterHead::Dflash2(_) => Some(not_dspark("DFlash2")),
    }
}

/// What serving a DSpark drafter without a confidence head on SGLang takes: SGLang 0.5.23
/// builds its confidence head from the verify mode, not from `enable_confidence_head`
/// (`build_confidence_head`), and then refuses a checkpoint without its weights. `None` for a
/// drafter with one.
pub fn confidence_note(cfg: &DrafterConfig) -> Option<String> {
    let DrafterHead::Dspark(head) = &cfg.head else {
        return None;
    };
    (!head.confidence_head).then(|| {
        format!(
            "this DSpark drafter has no confidence head: SGLang {SGLANG_VERSION} serves it in its \
             default SGLANG_RAGGED_VERIFY_MODE=static, and refuses to load it under cap-accept \
             or compact, which build a confidence head whatever enable_confidence_head says"
        )
    })
}

fn not_dspark(head: &str) -> String {
    format!(
        "the sglang format converts a DSpark drafter; SGLang reads this {head} drafter in the \
         layout `--format hf` writes, as it is"
    )
}

/// SGLang's `config.json` for `cfg` with weights of `dtype`.
pub fn sglang_json(cfg: &DrafterConfig, dtype: Kind) -> Result<Value, TrainError> {
    if let Some(detail) = refusal(cfg) {
        return Err(TrainError::Config {
            key: "drafter.head".into(),
            detail,
        });
    }
    let mut json = hf_json(cfg, dtype)?;
    let map = json.as_object_mut().expect("the hf config is an object");
    let nested = map
        .get("dflash_config")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (key, value) in nested {
        // Where the top level already names a key, the two agree by construction.
        map.entry(key).or_insert(value);
    }
    map.insert("sample_from_anchor".into(), Value::Bool(true));
    map.insert(
        "architectures".into(),
        Value::from(vec![SGLANG_DSPARK_ARCHITECTURE]),
    );
    Ok(json)
}

/// Writes `cfg` and `weights` (cast to `dtype`) into `dir` in SGLang's DSpark form.
pub fn write_sglang(
    dir: &Path,
    cfg: &DrafterConfig,
    weights: &[(String, Tensor)],
    dtype: Kind,
) -> Result<(), TrainError> {
    write_layout(dir, &sglang_json(cfg, dtype)?, weights, dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::tiny_dflash_drafter_config;
    use crate::model::drafter::{DsparkConfig, MarkovHeadType};
    use crate::model::target::TargetConfig;

    fn dspark(confidence_head: bool) -> DrafterConfig {
        let mut cfg = tiny_dflash_drafter_config(&TargetConfig::tiny_default());
        cfg.num_target_layers = Some(6);
        cfg.head = DrafterHead::Dspark(DsparkConfig {
            markov_rank: 64,
            markov_head_type: MarkovHeadType::Vanilla,
            confidence_head,
            confidence_head_with_markov: confidence_head,
        });
        cfg
    }

    #[test]
    fn the_head_keys_are_at_the_top_level_as_in_dflash_config_and_read_back_the_same() {
        let cfg = dspark(true);
        let json = sglang_json(&cfg, Kind::Float).unwrap();
        assert_eq!(json["architectures"][0], SGLANG_DSPARK_ARCHITECTURE);
        assert_eq!(json["sample_from_anchor"], true);
        for key in [
            "markov_rank",
            "markov_head_type",
            "enable_confidence_head",
            "confidence_head_with_markov",
            "mask_token_id",
            "target_layer_ids",
        ] {
            assert!(!json[key].is_null(), "{key} missing at the top level");
            assert_eq!(json[key], json["dflash_config"][key], "{key}");
        }
        assert_eq!(json["markov_rank"], 64);
        let read = DrafterConfig::from_hf_value(&json, "sglang").unwrap();
        assert_eq!(read, cfg);
    }

    #[test]
    fn other_heads_are_refused_saying_what_to_do_and_no_confidence_head_is_noted() {
        let plain = tiny_dflash_drafter_config(&TargetConfig::tiny_default());
        let why = refusal(&plain).unwrap();
        assert!(why.contains("`--format hf`"), "{why}");
        assert!(sglang_json(&plain, Kind::Float).is_err());
        assert_eq!(confidence_note(&plain), None);
        for with_confidence in [true, false] {
            let cfg = dspark(with_confidence);
            assert_eq!(refusal(&cfg), None);
            assert!(sglang_json(&cfg, Kind::Float).is_ok());
            let note = confidence_note(&cfg);
            assert_eq!(note.is_some(), !with_confidence);
        }
        let note = confidence_note(&dspark(false)).unwrap();
        assert!(
            note.contains("SGLANG_RAGGED_VERIFY_MODE=static") && note.contains("cap-accept"),
            "{note}"
        );
    }
}
