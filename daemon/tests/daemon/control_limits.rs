//! No client can lock up the control plane (issue 15, defects 1 and 2): pending requests are
//! bounded, the status always fits one frame, silent and idle connections give way, and a few
//! slots stay free of subscribers for requests such as a stop and its confirmation.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::support::in_process::{error_code, Client, Options, TestDaemon};
use dflash_shared::actions::Action;
use dflash_shared::protocol::{encode_frame, ErrorCode, Request, Response, Topic, MAX_FRAME_BYTES};
use dflash_shared::status::RunState;
use dflashd::run::pending::{DEFAULT_MAX_PENDING_PER_CLIENT, DEFAULT_MAX_PENDING_TOTAL};

const STOP: Request = Request::RequestAction {
    action: Action::StopRun,
};

#[test]
fn a_flood_of_stop_requests_is_bounded_and_status_stays_one_frame() {
    let d = TestDaemon::start();
    d.handle.set_run_state(RunState::Training);
    // The flood: 4,000 requests over one connection.
    let mut flood = d.client();
    let mut filed = 0;
    let mut refusal = None;
    for _ in 0..4000 {
        match flood.request(&STOP) {
            Response::Pending { .. } => filed += 1,
            Response::Error { code, message } => {
                assert_eq!(code, ErrorCode::Refused, "{message}");
                refusal.get_or_insert(message);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(filed, DEFAULT_MAX_PENDING_PER_CLIENT);
    let refusal = refusal.expect("the flood was refused past the per-connection bound");
    assert!(refusal.contains("per-connection limit"), "{refusal}");

    // Many connections each filing their share: the daemon-wide bound holds.
    for _ in 0..(DEFAULT_MAX_PENDING_TOTAL / DEFAULT_MAX_PENDING_PER_CLIENT + 2) {
        let mut c = d.client();
        for _ in 0..DEFAULT_MAX_PENDING_PER_CLIENT {
            c.request(&STOP);
        }
    }
    let mut operator = d.client();
    let status = match operator.request(&Request::Status) {
        Response::Status(s) => s,
        other => panic!("status must still answer: {other:?}"),
    };
    assert_eq!(status.pending_actions.len(), DEFAULT_MAX_PENDING_TOTAL);
    let frame = encode_frame(&Response::Status(status.clone())).unwrap();
    assert!(frame.len() < MAX_FRAME_BYTES / 10, "{} bytes", frame.len());
    // A fresh stop is refused with what to do, and the oldest pending stop is still there to
    // confirm (the confirmation path is control_actions.rs's).
    match operator.request(&STOP) {
        Response::Error { message, .. } => {
            assert!(message.contains("daemon-wide limit"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(status.pending_actions[0].id.starts_with("stop-"));
}

fn silent_connections(d: &TestDaemon, n: usize) -> Vec<Client> {
    (0..n).map(|_| d.connect()).collect()
}

#[test]
fn silent_connections_at_the_cap_give_way_to_an_operator() {
    let d = TestDaemon::start();
    // The lock-out: 64 connections that never say anything (the default cap is 64).
    let mut silent = silent_connections(&d, 64);
    std::thread::sleep(Duration::from_millis(100));
    let mut operator = d.client();
    assert!(matches!(
        operator.request(&Request::Status),
        Response::Status(_)
    ));
    assert!(matches!(operator.request(&STOP), Response::Pending { .. }));
    // The oldest silent one gave way and was told why.
    match silent[0].recv() {
        Some(Response::Error { code, message }) => {
            assert_eq!(code, ErrorCode::Refused);
            assert!(message.contains("had not said hello"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(silent[0].recv().is_none());
}

#[test]
fn a_connection_without_hello_is_closed_at_the_hello_deadline() {
    let d = TestDaemon::start_with(Options {
        tweak: Box::new(|c| c.hello_timeout = Duration::from_millis(300)),
        ..Default::default()
    });
    let mut c = d.connect();
    let t0 = Instant::now();
    match c.recv() {
        Some(Response::Error { code, message }) => {
            assert_eq!(code, ErrorCode::HelloRequired);
            assert!(message.contains("no hello within 300 ms"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(c.recv().is_none(), "closed after the deadline");
    assert!(t0.elapsed() < Duration::from_secs(3));
    // A client that says hello in time is unaffected by the deadline.
    let mut ok = d.client();
    std::thread::sleep(Duration::from_millis(500));
    assert!(matches!(ok.request(&Request::Status), Response::Status(_)));
}

#[test]
fn an_idle_connection_is_closed_with_a_reason_and_a_subscriber_is_not() {
    let d = TestDaemon::start_with(Options {
        tweak: Box::new(|c| c.idle_timeout = Duration::from_millis(400)),
        ..Default::default()
    });
    let mut idle = d.client();
    let mut watcher = d.client();
    assert_eq!(
        watcher.request(&Request::Subscribe {
            topics: vec![Topic::Events]
        }),
        Response::Ok
    );
    match idle.recv() {
        Some(Response::Dropped { reason }) => assert!(reason.contains("idle"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(idle.recv().is_none());
    std::thread::sleep(Duration::from_millis(300));
    assert!(matches!(
        watcher.request(&Request::Status),
        Response::Status(_)
    ));
}

#[test]
fn subscribers_cannot_take_the_slots_kept_for_requests() {
    let d = TestDaemon::start_with(Options {
        tweak: Box::new(|c| {
            c.max_connections = 3;
            c.reserved_for_requests = 1;
        }),
        ..Default::default()
    });
    let sub = || Request::Subscribe {
        topics: vec![Topic::Metrics],
    };
    let mut a = d.client();
    let mut b = d.client();
    assert_eq!(a.request(&sub()), Response::Ok);
    assert_eq!(b.request(&sub()), Response::Ok);
    let mut third = d.client();
    match third.request(&sub()) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Refused);
            assert!(
                message.contains("kept for requests such as confirm-stop"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The refused subscriber still has its connection for requests.
    assert!(matches!(
        third.request(&Request::Status),
        Response::Status(_)
    ));
    assert_eq!(
        error_code(&third.request(&Request::Cancel {
            action_id: "x".into()
        })),
        ErrorCode::NoSuchAction
    );
}

#[test]
fn a_refused_connection_can_still_read_the_reason_after_sending_its_hello() {
    // Every held connection is busy (subscribed): the newcomer is refused, and the daemon
    // reads its hello before closing so the client sees the reason, not a broken pipe.
    let d = TestDaemon::start_with(Options {
        tweak: Box::new(|c| {
            c.max_connections = 1;
            c.reserved_for_requests = 0;
        }),
        ..Default::default()
    });
    let mut a = d.client();
    assert_eq!(
        a.request(&Request::Subscribe {
            topics: vec![Topic::Events]
        }),
        Response::Ok
    );
    let s = UnixStream::connect(&d.socket).unwrap();
    drop(s);
    let mut late = d.connect();
    late.send(&Request::Hello {
        version: dflash_shared::protocol::PROTOCOL_VERSION,
        client: "late".into(),
        access: Default::default(),
    });
    match late.recv() {
        Some(Response::Error { code, message }) => {
            assert_eq!(code, ErrorCode::Refused);
            assert!(message.contains("connection limit (1)"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}
