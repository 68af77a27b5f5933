use anyhow::Result;
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
    /// Train (with no config: the embedded tiny default on the CPU).
    Start(cli::start::StartArgs),
    /// Offline evaluation of a drafter: τ, per-position acceptance, recall@k, loss.
    Eval(cli::eval::EvalArgs),
    /// Write a checkpoint's drafter in the Hugging Face layout.
    Export(cli::export::ExportArgs),
    /// Target hidden states at tap layers for a token sequence, written as safetensors.
    Features(cli::features::FeaturesArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor => cli::doctor::run(),
        Command::Start(args) => cli::start::run(args),
        Command::Eval(args) => cli::eval::run(args),
        Command::Export(args) => cli::export::run(args),
        Command::Features(args) => cli::features::run(args),
    }
}
