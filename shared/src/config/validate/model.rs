//! The drafter's shape: sizes, layer types, block and anchors, and the Domino head's keys.
use std::collections::BTreeSet;

use super::{in_range, positive};
use crate::config::dspark::DsparkSection;
use crate::config::error::ConfigIssue;
use crate::config::sections::{DrafterHead, LayerType, Objective};
use crate::config::Config;

pub(super) fn drafter(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.drafter;
    for (key, value) in [
        ("drafter.num_layers", d.num_layers),
        ("drafter.hidden_size", d.hidden_size),
        ("drafter.intermediate_size", d.intermediate_size),
        ("drafter.num_attention_heads", d.num_attention_heads),
        ("drafter.num_key_value_heads", d.num_key_value_heads),
        ("drafter.head_dim", d.head_dim),
    ] {
        positive(v, key, value);
    }
    if d.num_key_value_heads > 0 && d.num_attention_heads % d.num_key_value_heads != 0 {
        v.push(ConfigIssue::invalid(
            "drafter.num_key_value_heads",
            format!(
                "a divisor of drafter.num_attention_heads ({})",
                d.num_attention_heads
            ),
            d.num_key_value_heads,
        ));
    }
    if d.head_dim % 2 != 0 {
        v.push(ConfigIssue::invalid(
            "drafter.head_dim",
            "an even number (RoPE rotates pairs)",
            d.head_dim,
        ));
    }
    if d.block_size < 2 {
        v.push(
            ConfigIssue::invalid("drafter.block_size", "at least 2", d.block_size)
                .with_hint("a block is the anchor plus the positions the drafter predicts"),
        );
    }
    if d.target_layer_ids.is_empty() {
        v.push(ConfigIssue::invalid(
            "drafter.target_layer_ids",
            "at least one target layer id",
            "an empty list",
        ));
    }
    let unique: BTreeSet<_> = d.target_layer_ids.iter().collect();
    if unique.len() != d.target_layer_ids.len() {
        v.push(ConfigIssue::invalid(
            "drafter.target_layer_ids",
            "distinct layer ids",
            format!("{:?}", d.target_layer_ids),
        ));
    }
    if d.layer_types.len() != d.num_layers {
        v.push(ConfigIssue::invalid(
            "drafter.layer_types",
            format!(
                "one entry per layer ({} = drafter.num_layers)",
                d.num_layers
            ),
            format!("{} entries", d.layer_types.len()),
        ));
    }
    let slides = d.layer_types.contains(&LayerType::SlidingAttention);
    match d.sliding_window {
        None if slides => v.push(ConfigIssue::invalid(
            "drafter.sliding_window",
            "a window in tokens, because drafter.layer_types has sliding_attention layers",
            "nothing",
        )),
        Some(0) => v.push(ConfigIssue::invalid(
            "drafter.sliding_window",
            "a positive integer",
            0,
        )),
        _ => {}
    }
    if !(d.rope_theta.is_finite() && d.rope_theta > 0.0) {
        v.push(ConfigIssue::invalid(
            "drafter.rope_theta",
            "a positive number",
            d.rope_theta,
        ));
    }
    in_range(
        v,
        "drafter.rms_norm_eps",
        d.rms_norm_eps,
        f64::MIN_POSITIVE,
        1.0,
        "a small positive number",
    );
    if d.init_from
        .as_deref()
        .is_some_and(|dir| dir.trim().is_empty())
    {
        v.push(
            ConfigIssue::invalid(
                "drafter.init_from",
                "a drafter directory (config.json and model.safetensors)",
                "an empty string",
            )
            .with_hint("remove the key to start from random weights"),
        );
    }
    domino_head(c, v);
    dspark_head(c, v);
}

/// The DSpark keys: each only with `head = "dspark"`, and the confidence head reading the
/// Markov embedding only where there is a Markov head (SpecForge raises there too).
fn dspark_head(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.drafter;
    let dspark_keys = [
        ("drafter.markov_rank", d.markov_rank.is_some()),
        ("drafter.markov_head_type", d.markov_head_type.is_some()),
        (
            "drafter.enable_confidence_head",
            d.enable_confidence_head.is_some(),
        ),
        (
            "drafter.confidence_head_with_markov",
            d.confidence_head_with_markov.is_some(),
        ),
    ];
    if d.head != DrafterHead::Dspark {
        for (key, set) in dspark_keys {
            if set {
                v.push(
                    ConfigIssue::invalid(
                        key,
                        "no value unless drafter.head = \"dspark\"",
                        "a value",
                    )
                    .with_hint("set drafter.head = \"dspark\", or remove the key"),
                );
            }
        }
        if c.training.dspark != DsparkSection::default() {
            v.push(
                ConfigIssue::invalid(
                    "training.dspark",
                    "no section unless drafter.head = \"dspark\"",
                    "a section",
                )
                .with_hint("set drafter.head = \"dspark\", or remove [training.dspark]"),
            );
        }
        return;
    }
    if d.confidence_head_with_markov == Some(true)
        && (d.markov_rank == Some(0) || d.enable_confidence_head == Some(false))
    {
        v.push(
            ConfigIssue::invalid(
                "drafter.confidence_head_with_markov",
                "false unless there are a confidence head and a Markov head \
                 (drafter.enable_confidence_head, drafter.markov_rank > 0)",
                true,
            )
            .with_hint("remove the key: it follows the two heads when unset"),
        );
    }
    if c.training.objective != Objective::Dflash {
        v.push(
            ConfigIssue::invalid(
                "training.objective",
                "\"dflash\" with drafter.head = \"dspark\" (DSpark trains its own loss, \
                 weighted by [training.dspark])",
                format!("\"{}\"", c.training.objective.as_str()),
            )
            .with_hint("remove training.objective, or pick another head"),
        );
    }
}

/// `drafter.head` and the Domino keys: each Domino key only with `head = "domino"`, the two
/// widths required there, and at least one corrected slot per block.
fn domino_head(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.drafter;
    let domino_keys = [
        ("drafter.emb_dim", d.emb_dim.is_some()),
        ("drafter.gru_hidden_dim", d.gru_hidden_dim.is_some()),
        (
            "drafter.pure_draft_prefix_len",
            d.pure_draft_prefix_len.is_some(),
        ),
        ("drafter.shift_label", d.shift_label.is_some()),
    ];
    if d.head != DrafterHead::Domino {
        for (key, set) in domino_keys {
            if set {
                v.push(
                    ConfigIssue::invalid(
                        key,
                        "no value unless drafter.head = \"domino\"",
                        "a value",
                    )
                    .with_hint("set drafter.head = \"domino\", or remove the key"),
                );
            }
        }
        return;
    }
    for (key, value) in [
        ("drafter.emb_dim", d.emb_dim),
        ("drafter.gru_hidden_dim", d.gru_hidden_dim),
    ] {
        match value {
            None => v.push(
                ConfigIssue::invalid(
                    key,
                    "a positive integer (drafter.head = \"domino\")",
                    "nothing",
                )
                .with_hint("SpecForge's Qwen3.6-27B recipe uses emb_dim 256, gru_hidden_dim 1024"),
            ),
            Some(n) => positive(v, key, n),
        }
    }
    if d.shift_label == Some(true) {
        v.push(
            ConfigIssue::invalid("drafter.shift_label", "false", true).with_hint(
                "shift_label = true moves every label one token later (slot k predicts \
                 anchor + k + 1); dflashd's blocks keep the anchor in slot 0 and train slot k \
                 on anchor + k, as SpecForge does with shift_label = false (its Qwen3.6-27B recipe)",
            ),
        );
    }
    // Slot 0 is the anchor and is never predicted, so the first corrected slot is
    // 1 + pure_draft_prefix_len, and it must lie inside the block.
    let prefix = d.pure_draft_prefix_len.unwrap_or(0);
    if d.block_size >= 2 && 1 + prefix >= d.block_size {
        v.push(ConfigIssue::invalid(
            "drafter.pure_draft_prefix_len",
            format!(
                "at most {} (drafter.block_size − 2: the correction needs a slot after the \
                 anchor and the pure-draft prefix)",
                d.block_size - 2
            ),
            prefix,
        ));
    }
}
