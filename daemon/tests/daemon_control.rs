//! The control plane of a training `dflashd`: bad frames never disturb training, and a stop
//! confirmed through the protocol checkpoints, answers with the checkpoint and exits 0,
//! while the confirming connection keeps receiving its subscribed frames.
mod common;
mod daemon_support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{error_code, Client};
use daemon_support::{checkpoint_steps, journal, Daemon};
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
        |k| matches!(k, EventKind::OperatorConfirmed { action_id, via, .. } if *action_id == pending.id && via == "test")
    ));
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
