//! Stale is never live: when samples stop (a worker crashed, the daemon went away), every figure
//! says how old it is, the header says what the daemon last said and when, the badge never
//! reads OK, and a chart does not draw a ramp across the gap once samples come back. In a
//! replay by the recording's clock, attached by the wall clock.
mod support;

use std::time::Duration;

use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::metrics::{DeviceRole, StepMetrics};
use dflash_shared::protocol::Response;
use dflash_shared::recording::RecordedFrame;
use dflash_tui::app::{App, AppEvent, Source};
use dflash_tui::client::supervisor::LinkEvent;
use dflash_tui::fmt::DisplayClock;
use support::incident::{self, at};
use support::screen::{self, redacted, render, replayed, HEIGHT, WIDTH};

/// The healthy evening up to 21:01:30 (21.5K tok/s, before the collapse), then a drafter
/// worker's crash on its first compile at 21:01:40, then nothing: the recorder went with the
/// daemon.
fn until_the_crash() -> Vec<RecordedFrame> {
    let mut frames: Vec<RecordedFrame> = incident::generate(incident::SEED)
        .into_iter()
        .filter(|f| f.ts_ms <= at(21, 1, 30))
        .collect();
    let crash = at(21, 1, 40);
    frames.push(RecordedFrame {
        ts_ms: crash,
        frame: Response::Event(Box::new(Event {
            seq: 9_000,
            ts_ms: crash,
            severity: Severity::Crit,
            kind: EventKind::WorkerFailed {
                device: "cuda:5".into(),
                error: "torch._inductor: compile worker exited with signal 11".into(),
                role: Some(DeviceRole::Drafter),
                rank: Some(0),
            },
        })),
    });
    frames
}

/// The restarted daemon's metrics lines: 4.3K tok/s every 15 s from 21:15:40 for 3 minutes.
fn after_the_restart(last_step: u64) -> Vec<RecordedFrame> {
    (0..12)
        .map(|i| {
            let ts_ms = at(21, 15, 40) + i * 15_000;
            RecordedFrame {
                ts_ms,
                frame: Response::Metrics(Box::new(StepMetrics {
                    ts_ms,
                    step: last_step + i as u64,
                    epoch: 3,
                    loss: 1.9,
                    accuracy: 0.41,
                    tau: None,
                    tau_tree: None,
                    lr: 1.6e-4,
                    grad_norm: 0.9,
                    tokens_per_s: 4_300.0 + (i % 3) as f64 * 40.0,
                    draft_positions_per_s: 0.0,
                    mfu: None,
                    workers: Vec::new(),
                    times: Default::default(),
                    online: None,
                    domino: None,
                    dspark: None,
                    dflash2: None,
                    job: None,
                })),
            }
        })
        .collect()
}

#[test]
fn a_silent_replay_marks_every_figure_stale_with_its_age_and_the_badge_is_not_ok() {
    let frames = until_the_crash();
    let mut app = replayed(&frames);
    // Before the gap: live and healthy.
    let live = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(live.contains("· Training"), "{live}");
    assert!(live.contains("% of baseline"), "{live}");
    assert!(!live.contains("stale"), "{live}");

    // The replay clock moves on through 14 minutes of nothing (the player ticks through a
    // quiet stretch of a recording).
    app.handle(AppEvent::Tick(at(21, 15, 40)));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    let header = text.lines().next().unwrap();
    assert!(
        header.contains("daemon last said: training, 15 min ago"),
        "{header}"
    );
    assert!(header.contains("STALE 14 min"), "{header}");
    assert!(!header.contains(" OK "), "{header}");
    // The big number is no share of baseline, and it says when it was true.
    assert!(!text.contains("% of baseline"), "{text}");
    assert!(!text.contains("stable for"), "{text}");
    assert!(
        text.contains("stale 14 min: last sample at 21:01"),
        "{text}"
    );
    assert!(
        text.contains(
            "STALE no data for 14 min (last metrics line at 21:01; daemon last said training)"
        ),
        "{text}"
    );
    assert!(!text.contains("No active alerts."), "{text}");
    assert!(
        text.contains("ETA     unknown: no step for 14 min"),
        "{text}"
    );
    for panel in [
        "Throughput (tok/s) · stale 14 min",
        "Run · stale 14 min",
        "Loss · stale",
    ] {
        assert!(text.contains(panel), "{panel} missing:\n{text}");
    }
    redacted().bind(|| insta::assert_snapshot!("stale_overview", render(&app, WIDTH, HEIGHT)));

    app.view = dflash_tui::app::View::Gpus;
    let gpus = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        gpus.contains("stale 14 min: no GPU reading since 21:01"),
        "{gpus}"
    );
    app.view = dflash_tui::app::View::Queue;
    let queue = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        queue.contains("stale 14 min: no reading since 21:01"),
        "{queue}"
    );
}

/// The rows of the throughput chart's plot: inside the Throughput panel (its columns), from
/// the row under the baseline line to the row above the x axis.
fn throughput_plot_rows(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let panel = |l: &&str| l.chars().take(63).collect::<String>();
    let start = lines
        .iter()
        .position(|l| panel(l).contains("baseline "))
        .expect("the baseline line")
        + 1;
    let axis = lines[start..]
        .iter()
        .position(|l| panel(l).contains('└'))
        .expect("the x axis")
        + start;
    lines[start..axis].iter().map(panel).collect()
}

fn braille(row: &str) -> usize {
    row.chars()
        .filter(|c| ('\u{2801}'..='\u{28FF}').contains(c))
        .count()
}

#[test]
fn when_samples_resume_the_chart_shows_the_gap_not_a_ramp_across_it() {
    let mut frames = until_the_crash();
    let last_step = frames
        .iter()
        .rev()
        .find_map(|f| match &f.frame {
            Response::Metrics(m) => Some(m.step),
            _ => None,
        })
        .unwrap();
    frames.extend(after_the_restart(last_step));
    let app = replayed(&frames);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    let rows = throughput_plot_rows(&text);
    // The plot's height follows the Run panel beside it; it needs a row between top and bottom.
    assert!(rows.len() >= 3, "{rows:#?}");
    let (top, bottom) = (&rows[0], &rows[rows.len() - 1]);
    // 21.5K on the top row, 4.3K on the bottom one, and nothing between: a line joined
    // across the 14-minute gap would cross the middle rows.
    assert!(braille(top) > 10, "{rows:#?}");
    assert!(braille(bottom) > 3, "{rows:#?}");
    let between: usize = rows[1..rows.len() - 1].iter().map(|r| braille(r)).sum();
    assert_eq!(between, 0, "a ramp across the gap:\n{}", rows.join("\n"));
    // Live again: no stale marks, and the state is the daemon's word of now.
    assert!(!text.contains("stale"), "{text}");
    // The "stable for" of a status from before the crash is not repeated as if it held now.
    assert!(!text.contains("stable for"), "{text}");
    redacted().bind(|| insta::assert_snapshot!("gap_overview", render(&app, WIDTH, HEIGHT)));
}

#[test]
fn attached_the_header_says_what_the_daemon_last_said_once_it_is_gone() {
    let frames = until_the_crash();
    let mut app = incident::live_from(frames, false);
    // The daemon goes; the wall clock moves on a second at a time (`terminal::spawn_ticker`).
    app.handle(AppEvent::Link(LinkEvent::Lost {
        reason: "connection reset by peer".into(),
        retry_in: Duration::from_secs(2),
    }));
    let just_lost = screen::text(&render(&app, WIDTH, HEIGHT));
    let header = just_lost.lines().next().unwrap();
    // The link is down at once, so the state is what the daemon last said, not its word of now;
    // the figures are seconds old, not stale yet.
    assert!(header.contains("daemon last said: training"), "{header}");
    assert!(!header.contains("STALE"), "{header}");
    for s in (0..=14 * 60).step_by(30) {
        app.handle(AppEvent::Tick(at(21, 1, 40) + s * 1000));
    }
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    let header = text.lines().next().unwrap();
    assert!(
        header.contains("daemon last said: training, 15 min ago"),
        "{header}"
    );
    assert!(header.contains("✕ daemon unreachable"), "{header}");
    assert!(header.contains("STALE 14 min"), "{header}");
    assert!(!text.contains("% of baseline"), "{text}");
}

#[test]
fn nothing_received_yet_is_no_data_not_ok() {
    let app = App::new(
        Source::Live {
            socket: "/run/user/1000/dflash/dflashd.sock".into(),
        },
        false,
        at(21, 0, 0),
        DisplayClock::utc(),
    );
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    let header = text.lines().next().unwrap();
    assert!(header.ends_with(" NO DATA "), "{header}");
}
