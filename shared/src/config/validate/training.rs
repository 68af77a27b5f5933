//! `[training]`: the run's length and cadences, the optimizer, the objective's own knobs, and
//! the online evaluation.
use super::{in_range, positive};
use crate::config::error::ConfigIssue;
use crate::config::sections::{paper_loss_decay_gamma, EMBEDDED_PROMPTS};
use crate::config::Config;

pub(super) fn training(c: &Config, v: &mut Vec<ConfigIssue>) {
    length_and_cadence(c, v);
    optimizer(c, v);
    objective(c, v);
    tree_objective(c, v);
}

/// Epochs, steps, batch shape and the evaluation/checkpoint cadences.
fn length_and_cadence(c: &Config, v: &mut Vec<ConfigIssue>) {
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
    positive(
        v,
        "training.eval_tree_block_subsample",
        t.eval_tree_block_subsample,
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
}

/// AdamW and its schedule: the learning rate, warmup, clip and moments.
fn optimizer(c: &Config, v: &mut Vec<ConfigIssue>) {
    let t = &c.training;
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
}

/// The objective's own knobs: D-PACE's α, Domino's curriculum λ, DFlash's γ.
fn objective(c: &Config, v: &mut Vec<ConfigIssue>) {
    let t = &c.training;
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
    let dspark = &t.dspark;
    for (key, value) in [
        ("training.dspark.ce", dspark.ce),
        ("training.dspark.l1", dspark.l1),
        ("training.dspark.confidence", dspark.confidence),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            v.push(
                ConfigIssue::invalid(key, "a non-negative number", value)
                    .with_hint("SpecForge weighs DSpark's terms ce 0.1, l1 0.9, confidence 1.0"),
            );
        }
    }
    if dspark.ce + dspark.l1 == 0.0 {
        v.push(
            ConfigIssue::invalid(
                "training.dspark",
                "a positive ce or l1 (with both 0 nothing trains the drafter's logits)",
                "ce = 0, l1 = 0",
            )
            .with_hint("SpecForge weighs DSpark's terms ce 0.1, l1 0.9, confidence 1.0"),
        );
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

/// `[training.tree]`: the budget the tree objective trains for and its margin's scale. Checked
/// whatever the objective, as `dpace_alpha` is, so switching to it later cannot surprise.
fn tree_objective(c: &Config, v: &mut Vec<ConfigIssue>) {
    let tree = &c.training.tree;
    if tree.budget == Some(0) {
        v.push(
            ConfigIssue::invalid(
                "training.tree.budget",
                "a positive integer (the DDTree node budget the drafter is trained for)",
                0,
            )
            .with_hint("remove the key to train for the serving budget"),
        );
    }
    if !(tree.temperature.is_finite() && tree.temperature > 0.0) {
        v.push(
            ConfigIssue::invalid(
                "training.tree.temperature",
                "a positive number (the margin's scale in nats of path log-probability)",
                tree.temperature,
            )
            .with_hint("remove the key for 1.0"),
        );
    }
}

/// The online-evaluation keys of `[training]`. Their ranges hold even while it is off
/// (`online_eval_every = 0`), so turning it on later cannot surprise.
pub(super) fn online_eval(c: &Config, v: &mut Vec<ConfigIssue>) {
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
    serve_tree_budget(t.serve_tree_budget, budgets, v);
}

/// `training.serve_tree_budget`: a positive budget, and one the online evaluation decodes at
/// (where it decodes any tree), so the headline tree figure is measured online too.
fn serve_tree_budget(serve: usize, budgets: &[usize], v: &mut Vec<ConfigIssue>) {
    const KEY: &str = "training.serve_tree_budget";
    if serve == 0 {
        v.push(
            ConfigIssue::invalid(KEY, "a positive number of tree nodes", 0).with_hint(
                "set it to the DDTree node budget the drafter is served with (default 32)",
            ),
        );
    } else if !budgets.is_empty() && !budgets.contains(&serve) {
        let listed: Vec<String> = budgets.iter().map(usize::to_string).collect();
        v.push(
            ConfigIssue::invalid(
                KEY,
                format!(
                    "one of training.online_eval_tree_budgets ({})",
                    listed.join(", ")
                ),
                serve,
            )
            .with_hint(format!(
                "add {serve} to training.online_eval_tree_budgets, or set \
                 training.serve_tree_budget to one of its budgets"
            )),
        );
    }
}
