//! The control-plane client against a real Unix socket served by the test harness
//! (`support::test_daemon`, a protocol-speaking task, not `dflashd`).
mod support;

use std::time::Duration;

use dflash_shared::events::{Event, EventKind, Severity};
use dflash_shared::metrics::StepMetrics;
use dflash_shared::protocol::{ErrorCode, Request, Response, Topic};
use dflash_shared::status::StatusSnapshot;
use dflash_tui::app::{App, AppEvent, Source};
use dflash_tui::client::backoff::Backoff;
use dflash_tui::client::session::Push;
use dflash_tui::client::supervisor::{run_link, LinkCommand, LinkConfig, LinkEvent};
use dflash_tui::client::{ClientError, Session};
use dflash_tui::console::{self, LiveSink};
use dflash_tui::fmt::DisplayClock;
use dflash_tui::ui::theme::Theme;
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use support::test_daemon::{Script, TestDaemon};
use support::{incident, screen};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

/// The daemon's status at the end of the incident recording.
pub fn incident_status() -> StatusSnapshot {
    incident::generate(incident::SEED)
        .into_iter()
        .rev()
        .find_map(|f| match f.frame {
            Response::Status(s) => Some(*s),
            _ => None,
        })
        .expect("the recording has status frames")
}

fn metrics(ts_ms: i64, tokens_per_s: f64) -> Response {
    Response::Metrics(Box::new(StepMetrics {
        ts_ms,
        step: 31_700,
        epoch: 3,
        loss: 1.9,
        accuracy: 0.41,
        tau: None,
        tau_tree: None,
        lr: 1.6e-4,
        grad_norm: 0.9,
        tokens_per_s,
        draft_positions_per_s: 0.0,
        mfu: None,
        workers: Vec::new(),
        times: Default::default(),
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }))
}

fn note(seq: u64, text: &str) -> Event {
    Event {
        seq,
        ts_ms: incident::end_ms() + seq as i64,
        severity: Severity::Info,
        kind: EventKind::Note {
            message: text.into(),
        },
    }
}

#[tokio::test]
async fn a_session_says_hello_and_keeps_replies_in_order_around_pushes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon =
        TestDaemon::start(&dir.path().join("d.sock"), Script::new(incident_status())).await;
    let (session, welcome, mut pushes) = Session::connect(&daemon.socket).await.unwrap();
    assert_eq!(welcome.run_name, incident::RUN_NAME);
    assert_eq!(welcome.daemon_pid, 4242);
    let subscribe = Request::Subscribe {
        topics: vec![Topic::Metrics],
    };
    assert_eq!(session.request(&subscribe).await.unwrap(), Response::Ok);
    daemon.push(metrics(1, 21_500.0));
    let status = session.request(&Request::Status).await.unwrap();
    assert!(matches!(status, Response::Status(s) if s.run.name == incident::RUN_NAME));
    match timeout(WAIT, pushes.recv()).await.unwrap() {
        Some(Push::Frame(Response::Metrics(m))) => assert_eq!(m.tokens_per_s, 21_500.0),
        other => panic!("expected the pushed metrics, got {other:?}"),
    }
    // A daemon error reply is an error, not a crash.
    let bogus = Request::Confirm {
        action_id: "act-404".into(),
        run_name: "x".into(),
        via: "tui".into(),
    };
    match session.request(&bogus).await {
        Err(ClientError::Daemon { code, .. }) => assert_eq!(code, ErrorCode::NoSuchAction),
        other => panic!("expected a daemon error, got {other:?}"),
    }
    daemon.stop();
}

#[tokio::test]
async fn journal_catch_up_pages_through_the_daemons_reply_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut script = Script::new(incident_status());
    script.events = (1..=7).map(|seq| note(seq, "n")).collect();
    script.events_per_reply = 3;
    let daemon = TestDaemon::start(&dir.path().join("p.sock"), script).await;
    let (session, ..) = Session::connect(&daemon.socket).await.unwrap();
    let all = session.events_after(None, 10).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=7).collect::<Vec<_>>()
    );
    let since_five = session.events_after(Some(5), 10).await.unwrap();
    assert_eq!(since_five.len(), 2);
    let capped = session.events_after(None, 2).await.unwrap();
    assert_eq!(capped.len(), 6, "at most max_pages pages");
    daemon.stop();
}

#[tokio::test]
async fn no_daemon_is_a_clear_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = Session::connect(&path).await.err().expect("no daemon");
    let text = err.to_string();
    assert!(matches!(err, ClientError::NoDaemon { .. }), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

/// A raw server for handshakes the harness would never produce.
async fn raw_server(path: &std::path::Path, replies: Vec<String>) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let _hello = lines.next_line().await;
        for reply in replies {
            write.write_all(reply.as_bytes()).await.unwrap();
            write.write_all(b"\n").await.unwrap();
        }
        // Answer whatever comes next with ok, so requests after the garbage succeed.
        while let Ok(Some(_)) = lines.next_line().await {
            write.write_all(b"{\"type\":\"ok\"}\n").await.unwrap();
        }
    })
}

#[tokio::test]
async fn a_daemon_that_refuses_and_closes_at_once_is_reported_with_its_reason() {
    // What a daemon at its connection limit did: write the refusal and close without reading,
    // so the console's hello met a closed socket ("Broken pipe").
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        for _ in 0..20 {
            let (mut stream, _) = listener.accept().unwrap();
            std::io::Write::write_all(
                &mut stream,
                b"{\"type\":\"error\",\"code\":\"refused\",\"message\":\"connection limit (64) reached\"}\n",
            )
            .unwrap();
            stream.shutdown(std::net::Shutdown::Both).unwrap();
        }
    });
    for _ in 0..20 {
        // The race between our hello and the daemon's close goes both ways; each must say why.
        let err = Session::connect(&path).await.err().expect("refused");
        match &err {
            ClientError::Daemon { message, .. } => {
                assert!(message.contains("connection limit (64)"), "{err}")
            }
            other => panic!("expected the daemon's reason, got: {other}"),
        }
    }
    server.join().unwrap();
}

#[tokio::test]
async fn a_newer_daemon_is_refused_with_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let server = raw_server(
        &path,
        vec![r#"{"type":"welcome","version":99,"run_name":"r","daemon_pid":1}"#.into()],
    )
    .await;
    let err = Session::connect(&path).await.err().expect("refused");
    assert!(
        matches!(err, ClientError::VersionMismatch { ours: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("v99"), "{err}");
    server.abort();
}

#[tokio::test]
async fn garbage_and_oversize_frames_are_reported_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.sock");
    let huge = format!(
        r#"{{"type":"log","level":"info","line":"{}"}}"#,
        "x".repeat(dflash_shared::protocol::MAX_FRAME_BYTES)
    );
    let server = raw_server(
        &path,
        vec![
            r#"{"type":"welcome","version":1,"run_name":"r","daemon_pid":1}"#.into(),
            "\u{1}not json at all".into(),
            huge,
        ],
    )
    .await;
    let (session, _, mut pushes) = Session::connect(&path).await.unwrap();
    for expected in ["unreadable frame", "exceeds"] {
        match timeout(WAIT, pushes.recv()).await.unwrap() {
            Some(Push::Garbled(e)) => assert!(e.to_string().contains(expected), "{e}"),
            other => panic!("expected a garbled frame, got {other:?}"),
        }
    }
    assert_eq!(
        session.request(&Request::Status).await.unwrap(),
        Response::Ok
    );
    server.abort();
}

async fn next_matching(
    events: &mut mpsc::Receiver<LinkEvent>,
    what: &str,
    pred: impl Fn(&LinkEvent) -> bool,
) -> LinkEvent {
    timeout(WAIT, async {
        loop {
            let event = events.recv().await.expect("link alive");
            if pred(&event) {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn the_link_reconnects_after_a_daemon_restart_and_backfills_only_what_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("r.sock");
    let mut script = Script::new(incident_status());
    script.events = vec![note(1, "one"), note(2, "two")];
    let daemon = TestDaemon::start(&socket, script).await;
    let shared = daemon.script();

    let (events_tx, mut events) = mpsc::channel(256);
    let (commands_tx, commands) = mpsc::channel(8);
    let config = LinkConfig {
        status_every: Duration::from_millis(100),
        backoff: Backoff::new(Duration::from_millis(20), Duration::from_millis(100)),
        ..LinkConfig::new(socket.clone())
    };
    let link = tokio::spawn(run_link(config, events_tx, commands));
    next_matching(&mut events, "connected", |e| {
        matches!(e, LinkEvent::Connected(_))
    })
    .await;
    next_matching(
        &mut events,
        "backfill",
        |e| matches!(e, LinkEvent::Frame(Response::Events { events }) if events.len() == 2),
    )
    .await;

    daemon.stop();
    next_matching(&mut events, "lost", |e| matches!(e, LinkEvent::Lost { .. })).await;
    // Requests while the daemon is away fail at once instead of hanging.
    commands_tx
        .send(LinkCommand::Send(Request::Status))
        .await
        .unwrap();
    next_matching(
        &mut events,
        "offline reply",
        |e| matches!(e, LinkEvent::Reply { result: Err(m), .. } if m.contains("not connected")),
    )
    .await;

    shared.lock().unwrap().events.push(note(3, "three"));
    let daemon = TestDaemon::start_shared(&socket, shared).await;
    next_matching(&mut events, "reconnected", |e| {
        matches!(e, LinkEvent::Connected(_))
    })
    .await;
    let backfill = next_matching(&mut events, "second backfill", |e| {
        matches!(e, LinkEvent::Frame(Response::Events { .. }))
    })
    .await;
    match backfill {
        LinkEvent::Frame(Response::Events { events }) => {
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3]);
        }
        _ => unreachable!(),
    }
    assert!(daemon.requests().contains(&Request::Events {
        after_seq: Some(2),
        last: None
    }));
    link.abort();
    daemon.stop();
}

#[tokio::test]
async fn the_console_loop_shows_live_throughput_and_q_quits() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("c.sock");
    let daemon = TestDaemon::start(&socket, Script::new(incident_status())).await;

    let (events_tx, mut events) = mpsc::channel::<AppEvent>(1024);
    let (commands_tx, commands) = mpsc::channel(8);
    let config = LinkConfig {
        status_every: Duration::from_millis(50),
        ..LinkConfig::new(socket.clone())
    };
    let link = tokio::spawn(run_link(config, events_tx.clone(), commands));

    // Once the console has subscribed and polled status, the daemon streams a step; then the
    // operator presses q.
    let script = daemon.script();
    let pushes = tokio::spawn({
        let daemon_pushes = daemon_pusher(&daemon);
        async move {
            timeout(WAIT, async {
                while script
                    .lock()
                    .unwrap()
                    .requests
                    .iter()
                    .filter(|r| **r == Request::Status)
                    .count()
                    < 2
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("the console polls status");
            daemon_pushes(metrics(incident::end_ms() + 1_000, 21_480.0));
            tokio::time::sleep(Duration::from_millis(200)).await;
            events_tx
                .send(AppEvent::Key(crossterm::event::KeyEvent::new(
                    crossterm::event::KeyCode::Char('q'),
                    crossterm::event::KeyModifiers::NONE,
                )))
                .await
                .unwrap();
        }
    });

    let mut terminal = Terminal::new(TestBackend::new(screen::WIDTH, screen::HEIGHT)).unwrap();
    let mut app = App::new(
        Source::Live {
            socket: socket.display().to_string(),
        },
        false,
        incident::end_ms(),
        DisplayClock::utc(),
    );
    timeout(
        WAIT,
        console::run(
            &mut terminal,
            &mut app,
            &Theme::plain(),
            &mut events,
            &mut LiveSink(commands_tx),
        ),
    )
    .await
    .expect("q ends the loop")
    .expect("drawing works");
    pushes.await.unwrap();
    assert_eq!(app.tokens_per_s(), Some(21_480.0));
    terminal
        .draw(|f| dflash_tui::ui::draw(f, &app, &Theme::plain()))
        .unwrap();
    let text = screen::text(terminal.backend());
    assert!(text.contains("● connected (dflashd pid 4242)"), "{text}");
    assert!(text.contains("baseline 21.5K"), "{text}");
    link.abort();
    daemon.stop();
}

/// A closure that pushes frames through the harness (keeps the test body readable).
fn daemon_pusher(daemon: &TestDaemon) -> impl Fn(Response) + Send + 'static {
    let sender = daemon.pusher();
    move |frame| {
        let _ = sender.send(frame);
    }
}

#[tokio::test]
async fn a_read_only_link_says_so_in_its_hello() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ro.sock");
    let daemon = TestDaemon::start(&socket, Script::new(incident_status())).await;
    let (events_tx, mut events) = mpsc::channel(256);
    let (_commands_tx, commands) = mpsc::channel(8);
    let config = LinkConfig {
        access: dflash_shared::protocol::Access::ReadOnly,
        ..LinkConfig::new(socket.clone())
    };
    let link = tokio::spawn(run_link(config, events_tx, commands));
    next_matching(&mut events, "connected", |e| {
        matches!(e, LinkEvent::Connected(_))
    })
    .await;
    match &daemon.requests()[0] {
        Request::Hello { access, .. } => {
            assert_eq!(*access, dflash_shared::protocol::Access::ReadOnly)
        }
        other => panic!("the first frame was {other:?}"),
    }
    link.abort();
    daemon.stop();
}
