//! The daemon's locked-key gate and the engine's checkpoint check give the same verdict on a
//! resume with one changed key, for every key of the config's key table
//! (`dflash_shared::config::keys`): both refuse it, or both let it through; with an operator's
//! unlock, both carry an unlockable key across. Each key is changed from the embedded default
//! (and, for the tree objective's keys, from the default with `training.objective = "tree"`;
//! for the DSpark head's, from the default with `drafter.head = "dspark"`).
use dflash_engine::model::target::TargetConfig;
use dflash_engine::train::resume::{config_verdict, SavedConfigs};
use dflash_engine::train::run_config::{drafter_config, train_config};
use dflash_engine::train::unlocked::UnlockedKeys;
use dflash_shared::config::keys::{OnResume, KEYS};
use dflash_shared::config::{locked_key_changes, unlock_refusal, Config, DrafterHead};

/// Keys no valid config can change from the default, and why.
const NO_VALID_CHANGE: &[(&str, &str)] = &[
    ("training.precision", "BF16 is the only training precision"),
    (
        "training.early_stopping",
        "6 full epochs: early stopping is refused",
    ),
    (
        "drafter.num_layers",
        "drafter.layer_types lists one type per layer, so it changes with it",
    ),
    (
        "drafter.head",
        "the Domino widths are set with the Domino head and refused without it",
    ),
];

/// Keys the gate refuses that the engine's check does not see, and why that is right.
const GATE_ONLY: &[(&str, &str)] = &[(
    "drafter.init_from",
    "a resume never reads it: the checkpoint carries the weights on",
)];

/// A changed value for keys the generic change below cannot give a valid one (unset options,
/// enums, values with constraints).
fn hand_change(key: &str) -> Option<toml::Value> {
    let s = |v: &str| toml::Value::String(v.into());
    let i = toml::Value::Integer;
    Some(match key {
        "run.name" => s("another-run"),
        "run.run_dir" => s("/tmp/dflash-elsewhere"),
        "target.model" => s("/models/elsewhere"),
        "target.dtype" => s("bf16"),
        "drafter.layer_types" => toml::Value::Array(vec![s("full_attention"), s("full_attention")]),
        "drafter.head" => s("dflash"),
        "drafter.shift_label" => toml::Value::Boolean(false),
        "drafter.init_from" => s("/drafters/elsewhere"),
        "drafter.num_attention_heads" => i(8),
        "drafter.num_key_value_heads" => i(4),
        "drafter.block_size" => i(16),
        "drafter.mask_token_id" => i(510),
        "drafter.head_dim" => i(64),
        "training.weight_decay" => toml::Value::Float(0.01),
        "detectors.serve_gap.gap_fraction" => toml::Value::Float(0.5),
        "detectors.throughput.crit_clear_above" => toml::Value::Float(0.6),
        "detectors.throughput.pinned_baseline_tokens_per_s" => toml::Value::Float(1000.0),
        "detectors.throughput.warn_below" => toml::Value::Float(0.7),
        "detectors.throughput.warn_clear_above" => toml::Value::Float(0.95),
        "queue.byte_cap" => s("2 GiB"),
        "drafter.target_layer_ids" => toml::Value::Array(vec![i(0), i(3)]),
        "training.objective" => s("dpace"),
        "training.dpace_normalization" => s("weight_sum"),
        "training.max_steps" => i(10),
        "training.tree.budget" => i(8),
        "training.tree.temperature" => toml::Value::Float(2.0),
        "training.tree.loss" => s("expected"),
        "training.serve_tree_budget" => i(8),
        "training.online_eval_tree_budgets" => toml::Value::Array(vec![i(32)]),
        "training.online_eval_prompts" => s("/data/prompts.jsonl"),
        "training.label_mask" => s("cumulative"),
        "training.attention" => s("dense_mask"),
        "training.batch_size" => i(4),
        "training.grad_accum" => i(2),
        "data.train_file" => s("/data/train.jsonl"),
        "data.format" => s("chat"),
        "data.tokenizer" => s("/models/tokenizer.json"),
        "data.chat_template" => s("/models/template.jinja"),
        "data.max_line_bytes" => s("32 MiB"),
        "topology.target_devices" => toml::Value::Array(vec![s("cpu"), s("cpu")]),
        "topology.drafter_devices" => toml::Value::Array(vec![s("cpu"), s("cpu")]),
        "telemetry.caches" => toml::Value::Array(vec![]),
        "telemetry.python" => s("/usr/bin/python3"),
        "control.socket" => s("/run/dflash/d.sock"),
        "control.poweroff_command" => toml::Value::Array(vec![s("true")]),
        "control.allowed_uids" => toml::Value::Array(vec![i(1000)]),
        "metrics.listen" => s("127.0.0.1:9400"),
        "tensorboard.dir" => s("tb"),
        "drafter.markov_rank" => i(32),
        "drafter.markov_head_type" => s("gated"),
        "drafter.enable_confidence_head" => toml::Value::Boolean(false),
        "drafter.confidence_head_with_markov" => toml::Value::Boolean(false),
        "training.dspark.ce" => toml::Value::Float(0.2),
        "training.dspark.l1" => toml::Value::Float(0.5),
        "training.dspark.confidence" => toml::Value::Float(0.5),
        "drafter.conv_kernel_size" => i(3),
        "drafter.conv_group_size" => i(32),
        "drafter.selector_rank" => i(32),
        "drafter.selector_top_k" => i(8),
        "drafter.output_multiplier" => toml::Value::Float(0.5),
        "drafter.final_logit_softcapping" => toml::Value::Float(20.0),
        "training.dflash2.selector_loss_alpha" => toml::Value::Float(0.5),
        "training.dflash2.selector_warmup_ratio" => toml::Value::Float(0.1),
        "training.dflash2.selector_ramp_ratio" => toml::Value::Float(0.2),
        "training.dflash2.selector_stop_gradient" => toml::Value::Boolean(true),
        _ => return None,
    })
}

/// The generic change: a number moves, a flag flips.
fn generic_change(value: Option<&toml::Value>) -> Option<toml::Value> {
    match value? {
        toml::Value::Integer(n) => Some(toml::Value::Integer(n + 1)),
        toml::Value::Float(x) => Some(toml::Value::Float(x * 0.5)),
        toml::Value::Boolean(b) => Some(toml::Value::Boolean(!b)),
        _ => None,
    }
}

fn get<'a>(root: &'a toml::Value, key: &str) -> Option<&'a toml::Value> {
    key.split('.').try_fold(root, |v, k| v.get(k))
}

fn set(root: &mut toml::Value, key: &str, value: toml::Value) {
    let parts: Vec<&str> = key.split('.').collect();
    let (last, parents) = parts.split_last().unwrap();
    let mut at = root;
    for p in parents {
        at = at
            .as_table_mut()
            .unwrap()
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
    }
    at.as_table_mut().unwrap().insert(last.to_string(), value);
}

/// `base` with `key` changed to a value that still validates, or `None`.
fn changed(base: &Config, key: &str) -> Option<Config> {
    let root: toml::Value = toml::from_str(&base.to_toml_string()).unwrap();
    let candidates = [hand_change(key), generic_change(get(&root, key))];
    candidates.into_iter().flatten().find_map(|value| {
        let mut edited = root.clone();
        set(&mut edited, key, value);
        let text = toml::to_string(&edited).unwrap();
        Config::from_toml_str(&text, key).ok().filter(|c| c != base)
    })
}

fn engine_configs(cfg: &Config) -> (dflash_engine::train::config::TrainConfig, serde_json::Value) {
    let target = TargetConfig::tiny_default();
    (
        train_config(cfg, 900),
        drafter_config(&cfg.drafter, &target).to_hf_json(),
    )
}

struct Verdicts {
    gate_refuses: bool,
    engine_refuses: bool,
    engine_sees: bool,
    gate_unlocked_accepts: bool,
    engine_unlocked_accepts: bool,
}

fn verdicts(old: &Config, new: &Config, key: &str) -> Verdicts {
    let ((old_train, old_hf), (new_train, new_hf)) = (engine_configs(old), engine_configs(new));
    let saved = SavedConfigs {
        train: &old_train,
        drafter_hf: &old_hf,
    };
    let now = SavedConfigs {
        train: &new_train,
        drafter_hf: &new_hf,
    };
    let changes = locked_key_changes(old, new);
    let unlocked = UnlockedKeys::from_keys(&[key]);
    Verdicts {
        gate_refuses: !changes.is_empty(),
        engine_refuses: config_verdict(&saved, &now, &UnlockedKeys::default()).is_err(),
        engine_sees: old_train != new_train || old_hf != new_hf,
        gate_unlocked_accepts: changes
            .iter()
            .all(|c| c.key == key && unlock_refusal(old, new, &c.key).is_none()),
        engine_unlocked_accepts: config_verdict(&saved, &now, &unlocked).is_ok(),
    }
}

/// The DSpark head's keys, which only a DSpark drafter may set.
fn is_dspark_key(key: &str) -> bool {
    key.starts_with("training.dspark.")
        || [
            "drafter.markov_rank",
            "drafter.markov_head_type",
            "drafter.enable_confidence_head",
            "drafter.confidence_head_with_markov",
        ]
        .contains(&key)
}

/// The DFlash2 head's keys, which only a DFlash2 drafter may set.
fn is_dflash2_key(key: &str) -> bool {
    key.starts_with("training.dflash2.")
        || [
            "drafter.conv_kernel_size",
            "drafter.conv_group_size",
            "drafter.selector_rank",
            "drafter.selector_top_k",
            "drafter.output_multiplier",
            "drafter.final_logit_softcapping",
        ]
        .contains(&key)
}

/// The embedded default with `head` instead of Domino (its own keys left to their defaults).
fn head_default(head: DrafterHead) -> Config {
    let mut cfg = Config::embedded_default();
    cfg.drafter.head = head;
    cfg.drafter.emb_dim = None;
    cfg.drafter.gru_hidden_dim = None;
    cfg.drafter.pure_draft_prefix_len = None;
    let text = cfg.to_toml_string();
    Config::from_toml_str(&text, head.as_str()).unwrap()
}

#[test]
fn the_gate_and_the_engine_agree_on_every_key_of_the_table() {
    let default = Config::embedded_default();
    let mut tree = default.clone();
    tree.training.objective = dflash_shared::config::Objective::Tree;
    let dspark = head_default(DrafterHead::Dspark);
    let dflash2 = head_default(DrafterHead::Dflash2);
    let mut disagreements = Vec::new();
    let mut checked = 0;
    for row in KEYS {
        let base =
            if row.key.starts_with("training.tree.") || row.key == "training.serve_tree_budget" {
                &tree
            } else if is_dspark_key(row.key) {
                &dspark
            } else if is_dflash2_key(row.key) {
                &dflash2
            } else {
                &default
            };
        let Some(new) = changed(base, row.key) else {
            if !NO_VALID_CHANGE.iter().any(|(k, _)| *k == row.key) {
                disagreements.push(format!(
                    "{}: no valid change found; give one in hand_change",
                    row.key
                ));
            }
            continue;
        };
        checked += 1;
        let v = verdicts(base, &new, row.key);
        let gate_only = GATE_ONLY.iter().any(|(k, _)| *k == row.key);
        let agree = if v.engine_sees {
            v.gate_refuses == v.engine_refuses
        } else {
            !v.engine_refuses && (v.gate_refuses == gate_only)
        };
        if !agree {
            disagreements.push(format!(
                "{} ({:?}): gate {}, engine {}{}",
                row.key,
                row.on_resume,
                if v.gate_refuses { "refuses" } else { "accepts" },
                if v.engine_refuses {
                    "refuses"
                } else {
                    "accepts"
                },
                if v.engine_sees {
                    ""
                } else {
                    " (the engine does not see it)"
                }
            ));
        }
        if row.on_resume == OnResume::Unlockable
            && !(v.gate_unlocked_accepts && v.engine_unlocked_accepts)
        {
            disagreements.push(format!(
                "{} unlocked: gate {}, engine {}",
                row.key,
                if v.gate_unlocked_accepts {
                    "accepts"
                } else {
                    "refuses"
                },
                if v.engine_unlocked_accepts {
                    "accepts"
                } else {
                    "refuses"
                },
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    assert!(checked > 100, "{checked} keys checked");
}

#[test]
fn with_the_tree_objective_a_serving_budget_change_is_refused_by_both_and_free_otherwise() {
    let default = Config::embedded_default();
    let mut tree = default.clone();
    tree.training.objective = dflash_shared::config::Objective::Tree;
    let key = "training.serve_tree_budget";
    let v = verdicts(&tree, &changed(&tree, key).unwrap(), key);
    assert!(v.gate_refuses && v.engine_refuses);
    let v = verdicts(&default, &changed(&default, key).unwrap(), key);
    assert!(!v.gate_refuses && !v.engine_refuses);
}
