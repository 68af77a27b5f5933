//! The arguments of `dflashd eval`, offline and `--online`, and the offline options they give:
//! one home for both halves of the command (`eval.rs`, `eval_online.rs`).
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use dflash_engine::decode::Sampling;
use dflash_engine::model::drafter::AttentionBackend;
use dflash_engine::train::eval::EvalOptions;
use dflash_engine::train::labels::{default_gamma, LabelMaskRule};
use dflash_shared::config::DpaceNormalization;

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

/// `--serve-tree-budget`: a positive node count.
fn serve_tree_budget(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(b) if b > 0 => Ok(b),
        _ => Err(format!(
            "expected the DDTree node budget the drafter is served with, a positive integer \
             (default {}), found {text:?}",
            dflash_shared::config::DEFAULT_SERVE_TREE_BUDGET
        )),
    }
}

/// `--dpace-alpha`: a number in [0, 1].
fn dpace_alpha(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(a) if a.is_finite() && (0.0..=1.0).contains(&a) => Ok(a),
        _ => Err(format!(
            "expected a number in [0, 1] (D-PACE smooths the drafter's confidence as \
             (1−α)·q + α; SpecForge uses 0.5), found {text:?}"
        )),
    }
}

/// `--dpace-normalization`: one of `training.dpace_normalization`'s values.
fn dpace_normalization(text: &str) -> Result<DpaceNormalization, String> {
    DpaceNormalization::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = DpaceNormalization::ALL.iter().map(|n| n.as_str()).collect();
        format!(
            "expected one of {} (what D-PACE's sum is divided by, as \
             training.dpace_normalization names it), found {text:?}",
            names.join(", ")
        )
    })
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Target model directory (HF layout).
    #[arg(long)]
    pub target: PathBuf,
    /// Drafter directory in the published DFlash layout (`config.json` + safetensors).
    #[arg(long)]
    pub drafter: PathBuf,
    /// JSONL data for the offline evaluation: pre-tokenized (`input_ids` + `loss_mask`) or chat
    /// (`conversations`, rendered with the target's `tokenizer.json` and chat template).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Decode prompts with the drafter against the target (speculative decoding) and report the
    /// served acceptance; needs `--prompts`.
    #[arg(long)]
    pub online: bool,
    /// JSONL prompts for `--online`: `{"input_ids": [...]}` or a chat row (`conversations`; the
    /// prompt is the row without its closing assistant answer, with the generation prompt).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub decoding: OnlineArgs,
    /// Data format (offline); `auto` looks at the first non-blank line.
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
    /// Evaluate only the first N samples (offline).
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Truncate samples to this many tokens (offline; default 4096).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Loss decay γ (default: the paper value for the drafter's block size).
    #[arg(long)]
    pub gamma: Option<f64>,
    /// D-PACE's smoothing α for `loss_dpace`, in [0, 1] (SpecForge's default 0.5).
    #[arg(long, default_value_t = dflash_shared::config::DEFAULT_DPACE_ALPHA, value_parser = dpace_alpha)]
    pub dpace_alpha: f64,
    /// What `loss_dpace` divides the rows' D-PACE sums by, as `training.dpace_normalization`
    /// names it: sequences (default), weight_sum, anchors_per_sequence, tokens_per_sequence.
    #[arg(long, default_value = "sequences", value_parser = dpace_normalization)]
    pub dpace_normalization: DpaceNormalization,
    /// The DDTree budget the drafter is served with: the headline tree figure, `tau_tree_serve`
    /// (offline; scored besides `--tree-budget`'s).
    #[arg(long, default_value_t = dflash_shared::config::DEFAULT_SERVE_TREE_BUDGET, value_parser = serve_tree_budget)]
    pub serve_tree_budget: usize,
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

/// The decoding flags; each applies to `--online` only (`eval.rs` refuses them without it),
/// but `--tree-budget`, which offline sets the DDTree oracle's budgets.
#[derive(Args, Debug, Default)]
pub struct OnlineArgs {
    /// New tokens per prompt at most (online; default 256). Generation also stops after a stop
    /// token of the target (`eos_token_id` of its `generation_config.json`, else `config.json`).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling temperature (online); 0 or absent is greedy, where the output must equal the
    /// target's own greedy output token for token.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample from the K most likely tokens only (online, with --temperature > 0).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose mass reaches P (online, with --temperature).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Seed of the draws (online); prompt i uses seed + i. Default 0.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Decode only the first N prompts of the file (online; every line is still checked).
    #[arg(long)]
    pub max_prompts: Option<usize>,
    /// DDTree node budgets, e.g. `16,32,64`. Online (greedy): besides the chain, one
    /// `ddtree_<budget>` method per budget. Offline: the budgets of the DDTree oracle τ
    /// (default 8,16,32,64).
    #[arg(long, value_delimiter = ',')]
    pub tree_budget: Vec<usize>,
}

impl OnlineArgs {
    /// The flags given, by name (for the error when they come without `--online`).
    pub fn given_flags(&self) -> Vec<&'static str> {
        [
            (self.max_new_tokens.is_some(), "--max-new-tokens"),
            (self.temperature.is_some(), "--temperature"),
            (self.top_k.is_some(), "--top-k"),
            (self.top_p.is_some(), "--top-p"),
            (self.seed.is_some(), "--seed"),
            (self.max_prompts.is_some(), "--max-prompts"),
        ]
        .iter()
        .filter_map(|&(given, flag)| given.then_some(flag))
        .collect()
    }

    /// Greedy for no or a zero temperature; top-k / top-p need sampling.
    pub(super) fn sampling(&self) -> Result<Sampling> {
        let sampling = match self.temperature {
            None | Some(0.0) => {
                if self.top_k.is_some() || self.top_p.is_some() {
                    bail!(
                        "--top-k and --top-p shape sampling; greedy decoding ignores them, so \
                         give --temperature > 0 with them (or drop them)"
                    );
                }
                Sampling::Greedy
            }
            Some(temperature) => Sampling::Sample {
                temperature,
                top_k: self.top_k,
                top_p: self.top_p,
            },
        };
        sampling
            .validate()
            .map_err(|e| anyhow::anyhow!("{e} (--temperature / --top-k / --top-p)"))?;
        Ok(sampling)
    }
}

/// The offline options, shared by `--data` and the offline τ of `--online`'s continuations.
pub(super) fn eval_options(args: &EvalArgs, block_size: usize) -> EvalOptions {
    EvalOptions {
        anchors_per_forward: args.anchors_per_forward,
        rows_per_forward: args.rows_per_forward,
        gamma: args.gamma.unwrap_or_else(|| default_gamma(block_size)),
        rule: LabelMaskRule::Independent,
        chunk_positions: 2048,
        backend: args.attention,
        dpace_alpha: args.dpace_alpha,
        dpace_normalization: args.dpace_normalization,
        tree_budgets: oracle_budgets(args),
        serve_tree_budget: Some(args.serve_tree_budget),
        // `dflashd eval` is the figure of record: its oracle scores every block.
        tree_block_subsample: 1,
        // A DSpark drafter is scored at SpecForge's loss weights: a drafter directory does not
        // record the run's.
        dspark: Default::default(),
        // A DFlash2 drafter at SpecForge's default α, likewise.
        selector_alpha: dflash_shared::config::DEFAULT_SELECTOR_LOSS_ALPHA,
    }
}

/// The DDTree oracle's budgets: `--tree-budget`'s, else the configs' default.
pub(super) fn oracle_budgets(args: &EvalArgs) -> Vec<usize> {
    match args.decoding.tree_budget.as_slice() {
        [] => dflash_shared::config::DEFAULT_TREE_BUDGETS.to_vec(),
        given => given.to_vec(),
    }
}
