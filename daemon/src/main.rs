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
    /// Target hidden states at tap layers for a token sequence, written as safetensors.
    Features(cli::features::FeaturesArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor => cli::doctor::run(),
        Command::Features(args) => cli::features::run(args),
    }
}
