//! The control socket against real clients: permissions, hello, bad input, limits, shutdown.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::in_process::{error_code, Client, Options, TestDaemon, RUN_NAME};
use dflash_shared::protocol::{ErrorCode, Request, Response, MAX_FRAME_BYTES, PROTOCOL_VERSION};
use dflashd::control::server::{ControlServer, ServerConfig, ServerError};

#[test]
fn socket_is_0600_inside_a_0700_directory() {
    let d = TestDaemon::start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);
}

#[test]
fn hello_then_queries() {
    let d = TestDaemon::start();
    let mut c = d.connect();
    match c.request(&Request::Hello {
        version: PROTOCOL_VERSION,
        client: "t".into(),
        access: Default::default(),
    }) {
        Response::Welcome {
            version,
            run_name,
            daemon_pid,
        } => {
            assert_eq!(
                (version, run_name.as_str(), daemon_pid),
                (PROTOCOL_VERSION, RUN_NAME, std::process::id())
            );
        }
        other => panic!("{other:?}"),
    }
    match c.request(&Request::Status) {
        Response::Status(s) => assert_eq!(s.run.name, RUN_NAME),
        other => panic!("{other:?}"),
    }
    d.handle.set_config(std::sync::Arc::new(
        dflash_shared::config::Config::embedded_default(),
    ));
    match c.request(&Request::Config) {
        Response::Json { value } => assert_eq!(value["training"]["epochs"], 6),
        other => panic!("{other:?}"),
    }
    for q in [Request::Fingerprint, Request::Caches, Request::Checkpoints] {
        assert!(matches!(c.request(&q), Response::Json { .. }), "{q:?}");
    }
}

#[test]
fn a_request_before_hello_is_answered_with_hello_required() {
    let d = TestDaemon::start();
    let mut c = d.connect();
    assert_eq!(
        error_code(&c.request(&Request::Status)),
        ErrorCode::HelloRequired
    );
    // The connection stays usable: hello now works.
    assert!(matches!(
        c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client: "t".into(),
            access: Default::default(),
        }),
        Response::Welcome { .. }
    ));
}

#[test]
fn garbage_bytes_get_an_error_and_the_connection_goes_on() {
    let d = TestDaemon::start();
    let mut c = d.client();
    c.send_raw(b"\x00\xff\xfe garbage \x01\n");
    assert_eq!(error_code(&c.recv().unwrap()), ErrorCode::BadFrame);
    c.send_raw(b"{\"type\": 5}\n");
    assert_eq!(error_code(&c.recv().unwrap()), ErrorCode::BadFrame);
    assert!(matches!(c.request(&Request::Status), Response::Status(_)));
}

#[test]
fn an_oversize_frame_is_refused_and_skipped() {
    let d = TestDaemon::start();
    let mut c = d.client();
    let mut big = vec![b'x'; MAX_FRAME_BYTES + 100];
    big.push(b'\n');
    c.send_raw(&big);
    match c.recv().unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::FrameTooLarge);
            assert!(message.contains(&MAX_FRAME_BYTES.to_string()), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.request(&Request::Status), Response::Status(_)));
}

#[test]
fn an_unknown_command_names_the_known_ones() {
    let d = TestDaemon::start();
    let mut c = d.client();
    c.send_raw(b"{\"type\":\"format_disk\"}\n");
    match c.recv().unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::UnknownRequest);
            assert!(message.contains("format_disk"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.request(&Request::Status), Response::Status(_)));
}

#[test]
fn a_wrong_protocol_version_is_refused_and_the_daemon_goes_on() {
    let d = TestDaemon::start();
    let mut c = d.connect();
    let reply = c.request(&Request::Hello {
        version: PROTOCOL_VERSION + 1,
        client: "future".into(),
        access: Default::default(),
    });
    assert_eq!(error_code(&reply), ErrorCode::VersionMismatch);
    assert!(
        c.recv().is_none(),
        "the connection is closed after a version mismatch"
    );
    let mut other = d.client();
    assert!(matches!(
        other.request(&Request::Status),
        Response::Status(_)
    ));
}

#[test]
fn peers_of_another_uid_are_refused() {
    // Our own uid plays "another user": the daemon reads the peer's uid from SO_PEERCRED and
    // only lets uid 4242 in.
    let d = TestDaemon::start_with(Options {
        tweak: Box::new(|c| c.allowed_uids = vec![4242]),
        ..Default::default()
    });
    let mut c = d.connect();
    match c.recv().unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::NotPermitted);
            assert!(
                message.contains(&format!("uid {}", unsafe { libc::geteuid() })),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(c.recv().is_none());
}

#[test]
fn the_connection_cap_refuses_extra_clients_with_a_reason() {
    let d = TestDaemon::start_with(Options {
        // Idle connections would give way to a newcomer (control_limits.rs); here none
        // has been idle long enough, so the newcomer is the one refused.
        tweak: Box::new(|c| {
            c.max_connections = 2;
            c.evict_idle_after = Duration::from_secs(3600);
        }),
        ..Default::default()
    });
    let a = d.client();
    let _b = d.client();
    let mut extra = d.connect();
    match extra.recv().unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Refused);
            assert!(message.contains("connection limit (2)"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    drop(a);
    // The freed slot is reusable once the server notices the close.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = d.connect();
        match c.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client: "t".into(),
            access: Default::default(),
        }) {
            Response::Welcome { .. } => break,
            _ => assert!(std::time::Instant::now() < deadline, "slot never freed"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn many_clients_at_once() {
    let d = TestDaemon::start();
    let socket = d.socket.clone();
    let threads: Vec<_> = (0..24)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket);
                assert!(matches!(
                    c.request(&Request::Hello {
                        version: PROTOCOL_VERSION,
                        client: "t".into(),
                        access: Default::default(),
                    }),
                    Response::Welcome { .. }
                ));
                for _ in 0..10 {
                    assert!(matches!(c.request(&Request::Status), Response::Status(_)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_stale_socket_is_replaced_but_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = dir.path().join("s");
    std::fs::create_dir(&sock_dir).unwrap();
    std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let path = sock_dir.join("dflashd.sock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let d = TestDaemon::start();
    rt.block_on(async {
        // Live: someone listens there.
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = ControlServer::bind(ServerConfig::new(&path), d.handle.clone()).unwrap_err();
        assert!(matches!(err, ServerError::SocketInUse(_)), "{err}");
        // Stale: the listener is gone, its file remains.
        drop(live);
        assert!(path.exists());
        let server = ControlServer::bind(ServerConfig::new(&path), d.handle.clone()).unwrap();
        assert!(server.removed_stale_socket());
        // Not a socket at all: never removed.
        let file = sock_dir.join("plain");
        std::fs::write(&file, "x").unwrap();
        let err = ControlServer::bind(ServerConfig::new(&file), d.handle.clone()).unwrap_err();
        assert!(matches!(err, ServerError::NotASocket(_)), "{err}");
        assert!(file.exists());
    });
}

#[test]
fn shutdown_by_broadcast_notifies_clients_and_removes_the_socket() {
    let mut d = TestDaemon::start();
    let mut a = d.client();
    let mut b = d.client();
    b.send(&Request::Subscribe {
        topics: vec![dflash_shared::protocol::Topic::Events],
    });
    assert_eq!(b.recv(), Some(Response::Ok));
    d.handle.request_shutdown("test");
    for c in [&mut a, &mut b] {
        match c.recv() {
            Some(Response::Dropped { reason }) => {
                assert!(reason.contains("shutting down"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert!(c.recv().is_none());
    }
    d.join();
    assert!(!d.socket.exists(), "socket removed on clean shutdown");
}
