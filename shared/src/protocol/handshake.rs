//! The versioned hello: the first frame on every connection.
//!
//! The client sends `Request::Hello { version, client, access }`; the daemon answers with
//! `Response::Welcome` when it speaks that version, or with a `version_mismatch` error that says
//! both versions, and closes. The hello and welcome shapes never change between versions, so a
//! mismatched pair can always tell each other why they cannot talk.
use serde::{Deserialize, Serialize};

use super::{Access, ErrorCode, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// What the daemon says about itself in its welcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerIdentity {
    pub run_name: String,
    pub daemon_pid: u32,
}

/// A successful handshake: the version both sides will speak from now on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub version: u32,
    pub run_name: String,
    pub daemon_pid: u32,
}

impl From<Welcome> for Response {
    fn from(w: Welcome) -> Self {
        Response::Welcome {
            version: w.version,
            run_name: w.run_name,
            daemon_pid: w.daemon_pid,
        }
    }
}

/// An error frame, as data. Converts into `Response::Error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<ErrorReply> for Response {
    fn from(e: ErrorReply) -> Self {
        Response::Error {
            code: e.code,
            message: e.message,
        }
    }
}

/// Daemon side: answers the first frame of a connection.
pub fn negotiate(hello: &Request, server: &ServerIdentity) -> Result<Welcome, ErrorReply> {
    let Request::Hello {
        version, client, ..
    } = hello
    else {
        return Err(ErrorReply::new(
            ErrorCode::HelloRequired,
            format!(
                "the first frame must be a hello ({{\"type\":\"hello\",\"version\":{PROTOCOL_VERSION},\"client\":\"...\"}}), got '{}'",
                request_type(hello)
            ),
        ));
    };
    if (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(version) {
        return Ok(Welcome {
            version: *version,
            run_name: server.run_name.clone(),
            daemon_pid: server.daemon_pid,
        });
    }
    let advice = if *version > PROTOCOL_VERSION {
        "this dflashd is older than the client; upgrade dflashd or use a matching dflash-tui"
    } else {
        "the client is older than this dflashd; upgrade the client"
    };
    Err(ErrorReply::new(
        ErrorCode::VersionMismatch,
        format!(
            "client '{}' speaks protocol v{version}, this dflashd speaks {}: {advice}",
            client.chars().take(64).collect::<String>(),
            supported_range()
        ),
    ))
}

/// Client side: checks the daemon's answer to our hello.
pub fn accept_welcome(reply: &Response) -> Result<Welcome, ErrorReply> {
    match reply {
        Response::Welcome {
            version,
            run_name,
            daemon_pid,
        } if (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(version) => Ok(Welcome {
            version: *version,
            run_name: run_name.clone(),
            daemon_pid: *daemon_pid,
        }),
        Response::Welcome { version, .. } => Err(ErrorReply::new(
            ErrorCode::VersionMismatch,
            format!(
                "dflashd answered with protocol v{version}, this client speaks {}",
                supported_range()
            ),
        )),
        Response::Error { code, message } => Err(ErrorReply::new(*code, message.clone())),
        other => Err(ErrorReply::new(
            ErrorCode::BadFrame,
            format!("expected a welcome, got '{}'", response_type(other)),
        )),
    }
}

/// The hello this build of the client sends, for a full connection.
pub fn hello(client: impl Into<String>) -> Request {
    hello_with(client, Access::Full)
}

/// The hello this build of the client sends, for a connection of the given access.
pub fn hello_with(client: impl Into<String>, access: Access) -> Request {
    Request::Hello {
        version: PROTOCOL_VERSION,
        client: client.into(),
        access,
    }
}

fn supported_range() -> String {
    if MIN_PROTOCOL_VERSION == PROTOCOL_VERSION {
        format!("v{PROTOCOL_VERSION}")
    } else {
        format!("v{MIN_PROTOCOL_VERSION}..v{PROTOCOL_VERSION}")
    }
}

/// The wire tag of a request, for messages.
pub fn request_type(request: &Request) -> &'static str {
    match request {
        Request::Hello { .. } => "hello",
        Request::Subscribe { .. } => "subscribe",
        Request::Status => "status",
        Request::Config => "config",
        Request::Fingerprint => "fingerprint",
        Request::Caches => "caches",
        Request::Checkpoints => "checkpoints",
        Request::Events { .. } => "events",
        Request::RequestAction { .. } => "request_action",
        Request::Confirm { .. } => "confirm",
        Request::Cancel { .. } => "cancel",
    }
}

/// The wire tag of a response, for messages.
pub fn response_type(response: &Response) -> &'static str {
    match response {
        Response::Welcome { .. } => "welcome",
        Response::Ok => "ok",
        Response::Status(_) => "status",
        Response::Json { .. } => "json",
        Response::Events { .. } => "events",
        Response::Pending { .. } => "pending",
        Response::Executed { .. } => "executed",
        Response::Error { .. } => "error",
        Response::Metrics(_) => "metrics",
        Response::Gpus { .. } => "gpus",
        Response::Queue(_) => "queue",
        Response::Event(_) => "event",
        Response::Log { .. } => "log",
        Response::Dropped { .. } => "dropped",
    }
}
