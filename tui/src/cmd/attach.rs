//! `dflash-tui attach [--socket PATH] [--read-only]`
use std::process::ExitCode;

use dflash_shared::clock::now_ms;
use dflash_shared::protocol::Access;
use tokio::sync::mpsc;

use super::SocketArg;
use crate::app::{App, Source};
use crate::client::supervisor::{run_link, LinkConfig};
use crate::console::{self, LiveSink};
use crate::fmt::DisplayClock;
use crate::terminal::{self, InputThread};
use crate::ui::theme::Theme;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    socket: SocketArg,
    /// Watch only: every destructive action is disabled, in the console and by the daemon (the
    /// connection says hello as read-only).
    #[arg(long)]
    read_only: bool,
}

/// The console's link: `--read-only` goes into the hello, so the daemon holds the connection
/// to it, not only this console.
fn link_config(socket: std::path::PathBuf, read_only: bool) -> LinkConfig {
    LinkConfig {
        access: if read_only {
            Access::ReadOnly
        } else {
            Access::Full
        },
        ..LinkConfig::new(socket)
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let socket = args.socket.path();
    let mut terminal = terminal::enter()?;
    let (events_tx, mut events) = mpsc::channel(4096);
    let (commands_tx, commands) = mpsc::channel(64);
    let link = tokio::spawn(run_link(
        link_config(socket.clone(), args.read_only),
        events_tx.clone(),
        commands,
    ));
    let ticker = terminal::spawn_ticker(events_tx.clone());
    let signals = terminal::spawn_signal_watcher(events_tx.clone());
    let input = InputThread::spawn(events_tx);

    let source = Source::Live {
        socket: socket.display().to_string(),
    };
    let mut app = App::new(source, args.read_only, now_ms(), DisplayClock::Local);
    let result = console::run(
        &mut terminal,
        &mut app,
        &Theme::from_env(),
        &mut events,
        &mut LiveSink(commands_tx),
    )
    .await;
    terminal::leave();
    drop(input);
    signals.abort();
    ticker.abort();
    link.abort();
    result?;
    let tui = super::own_spelling();
    let on = args.socket.flag();
    println!("Left the console; dflashd keeps training.");
    println!("  watch again:  {tui} attach{on}");
    println!("  headless:     {tui} tail --follow{on}   or   {tui} status{on}");
    println!("  stop the run: {tui} stop{on}, then {tui} confirm-stop{on}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_goes_into_the_hello() {
        let access = |ro| link_config("s".into(), ro).access;
        assert_eq!(
            (access(true), access(false)),
            (Access::ReadOnly, Access::Full)
        );
    }
}
