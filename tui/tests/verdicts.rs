//! One source of truth for verdicts: the console's own memory and queue verdicts reach the
//! Alerts panel and the header badge where the daemon sent no alert of that detector (labelled
//! as the console's), the daemon's alert wins where it sent one, nothing is counted twice, and
//! sibling GPUs read as one line.
mod support;

use dflash_shared::config::DetectorsSection;
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::protocol::Response;
use dflash_shared::recording::RecordedFrame;
use dflash_tui::app::alerts::{Verdict, CONSOLE_LABEL};
use support::incident::{self, at};
use support::screen::{self, redacted, render, replayed, HEIGHT, WIDTH};

fn is_memory_or_queue(detector: &str) -> bool {
    detector.starts_with("memory:") || detector == "queue"
}

/// The incident as a daemon that journals (and reports in its status) no memory or queue
/// alert would stream it: its throughput and cache alerts only.
fn without_the_daemons_memory_and_queue_alerts(until_ms: i64) -> Vec<RecordedFrame> {
    incident::generate(incident::SEED)
        .into_iter()
        .filter(|f| f.ts_ms <= until_ms)
        .filter(|f| match &f.frame {
            Response::Event(e) => !matches!(
                &e.kind,
                EventKind::RegressionStarted { detector, .. }
                    | EventKind::RegressionEnded { detector, .. }
                    if is_memory_or_queue(detector)
            ),
            _ => true,
        })
        .map(|mut f| {
            if let Response::Status(s) = &mut f.frame {
                s.alerts.retain(|a| !is_memory_or_queue(&a.detector));
            }
            f
        })
        .collect()
}

fn lines_with(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn the_consoles_own_verdicts_reach_the_alerts_panel_and_the_badge_where_the_daemon_sent_none() {
    // Up to 21:02:30: the drafters' memory has turned volatile (21:02), no throughput alert
    // yet (21:03) and the daemon sent nothing about memory.
    let app = replayed(&without_the_daemons_memory_and_queue_alerts(at(21, 2, 30)));
    assert!(app
        .alerts
        .sorted()
        .iter()
        .all(|a| !is_memory_or_queue(&a.detector)));
    let shown = app.shown_alerts();
    let console: Vec<&str> = shown
        .iter()
        .filter(|(_, v)| *v == Verdict::Console)
        .map(|(a, _)| a.detector.as_str())
        .collect();
    assert_eq!(console, ["memory:gpu5", "memory:gpu6", "memory:gpu7"]);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains(&format!(
            "WARN GPU 5–7 memory volatile {CONSOLE_LABEL}, Warn since 21:02"
        )),
        "{text}"
    );
    let header = text.lines().next().unwrap();
    assert!(header.ends_with(" WARN "), "{header}");

    // Later the queue too: the console's queue verdict, labelled, beside the daemon's Crit.
    let app = replayed(&without_the_daemons_memory_and_queue_alerts(
        incident::end_ms(),
    ));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("WARN queue imbalance: drafter workers waited"),
        "{text}"
    );
    let queue_line = text
        .lines()
        .find(|l| l.contains("WARN queue imbalance"))
        .unwrap();
    let queue = app
        .explained_alerts()
        .into_iter()
        .find(|e| e.detectors == ["queue"])
        .expect("the console's queue verdict");
    assert_eq!(queue.verdict, Verdict::Console);
    assert!(
        queue.head.contains(CONSOLE_LABEL),
        "{queue:?} / {queue_line}"
    );
    assert!(text.lines().next().unwrap().ends_with(" CRIT "));
}

#[test]
fn where_the_daemon_sent_an_alert_the_console_shows_it_once_not_its_own_beside_it() {
    let app = replayed(&incident::generate(incident::SEED));
    let shown = app.shown_alerts();
    // The console judged GPUs 5–7 volatile too, from the same samples: not counted again.
    assert!(
        shown.iter().all(|(_, v)| *v == Verdict::Daemon),
        "{shown:?}"
    );
    let mut detectors: Vec<&str> = shown.iter().map(|(a, _)| a.detector.as_str()).collect();
    detectors.sort_unstable();
    let before = detectors.len();
    detectors.dedup();
    assert_eq!(
        detectors.len(),
        before,
        "a detector shown twice: {detectors:?}"
    );
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(!text.contains(CONSOLE_LABEL), "{text}");
    assert_eq!(
        lines_with(&text, "WARN GPU 5–7 memory volatile, Warn since 21:02"),
        1,
        "{text}"
    );
    // No GPU of the three has a line of its own.
    for gpu in ["GPU 5 ", "GPU 6 ", "GPU 7 "] {
        assert_eq!(lines_with(&text, &format!("WARN {gpu}")), 0, "{text}");
    }
}

#[test]
fn sibling_gpus_read_as_one_line_and_the_consoles_own_are_labelled() {
    // A run tuned to tolerate only 0.005% of range: the console judges every GPU volatile by
    // it, while the recording's daemon (default thresholds) alerted on the drafters only. The
    // Alerts panel: the daemon's "GPU 5–7", then the console's own "GPU 0–4", labelled.
    let mut tuned = DetectorsSection::default();
    tuned.memory.max_range_frac = 0.000_05;
    let mut frames = incident::generate(incident::SEED);
    for frame in &mut frames {
        if let Response::Status(status) = &mut frame.frame {
            status.detectors = Some(tuned.clone());
        }
    }
    let app = replayed(&frames);
    let lines = app.alert_lines();
    let memory: Vec<(&str, Verdict)> = lines
        .iter()
        .filter(|e| e.detectors.iter().all(|d| d.starts_with("memory:")))
        .map(|e| (e.head.as_str(), e.verdict))
        .collect();
    assert_eq!(memory.len(), 2, "{lines:#?}");
    // Oldest first within a level: the console judged the targets volatile from 20:39 on.
    assert!(
        memory[0].0.starts_with(&format!(
            "GPU 0–4 memory volatile {CONSOLE_LABEL}, Warn since 20:39"
        )),
        "{memory:?}"
    );
    assert_eq!(memory[0].1, Verdict::Console);
    assert!(
        memory[1]
            .0
            .starts_with("GPU 5–7 memory volatile, Warn since 21:02"),
        "{memory:?}"
    );
    assert_eq!(memory[1].1, Verdict::Daemon);
    assert_eq!(
        lines
            .iter()
            .find(|e| e.detectors.len() == 5)
            .map(|e| e.detectors.clone()),
        Some((0..5).map(|i| format!("memory:gpu{i}")).collect::<Vec<_>>())
    );
    // The worst alert's context folds the three drafters too.
    let crit = &lines[0];
    assert_eq!(crit.level, Severity::Crit);
    assert!(
        crit.before
            .iter()
            .any(|b| b == "GPU 5–7 memory volatile at 21:02"),
        "{:?}",
        crit.before
    );
    redacted().bind(|| insta::assert_snapshot!("alerts_grouped", render(&app, WIDTH, HEIGHT)));
}
