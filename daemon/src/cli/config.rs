//! `dflashd config validate FILE` and `dflashd config show [FILE]`.
//!
//! `validate` exits 0 for a valid file (printing any non-fatal remarks) and 1 with every
//! problem listed, each naming the key path, its line, what was expected and what was found.
//! `show` prints the effective config, every default filled in; it parses back to the same
//! config, so it is a complete starting point for a new run.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dflash_shared::config::{Config, EMBEDDED_ORIGIN};

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Check a run config; exit 1 with every problem named by key and line.
    Validate { file: PathBuf },
    /// Print the effective config (every default filled in). No FILE: the embedded default.
    Show { file: Option<PathBuf> },
}

/// Reads and validates a config file; the error lists every problem.
pub fn load_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    Ok(Config::from_toml_str(&text, &path.display().to_string())?)
}

pub fn run(args: ConfigArgs) -> Result<ExitCode> {
    match args.command {
        ConfigCommand::Validate { file } => {
            let config = match load_config(&file) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("dflashd: {e:#}");
                    return Ok(ExitCode::FAILURE);
                }
            };
            for warning in config.warnings() {
                println!("warning: {warning}");
            }
            println!(
                "{}: valid (run '{}', {} epochs, block size {}, target layers {:?})",
                file.display(),
                config.run.name,
                config.training.epochs,
                config.drafter.block_size,
                config.drafter.target_layer_ids
            );
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Show { file } => {
            let (config, origin) = match &file {
                Some(path) => (load_config(path)?, path.display().to_string()),
                None => (Config::embedded_default(), EMBEDDED_ORIGIN.to_string()),
            };
            println!("# effective config of {origin}, every default filled in");
            print!("{}", config.to_toml_string());
            Ok(ExitCode::SUCCESS)
        }
    }
}
