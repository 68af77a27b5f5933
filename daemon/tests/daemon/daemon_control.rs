//! The control plane of a training `dflashd`: bad frames never disturb training, and a stop
//! confirmed through the protocol checkpoints, answers with the checkpoint and exits 0,
//! while the confirming connection keeps receiving its subscribed frames.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::support::binary::{
    checkpoint_steps, journal, request_and_confirm, write_config, Daemon,
};
use crate::support::in_process::{error_code, Client};
use dflash_shared::actions::Action;
use dflash_shared::events::EventKind;
use dflash_shared::protocol::{ErrorCode, Request, Response, Topic, MAX_FRAME_BYTES};

#[test]
fn bad_frames_get_errors_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::spawn(tmp.path(), &[]);
    let before = d.wait_step_above(0);
    let mut c = d.client();

    c.send_raw(b"\x00\xff\xfe garbage\n");
    assert_eq!(error_code(&c.recv().unwrap()), ErrorCode::BadFrame);
    c.send_raw(br#"{"type":"launch_missiles"}"#);
    c.send_raw(b"\n");
    assert_eq!(error_code(&c.recv().unwrap()), ErrorCode::UnknownRequest);
    let mut huge = vec![b'x'; MAX_FRAME_BYTES + 10];
    huge.push(b'\n');
    c.send_raw(&huge);
    assert_eq!(error_code(&c.recv().unwrap()), ErrorCode::FrameTooLarge);
    // The same connection still answers properly afterwards.
    assert!(matches!(c.request(&Request::Status), Response::Status(_)));

    // A wrong protocol version is refused and that connection closed.
    let mut old = Client::connect(&d.socket);
    old.send_raw(b"{\"type\":\"hello\",\"version\":999,\"client\":\"future\"}\n");
    assert_eq!(error_code(&old.recv().unwrap()), ErrorCode::VersionMismatch);
    assert!(old.recv().is_none(), "closed after a version mismatch");
    // A client that sends half a frame and vanishes.
    let mut half = UnixStream::connect(&d.socket).unwrap();
    half.write_all(b"{\"type\":\"hel").unwrap();
    drop(half);

    let after = d.wait_step_above(before + 2);
    assert!(after > before);
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the daemon is unaffected"
    );
    assert!(
        d.stderr().is_empty() || !d.stderr().contains("panicked"),
        "{}",
        d.stderr()
    );
    d.signal(libc::SIGTERM);
    assert!(d.wait_exit().success());
}

#[test]
fn a_confirmed_stop_checkpoints_answers_with_it_and_exits_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::spawn(tmp.path(), &[]);
    d.wait_step_above(1);
    let mut c = d.client();
    assert_eq!(
        c.request(&Request::Subscribe {
            topics: vec![Topic::Events, Topic::Metrics]
        }),
        Response::Ok
    );
    // Replies and pushed frames interleave from here on.
    c.send(&Request::RequestAction {
        action: Action::StopRun,
    });
    let pending = loop {
        match c.recv().expect("the pending action") {
            Response::Pending { action } => break action,
            Response::Error { message, .. } => panic!("{message}"),
            _ => continue,
        }
    };
    assert!(
        pending
            .consequences
            .iter()
            .any(|c| c.contains("writes a final checkpoint")),
        "{:?}",
        pending.consequences
    );
    c.send(&Request::Confirm {
        action_id: pending.id.clone(),
        run_name: "tiny-cpu".into(),
        via: "test".into(),
    });
    c.set_read_timeout(Duration::from_secs(30));
    let (mut executed, mut stopped_event) = (None, None);
    while let Some(frame) = c.recv() {
        match frame {
            Response::Executed { action_id, outcome } => {
                assert_eq!(action_id, pending.id);
                executed = Some(outcome);
            }
            Response::Event(e) => {
                if let EventKind::RunStopped { checkpoint, .. } = e.kind {
                    stopped_event = checkpoint;
                }
            }
            Response::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    let outcome = executed.expect("the confirmation is answered");
    let checkpoint = stopped_event.expect("the stop's event reaches the confirming subscriber");
    assert!(
        outcome.contains(&checkpoint),
        "{outcome} names {checkpoint}"
    );
    assert!(std::path::Path::new(&checkpoint)
        .join("manifest.json")
        .is_file());
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let step = last_journaled_checkpoint(&d.run_dir);
    assert_eq!(checkpoint_steps(&d.run_dir).last(), Some(&step));
    let kinds: Vec<EventKind> = journal(&d.run_dir).into_iter().map(|e| e.kind).collect();
    assert!(kinds.iter().any(
        |k| matches!(k, EventKind::OperatorConfirmed { action_id, via, client_says: Some(says), .. } if *action_id == pending.id && says == "test" && via.contains("full connection") && via.ends_with(&format!("from pid {}", std::process::id())))
    ), "the journal's via is what dflashd established (this test's pid over a full connection), the client's word apart");
}

/// The step of the newest journaled checkpoint.
fn last_journaled_checkpoint(run_dir: &std::path::Path) -> u64 {
    journal(run_dir)
        .into_iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::CheckpointWritten { step, .. } => Some(step),
            _ => None,
        })
        .expect("a checkpoint was journaled")
}

#[test]
fn kill_exits_without_a_checkpoint_and_says_what_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::spawn(tmp.path(), &[]);
    d.wait_step_above(1);
    let mut c = d.client();
    let (id, reply) = request_and_confirm(&mut c, Action::Kill);
    match reply {
        Response::Executed { outcome, .. } => {
            assert!(
                outcome.contains("without a checkpoint") && outcome.contains("lost"),
                "{outcome}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(d.wait_exit().success(), "{}", d.stderr());
    assert!(
        checkpoint_steps(&d.run_dir).is_empty(),
        "a kill writes no checkpoint"
    );
    let journaled = journal(&d.run_dir).into_iter().any(|e| {
        matches!(e.kind, EventKind::RunStopped { ref reason, checkpoint: None } if reason.contains(&id))
    });
    assert!(journaled, "the kill is journaled");
}

#[test]
fn power_off_runs_the_configured_command_after_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let marker = root.join("powered-off.txt");
    // The "power-off command" records which checkpoints existed when it ran.
    let command = format!(
        "ls {} > {}",
        root.join("run/checkpoints").display(),
        marker.display()
    );
    let config = root.join("run.toml");
    write_config(&config, |c| {
        c.control.poweroff_command = Some(vec!["sh".into(), "-c".into(), command]);
    });
    let mut d = Daemon::spawn(root, &["--config", &config.display().to_string()]);
    d.wait_step_above(1);
    let mut c = d.client();
    let (_, reply) = request_and_confirm(&mut c, Action::PowerOff);
    match reply {
        Response::Executed { outcome, .. } => {
            assert!(outcome.contains("accepted the power-off"), "{outcome}")
        }
        other => panic!("{other:?}"),
    }
    assert!(d.wait_exit().success(), "{}", d.stderr());
    let step = last_journaled_checkpoint(&d.run_dir);
    let listed = std::fs::read_to_string(&marker).expect("the power-off command ran");
    assert!(
        listed.contains(&format!("step-{step:010}")),
        "ran after the checkpoint: {listed}"
    );
}

#[test]
fn a_failed_checkpoint_pauses_the_run_keeps_serving_and_never_trains_on() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("run.toml");
    write_config(&config, |c| c.training.checkpoint_every = 3);
    let mut d = Daemon::spawn(root, &["--config", &config.display().to_string()]);
    d.wait_step_above(3);
    // The checkpoint directory becomes a file: the next checkpoint write fails for real.
    let (ckpts, kept) = (d.run_dir.join("checkpoints"), root.join("kept"));
    std::fs::create_dir_all(&kept).unwrap();
    for attempt in 0.. {
        let _ = std::fs::rename(&ckpts, kept.join(format!("c{attempt}")));
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&ckpts)
            .is_ok()
        {
            break;
        }
    }
    let deadline = std::time::Instant::now() + crate::support::binary::WAIT;
    let paused = loop {
        let s = d.status();
        if s.run.state == dflash_shared::status::RunState::Paused {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never paused:\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let alert = paused
        .alerts
        .iter()
        .find(|a| a.detector == "run")
        .expect("the run detector's alert says why");
    assert!(
        alert.message.contains("checkpoint") && alert.message.contains("paused"),
        "{}",
        alert.message
    );
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        d.status().run.step,
        paused.run.step,
        "a paused run does not train on"
    );
    assert!(d.stderr().contains("Training is paused"), "{}", d.stderr());
    let kinds: Vec<EventKind> = journal(&d.run_dir).into_iter().map(|e| e.kind).collect();
    assert!(kinds
        .iter()
        .any(|k| matches!(k, EventKind::WorkerFailed { .. })));
    assert!(kinds
        .iter()
        .any(|k| matches!(k, EventKind::RunPaused { .. })));

    let mut c = d.client();
    match request_and_confirm(&mut c, Action::StopRun).1 {
        Response::Executed { outcome, .. } => {
            assert!(outcome.contains("paused after a failed step"), "{outcome}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(d.wait_exit().code(), Some(1), "a failed run exits non-zero");
}
