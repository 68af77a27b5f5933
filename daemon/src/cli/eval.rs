//! `dflashd eval --target DIR --drafter DIR --data FILE [--json]`: offline acceptance length τ,
//! per-position acceptance, top-K recall per position and loss (spec §5), with deterministic
//! anchors at every valid position of every sample, and the DDTree oracle τ at each
//! `--tree-budget` (headline: `--serve-tree-budget`), the tree DDTree would build at each block
//! scored by its deepest gold prefix.
//!
//! With `--online --prompts FILE` it decodes instead (`eval_online.rs`); this file chooses
//! between the two and loads what both need.
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{bail, Context, Result};
use dflash_engine::data::{load, ChatEncoder, ChatOptions, DataFormat, LoadOptions, Sample};
use dflash_engine::device::compute_kind;
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::drafter_io::{load_hf, LoadedDrafter};
use dflash_engine::train::eval::{evaluate, EvalReport};
use tch::Kind;

use super::eval_args::{eval_options, EvalArgs, FormatArg};
use super::eval_online;
use super::parse_device;

/// `--max-len` when not given (offline only).
const DEFAULT_MAX_LEN: usize = 4096;

/// Which evaluation the arguments ask for, with its input file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input<'a> {
    Offline(&'a Path),
    Online(&'a Path),
}

/// The one place the offline/online flag combinations are judged.
fn choose_input(args: &EvalArgs) -> Result<Input<'_>> {
    let online_flags = args.decoding.given_flags();
    match (args.online, &args.data, &args.prompts) {
        (true, Some(_), _) => bail!(
            "--data is the offline input (rows with their answers); with --online give the \
             prompts to decode as --prompts FILE"
        ),
        (true, None, None) => bail!(
            "--online needs --prompts FILE: JSONL with one {{\"input_ids\": [...]}} or \
             {{\"conversations\": [...]}} a line"
        ),
        (true, None, Some(prompts)) => {
            let offline_only: Vec<&str> = [
                (args.format != FormatArg::Auto, "--format"),
                (args.max_samples.is_some(), "--max-samples"),
                (args.max_len.is_some(), "--max-len"),
            ]
            .iter()
            .filter_map(|&(given, flag)| given.then_some(flag))
            .collect();
            if !offline_only.is_empty() {
                bail!(
                    "{} apply to the offline evaluation (--data) only; with --online, \
                     --max-prompts limits the prompts and each line's shape sets its format",
                    offline_only.join(", ")
                );
            }
            Ok(Input::Online(prompts))
        }
        (false, _, Some(_)) => bail!(
            "--prompts is the online input; add --online to decode them (or give --data FILE \
             for the offline evaluation)"
        ),
        (false, None, None) => bail!(
            "nothing to evaluate: give --data FILE for the offline evaluation, or --online \
             --prompts FILE for the served acceptance"
        ),
        (false, Some(data), None) if !online_flags.is_empty() => bail!(
            "{} apply to --online only; add --online --prompts FILE (instead of --data {})",
            online_flags.join(", "),
            data.display()
        ),
        (false, Some(data), None) => Ok(Input::Offline(data)),
    }
}

/// The target and the drafter, on `--device` in `--dtype`.
fn load_models(args: &EvalArgs) -> Result<(TargetModel, LoadedDrafter)> {
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
    Ok((target, drafter))
}

pub fn run(args: EvalArgs) -> Result<()> {
    let data = match choose_input(&args)? {
        Input::Online(prompts) => {
            let prompts = prompts.to_path_buf();
            let (target, drafter) = load_models(&args)?;
            return eval_online::run(&args, &prompts, &target, &drafter);
        }
        Input::Offline(data) => data.to_path_buf(),
    };
    if args.decoding.tree_budget.contains(&0) {
        bail!("--tree-budget 0 drafts no node; give budgets ≥ 1, e.g. --tree-budget 8,16,32,64");
    }
    let (target, drafter) = load_models(&args)?;
    let opts = LoadOptions {
        max_length: args.max_len.unwrap_or(DEFAULT_MAX_LEN),
        vocab_size: Some(target.config().vocab_size() as usize),
        threads: 0,
        max_line_bytes: dflash_shared::config::sections::DEFAULT_MAX_LINE_BYTES.bytes(),
    };
    let format = match args.format {
        FormatArg::Auto if looks_like_chat(&data)? => FormatArg::Chat,
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
    let (samples, report) = load(&data, data_format, &opts)?;
    for bad in &report.bad_lines {
        eprintln!("data: {bad} (skipped)");
    }
    for line in &report.skipped_too_short {
        eprintln!(
            "data: {}:{line}: no two consecutive supervised tokens, nothing to evaluate (skipped)",
            data.display()
        );
    }
    let limit = args.max_samples.unwrap_or(usize::MAX);
    let chosen: Vec<&Sample> = samples.iter().take(limit).collect();
    let eval_opts = eval_options(&args, drafter.config.block_size as usize);
    let result = evaluate(&target, &drafter.drafter, &chosen, &eval_opts)?;
    if args.json {
        let mut value = serde_json::to_value(&result)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("data".into(), report.to_json(&data.display().to_string()));
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
    if let Some(base) = result.base_tau {
        println!("base_tau (Domino's LM-head logits alone, without its correction): {base:.4}");
    }
    println!(
        "loss: {:.4}   top-1 accuracy: {:.4}",
        result.loss, result.accuracy
    );
    println!(
        "loss_dflash (γ-weighted, pooled): {:.4}   loss_dpace (α {}, divided by {}): {:.4}",
        result.loss_dflash,
        result.dpace_alpha,
        result.dpace_normalization.as_str(),
        result.loss_dpace
    );
    print_tree_oracle(&result);
    print!("{:>4} {:>10}", "k", "accept");
    for k in result.topk_recall.keys() {
        print!(" {:>9}", format!("top{k}"));
    }
    println!();
    for (i, acc) in result.per_position_acceptance.iter().enumerate() {
        print!("{:>4} {:>10.4}", i + 1, acc);
        for recall in result.topk_recall.values() {
            print!(" {:>9.4}", recall[i]);
        }
        println!();
    }
    Ok(())
}

/// The DDTree oracle's line: the serving budget's τ first, then every budget's.
fn print_tree_oracle(result: &EvalReport) {
    if let (Some(budget), Some(tau)) = (result.serve_tree_budget, result.tau_tree_serve) {
        println!(
            "tree tau (DDTree oracle at the serving budget {budget}): {tau:.4}   chain tau: {:.4}",
            result.tau
        );
    }
    if !result.tau_tree_oracle.is_empty() {
        let all: Vec<String> = result
            .tau_tree_oracle
            .iter()
            .map(|(b, tau)| format!("{b}: {tau:.4}"))
            .collect();
        println!("tree tau by budget: {}", all.join("   "));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::eval_args::oracle_budgets;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        eval: EvalArgs,
    }

    fn parsed(extra: &[&str]) -> EvalArgs {
        let mut argv = vec!["dflashd", "--target", "t", "--drafter", "d"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().eval
    }

    fn refusal(extra: &[&str]) -> String {
        choose_input(&parsed(extra)).unwrap_err().to_string()
    }

    #[test]
    fn data_is_offline_and_online_prompts_are_online() {
        let offline = parsed(&["--data", "d.jsonl"]);
        assert_eq!(
            choose_input(&offline).unwrap(),
            Input::Offline(Path::new("d.jsonl"))
        );
        let online = parsed(&["--online", "--prompts", "p.jsonl", "--max-new-tokens", "8"]);
        assert_eq!(
            choose_input(&online).unwrap(),
            Input::Online(Path::new("p.jsonl"))
        );
    }

    #[test]
    fn wrong_combinations_say_what_to_give() {
        assert!(refusal(&["--online"]).contains("--online needs --prompts FILE"));
        assert!(refusal(&["--online", "--data", "d.jsonl"]).contains("give the prompts"));
        assert!(refusal(&["--prompts", "p.jsonl"]).contains("add --online"));
        assert!(refusal(&[]).contains("give --data FILE"));
        let err = refusal(&["--data", "d.jsonl", "--temperature", "0.5", "--seed", "3"]);
        assert!(
            err.contains("--temperature, --seed apply to --online only"),
            "{err}"
        );
        let err = refusal(&["--online", "--prompts", "p", "--max-samples", "3"]);
        assert!(err.contains("--max-samples apply to the offline"), "{err}");
    }

    #[test]
    fn tree_budgets_default_to_the_configs_and_the_serving_budget_must_be_positive() {
        let plain = parsed(&["--data", "d.jsonl"]);
        assert_eq!(oracle_budgets(&plain), vec![8, 16, 32, 64]);
        assert_eq!(plain.serve_tree_budget, 32);
        let given = parsed(&[
            "--data",
            "d.jsonl",
            "--tree-budget",
            "4,12",
            "--serve-tree-budget",
            "12",
        ]);
        assert_eq!(oracle_budgets(&given), vec![4, 12]);
        let opts = eval_options(&given, 8);
        assert_eq!(
            (opts.tree_budgets, opts.serve_tree_budget),
            (vec![4, 12], Some(12))
        );
        assert!(
            choose_input(&given).is_ok(),
            "--tree-budget is an offline flag too"
        );
        for bad in ["0", "-1", "x"] {
            let flag = format!("--serve-tree-budget={bad}");
            let argv = ["dflashd", "--target", "t", "--drafter", "d", flag.as_str()];
            let err = Cli::try_parse_from(argv).err().unwrap().to_string();
            assert!(
                err.contains("a positive integer (default 32)"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn dpace_normalization_defaults_to_the_sequences_and_names_its_choices() {
        use dflash_shared::config::DpaceNormalization;
        assert_eq!(
            parsed(&[]).dpace_normalization,
            DpaceNormalization::Sequences
        );
        assert_eq!(
            parsed(&["--dpace-normalization", "anchors_per_sequence"]).dpace_normalization,
            DpaceNormalization::AnchorsPerSequence
        );
        let argv = [
            "dflashd",
            "--target",
            "t",
            "--drafter",
            "d",
            "--dpace-normalization=rows",
        ];
        let err = Cli::try_parse_from(argv).err().unwrap().to_string();
        assert!(
            err.contains(
                "expected one of sequences, weight_sum, anchors_per_sequence, tokens_per_sequence"
            ),
            "{err}"
        );
    }

    #[test]
    fn dpace_alpha_defaults_to_one_half_and_must_lie_in_the_unit_interval() {
        assert_eq!(parsed(&[]).dpace_alpha, 0.5);
        assert_eq!(parsed(&["--dpace-alpha", "0.25"]).dpace_alpha, 0.25);
        for bad in ["1.5", "-0.1", "nan", "x"] {
            let flag = format!("--dpace-alpha={bad}");
            let argv = ["dflashd", "--target", "t", "--drafter", "d", flag.as_str()];
            let err = Cli::try_parse_from(argv).err().unwrap().to_string();
            assert!(err.contains("a number in [0, 1]"), "{bad}: {err}");
        }
    }
}
