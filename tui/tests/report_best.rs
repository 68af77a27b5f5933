//! The status checkpoint names the run's best checkpoint: the daemon's, or with the daemon down
//! the journal's last; and why there is none when the daemon says.
mod support;

use std::path::Path;

use dflash_shared::best_checkpoint::{BestCheckpoint, NoBestCheckpoint};
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::protocol::Response;
use dflash_shared::status::StatusSnapshot;
use dflash_tui::fmt::DisplayClock;
use dflash_tui::paths::DaemonFiles;
use dflash_tui::report::{self, ReportInput, StatusReport};
use support::incident;

fn incident_status() -> StatusSnapshot {
    incident::generate(incident::SEED)
        .iter()
        .rev()
        .find_map(|f| match &f.frame {
            Response::Status(s) => Some((**s).clone()),
            _ => None,
        })
        .unwrap()
}

fn build(snapshot: Option<&StatusSnapshot>, events: &[Event]) -> StatusReport {
    let files = DaemonFiles::new(Path::new("/state"), Path::new(incident::RUN_DIR));
    report::build(&ReportInput {
        snapshot,
        events,
        config: None,
        files: &files,
        daemon_error: None,
        now_ms: incident::end_ms(),
        clock: DisplayClock::utc(),
    })
}

fn best(step: u64, tau_tree: f64) -> BestCheckpoint {
    BestCheckpoint {
        step,
        tau_tree,
        budget: 32,
        path: format!("/runs/r/checkpoints/step-{step:010}"),
    }
}

#[test]
fn the_report_names_the_daemons_best_checkpoint_in_markdown_and_json() {
    let mut status = incident_status();
    status.best_checkpoint = Some(best(450, 4.4519));
    let report = build(Some(&status), &[]);
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "- Best checkpoint: step 450, tree τ@32 4.45 (/runs/r/checkpoints/step-0000000450)"
        ),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["files"]["best_checkpoint"]["step"], 450);
    assert_eq!(json["files"]["best_checkpoint"]["budget"], 32);

    status.best_checkpoint = None;
    status.no_best_checkpoint = Some(NoBestCheckpoint::OnlineEvalOff);
    let markdown = report::render_markdown(&build(Some(&status), &[]));
    assert!(
        markdown.contains("- Best checkpoint: none, online evaluation is off"),
        "{markdown}"
    );
}

#[test]
fn with_the_daemon_down_the_journals_last_best_is_named() {
    let event = |seq: u64, b: BestCheckpoint| Event {
        seq,
        ts_ms: incident::end_ms(),
        severity: Severity::Info,
        kind: EventKind::BestCheckpoint {
            step: b.step,
            tau_tree: b.tau_tree,
            budget: b.budget,
            path: b.path,
        },
    };
    let events = [event(1, best(100, 3.0)), event(2, best(200, 3.5))];
    let report = build(None, &events);
    assert_eq!(report.files.best_checkpoint, Some(best(200, 3.5)));
    let markdown = report::render_markdown(&build(None, &[]));
    assert!(
        markdown.contains("- Best checkpoint: none recorded"),
        "{markdown}"
    );
}
