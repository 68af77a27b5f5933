//! `dflashd config validate` refuses what `start`'s setup refuses after reading the files the
//! config names (issue 22: "config validate says yes where start says no"), without loading a
//! weight: the online prompt file, the target's stop tokens, chat data's tokenizer and chat
//! template, and the memory plan wherever the devices' memory is known. Each case here was
//! valid to `config validate` before, and refused by `start`.

use std::path::{Path, PathBuf};

use crate::daemon_config::{line_of, validate_and_start};
use crate::support::binary::{run, write_config};
use dflash_shared::config::{Config, DataFormat, Device};

fn repo_path(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `root/name`: a Hugging Face target directory holding the tiny target's `config.json`
/// (vocabulary 512) and `generation_config.json`, and its `extra` files besides
/// (`model.safetensors` only where `start` runs on it).
fn tiny_target_dir(root: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = repo_path("assets/tiny/target");
    for file in ["config.json", "generation_config.json"]
        .iter()
        .chain(extra)
    {
        std::fs::copy(tiny.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// The embedded default, edited, written to `root/name`: its path and its text.
fn config(root: &Path, name: &str, edit: impl FnOnce(&mut Config)) -> (PathBuf, String) {
    let path = root.join(name);
    write_config(&path, edit);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

/// `config validate FILE EXTRA...`: its exit code and everything it printed.
fn validate(root: &Path, file: &Path, extra: &[&str]) -> (i32, String) {
    let path = file.display().to_string();
    let mut args = vec!["config", "validate", &path];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run(root, &args);
    (code, format!("{stderr}{stdout}"))
}

/// `config validate` states the CPU device's need in the very line `start` refused with.
fn assert_same_device_need(started: &str, validated: &str) {
    let need = started
        .lines()
        .find(|l| l.contains("cpu (target_and_drafter): needs "))
        .unwrap_or_else(|| panic!("no device line from start:\n{started}"))
        .trim();
    assert_has(validated, &[need]);
}

fn assert_has(out: &str, needles: &[&str]) {
    for needle in needles {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }
}

#[test]
fn validate_reads_the_online_prompt_file_and_the_stop_tokens_as_start_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // No tokenizer or chat template: chat prompts cannot be rendered on it.
    let target = tiny_target_dir(root, "target", &["model.safetensors"]);
    let on_prompts = |name: &str, prompts: &str| {
        let file = root.join(name);
        std::fs::write(&file, prompts).unwrap();
        config(root, &format!("{name}.toml"), |c| {
            c.target.model = target.display().to_string();
            c.training.online_eval_prompts = Some(file.display().to_string());
        })
    };
    let cases = [
        (
            "bad_json.jsonl",
            "{\"input_ids\": [1, 3, 9]}\n{not json\n",
            "bad_json.jsonl:2: not JSON",
        ),
        (
            "out_of_vocab.jsonl",
            "{\"input_ids\": [1, 3, 9999]}\n",
            "token 2 of the prompt is 9999; expected 0..512 (the target's vocab_size)",
        ),
        (
            "chat.jsonl",
            "{\"conversations\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
            "chat prompts are rendered with the target's tokenizer.json and chat template: \
             tokenizer ",
        ),
        ("blank.jsonl", "\n\n", "holds no prompt (only blank lines)"),
    ];
    for (name, prompts, says) in cases {
        let (file, text) = on_prompts(name, prompts);
        let (code, out) = validate(root, &file, &[]);
        assert_eq!(code, 1, "{name}: {out}");
        let key = format!(
            "training.online_eval_prompts (line {})",
            line_of(&text, "online_eval_prompts = ")
        );
        assert_has(&out, &[&key, says, "or set training.online_eval_every = 0"]);
    }

    // Good prompts on a target whose stop tokens cannot be read: refused by both, naming the
    // target's key, the file, and what to do.
    std::fs::write(
        target.join("generation_config.json"),
        r#"{"eos_token_id": "</s>"}"#,
    )
    .unwrap();
    let (file, text) = on_prompts("good.jsonl", "{\"input_ids\": [1, 3, 9]}\n");
    let ((code, validated), (start, started)) = validate_and_start(root, &file);
    assert_eq!(code, 1, "{validated}");
    assert_ne!(start, Some(0), "{started}");
    let reason = [
        "generation_config.json: `eos_token_id` holds \"</s>\"",
        "fix `eos_token_id` there",
        "or set training.online_eval_every = 0",
    ];
    assert_has(&validated, &reason);
    assert_has(&started, &reason);
    assert_has(
        &validated,
        &[&format!(
            "target.model (line {})",
            line_of(&text, "model = ")
        )],
    );
    assert_has(&started, &["target.model = \""]);
}

#[test]
fn validate_refuses_chat_data_without_its_tokenizer_or_chat_template_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let bare = tiny_target_dir(root, "bare", &[]);
    let chat_data = |c: &mut Config| {
        c.data.format = DataFormat::Chat;
        c.data.train_file = repo_path("tests/fixtures/data/chat.jsonl")
            .display()
            .to_string();
        c.data.held_out_samples = Some(1);
        c.training.batch_size = 1;
    };
    let fixture_model = repo_path("tests/fixtures/data/model");

    // The tokenizer and template would come from the target directory, which has neither.
    let (file, text) = config(root, "no_tokenizer.toml", |c| {
        chat_data(c);
        c.target.model = bare.display().to_string();
    });
    let (code, out) = validate(root, &file, &[]);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            &format!("target.model (line {})", line_of(&text, "model = ")),
            "tokenizer.json does not exist",
            "point data.tokenizer and data.chat_template at them, or use pre-tokenized data",
        ],
    );

    // data.tokenizer names a tokenizer; data.chat_template names no file.
    let (file, text) = config(root, "no_template.toml", |c| {
        chat_data(c);
        c.target.model = bare.display().to_string();
        c.data.tokenizer = Some(fixture_model.join("tokenizer.json").display().to_string());
        c.data.chat_template = Some(root.join("missing.jinja").display().to_string());
    });
    let (code, out) = validate(root, &file, &[]);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            &format!(
                "data.chat_template (line {})",
                line_of(&text, "chat_template = ")
            ),
            "missing.jinja does not exist",
        ],
    );
    assert!(!out.contains("data.tokenizer ("), "{out}");

    // With both in the target directory, the chat data and chat prompts read: valid.
    let complete = tiny_target_dir(root, "complete", &[]);
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture_model.join(name), complete.join(name)).unwrap();
    }
    let prompts = root.join("chat_prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"conversations\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    )
    .unwrap();
    let (file, _) = config(root, "complete.toml", |c| {
        chat_data(c);
        c.target.model = complete.display().to_string();
        c.training.online_eval_prompts = Some(prompts.display().to_string());
    });
    let (code, out) = validate(root, &file, &[]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn validate_runs_starts_memory_plan_where_the_devices_memory_is_known() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // A CPU run against the host's memory: a drafter of a billion-wide MLP needs terabytes.
    let (file, text) = config(root, "huge.toml", |c| {
        c.drafter.intermediate_size = 1_000_000_000;
    });
    let ((code, validated), (start, started)) = validate_and_start(root, &file);
    assert_eq!(code, 1, "{validated}");
    assert_ne!(start, Some(0), "{started}");
    assert_has(
        &validated,
        &[
            &format!("topology (line {})", line_of(&text, "[topology]")),
            "the memory plan predicts this run does not fit",
            "device memory: host memory (sysinfo)",
            "--ignore-memory-plan",
        ],
    );
    // The same need against the same memory, in start's words.
    assert_same_device_need(&started, &validated);

    // A GPU topology on a machine that may have no GPU: the memory stated as `start` takes it.
    let (file, _) = config(root, "cuda.toml", |c| {
        c.topology.target_devices = vec![Device::Cuda(0)];
        c.topology.drafter_devices = vec![Device::Cuda(0)];
    });
    let (code, out) = validate(root, &file, &["--gpu-memory-gib", "0.001"]);
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            "cuda:0 (target_and_drafter): needs ",
            "has 1.0 MiB",
            "device memory: --gpu-memory-gib",
            "devices of at least ",
        ],
    );
    // Not stated: NVML's figure where there is one, else a note that start checks it; no
    // figure is made up.
    let (code, out) = validate(root, &file, &[]);
    assert_eq!(code, 0, "{out}");
    if out.contains("memory plan is not checked here") {
        assert_has(&out, &["pass --gpu-memory-gib", "start checks it"]);
    }
}

#[test]
fn a_run_the_memory_plan_refuses_is_refused_before_a_weight_is_read() {
    // The target's weight file is not a safetensors file: a start that read it first would
    // name it. The plan (a billion-wide MLP against the host's memory) must be what refuses.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let target = tiny_target_dir(root, "target", &["tokenizer.json"]);
    std::fs::write(target.join("model.safetensors"), b"not a safetensors file").unwrap();
    let (file, _) = config(root, "huge.toml", |c| {
        c.target.model = target.display().to_string();
        c.training.online_eval_every = Some(0);
        c.drafter.intermediate_size = 1_000_000_000;
    });
    let ((code, validated), (start, started)) = validate_and_start(root, &file);
    assert_eq!(code, 1, "{validated}");
    assert_eq!(start, Some(1), "{started}");
    assert_has(
        &started,
        &["the memory plan predicts this run does not fit"],
    );
    assert!(
        !started.contains("model.safetensors") && !started.contains("safetensors"),
        "start read the weights before the plan refused:\n{started}"
    );
    assert_same_device_need(&started, &validated);

    // The plan satisfied, the same unreadable weights are what refuses, naming the file.
    let (file, _) = config(root, "fits.toml", |c| {
        c.target.model = target.display().to_string();
        c.training.online_eval_every = Some(0);
    });
    let ((code, validated), (start, started)) = validate_and_start(root, &file);
    assert_eq!(code, 0, "config validate reads no weight:\n{validated}");
    assert_ne!(start, Some(0), "{started}");
    assert_has(&started, &["model.safetensors"]);
}
