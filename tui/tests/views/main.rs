//! Every view, overlay and modal drawn whole into `TestBackend` and snapshot-tested (times and
//! numbers redacted), plus the key handling that leads to them.
#[path = "../support/mod.rs"]
mod support;

mod modals;
mod navigation;
mod run_panel;
mod states;

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::config::DetectorsSection;
use dflash_shared::metrics::{GpuTelemetry, HostSample};
use dflash_shared::protocol::{Request, Response};
use dflash_shared::recording::RecordedFrame;
use dflash_tui::app::{App, AppEvent, Effect, Source, View};
use dflash_tui::client::supervisor::LinkEvent;
use dflash_tui::fmt::DisplayClock;
use support::incident::{self, live_from, SOCKET};
use support::screen::{self, redacted, render, HEIGHT, WIDTH};

fn key(c: char) -> AppEvent {
    AppEvent::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

fn code(code: KeyCode) -> AppEvent {
    AppEvent::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn live(read_only: bool) -> App {
    live_from(incident::generate(incident::SEED), read_only)
}

fn snapshot(name: &str, app: &App) {
    redacted().bind(|| insta::assert_snapshot!(name, render(app, WIDTH, HEIGHT)));
}

fn pending(action: Action, app: &App) -> PendingAction {
    PendingAction {
        id: "act-7".into(),
        action,
        requested_by_uid: 1000,
        created_ms: app.now_ms,
        expires_ms: app.now_ms + 300_000,
        consequences: vec![
            "last checkpoint 0 min ago (step 31,682)".into(),
            "throughput 4.5K tok/s, Crit for 11 min".into(),
        ],
    }
}

/// Presses `key`, checks the console asks the daemon to file `action`, and answers for it.
fn request_and_file(app: &mut App, key_event: AppEvent, action: Action) -> Request {
    let effects = app.handle(key_event);
    let request = Request::RequestAction {
        action: action.clone(),
    };
    assert_eq!(effects, vec![Effect::Send(request.clone())]);
    let reply = Ok(Response::Pending {
        action: pending(action, app),
    });
    app.handle(AppEvent::Link(LinkEvent::Reply {
        request: request.clone(),
        result: reply,
    }));
    request
}

/// The incident as a daemon would stream it whose status snapshots carry `detectors`.
fn incident_with_thresholds(detectors: Option<DetectorsSection>) -> Vec<RecordedFrame> {
    let mut frames = incident::generate(incident::SEED);
    for frame in &mut frames {
        if let Response::Status(status) = &mut frame.frame {
            status.detectors = detectors.clone();
        }
    }
    frames
}
