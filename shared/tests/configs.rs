//! The shipped configs validate, and a corpus of broken configs fails with exact messages.
//!
//! Each file in `configs/invalid/` starts with `# expect: ` lines holding the exact error text.
use std::fs;
use std::path::{Path, PathBuf};

use dflash_shared::config::{
    locked_key_changes, unlock_refusal, Config, DataFormat, Device, DpaceNormalization,
    DrafterHead, LayerType, Objective, Precision, EMBEDDED_DEFAULT_TOML,
};
use dflash_shared::job;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn load(path: &Path) -> Result<Config, String> {
    let text = fs::read_to_string(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy();
    Config::from_toml_str(&text, &name).map_err(|e| e.to_string())
}

fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_config_validates_and_prints_back_to_itself() {
    let files = toml_files(&repo_root().join("configs"));
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "qwen3-8b-8gpu.toml",
            "qwen3.6-27b-8gpu.toml",
            "tiny-cpu-dflash.toml",
            "tiny-cpu-dflash2.toml",
            "tiny-cpu-dspark.toml",
            "tiny-cpu.toml"
        ]
    );
    for file in files
        .iter()
        .chain(toml_files(&repo_root().join("shared/tests/configs/valid")).iter())
    {
        let config = load(file).unwrap_or_else(|e| panic!("{e}"));
        let printed = config.to_toml_string();
        let reparsed =
            Config::from_toml_str(&printed, "printed").unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(reparsed, config, "{}", file.display());
        assert!(
            config.warnings().is_empty(),
            "{}: {:?}",
            file.display(),
            config.warnings()
        );
    }
}

#[test]
fn the_embedded_default_is_the_tiny_cpu_config() {
    let shipped = load(&repo_root().join("configs/tiny-cpu.toml")).unwrap();
    assert_eq!(Config::embedded_default(), shipped);
    assert_eq!(
        EMBEDDED_DEFAULT_TOML,
        fs::read_to_string(repo_root().join("configs/tiny-cpu.toml")).unwrap()
    );
    assert!(shipped.target.is_embedded());
    assert_eq!(shipped.topology.target_devices, [Device::Cpu]);
    assert_eq!(shipped.topology.drafter_devices, [Device::Cpu]);
    assert_eq!(shipped.data.format, DataFormat::Pretokenized);
    assert_eq!(shipped.loss_decay_gamma(), 4.0, "paper γ for block 8");
    let t = &shipped.training;
    assert_eq!(
        t.online_eval_interval(),
        50,
        "online τ at the offline cadence"
    );
    assert_eq!(t.online_eval_prompts.as_deref(), Some("embedded"));
    assert_eq!(t.online_eval_tree_budgets, [8, 32]);
    // Domino won the objective tournament on this default (docs/BENCHMARKS.md): its head,
    // with the widths the tournament measured, trained with DFlash's loss.
    let d = &shipped.drafter;
    assert_eq!(d.head, DrafterHead::Domino);
    assert_eq!(
        (
            d.emb_dim,
            d.gru_hidden_dim,
            d.pure_draft_prefix_len,
            d.shift_label
        ),
        (Some(64), Some(128), Some(1), None)
    );
    assert_eq!(t.objective, Objective::Dflash);
}

/// The embedded default before its head became Domino, shipped for the run dirs started under
/// it: the same run with DFlash's head. Such a run keeps its head through the lock: resumed
/// under the new default it is refused with no unlock that could carry it, resumed with this
/// file it is unchanged.
#[test]
fn a_run_started_under_the_dflash_default_keeps_its_head_through_the_lock() {
    let old = load(&repo_root().join("configs/tiny-cpu-dflash.toml")).unwrap();
    let new = Config::embedded_default();
    assert_eq!(old.drafter.head, DrafterHead::Dflash);
    let mut same_but_head = old.clone();
    same_but_head.drafter.head = new.drafter.head;
    same_but_head.drafter.emb_dim = new.drafter.emb_dim;
    same_but_head.drafter.gru_hidden_dim = new.drafter.gru_hidden_dim;
    same_but_head.drafter.pure_draft_prefix_len = new.drafter.pure_draft_prefix_len;
    assert_eq!(
        same_but_head, new,
        "tiny-cpu-dflash.toml differs from the embedded default in more than the head"
    );
    let changes: Vec<String> = locked_key_changes(&old, &new)
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        changes,
        [
            "drafter.head is locked: \"dflash\" → \"domino\"",
            "drafter.emb_dim is locked: (unset) → 64",
            "drafter.gru_hidden_dim is locked: (unset) → 128",
            "drafter.pure_draft_prefix_len is locked: (unset) → 1",
        ]
    );
    let why = unlock_refusal(&old, &new, "drafter.head").expect("no unlock carries a head");
    assert!(why.contains("Keep drafter.head = \"dflash\""), "{why}");
    assert!(locked_key_changes(&old, &old.clone()).is_empty());
}

#[test]
fn online_evaluation_defaults_on_where_there_are_prompts_and_off_where_there_are_none() {
    let minimal = load(&repo_root().join("shared/tests/configs/valid/minimal.toml")).unwrap();
    let t = &minimal.training;
    assert_eq!(
        (t.online_eval_every, t.online_eval_prompts.as_deref()),
        (None, None)
    );
    assert_eq!(
        t.online_eval_interval(),
        0,
        "a Hugging Face target has no built-in prompts"
    );
    assert!(!minimal.to_toml_string().contains("online_eval_every"));

    let text = fs::read_to_string(repo_root().join("shared/tests/configs/valid/minimal.toml"))
        .unwrap()
        .replace(
            "[data]",
            "[training]\nonline_eval_prompts = \"prompts.jsonl\"\n\n[data]",
        );
    let with_prompts = Config::from_toml_str(&text, "with prompts").unwrap();
    assert_eq!(with_prompts.training.online_eval_interval(), 1000);
    assert_eq!(
        with_prompts.training.online_eval_tree_budgets,
        [8, 16, 32, 64]
    );
    assert_eq!(with_prompts.training.serve_tree_budget, 32);

    let embedded = EMBEDDED_DEFAULT_TOML
        .lines()
        .filter(|l| !l.starts_with("online_eval_"))
        .collect::<Vec<_>>()
        .join("\n");
    let embedded = Config::from_toml_str(&embedded, "embedded without online keys").unwrap();
    assert_eq!(
        embedded.training.online_eval_prompts.as_deref(),
        Some("embedded")
    );
    assert_eq!(embedded.training.online_eval_interval(), 1000);
    let printed = embedded.to_toml_string();
    assert!(printed.contains("online_eval_every = 1000"), "{printed}");
    let mut off = embedded.clone();
    off.training.online_eval_every = Some(0);
    assert_eq!(off.training.online_eval_interval(), 0);
    off.validate().unwrap();
}

#[test]
fn the_27b_config_is_the_one_the_issue_describes() {
    let c = load(&repo_root().join("configs/qwen3.6-27b-8gpu.toml")).unwrap();
    let cuda = |r: std::ops::Range<u32>| r.map(Device::Cuda).collect::<Vec<_>>();
    assert_eq!(c.topology.target_devices, cuda(0..5));
    assert_eq!(c.topology.drafter_devices, cuda(5..8));
    assert_eq!(c.drafter.target_layer_ids, [1, 16, 31, 46, 61]);
    assert_eq!((c.training.num_anchors, c.drafter.block_size), (1024, 32));
    assert_eq!(c.training.precision, Precision::Bf16);
    assert_eq!((c.training.epochs, c.training.early_stopping), (6, false));
    // Its drafter fits a 96 GiB card only when it recomputes its layers (`dflashd plan`).
    assert!(c.training.activation_checkpointing);
    assert!(!Config::embedded_default().training.activation_checkpointing);
    assert_eq!(
        (
            c.training.lr,
            c.training.warmup_ratio,
            c.training.grad_clip,
            c.training.weight_decay
        ),
        (6e-4, 0.04, 1.0, 0.0)
    );
    assert_eq!(
        (
            c.drafter.hidden_size,
            c.drafter.num_layers,
            c.drafter.mask_token_id
        ),
        (5120, 5, 248_070)
    );
    assert_eq!(
        c.drafter
            .layer_types
            .iter()
            .filter(|t| **t == LayerType::SlidingAttention)
            .count(),
        4
    );
    // SpecForge's configs/qwen3.6-27b-domino-full-attention.json dflash_config.
    let d = &c.drafter;
    assert_eq!(d.head, DrafterHead::Domino);
    assert_eq!(
        (
            d.emb_dim,
            d.gru_hidden_dim,
            d.pure_draft_prefix_len,
            d.shift_label
        ),
        (Some(256), Some(1024), Some(1), Some(false))
    );
}

#[test]
fn the_8b_config_follows_spec_section_1_2() {
    let c = load(&repo_root().join("configs/qwen3-8b-8gpu.toml")).unwrap();
    let d = &c.drafter;
    assert_eq!(
        (d.num_layers, d.hidden_size, d.intermediate_size),
        (5, 4096, 12288)
    );
    assert_eq!(
        (d.num_attention_heads, d.num_key_value_heads, d.head_dim),
        (32, 8, 128)
    );
    assert_eq!(
        (d.block_size, d.mask_token_id, d.rope_theta),
        (16, 151_669, 1e6)
    );
    assert_eq!(d.target_layer_ids, [1, 9, 17, 25, 33]);
    assert!(d.layer_types.iter().all(|t| *t == LayerType::FullAttention));
    assert_eq!(
        c.topology.target_devices.len() + c.topology.drafter_devices.len(),
        8
    );
    assert_eq!(c.loss_decay_gamma(), 7.0);
    assert_eq!(
        (d.head, d.emb_dim, d.gru_hidden_dim, d.pure_draft_prefix_len),
        (DrafterHead::Domino, Some(256), Some(1024), Some(1))
    );
}

#[test]
fn defaults_fill_a_minimal_config() {
    let c = load(&repo_root().join("shared/tests/configs/valid/minimal.toml")).unwrap();
    assert_eq!(c.training.epochs, 6);
    assert_eq!(c.training.num_anchors, 512);
    assert_eq!(c.training.loss_decay_gamma, Some(7.0));
    assert_eq!(c.drafter.layer_types, [LayerType::FullAttention]);
    assert!(
        c.control.poweroff_command.is_none(),
        "power-off is disabled by default"
    );
    let names: Vec<_> = c.telemetry.caches.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "torchinductor",
            "triton",
            "cuda_compute_cache",
            "dflash_warmup"
        ]
    );
    let shown = c.to_toml_string();
    for key in [
        "epochs = 6",
        "num_anchors = 512",
        "pending_action_expiry_s = 300",
        "[detectors.throughput]",
        "[tensorboard]",
    ] {
        assert!(shown.contains(key), "config show lacks {key}:\n{shown}");
    }
}

#[test]
fn the_straggler_keys_default_to_a_fifth_for_five_steps_and_refuse_out_of_range_values() {
    let minimal =
        fs::read_to_string(repo_root().join("shared/tests/configs/valid/minimal.toml")).unwrap();
    let with = |section: &str| Config::from_toml_str(&format!("{minimal}\n{section}"), "t.toml");
    // Defaults: today's constants, so a config without the section judges as before.
    let c = with("").unwrap();
    assert_eq!(c.detectors.straggler.behind_frac, 0.2);
    assert_eq!(
        c.detectors.straggler.behind_frac,
        job::STRAGGLER_BEHIND_FRAC
    );
    assert_eq!(c.detectors.straggler.steps, 5);
    assert!(c.to_toml_string().contains("[detectors.straggler]"));
    // Valid values are taken, the bounds included.
    for (frac, steps) in [(0.05, 1), (0.5, 20), (10.0, 10_000)] {
        let c = with(&format!(
            "[detectors.straggler]\nbehind_frac = {frac:?}\nsteps = {steps}\n"
        ))
        .unwrap_or_else(|e| panic!("{frac} / {steps}: {e}"));
        assert_eq!(
            (
                c.detectors.straggler.behind_frac,
                c.detectors.straggler.steps
            ),
            (frac, steps)
        );
    }
    // Out of range: refused, naming the key and what to set.
    for (line, key, expected) in [
        ("behind_frac = 0.0", "behind_frac", "in (0, 10]"),
        ("behind_frac = -0.2", "behind_frac", "in (0, 10]"),
        ("behind_frac = 10.5", "behind_frac", "in (0, 10]"),
        ("behind_frac = nan", "behind_frac", "in (0, 10]"),
        ("steps = 0", "steps", "from 1 to 10000"),
        ("steps = 10001", "steps", "from 1 to 10000"),
    ] {
        let e = with(&format!("[detectors.straggler]\n{line}\n"))
            .expect_err(line)
            .to_string();
        assert!(
            e.contains(&format!("detectors.straggler.{key} (line ")) && e.contains(expected),
            "{line}: {e}"
        );
    }
    // A key the section does not have is refused too.
    assert!(with("[detectors.straggler]\nfire_after = 3\n").is_err());
}

#[test]
fn the_heartbeat_timeout_defaults_to_10_s_and_refuses_values_outside_1_to_3600_s() {
    let minimal =
        fs::read_to_string(repo_root().join("shared/tests/configs/valid/minimal.toml")).unwrap();
    let with = |section: &str| Config::from_toml_str(&format!("{minimal}\n{section}"), "t.toml");
    let c = with("").unwrap();
    assert_eq!(c.nodes.heartbeat_timeout_s, 10.0);
    assert!(c
        .to_toml_string()
        .contains("[nodes]\nheartbeat_timeout_s = 10.0"));
    for t in [1.0, 2.5, 3600.0] {
        let c = with(&format!("[nodes]\nheartbeat_timeout_s = {t:?}\n")).unwrap();
        assert_eq!(c.nodes.heartbeat_timeout_s, t);
    }
    for bad in ["0.5", "0.0", "-3.0", "3601.0", "nan", "inf"] {
        let e = with(&format!("[nodes]\nheartbeat_timeout_s = {bad}\n"))
            .expect_err(bad)
            .to_string();
        assert!(
            e.contains("nodes.heartbeat_timeout_s (line ")
                && e.contains("a number of seconds from 1 to 3600")
                && e.contains("within this and a fifth of it"),
            "{bad}: {e}"
        );
    }
    assert!(with("[nodes]\nheartbeat_s = 3.0\n").is_err());
}

#[test]
fn invalid_configs_fail_with_the_expected_message() {
    let files = toml_files(&repo_root().join("shared/tests/configs/invalid"));
    assert!(files.len() >= 15);
    let mut mismatches = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let expected: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .collect();
        assert!(
            !expected.is_empty(),
            "{} has no '# expect:' line",
            file.display()
        );
        match load(&file) {
            Ok(_) => mismatches.push(format!("{}: parsed, but should fail", file.display())),
            Err(message) if message != expected.join("\n") => mismatches.push(format!(
                "{}:\n  expected: {}\n  actual:   {message}",
                file.display(),
                expected.join("\n")
            )),
            Err(_) => {}
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn locked_keys_changes_are_listed_on_resume() {
    let old = Config::embedded_default();
    // (the head's keys are covered by the test above and the unit tests in locked.rs)
    assert!(locked_key_changes(&old, &old.clone()).is_empty());
    let mut new = old.clone();
    new.training.epochs = 3;
    new.training.num_anchors = 1024;
    new.drafter.target_layer_ids = vec![1, 2];
    new.training.lr = 1e-3; // locked too: the optimiser is part of what is learned
    new.training.eval_every = 7; // free: a cadence
    let changes: Vec<String> = locked_key_changes(&old, &new)
        .iter()
        .map(|c| c.to_string())
        .collect();
    // In the key table's order (`shared/src/config/keys.rs`).
    assert_eq!(
        changes,
        [
            "drafter.target_layer_ids is locked: [1, 3] → [1, 2]",
            "training.epochs is locked: 6 → 3",
            "training.num_anchors is locked: 16 → 1024",
            "training.lr is locked: 0.002 → 0.001",
        ]
    );
}

#[test]
fn warnings_say_when_the_recipe_is_left() {
    let mut c = Config::embedded_default();
    c.training.epochs = 2;
    c.topology.target_devices = vec![Device::Cuda(0)];
    c.topology.drafter_devices = vec![Device::Cuda(0)];
    assert_eq!(
        c.warnings(),
        [
            "training.epochs = 2: the DFlash recipe trains 6 full epochs",
            "cuda:0 is in both topology.target_devices and topology.drafter_devices: two workers share its memory",
        ]
    );
    c.validate().unwrap();
}

#[test]
fn the_dpace_normalization_parses_defaults_to_the_sequences_and_is_locked_on_resume() {
    let minimal =
        fs::read_to_string(repo_root().join("shared/tests/configs/valid/minimal.toml")).unwrap();
    let c = Config::from_toml_str(&minimal, "minimal.toml").unwrap();
    // The default is the division every run before the key trained with.
    assert_eq!(
        c.training.dpace_normalization,
        DpaceNormalization::Sequences
    );
    assert!(
        !c.to_toml_string().contains("dpace_normalization"),
        "the default is left out, so older configs record as they did"
    );
    let with = |value: &str, objective: &str| {
        let text = minimal.replace(
            "[data]",
            &format!(
                "[training]\nobjective = \"{objective}\"\ndpace_normalization = \"{value}\"\n\n[data]"
            ),
        );
        Config::from_toml_str(&text, "run.toml")
    };
    for n in DpaceNormalization::ALL {
        let parsed = with(n.as_str(), "dpace").unwrap();
        assert_eq!(parsed.training.dpace_normalization, n);
        assert_eq!(DpaceNormalization::from_name(n.as_str()), Some(n));
        let shown = parsed.to_toml_string();
        assert_eq!(
            Config::from_toml_str(&shown, "shown.toml").unwrap(),
            parsed,
            "{shown}"
        );
    }
    // As `dpace_alpha`: read only with D-PACE, accepted (and locked) with another objective.
    let dflash = with("weight_sum", "dflash").unwrap();
    assert_eq!(
        dflash.training.dpace_normalization,
        DpaceNormalization::WeightSum
    );
    let err = with("per_token", "dpace").unwrap_err().to_string();
    assert_eq!(
        err,
        "run.toml: training.dpace_normalization (line 21): expected one of \"sequences\", \
         \"weight_sum\", \"anchors_per_sequence\" or \"tokens_per_sequence\", found \"per_token\""
    );
    let old = with("sequences", "dpace").unwrap();
    let new = with("tokens_per_sequence", "dpace").unwrap();
    let changes: Vec<String> = locked_key_changes(&old, &new)
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        changes,
        ["training.dpace_normalization is locked: \"sequences\" → \"tokens_per_sequence\""]
    );
    let why = unlock_refusal(&old, &new, "training.dpace_normalization").unwrap();
    assert!(
        why.contains("Keep training.dpace_normalization = \"sequences\"")
            && why.contains("new run"),
        "{why}"
    );
    // A config that leaves the key out is the default's run: nothing to refuse.
    assert!(
        locked_key_changes(&c, &with("sequences", "dflash").unwrap())
            .iter()
            .all(|c| c.key != "training.dpace_normalization")
    );
}

#[test]
fn early_stopping_is_refused_and_false_is_accepted_for_old_configs() {
    // The standing rule is 6 full epochs with no early stopping: a `true` that did nothing
    // was warned about and trained on; it is refused, saying what to do.
    let mut c = Config::embedded_default();
    assert!(!c.training.early_stopping);
    c.validate().unwrap();
    c.training.early_stopping = true;
    let err = c.validate().unwrap_err().to_string();
    for needle in [
        "training.early_stopping",
        "6 full epochs and has no early stopping",
        "found true",
        "remove the key, or set it to false",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from {err}");
    }
    let old = EMBEDDED_DEFAULT_TOML.replace("early_stopping = false", "early_stopping = true");
    assert!(Config::from_toml_str(&old, "old.toml").is_err());
    assert!(!c.warnings().iter().any(|w| w.contains("early_stopping")));
}

#[test]
fn batch_size_and_held_out_are_judged_against_the_dataset_naming_the_toml_key() {
    // Issue 15, defect 4: `batch_size = 100000` trained at 6 steps in all, and
    // `held_out_samples = 5000` was reported as "`held_out` is 5000".
    let mut c = Config::embedded_default();
    c.data.held_out_samples = None;
    c.data.held_out_fraction = 0.01;
    c.training.batch_size = 100_000;
    let err = c.check_against_dataset(1000).unwrap_err().to_string();
    assert!(err.contains("training.batch_size"), "{err}");
    assert!(err.contains("at most the 990 training samples"), "{err}");
    c.training.batch_size = 8;
    c.data.held_out_samples = Some(5000);
    let err = c.check_against_dataset(1000).unwrap_err().to_string();
    assert!(
        err.contains("data.held_out_samples") && err.contains("5000 held out"),
        "{err}"
    );
    c.data.held_out_samples = None;
    c.data.held_out_fraction = 1.0;
    let err = c.check_against_dataset(1000).unwrap_err().to_string();
    assert!(err.contains("data.held_out_fraction"), "{err}");
    c.data.held_out_fraction = 0.01;
    c.check_against_dataset(1000).unwrap();
}

#[test]
fn config_validate_names_a_missing_online_prompt_file_with_its_line() {
    let text = fs::read_to_string(repo_root().join("shared/tests/configs/valid/minimal.toml"))
        .unwrap()
        .replace(
            "[data]",
            "[training]\nonline_eval_prompts = \"prompts.jsonl\"\n\n[data]",
        );
    let config = Config::from_toml_str(&text, "run.toml").unwrap();
    let facts = dflash_shared::config::ConfigFacts {
        missing_online_prompts: Some("/etc/dflash/prompts.jsonl".into()),
        ..Default::default()
    };
    let err = config
        .check_facts(&facts, &text, "run.toml")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "run.toml: training.online_eval_prompts (line 20): expected an existing JSONL prompt \
         file, found /etc/dflash/prompts.jsonl (no such file); fix the path, or set \
         training.online_eval_every = 0"
    );
}

#[test]
fn the_embedded_prompts_are_refused_for_another_target_where_the_target_is_judged() {
    // A copy of the embedded default pointed at a Hugging Face model still parses (it is
    // refused for its model first, if that is what is wrong), and then for its prompts.
    let text = EMBEDDED_DEFAULT_TOML.replace("model = \"embedded\"", "model = \"/models/q\"");
    let config = Config::from_toml_str(&text, "copy.toml").unwrap();
    let err = config
        .check_facts(&Default::default(), &text, "copy.toml")
        .unwrap_err()
        .to_string();
    let line = text
        .lines()
        .position(|l| l.starts_with("online_eval_prompts"))
        .unwrap()
        + 1;
    assert_eq!(
        err,
        format!(
            "copy.toml: training.online_eval_prompts (line {line}): expected a JSONL prompt file \
             for this target, found \"embedded\"; the embedded prompts are token ids of the \
             embedded target's vocabulary; name a JSONL file of prompts (`input_ids` or chat \
             `conversations`) for target.model, or set training.online_eval_every = 0"
        )
    );
    assert!(config.check_online_prompts().is_err());
    let mut off = config.clone();
    off.training.online_eval_every = Some(0);
    assert!(off.check_online_prompts().is_ok());
    assert!(Config::embedded_default().check_online_prompts().is_ok());
}
