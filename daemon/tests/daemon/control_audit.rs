//! What the journal says about operators (issue 15, defects 8 and 9): a flood of refused
//! requests becomes its first lines and one summary, not one fsynced line each; a connection
//! that said hello as read-only is held to it by the daemon.

use crate::support::in_process::{error_code, Client, TestDaemon, RUN_NAME};
use dflash_shared::actions::Action;
use dflash_shared::events::EventKind;
use dflash_shared::protocol::{ErrorCode, Request, Response};
use dflash_shared::status::RunState;
use dflashd::run::journal::JournalQuery;
use dflashd::run::pending::DEFAULT_MAX_PENDING_PER_CLIENT;
use dflashd::run::refusal_throttle::REFUSALS_JOURNALED_PER_WINDOW;

const STOP: Request = Request::RequestAction {
    action: Action::StopRun,
};

/// The journal's operator-request lines, oldest first.
fn operator_requests(d: &TestDaemon) -> Vec<String> {
    d.handle
        .with_journal(|j| j.query(&JournalQuery::default()))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::OperatorRequest { request, .. } => Some(request),
            _ => None,
        })
        .collect()
}

#[test]
fn a_flood_of_refused_requests_is_journaled_as_its_first_lines_and_one_summary() {
    let d = TestDaemon::start();
    d.handle.set_run_state(RunState::Training);
    // The issue's flood: 4,000 stops over one connection, and wrong-name confirmations.
    let mut flood = d.client();
    let mut first_id = None;
    for _ in 0..4000 {
        if let Response::Pending { action } = flood.request(&STOP) {
            first_id.get_or_insert(action.id);
        }
    }
    let id = first_id.expect("the first stops were filed");
    for _ in 0..200 {
        let wrong = flood.request(&Request::Confirm {
            action_id: id.clone(),
            run_name: "not-the-run".into(),
            via: "flood".into(),
        });
        assert_eq!(error_code(&wrong), ErrorCode::WrongRunName);
    }
    let refused = 4000 - DEFAULT_MAX_PENDING_PER_CLIENT + 200;
    let lines = operator_requests(&d);
    let bound = DEFAULT_MAX_PENDING_PER_CLIENT + REFUSALS_JOURNALED_PER_WINDOW as usize + 1;
    assert_eq!(
        lines.len(),
        bound,
        "{} lines: {:?}",
        lines.len(),
        &lines[..5]
    );
    // The first occurrences are kept as they were, and the line where counting starts says so.
    assert!(
        lines[DEFAULT_MAX_PENDING_PER_CLIENT].contains("refused: "),
        "{lines:?}"
    );
    assert!(
        lines[bound - 1].contains("further ones are counted"),
        "{lines:?}"
    );

    // The summary is journaled when the window closes, or (here) at shutdown, with the count.
    d.handle.request_shutdown("test over");
    let lines = operator_requests(&d);
    assert_eq!(lines.len(), bound + 1);
    let left_out = refused - REFUSALS_JOURNALED_PER_WINDOW as usize - 1;
    let summary = lines.last().unwrap();
    assert!(
        summary.starts_with(&format!("{left_out} more refused requests from uid")),
        "{summary}"
    );
    assert!(
        summary.contains("confirm"),
        "the last one left out is named: {summary}"
    );
}

/// A hello as a raw frame, so the wire form is what is tested.
fn raw_hello(d: &TestDaemon, extra: &str) -> Client {
    let mut c = d.connect();
    c.send_raw(
        format!("{{\"type\":\"hello\",\"version\":1,\"client\":\"t\"{extra}}}\n").as_bytes(),
    );
    match c.recv() {
        Some(Response::Welcome { .. }) => c,
        other => panic!("expected a welcome, got {other:?}"),
    }
}

#[test]
fn a_read_only_connection_may_watch_but_never_request_confirm_or_cancel() {
    let d = TestDaemon::start();
    d.handle.set_run_state(RunState::Training);
    let mut operator = d.client();
    let pending = match operator.request(&STOP) {
        Response::Pending { action } => action,
        other => panic!("{other:?}"),
    };
    let mut watcher = raw_hello(&d, r#","access":"read_only""#);
    assert!(matches!(
        watcher.request(&Request::Status),
        Response::Status(_)
    ));
    assert_eq!(
        watcher.request(&Request::Subscribe { topics: vec![] }),
        Response::Ok
    );
    for req in [
        STOP,
        Request::Confirm {
            action_id: pending.id.clone(),
            run_name: RUN_NAME.into(),
            via: "tty".into(),
        },
        Request::Cancel {
            action_id: pending.id.clone(),
        },
    ] {
        match watcher.request(&req) {
            Response::Error { code, message } => {
                assert_eq!(code, ErrorCode::NotPermitted, "{message}");
                assert!(message.contains("read-only"), "{message}");
                assert!(
                    message.contains("Reconnect without --read-only"),
                    "{message}"
                );
            }
            other => panic!("a read-only connection got {other:?} for {req:?}"),
        }
    }
    // A second hello cannot lift it.
    watcher.send_raw(b"{\"type\":\"hello\",\"version\":1,\"client\":\"t\"}\n");
    assert_eq!(error_code(&watcher.recv().unwrap()), ErrorCode::BadFrame);
    assert_eq!(error_code(&watcher.request(&STOP)), ErrorCode::NotPermitted);
    // Nothing was filed, confirmed or cancelled: the operator's request is still the only one.
    match operator.request(&Request::Status) {
        Response::Status(s) => {
            assert_eq!(s.pending_actions.len(), 1);
            assert_eq!(s.pending_actions[0].id, pending.id);
        }
        other => panic!("{other:?}"),
    }
    assert!(!d.handle.is_shutdown_requested());
    let lines = operator_requests(&d);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("confirm on read-only connection")),
        "the attempt is journaled: {lines:?}"
    );
    // A hello without `access` (every client before the field) is a full one.
    let mut old = raw_hello(&d, "");
    assert!(matches!(old.request(&STOP), Response::Pending { .. }));
}

#[test]
fn request_cancel_cycles_do_not_grow_the_journal_and_a_confirmed_one_keeps_both_lines() {
    let mut d = TestDaemon::start();
    d.handle.set_run_state(RunState::Training);
    let mut c = d.client();
    let lines = |d: &TestDaemon| {
        d.handle
            .with_journal(|j| j.query(&JournalQuery::default()))
            .unwrap()
            .len()
    };
    let before = lines(&d);
    // Granted every time, so neither the pending caps nor the refusal throttle bounds it.
    const CYCLES: usize = 1000;
    for _ in 0..CYCLES {
        let id = match c.request(&STOP) {
            Response::Pending { action } => action.id,
            other => panic!("{other:?}"),
        };
        assert_eq!(c.request(&Request::Cancel { action_id: id }), Response::Ok);
    }
    let n = REFUSALS_JOURNALED_PER_WINDOW as usize;
    let grown = lines(&d) - before;
    assert!(
        grown <= 2 * (n + 1),
        "{CYCLES} request/cancel cycles added {grown} journal lines"
    );

    // Past the first filings of the minute, a confirmed request still has its filing line,
    // then its confirmation.
    let unlock = match c.request(&Request::RequestAction {
        action: Action::UnlockKey {
            key: "block_size".into(),
        },
    }) {
        Response::Pending { action } => action.id,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        c.request(&Request::Confirm {
            action_id: unlock.clone(),
            run_name: RUN_NAME.into(),
            via: "t".into()
        }),
        Response::Executed { .. }
    ));
    let events = d
        .handle
        .with_journal(|j| j.query(&JournalQuery::default()))
        .unwrap();
    let mine: Vec<&EventKind> = events
        .iter()
        .map(|e| &e.kind)
        .filter(|k| match k {
            EventKind::OperatorRequest { action_id, .. } => {
                action_id.as_deref() == Some(unlock.as_str())
            }
            EventKind::OperatorConfirmed { action_id, .. } => action_id == &unlock,
            _ => false,
        })
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(
        matches!(mine[0], EventKind::OperatorRequest { request, .. } if request.contains("journaled with its confirmation")),
        "{mine:?}"
    );
    assert!(matches!(mine[1], EventKind::OperatorConfirmed { .. }));

    // At shutdown one line counts the cycles left out.
    d.handle.request_shutdown("test over");
    d.join();
    let left_out = CYCLES - n - 1;
    let requests = operator_requests(&d);
    assert!(
        requests.iter().any(|r| r.starts_with(&format!(
            "{left_out} more requests filed and withdrawn (cancelled or expired) unconfirmed from uid"
        ))),
        "{requests:#?}"
    );
}
