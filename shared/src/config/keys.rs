//! Every config key's kind, declared once: what a resume does with a changed value, whether the
//! key is part of the recipe a healthy record is keyed by, and whether every node of a job must
//! agree on it. The daemon's locked-key gate, the engine's resume check, the healthy record's
//! recipe, the job's agreement and the "did you mean" suggestions are filters over [`KEYS`];
//! `shared/tests/config_keys.rs` holds the table to the schema (every leaf key has a row, every
//! row a key). A key's meaning is documented on its field in `sections.rs` /
//! `daemon_sections.rs`; this table says only how the rest of the system treats it.
//!
//! A row is one leaf key: a table of tables (`telemetry.caches`) or an array is one leaf.

/// What a resume does when the key's value differs from the checkpoint's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnResume {
    /// The new value applies: when and how to evaluate, save, chunk or watch, not what is
    /// computed.
    Free,
    /// Refused: the key decides what the drafter learns or how its weights are shaped, so a
    /// run that changed it would be neither experiment. No unlock admits it (`locked.rs`'s
    /// `unlock_refusal` says why for each).
    Fixed,
    /// Refused unless an operator unlocked it (typed confirmation, journaled); the engine then
    /// carries the checkpoint across the change (`engine/src/train/unlocked.rs`).
    Unlockable,
}

/// One row of [`KEYS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyKind {
    /// The dotted leaf key.
    pub key: &'static str,
    pub on_resume: OnResume,
    /// Part of the recipe the healthy record is keyed by: a change makes a run a different
    /// workload, whose throughput an old record cannot judge.
    pub recipe: bool,
    /// Every node of a multi-node job must hold the same value (it is in the job's digest).
    pub job: bool,
}

use OnResume::{Fixed, Free, Unlockable};

const fn row(key: &'static str, on_resume: OnResume, recipe: bool, job: bool) -> KeyKind {
    KeyKind {
        key,
        on_resume,
        recipe,
        job,
    }
}

/// The training signal: fixed for the run, in the recipe, agreed by every node.
const fn signal(key: &'static str) -> KeyKind {
    row(key, Fixed, true, true)
}

/// A cadence or a knob of how work is done, not what: free on resume, agreed by every node.
const fn cadence(key: &'static str, recipe: bool) -> KeyKind {
    row(key, Free, recipe, true)
}

/// One node's own business: free on resume, outside the recipe and the job's digest.
const fn node_local(key: &'static str, recipe: bool) -> KeyKind {
    row(key, Free, recipe, false)
}

pub const KEYS: &[KeyKind] = &[
    // [run]: names and places; the seed fixes data order and initialisation.
    cadence("run.name", false),
    row("run.seed", Fixed, false, true),
    node_local("run.run_dir", false),
    // [target]: the frozen model the hidden states come from.
    cadence("target.model", true),
    cadence("target.dtype", true),
    // [drafter]: the architecture shapes the weights.
    signal("drafter.num_layers"),
    signal("drafter.hidden_size"),
    signal("drafter.intermediate_size"),
    signal("drafter.num_attention_heads"),
    signal("drafter.num_key_value_heads"),
    signal("drafter.head_dim"),
    row("drafter.block_size", Unlockable, true, true),
    signal("drafter.mask_token_id"),
    row("drafter.target_layer_ids", Unlockable, true, true),
    signal("drafter.layer_types"),
    signal("drafter.sliding_window"),
    signal("drafter.rope_theta"),
    signal("drafter.rms_norm_eps"),
    signal("drafter.head"),
    signal("drafter.emb_dim"),
    signal("drafter.gru_hidden_dim"),
    signal("drafter.pure_draft_prefix_len"),
    signal("drafter.shift_label"),
    signal("drafter.markov_rank"),
    signal("drafter.markov_head_type"),
    signal("drafter.enable_confidence_head"),
    signal("drafter.confidence_head_with_markov"),
    signal("drafter.conv_kernel_size"),
    signal("drafter.conv_group_size"),
    signal("drafter.selector_rank"),
    signal("drafter.selector_top_k"),
    signal("drafter.output_multiplier"),
    signal("drafter.final_logit_softcapping"),
    signal("drafter.init_from"),
    // [training]: the objective, the optimiser and the schedule are the signal.
    signal("training.precision"),
    row("training.epochs", Unlockable, false, true),
    row("training.max_steps", Free, false, true),
    row("training.early_stopping", Fixed, false, true),
    row("training.num_anchors", Unlockable, true, true),
    signal("training.lr"),
    signal("training.warmup_ratio"),
    signal("training.grad_clip"),
    signal("training.weight_decay"),
    signal("training.adam_beta1"),
    signal("training.adam_beta2"),
    signal("training.adam_eps"),
    signal("training.objective"),
    signal("training.dpace_alpha"),
    signal("training.dpace_normalization"),
    signal("training.tree.budget"),
    signal("training.tree.temperature"),
    signal("training.tree.loss"),
    signal("training.dspark.ce"),
    signal("training.dspark.l1"),
    signal("training.dspark.confidence"),
    signal("training.dflash2.selector_loss_alpha"),
    signal("training.dflash2.selector_warmup_ratio"),
    signal("training.dflash2.selector_ramp_ratio"),
    signal("training.dflash2.selector_stop_gradient"),
    signal("training.lambda_base_start"),
    signal("training.lambda_base_decay_ratio"),
    signal("training.loss_decay_gamma"),
    signal("training.batch_size"),
    signal("training.max_length"),
    signal("training.label_mask"),
    // The global batch, not grad_accum alone, is what the engine holds fixed.
    cadence("training.grad_accum", true),
    cadence("training.seq_len_multiple", true),
    cadence("training.eval_every", false),
    cadence("training.eval_max_samples", false),
    cadence("training.eval_tree_block_subsample", false),
    cadence("training.online_eval_every", false),
    cadence("training.online_eval_prompts", false),
    cadence("training.online_eval_max_prompts", false),
    cadence("training.online_eval_max_new_tokens", false),
    cadence("training.online_eval_tree_budgets", false),
    // With the tree objective and no `training.tree.budget`, the trained budget follows it:
    // the gate and the engine then compare the effective budget (`locked.rs`).
    cadence("training.serve_tree_budget", false),
    cadence("training.checkpoint_every", false),
    cadence("training.keep_checkpoints", false),
    cadence("training.loss_chunk_positions", true),
    cadence("training.eval_anchors_per_forward", true),
    cadence("training.attention", true),
    cadence("training.activation_checkpointing", true),
    // [data]: the engine's data digest guards the samples themselves; the held-out split
    // decides which samples train.
    cadence("data.train_file", true),
    cadence("data.format", true),
    cadence("data.tokenizer", true),
    cadence("data.chat_template", true),
    signal("data.held_out_fraction"),
    signal("data.held_out_samples"),
    cadence("data.max_line_bytes", true),
    // The machine's own sections: one node's business (the heartbeat excepted, which every
    // node must agree on).
    // [control]
    node_local("control.allowed_uids", false),
    node_local("control.client_buffer_frames", false),
    node_local("control.max_connections", false),
    node_local("control.pending_action_expiry_s", false),
    node_local("control.poweroff_command", false),
    node_local("control.socket", false),
    // [detectors]
    node_local("detectors.explain_lookback_s", false),
    node_local("detectors.healthy.after_ok_s", false),
    node_local("detectors.healthy.refresh_s", false),
    node_local("detectors.healthy.use_recipe_record", false),
    node_local("detectors.memory.clear_range_frac", false),
    node_local("detectors.memory.clear_stddev_frac", false),
    node_local("detectors.memory.max_range_frac", false),
    node_local("detectors.memory.max_stddev_frac", false),
    node_local("detectors.memory.min_samples", false),
    node_local("detectors.memory.warmup_s", false),
    node_local("detectors.memory.window_s", false),
    node_local("detectors.queue.blocked_frac", false),
    node_local("detectors.queue.clear_waste_frac", false),
    node_local("detectors.queue.min_duration_s", false),
    node_local("detectors.queue.starved_frac", false),
    node_local("detectors.queue.waste_warn_frac", false),
    node_local("detectors.queue.window_s", false),
    node_local("detectors.serve_gap.clear_after", false),
    node_local("detectors.serve_gap.clear_fraction", false),
    node_local("detectors.serve_gap.fire_after", false),
    node_local("detectors.serve_gap.gap_fraction", false),
    node_local("detectors.straggler.behind_frac", false),
    node_local("detectors.straggler.steps", false),
    node_local("detectors.throughput.baseline_window_s", false),
    node_local("detectors.throughput.clear_after_s", false),
    node_local("detectors.throughput.crit_after_s", false),
    node_local("detectors.throughput.crit_below", false),
    node_local("detectors.throughput.crit_clear_above", false),
    node_local("detectors.throughput.max_sample_gap_s", false),
    node_local("detectors.throughput.min_baseline_samples", false),
    node_local("detectors.throughput.pinned_baseline_tokens_per_s", false),
    node_local("detectors.throughput.smoothing_samples", false),
    node_local("detectors.throughput.warmup_s", false),
    node_local("detectors.throughput.warn_after_s", false),
    node_local("detectors.throughput.warn_below", false),
    node_local("detectors.throughput.warn_clear_above", false),
    // [metrics]
    node_local("metrics.listen", false),
    // [nodes]
    cadence("nodes.heartbeat_timeout_s", false),
    // [queue]
    node_local("queue.byte_cap", true),
    node_local("queue.capacity", true),
    node_local("queue.high_watermark", true),
    node_local("queue.low_watermark", true),
    // [telemetry]
    node_local("telemetry.caches", false),
    node_local("telemetry.python", false),
    node_local("telemetry.sample_interval_ms", false),
    // [tensorboard]
    node_local("tensorboard.dir", false),
    node_local("tensorboard.enabled", false),
    // [topology]
    node_local("topology.drafter_devices", true),
    node_local("topology.target_devices", true),
];

/// The row of `key`.
pub fn kind_of(key: &str) -> Option<&'static KeyKind> {
    KEYS.iter().find(|k| k.key == key)
}

/// The keys with the given resume kind, in table order.
pub fn keys_on_resume(on_resume: OnResume) -> impl Iterator<Item = &'static str> {
    KEYS.iter()
        .filter(move |k| k.on_resume == on_resume)
        .map(|k| k.key)
}

/// Whether a change of `key` on resume is refused without an unlock (fixed or unlockable).
/// A key without a row is refused: a key nobody classified is not assumed harmless.
pub fn refused_on_resume(key: &str) -> bool {
    kind_of(key).is_none_or(|k| k.on_resume != Free)
}

/// Whether `key` belongs to the healthy record's recipe.
pub fn in_recipe(key: &str) -> bool {
    kind_of(key).is_none_or(|k| k.recipe)
}

/// Whether every node of a job must agree on `key`.
pub fn in_job(key: &str) -> bool {
    kind_of(key).is_none_or(|k| k.job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_finds_its_row_and_an_unknown_key_counts_as_refused_recipe_and_job() {
        assert_eq!(kind_of("training.lr").unwrap().on_resume, Fixed);
        assert!(kind_of("training.lrx").is_none());
        assert!(kind_of("detectors").is_none(), "a section is not a key");
        assert!(refused_on_resume("training.no_such_key"));
        assert!(!refused_on_resume("training.eval_every"));
        assert!(!in_recipe("detectors.healthy.after_ok_s"));
        assert!(in_recipe("training.batch_size"));
        assert!(!in_job("run.run_dir") && !in_job("topology.drafter_devices"));
        assert!(in_job("run.name"));
        assert!(in_recipe("training.no_such_key") && in_job("training.no_such_key"));
    }

    #[test]
    fn every_row_is_declared_once() {
        let mut keys: Vec<&str> = KEYS.iter().map(|k| k.key).collect();
        keys.sort_unstable();
        let before = keys.len();
        keys.dedup();
        assert_eq!(before, keys.len(), "a key has two rows");
    }
}
