//! Rendering whole screens into ratatui's `TestBackend`, and the insta filters that redact
//! times and numbers so snapshots test layout and wording, not the clock.
use dflash_shared::recording::RecordedFrame;
use dflash_tui::app::{App, AppEvent, ReplayState, Source};
use dflash_tui::fmt::DisplayClock;
use dflash_tui::ui::{self, theme::Theme};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

pub const WIDTH: u16 = 110;
pub const HEIGHT: u16 = 34;

pub fn render(app: &App, width: u16, height: u16) -> TestBackend {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|frame| ui::draw(frame, app, &Theme::plain()))
        .expect("draw");
    terminal.backend().clone()
}

/// The screen as plain text, one line per row (for `contains` checks).
pub fn text(backend: &TestBackend) -> String {
    let buffer = backend.buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            out.push_str(buffer[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

pub fn redacted() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    // One folder for every test binary's screens, wherever its source files sit.
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots"));
    for (pattern, replacement) in [
        (r"\d{4}-\d{2}-\d{2}", "[date]"),
        (r"\b\d{2}-\d{2} ", "[date] "),
        (r"\b\d{2}:\d{2}(:\d{2})?\b", "[time]"),
        (r"\d+(,\d{3})+", "[count]"),
        (r"\d+(\.\d+)? ?(kB|MB|GB|TB|PB|K|M|G)\b", "[num]"),
        (r"\d+(\.\d+)? ?(s|min|h|d)\b", "[dur]"),
        (r"\d+(\.\d+)?%", "[pct]"),
        (r"\d+\.\d+", "[float]"),
    ] {
        settings.add_filter(pattern, replacement);
    }
    settings
}

pub fn replay_source(total: usize) -> Source {
    Source::Replay(ReplayState {
        file: "incident.jsonl".into(),
        position: total,
        total,
        speed: 60.0,
        paused: false,
        finished: true,
        skipped_lines: 0,
    })
}

/// A console that has played `frames` to the end, clocks in UTC.
pub fn replayed(frames: &[RecordedFrame]) -> App {
    let start = frames.first().map_or(0, |f| f.ts_ms);
    let mut app = App::new(
        replay_source(frames.len()),
        true,
        start,
        DisplayClock::utc(),
    );
    dflash_tui::replay::apply_all(&mut app, frames);
    app
}

/// Feeds events, ignoring effects.
pub fn feed(app: &mut App, events: impl IntoIterator<Item = AppEvent>) {
    for event in events {
        app.handle(event);
    }
}
