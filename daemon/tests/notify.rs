//! systemd readiness reaches a real notify socket. A test binary of its own: it sets
//! NOTIFY_SOCKET, which no other test may observe.
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

#[test]
fn ready_and_status_reach_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(!dflashd::runtime::notify::under_systemd());
    dflashd::runtime::notify::ready("no-op outside systemd");
    // SAFETY: this binary has a single test, so no other thread reads the environment.
    unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
    assert!(dflashd::runtime::notify::under_systemd());
    dflashd::runtime::notify::ready("control socket up");
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]);
    assert!(
        msg.contains("READY=1") && msg.contains("STATUS=control socket up"),
        "{msg}"
    );
    dflashd::runtime::notify::stopping("checkpointing");
    let n = sock.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
}
