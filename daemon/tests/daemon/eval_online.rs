//! `dflashd eval --online`, the real binary on a tiny hybrid target saved in the HF layout (with
//! the fixture tokenizer and chat template) and a drafter saved in the DFlash layout: the JSON
//! contract, greedy losslessness against the target alone, stop tokens from
//! `generation_config.json` (else `config.json`), token and chat prompts, and clear errors for
//! bad input.
use std::path::{Path, PathBuf};
use std::process::Output;

use dflash_engine::embedded::tiny_dflash_drafter_config;
use dflash_engine::model::drafter::{DominoConfig, Drafter, DrafterHead};
use dflash_engine::model::target::{TargetConfig, TargetModel};
use dflash_engine::train::drafter_io::{named_parameters, write_hf};
use serde_json::Value;
use tch::{nn, Device, Kind, Tensor};

use crate::support::binary::dflashd;

const MAX_NEW_TOKENS: usize = 10;

fn fixture_tokenizer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data/model")
}

/// `root/target` (the embedded default's shape, vocabulary 512, room for the fixture
/// tokenizer's 473 ids) with `tokenizer.json`, `tokenizer_config.json` (its chat template) and
/// a `generation_config.json` without `eos_token_id`; `root/drafter` in the DFlash layout.
fn models(root: &Path) -> (PathBuf, PathBuf) {
    let target_dir = root.join("target");
    let config = TargetConfig::tiny_default();
    let target = TargetModel::random(config.clone(), Device::Cpu, Kind::Float, 7);
    target.save_hf(&target_dir).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture_tokenizer_dir().join(file), target_dir.join(file)).unwrap();
    }
    write_generation_config(&target_dir, None);

    let drafter_dir = root.join("drafter");
    let cfg = tiny_dflash_drafter_config(&config);
    let _rng = dflash_engine::device::global_rng::seeded(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), &cfg);
    write_hf(&drafter_dir, &cfg, &named_parameters(&vs), Kind::Float).unwrap();
    (target_dir, drafter_dir)
}

fn write_generation_config(target_dir: &Path, eos: Option<i64>) {
    let mut config = serde_json::json!({"use_cache": true});
    if let Some(id) = eos {
        config["eos_token_id"] = serde_json::json!([id]);
    }
    std::fs::write(
        target_dir.join("generation_config.json"),
        config.to_string(),
    )
    .unwrap();
}

fn eval_online(
    root: &Path,
    target: &Path,
    drafter: &Path,
    prompts: &Path,
    extra: &[&str],
) -> Output {
    dflashd(root)
        .args(["eval", "--online", "--threads", "1", "--target"])
        .arg(target)
        .arg("--drafter")
        .arg(drafter)
        .arg("--prompts")
        .arg(prompts)
        .args(["--max-new-tokens", &MAX_NEW_TOKENS.to_string()])
        .args(extra)
        .output()
        .unwrap()
}

/// The one JSON object on stdout.
fn json_of(o: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "expected one JSON line: {stdout:?}"
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// Checks one method's figures against its own per-prompt lists and the target alone's output.
fn check_method(v: &Value, method: &str) {
    let m = &v["methods"][method];
    let prompts = m["prompts"].as_array().unwrap();
    let reference = v["target_only"]["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), reference.len());
    let (mut rounds, mut produced, mut tokens, mut means) = (0usize, 0i64, 0usize, Vec::new());
    let (mut peer_rounds, mut peer_means) = (0usize, Vec::new());
    for (p, r) in prompts.iter().zip(reference) {
        let lengths = ints(&p["acceptance_lengths"]);
        let out = ints(&p["output_ids"]);
        assert_eq!(
            out,
            ints(&r["output_ids"]),
            "{method}: greedy must equal the target alone"
        );
        assert_eq!(p["line"], r["line"]);
        // every token but the prefill's comes from one round; a round gives 1..=block_size
        assert_eq!(lengths.iter().sum::<i64>() + 1, out.len() as i64);
        assert!(lengths.iter().all(|&a| (1..=8).contains(&a)), "{lengths:?}");
        rounds += lengths.len();
        produced += lengths.iter().sum::<i64>();
        tokens += out.len();
        if !lengths.is_empty() {
            means.push(lengths.iter().sum::<i64>() as f64 / lengths.len() as f64);
        }
        // the peers' count: the same rounds, the last in full, and at most one more
        let peer = ints(&p["acceptance_lengths_peer_counting"]);
        let n = lengths.len();
        assert!(
            peer.len() == n || peer.len() == n + 1,
            "{lengths:?} {peer:?}"
        );
        if n > 0 {
            assert_eq!(peer[..n - 1], lengths[..n - 1]);
            assert!(peer[n - 1] >= lengths[n - 1], "{lengths:?} {peer:?}");
        }
        peer_rounds += peer.len();
        if !peer.is_empty() {
            peer_means.push(peer.iter().sum::<i64>() as f64 / peer.len() as f64);
        }
    }
    assert_eq!(
        m["rounds_peer_counting"].as_u64().unwrap() as usize,
        peer_rounds
    );
    if peer_means.is_empty() {
        assert!(m["tau_peer_counting"].is_null(), "{m}");
    } else {
        let peer_tau = m["tau_peer_counting"].as_f64().unwrap();
        let want = peer_means.iter().sum::<f64>() / peer_means.len() as f64;
        assert!((peer_tau - want).abs() < 1e-12, "{peer_tau} vs {want}");
    }
    assert_eq!(m["rounds"].as_u64().unwrap() as usize, rounds);
    assert_eq!(m["tokens"].as_u64().unwrap() as usize, tokens);
    if rounds == 0 {
        // every output ended at the prefill's token: no round, no figure
        assert!(m["tau"].is_null() && m["tau_pooled"].is_null(), "{m}");
    } else {
        let tau = m["tau"].as_f64().unwrap();
        assert!((tau - means.iter().sum::<f64>() / means.len() as f64).abs() < 1e-12);
        let pooled = m["tau_pooled"].as_f64().unwrap();
        assert!((pooled - produced as f64 / rounds as f64).abs() < 1e-12);
    }
    assert_eq!(m["lossless"], true);
    let (seconds, rate) = (
        m["seconds"].as_f64().unwrap(),
        m["tokens_per_s"].as_f64().unwrap(),
    );
    assert!(seconds > 0.0 && (rate - tokens as f64 / seconds).abs() < 1e-6 * rate);
}

#[test]
fn online_eval_on_token_and_chat_prompts_is_lossless_and_reports_the_contract() {
    let root = tempfile::tempdir().unwrap();
    let (target, drafter) = models(root.path());
    let prompts = root.path().join("prompts.jsonl");
    let lines = [
        r#"{"input_ids": [12, 40, 7, 301, 5, 88, 12, 40]}"#,
        "",
        r#"{"id": "q", "conversations": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."}]}"#,
        r#"{"input_ids": [3]}"#,
        r#"{"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many legs does a spider have?"}]}"#,
    ];
    std::fs::write(&prompts, lines.join("\n") + "\n").unwrap();

    let v = json_of(&eval_online(
        root.path(),
        &target,
        &drafter,
        &prompts,
        &["--json", "--tree-budget", "4,16"],
    ));
    for method in ["chain", "ddtree_4", "ddtree_16"] {
        check_method(&v, method);
    }
    let lines_seen: Vec<i64> = v["methods"]["chain"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["line"].as_i64().unwrap())
        .collect();
    assert_eq!(
        lines_seen,
        vec![1, 3, 4, 5],
        "the blank line 2 is no prompt"
    );
    assert_eq!(v["prompts"]["count"], 4);
    let lengths = ints(&v["prompts"]["lengths"]);
    assert_eq!((lengths[0], lengths[2]), (8, 1));
    // chat rows: the question rendered with the template and the generation prompt
    assert!(lengths[1] > 10 && lengths[3] > 10, "{lengths:?}");
    for p in v["target_only"]["prompts"].as_array().unwrap() {
        assert_eq!(
            ints(&p["output_ids"]).len(),
            MAX_NEW_TOKENS,
            "no stop token is set"
        );
    }
    let offline = v["offline_tau"].as_f64().unwrap();
    assert!((1.0..=8.0).contains(&offline), "{offline}");
    // anchors at every continuation token but the last
    assert_eq!(v["offline"]["blocks"], 4 * (MAX_NEW_TOKENS as u64 - 1));
    assert_eq!(v["stop_tokens"]["ids"], serde_json::json!([]));
    assert!(v["stop_tokens"]["source"]
        .as_str()
        .unwrap()
        .contains("no eos_token_id"));
    assert_eq!(v["settings"]["max_new_tokens"], MAX_NEW_TOKENS);
    assert_eq!(v["settings"]["sampling"]["mode"], "greedy");
    assert_eq!(v["settings"]["block_size"], 8);
    assert!(v["target_only"]["tokens_per_s"].as_f64().unwrap() > 0.0);

    // a stop token from generation_config.json ends every output after its first occurrence
    let first = ints(&v["target_only"]["prompts"][0]["output_ids"]);
    let stop = first[3];
    write_generation_config(&target, Some(stop));
    let stopped = json_of(&eval_online(
        root.path(),
        &target,
        &drafter,
        &prompts,
        &["--json"],
    ));
    check_method(&stopped, "chain");
    assert_eq!(stopped["stop_tokens"]["ids"], serde_json::json!([stop]));
    let cut = first.iter().position(|&t| t == stop).unwrap();
    assert_eq!(
        ints(&stopped["methods"]["chain"]["prompts"][0]["output_ids"]),
        first[..=cut].to_vec()
    );
    for p in stopped["target_only"]["prompts"].as_array().unwrap() {
        let out = ints(&p["output_ids"]);
        let ended = out.last() == Some(&stop) || out.len() == MAX_NEW_TOKENS;
        assert!(ended && !out[..out.len() - 1].contains(&stop), "{out:?}");
    }

    // An export naming its EOS only in config.json stops there too, as `generate` (and
    // `dflashd regenerate`) would: the same outputs as from generation_config.json.
    write_generation_config(&target, None);
    let config_path = target.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["eos_token_id"] = serde_json::json!(stop);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let from_config = json_of(&eval_online(
        root.path(),
        &target,
        &drafter,
        &prompts,
        &["--json"],
    ));
    assert_eq!(from_config["stop_tokens"]["ids"], serde_json::json!([stop]));
    let source = from_config["stop_tokens"]["source"].as_str().unwrap();
    assert!(
        source.contains(&config_path.display().to_string()) && !source.contains("generation"),
        "{source}"
    );
    assert_eq!(
        from_config["target_only"]["prompts"],
        stopped["target_only"]["prompts"]
    );
    assert_eq!(
        from_config["methods"]["chain"]["prompts"],
        stopped["methods"]["chain"]["prompts"]
    );
}

#[test]
fn sampled_online_eval_prints_a_table() {
    let root = tempfile::tempdir().unwrap();
    let (target, drafter) = models(root.path());
    let prompts = root.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [4, 5]}\n",
    )
    .unwrap();
    let o = eval_online(
        root.path(),
        &target,
        &drafter,
        &prompts,
        &[
            "--temperature",
            "0.8",
            "--top-k",
            "50",
            "--seed",
            "3",
            "--max-prompts",
            "1",
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(stdout.contains("prompts: 1 from"), "{stdout}");
    assert!(
        stdout.contains("temperature 0.8, top-k 50, seed 3"),
        "{stdout}"
    );
    let header = stdout.lines().find(|l| l.starts_with("method")).unwrap();
    assert!(
        header.contains("tau_pooled")
            && header.contains("tau_peer_counting")
            && header.contains("lossless"),
        "{stdout}"
    );
    let chain = stdout.lines().find(|l| l.starts_with("chain")).unwrap();
    // lossless in distribution only: no per-run verdict
    assert!(chain.trim_end().ends_with('-'), "{chain}");
    assert!(
        stdout.contains("offline tau on the target's greedy continuations"),
        "{stdout}"
    );
}

#[test]
fn bad_prompt_input_fails_naming_the_file_and_line() {
    let root = tempfile::tempdir().unwrap();
    let (target, drafter) = models(root.path());
    let run = |prompts: &Path, extra: &[&str]| {
        let o = eval_online(root.path(), &target, &drafter, prompts, extra);
        assert!(!o.status.success());
        assert!(o.stdout.is_empty(), "nothing on stdout when it fails");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    let bad = root.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 600]}\n{\"text\": \"hi\"}\n",
    )
    .unwrap();
    let err = run(&bad, &["--json"]);
    assert!(err.contains("2 bad prompt lines"), "{err}");
    assert!(
        err.contains("bad.jsonl:2: token 1 of the prompt is 600; expected 0..512"),
        "{err}"
    );
    assert!(
        err.contains("bad.jsonl:3: has neither `input_ids` nor `conversations`"),
        "{err}"
    );

    let err = run(&root.path().join("absent.jsonl"), &[]);
    assert!(
        err.contains("absent.jsonl") && err.contains("does not exist"),
        "{err}"
    );

    // chat rows need the target's tokenizer
    std::fs::remove_file(target.join("tokenizer.json")).unwrap();
    let chat = root.path().join("chat.jsonl");
    std::fs::write(
        &chat,
        "{\"input_ids\": [1]}\n{\"conversations\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    )
    .unwrap();
    let err = run(&chat, &[]);
    assert!(err.contains("chat.jsonl:2 is a chat row"), "{err}");
    assert!(err.contains("tokenizer.json"), "{err}");

    // the wrong input for the mode
    let o = dflashd(root.path())
        .args(["eval", "--online", "--target"])
        .arg(&target)
        .arg("--drafter")
        .arg(&drafter)
        .arg("--data")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--data is the offline input"), "{err}");
}

/// A Domino drafter (head weights spread so the correction moves drafts) in `root/domino`, and
/// its backbone alone, the same weights without the head, as a DFlash drafter in
/// `root/backbone`.
fn domino_and_backbone(root: &Path) -> (PathBuf, PathBuf) {
    let config = TargetConfig::tiny_default();
    let plain = tiny_dflash_drafter_config(&config);
    let mut cfg = plain.clone();
    cfg.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 16,
        gru_hidden_dim: 8,
        pure_draft_prefix_len: 0,
    });
    let _rng = dflash_engine::device::global_rng::seeded(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), &cfg);
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name.starts_with("embed_proj") || name.starts_with("prefix_gru") {
                var.copy_(&(Tensor::randn(var.size(), (Kind::Float, Device::Cpu)) * 0.5));
            }
        }
    });
    let params = named_parameters(&vs);
    let (domino_dir, backbone_dir) = (root.join("domino"), root.join("backbone"));
    write_hf(&domino_dir, &cfg, &params, Kind::Float).unwrap();
    let backbone: Vec<_> = params
        .into_iter()
        .filter(|(n, _)| !n.starts_with("embed_proj") && !n.starts_with("prefix_gru"))
        .collect();
    write_hf(&backbone_dir, &plain, &backbone, Kind::Float).unwrap();
    (domino_dir, backbone_dir)
}

#[test]
fn a_domino_drafter_reports_its_base_tau_as_its_backbone_decodes_alone() {
    let root = tempfile::tempdir().unwrap();
    let (target, _) = models(root.path());
    let (domino, backbone) = domino_and_backbone(root.path());
    let prompts = root.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"input_ids\": [12, 40, 7, 301, 5]}\n{\"input_ids\": [3, 9]}\n",
    )
    .unwrap();
    let flags = ["--json", "--tree-budget", "4"];
    let corrected = json_of(&eval_online(
        root.path(),
        &target,
        &domino,
        &prompts,
        &flags,
    ));
    let alone = json_of(&eval_online(
        root.path(),
        &target,
        &backbone,
        &prompts,
        &flags,
    ));
    for method in ["chain", "ddtree_4"] {
        check_method(&corrected, method);
        let (d, b) = (&corrected["methods"][method], &alone["methods"][method]);
        assert_eq!(d["base_tau"], b["tau"], "{method}");
        assert_eq!(
            d["base_tau_peer_counting"], b["tau_peer_counting"],
            "{method}"
        );
        assert_eq!(d["base_lossless"], Value::Bool(true), "{method}");
        assert!(
            b.get("base_tau").is_none(),
            "a DFlash drafter has no base_tau"
        );
    }
    let table = eval_online(root.path(), &target, &domino, &prompts, &[]);
    assert!(table.status.success());
    let stdout = String::from_utf8(table.stdout).unwrap();
    assert!(
        stdout.contains("chain base_tau (Domino's LM-head logits alone"),
        "{stdout}"
    );
}
