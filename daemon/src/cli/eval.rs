//! `dflashd eval --target DIR --drafter DIR --data FILE [--json]`: offline acceptance length τ,
//! per-position acceptance, recall@k per position and loss (spec §5), with deterministic
//! anchors at every valid position of every sample.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dflash_engine::data::{load, ChatEncoder, ChatOptions, DataFormat, LoadOptions, Sample};
use dflash_engine::device::compute_kind;
use dflash_engine::model::drafter::AttentionBackend;
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::drafter_io::load_hf;
use dflash_engine::train::eval::{evaluate, EvalOptions};
use dflash_engine::train::labels::{default_gamma, LabelMaskRule};
use tch::Kind;

use super::parse_device;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Auto,
    Pretokenized,
    Chat,
}

/// `--attention`: `block-sparse` or `dense-mask`.
fn attention_backend(name: &str) -> Result<AttentionBackend, String> {
    match name {
        "block-sparse" => Ok(AttentionBackend::BlockSparse),
        "dense-mask" => Ok(AttentionBackend::DenseMask),
        other => Err(format!(
            "expected block-sparse or dense-mask, found {other:?}"
        )),
    }
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Target model directory (HF layout).
    #[arg(long)]
    pub target: PathBuf,
    /// Drafter directory in the published DFlash layout (`config.json` + safetensors).
    #[arg(long)]
    pub drafter: PathBuf,
    /// JSONL data: pre-tokenized (`input_ids` + `loss_mask`) or chat (`conversations`, rendered
    /// with the target's `tokenizer.json` and chat template).
    #[arg(long)]
    pub data: PathBuf,
    /// Data format; `auto` looks at the first non-blank line.
    #[arg(long, value_enum, default_value = "auto")]
    pub format: FormatArg,
    /// Chat template file for chat data (default: the target directory's template).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype `f32` or `bf16` (default: bf16 on CUDA, f32 on CPU).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Evaluate only the first N samples.
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Truncate samples to this many tokens.
    #[arg(long, default_value_t = 4096)]
    pub max_len: usize,
    /// Loss decay γ (default: the paper value for the drafter's block size).
    #[arg(long)]
    pub gamma: Option<f64>,
    /// Anchors per sequence in one forward pass (bounds memory).
    #[arg(long, default_value_t = 256)]
    pub anchors_per_forward: usize,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 4)]
    pub rows_per_forward: usize,
    #[arg(long, default_value = "block-sparse", value_parser = attention_backend)]
    pub attention: AttentionBackend,
    /// CPU threads for libtorch (default: libtorch's choice).
    #[arg(long)]
    pub threads: Option<i32>,
}

pub fn run(args: EvalArgs) -> Result<()> {
    let device = parse_device(&args.device)?;
    if let Some(n) = args.threads {
        if n < 1 {
            bail!("--threads: expected at least 1, found {n}");
        }
        tch::set_num_threads(n);
    }
    let kind = match args.dtype.as_deref() {
        None => compute_kind(device),
        Some("f32" | "float32") => Kind::Float,
        Some("bf16" | "bfloat16") => Kind::BFloat16,
        Some(other) => bail!("--dtype: expected `f32` or `bf16`, found `{other}`"),
    };
    let target = TargetModel::load(&args.target, device, Some(kind))?;
    let drafter = load_hf(&args.drafter, device, kind)?;
    let opts = LoadOptions {
        max_length: args.max_len,
        vocab_size: Some(target.config().vocab_size() as usize),
        threads: 0,
        max_line_bytes: dflash_shared::config::sections::DEFAULT_MAX_LINE_BYTES.bytes(),
    };
    let format = match args.format {
        FormatArg::Auto if looks_like_chat(&args.data)? => FormatArg::Chat,
        FormatArg::Auto => FormatArg::Pretokenized,
        other => other,
    };
    let encoder = match format {
        FormatArg::Chat => Some(ChatEncoder::from_model_dir(
            &args.target,
            args.chat_template.as_deref(),
            ChatOptions::default(),
        )?),
        _ => None,
    };
    let data_format = match &encoder {
        Some(e) => DataFormat::Chat(e),
        None => DataFormat::Pretokenized,
    };
    let (samples, report) = load(&args.data, data_format, &opts)?;
    for bad in &report.bad_lines {
        eprintln!("data: {bad} (skipped)");
    }
    for line in &report.skipped_too_short {
        eprintln!(
            "data: {}:{line}: no two consecutive supervised tokens, nothing to evaluate (skipped)",
            args.data.display()
        );
    }
    let limit = args.max_samples.unwrap_or(usize::MAX);
    let chosen: Vec<&Sample> = samples.iter().take(limit).collect();
    let bs = drafter.config.block_size as usize;
    let eval_opts = EvalOptions {
        anchors_per_forward: args.anchors_per_forward,
        rows_per_forward: args.rows_per_forward,
        gamma: args.gamma.unwrap_or_else(|| default_gamma(bs)),
        rule: LabelMaskRule::Independent,
        chunk_positions: 2048,
        backend: args.attention,
    };
    let result = evaluate(&target, &drafter.drafter, &chosen, &eval_opts)?;
    if args.json {
        let mut value = serde_json::to_value(&result)?;
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "data".into(),
                report.to_json(&args.data.display().to_string()),
            );
        }
        println!("{}", serde_json::to_string(&value)?);
        return Ok(());
    }
    println!(
        "data: {}; evaluated {} samples, {} blocks, {} draft positions",
        report.summary(),
        result.samples,
        result.blocks,
        result.positions
    );
    println!("tau (acceptance length): {:.4}", result.tau);
    println!(
        "loss: {:.4}   top-1 accuracy: {:.4}",
        result.loss, result.accuracy
    );
    print!("{:>4} {:>10}", "k", "accept");
    for k in result.recall_at_k.keys() {
        print!(" {:>9}", format!("recall@{k}"));
    }
    println!();
    for (i, acc) in result.per_position_acceptance.iter().enumerate() {
        print!("{:>4} {:>10.4}", i + 1, acc);
        for recall in result.recall_at_k.values() {
            print!(" {:>9.4}", recall[i]);
        }
        println!();
    }
    Ok(())
}

/// True when the first non-blank line is a JSON object with a `conversations` key.
fn looks_like_chat(path: &Path) -> Result<bool> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read data file {}", path.display()))?;
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("cannot read data file {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line.trim_start_matches('\u{feff}')).unwrap_or_default();
        return Ok(value.get("conversations").is_some());
    }
    Ok(false)
}
