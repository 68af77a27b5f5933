//! Chat JSONL → samples, checked against the fixtures in `tests/fixtures/data/`:
//! renders against transformers' `apply_chat_template`, masks against SpecForge's parser
//! (both recorded in `chat.reference.jsonl` by `make_reference.py`), and decoded masks against
//! the assistant texts written out by hand.
use std::path::{Path, PathBuf};

use dflash_engine::data::{
    load, ChatEncoder, ChatOptions, DataError, DataFormat, LoadOptions, Sample, SpanRule,
};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data")
}

fn encoder(rule: SpanRule) -> ChatEncoder {
    let options = ChatOptions {
        span_rule: rule,
        ..ChatOptions::default()
    };
    ChatEncoder::from_model_dir(&fixtures().join("model"), None, options).unwrap()
}

fn options(max_length: usize) -> LoadOptions {
    LoadOptions {
        max_length,
        vocab_size: None,
        threads: 2,
        max_line_bytes: 1 << 20,
    }
}

/// The decoded text of each maximal run of supervised tokens.
fn supervised_runs(encoder: &ChatEncoder, sample: &Sample) -> Vec<String> {
    let mut runs: Vec<Vec<u32>> = Vec::new();
    let mut previous = 0;
    for (&id, &m) in sample.input_ids.iter().zip(&sample.loss_mask) {
        if m == 1 {
            if previous == 0 {
                runs.push(Vec::new());
            }
            runs.last_mut().unwrap().push(id as u32);
        }
        previous = m;
    }
    runs.iter()
        .map(|ids| encoder.tokenizer().decode(ids, false).unwrap())
        .collect()
}

/// What SF's `qwen3.5` rule supervises in each good line of chat.jsonl, in file order.
fn expected_qwen3_5_spans() -> Vec<Vec<&'static str>> {
    vec![
        // line 1: reasoning_content goes into the think block, which is supervised.
        vec!["The user asks about France. Paris is the capital.\n</think>\n\nThe capital of France is Paris.<|im_end|>\n"],
        // line 2: only the turn after the last user message has a think block.
        vec!["Explain it briefly.\n</think>\n\nA list comprehension builds a new list from an iterable in a single expression.<|im_end|>\n"],
        // line 4: reasoning split out of `<think>...</think>` inside the content.
        vec!["I need a def with a return.\n</think>\n\ndef add(a, b):\n    return a + b<|im_end|>\n"],
        // line 7: both assistant turns follow the last user query; the tool call is supervised.
        vec![
            "The user asks about the weather, so I should call the weather tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>\n",
            "The tool said the temperature is 21.\n</think>\n\nIt is 21 degrees and sunny in Paris today.<|im_end|>\n",
        ],
        // line 9: empty reasoning; the "\n\n" token straddles the header's end, so it stays
        // unsupervised (SF's prefix-length rule gives the same).
        vec!["</think>\n\nGood morning! How can I help you today?<|im_end|>\n"],
        // line 11: multi-byte text keeps exact offsets.
        vec!["Accented words 🙂\n</think>\n\nCafé, naïve, résumé 🙂 日本語のテキスト。<|im_end|>\n"],
    ]
}

#[test]
fn masked_tokens_decode_to_exactly_the_assistant_spans() {
    let encoder = encoder(SpanRule::qwen3_5());
    let (samples, report) = load(
        &fixtures().join("chat.jsonl"),
        DataFormat::Chat(&encoder),
        &options(4096),
    )
    .unwrap();
    let runs: Vec<Vec<String>> = samples
        .iter()
        .map(|s| supervised_runs(&encoder, s))
        .collect();
    assert_eq!(runs, expected_qwen3_5_spans());
    assert_eq!(report.truncated, 0);
    for sample in &samples {
        assert_eq!(sample.input_ids.len(), sample.loss_mask.len());
    }
}

#[test]
fn bad_lines_are_reported_with_line_numbers_and_reasons_and_nothing_is_lost() {
    let encoder = encoder(SpanRule::qwen3_5());
    let path = fixtures().join("chat.jsonl");
    let (samples, report) = load(&path, DataFormat::Chat(&encoder), &options(4096)).unwrap();
    let bad: Vec<(u64, &str)> = report
        .bad_lines
        .iter()
        .map(|b| (b.line, b.reason.as_str()))
        .collect();
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert_eq!(bad[0].0, 3);
    assert!(bad[0].1.contains("not a chat row"), "{}", bad[0].1);
    assert_eq!(bad[1].0, 5);
    assert!(bad[1].1.contains("role \"bot\""), "{}", bad[1].1);
    assert_eq!(bad[2].0, 8);
    assert!(
        bad[2].1.contains("No user query found in messages."),
        "{}",
        bad[2].1
    );
    assert!(report.bad_lines.iter().all(|b| b.file == path));
    assert_eq!(report.blank_lines, 1);
    // Line 10's only assistant turn is history (before the last user message): no think block,
    // so SF's qwen3.5 rule supervises nothing there.
    assert_eq!(report.skipped_too_short, vec![10]);
    assert_eq!((report.lines, report.samples, samples.len()), (11, 6, 6));
    assert!(report.is_balanced());
    assert!(
        report.summary().contains("first bad line"),
        "{}",
        report.summary()
    );
}

#[test]
fn renders_like_transformers_and_masks_like_specforge() {
    let encoder = encoder(SpanRule::qwen3_5());
    let lines: Vec<String> = std::fs::read_to_string(fixtures().join("chat.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let reference = std::fs::read_to_string(fixtures().join("chat.reference.jsonl")).unwrap();
    let mut compared = 0;
    for entry in reference.lines() {
        let entry: serde_json::Value = serde_json::from_str(entry).unwrap();
        let n = entry["line"].as_u64().unwrap() as usize;
        let line = &lines[n - 1];
        if entry.get("error").is_some() {
            if !line.trim().is_empty() {
                assert!(
                    encoder.encode_line(line).is_err(),
                    "line {n} should be rejected"
                );
            }
            continue;
        }
        let encoded = encoder.encode_line(line).unwrap();
        assert_eq!(
            encoded.text,
            entry["text"].as_str().unwrap(),
            "line {n} render"
        );
        let ids: Vec<i64> = serde_json::from_value(entry["input_ids"].clone()).unwrap();
        let mask: Vec<u8> = serde_json::from_value(entry["loss_mask"].clone()).unwrap();
        assert_eq!(encoded.sample.input_ids, ids, "line {n} ids");
        assert_eq!(encoded.sample.loss_mask, mask, "line {n} mask");
        compared += 1;
    }
    assert_eq!(compared, 7);
}

#[test]
fn every_turn_rule_also_supervises_history_turns() {
    let encoder = encoder(SpanRule::qwen3_5_every_turn());
    let (samples, report) = load(
        &fixtures().join("chat.jsonl"),
        DataFormat::Chat(&encoder),
        &options(4096),
    )
    .unwrap();
    assert!(report.skipped_too_short.is_empty());
    assert_eq!(samples.len(), 7);
    assert_eq!(
        supervised_runs(&encoder, &samples[1]),
        vec![
            "A spider has eight legs.<|im_end|>\n",
            "Explain it briefly.\n</think>\n\nA list comprehension builds a new list from an iterable in a single expression.<|im_end|>\n",
        ]
    );
    // Line 10 (the history-only row) now trains on its one assistant turn.
    assert_eq!(
        supervised_runs(&encoder, &samples[5]),
        vec!["The drafter predicts a block of tokens.<|im_end|>\n"]
    );
}

fn write_jsonl(dir: &Path, name: &str, rows: &[serde_json::Value]) -> PathBuf {
    let path = dir.join(name);
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn truncation_cuts_ids_and_mask_together_and_drops_rows_left_unsupervised() {
    let encoder = encoder(SpanRule::qwen3_5());
    let dir = tempfile::tempdir().unwrap();
    let long_answer = serde_json::json!({"conversations": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "The capital of France is Paris. ".repeat(20)},
    ]});
    let long_prompt = serde_json::json!({"conversations": [
        {"role": "user", "content": "The capital of France is Paris. ".repeat(20)},
        {"role": "assistant", "content": "Yes."},
    ]});
    let path = write_jsonl(
        dir.path(),
        "long.jsonl",
        &[long_answer.clone(), long_prompt],
    );
    let max_length = 40;
    let (samples, report) = load(&path, DataFormat::Chat(&encoder), &options(max_length)).unwrap();
    assert_eq!(report.truncated, 1);
    assert_eq!(report.skipped_too_short, vec![2]);
    assert_eq!(samples.len(), 1);
    let full = encoder
        .encode_line(&long_answer.to_string())
        .unwrap()
        .sample;
    assert!(full.len() > max_length);
    assert_eq!(samples[0].input_ids, full.input_ids[..max_length]);
    assert_eq!(samples[0].loss_mask, full.loss_mask[..max_length]);
    assert!(samples[0].supervised_tokens() > 2);
}

#[test]
fn a_jinja_file_overrides_the_config_template_and_a_model_dir_jinja_is_preferred() {
    let options = ChatOptions {
        span_rule: SpanRule::qwen(),
        system_prompt: None,
        enable_thinking: None,
    };
    let model = fixtures().join("model");
    let jinja = fixtures().join("chatml_template.jinja");
    let explicit = ChatEncoder::from_model_dir(&model, Some(&jinja), options.clone()).unwrap();
    let line = r#"{"conversations":[{"from":"human","value":"Good morning!"},{"from":"gpt","value":"Good morning! How can I help you today?"}]}"#;
    let encoded = explicit.encode_line(line).unwrap();
    assert_eq!(
        encoded.text,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nGood morning!<|im_end|>\n\
         <|im_start|>assistant\nGood morning! How can I help you today?<|im_end|>\n"
    );
    assert_eq!(
        supervised_runs(&explicit, &encoded.sample),
        vec!["Good morning! How can I help you today?<|im_end|>\n"]
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        model.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::copy(&jinja, dir.path().join("chat_template.jinja")).unwrap();
    let from_dir = ChatEncoder::from_model_dir(dir.path(), None, options).unwrap();
    assert_eq!(
        from_dir.template().origin(),
        dir.path().join("chat_template.jinja")
    );
    assert_eq!(from_dir.encode_line(line).unwrap().text, encoded.text);
}

#[test]
fn parallel_loading_keeps_file_order_and_line_numbers_across_batches() {
    let encoder = encoder(SpanRule::qwen3_5());
    let fixture = std::fs::read_to_string(fixtures().join("chat.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl");
    // 11 lines × 400 = 4400 lines: more than one 4096-line batch.
    std::fs::write(&path, fixture.repeat(400)).unwrap();
    let sequential = load(
        &path,
        DataFormat::Chat(&encoder),
        &LoadOptions {
            threads: 1,
            ..options(4096)
        },
    )
    .unwrap();
    let parallel = load(
        &path,
        DataFormat::Chat(&encoder),
        &LoadOptions {
            threads: 3,
            ..options(4096)
        },
    )
    .unwrap();
    assert_eq!(sequential, parallel);
    let (samples, report) = parallel;
    assert_eq!(samples.len(), 6 * 400);
    let last_bad: Vec<u64> = report
        .bad_lines
        .iter()
        .rev()
        .take(3)
        .map(|b| b.line)
        .collect();
    assert_eq!(last_bad, vec![11 * 399 + 8, 11 * 399 + 5, 11 * 399 + 3]);
    assert!(report.is_balanced());
}

#[test]
fn file_level_problems_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = ChatEncoder::from_model_dir(dir.path(), None, ChatOptions::default()).unwrap_err();
    assert!(matches!(err, DataError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    std::fs::write(
        dir.path().join("tokenizer.json"),
        "{\"not\": \"a tokenizer\"}",
    )
    .unwrap();
    let err = ChatEncoder::from_model_dir(dir.path(), None, ChatOptions::default()).unwrap_err();
    assert!(
        matches!(err, DataError::UnreadableTokenizer { .. }),
        "{err}"
    );

    std::fs::copy(
        fixtures().join("model/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let err = ChatEncoder::from_model_dir(dir.path(), None, ChatOptions::default()).unwrap_err();
    assert!(
        matches!(err, DataError::MissingChatTemplate { .. }),
        "{err}"
    );

    let bad_template = dir.path().join("chat_template.jinja");
    std::fs::write(&bad_template, "{% for m in messages %}{{ m.content }}").unwrap();
    let err = ChatEncoder::from_model_dir(dir.path(), None, ChatOptions::default()).unwrap_err();
    assert!(matches!(err, DataError::BadTemplate { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&bad_template.display().to_string()),
        "{err}"
    );

    let encoder = encoder(SpanRule::qwen3_5());
    let missing = dir.path().join("nope.jsonl");
    let err = load(&missing, DataFormat::Chat(&encoder), &options(4096)).unwrap_err();
    assert!(matches!(err, DataError::MissingFile { .. }) && err.to_string().contains("nope.jsonl"));

    let all_bad = dir.path().join("bad.jsonl");
    std::fs::write(&all_bad, "{\"conversations\": 3}\n\n").unwrap();
    let err = load(&all_bad, DataFormat::Chat(&encoder), &options(4096)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, DataError::NoUsableSamples { .. }), "{text}");
    assert!(text.contains("bad.jsonl:1:"), "{text}");
}

#[test]
fn a_chat_prompt_is_the_history_before_the_answer_with_the_generation_prompt() {
    let encoder = encoder(SpanRule::qwen3_5());
    let line = r#"{"conversations": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Blue."}]}"#
        .replace('\n', " ");
    let ids = encoder.encode_prompt_line(&line).unwrap();
    let as_u32: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
    let prompt = encoder.tokenizer().decode(&as_u32, false).unwrap();
    assert!(
        prompt.ends_with("Another?<|im_end|>\n<|im_start|>assistant\n<think>\n"),
        "{prompt:?}"
    );
    // what the training render shows before the answer the prompt leaves out
    let full = encoder.encode_line(&line).unwrap().text;
    assert!(full.starts_with(&prompt), "{prompt:?} vs {full:?}");
    assert!(full[prompt.len()..].contains("Blue."));
    assert!(!prompt.contains("Blue."));
}
