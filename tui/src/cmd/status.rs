//! `dflash-tui status [--format markdown|json]`: the status checkpoint from the daemon's state
//! and journal; from the journal file alone when the daemon is down.
use std::path::PathBuf;
use std::process::ExitCode;

use dflash_shared::clock::now_ms;
use dflash_shared::events::Event;
use dflash_shared::protocol::{Access, Request, Response};

use super::SocketArg;
use crate::client::session::MAX_EVENT_PAGES;
use crate::client::{ClientError, Session};
use crate::fmt::DisplayClock;
use crate::paths::DaemonFiles;
use crate::report::{self, ReportInput};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Markdown,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    socket: SocketArg,
    #[arg(long, value_enum, default_value_t = Format::Markdown)]
    format: Format,
    /// The daemon's state dir (journal and logs) [default: $XDG_STATE_HOME/dflash]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The run dir holding journal.jsonl, read when the daemon is down
    /// [default: $XDG_DATA_HOME/dflash/runs/default]
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let files = DaemonFiles::resolve(args.state_dir.as_deref(), args.run_dir.as_deref())?;
    let (snapshot, events, config, daemon_error) =
        match Session::connect_with(&args.socket.path(), Access::ReadOnly).await {
            Ok((session, ..)) => {
                let snapshot = match session.request(&Request::Status).await? {
                    Response::Status(s) => s,
                    other => anyhow::bail!("expected the daemon's status, got {other:?}"),
                };
                let events = session.events_after(None, MAX_EVENT_PAGES).await?;
                // The config is context, not essential: a daemon that cannot send it still gets a report.
                let config = match session.request(&Request::Config).await {
                    Ok(Response::Json { value }) => Some(value),
                    _ => None,
                };
                (Some(snapshot), events, config, None)
            }
            Err(e @ (ClientError::NoDaemon { .. } | ClientError::Connect { .. })) => {
                let events = read_journal(&files);
                (None, events, None, Some(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
    let input = ReportInput {
        snapshot: snapshot.as_deref(),
        events: &events,
        config: config.as_ref(),
        files: &files,
        daemon_error,
        now_ms: now_ms(),
        clock: DisplayClock::Local,
    };
    let report = report::build(&input);
    match args.format {
        Format::Markdown => print!("{}", report::render_markdown(&report)),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}

fn read_journal(files: &DaemonFiles) -> Vec<Event> {
    let Ok(text) = std::fs::read_to_string(&files.journal) else {
        eprintln!("dflash-tui: no journal at {}", files.journal.display());
        return Vec::new();
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .filter_map(|(i, line)| match serde_json::from_str(line) {
            Ok(event) => Some(event),
            Err(e) => {
                eprintln!(
                    "dflash-tui: {}:{}: skipped: {e}",
                    files.journal.display(),
                    i + 1
                );
                None
            }
        })
        .collect()
}
