//! Is a daemon answering on this socket? A hello and its welcome, with short timeouts.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use dflash_shared::protocol::{decode_response, encode_frame, hello, Response};

/// Who answered the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDaemon {
    pub pid: u32,
    pub run_name: String,
}

/// `Some` when a dflashd greets us on `socket` within `timeout`; `None` when nothing listens
/// there or what listens does not speak the protocol.
pub fn probe(socket: &Path, timeout: Duration) -> Option<LiveDaemon> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let frame = encode_frame(&hello("dflashd-probe")).ok()?;
    stream.write_all(&frame).ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    match decode_response(line.trim_end().as_bytes()).ok()? {
        Response::Welcome {
            run_name,
            daemon_pid,
            ..
        } => Some(LiveDaemon {
            pid: daemon_pid,
            run_name,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_listening_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            probe(&dir.path().join("none.sock"), Duration::from_millis(200)),
            None
        );
        // A listener that never answers times out rather than hanging.
        let path = dir.path().join("mute.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(probe(&path, Duration::from_millis(200)), None);
    }
}
