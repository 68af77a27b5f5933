//! Control-plane wire protocol: a versioned hello, then newline-delimited JSON frames.
//!
//! Framing lives here as pure functions so both ends (and fuzz-ish tests) share it.
mod framing;
mod handshake;
#[cfg(test)]
mod samples;
#[cfg(test)]
mod tests;

pub use framing::{
    decode_request, decode_response, encode_frame, FrameError, FrameSplitter, REQUEST_TYPES,
    RESPONSE_TYPES,
};
pub use handshake::{
    accept_welcome, hello, hello_with, negotiate, request_type, response_type, ErrorReply,
    ServerIdentity, Welcome,
};

use serde::{Deserialize, Serialize};

use crate::actions::{Action, PendingAction};
use crate::events::Event;
use crate::metrics::{GpuTelemetry, QueueStats, StepMetrics};
use crate::status::StatusSnapshot;

pub const PROTOCOL_VERSION: u32 = 1;
/// The oldest client protocol this build still answers.
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// Frames longer than this are refused; the connection gets an error reply.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Streams a client may subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topic {
    Metrics,
    Events,
    Logs,
}

/// What a connection may do: declared in its hello, held by the daemon for the life of the
/// connection (a read-only connection cannot change it later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Query, watch, request, confirm and cancel. The default: a hello without `access` (every
    /// client before this field) is a full one.
    #[default]
    Full,
    /// Query and watch only: requests, confirmations and cancels are refused.
    ReadOnly,
}

impl Access {
    pub fn is_full(&self) -> bool {
        *self == Access::Full
    }
}

/// Client → daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Hello {
        version: u32,
        client: String,
        /// Absent on the wire for a full connection, so a full hello reads as it always did.
        #[serde(default, skip_serializing_if = "Access::is_full")]
        access: Access,
    },
    Subscribe {
        topics: Vec<Topic>,
    },
    Status,
    Config,
    Fingerprint,
    Caches,
    Checkpoints,
    /// Journal events with `seq > after_seq`, oldest first. With `last`, only the newest
    /// `last` of those (a console catching up on "what happened lately" without paging).
    Events {
        after_seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last: Option<usize>,
    },
    /// Files a pending destructive action; never acts by itself.
    RequestAction {
        action: Action,
    },
    /// Confirms a pending action; `run_name` must be typed by the operator.
    Confirm {
        action_id: String,
        run_name: String,
        via: String,
    },
    Cancel {
        action_id: String,
    },
}

/// Daemon → client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Welcome {
        version: u32,
        run_name: String,
        daemon_pid: u32,
    },
    Ok,
    Status(Box<StatusSnapshot>),
    Json {
        value: serde_json::Value,
    },
    Events {
        events: Vec<Event>,
    },
    Pending {
        action: PendingAction,
    },
    Executed {
        action_id: String,
        outcome: String,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    // Pushed to subscribers.
    Metrics(Box<StepMetrics>),
    Gpus {
        telemetry: GpuTelemetry,
    },
    Queue(QueueStats),
    Event(Box<Event>),
    Log {
        level: String,
        line: String,
    },
    /// Sent just before a slow subscriber is dropped.
    Dropped {
        reason: String,
    },
}

impl Response {
    /// Whether the daemon pushes this frame to subscribers (metrics, GPUs, queue, events, logs,
    /// a drop notice) rather than sends it as the reply to a request. The protocol has no
    /// request ids, so this is how a client tells the two apart.
    pub fn is_pushed(&self) -> bool {
        // Exhaustive on purpose: a new frame type must be placed on one side.
        match self {
            Response::Metrics(_)
            | Response::Gpus { .. }
            | Response::Queue(_)
            | Response::Event(_)
            | Response::Log { .. }
            | Response::Dropped { .. } => true,
            Response::Welcome { .. }
            | Response::Ok
            | Response::Status(_)
            | Response::Json { .. }
            | Response::Events { .. }
            | Response::Pending { .. }
            | Response::Executed { .. }
            | Response::Error { .. } => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadFrame,
    FrameTooLarge,
    VersionMismatch,
    UnknownRequest,
    NotPermitted,
    NoSuchAction,
    WrongRunName,
    Refused,
    Internal,
    /// The first frame of a connection was not a hello.
    HelloRequired,
}
