//! The loaders' own code reads our exports (issue 35, item 4).
//!
//! vLLM speculators: a tiny CPU drafter of each head speculators 0.9.0 has a model for
//! (DFlash, DSpark, DFlash2), trained two steps and exported with `--format speculators
//! --dtype f32`, is loaded by speculators' `from_pretrained` (`scripts/loaders/speculators_forward.py`, the `loaders` uv group), and
//! its training forward over one anchored block gives the logits ours gives on the same
//! context features and tokens (DSpark: with the Markov bias, and the confidence logits;
//! DFlash2: the unary logits and the selector's scores of speculators' candidates).
//!
//! z-lab's loader (PyPI `dflash` 0.1.0, `scripts/loaders/zlab_forward.py`): its
//! `DFlash2DraftModel` and `DFlashDraftModel` load the standard `hf` export of a DFlash2 and a
//! DFlash drafter and run one block as its `dflash_generate` does; the logits match ours
//! (DFlash2's with its multiplier and cap), and DFlash2's greedy selector path is ours.
//!
//! SGLang (`sglang` 0.5.23, `scripts/loaders/sglang_dspark.py`): its `Qwen3DSparkModel` is
//! built on CPU (SGLang's single-process gloo setup, TP 1) from a DSpark drafter's `--format
//! sglang --dtype f32` export and loads it through SGLang's loader: every parameter is loaded
//! and equal bit for bit to the export's tensors (the fused `qkv_proj` and `gate_up_proj` too),
//! and every tensor is consumed (with SGLANG_RAGGED_VERIFY_MODE at its default, `static`,
//! SGLang builds no confidence head and skips exactly its tensors). Its Markov head stepped over
//! a block and its confidence head's `predict` give our bias, confidence logit and confidence
//! on the same hidden states and tokens. Not checked: SGLang's draft forward, which runs
//! through its attention backends over a KV pool (CUDA/Triton kernels).
//!
//! Tolerance: 1e-4 on the largest absolute difference, f32 on both sides (eager or SDPA
//! attention there, our dense-mask kernels here); the test prints the measured one.
//!
//! `#[ignore]`d (`make soak`, which syncs the group): importing transformers, speculators and
//! sglang takes longer than `make test` affords. A missing package fails the test and says what to
//! run.
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use dflash_engine::train::drafter_io::{load_hf, LoadedDrafter};
use tch::{Device, Kind, Tensor};

use crate::trained_artifacts::{export, trained_run_of};

/// The block's anchor: 12 context positions, fewer than the tiny configs' sliding window (32),
/// so the window's edge convention is not what is compared.
const ANCHOR: i64 = 12;
/// f32 on both sides; eager attention there, our dense-mask kernels here.
const TOLERANCE: f64 = 1e-4;

fn python() -> PathBuf {
    crate::support::binary::project_python("run `make soak` (it syncs the `loaders` uv group)")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts/loaders")
        .join(name)
}

/// The inputs both sides get: the tap features `[1, T, n·H]`, the tokens `[1, T]` and a last
/// hidden state (speculators' forward reads it for its targets; the logits do not depend on
/// it), `T` = anchor + block size + 1 (speculators never anchors in the last block).
fn block_inputs(feature_size: i64, hidden: i64, block: i64, vocab: i64) -> Vec<(String, Tensor)> {
    let _rng = dflash_engine::device::global_rng::seeded(35);
    let total = ANCHOR + block + 1;
    vec![
        (
            "features".into(),
            Tensor::randn([1, total, feature_size], (Kind::Float, Device::Cpu)),
        ),
        // Below the tiny configs' MASK id (the vocabulary's last).
        (
            "input_ids".into(),
            Tensor::randint(vocab - 1, [1, total], (Kind::Int64, Device::Cpu)),
        ),
        (
            "verifier_last".into(),
            Tensor::randn([1, total, hidden], (Kind::Float, Device::Cpu)),
        ),
    ]
}

/// The target's embedding table and LM head, from its safetensors.
fn target_embed_and_head(target: &Path) -> (Tensor, Tensor) {
    let tensors = Tensor::read_safetensors(target.join("model.safetensors")).unwrap();
    let find = |suffix: &str| {
        tensors
            .iter()
            .filter(|(n, _)| n.ends_with(suffix))
            .min_by_key(|(n, _)| n.len())
            .map(|(_, t)| t.to_kind(Kind::Float))
            .unwrap_or_else(|| panic!("no {suffix} in {}", target.display()))
    };
    (find("embed_tokens.weight"), find("lm_head.weight"))
}

/// Runs a loader script over `args` and [`ANCHOR`], failing with its stderr and what to
/// install.
fn run_script(name: &str, args: &[&Path]) -> serde_json::Value {
    let mut args: Vec<OsString> = args.iter().map(|a| a.as_os_str().to_owned()).collect();
    args.push(ANCHOR.to_string().into());
    run_python(name, &args)
}

/// Runs a loader script over `args`; its stdout is one JSON summary.
fn run_python(name: &str, args: &[OsString]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(script(name))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} failed (is the `loaders` uv group installed? `make soak`, or \
         `python3 -m uv sync --frozen --group loaders`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The largest absolute difference of two tensors, after checking their shapes.
fn max_difference(name: &str, ours: &Tensor, theirs: &Tensor) -> f64 {
    assert_eq!(ours.size(), theirs.size(), "{name}: shapes");
    (ours.to_kind(Kind::Double) - theirs.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Our drafter (the `hf` export `hf`) on the block at [`ANCHOR`]: its final-normed hidden
/// states `[1, bs, H]`, the target's LM head over them `[1, bs, V]`, and the block's tokens
/// (from the anchor on, `[bs]`).
struct OurBlock {
    loaded: LoadedDrafter,
    hidden: Tensor,
    logits: Tensor,
    block_tokens: Tensor,
}

fn our_block(hf: &Path, target: &Path, inputs: &[(String, Tensor)]) -> OurBlock {
    let loaded = load_hf(hf, Device::Cpu, Kind::Float).unwrap();
    let cfg = &loaded.config;
    let bs = cfg.block_size;
    let (embed, lm_head) = target_embed_and_head(target);
    let ids = inputs[1].1.get(0);
    let block_ids = Tensor::full([bs], cfg.mask_token_id, (Kind::Int64, Device::Cpu));
    block_ids.get(0).copy_(&ids.get(ANCHOR));
    let embeddings = embed.index_select(0, &block_ids).unsqueeze(0);
    let hidden = tch::no_grad(|| {
        loaded
            .drafter
            .forward_block(&inputs[0].1, &embeddings, ANCHOR)
    });
    let logits = hidden.matmul(&lm_head.tr());
    OurBlock {
        loaded,
        hidden,
        logits,
        block_tokens: ids.narrow(0, ANCHOR, bs),
    }
}

/// Our drafter's outputs on the block at [`ANCHOR`], named as the script names speculators'.
fn our_outputs(
    hf: &Path,
    target: &Path,
    inputs: &[(String, Tensor)],
    theirs: &BTreeMap<String, Tensor>,
) -> BTreeMap<String, Tensor> {
    let OurBlock {
        loaded,
        hidden,
        mut logits,
        block_tokens,
    } = our_block(hf, target, inputs);
    let bs = loaded.config.block_size;
    let drafter = &loaded.drafter;
    let mut out = BTreeMap::new();
    if let Some(dspark) = drafter.dspark() {
        // DSpark's slot k drafts anchor + k + 1 and reads the token at anchor + k.
        let prev = block_tokens.unsqueeze(0);
        if let Some(markov) = dspark.markov() {
            logits = &logits + markov.block_bias(&prev, &hidden);
        }
        if let Some(confidence) = dspark.confidence_logit(&hidden, &prev) {
            out.insert("confidence".to_string(), confidence.get(0));
        }
    }
    if let Some(selector) = drafter.selector() {
        let unary = selector.unary(&logits).get(0);
        let candidates = &theirs["candidate_ids"];
        // The predecessor of slot k is the token at anchor + k − 1 (the anchor's own for 0).
        let predecessors = Tensor::cat(
            &[
                block_tokens.narrow(0, 0, 1),
                block_tokens.narrow(0, 0, bs - 1),
            ],
            0,
        );
        let scores = selector.score(
            candidates,
            &unary.gather(-1, candidates, false),
            &hidden.get(0),
            &predecessors,
        );
        out.insert("candidate_scores".to_string(), scores);
        out.insert("logits".to_string(), unary);
    } else {
        out.insert("logits".to_string(), logits.get(0));
    }
    out
}

/// A run of `config` trained two steps, exported in each of `formats` (f32) to the run dir's
/// folder of that name; the block's inputs written there (`inputs.safetensors`).
struct Exported {
    run: tempfile::TempDir,
    inputs: Vec<(String, Tensor)>,
}

impl Exported {
    fn new(config: &str, formats: &[&str]) -> Self {
        let run = trained_run_of(Some(config), 2);
        for format in formats {
            let o = export(
                run.path(),
                &run.path().join(format),
                &["--dtype", "f32", "--format", format],
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        let cfg = load_hf(&run.path().join("hf"), Device::Cpu, Kind::Float)
            .unwrap()
            .config;
        let inputs = block_inputs(
            cfg.feature_size(),
            cfg.hidden_size,
            cfg.block_size,
            cfg.vocab_size,
        );
        Tensor::write_safetensors(&inputs, run.path().join("inputs.safetensors")).unwrap();
        Self { run, inputs }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.run.path().join(name)
    }

    /// What a script wrote to `theirs.safetensors`.
    fn theirs(&self) -> BTreeMap<String, Tensor> {
        Tensor::read_safetensors(self.path("theirs.safetensors"))
            .unwrap()
            .into_iter()
            .collect()
    }
}

/// Trains `config` two steps, exports it both ways, runs speculators on the speculators export
/// and compares every output with ours; returns the largest difference.
fn speculators_reads(config: &str, kind: &str) -> f64 {
    let run = Exported::new(config, &["speculators", "hf"]);
    let summary = run_script(
        "speculators_forward.py",
        &[
            &run.path("speculators"),
            &run.path("inputs.safetensors"),
            &run.path("theirs.safetensors"),
        ],
    );
    assert_eq!(summary["speculators_version"], "0.9.0", "{summary}");
    assert_eq!(summary["kind"], kind, "{summary}");
    let theirs = run.theirs();
    let ours = our_outputs(&run.path("hf"), &run.path("target"), &run.inputs, &theirs);
    let mut names: Vec<&String> = theirs.keys().filter(|n| *n != "candidate_ids").collect();
    names.sort();
    assert_eq!(names, ours.keys().collect::<Vec<_>>(), "{summary}");
    let differences: Vec<(&String, f64)> = names
        .into_iter()
        .map(|name| (name, max_difference(name, &ours[name], &theirs[name])))
        .collect();
    eprintln!("speculators {kind}: max |ours − theirs| {differences:?}");
    for (name, d) in &differences {
        assert!(
            *d <= TOLERANCE,
            "{kind} {name}: max difference {d} > {TOLERANCE}"
        );
    }
    differences.iter().map(|(_, d)| *d).fold(0.0, f64::max)
}

#[test]
#[ignore = "soak: imports transformers and speculators (`make soak` syncs the loaders group)"]
fn speculators_loads_a_dflash_export_and_drafts_our_logits() {
    speculators_reads("tiny-cpu-dflash.toml", "dflash");
}

#[test]
#[ignore = "soak: imports transformers and speculators (`make soak` syncs the loaders group)"]
fn speculators_loads_a_dspark_export_and_drafts_our_logits_and_confidence() {
    speculators_reads("tiny-cpu-dspark.toml", "dspark");
}

#[test]
#[ignore = "soak: imports transformers and speculators (`make soak` syncs the loaders group)"]
fn speculators_loads_a_dflash2_export_and_scores_our_candidates() {
    speculators_reads("tiny-cpu-dflash2.toml", "dflash2");
}

/// Trains `config` two steps, exports it in the standard `hf` layout, runs z-lab's own loader
/// on it and compares its logits (and DFlash2's greedy selector path) with ours.
fn zlab_reads(config: &str, model: &str) -> f64 {
    let run = Exported::new(config, &["hf"]);
    let summary = run_script(
        "zlab_forward.py",
        &[
            &run.path("hf"),
            &run.path("target"),
            &run.path("inputs.safetensors"),
            &run.path("theirs.safetensors"),
        ],
    );
    assert_eq!(summary["dflash_version"], "0.1.0", "{summary}");
    assert_eq!(summary["model"], model, "{summary}");
    let theirs = run.theirs();
    let ours = our_block(&run.path("hf"), &run.path("target"), &run.inputs);
    let mut logits = ours.logits.get(0);
    if let Some(selector) = ours.loaded.drafter.selector() {
        // z-lab's decoder walks the selector over slots 1.. from the anchor token.
        logits = selector.unary(&logits);
        let slots = ours.loaded.config.block_size - 1;
        let (scores, ids) = selector.candidates(&logits.narrow(0, 1, slots).unsqueeze(0));
        let path = selector.greedy_path(
            &ids,
            &scores,
            &ours.hidden.narrow(1, 1, slots),
            &ours.block_tokens.narrow(0, 0, 1),
        );
        assert_eq!(
            Vec::<i64>::try_from(path.get(0)).unwrap(),
            Vec::<i64>::try_from(&theirs["path"]).unwrap(),
            "the selector's greedy path"
        );
    }
    let d = max_difference("logits", &logits, &theirs["logits"]);
    eprintln!("z-lab {model}: max |ours − theirs| logits {d:.3e}");
    assert!(
        d <= TOLERANCE,
        "{model} logits: max difference {d} > {TOLERANCE}"
    );
    d
}

#[test]
#[ignore = "soak: imports transformers and z-lab's dflash (`make soak` syncs the loaders group)"]
fn zlabs_dflash2_draft_model_loads_a_dflash2_export_and_walks_our_selector_path() {
    zlab_reads("tiny-cpu-dflash2.toml", "DFlash2DraftModel");
}

#[test]
#[ignore = "soak: imports transformers and z-lab's dflash (`make soak` syncs the loaders group)"]
fn zlabs_dflash_draft_model_loads_a_dflash_export_and_drafts_our_logits() {
    zlab_reads("tiny-cpu-dflash.toml", "DFlashDraftModel");
}

/// What SGLang's loader did with the export in one SGLANG_RAGGED_VERIFY_MODE (the script's
/// `ragged_verify_<mode>`): it left no parameter unloaded, each holds the export's tensors bit
/// for bit, and the export's tensors it did not consume are `unconsumed`.
fn assert_sglang_loaded(summary: &serde_json::Value, mode: &str, unconsumed: &[&str]) {
    let report = &summary[format!("ragged_verify_{mode}")];
    let names = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .unwrap_or_else(|| panic!("{mode}: no {key} in {summary}"))
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names("unloaded"), Vec::<String>::new(), "{mode}: {report}");
    assert_eq!(names("differ"), Vec::<String>::new(), "{mode}: {report}");
    assert_eq!(names("unconsumed"), unconsumed, "{mode}: {report}");
    assert_eq!(report["markov_head"], "VanillaMarkov", "{report}");
}

/// SGLang 0.5.23's own `Qwen3DSparkModel` (`scripts/loaders/sglang_dspark.py`) is built on CPU
/// from a tiny DSpark drafter's `--format sglang --dtype f32` export and loads its weights
/// through SGLang's loader: every parameter is loaded, bit for bit the export's (the fused
/// `qkv_proj` / `gate_up_proj` too), and every tensor is consumed; with SGLang's default
/// SGLANG_RAGGED_VERIFY_MODE (`static`) it builds no confidence head and skips exactly that
/// head's tensors. Its Markov head stepped over a block and its confidence head's `predict`
/// give our drafter's bias, confidence logit and confidence on the same hidden states and
/// tokens. SGLang's full draft forward is not run (attention backends, CUDA).
#[test]
#[ignore = "soak: imports sglang (`make soak` syncs the loaders group)"]
fn sglangs_dspark_model_loads_a_sglang_export_exactly_and_its_heads_give_ours() {
    let run = trained_run_of(Some("tiny-cpu-dspark.toml"), 2);
    let export_dir = run.path().join("sglang");
    let o = export(
        run.path(),
        &export_dir,
        &["--dtype", "f32", "--format", "sglang"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Our reader reads the same files SGLang does.
    let loaded = load_hf(&export_dir, Device::Cpu, Kind::Float).unwrap();
    let cfg = &loaded.config;
    let rng = dflash_engine::device::global_rng::seeded(35);
    let hidden = Tensor::randn(
        [1, cfg.block_size, cfg.hidden_size],
        (Kind::Float, Device::Cpu),
    );
    // The token each slot reads (the anchor's for slot 0), below the MASK id.
    let prev = Tensor::randint(
        cfg.vocab_size - 1,
        [1, cfg.block_size],
        (Kind::Int64, Device::Cpu),
    );
    drop(rng);
    let inputs = run.path().join("inputs.safetensors");
    let theirs_path = run.path().join("theirs.safetensors");
    Tensor::write_safetensors(&[("hidden", &hidden), ("prev_tokens", &prev)], &inputs).unwrap();
    let summary = run_python(
        "sglang_dspark.py",
        &[
            export_dir.into_os_string(),
            inputs.into_os_string(),
            theirs_path.clone().into_os_string(),
        ],
    );
    assert_eq!(summary["sglang_version"], "0.5.23", "{summary}");
    assert_eq!(summary["model"], "Qwen3DSparkModel", "{summary}");
    assert_sglang_loaded(&summary, "cap-accept", &[]);
    assert_eq!(
        summary["ragged_verify_cap-accept"]["confidence_head_built"],
        true
    );
    assert_sglang_loaded(
        &summary,
        "static",
        &["confidence_head.proj.bias", "confidence_head.proj.weight"],
    );
    assert_eq!(
        summary["ragged_verify_static"]["confidence_head_built"],
        false
    );

    let theirs: BTreeMap<String, Tensor> = Tensor::read_safetensors(&theirs_path)
        .unwrap()
        .into_iter()
        .collect();
    let dspark = loaded.drafter.dspark().expect("a DSpark drafter");
    let (bias, logit) = tch::no_grad(|| {
        let markov = dspark.markov().expect("a Markov head");
        (
            markov.block_bias(&prev, &hidden).get(0),
            dspark
                .confidence_logit(&hidden, &prev)
                .expect("a confidence head")
                .get(0),
        )
    });
    let ours = [
        ("markov_bias", bias),
        ("confidence", logit.sigmoid()),
        ("confidence_logit", logit),
    ];
    assert_eq!(
        theirs.keys().collect::<Vec<_>>(),
        ["confidence", "confidence_logit", "markov_bias"]
    );
    let differences: Vec<(&str, f64)> = ours
        .iter()
        .map(|(name, t)| (*name, max_difference(name, t, &theirs[*name])))
        .collect();
    eprintln!(
        "sglang dspark: weights bit for bit ({} tensors); max |ours − theirs| {differences:?}",
        summary["ragged_verify_cap-accept"]["consumed"]
    );
    for (name, d) in &differences {
        assert!(*d <= TOLERANCE, "{name}: max difference {d} > {TOLERANCE}");
    }
}
