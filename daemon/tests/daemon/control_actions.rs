//! Destructive actions end to end: request → pending with consequences → typed confirmation
//! → re-check → the run loop (a real thread on the handle's command channel) acts.

use std::time::Duration;

use crate::support::in_process::{error_code, TestDaemon, RUN_NAME};
use dflash_shared::actions::Action;
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::metrics::CacheState;
use dflash_shared::protocol::{ErrorCode, Request, Response};
use dflash_shared::status::{CheckpointInfo, RunState};
use dflashd::run::handle::RunCommand;
use dflashd::run::journal::JournalQuery;

fn uid() -> u32 {
    unsafe { libc::geteuid() }
}

fn journal_kinds(d: &TestDaemon) -> Vec<EventKind> {
    d.handle
        .with_journal(|j| j.query(&JournalQuery::default()))
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

#[test]
fn stop_runs_only_after_a_typed_confirmation_and_the_run_loop_checkpoints() {
    let mut d = TestDaemon::start();
    d.handle.set_run_state(RunState::Training);
    d.handle
        .add_checkpoint(CheckpointInfo {
            step: 800,
            path: "/runs/a/ckpt-800".into(),
            written_ms: 1,
            bytes: 10,
        })
        .unwrap();
    // A stand-in run loop: a real thread that serves the command channel like the trainer will.
    let commands = d.handle.attach_run_loop();
    let h = d.handle.clone();
    let run_loop =
        std::thread::spawn(
            move || match commands.recv_timeout(Duration::from_secs(10)).unwrap() {
                RunCommand::Stop { action_id, reply } => {
                    h.set_run_state(RunState::Stopping);
                    let ckpt = "/runs/a/ckpt-900".to_string();
                    h.record_event(
                        Severity::Info,
                        EventKind::RunStopped {
                            reason: format!("operator ({action_id})"),
                            checkpoint: Some(ckpt.clone()),
                        },
                    )
                    .unwrap();
                    reply
                        .send(Ok(format!("checkpoint written: {ckpt} (step 900)")))
                        .unwrap();
                }
                other => panic!("{other:?}"),
            },
        );

    let mut c = d.client();
    let pending = match c.request(&Request::RequestAction {
        action: Action::StopRun,
    }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    assert!(pending.id.starts_with("stop-"));
    assert!(
        pending
            .consequences
            .iter()
            .any(|s| s.contains("last checkpoint") && s.contains("step 800")),
        "{:?}",
        pending.consequences
    );
    assert!(!run_loop.is_finished(), "a request alone must not act");

    let wrong = c.request(&Request::Confirm {
        action_id: pending.id.clone(),
        run_name: "qwen27b".into(),
        via: "test".into(),
    });
    assert_eq!(error_code(&wrong), ErrorCode::WrongRunName);
    match c.request(&Request::Status) {
        Response::Status(s) => assert_eq!(
            s.pending_actions.len(),
            1,
            "a typo keeps the action pending"
        ),
        other => panic!("{other:?}"),
    }

    let done = c.request(&Request::Confirm {
        action_id: pending.id.clone(),
        run_name: RUN_NAME.into(),
        via: "test".into(),
    });
    match done {
        Response::Executed { action_id, outcome } => {
            assert_eq!(action_id, pending.id);
            assert_eq!(outcome, "checkpoint written: /runs/a/ckpt-900 (step 900)");
        }
        other => panic!("{other:?}"),
    }
    run_loop.join().unwrap();
    d.join(); // a completed stop shuts the daemon down
    assert!(d.handle.shutdown_reason().unwrap().contains(&pending.id));

    let kinds = journal_kinds(&d);
    assert!(kinds.iter().any(|k| matches!(k, EventKind::OperatorRequest { uid: u, action_id: Some(id), .. } if *u == uid() && *id == pending.id)));
    assert!(kinds.iter().any(|k| matches!(k, EventKind::OperatorRequest { request, .. } if request.contains("refused"))), "failed confirmations are audited");
    assert!(kinds.iter().any(|k| matches!(k, EventKind::OperatorConfirmed { uid: u, via, client_says: Some(says), .. } if *u == uid() && via.starts_with("run name matched on full connection") && says == "test")));
    assert!(kinds.iter().any(
        |k| matches!(k, EventKind::ActionExecuted { outcome, .. } if outcome.contains("ckpt-900"))
    ));
}

#[test]
fn deleting_a_cache_is_refused_while_workers_run_and_done_when_paused() {
    let d = TestDaemon::start();
    let cache_dir = d.dir.path().join("torchinductor_op");
    std::fs::create_dir_all(cache_dir.join("fx")).unwrap();
    std::fs::write(cache_dir.join("fx/k.bin"), vec![0u8; 1000]).unwrap();
    d.handle.set_caches(vec![CacheState {
        name: "torchinductor".into(),
        path: cache_dir.display().to_string(),
        present: true,
        size_bytes: 1000,
        entries: 1,
        last_change_ms: None,
        warm: true,
    }]);
    d.handle.set_run_state(RunState::Training);
    let mut c = d.client();
    let del = Action::DeleteCache {
        name: "torchinductor".into(),
    };
    match c.request(&Request::RequestAction {
        action: del.clone(),
    }) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Refused);
            assert!(message.contains("workers are running"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    d.handle.set_run_state(RunState::Paused);
    let pending = match c.request(&Request::RequestAction { action: del }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    assert!(
        pending.consequences[0].contains("1.0 kB cache, 1 entries"),
        "{:?}",
        pending.consequences
    );
    assert!(cache_dir.exists());
    match c.request(&Request::Confirm {
        action_id: pending.id,
        run_name: RUN_NAME.into(),
        via: "test".into(),
    }) {
        Response::Executed { outcome, .. } => assert!(outcome.starts_with("deleted"), "{outcome}"),
        other => panic!("{other:?}"),
    }
    assert!(!cache_dir.exists());
    assert!(journal_kinds(&d).iter().any(|k| matches!(k, EventKind::CacheChanged { change, .. } if change.starts_with("deleted by operator"))));
}

#[test]
fn a_cache_deletion_confirmed_after_the_run_resumed_is_refused() {
    let d = TestDaemon::start();
    let cache_dir = d.dir.path().join("triton");
    std::fs::create_dir_all(&cache_dir).unwrap();
    std::fs::write(cache_dir.join("k"), "x").unwrap();
    d.handle.set_caches(vec![CacheState {
        name: "triton".into(),
        path: cache_dir.display().to_string(),
        present: true,
        size_bytes: 1,
        entries: 1,
        last_change_ms: None,
        warm: true,
    }]);
    d.handle.set_run_state(RunState::Paused);
    let mut c = d.client();
    let pending = match c.request(&Request::RequestAction {
        action: Action::DeleteCache {
            name: "triton".into(),
        },
    }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    d.handle.set_run_state(RunState::WarmingUp);
    let reply = c.request(&Request::Confirm {
        action_id: pending.id,
        run_name: RUN_NAME.into(),
        via: "test".into(),
    });
    assert_eq!(error_code(&reply), ErrorCode::Refused);
    assert!(cache_dir.exists(), "nothing deleted");
}

#[test]
fn cancel_and_unlock() {
    let d = TestDaemon::start();
    let mut c = d.client();
    let p = match c.request(&Request::RequestAction {
        action: Action::Kill,
    }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        c.request(&Request::Cancel {
            action_id: p.id.clone()
        }),
        Response::Ok
    );
    let gone = c.request(&Request::Confirm {
        action_id: p.id,
        run_name: RUN_NAME.into(),
        via: "t".into(),
    });
    assert_eq!(error_code(&gone), ErrorCode::NoSuchAction);

    let p = match c.request(&Request::RequestAction {
        action: Action::UnlockKey {
            key: "block_size".into(),
        },
    }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        c.request(&Request::Confirm {
            action_id: p.id,
            run_name: RUN_NAME.into(),
            via: "t".into()
        }),
        Response::Executed { .. }
    ));
    assert_eq!(d.handle.unlocked_keys(), vec!["block_size".to_string()]);
    let poweroff = c.request(&Request::RequestAction {
        action: Action::PowerOff,
    });
    assert_eq!(
        error_code(&poweroff),
        ErrorCode::Refused,
        "power-off is disabled by default"
    );
}

#[test]
fn poweroff_when_configured_stops_then_runs_the_command() {
    let mut policy = dflashd::run::pending::ActionPolicy::new(RUN_NAME);
    // `true` stands in for `systemctl poweroff`: a real process whose exit status is checked.
    policy.poweroff_command = Some(vec!["true".into()]);
    let mut d = TestDaemon::start_with(crate::support::in_process::Options {
        policy,
        ..Default::default()
    });
    d.handle.set_run_state(RunState::Training);
    let mut c = d.client();
    let p = match c.request(&Request::RequestAction {
        action: Action::PowerOff,
    }) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    assert!(
        p.consequences.iter().any(|s| s.contains("`true`")),
        "{:?}",
        p.consequences
    );
    match c.request(&Request::Confirm {
        action_id: p.id,
        run_name: RUN_NAME.into(),
        via: "t".into(),
    }) {
        Response::Executed { outcome, .. } => {
            assert!(
                outcome.contains("no training loop is running")
                    && outcome.contains("`true` accepted the power-off"),
                "{outcome}"
            );
        }
        other => panic!("{other:?}"),
    }
    d.join();
}
