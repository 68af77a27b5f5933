use std::path::PathBuf;

use dflash_shared::protocol::ErrorCode;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("no dflashd is listening at {path} ({reason}); start it with `dflashd start` or pass --socket")]
    NoDaemon { path: PathBuf, reason: String },
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    UnsafeSocket(#[from] crate::paths::PathError),
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
    Io(#[from] std::io::Error),
}
