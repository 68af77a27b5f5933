//! One file per subcommand. Every command finds the daemon at the default socket unless
//! `--socket` is given.
mod attach;
mod confirm_stop;
mod replay;
mod status;
mod stop;
mod tail;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// dflash-tui: the operator console for dflashd.
#[derive(Debug, Parser)]
#[command(name = "dflash-tui", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach the console to the running daemon.
    Attach(attach::Args),
    /// File a pending stop (or stop + power off) and print its consequences; stops nothing.
    Stop(stop::Args),
    /// List pending stop/power-off requests and confirm one by typing the run name.
    ConfirmStop(confirm_stop::Args),
    /// Stream events, logs and metrics line by line (works in a pipe and over SSH).
    Tail(tail::Args),
    /// Print a status checkpoint built from the daemon's state and journal.
    Status(status::Args),
    /// Play a recorded telemetry and event stream in the console.
    Replay(replay::Args),
}

/// `--socket PATH`, shared by every command that talks to the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArg {
    /// The daemon's control socket [default: $XDG_RUNTIME_DIR/dflash/dflashd.sock, else
    /// <tmp>/dflash-<uid>/dflashd.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

impl SocketArg {
    /// ` --socket PATH` when one was given, so a printed hint reaches the same daemon.
    pub fn flag(&self) -> String {
        match &self.socket {
            Some(path) => dflash_shared::invocation::socket_flag(path, false),
            None => String::new(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(crate::paths::default_socket_path)
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Attach(args) => attach::run(args).await,
        Command::Stop(args) => stop::run(args).await,
        Command::ConfirmStop(args) => confirm_stop::run(args).await,
        Command::Tail(args) => tail::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Replay(args) => replay::run(args).await,
    }
}

/// This binary as the operator can type it: `dflash-tui` when `PATH` finds this very file,
/// else its path (`make run` starts it from `target/release/`).
pub fn own_spelling() -> String {
    dflash_shared::invocation::spell_sibling("dflash-tui")
}
