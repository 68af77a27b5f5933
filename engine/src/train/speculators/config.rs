//! The `config.json` of vLLM speculators' own format (speculators 0.9.0,
//! `speculators/models/{dflash,dspark,dflash2}/config.py`), built from a drafter's config and
//! its target (speculators' "verifier").
//!
//! What it carries, read from speculators' code, not copied from it:
//! - `speculators_model_type` (`dflash`, `dspark`, `dflash2`) picks the model class;
//! - `transformer_layer_config`: the drafter's Qwen3 fields, i.e. our published config less the
//!   keys speculators' DFlash converter strips (`architectures`, `auto_map`, `block_size`,
//!   `dflash_config`, `num_target_layers`);
//! - `aux_hidden_state_layer_ids`: each tap layer id + 1 (speculators counts the embedding
//!   output as layer 0, as z-lab's `hidden_states[id + 1]`); its converter drops an id on the
//!   verifier's last layer, which it feeds separately, so a drafter tapping that layer cannot be
//!   carried;
//! - `sample_from_anchor`: DSpark's slot k drafts anchor + k + 1 (true, `block_size` draft
//!   tokens), DFlash's and DFlash2's slot k drafts anchor + k (false, `block_size − 1`);
//! - `sliding_window_non_causal` false: our sliding layers are causal inside the block
//!   (speculators' DFlash2 defaults to true, so it is always written);
//! - `speculators_config`: a greedy proposal and the verifier's path and architectures, from
//!   which speculators loads the embeddings, the LM head and the final norm it does not store.
use serde_json::{json, Map, Value};

use crate::model::drafter::{DrafterConfig, DrafterHead};

/// The speculators release whose format is written and whose loader the soak test runs.
pub const SPECULATORS_VERSION: &str = "0.9.0";

/// What the export needs to know of the target (speculators' verifier).
#[derive(Clone, Debug, PartialEq)]
pub struct Verifier {
    /// Written as `speculators_config.verifier.name_or_path`: where speculators reads the
    /// embeddings, the LM head and the final norm from.
    pub name_or_path: String,
    pub architectures: Vec<String>,
    pub num_layers: usize,
    pub hidden_size: i64,
    pub vocab_size: i64,
}

/// Top-level keys of our published config that are not the draft transformer's
/// (speculators' `convert/dflash/converter.py` strips the same ones).
const NOT_TRANSFORMER_KEYS: [&str; 5] = [
    "architectures",
    "auto_map",
    "block_size",
    "dflash_config",
    "num_target_layers",
];

/// Why `cfg` cannot be written for speculators with `verifier`, if it cannot: each reason says
/// what speculators would do instead, and what to export.
pub fn refusal(cfg: &DrafterConfig, verifier: &Verifier) -> Option<String> {
    if cfg.head.domino().is_some() {
        return Some(format!(
            "speculators {SPECULATORS_VERSION} has no Domino model (its DFlash model would \
             drop the GRU correction); export it with --format hf"
        ));
    }
    if let Some(d) = cfg.head.dflash2() {
        if d.output_multiplier != 1.0 || d.final_logit_softcapping.is_some() {
            return Some(format!(
                "speculators {SPECULATORS_VERSION}'s DFlash2 applies neither output_multiplier \
                 nor final_logit_softcapping (this drafter has {} and {:?}); export it with \
                 --format hf",
                d.output_multiplier, d.final_logit_softcapping
            ));
        }
    }
    if cfg.target_hidden_size != cfg.hidden_size {
        return Some(format!(
            "speculators sizes fc from the drafter's hidden size; this drafter's target hidden \
             size {} differs from its hidden size {}",
            cfg.target_hidden_size, cfg.hidden_size
        ));
    }
    let target = &verifier.name_or_path;
    if verifier.hidden_size != cfg.target_hidden_size || verifier.vocab_size != cfg.vocab_size {
        return Some(format!(
            "the target {target} has hidden size {} and vocab {}; the drafter was trained on \
             {} and {}: give --target the drafter's own target",
            verifier.hidden_size, verifier.vocab_size, cfg.target_hidden_size, cfg.vocab_size
        ));
    }
    if let Some(n) = cfg.num_target_layers.filter(|&n| n != verifier.num_layers) {
        return Some(format!(
            "the target {target} has {} layers; the drafter records {n}: give --target the \
             drafter's own target",
            verifier.num_layers
        ));
    }
    if let Some(last) = cfg
        .target_layer_ids
        .iter()
        .find(|&&id| id + 1 == verifier.num_layers)
    {
        return Some(format!(
            "the drafter taps the target's last layer ({last}), which speculators feeds apart \
             from its auxiliary layers (its converter drops that id): its fc would lose an \
             input; export it with --format hf"
        ));
    }
    None
}

/// speculators' `config.json` for `cfg` (which [`refusal`] accepts) read against `verifier`;
/// `dtype` is the weights' (`float32`, `bfloat16`).
pub fn speculators_json(cfg: &DrafterConfig, verifier: &Verifier, dtype: &str) -> Value {
    let mut transformer = match cfg.to_hf_json() {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for key in NOT_TRANSFORMER_KEYS {
        transformer.remove(key);
    }
    transformer.insert("dtype".into(), json!(dtype));
    let sample_from_anchor = cfg.head.dspark().is_some();
    let (model_type, architecture) = match cfg.head {
        DrafterHead::Dspark(_) => ("dspark", "DSparkSpeculator"),
        DrafterHead::Dflash2(_) => ("dflash2", "DFlash2DraftModel"),
        _ => ("dflash", "DFlashSpeculator"),
    };
    let draft_tokens = if sample_from_anchor {
        cfg.block_size
    } else {
        cfg.block_size - 1
    };
    let mut out = json!({
        "architectures": [architecture],
        "speculators_model_type": model_type,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": transformer,
        "draft_vocab_size": cfg.vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": null,
        "aux_hidden_state_layer_ids": cfg.target_layer_ids.iter().map(|id| id + 1).collect::<Vec<_>>(),
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": false,
        "sample_from_anchor": sample_from_anchor,
        "dtype": dtype,
        "speculators_config": {
            "algorithm": model_type,
            "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": draft_tokens,
                "accept_tolerance": 0.0,
                "verifier_accept_k": 1,
            }],
            "verifier": {
                "name_or_path": verifier.name_or_path,
                "architectures": verifier.architectures,
            },
        },
    });
    let map = out.as_object_mut().expect("literal object");
    if let Some(d) = cfg.head.dspark() {
        map.insert("markov_rank".into(), json!(d.markov_rank));
        map.insert(
            "markov_head_type".into(),
            json!(d.markov_head_type.as_str()),
        );
        map.insert("enable_confidence_head".into(), json!(d.confidence_head));
        map.insert(
            "confidence_head_with_markov".into(),
            json!(d.confidence_head_with_markov),
        );
    }
    if let Some(d) = cfg.head.dflash2() {
        map.insert("conv_kernel_size".into(), json!(d.conv_kernel_size));
        map.insert("conv_group_size".into(), json!(d.conv_group_size));
        map.insert("selector_rank".into(), json!(d.selector_rank));
        map.insert("selector_top_k".into(), json!(d.selector_top_k));
    }
    out
}
