//! The console loop: draw, wait for events, apply them, perform effects. Generic over the
//! ratatui backend so whole screens are tested with `TestBackend`.
use dflash_shared::protocol::Request;
use ratatui::backend::Backend;
use ratatui::Terminal;
use thiserror::Error;
use tokio::sync::mpsc;

use crate::app::{App, AppEvent, Effect, ReplayControl};
use crate::client::supervisor::LinkCommand;
use crate::ui::{self, theme::Theme};

/// Events applied between two draws at most; keeps the screen fresh under a flood of frames.
const MAX_BATCH: usize = 512;

#[derive(Debug, Error)]
pub enum ConsoleError {
    #[error("cannot draw to the terminal: {0}")]
    Draw(String),
}

/// Where effects go: the daemon link when live, the player in a replay.
pub trait EffectSink {
    fn send(&mut self, app: &mut App, request: Request);
    fn replay(&mut self, app: &mut App, control: ReplayControl);
}

/// Effects for a live console: requests go to the link task.
pub struct LiveSink(pub mpsc::Sender<LinkCommand>);

impl EffectSink for LiveSink {
    fn send(&mut self, app: &mut App, request: Request) {
        if self.0.try_send(LinkCommand::Send(request)).is_err() {
            app.notify("the daemon link is busy; try again");
        }
    }

    fn replay(&mut self, _app: &mut App, _control: ReplayControl) {}
}

/// Effects for a replay: controls go to the player; there is no daemon to send requests to.
pub struct ReplaySink(pub mpsc::Sender<ReplayControl>);

impl EffectSink for ReplaySink {
    fn send(&mut self, app: &mut App, _request: Request) {
        app.notify("this is a replay: there is no daemon to act on");
    }

    fn replay(&mut self, _app: &mut App, control: ReplayControl) {
        let _ = self.0.try_send(control);
    }
}

/// Runs until the operator quits or every event sender is gone.
pub async fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    app: &mut App,
    theme: &Theme,
    events: &mut mpsc::Receiver<AppEvent>,
    sink: &mut impl EffectSink,
) -> Result<(), ConsoleError> {
    loop {
        terminal
            .draw(|frame| ui::draw(frame, app, theme))
            .map_err(|e| ConsoleError::Draw(e.to_string()))?;
        let Some(first) = events.recv().await else {
            return Ok(());
        };
        if apply(app, first, sink) {
            return Ok(());
        }
        for _ in 0..MAX_BATCH {
            match events.try_recv() {
                Ok(event) => {
                    if apply(app, event, sink) {
                        return Ok(());
                    }
                }
                Err(_) => break,
            }
        }
    }
}

/// Applies one event; true when the operator asked to quit.
fn apply(app: &mut App, event: AppEvent, sink: &mut impl EffectSink) -> bool {
    for effect in app.handle(event) {
        match effect {
            Effect::Quit => return true,
            Effect::Send(request) => sink.send(app, request),
            Effect::Replay(control) => sink.replay(app, control),
        }
    }
    false
}
