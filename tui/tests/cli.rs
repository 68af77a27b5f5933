//! The `dflash-tui` binary's headless subcommands, run as child processes against the test
//! harness (`support::test_daemon`) or against the daemon's files.
mod support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::protocol::{Request, Response};
use dflash_shared::status::StatusSnapshot;
use support::incident;
use support::test_daemon::{Script, TestDaemon};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::timeout;

const BIN: &str = env!("CARGO_BIN_EXE_dflash-tui");
const WAIT: Duration = Duration::from_secs(20);

fn incident_status() -> StatusSnapshot {
    incident::generate(incident::SEED)
        .into_iter()
        .rev()
        .find_map(|f| match f.frame {
            Response::Status(s) => Some(*s),
            _ => None,
        })
        .unwrap()
}

fn incident_events() -> Vec<Event> {
    incident::generate(incident::SEED)
        .into_iter()
        .filter_map(|f| match f.frame {
            Response::Event(e) => Some(*e),
            _ => None,
        })
        .collect()
}

/// The binary with a clean environment: no terminal, XDG dirs inside `home`, UTC clock.
fn command(home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(home: &Path, args: &[&str]) -> Output {
    timeout(WAIT, command(home, args).output())
        .await
        .expect("the command finishes")
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn pending_stop(status: &StatusSnapshot) -> PendingAction {
    PendingAction {
        id: "act-9".into(),
        action: Action::StopRun,
        requested_by_uid: 1000,
        created_ms: status.run.started_ms,
        expires_ms: i64::MAX / 2,
        consequences: vec!["last checkpoint 0 min ago".into()],
    }
}

async fn harness(dir: &Path, customize: impl FnOnce(&mut Script)) -> TestDaemon {
    let mut script = Script::new(incident_status());
    script.events = incident_events();
    customize(&mut script);
    TestDaemon::start(&dir.join("d.sock"), script).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_only_files_a_request_and_prints_its_consequences() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = harness(dir.path(), |s| {
        s.consequences = vec![
            "last checkpoint 14 min ago".into(),
            "stable at 12.8K tok/s for 3 h".into(),
        ]
    })
    .await;
    let socket = daemon.socket.display().to_string();
    let out = run(dir.path(), &["stop", "--socket", &socket]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("Filed pending request act-1 for run qwen36-27b-dflash"),
        "{text}"
    );
    assert!(text.contains("  - stable at 12.8K tok/s for 3 h"), "{text}");
    assert!(text.contains("--token act-1 --yes-i-know"), "{text}");

    let out = run(dir.path(), &["stop", "--poweroff", "--socket", &socket]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let requests = daemon.requests();
    assert!(requests.contains(&Request::RequestAction {
        action: Action::StopRun
    }));
    assert!(requests.contains(&Request::RequestAction {
        action: Action::PowerOff
    }));
    assert!(!requests
        .iter()
        .any(|r| matches!(r, Request::Confirm { .. })));
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_stop_without_a_terminal_refuses_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let status = incident_status();
    let daemon = harness(dir.path(), |s| s.pending = vec![pending_stop(&status)]).await;
    let socket = daemon.socket.display().to_string();

    let out = run(dir.path(), &["confirm-stop", "--socket", &socket]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("[1] act-9: Stop the run (checkpoint, then exit)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("needs an interactive terminal"),
        "{}",
        stderr(&out)
    );

    let out = run(
        dir.path(),
        &["confirm-stop", "--token", "act-9", "--socket", &socket],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--token needs --yes-i-know"),
        "{}",
        stderr(&out)
    );

    assert!(!daemon
        .requests()
        .iter()
        .any(|r| matches!(r, Request::Confirm { .. })));
    assert_eq!(
        daemon.script().lock().unwrap().pending.len(),
        1,
        "still pending"
    );
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audited_token_form_confirms_and_reports_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let status = incident_status();
    let checkpoint = format!("{}/checkpoints/step-00031690", incident::RUN_DIR);
    let daemon = harness(dir.path(), |s| {
        s.pending = vec![pending_stop(&status)];
        s.after_confirm = vec![
            Response::Event(Box::new(Event {
                seq: 9_000,
                ts_ms: incident::end_ms(),
                severity: Severity::Info,
                kind: EventKind::CheckpointWritten {
                    step: 31_690,
                    path: checkpoint.clone(),
                    bytes: 5_800_000_000,
                },
            })),
            Response::Event(Box::new(Event {
                seq: 9_001,
                ts_ms: incident::end_ms(),
                severity: Severity::Info,
                kind: EventKind::RunStopped {
                    reason: "confirmed stop act-9".into(),
                    checkpoint: Some(checkpoint.clone()),
                },
            })),
        ];
    })
    .await;
    let socket = daemon.socket.display().to_string();
    let out = run(
        dir.path(),
        &[
            "confirm-stop",
            "--token",
            "act-9",
            "--yes-i-know",
            "--socket",
            &socket,
        ],
    )
    .await;
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("Confirmed act-9: checkpointing, then stopping"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "Checkpoint written: {checkpoint} (step 31690, 5.8 GB)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("final checkpoint: {checkpoint}")),
        "{text}"
    );
    assert!(daemon.requests().contains(&Request::Confirm {
        action_id: "act-9".into(),
        run_name: incident::RUN_NAME.into(),
        via: "token".into(),
    }));
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_markdown_sections_and_json_keys() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = harness(dir.path(), |s| {
        s.config = serde_json::json!({
            "training": {"precision": "bf16", "epochs": 6, "num_anchors": 1024},
            "drafter": {"block_size": 32, "target_layer_ids": [1, 16, 31, 46, 61]},
            "data": {"train_file": "/srv/data/chat.jsonl"}
        })
    })
    .await;
    let socket = daemon.socket.display().to_string();
    let out = run(dir.path(), &["status", "--socket", &socket]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let md = stdout(&out);
    for section in [
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "### Done",
        "### In Progress",
        "### Blocked",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
        "## Relevant Files",
    ] {
        assert!(md.contains(section), "missing {section} in\n{md}");
    }
    assert!(md.contains("torch 2.11.0+cu128 → 2.9.1+cu130"), "{md}");
    assert!(md.contains("training.num_anchors = 1024"), "{md}");
    assert!(md.contains("/srv/data/chat.jsonl"), "{md}");

    let out = run(
        dir.path(),
        &["status", "--format", "json", "--socket", &socket],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    for pointer in ["/run/name", "/run/state", "/run/step", "/run/epoch"] {
        assert!(json.pointer(pointer).is_some(), "missing {pointer}");
    }
    assert_eq!(json["run"]["name"], incident::RUN_NAME);
    assert!(json["throughput"]["tokens_per_s"].is_number());
    assert!(json["throughput"]["baseline_tokens_per_s"].is_number());
    assert_eq!(json["gpus"].as_array().map(Vec::len), Some(8));
    assert!(json["queue"]["depth"].is_number());
    assert!(json["caches"].is_array());
    assert_eq!(json["alerts"][0]["level"], "crit");
    assert!(json["pending_actions"].is_array());
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_the_journal_as_text_or_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = harness(dir.path(), |_| {}).await;
    let socket = daemon.socket.display().to_string();
    let out = run(
        dir.path(),
        &["tail", "--socket", &socket, "--level", "warn"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("WARN  event  env-drift torch 2.11.0+cu128 → 2.9.1+cu130"),
        "{text}"
    );
    assert!(
        !text.contains("checkpoint"),
        "info lines are filtered: {text}"
    );

    let out = run(
        dir.path(),
        &[
            "tail",
            "--json",
            "--socket",
            &socket,
            "--since",
            "2026-03-14T21:00:00Z",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(!lines.is_empty());
    assert!(lines
        .iter()
        .all(|l| l["ts_ms"].as_i64().unwrap() >= incident::cache_deleted_ms()));
    assert!(lines
        .iter()
        .any(|l| l["data"]["kind"] == "regression_started"));
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reads_the_daemons_files_when_it_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run-dir");
    let logs = dir.path().join("state-dir/logs");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let journal: String = incident_events()
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    std::fs::write(
        run_dir.join("journal.jsonl"),
        journal + "torn line without end",
    )
    .unwrap();
    std::fs::write(
        logs.join("dflashd.2026-03-14.jsonl"),
        r#"{"timestamp":"2026-03-14T20:52:30.000Z","level":"WARN","fields":{"message":"fingerprint changed: python.torch"},"target":"dflashd::telemetry"}"#.to_string() + "\n",
    )
    .unwrap();
    std::fs::write(
        logs.join("dflashd.2026-03-14.log"),
        "2026-03-14T20:52:30.000Z  WARN duplicate\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &[
            "tail",
            "--socket",
            &dir.path().join("absent.sock").display().to_string(),
            "--state-dir",
            &dir.path().join("state-dir").display().to_string(),
            "--run-dir",
            &run_dir.display().to_string(),
            "--level",
            "warn",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("reading the daemon's files"),
        "{}",
        stderr(&out)
    );
    let text = stdout(&out);
    let drift = text.find("env-drift").expect("journal line");
    let log = text.find("fingerprint changed").expect("log line");
    let deleted = text
        .find("compile cache deleted")
        .expect("later journal line");
    assert!(drift < log && log < deleted, "merged by time: {text}");
    assert!(
        !text.contains("duplicate"),
        "the human log repeats the JSON log: {text}"
    );
}

/// Writes a journal into `run_dir` and a JSON log line into `state_dir/logs`, the way the daemon
/// does.
fn write_daemon_files(state_dir: &Path, run_dir: &Path) {
    std::fs::create_dir_all(run_dir).unwrap();
    std::fs::create_dir_all(state_dir.join("logs")).unwrap();
    let journal: String = incident_events()
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    std::fs::write(run_dir.join("journal.jsonl"), journal).unwrap();
    std::fs::write(
        state_dir.join("logs/dflashd.2026-03-14.jsonl"),
        r#"{"timestamp":"2026-03-14T20:52:30.000Z","level":"WARN","fields":{"message":"fingerprint changed: python.torch"},"target":"dflashd::telemetry"}"#.to_string() + "\n",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_dirs_tail_reads_where_the_daemon_writes_by_default() {
    let home = tempfile::tempdir().unwrap();
    let socket = home.path().join("absent.sock").display().to_string();
    let args = ["tail", "--socket", &socket, "--level", "warn"];
    let read_both = |out: &Output| {
        assert!(out.status.success(), "{}", stderr(out));
        let text = stdout(out);
        assert!(text.contains("env-drift"), "journal line: {text}");
        assert!(text.contains("fingerprint changed"), "log line: {text}");
    };

    // $XDG_STATE_HOME/dflash and $XDG_DATA_HOME/dflash/runs/default.
    write_daemon_files(
        &home.path().join("state/dflash"),
        &home.path().join("data/dflash/runs/default"),
    );
    read_both(&run(home.path(), &args).await);

    // A relative XDG value is ignored and an unset one falls back: under ~/.local.
    let home = tempfile::tempdir().unwrap();
    write_daemon_files(
        &home.path().join(".local/state/dflash"),
        &home.path().join(".local/share/dflash/runs/default"),
    );
    let mut cmd = command(home.path(), &args);
    cmd.env("XDG_STATE_HOME", "state")
        .env_remove("XDG_DATA_HOME");
    let out = timeout(WAIT, cmd.output()).await.unwrap().unwrap();
    read_both(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follow_streams_each_line_as_it_happens_through_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = harness(dir.path(), |s| s.events.clear()).await;
    let socket = daemon.socket.display().to_string();
    let mut child = command(dir.path(), &["tail", "--follow", "--socket", &socket])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    timeout(WAIT, async {
        while !daemon
            .requests()
            .iter()
            .any(|r| matches!(r, Request::Subscribe { .. }))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("tail subscribes");
    daemon.push(Response::Event(Box::new(Event {
        seq: 1,
        ts_ms: incident::end_ms(),
        severity: Severity::Warn,
        kind: EventKind::Note {
            message: "first pushed line".into(),
        },
    })));
    let line = timeout(WAIT, lines.next_line())
        .await
        .expect("a line arrives while tail keeps running")
        .unwrap()
        .unwrap();
    assert!(line.contains("first pushed line"), "{line}");
    assert!(child.try_wait().unwrap().is_none(), "still following");
    child.kill().await.unwrap();
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_replay_refuse_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["attach", "--socket", "/nonexistent.sock"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("dflash-tui tail --follow"),
        "{}",
        stderr(&out)
    );
    let out = run(dir.path(), &["replay", incident::FIXTURE]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("interactive terminal"),
        "{}",
        stderr(&out)
    );
    let out = run(dir.path(), &["replay", "/nonexistent.jsonl"]).await;
    assert!(
        stderr(&out).contains("cannot read recording /nonexistent.jsonl"),
        "{}",
        stderr(&out)
    );
}
