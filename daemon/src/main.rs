use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dflashd::cli;

/// dflashd — trains DFlash speculative-decoding drafters and guards the run.
#[derive(Parser)]
#[command(name = "dflashd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what this binary runs on: libtorch, CUDA, devices, NVML.
    Doctor,
    /// Start the daemon: control socket, journal, telemetry, and training (with no config:
    /// the embedded tiny default on the CPU).
    Start(cli::start::StartArgs),
    /// Validate a run config, or print the effective one.
    Config(cli::config::ConfigArgs),
    /// Offline evaluation of a drafter: τ, per-position acceptance, recall@k, loss.
    Eval(cli::eval_args::EvalArgs),
    /// Write a checkpoint's drafter in the Hugging Face layout.
    Export(cli::export::ExportArgs),
    /// Target hidden states at tap layers for a token sequence, written as safetensors.
    Features(cli::features::FeaturesArgs),
    /// Predict each device's memory, the FLOPs, tokens/s and the best split of a run config.
    Plan(cli::plan::PlanArgs),
    /// Replace the assistant turns of chat data with the target's own replies (greedy or
    /// sampled), resumable, for training on the target's distribution.
    Regenerate(cli::regenerate::RegenerateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Doctor => done(cli::doctor::run()),
        Command::Start(args) => cli::start::run(args),
        Command::Config(args) => cli::config::run(args),
        Command::Eval(args) => done(cli::eval::run(args)),
        Command::Export(args) => done(cli::export::run(args)),
        Command::Features(args) => done(cli::features::run(args)),
        Command::Plan(args) => done(cli::plan::run(args)),
        Command::Regenerate(args) => done(cli::regenerate::run(args)),
    };
    result.unwrap_or_else(|e| {
        eprintln!("dflashd: {e:#}");
        ExitCode::FAILURE
    })
}
