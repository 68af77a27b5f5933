//! `dflash-tui replay FILE [--speed X]`
use std::path::PathBuf;
use std::process::ExitCode;

use tokio::sync::mpsc;

use crate::app::{App, ReplayState, Source};
use crate::console::{self, ReplaySink};
use crate::fmt::DisplayClock;
use crate::terminal::{self, InputThread};
use crate::ui::theme::Theme;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A recording: JSONL, one RecordedFrame per line.
    file: PathBuf,
    /// Playback speed: 60 plays a recorded minute in a second. `+`/`-` change it while playing.
    #[arg(long, default_value_t = 60.0)]
    speed: f64,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        anyhow::bail!("--speed must be a positive number, got {}", args.speed);
    }
    let recording = crate::replay::load(&args.file)?;
    for (line, reason) in recording.skipped.iter().take(5) {
        eprintln!("{}:{line}: skipped: {reason}", args.file.display());
    }
    let start_ms = recording.frames[0].ts_ms;
    let state = ReplayState {
        file: args.file.display().to_string(),
        position: 0,
        total: recording.frames.len(),
        speed: args.speed,
        paused: false,
        finished: false,
        skipped_lines: recording.skipped.len(),
    };
    let mut terminal = terminal::enter()?;
    let (events_tx, mut events) = mpsc::channel(4096);
    let (controls_tx, controls) = mpsc::channel(16);
    let player = tokio::spawn(crate::replay::play(
        recording.frames,
        args.speed,
        events_tx.clone(),
        controls,
    ));
    let signals = terminal::spawn_signal_watcher(events_tx.clone());
    let input = InputThread::spawn(events_tx);
    let mut app = App::new(Source::Replay(state), true, start_ms, DisplayClock::Local);
    let result = console::run(
        &mut terminal,
        &mut app,
        &Theme::from_env(),
        &mut events,
        &mut ReplaySink(controls_tx),
    )
    .await;
    terminal::leave();
    drop(input);
    signals.abort();
    player.abort();
    result?;
    Ok(ExitCode::SUCCESS)
}
