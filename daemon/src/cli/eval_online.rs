//! `dflashd eval --online --target DIR --drafter DIR --prompts FILE [--max-new-tokens N]
//! [--temperature T] [--top-k K] [--top-p P] [--seed S] [--max-prompts N] [--json]`: the
//! served acceptance. Every method decodes every prompt against the target (the engine's
//! `decode::run_online`), beside the target alone, and the offline τ of the same drafter on the
//! target's greedy continuations of the same prompts puts the train-versus-serve gap in one
//! place. A Domino drafter decodes with its correction (τ), and every method runs a second
//! time on the LM head's logits alone (`base_tau`), as the offline eval reports both.
use std::path::Path;

use anyhow::{bail, Context, Result};
use dflash_engine::data::{
    load_stop_tokens, read_prompt_rows, tokenize_prompts, ChatEncoder, ChatOptions, Prompt,
    PromptRow, StopTokens,
};
use dflash_engine::decode::{
    run_online, run_online_with, DraftLogits, Method, MethodRun, OnlineReport, Sampling, Settings,
};
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::continuation_eval::{evaluate_greedy_continuations, ContinuationEval};
use dflash_engine::train::drafter_io::LoadedDrafter;
use serde_json::{json, Value};

use super::eval_args::{eval_options, EvalArgs, OnlineArgs};

/// `--max-new-tokens` when not given.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 256;

/// The methods `--online` runs: the chain, then DDTree at each `--tree-budget` (greedy only;
/// each budget once, in the order given).
fn methods(online: &OnlineArgs, sampling: Sampling) -> Result<Vec<Method>> {
    let mut methods = vec![Method::Chain];
    if online.tree_budget.is_empty() {
        return Ok(methods);
    }
    if sampling != Sampling::Greedy {
        bail!(
            "--tree-budget: DDTree verification is greedy (the target's argmax followed down the \
             tree); drop --temperature to run it, or drop --tree-budget to sample with the chain"
        );
    }
    for &budget in &online.tree_budget {
        if budget == 0 {
            bail!("--tree-budget 0 drafts no node; give budgets ≥ 1, e.g. --tree-budget 16,32,64");
        }
        let method = Method::Tree { budget };
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    Ok(methods)
}

pub fn run(
    args: &EvalArgs,
    prompts_path: &Path,
    target: &TargetModel,
    drafter: &LoadedDrafter,
) -> Result<()> {
    let online = &args.decoding;
    let sampling = online.sampling()?;
    let methods = methods(online, sampling)?;
    if online.max_prompts == Some(0) {
        bail!("--max-prompts 0 decodes nothing; give at least 1");
    }
    let vocab = target.config().vocab_size();
    let stop = load_stop_tokens(&args.target)?;
    if let Some(&bad) = stop.ids.iter().find(|&&t| t >= vocab) {
        bail!(
            "{}: stop token {bad} is outside the target's vocabulary 0..{vocab}; fix \
             `eos_token_id` there",
            stop.describe()
        );
    }
    let prompts = load_prompts(args, prompts_path, vocab)?;
    let settings = Settings {
        max_new_tokens: online.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS),
        stop_tokens: stop.ids.clone(),
        sampling,
        seed: online.seed.unwrap_or(0),
    };
    let ids: Vec<Vec<i64>> = prompts.iter().map(|p| p.input_ids.clone()).collect();
    let report = run_online(target, &drafter.drafter, &ids, &settings, &methods)?;
    // Domino, DSpark with a Markov head, DFlash2: the same methods drafting from the LM head
    // alone, what the correction (the Markov head, the selector) adds
    let base = if drafter.drafter.corrects_lm_head() {
        Some(run_online_with(
            target,
            &drafter.drafter,
            &ids,
            &settings,
            &methods,
            DraftLogits::LmHeadOnly,
        )?)
    } else {
        None
    };
    let opts = eval_options(args, drafter.config.block_size as usize);
    let offline = evaluate_greedy_continuations(target, &drafter.drafter, &ids, &report, &opts)?;
    let base_runs = base.iter().flat_map(|b| &b.methods);
    for run in report.methods.iter().chain(base_runs) {
        if run.lossless == Some(false) {
            eprintln!(
                "warning: greedy {} differs from the target alone on prompt line(s) {:?}: the \
                 speculative output must equal the target's (in f32 a bug; in bf16 it can be a \
                 near-tie decided differently by batched and one-token forwards)",
                run.method,
                run.mismatched_prompts
                    .iter()
                    .map(|&i| prompts[i].line)
                    .collect::<Vec<_>>()
            );
        }
    }
    let context = RunContext {
        prompts_path,
        prompts: &prompts,
        stop: &stop,
        block_size: drafter.config.block_size,
        dtype: format!("{:?}", target.kind()),
        device: args.device.clone(),
        base: base.as_ref(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report_json(&report, &offline, &context))?
        );
    } else {
        print_table(&report, &offline, &context);
    }
    Ok(())
}

/// The prompt file's rows, the first `--max-prompts`, tokenized (chat rows with the target
/// directory's tokenizer and chat template, or `--chat-template`).
fn load_prompts(args: &EvalArgs, path: &Path, vocab: i64) -> Result<Vec<Prompt>> {
    let mut rows = read_prompt_rows(path)?;
    rows.rows
        .truncate(args.decoding.max_prompts.unwrap_or(usize::MAX));
    let first_chat = rows.rows.iter().find_map(|(line, row)| match row {
        PromptRow::Chat(_) => Some(*line),
        PromptRow::Tokens(_) => None,
    });
    let encoder = match first_chat {
        Some(line) => Some(
            ChatEncoder::from_model_dir(
                &args.target,
                args.chat_template.as_deref(),
                ChatOptions::default(),
            )
            .with_context(|| {
                format!(
                    "{}:{line} is a chat row, rendered with the target's tokenizer.json and \
                     chat template (--chat-template FILE names another template); give the \
                     target directory both, or give the prompts as input_ids",
                    path.display()
                )
            })?,
        ),
        None => None,
    };
    Ok(tokenize_prompts(path, rows, encoder.as_ref(), vocab)?)
}

/// What the report was computed from, besides the engine's report.
struct RunContext<'a> {
    prompts_path: &'a Path,
    prompts: &'a [Prompt],
    stop: &'a StopTokens,
    block_size: i64,
    dtype: String,
    device: String,
    /// A Domino drafter's methods decoded from the LM head's logits alone.
    base: Option<&'a OnlineReport>,
}

impl RunContext<'_> {
    /// The base-logits run of `method`, for a Domino drafter.
    fn base_run(&self, method: Method) -> Option<&MethodRun> {
        self.base?.methods.iter().find(|r| r.method == method)
    }
}

fn sampling_json(sampling: Sampling) -> Value {
    match sampling {
        Sampling::Greedy => json!({"mode": "greedy", "temperature": 0.0}),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } => json!({"mode": "sample", "temperature": temperature, "top_k": top_k, "top_p": top_p}),
    }
}

fn method_json(run: &MethodRun, ctx: &RunContext<'_>, baseline_tokens_per_s: f64) -> Value {
    let (a, peer) = (&run.acceptance, &run.acceptance_peer_counting);
    let prompts = ctx.prompts;
    let mut value = json!({
        "tau": a.tau,
        "tau_peer_counting": peer.tau,
        "tau_pooled": a.tau_pooled,
        "rounds": a.rounds,
        "rounds_peer_counting": peer.rounds,
        "tokens": run.tokens,
        "seconds": run.seconds,
        "tokens_per_s": run.tokens_per_s(),
        "speedup": speedup(run.tokens_per_s(), baseline_tokens_per_s),
        "lossless": run.lossless,
        "prompts": run.generations.iter().zip(prompts).map(|(g, p)| json!({
            "line": p.line,
            "acceptance_lengths": g.acceptance_lengths,
            "acceptance_lengths_peer_counting": g.peer_acceptance_lengths,
            "output_ids": g.output_ids,
        })).collect::<Vec<_>>(),
    });
    if let Some(base) = ctx.base_run(run.method) {
        let fields = value.as_object_mut().expect("a JSON object");
        fields.insert("base_tau".into(), json!(base.acceptance.tau));
        fields.insert(
            "base_tau_peer_counting".into(),
            json!(base.acceptance_peer_counting.tau),
        );
        fields.insert("base_lossless".into(), json!(base.lossless));
    }
    value
}

fn speedup(tokens_per_s: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0).then(|| tokens_per_s / baseline)
}

/// The one JSON object `--json` prints.
fn report_json(report: &OnlineReport, offline: &ContinuationEval, ctx: &RunContext<'_>) -> Value {
    let target_only = &report.target_only;
    let baseline = target_only.tokens_per_s();
    let methods: serde_json::Map<String, Value> = report
        .methods
        .iter()
        .map(|run| (run.method.name(), method_json(run, ctx, baseline)))
        .collect();
    json!({
        "methods": methods,
        "target_only": {
            "tokens": target_only.tokens,
            "seconds": target_only.seconds,
            "tokens_per_s": baseline,
            "prompts": target_only.generations.iter().zip(ctx.prompts).map(|(g, p)| json!({
                "line": p.line,
                "output_ids": g.output_ids,
            })).collect::<Vec<_>>(),
        },
        "offline_tau": offline.tau(),
        "offline": {
            "blocks": offline.report.blocks,
            "samples": offline.report.samples,
            "too_short": offline.too_short,
            "per_position_acceptance": offline.report.per_position_acceptance,
        },
        "stop_tokens": {
            "ids": ctx.stop.ids,
            "source": ctx.stop.describe(),
        },
        "prompts": {
            "file": ctx.prompts_path.display().to_string(),
            "count": ctx.prompts.len(),
            "lengths": ctx.prompts.iter().map(|p| p.input_ids.len()).collect::<Vec<_>>(),
        },
        "settings": {
            "max_new_tokens": report.settings.max_new_tokens,
            "sampling": sampling_json(report.settings.sampling),
            "seed": report.settings.seed,
            "block_size": ctx.block_size,
            "device": ctx.device,
            "dtype": ctx.dtype,
        },
    })
}

fn figure(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"))
}

fn print_table(report: &OnlineReport, offline: &ContinuationEval, ctx: &RunContext<'_>) {
    let s = &report.settings;
    let sampling = match s.sampling {
        Sampling::Greedy => "greedy".to_string(),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } => format!(
            "temperature {temperature}{}{}, seed {}",
            top_k.map_or(String::new(), |k| format!(", top-k {k}")),
            top_p.map_or(String::new(), |p| format!(", top-p {p}")),
            s.seed
        ),
    };
    println!(
        "prompts: {} from {}; {sampling}; max_new_tokens {}; block size {}",
        ctx.prompts.len(),
        ctx.prompts_path.display(),
        s.max_new_tokens,
        ctx.block_size
    );
    println!("stop tokens: {}", ctx.stop.describe());
    println!(
        "{:<12} {:>7} {:>17} {:>10} {:>7} {:>7} {:>8} {:>9} {:>8} {:>8}",
        "method",
        "tau",
        "tau_peer_counting",
        "tau_pooled",
        "rounds",
        "tokens",
        "seconds",
        "tokens/s",
        "speedup",
        "lossless"
    );
    let t = &report.target_only;
    // one token per forward; the prefill's token is no round, as for the methods
    let target_rounds: usize = t
        .generations
        .iter()
        .map(|g| g.acceptance_lengths.len())
        .sum();
    println!(
        "{:<12} {:>7} {:>17} {:>10} {:>7} {:>7} {:>8.2} {:>9.1} {:>8} {:>8}",
        "target_only",
        "1",
        "1",
        "1",
        target_rounds,
        t.tokens,
        t.seconds,
        t.tokens_per_s(),
        "1",
        "-"
    );
    for run in &report.methods {
        let a = &run.acceptance;
        let lossless = match run.lossless {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:<12} {:>7} {:>17} {:>10} {:>7} {:>7} {:>8.2} {:>9.1} {:>8} {:>8}",
            run.method.name(),
            figure(a.tau),
            figure(run.acceptance_peer_counting.tau),
            figure(a.tau_pooled),
            a.rounds,
            run.tokens,
            run.seconds,
            run.tokens_per_s(),
            figure(speedup(run.tokens_per_s(), t.tokens_per_s())),
            lossless
        );
    }
    println!(
        "tau counts the output's rounds, the last one clipped where the output stops; \
         tau_peer_counting counts them as z-lab's dflash_generate and DDTree's ddtree_generate \
         do, the last one in full (docs/online-acceptance.md)"
    );
    for run in &report.methods {
        if let Some(base) = ctx.base_run(run.method) {
            println!(
                "{} base_tau (Domino's LM-head logits alone, without its correction): {} \
                 (peer counting {})",
                run.method.name(),
                figure(base.acceptance.tau),
                figure(base.acceptance_peer_counting.tau)
            );
        }
    }
    println!(
        "offline tau on the target's greedy continuations: {} ({} blocks{})",
        figure(offline.tau()),
        offline.report.blocks,
        match offline.too_short {
            0 => String::new(),
            n => format!("; {n} continuation(s) under 2 tokens not evaluated"),
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_or_zero_temperature_is_greedy_and_refuses_top_k() {
        let greedy = OnlineArgs::default();
        assert_eq!(greedy.sampling().unwrap(), Sampling::Greedy);
        let zero = OnlineArgs {
            temperature: Some(0.0),
            ..Default::default()
        };
        assert_eq!(zero.sampling().unwrap(), Sampling::Greedy);
        let top_k_alone = OnlineArgs {
            top_k: Some(5),
            ..Default::default()
        };
        let err = top_k_alone.sampling().unwrap_err().to_string();
        assert!(err.contains("--temperature > 0"), "{err}");
    }

    #[test]
    fn sampling_settings_are_checked() {
        let sampled = OnlineArgs {
            temperature: Some(0.7),
            top_p: Some(0.9),
            ..Default::default()
        };
        assert_eq!(
            sampled.sampling().unwrap(),
            Sampling::Sample {
                temperature: 0.7,
                top_k: None,
                top_p: Some(0.9)
            }
        );
        let negative = OnlineArgs {
            temperature: Some(-1.0),
            ..Default::default()
        };
        assert!(negative
            .sampling()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
        let bad_p = OnlineArgs {
            temperature: Some(1.0),
            top_p: Some(1.5),
            ..Default::default()
        };
        assert!(bad_p.sampling().unwrap_err().to_string().contains("top_p"));
    }

    #[test]
    fn given_flags_are_named() {
        let args = OnlineArgs {
            seed: Some(1),
            max_prompts: Some(2),
            ..Default::default()
        };
        assert_eq!(args.given_flags(), vec!["--seed", "--max-prompts"]);
        assert!(OnlineArgs::default().given_flags().is_empty());
    }

    #[test]
    fn tree_budgets_add_ddtree_methods_after_the_chain_greedy_only() {
        let args = OnlineArgs {
            tree_budget: vec![16, 32, 16],
            ..Default::default()
        };
        let names: Vec<String> = methods(&args, Sampling::Greedy)
            .unwrap()
            .iter()
            .map(Method::name)
            .collect();
        assert_eq!(names, vec!["chain", "ddtree_16", "ddtree_32"]);
        let sampled = Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        };
        let err = methods(&args, sampled).unwrap_err().to_string();
        assert!(err.contains("greedy"), "{err}");
        let zero = OnlineArgs {
            tree_budget: vec![0],
            ..Default::default()
        };
        assert!(methods(&zero, Sampling::Greedy).is_err());
        assert_eq!(
            methods(&OnlineArgs::default(), sampled).unwrap(),
            vec![Method::Chain]
        );
    }
}
