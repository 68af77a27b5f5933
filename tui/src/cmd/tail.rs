//! `dflash-tui tail [--follow] [--json] [--level L] [--since T]`: events, logs and metrics,
//! one flushed line each. When the daemon is down it reads the daemon's journal and log files.
use std::collections::BTreeSet;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dflash_shared::clock::now_ms;
use dflash_shared::protocol::{Access, Response, Topic};
use tokio::sync::mpsc;

use super::SocketArg;
use crate::client::session::MAX_EVENT_PAGES;
use crate::client::supervisor::{run_link, LinkConfig, LinkEvent};
use crate::client::{ClientError, Session};
use crate::feed::{self, Filter, Item, Level};
use crate::fmt;
use crate::paths::DaemonFiles;

mod files;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    socket: SocketArg,
    /// Keep streaming; reconnects when the daemon restarts.
    #[arg(long, short = 'f')]
    follow: bool,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Minimum level: trace, debug, info, warn, error (= crit).
    #[arg(long, value_name = "L", default_value = "info")]
    level: String,
    /// Only lines at or after T: RFC 3339, HH:MM (UTC today) or an age (90s, 10m, 2h, 1d).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Without --since, how many past journal lines to print first.
    #[arg(long, short = 'n', value_name = "N", default_value_t = 20)]
    lines: usize,
    /// The daemon's state dir, read when the daemon is down [default: $XDG_STATE_HOME/dflash]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The run dir holding journal.jsonl, read when the daemon is down
    /// [default: $XDG_DATA_HOME/dflash/runs/default]
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
}

/// Writes one line at a time and flushes it, so a pipe sees every line as it happens.
struct Out {
    json: bool,
    filter: Filter,
    printed_seqs: BTreeSet<u64>,
}

/// The reader went away (a closed pipe): stop quietly.
struct Gone;

impl Out {
    fn emit(&mut self, item: &Item) -> Result<(), Gone> {
        if !self.filter.keeps(item) {
            return Ok(());
        }
        if let Item::Event(e) = item {
            if !self.printed_seqs.insert(e.seq) {
                return Ok(());
            }
            if self.printed_seqs.len() > 100_000 {
                self.printed_seqs.pop_first();
            }
        }
        let line = if self.json {
            feed::json_line(item)
        } else {
            feed::human(item)
        };
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{line}").and_then(|_| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(Gone),
            // Any other write failure also means nobody reads us any more.
            Err(_) => Err(Gone),
        }
    }

    /// Prints the last `n` of `items` (all of them under --since).
    fn emit_history(&mut self, items: &[Item], n: usize) -> Result<(), Gone> {
        let kept: Vec<&Item> = items.iter().filter(|i| self.filter.keeps(i)).collect();
        let start = if self.filter.since_ms.is_some() {
            0
        } else {
            kept.len().saturating_sub(n)
        };
        for item in &kept[start..] {
            self.emit(item)?;
        }
        Ok(())
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let min_level = Level::parse(&args.level).map_err(anyhow::Error::msg)?;
    let since_ms = args
        .since
        .as_deref()
        .map(|t| feed::parse_since(t, now_ms()))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut out = Out {
        json: args.json,
        filter: Filter {
            min_level,
            since_ms,
        },
        printed_seqs: BTreeSet::new(),
    };
    let socket = args.socket.path();
    let outcome = match Session::connect_with(&socket, Access::ReadOnly).await {
        Ok((session, _welcome, _pushes)) if !args.follow => {
            history_once(&session, &mut out, args.lines).await
        }
        Ok((session, ..)) => {
            drop(session);
            follow_live(socket, &mut out, args.lines).await
        }
        Err(e @ (ClientError::NoDaemon { .. } | ClientError::Connect { .. })) => {
            let files = DaemonFiles::resolve(args.state_dir.as_deref(), args.run_dir.as_deref())?;
            eprintln!(
                "dflash-tui: {e}\ndflash-tui: reading the daemon's files in {} instead (journal and \
                 logs; live metrics need the daemon)",
                files.state_dir.display()
            );
            files::tail(&files, &mut out, args.lines, args.follow).await
        }
        Err(e) => return Err(e.into()),
    };
    match outcome {
        Ok(()) | Err(Gone) => Ok(ExitCode::SUCCESS),
    }
}

async fn history_once(session: &Session, out: &mut Out, lines: usize) -> Result<(), Gone> {
    match session.events_after(None, MAX_EVENT_PAGES).await {
        Ok(events) => {
            let items: Vec<Item> = events.into_iter().map(Item::Event).collect();
            out.emit_history(&items, lines)
        }
        Err(e) => {
            eprintln!("dflash-tui: cannot read the journal: {e}");
            Ok(())
        }
    }
}

async fn follow_live(socket: PathBuf, out: &mut Out, lines: usize) -> Result<(), Gone> {
    let (events_tx, mut events) = mpsc::channel::<LinkEvent>(4096);
    let (_commands_tx, commands) = mpsc::channel(1);
    let config = LinkConfig {
        topics: vec![Topic::Metrics, Topic::Events, Topic::Logs],
        // tail shows the stream; it never needs the status snapshot.
        status_every: Duration::from_secs(24 * 3600),
        // tail only watches; the daemon holds it to that.
        access: Access::ReadOnly,
        ..LinkConfig::new(socket)
    };
    let link = tokio::spawn(run_link(config, events_tx, commands));
    let mut first_backfill = true;
    let result = loop {
        let Some(event) = events.recv().await else {
            break Ok(());
        };
        let emitted = match event {
            LinkEvent::Connected(welcome) => {
                eprintln!(
                    "dflash-tui: following run {} (dflashd pid {})",
                    welcome.run_name, welcome.daemon_pid
                );
                Ok(())
            }
            LinkEvent::Lost { reason, retry_in } => {
                eprintln!(
                    "dflash-tui: lost the daemon ({reason}); retrying in {}",
                    fmt::duration_ms(retry_in.as_millis() as i64)
                );
                Ok(())
            }
            LinkEvent::Garbled(reason) => {
                eprintln!("dflash-tui: unreadable frame: {reason}");
                Ok(())
            }
            LinkEvent::Frame(Response::Events { events }) => {
                let items: Vec<Item> = events.into_iter().map(Item::Event).collect();
                // After a reconnect the backfill holds only what was missed: print all of it.
                let n = if first_backfill { lines } else { usize::MAX };
                first_backfill = false;
                out.emit_history(&items, n)
            }
            LinkEvent::Frame(Response::Event(event)) => out.emit(&Item::Event(*event)),
            LinkEvent::Frame(Response::Metrics(metrics)) => out.emit(&Item::Metrics(metrics)),
            LinkEvent::Frame(Response::Log { level, line }) => out.emit(&Item::Log {
                ts_ms: now_ms(),
                level: Level::parse(&level).unwrap_or(Level::Info),
                line,
            }),
            LinkEvent::Frame(Response::Dropped { reason }) => {
                eprintln!("dflash-tui: the daemon dropped this client: {reason}");
                Ok(())
            }
            LinkEvent::Frame(_) | LinkEvent::Connecting { .. } | LinkEvent::Reply { .. } => Ok(()),
        };
        if emitted.is_err() {
            break emitted;
        }
    };
    link.abort();
    result
}
