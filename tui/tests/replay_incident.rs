//! The shipped recording of the incident, played into the console: the console must flag it.
mod support;

use dflash_shared::events::Severity;
use dflash_shared::protocol::Response;
use dflash_tui::app::{AppEvent, View};
use support::incident;
use support::screen::{self, redacted, render, replayed, HEIGHT, WIDTH};

fn fixture() -> Vec<dflash_shared::recording::RecordedFrame> {
    let recording = dflash_tui::replay::load(std::path::Path::new(incident::FIXTURE))
        .expect("the fixture loads");
    assert!(recording.skipped.is_empty(), "{:?}", recording.skipped);
    recording.frames
}

#[test]
fn the_committed_fixture_is_what_the_seeded_generator_makes() {
    let generated = incident::to_jsonl(&incident::generate(incident::SEED));
    if std::env::var_os("DFLASH_REGENERATE_FIXTURES").is_some() {
        std::fs::write(incident::FIXTURE, &generated).expect("write the fixture");
    }
    let committed = std::fs::read_to_string(incident::FIXTURE).expect("fixture exists");
    assert!(
        committed == generated,
        "tests/fixtures/incident.jsonl differs from the generator; rerun with \
         DFLASH_REGENERATE_FIXTURES=1 and review the diff"
    );
}

#[test]
fn the_console_flags_the_collapse_with_the_torch_swap_and_the_cache_deletion() {
    let mut app = replayed(&fixture());
    let alerts = app.explained_alerts();
    let (level, text) = (alerts[0].level, alerts[0].sentence());
    assert_eq!(level, Severity::Crit, "{alerts:?}");
    assert!(text.contains(" tok/s, Crit since 21:0"), "{text}");
    assert!(text.contains("(baseline 21.5K)"), "{text}");
    assert!(
        text.contains("torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52"),
        "{text}"
    );
    assert!(
        text.contains("TorchInductor compile cache deleted at 21:00"),
        "{text}"
    );

    let overview = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(overview.contains("CRIT"), "{overview}");
    assert!(overview.contains("torch 2.11.0+cu128"), "{overview}");

    app.view = View::Gpus;
    let gpus = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(gpus.contains("memory VOLATILE on GPU 5–7"), "{gpus}");
    for row in gpus.lines().filter(|l| l.contains("NVIDIA H200")) {
        let drafter = row.contains("drafter");
        assert_eq!(row.contains("VOLATILE"), drafter, "{row}");
        assert_eq!(row.contains("flat"), !drafter, "{row}");
    }

    app.view = View::Queue;
    let queue = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(queue.contains("the DRAFTER side bounds the run"), "{queue}");
}

#[test]
fn every_view_after_the_incident() {
    let mut app = replayed(&fixture());
    for view in View::ALL {
        app.view = view;
        let name = format!("incident_{}", view.title().to_lowercase());
        redacted().bind(|| insta::assert_snapshot!(name, render(&app, WIDTH, HEIGHT)));
    }
}

#[test]
fn before_the_swap_the_run_reads_healthy() {
    let frames: Vec<_> = fixture()
        .into_iter()
        .filter(|f| f.ts_ms < incident::torch_swap_ms())
        .collect();
    let mut app = replayed(&frames);
    assert!(app.alerts.is_empty());
    app.view = View::Gpus;
    let gpus = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(gpus.contains("memory flat on every judged GPU"), "{gpus}");
    app.view = View::Overview;
    let overview = render(&app, WIDTH, HEIGHT);
    assert!(screen::text(&overview).contains("No active alerts."));
    redacted().bind(|| insta::assert_snapshot!("healthy_overview", overview));
}

#[test]
fn from_the_stream_alone_the_console_still_names_what_changed() {
    // Without the daemon's status snapshots (an older recorder, or a console that attached
    // late) the alert comes from the journal events and the explanation from the console's
    // own journal.
    let frames: Vec<_> = fixture()
        .into_iter()
        .filter(|f| !matches!(f.frame, Response::Status(_)))
        .collect();
    let app = replayed(&frames);
    let alerts = app.explained_alerts();
    let crit = alerts
        .iter()
        .find(|a| a.level == Severity::Crit)
        .unwrap_or_else(|| panic!("no Crit alert in {alerts:?}"))
        .sentence();
    assert!(
        crit.contains("torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52"),
        "{crit}"
    );
    assert!(
        crit.contains("TorchInductor compile cache deleted at 21:00"),
        "{crit}"
    );
}

#[test]
fn replay_progress_and_clock_follow_the_recording() {
    let frames = fixture();
    let mut app = replayed(&frames[..10]);
    assert_eq!(app.now_ms, frames[9].ts_ms);
    app.handle(AppEvent::ReplayProgress {
        position: 10,
        speed: 120.0,
        paused: true,
        finished: false,
    });
    let header = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(header.contains("×120 paused"), "{header}");
}
