use std::path::PathBuf;

use dflash_shared::protocol::ErrorCode;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("no dflashd is listening at {path} ({reason}); start it with `dflashd start` or pass --socket")]
    NoDaemon { path: PathBuf, reason: String },
    #[error("cannot connect to {path}: {cause}")]
    Connect {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{0}")]
    UnsafeSocket(crate::paths::PathError),
    #[error("the daemon at {path} did not answer the hello within {timeout_ms} ms")]
    HelloTimeout { path: PathBuf, timeout_ms: u64 },
    #[error(
        "the daemon at {path} closed the connection before our hello ({reason}) and sent no \
         reason; see its log (`dflash-tui tail`) and try again"
    )]
    ClosedBeforeHello { path: PathBuf, reason: String },
    #[error("protocol version mismatch: this console speaks v{ours}, the daemon {theirs}")]
    VersionMismatch { ours: u32, theirs: String },
    #[error("unexpected first frame from the daemon: expected a welcome, got {got}")]
    Handshake { got: String },
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge { len: usize, max: usize },
    #[error("unreadable frame from the daemon ({reason}): {preview}")]
    BadFrame { preview: String, reason: String },
    #[error("the daemon refused ({code:?}): {message}")]
    Daemon { code: ErrorCode, message: String },
    #[error("expected {expected} from the daemon, got {got}")]
    UnexpectedReply { expected: &'static str, got: String },
    #[error("the daemon did not answer within {timeout_ms} ms")]
    RequestTimeout { timeout_ms: u64 },
    #[error("the connection to the daemon closed")]
    Closed,
    #[error("i/o on the daemon socket: {0}")]
    Io(std::io::Error),
}

/// By hand rather than `#[from]`, which would also make the path error the `source()` of a
/// message that already prints it (an error chain would print it twice).
impl From<crate::paths::PathError> for ClientError {
    fn from(e: crate::paths::PathError) -> Self {
        Self::UnsafeSocket(e)
    }
}

/// By hand rather than `#[from]`, for the same reason: the message prints the I/O error.
impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22 part 7: a message that carries its cause does not also return it as `source()`,
    /// or `dflash-tui`'s `{e:#}` (anyhow's chain) prints the cause twice.
    #[test]
    fn client_errors_print_their_cause_once_through_anyhow() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("dflashd.sock");
        let refused = || std::os::unix::net::UnixStream::connect(&socket).unwrap_err();
        let os_error = refused().to_string();
        let unsafe_dir = crate::paths::PathError::UnsafeSocketDir {
            dir: dir.path().to_path_buf(),
            expected_uid: 1000,
            found_uid: 0,
            found_mode: 0o755,
        };
        let unsafe_text = unsafe_dir.to_string();
        let cases = [
            (
                ClientError::Connect {
                    path: socket.clone(),
                    cause: refused(),
                },
                os_error.clone(),
            ),
            (ClientError::from(refused()), os_error),
            (ClientError::from(unsafe_dir), unsafe_text),
        ];
        for (err, cause) in cases {
            let shown = format!("{:#}", anyhow::Error::from(err));
            assert_eq!(shown.matches(cause.as_str()).count(), 1, "{shown}");
        }
    }
}
