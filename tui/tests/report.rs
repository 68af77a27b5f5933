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
    assert!(report.next_steps.iter().any(|s| s
        .contains("TorchInductor compile cache was deleted outside dflash")
        && s.contains("re-warm")));
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
fn the_report_puts_tree_tau_at_the_serving_budget_beside_chain_tau_offline_and_online() {
    use dflash_shared::metrics::{OnlineAcceptance, TreeOracleTau};
    use dflash_shared::status::OnlineEvalStatus;
    let (mut status, events) = incident_data();
    let files = files();
    status.last_tau_tree = Some(TreeOracleTau {
        serve_budget: 32,
        by_budget: [(8, 3.5), (32, 4.5)].into_iter().collect(),
    });
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
        before.contains(
            "- Acceptance: offline τ chain 3.91 · tree@32 4.50; no online evaluation yet."
        ),
        "{before}"
    );
    status.last_online = Some(OnlineEvalStatus {
        step: 31_000,
        ts_ms: incident::end_ms() - 60_000,
        acceptance: OnlineAcceptance {
            tau_chain: 2.5,
            tau_ddtree: [(8, 3.0), (32, 3.25), (64, 3.5)].into_iter().collect(),
            serve_tree_budget: Some(32),
            offline_tau: Some(4.0),
            base: None,
            prompts: 16,
            seconds: 41.5,
        },
    });
    let report = build(&status);
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "- Acceptance: offline τ chain 3.91 · tree@32 4.50; online at step 31,000 (16 \
             prompts, 41.5 s): chain 2.50 · tree@32 3.25; also ddtree_8 3.00, ddtree_64 3.50, \
             38% below the offline τ 4.00 of its moment."
        ),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    let acceptance = &json["acceptance"];
    assert_eq!(
        acceptance["offline_serve_tree"],
        serde_json::json!({"budget": 32, "tau": 4.5})
    );
    assert_eq!(
        acceptance["offline_tree_oracle"],
        serde_json::json!({"8": 3.5, "32": 4.5})
    );
    assert_eq!(
        acceptance["online"]["serve_tree"],
        serde_json::json!({"budget": 32, "tau": 3.25})
    );
    // Every method is still listed by its name in JSON.
    assert_eq!(acceptance["online"]["methods"][2]["method"], "ddtree_32");

    // A Domino drafter's serving-budget figure carries its base like every other method.
    let online = status.last_online.as_mut().unwrap();
    online.acceptance.base = Some(dflash_shared::metrics::OnlineBase {
        tau_chain: 2.125,
        tau_ddtree: [(8, 2.5), (32, 2.75), (64, 2.875)].into_iter().collect(),
    });
    let markdown = report::render_markdown(&build(&status));
    assert!(
        markdown.contains(
            "chain 2.50 (base 2.12) · tree@32 3.25 (base 2.75); also ddtree_8 3.00 (base \
             2.50), ddtree_64 3.50 (base 2.88), 38% below"
        ),
        "{markdown}"
    );
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
            serve_tree_budget: None,
            offline_tau: Some(4.0),
            base: None,
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
    assert!(
        json["acceptance"]["online"]["methods"][0]
            .get("base_tau")
            .is_none(),
        "a DFlash drafter has no base τ: {json}"
    );

    // A Domino drafter's online evaluation carries each method's base τ (LM head alone).
    let online = status.last_online.as_mut().unwrap();
    online.acceptance.base = Some(dflash_shared::metrics::OnlineBase {
        tau_chain: 2.125,
        tau_ddtree: [(16, 2.75), (64, 2.875)].into_iter().collect(),
    });
    let report = build(&status);
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "online at step 31,000 (16 prompts, 41.5 s): chain 2.50 (base 2.12), ddtree_16 \
             3.00 (base 2.75), ddtree_64 3.25 (base 2.88), 38% below"
        ),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    let methods = &json["acceptance"]["online"]["methods"];
    assert_eq!(methods[0]["method"], "chain");
    assert_eq!(
        (&methods[0]["tau"], &methods[0]["base_tau"]),
        (&2.5.into(), &2.125.into())
    );
    assert_eq!(methods[2]["base_tau"], 2.875);
}

/// An event after the last one of `events`, `minutes` after the incident's end.
fn later(events: &[Event], minutes: i64, kind: dflash_shared::events::EventKind) -> Event {
    Event {
        seq: events.last().unwrap().seq + 1,
        ts_ms: incident::end_ms() + minutes * 60_000,
        severity: dflash_shared::events::Severity::Warn,
        kind,
    }
}

fn torch_drift(before: &str, after: &str) -> dflash_shared::events::EventKind {
    dflash_shared::events::EventKind::EnvironmentDrift {
        field: "python.torch".into(),
        before: before.into(),
        after: after.into(),
    }
}

fn report_of(status: &StatusSnapshot, events: &[Event]) -> report::StatusReport {
    let files = files();
    report::build(&ReportInput {
        snapshot: Some(status),
        events,
        config: None,
        files: &files,
        daemon_error: None,
        now_ms: incident::end_ms() + 3_600_000,
        clock: DisplayClock::utc(),
    })
}

fn restore_lines(report: &report::StatusReport) -> Vec<&str> {
    report
        .next_steps
        .iter()
        .filter(|s| s.starts_with("Restore "))
        .map(String::as_str)
        .collect()
}

#[test]
fn next_steps_restore_the_healthy_environment_and_only_one_way() {
    let (status, mut events) = incident_data();
    // The evening: torch swapped at 20:52 (2.11.0+cu128 → 2.9.1+cu130) and nothing else.
    assert_eq!(
        restore_lines(&report_of(&status, &events)),
        [
            "Restore torch 2.11.0+cu128 (now 2.9.1+cu130), what the run trained on before 20:52, \
          or confirm the drift on purpose, before resuming."
        ]
    );
    // Then reverted: the journal holds both directions, the advice neither. It never says to
    // restore the broken build.
    events.push(later(
        &events,
        5,
        torch_drift("2.9.1+cu130", "2.11.0+cu128"),
    ));
    let reverted = report_of(&status, &events);
    assert!(
        restore_lines(&reverted).is_empty(),
        "{:?}",
        reverted.next_steps
    );
    assert!(
        !reverted
            .next_steps
            .iter()
            .any(|s| s.contains("Restore torch 2.9.1")),
        "{:?}",
        reverted.next_steps
    );
    // And swapped to a third build: restore the first, the one the run was healthy on.
    events.push(later(
        &events,
        10,
        torch_drift("2.11.0+cu128", "2.12.0+cu130"),
    ));
    assert_eq!(
        restore_lines(&report_of(&status, &events)),
        [
            "Restore torch 2.11.0+cu128 (now 2.12.0+cu130), what the run trained on before 20:52, \
          or confirm the drift on purpose, before resuming."
        ]
    );
}

#[test]
fn a_cache_gone_with_no_confirmed_delete_reads_deleted_outside_dflash() {
    let (status, events) = incident_data();
    let report = report_of(&status, &events);
    let cache_line = report
        .timeline
        .iter()
        .find(|e| e.text.starts_with("TorchInductor compile cache deleted"))
        .expect("the deletion in the timeline");
    assert!(
        cache_line
            .text
            .ends_with("; deleted outside dflash; no confirmation on record"),
        "{}",
        cache_line.text
    );
    assert!(
        report.key_decisions.is_empty(),
        "{:?}",
        report.key_decisions
    );
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "- TorchInductor compile cache: present, 400 MB, cold (deleted outside dflash at \
             2026-03-14T21:00:00.000Z; no confirmation on record)."
        ),
        "{markdown}"
    );
    assert!(
        report
            .next_steps
            .iter()
            .any(|s| s.starts_with("The TorchInductor compile cache was deleted outside dflash")),
        "{:?}",
        report.next_steps
    );
}

/// The incident's journal with a filing of "delete the torchinductor cache" at 20:59, and
/// (when `confirmed`) its confirmation and execution just before the deletion at 21:00.
fn with_a_delete_request(confirmed: bool) -> (StatusSnapshot, Vec<Event>) {
    use dflash_shared::events::{EventKind, Severity};
    let (status, events) = incident_data();
    let deletion = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::CacheChanged { change, .. } if change.starts_with("deleted")))
        .unwrap();
    let mut out: Vec<Event> = events[..deletion].to_vec();
    let mut seq = 100_000;
    let mut push = |out: &mut Vec<Event>, ts_ms: i64, kind: EventKind| {
        seq += 1;
        out.push(Event {
            seq,
            ts_ms,
            severity: Severity::Info,
            kind,
        });
    };
    let t = incident::cache_deleted_ms();
    push(
        &mut out,
        t - 60_000,
        EventKind::OperatorRequest {
            uid: 1000,
            request: "Delete the torchinductor cache (filed, awaiting confirmation)".into(),
            action_id: Some("act-3".into()),
        },
    );
    if confirmed {
        push(
            &mut out,
            t - 30_000,
            EventKind::OperatorConfirmed {
                uid: 1000,
                action_id: "act-3".into(),
                via: "tui".into(),
                client_says: None,
            },
        );
        push(
            &mut out,
            t - 29_000,
            EventKind::ActionExecuted {
                action_id: "act-3".into(),
                outcome: "deleted /srv/dflash/cache/torchinductor; the next start compiles cold"
                    .into(),
            },
        );
    }
    // Keep the journal in seq order: the request's seqs sort before the deletion's.
    let mut rest: Vec<Event> = events[deletion..].to_vec();
    for (i, e) in rest.iter_mut().enumerate() {
        e.seq = 200_000 + i as u64;
    }
    out.extend(rest);
    (status, out)
}

#[test]
fn an_unconfirmed_delete_is_listed_as_such_not_as_a_decision() {
    let (status, events) = with_a_delete_request(false);
    let report = report_of(&status, &events);
    assert!(
        report.key_decisions.is_empty(),
        "{:?}",
        report.key_decisions
    );
    assert_eq!(
        report.unconfirmed_requests,
        [
            "delete of the TorchInductor compile cache (act-3) requested by uid 1000 at 20:59, \
          never confirmed"
        ]
    );
    // A filing nobody confirmed did not delete anything: the cache still went outside dflash.
    assert!(
        report.timeline.iter().any(|e| e
            .text
            .ends_with("deleted outside dflash; no confirmation on record")),
        "{:?}",
        report.timeline
    );
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains(
            "## Key Decisions\n\n- no operator action recorded\n\n### Requested, never \
             confirmed (no decision)\n\n- delete of the TorchInductor compile cache (act-3) \
             requested by uid 1000 at 20:59, never confirmed\n"
        ),
        "{markdown}"
    );

    // Confirmed and executed: a decision, and the deletion is the operator's.
    let (status, events) = with_a_delete_request(true);
    let report = report_of(&status, &events);
    assert!(report.unconfirmed_requests.is_empty());
    assert_eq!(report.key_decisions.len(), 3, "{:?}", report.key_decisions);
    assert!(
        !report
            .timeline
            .iter()
            .any(|e| e.text.contains("outside dflash")),
        "{:?}",
        report.timeline
    );
    assert!(report
        .timeline
        .iter()
        .any(|e| e.text.ends_with("; by the confirmed action act-3")));
    assert!(report
        .next_steps
        .iter()
        .any(|s| s.starts_with("Let the TorchInductor compile cache re-warm")));
}

#[test]
fn the_report_never_calls_throughput_stable_while_a_throughput_alert_is_active() {
    let (mut status, events) = incident_data();
    // A status whose throughput judgement lags its alerts.
    status.throughput.stable_since_ms = Some(incident::start_ms());
    let report = report_of(&status, &events);
    assert!(report.alerts.iter().any(|a| a.detector == "throughput"));
    assert_eq!(report.throughput.stable_since, None);
    // Blocked names every alert, the three drafters' memory in one line.
    let blocked = &report.progress.blocked;
    for alert in &report.alerts {
        assert!(
            blocked.iter().any(|b| b.contains(&alert.detector)),
            "{} not in {blocked:?}",
            alert.detector
        );
    }
    assert!(blocked.contains(
        &"GPU 5–7 memory volatile, Warn (detectors memory:gpu5, memory:gpu6, memory:gpu7)."
            .to_string()
    ));
    // Without the alert the daemon's "stable since" stands.
    status.alerts.retain(|a| a.detector != "throughput");
    assert!(report_of(&status, &events)
        .throughput
        .stable_since
        .is_some());
}

/// The healthy record of the evening before the swap: 21.5K tok/s on torch 2.11.0+cu128.
fn healthy_record() -> dflash_shared::health::healthy_record::HealthyRecord {
    use dflash_shared::health::healthy_record::{HealthyRecord, HealthyThroughput, FORMAT};
    use dflash_shared::health::Fingerprint;
    HealthyRecord {
        format: FORMAT,
        recorded_ms: incident::at(20, 40, 0),
        healthy_since_ms: incident::at(20, 0, 0),
        run_name: "qwen36-27b-dflash".into(),
        run_dir: incident::RUN_DIR.into(),
        recipe: "3fa9c2d1e0b47a65".into(),
        step: 30_000,
        throughput: HealthyThroughput {
            tokens_per_s: 21_500.0,
            draft_positions_per_s: 3_100.0,
            samples: 240,
            basis: None,
        },
        memory: Vec::new(),
        queue: None,
        step_times: Default::default(),
        fingerprint: Fingerprint {
            python_packages: [("torch".to_string(), "2.11.0+cu128".to_string())].into(),
            ..Fingerprint::default()
        },
        caches: Vec::new(),
        config_digest: None,
        data_digest: None,
        mean_row_tokens: None,
        commit: None,
        topology: "5 target + 3 drafter GPUs".into(),
        device_models: Vec::new(),
    }
}

#[test]
fn the_report_shows_the_healthy_record_how_to_forget_it_and_restores_towards_it() {
    let (mut status, mut events) = incident_data();
    status.healthy_record = Some(Box::new(healthy_record()));
    // Reverted, then swapped to a third build: the record names the build to restore.
    events.push(later(
        &events,
        5,
        torch_drift("2.9.1+cu130", "2.12.0+cu130"),
    ));
    let report = report_of(&status, &events);
    let summary = report.healthy_record_summary.as_deref().unwrap();
    assert_eq!(
        summary,
        "Healthy record: 21.5K tok/s and 3.1K draft positions/s over 240 healthy steps, \
         recorded 2026-03-14 20:40 by run qwen36-27b-dflash at step 30,000 (recipe \
         3fa9c2d1e0b47a65, 5 target + 3 drafter GPUs); throughput is judged against it. To \
         forget it (a slowdown that is on purpose): F in `dflash-tui attach`, with typed \
         confirmation."
    );
    let markdown = report::render_markdown(&report);
    assert!(markdown.contains(&format!("- {summary}")), "{markdown}");
    assert_eq!(
        restore_lines(&report),
        [
            "Restore torch 2.11.0+cu128 (now 2.12.0+cu130), as in the healthy record of \
          2026-03-14 20:40, or confirm the drift on purpose, before resuming."
        ]
    );
}

#[test]
fn the_report_names_the_objective_and_a_domino_runs_base_and_final_acceptance() {
    use dflash_shared::config::{DrafterHead, Objective};
    use dflash_shared::status::{DominoAcceptance, RunObjective};
    let (mut status, events) = incident_data();
    let dflash = report::render_markdown(&report_of(&status, &events));
    assert!(
        dflash.contains("- objective: DFlash; drafter head: DFlash.\n"),
        "{dflash}"
    );
    assert!(!dflash.contains("Domino correction"), "{dflash}");

    status.run.objective = Some(RunObjective::new(Objective::Dpace, 0.5));
    status.run.drafter_head = Some(DrafterHead::Domino);
    status.last_domino = Some(DominoAcceptance {
        step: 31_000,
        ts_ms: incident::end_ms(),
        accept_len: 2.87,
        base_accept_len: 2.31,
    });
    let report = report_of(&status, &events);
    let markdown = report::render_markdown(&report);
    assert!(
        markdown.contains("- objective: D-PACE (α 0.5); drafter head: Domino.\n"),
        "{markdown}"
    );
    assert!(
        markdown.contains(
            "- acceptance: base 2.31 → final 2.87 (Domino correction +0.56) on the training \
             batch at step 31,000 (teacher-forced: the metrics' `base_accept_len` → \
             `accept_len`)."
        ),
        "{markdown}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["run"]["objective"], "D-PACE (α 0.5)");
    assert_eq!(json["acceptance"]["domino"]["base_accept_len"], 2.31);

    // A daemon older than these fields sends none of them.
    status.run.objective = None;
    status.run.drafter_head = None;
    status.last_domino = None;
    let old = report::render_markdown(&report_of(&status, &events));
    assert!(
        old.contains(
            "- objective: unknown (the daemon did not report it); drafter head: unknown (the \
             daemon did not report it).\n"
        ),
        "{old}"
    );
}
