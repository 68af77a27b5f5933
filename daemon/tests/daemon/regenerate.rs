//! `dflashd regenerate`, the real binary, on the fixture chat data (`tests/fixtures/data/`)
//! and a small Hugging Face target directory with the fixture tokenizer and template.
//!
//! The target is the embedded default's (Qwen3.5 hybrid, 6 layers, vocabulary 512) written in
//! the HF layout: the fixture targets in `tests/fixtures/target/` have a vocabulary of 160,
//! smaller than the fixture tokenizer's 473 ids, so they cannot take a rendered chat prompt;
//! this one can, and the embedded default's drafter fits it for the training check.
use std::path::{Path, PathBuf};

use dflash_engine::data::{load_chat_template, load_tokenizer, parse_chat_line, RenderArgs};
use dflash_engine::decode::{generate_target_only, Sampling, Settings};
use dflash_engine::embedded::tiny_target_config;
use dflash_engine::model::target::TargetModel;
use dflash_engine::regenerate::rows::split_reasoning;

/// Any fixed seed: the test needs a target of the tiny shape, not a trained one.
const TARGET_SEED: i64 = 20_260_601;
use dflash_shared::config::sections::DataFormat;
use serde_json::Value;
use tch::{Device, Kind};

use crate::support::binary::{run, write_config, Daemon};

const MAX_NEW: usize = 6;
/// `<|im_end|>` in the fixture tokenizer.
const IM_END: i64 = 468;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data")
}

fn chat_data() -> PathBuf {
    fixtures().join("chat.jsonl")
}

/// The target directory: weights and config, the fixture tokenizer and template, and a
/// `generation_config.json` whose stop tokens are `<|im_end|>` and a token the target's greedy
/// reply to the first prompt holds, so that replies stop before `MAX_NEW` there.
fn target_dir(root: &Path) -> (PathBuf, TargetModel) {
    let dir = root.join("target");
    let target = TargetModel::random(tiny_target_config(), Device::Cpu, Kind::Float, TARGET_SEED);
    target.save_hf(&dir).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("model").join(file), dir.join(file)).unwrap();
    }
    let first_row = std::fs::read_to_string(chat_data()).unwrap();
    let first_row: Value = serde_json::from_str(first_row.lines().next().unwrap()).unwrap();
    let prompt = prompt_ids(&dir, &prompt_text(&dir, &first_row, 1));
    let free = reference(&target, &prompt, &[]);
    let stop = free[2];
    std::fs::write(
        dir.join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{stop}, {IM_END}]}}"#),
    )
    .unwrap();
    (dir, target)
}

/// The prompt of `row`'s first `end` messages, rendered with the directory's template and its
/// generation prompt (thinking on, as training renders), built here from the template alone.
fn prompt_text(dir: &Path, row: &Value, end: usize) -> String {
    // The whole row parses (it has an assistant turn); the prompt is its first `end` messages.
    let conversation = parse_chat_line(&row.to_string(), None).unwrap();
    let prompt: Vec<minijinja::Value> = conversation
        .messages
        .try_iter()
        .unwrap()
        .take(end)
        .collect();
    let args = RenderArgs {
        tools: conversation.tools,
        add_generation_prompt: true,
        extra: [("enable_thinking".to_string(), minijinja::Value::from(true))].into(),
    };
    let template = load_chat_template(dir, None).unwrap();
    template
        .render(&minijinja::Value::from(prompt), &args)
        .unwrap()
}

fn prompt_ids(dir: &Path, text: &str) -> Vec<i64> {
    let tokenizer = load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let encoding = tokenizer.encode(text, false).unwrap();
    encoding.get_ids().iter().map(|&id| i64::from(id)).collect()
}

fn reference(target: &TargetModel, prompt: &[i64], stops: &[i64]) -> Vec<i64> {
    let settings = Settings {
        max_new_tokens: MAX_NEW,
        stop_tokens: stops.to_vec(),
        sampling: Sampling::Greedy,
        seed: 0,
    };
    generate_target_only(target, prompt, &settings)
        .unwrap()
        .output_ids
}

fn regenerate(root: &Path, target: &Path, out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "regenerate".to_string(),
        "--target".into(),
        target.display().to_string(),
        "--data".into(),
        chat_data().display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--max-new-tokens".into(),
        MAX_NEW.to_string(),
        "--threads".into(),
        "1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run(root, &args);
    (code, stderr)
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn is_assistant(m: &Value) -> bool {
    matches!(
        m["role"].as_str().or(m["from"].as_str()),
        Some("assistant" | "gpt")
    )
}

#[test]
fn regenerate_replaces_every_assistant_turn_with_the_targets_greedy_reply_and_the_output_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (dir, target) = target_dir(root);
    let out = root.join("out.jsonl");
    let (code, stderr) = regenerate(root, &dir, &out, &["--batch", "2"]);
    assert_eq!(code, 0, "{stderr}");
    // the lines training refuses are named and left out; the rest keep their input line
    for skipped in [
        ":3: not a chat row",
        ":5: message 1: role \"bot\"",
        ":8: assistant turn 1",
    ] {
        assert!(stderr.contains(skipped), "{skipped}\n{stderr}");
    }
    assert!(
        stderr.contains("7 conversations regenerated, 3 skipped"),
        "{stderr}"
    );
    let output = rows(&out);
    let sources: Vec<u64> = output
        .iter()
        .map(|r| r["source_line"].as_u64().unwrap())
        .collect();
    assert_eq!(sources, [1, 2, 4, 7, 9, 10, 11]);

    let input: Vec<Value> = std::fs::read_to_string(chat_data())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
        .collect();
    let generation: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("generation_config.json")).unwrap())
            .unwrap();
    let stops: Vec<i64> = generation["eos_token_id"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let tokenizer = load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let mut turns = 0;
    let mut stopped_early = 0;
    for row in &output {
        let source = &input[row["source_line"].as_u64().unwrap() as usize - 1];
        assert_eq!(row["id"], source["id"]);
        let messages = row["conversations"].as_array().unwrap();
        let original = source["conversations"].as_array().unwrap();
        for (i, message) in messages.iter().enumerate() {
            if !is_assistant(message) {
                assert_eq!(message, &original[i], "system/user/tool turns are verbatim");
                continue;
            }
            // each turn is the target's greedy reply to the output's own turns before it
            let text = prompt_text(&dir, row, i);
            let ids = prompt_ids(&dir, &text);
            let generated = reference(&target, &ids, &stops);
            stopped_early += usize::from(generated.len() < MAX_NEW);
            let generated: Vec<u32> = generated.iter().map(|&t| t as u32).collect();
            let expected = split_reasoning(&text, &tokenizer.decode(&generated, true).unwrap());
            let content = message.get("content").or(message.get("value")).unwrap();
            assert_eq!(content.as_str(), Some(expected.content.as_str()), "{row}");
            assert_eq!(
                message["reasoning_content"].as_str(),
                expected.reasoning.as_deref(),
                "{row}"
            );
            assert!(message.get("tool_calls").is_none());
            turns += 1;
        }
    }
    assert_eq!(turns, 8, "the multi-turn row has two assistant turns");
    assert!(stopped_early > 0, "a stop token ended some reply");
    // the tool-calling row ends at its regenerated call
    let tool_row = &output[3];
    assert_eq!(tool_row["id"], "tool-call");
    assert_eq!(tool_row["conversations"].as_array().unwrap().len(), 2);

    // the output is a chat --data file `dflashd start` trains on
    let config = root.join("train.toml");
    write_config(&config, |cfg| {
        cfg.target.model = dir.display().to_string();
        cfg.data.train_file = out.display().to_string();
        cfg.data.format = DataFormat::Chat;
        cfg.data.held_out_samples = Some(1);
        cfg.training.batch_size = 2;
        // the embedded held-out prompts are the embedded target's token ids, not this one's
        cfg.training.online_eval_every = Some(0);
    });
    let mut daemon = Daemon::spawn(
        root,
        &["--config", config.to_str().unwrap(), "--max-steps", "2"],
    );
    let status = daemon.wait_exit();
    assert!(status.success(), "{}", daemon.stderr());
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(daemon.run_dir.join("data_report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["bad_lines"], serde_json::json!([]), "{report}");
    assert!(report["samples"].as_u64().unwrap() >= 4, "{report}");
    let metrics = std::fs::read_to_string(daemon.run_dir.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"step\":2"), "{metrics}");
}

#[test]
fn sampled_output_does_not_depend_on_batch_size_or_resume_and_changed_settings_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (dir, _) = target_dir(root);
    let sampled = ["--temperature", "0.9", "--top-k", "40", "--seed", "7"];
    let with = |batch: &'static str| [&sampled[..], &["--batch", batch]].concat();

    let one = root.join("one.jsonl");
    let (code, stderr) = regenerate(root, &dir, &one, &with("1"));
    assert_eq!(code, 0, "{stderr}");
    let two = root.join("two.jsonl");
    let (code, stderr) = regenerate(root, &dir, &two, &with("2"));
    assert_eq!(code, 0, "{stderr}");
    let expected = std::fs::read(&one).unwrap();
    assert_eq!(
        std::fs::read(&two).unwrap(),
        expected,
        "--batch 1 and --batch 2"
    );
    // sampling did something: not the greedy output
    let greedy = root.join("greedy.jsonl");
    assert_eq!(regenerate(root, &dir, &greedy, &[]).0, 0);
    assert_ne!(std::fs::read(&greedy).unwrap(), expected);

    // an interrupted run: three rows and half of the fourth written
    let resumed = root.join("resumed.jsonl");
    let cut = expected
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(2)
        .unwrap()
        .0
        + 30;
    std::fs::write(&resumed, &expected[..cut]).unwrap();
    std::fs::copy(
        root.join("one.jsonl.regenerate.json"),
        root.join("resumed.jsonl.regenerate.json"),
    )
    .unwrap();
    let (code, stderr) = regenerate(root, &dir, &resumed, &with("2"));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("was cut short by an interrupted run"),
        "{stderr}"
    );
    assert!(stderr.contains("resumed after 3 rows"), "{stderr}");
    assert_eq!(
        std::fs::read(&resumed).unwrap(),
        expected,
        "resume = uninterrupted run"
    );
    // a finished output resumes to itself
    let (code, stderr) = regenerate(root, &dir, &resumed, &with("1"));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read(&resumed).unwrap(), expected);

    // another seed on resume is refused, naming the change, and nothing is touched
    let other_seed = ["--temperature", "0.9", "--top-k", "40", "--seed", "8"];
    let (code, stderr) = regenerate(root, &dir, &resumed, &other_seed);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("seed: 7 → 8") && stderr.contains("another --out"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&resumed).unwrap(), expected);
    // and so is an output without its record
    std::fs::remove_file(root.join("resumed.jsonl.regenerate.json")).unwrap();
    let (code, stderr) = regenerate(root, &dir, &resumed, &with("1"));
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot be resumed"), "{stderr}");
    assert_eq!(std::fs::read(&resumed).unwrap(), expected);
}
