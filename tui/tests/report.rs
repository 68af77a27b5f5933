//! The status checkpoint built from the daemon's snapshot and journal (pure functions), on the
//! incident's data.
mod support;

use std::path::Path;

use dflash_shared::events::Event;
use dflash_shared::protocol::Response;
use dflash_shared::status::StatusSnapshot;
use dflash_tui::fmt::DisplayClock;
use dflash_tui::paths::DaemonFiles;
use dflash_tui::report::{self, ReportInput};
use support::incident;

fn incident_data() -> (StatusSnapshot, Vec<Event>) {
    let frames = incident::generate(incident::SEED);
    let status = frames
        .iter()
        .rev()
        .find_map(|f| match &f.frame {
            Response::Status(s) => Some((**s).clone()),
            _ => None,
        })
        .unwrap();
    let events = frames
        .into_iter()
        .filter_map(|f| match f.frame {
            Response::Event(e) => Some(*e),
            _ => None,
        })
        .collect();
    (status, events)
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "training": {"precision": "bf16", "epochs": 6, "early_stopping": false, "num_anchors": 1024},
        "drafter": {"block_size": 32, "target_layer_ids": [1, 16, 31, 46, 61]},
        "data": {"train_file": "/srv/data/chat.jsonl", "tokenizer": "/srv/models/qwen3.6-27b/tokenizer.json"}
    })
}

fn files() -> DaemonFiles {
    DaemonFiles::new(
        Path::new("/home/op/.local/state/dflash"),
        Path::new(incident::RUN_DIR),
    )
}

#[test]
fn the_incident_report_names_the_changes_and_what_to_do() {
    let (status, events) = incident_data();
    let config = config();
    let files = files();
    let report = report::build(&ReportInput {
        snapshot: Some(&status),
        events: &events,
        config: Some(&config),
        files: &files,
        daemon_error: None,
        now_ms: incident::end_ms(),
        clock: DisplayClock::utc(),
    });
    assert_eq!(report.run.name.as_deref(), Some(incident::RUN_NAME));
    assert_eq!(report.alerts[0].detector, "throughput");
    assert!(report.alerts[0]
        .explanation
        .contains("torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52"));
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.starts_with("Restore torch 2.11.0+cu128 (now 2.9.1+cu130)")));
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.contains("TorchInductor compile cache re-warm")));
    assert!(report
        .progress
        .blocked
        .iter()
        .any(|b| b.contains("Crit since 21:03")));
    let categories: Vec<&str> = report.timeline.iter().map(|e| e.category.word()).collect();
    for c in ["environment", "caches", "throughput"] {
        assert!(categories.contains(&c), "{c} missing from {categories:?}");
    }
    assert_eq!(
        report.files.journal,
        format!("{}/journal.jsonl", incident::RUN_DIR)
    );
    assert_eq!(report.files.data.len(), 2);

    let markdown = report::render_markdown(&report);
    insta::assert_snapshot!("status_markdown_incident", markdown);

    let json = serde_json::to_value(&report).unwrap();
    for key in [
        "run",
        "throughput",
        "gpus",
        "queue",
        "caches",
        "alerts",
        "pending_actions",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["queue"]["depth"], 64);
    assert!(
        json["throughput"]["baseline_tokens_per_s"]
            .as_f64()
            .unwrap()
            > 21_000.0
    );
}

#[test]
fn without_the_daemon_the_report_rests_on_the_journal() {
    let (_, events) = incident_data();
    let files = files();
    let report = report::build(&ReportInput {
        snapshot: None,
        events: &events,
        config: None,
        files: &files,
        daemon_error: Some("no dflashd is listening at /run/user/1000/dflash/dflashd.sock".into()),
        now_ms: incident::end_ms(),
        clock: DisplayClock::utc(),
    });
    assert!(!report.daemon.reachable);
    assert_eq!(report.run.state, "unknown (daemon unreachable)");
    assert_eq!(
        report.run.step,
        Some(31_682),
        "from the last checkpoint event"
    );
    assert_eq!(
        report.alerts.first().map(|a| a.detector.as_str()),
        Some("throughput")
    );
    assert!(report.progress.blocked[0].starts_with("The daemon is unreachable"));
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.contains("dflashd start")));
    assert_eq!(report.checkpoints.len(), 2);
    let markdown = report::render_markdown(&report);
    assert!(markdown.contains("## Critical Context"));
    assert!(markdown.contains("GPUs: daemon unreachable."));
}

#[test]
fn a_run_that_trained_to_the_end_is_finished_not_something_to_restart() {
    use dflash_shared::events::{EventKind, Severity};
    let (_, mut events) = incident_data();
    let last = events.last().unwrap().clone();
    events.push(Event {
        seq: last.seq + 1,
        ts_ms: last.ts_ms + 1_000,
        severity: Severity::Info,
        kind: EventKind::RunStopped {
            reason: "training complete: 6 epochs, 642 steps".into(),
            checkpoint: Some("/runs/r/checkpoints/step-0000000642".into()),
        },
    });
    let files = files();
    let report = report::build(&ReportInput {
        snapshot: None,
        events: &events,
        config: None,
        files: &files,
        daemon_error: Some("no dflashd is listening".into()),
        now_ms: incident::end_ms() + 2_000,
        clock: DisplayClock::utc(),
    });
    assert_eq!(report.run.state, "finished");
    assert!(report
        .progress
        .done
        .iter()
        .any(|d| d == "Run finished: training complete: 6 epochs, 642 steps."));
    // With the daemon down the journal only says what was written, not what is still kept.
    assert!(
        report
            .progress
            .done
            .iter()
            .any(|d| d.contains("checkpoint(s) written; latest at step")),
        "{:?}",
        report.progress.done
    );
    assert!(
        !report
            .progress
            .blocked
            .iter()
            .any(|b| b.starts_with("The daemon is unreachable")),
        "{:?}",
        report.progress.blocked
    );
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.contains("dflashd export")));
    // Not told to restart this run; told how to start the next one, in a new run dir.
    assert!(
        !report.next_steps.iter().any(|s| s.contains("resume")),
        "{:?}",
        report.next_steps
    );
    assert!(report
        .next_steps
        .iter()
        .filter(|s| s.contains("dflashd start"))
        .all(|s| s.contains("NEW_DIR")));
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.contains("Start the next run")));
}

#[test]
fn the_report_puts_online_tau_beside_offline_tau_with_the_gap() {
    use dflash_shared::metrics::OnlineAcceptance;
    use dflash_shared::status::OnlineEvalStatus;
    let (mut status, events) = incident_data();
    let files = files();
    let build = |status: &StatusSnapshot| {
        report::build(&ReportInput {
            snapshot: Some(status),
            events: &events,
            config: None,
            files: &files,
            daemon_error: None,
            now_ms: incident::end_ms(),
            clock: DisplayClock::utc(),
        })
    };
    let before = report::render_markdown(&build(&status));
    assert!(
        before.contains("- Acceptance: offline τ 3.91; no online evaluation yet."),
        "{before}"
    );
    status.last_online = Some(OnlineEvalStatus {
        step: 31_000,
        ts_ms: incident::end_ms() - 60_000,
        acceptance: OnlineAcceptance {
            tau_chain: 2.5,
            tau_ddtree: [(64, 3.25), (16, 3.0)].into_iter().collect(),
            offline_tau: Some(4.0),
            prompts: 16,
            seconds: 41.5,
        },
    });
    let report = build(&status);
    let online = report.acceptance.online.as_ref().unwrap();
    let methods: Vec<&str> = online.methods.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(methods, ["chain", "ddtree_16", "ddtree_64"]);
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "- Acceptance: offline τ 3.91; online at step 31,000 (16 prompts, 41.5 s): chain \
             2.50, ddtree_16 3.00, ddtree_64 3.25, 38% below the offline τ 4.00 of its moment."
        ),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["acceptance"]["online"]["gap_fraction"], 0.375);
}
