//! From one parsed request to one response, one file per request kind. Connection state
//! (hello, subscriptions) lives in [`super::connection`]; everything here is per request.
//!
//! - [`query`]: status, config, fingerprint, caches, checkpoints (read-only snapshots).
//! - [`events`]: a page of the journal.
//! - [`request_action`]: file a destructive action as pending, with its consequences.
//! - [`confirm`]: typed confirmation, re-check, and execution ([`super::actions`]).
//! - [`cancel`]: withdraw a pending action.
mod cancel;
mod confirm;
mod events;
mod query;
mod request_action;

pub use events::MAX_EVENTS_PER_REPLY;
use std::time::Duration;

use dflash_shared::protocol::{decode_request, request_type, Access, ErrorCode, Request, Response};

use crate::run::handle::RunHandle;

/// Who sent a request: uid and pid from SO_PEERCRED, the server's id of the connection, and
/// the access its hello declared (held by the daemon for the connection's life).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub pid: Option<i32>,
    pub connection: u64,
    pub access: Access,
}

#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// How long a confirmed stop/kill may take in the run loop before the reply says so.
    pub command_timeout: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            command_timeout: Duration::from_secs(600),
        }
    }
}

pub fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error {
        code,
        message: message.into(),
    }
}

/// Parses one frame; malformed JSON, a well-formed unknown request and a bad field each get
/// their own error reply.
pub fn parse_request(line: &[u8]) -> Result<Request, Response> {
    decode_request(line).map_err(|e| e.to_reply())
}

/// Answers every request except `hello` and `subscribe`, which change connection state: one
/// file per request kind, as mini-redis's `cmd/`.
pub async fn handle_request(
    handle: &RunHandle,
    caller: Caller,
    cfg: &DispatchConfig,
    req: Request,
) -> Response {
    match req {
        Request::Hello { .. } => error(
            ErrorCode::BadFrame,
            "hello was already exchanged on this connection",
        ),
        Request::Subscribe { .. } => error(
            ErrorCode::Internal,
            "subscribe is handled by the connection",
        ),
        Request::Status
        | Request::Config
        | Request::Fingerprint
        | Request::Caches
        | Request::Checkpoints => query::answer(handle, &req),
        Request::Events { after_seq, last } => events::answer(handle, after_seq, last),
        Request::RequestAction { .. } | Request::Confirm { .. } | Request::Cancel { .. }
            if caller.access == Access::ReadOnly =>
        {
            refuse_read_only(handle, caller, &req)
        }
        Request::RequestAction { action } => request_action::file(handle, caller, action),
        Request::Confirm {
            action_id,
            run_name,
            via,
        } => confirm::confirm(handle, caller, cfg, action_id, run_name, via).await,
        Request::Cancel { action_id } => cancel::cancel(handle, caller, action_id),
    }
}

/// A request, confirmation or cancel on a connection whose hello was read-only. Refused and
/// journaled (through the throttle): a client that declared itself a watcher tried to act.
fn refuse_read_only(handle: &RunHandle, caller: Caller, req: &Request) -> Response {
    let kind = request_type(req);
    let action_id = match req {
        Request::Confirm { action_id, .. } | Request::Cancel { action_id } => {
            Some(action_id.clone())
        }
        _ => None,
    };
    handle.record_refused_request(
        caller.uid,
        format!(
            "{kind} on read-only connection {} (refused)",
            caller.connection
        ),
        action_id,
    );
    error(
        ErrorCode::NotPermitted,
        format!(
            "this connection said hello as read-only: it may query and watch, but a {kind} \
             is refused. Reconnect without --read-only (a full hello) to act"
        ),
    )
}

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_value(v) {
        Ok(value) => Response::Json { value },
        Err(e) => error(ErrorCode::Internal, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_unknown_and_malformed_frames_get_distinct_errors() {
        let code = |b: &[u8]| match parse_request(b) {
            Err(Response::Error { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(b"\x00\xffnot json"), ErrorCode::BadFrame);
        assert_eq!(code(b"[1,2]"), ErrorCode::BadFrame);
        assert_eq!(
            code(br#"{"type":"launch_missiles"}"#),
            ErrorCode::UnknownRequest
        );
        assert_eq!(
            code(br#"{"type":"confirm","action_id":"x"}"#),
            ErrorCode::BadFrame
        );
    }
}
