//! Semantic checks after the types parsed. Every rule names its key, the expectation and what
//! was found; all failures are collected so one run of `config validate` shows them all.
use std::collections::BTreeSet;

use super::daemon_sections::{parse_metrics_listen, METRICS_LISTEN_EXPECTED};
use super::device::Device;
use super::error::ConfigIssue;
use super::sections::{
    paper_loss_decay_gamma, DataFormat, DrafterHead, LayerType, EMBEDDED_DATA, EMBEDDED_PROMPTS,
};
use super::Config;

const MAX_RUN_NAME: usize = 64;

pub(crate) fn validate(c: &Config) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    run(c, &mut v);
    drafter(c, &mut v);
    training(c, &mut v);
    online_eval(c, &mut v);
    data(c, &mut v);
    topology(c, &mut v);
    runtime(c, &mut v);
    detectors(c, &mut v);
    tensorboard(c, &mut v);
    metrics(c, &mut v);
    v
}

/// What can only be judged once the data's sample count is known: the held-out count and the
/// batch size against it. `start` checks this after loading the data; `config validate` with
/// an upper bound of the count (the file's lines), so what it refuses `start` refuses too.
pub(crate) fn against_dataset(c: &Config, n_samples: usize) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    let d = &c.data;
    let held_out = d.held_out_count(n_samples);
    let held_out_key = if d.held_out_samples.is_some() {
        "data.held_out_samples"
    } else {
        "data.held_out_fraction"
    };
    if held_out >= n_samples {
        v.push(
            ConfigIssue::invalid(
                held_out_key,
                format!("fewer held-out samples than the {n_samples} samples of the data"),
                format!("{} held out", d.held_out_samples.unwrap_or(held_out)),
            )
            .with_hint("that leaves no sample to train on; hold out fewer"),
        );
        return v;
    }
    let train = n_samples - held_out;
    let batch = c.training.batch_size;
    if batch > train {
        v.push(
            ConfigIssue::invalid(
                "training.batch_size",
                format!("at most the {train} training samples ({n_samples} in the data, {held_out} held out)"),
                batch,
            )
            .with_hint(
                "every step would take the whole dataset, a handful of steps in all; pick a \
                 batch size well below the training sample count",
            ),
        );
    }
    v
}

fn positive(v: &mut Vec<ConfigIssue>, key: &str, value: usize) {
    if value == 0 {
        v.push(ConfigIssue::invalid(key, "a positive integer", value));
    }
}

fn in_range(v: &mut Vec<ConfigIssue>, key: &str, value: f64, lo: f64, hi: f64, expected: &str) {
    if !(value.is_finite() && value >= lo && value <= hi) {
        v.push(ConfigIssue::invalid(key, expected, value));
    }
}

fn run(c: &Config, v: &mut Vec<ConfigIssue>) {
    let name = &c.run.name;
    let ok = !name.is_empty()
        && name.len() <= MAX_RUN_NAME
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch));
    if !ok {
        v.push(
            ConfigIssue::invalid(
                "run.name",
                format!("1–{MAX_RUN_NAME} letters, digits, '.', '_' or '-'"),
                format!("\"{name}\""),
            )
            .with_hint("operators type the run name to confirm destructive actions"),
        );
    }
}

fn drafter(c: &Config, v: &mut Vec<ConfigIssue>) {
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
    domino_head(c, v);
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

fn training(c: &Config, v: &mut Vec<ConfigIssue>) {
    let t = &c.training;
    if t.epochs == 0 {
        v.push(ConfigIssue::invalid(
            "training.epochs",
            "a positive integer (the recipe trains 6)",
            0,
        ));
    }
    if t.early_stopping {
        v.push(
            ConfigIssue::invalid(
                "training.early_stopping",
                "false: the DFlash recipe trains 6 full epochs and has no early stopping",
                true,
            )
            .with_hint("remove the key, or set it to false"),
        );
    }
    if t.max_steps == Some(0) {
        v.push(ConfigIssue::invalid(
            "training.max_steps",
            "a positive integer or no value",
            0,
        ));
    }
    positive(v, "training.num_anchors", t.num_anchors);
    positive(v, "training.batch_size", t.batch_size);
    positive(v, "training.keep_checkpoints", t.keep_checkpoints);
    positive(v, "training.grad_accum", t.grad_accum);
    positive(v, "training.loss_chunk_positions", t.loss_chunk_positions);
    positive(v, "training.seq_len_multiple", t.seq_len_multiple);
    positive(
        v,
        "training.eval_anchors_per_forward",
        t.eval_anchors_per_forward,
    );
    if t.eval_every == 0 {
        v.push(ConfigIssue::invalid(
            "training.eval_every",
            "a positive number of steps",
            0,
        ));
    }
    if t.checkpoint_every == 0 {
        v.push(ConfigIssue::invalid(
            "training.checkpoint_every",
            "a positive number of steps",
            0,
        ));
    }
    if t.max_length <= c.drafter.block_size {
        v.push(ConfigIssue::invalid(
            "training.max_length",
            format!(
                "more tokens than drafter.block_size ({})",
                c.drafter.block_size
            ),
            t.max_length,
        ));
    }
    if t.num_anchors > t.max_length {
        v.push(ConfigIssue::invalid(
            "training.num_anchors",
            format!("at most training.max_length ({})", t.max_length),
            t.num_anchors,
        ));
    }
    if !(t.lr.is_finite() && t.lr > 0.0) {
        v.push(ConfigIssue::invalid(
            "training.lr",
            "a positive number",
            t.lr,
        ));
    }
    in_range(
        v,
        "training.warmup_ratio",
        t.warmup_ratio,
        0.0,
        0.999_999,
        "a fraction in [0, 1)",
    );
    if !(t.grad_clip.is_finite() && t.grad_clip > 0.0) {
        v.push(ConfigIssue::invalid(
            "training.grad_clip",
            "a positive number (global L2 norm)",
            t.grad_clip,
        ));
    }
    in_range(
        v,
        "training.weight_decay",
        t.weight_decay,
        0.0,
        1.0,
        "a number in [0, 1]",
    );
    in_range(
        v,
        "training.adam_beta1",
        t.adam_beta1,
        0.0,
        0.999_999,
        "a number in [0, 1)",
    );
    in_range(
        v,
        "training.adam_beta2",
        t.adam_beta2,
        0.0,
        0.999_999_999,
        "a number in [0, 1)",
    );
    in_range(
        v,
        "training.adam_eps",
        t.adam_eps,
        f64::MIN_POSITIVE,
        1.0,
        "a small positive number",
    );
    if !(t.dpace_alpha.is_finite() && (0.0..=1.0).contains(&t.dpace_alpha)) {
        v.push(
            ConfigIssue::invalid(
                "training.dpace_alpha",
                "a number in [0, 1] (D-PACE smooths the drafter's confidence as (1−α)·q + α)",
                t.dpace_alpha,
            )
            .with_hint("SpecForge and the D-PACE paper use 0.5; remove the key for that"),
        );
    }
    for (key, value) in [
        ("training.lambda_base_start", t.lambda_base_start),
        (
            "training.lambda_base_decay_ratio",
            t.lambda_base_decay_ratio,
        ),
    ] {
        if !(value.is_finite() && (0.0..=1.0).contains(&value)) {
            v.push(
                ConfigIssue::invalid(key, "a number in [0, 1]", value).with_hint(
                    "Domino's curriculum weighs the base loss by λ, falling linearly from \
                     lambda_base_start to 0 over lambda_base_decay_ratio of the run \
                     (SpecForge: 1 and 0.5)",
                ),
            );
        }
    }
    match t.loss_decay_gamma {
        Some(g) if !(g.is_finite() && g > 0.0) => {
            v.push(ConfigIssue::invalid(
                "training.loss_decay_gamma",
                "a positive number",
                g,
            ));
        }
        None if paper_loss_decay_gamma(c.drafter.block_size).is_none() => v.push(
            ConfigIssue::invalid(
                "training.loss_decay_gamma",
                format!(
                    "a value, because the paper publishes none for drafter.block_size = {}",
                    c.drafter.block_size
                ),
                "nothing",
            )
            .with_hint("the paper uses 7 for block 16, 5 for block 10, 4 for block 8"),
        ),
        _ => {}
    }
}

/// The online-evaluation keys of `[training]`. Their ranges hold even while it is off
/// (`online_eval_every = 0`), so turning it on later cannot surprise.
fn online_eval(c: &Config, v: &mut Vec<ConfigIssue>) {
    let t = &c.training;
    positive(
        v,
        "training.online_eval_max_prompts",
        t.online_eval_max_prompts,
    );
    positive(
        v,
        "training.online_eval_max_new_tokens",
        t.online_eval_max_new_tokens,
    );
    match t.online_eval_prompts.as_deref() {
        Some(p) if p.trim().is_empty() => v.push(ConfigIssue::invalid(
            "training.online_eval_prompts",
            format!("a JSONL prompt file or \"{EMBEDDED_PROMPTS}\""),
            "an empty string",
        )),
        _ => {}
    }
    if let (Some(every @ 1..), None) = (t.online_eval_every, &t.online_eval_prompts) {
        v.push(
            ConfigIssue::invalid(
                "training.online_eval_every",
                "training.online_eval_prompts to name the prompts to decode",
                format!("{every} steps with no prompts"),
            )
            .with_hint(
                "name a JSONL file of prompts (`input_ids` or chat `conversations`) in \
                 training.online_eval_prompts, or set training.online_eval_every = 0",
            ),
        );
    }
    let budgets = &t.online_eval_tree_budgets;
    for (i, &b) in budgets.iter().enumerate() {
        if b == 0 {
            v.push(
                ConfigIssue::invalid(
                    format!("training.online_eval_tree_budgets[{i}]"),
                    "a positive number of tree nodes",
                    0,
                )
                .with_hint("leave the list empty ([]) for chain decoding only"),
            );
        } else if budgets[..i].contains(&b) {
            v.push(ConfigIssue::invalid(
                format!("training.online_eval_tree_budgets[{i}]"),
                "each budget once",
                format!("{b} again"),
            ));
        }
    }
}

/// The embedded prompts are token ids of the embedded target's vocabulary: meaningless for
/// any other target. Judged where the target is (`config validate`, and `start` before the
/// first step), not when a config is parsed: a copy of the embedded default pointed at a
/// Hugging Face model is refused for its model first, if that is what is wrong with it.
pub(crate) fn embedded_prompts_on_another_target(c: &Config) -> Option<ConfigIssue> {
    let t = &c.training;
    let embedded_prompts = t.online_eval_prompts.as_deref() == Some(EMBEDDED_PROMPTS);
    (embedded_prompts && t.online_eval_interval() > 0 && !c.target.is_embedded()).then(|| {
        ConfigIssue::invalid(
            "training.online_eval_prompts",
            "a JSONL prompt file for this target",
            format!("\"{EMBEDDED_PROMPTS}\""),
        )
        .with_hint(
            "the embedded prompts are token ids of the embedded target's vocabulary; name a \
             JSONL file of prompts (`input_ids` or chat `conversations`) for target.model, or \
             set training.online_eval_every = 0",
        )
    })
}

fn data(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.data;
    if d.train_file.trim().is_empty() {
        v.push(ConfigIssue::invalid(
            "data.train_file",
            "a JSONL path or \"embedded\"",
            "an empty string",
        ));
    }
    in_range(
        v,
        "data.held_out_fraction",
        d.held_out_fraction,
        0.0,
        0.5,
        "a fraction in [0, 0.5]",
    );
    // `start` refuses chat data on the embedded target whatever `data.tokenizer` says: the
    // embedded target has no chat template, and its random weights know no tokenizer's ids.
    let chat_file = d.format == DataFormat::Chat && d.train_file != EMBEDDED_DATA;
    if chat_file && c.target.is_embedded() {
        v.push(
            ConfigIssue::invalid(
                "data.format",
                "\"pretokenized\" with the embedded target",
                "\"chat\"",
            )
            .with_hint(
                "the embedded target has no chat template, and data.tokenizer does not give it \
                 one; use pre-tokenized data or a Hugging Face target (target.model)",
            ),
        );
    }
}

/// What `config validate` can learn from disk without loading weights; `None` where it could
/// not be learnt (the check is then left to `start`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    /// Non-blank lines of `data.train_file`: an upper bound of its sample count.
    pub train_lines: Option<usize>,
    /// `telemetry.python` as resolved, when it names no file.
    pub missing_python: Option<String>,
    /// `training.online_eval_prompts` as resolved, when online evaluation is on and it names
    /// no file.
    pub missing_online_prompts: Option<String>,
    /// The target's depth and vocabulary, from its `config.json` (or the embedded target).
    pub target: Option<TargetShape>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetShape {
    pub num_layers: usize,
    pub vocab_size: u64,
    pub hidden_size: u64,
}

/// The checks of [`ConfigFacts`]: each is one `start` makes with the loaded target and data,
/// named here by the TOML key. A sample count is at most the line count, and the dataset rules
/// only get stricter as it shrinks, so what is refused on the lines `start` refuses too.
pub(crate) fn against_facts(c: &Config, f: &ConfigFacts) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    if let Some(lines) = f.train_lines {
        v.extend(against_dataset(c, lines));
    }
    if let Some(path) = &f.missing_python {
        v.push(
            ConfigIssue::invalid(
                "telemetry.python",
                "the path of an existing Python interpreter",
                format!("{path} (no such file)"),
            )
            .with_hint("fix the path, or remove the key to record no Python environment"),
        );
    }
    v.extend(embedded_prompts_on_another_target(c));
    if let Some(path) = &f.missing_online_prompts {
        v.push(
            ConfigIssue::invalid(
                "training.online_eval_prompts",
                "an existing JSONL prompt file",
                format!("{path} (no such file)"),
            )
            .with_hint("fix the path, or set training.online_eval_every = 0"),
        );
    }
    if let Some(t) = f.target {
        let d = &c.drafter;
        for (i, &id) in d.target_layer_ids.iter().enumerate() {
            if id >= t.num_layers {
                v.push(ConfigIssue::invalid(
                    format!("drafter.target_layer_ids[{i}]"),
                    format!(
                        "a layer of the target: 0..={}",
                        t.num_layers.saturating_sub(1)
                    ),
                    format!("{id} (the target has {} layers)", t.num_layers),
                ));
            }
        }
        if d.hidden_size as u64 != t.hidden_size {
            v.push(
                ConfigIssue::invalid(
                    "drafter.hidden_size",
                    format!("the target's hidden size, {}", t.hidden_size),
                    d.hidden_size,
                )
                .with_hint("the drafter reuses the target's embedding and LM head"),
            );
        }
        if u64::from(d.mask_token_id) >= t.vocab_size {
            v.push(
                ConfigIssue::invalid(
                    "drafter.mask_token_id",
                    format!(
                        "a token id of the target: 0..={}",
                        t.vocab_size.saturating_sub(1)
                    ),
                    format!(
                        "{} (the target's vocabulary has {})",
                        d.mask_token_id, t.vocab_size
                    ),
                )
                .with_hint("the mask token must be a row of the target's embedding"),
            );
        }
    }
    v
}

fn serve_gap(c: &Config, v: &mut Vec<ConfigIssue>) {
    let g = &c.detectors.serve_gap;
    let p = "detectors.serve_gap";
    in_range(
        v,
        &format!("{p}.gap_fraction"),
        g.gap_fraction,
        f64::MIN_POSITIVE,
        0.999_999,
        "a fraction of the offline τ in (0, 1)",
    );
    if !(g.clear_fraction.is_finite() && g.clear_fraction >= 0.0) {
        v.push(ConfigIssue::invalid(
            format!("{p}.clear_fraction"),
            "a fraction of the offline τ, 0 or more",
            g.clear_fraction,
        ));
    } else if g.clear_fraction >= g.gap_fraction {
        v.push(ConfigIssue::invalid(
            format!("{p}.clear_fraction"),
            format!(
                "less than {p}.gap_fraction ({}) for hysteresis",
                g.gap_fraction
            ),
            g.clear_fraction,
        ));
    }
    positive(v, &format!("{p}.fire_after"), g.fire_after);
    positive(v, &format!("{p}.clear_after"), g.clear_after);
}

fn topology(c: &Config, v: &mut Vec<ConfigIssue>) {
    for (key, devices) in [
        ("topology.target_devices", &c.topology.target_devices),
        ("topology.drafter_devices", &c.topology.drafter_devices),
    ] {
        if devices.is_empty() {
            v.push(ConfigIssue::invalid(
                key,
                "at least one device (\"cpu\" or \"cuda:N\")",
                "an empty list",
            ));
            continue;
        }
        let mut seen = BTreeSet::new();
        for d in devices.iter().filter(|d| d.is_cuda()) {
            if !seen.insert(d) {
                v.push(ConfigIssue::invalid(
                    key,
                    "each GPU at most once (one worker thread per device)",
                    format!("{d} twice"),
                ));
            }
        }
        // CPU workers share the host; several are allowed (tests run 2+2 CPU topologies).
        let kinds: BTreeSet<bool> = devices.iter().map(Device::is_cuda).collect();
        if kinds.len() > 1 {
            v.push(
                ConfigIssue::invalid(key, "all \"cpu\" or all \"cuda:N\"", "a mix of both")
                    .with_hint("gradients and hidden states are exchanged within one device kind"),
            );
        }
    }
}

fn runtime(c: &Config, v: &mut Vec<ConfigIssue>) {
    let q = &c.queue;
    positive(v, "queue.capacity", q.capacity);
    if q.high_watermark == 0 || q.high_watermark > q.capacity {
        v.push(ConfigIssue::invalid(
            "queue.high_watermark",
            format!("between 1 and queue.capacity ({})", q.capacity),
            q.high_watermark,
        ));
    }
    if q.low_watermark >= q.high_watermark {
        v.push(ConfigIssue::invalid(
            "queue.low_watermark",
            format!("less than queue.high_watermark ({})", q.high_watermark),
            q.low_watermark,
        ));
    }
    if q.byte_cap.bytes() == 0 {
        v.push(ConfigIssue::invalid(
            "queue.byte_cap",
            "a positive size",
            "0 B",
        ));
    }
    let t = &c.telemetry;
    if t.sample_interval_ms < 100 {
        v.push(ConfigIssue::invalid(
            "telemetry.sample_interval_ms",
            "at least 100",
            t.sample_interval_ms,
        ));
    }
    let mut names = BTreeSet::new();
    for (i, cache) in t.caches.iter().enumerate() {
        if cache.name.trim().is_empty() {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].name"),
                "a name",
                "an empty string",
            ));
        } else if !names.insert(cache.name.as_str()) {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].name"),
                "a name not used by another cache",
                format!("\"{}\" again", cache.name),
            ));
        }
        if cache.path.trim().is_empty() {
            v.push(ConfigIssue::invalid(
                format!("telemetry.caches[{i}].path"),
                "a path",
                "an empty string",
            ));
        }
    }
    let ctl = &c.control;
    if ctl.pending_action_expiry_s == 0 {
        v.push(ConfigIssue::invalid(
            "control.pending_action_expiry_s",
            "a positive number of seconds",
            0,
        ));
    }
    positive(v, "control.client_buffer_frames", ctl.client_buffer_frames);
    let range = super::daemon_sections::MAX_CONNECTIONS_RANGE;
    if !range.contains(&ctl.max_connections) {
        v.push(ConfigIssue::invalid(
            "control.max_connections",
            format!("{} to {} connections", range.start(), range.end()),
            ctl.max_connections,
        ));
    }
    if let Some(cmd) = &ctl.poweroff_command {
        if cmd.first().is_none_or(|p| p.trim().is_empty()) {
            v.push(
                ConfigIssue::invalid(
                    "control.poweroff_command",
                    "a program and its arguments, e.g. [\"systemctl\", \"poweroff\"]",
                    "an empty command",
                )
                .with_hint("leave the key out to keep power-off disabled"),
            );
        }
    }
}

fn tensorboard(c: &Config, v: &mut Vec<ConfigIssue>) {
    let dir = &c.tensorboard.dir;
    if !c.tensorboard.enabled {
        return;
    }
    if dir.trim().is_empty() {
        v.push(
            ConfigIssue::invalid(
                "tensorboard.dir",
                "a directory, relative to the run dir or absolute",
                "an empty string",
            )
            .with_hint(
                "leave the key out for <run dir>/tensorboard, or set tensorboard.enabled = false",
            ),
        );
    } else if dir.starts_with('~') || dir.contains("${") {
        v.push(
            ConfigIssue::invalid(
                "tensorboard.dir",
                "a plain path, relative to the run dir or absolute",
                format!("\"{dir}\""),
            )
            .with_hint("`~` and `${VAR}` are not expanded here; write the absolute path"),
        );
    }
}

fn metrics(c: &Config, v: &mut Vec<ConfigIssue>) {
    if let Some(listen) = &c.metrics.listen {
        if let Err(found) = parse_metrics_listen(listen) {
            v.push(
                ConfigIssue::invalid("metrics.listen", METRICS_LISTEN_EXPECTED, found)
                    .with_hint("leave the key out to serve no /metrics endpoint"),
            );
        }
    }
}

fn detectors(c: &Config, v: &mut Vec<ConfigIssue>) {
    serve_gap(c, v);
    let t = &c.detectors.throughput;
    let p = "detectors.throughput";
    for (key, value) in [
        ("warn_below", t.warn_below),
        ("warn_clear_above", t.warn_clear_above),
        ("crit_below", t.crit_below),
        ("crit_clear_above", t.crit_clear_above),
    ] {
        in_range(
            v,
            &format!("{p}.{key}"),
            value,
            0.0,
            1.0,
            "a ratio of the baseline in [0, 1]",
        );
    }
    if t.crit_below >= t.warn_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.crit_below"),
            format!("less than {p}.warn_below ({})", t.warn_below),
            t.crit_below,
        ));
    }
    if t.warn_clear_above <= t.warn_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.warn_clear_above"),
            format!("more than {p}.warn_below ({}) for hysteresis", t.warn_below),
            t.warn_clear_above,
        ));
    }
    if t.crit_clear_above <= t.crit_below {
        v.push(ConfigIssue::invalid(
            format!("{p}.crit_clear_above"),
            format!("more than {p}.crit_below ({}) for hysteresis", t.crit_below),
            t.crit_clear_above,
        ));
    }
    positive(v, &format!("{p}.smoothing_samples"), t.smoothing_samples);
    if let Some(b) = t.pinned_baseline_tokens_per_s {
        if !(b.is_finite() && b > 0.0) {
            v.push(ConfigIssue::invalid(
                format!("{p}.pinned_baseline_tokens_per_s"),
                "a positive tok/s",
                b,
            ));
        }
    }
    let durations = [
        ("detectors.throughput.warmup_s", t.warmup_s),
        (
            "detectors.throughput.baseline_window_s",
            t.baseline_window_s,
        ),
        ("detectors.throughput.warn_after_s", t.warn_after_s),
        ("detectors.throughput.crit_after_s", t.crit_after_s),
        ("detectors.throughput.clear_after_s", t.clear_after_s),
        ("detectors.throughput.max_sample_gap_s", t.max_sample_gap_s),
        ("detectors.memory.warmup_s", c.detectors.memory.warmup_s),
        ("detectors.memory.window_s", c.detectors.memory.window_s),
        ("detectors.queue.window_s", c.detectors.queue.window_s),
        (
            "detectors.queue.min_duration_s",
            c.detectors.queue.min_duration_s,
        ),
        (
            "detectors.healthy.after_ok_s",
            c.detectors.healthy.after_ok_s,
        ),
        ("detectors.healthy.refresh_s", c.detectors.healthy.refresh_s),
    ];
    for (key, value) in durations {
        in_range(
            v,
            key,
            value,
            0.0,
            f64::MAX,
            "a non-negative number of seconds",
        );
    }
    let m = &c.detectors.memory;
    in_range(
        v,
        "detectors.memory.max_range_frac",
        m.max_range_frac,
        0.0,
        1.0,
        "a fraction of total memory in [0, 1]",
    );
    in_range(
        v,
        "detectors.memory.max_stddev_frac",
        m.max_stddev_frac,
        0.0,
        1.0,
        "a fraction of total memory in [0, 1]",
    );
    let q = &c.detectors.queue;
    for (key, value) in [
        ("starved_frac", q.starved_frac),
        ("blocked_frac", q.blocked_frac),
        ("waste_warn_frac", q.waste_warn_frac),
    ] {
        in_range(
            v,
            &format!("detectors.queue.{key}"),
            value,
            0.0,
            1.0,
            "a fraction in [0, 1]",
        );
    }
}

/// Legal but worth saying out loud at start and in `config validate`.
pub(crate) fn warnings(c: &Config) -> Vec<String> {
    let mut w = Vec::new();
    if c.training.epochs != 6 {
        w.push(format!(
            "training.epochs = {}: the DFlash recipe trains 6 full epochs",
            c.training.epochs
        ));
    }
    if let Some(steps) = c.training.max_steps {
        w.push(format!(
            "training.max_steps = {steps}: training stops there even if epochs remain"
        ));
    }
    let drafters: BTreeSet<_> = c
        .topology
        .drafter_devices
        .iter()
        .filter(|d| d.is_cuda())
        .collect();
    for d in c
        .topology
        .target_devices
        .iter()
        .filter(|d| drafters.contains(d))
    {
        w.push(format!("{d} is in both topology.target_devices and topology.drafter_devices: two workers share its memory"));
    }
    w
}
