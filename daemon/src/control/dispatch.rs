//! From one parsed request to one response. Connection state (hello, subscriptions) lives in
//! [`super::connection`]; everything here is per request.
use std::time::Duration;

use dflash_shared::events::{EventKind, Severity};
use dflash_shared::protocol::{decode_request, ErrorCode, Request, Response};

use super::actions;
use crate::run::handle::RunHandle;
use crate::run::journal::JournalQuery;
use crate::run::pending::action_id;

/// Events per `events` reply; a client pages with the last seq it got.
pub const MAX_EVENTS_PER_REPLY: usize = 500;

/// Who sent a request, from SO_PEERCRED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub pid: Option<i32>,
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

/// Answers every request except `hello` and `subscribe`, which change connection state.
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
        Request::Status => Response::Status(Box::new(handle.status_snapshot())),
        Request::Config => Response::Json {
            value: handle.config(),
        },
        Request::Fingerprint => Response::Json {
            value: handle.fingerprint(),
        },
        Request::Caches => to_json(&handle.caches()),
        Request::Checkpoints => to_json(&handle.checkpoints()),
        Request::Events { after_seq, last } => {
            let q = JournalQuery {
                after_seq,
                ..Default::default()
            };
            match handle.with_journal(|j| j.query(&q)) {
                Ok(events) => Response::Events {
                    events: page_of_events(events, last),
                },
                Err(e) => error(ErrorCode::Internal, e.to_string()),
            }
        }
        Request::RequestAction { action } => {
            let id = action_id(&action, rand::random());
            let view = handle.state_view();
            let result = handle.with_pending(|p| {
                p.request(
                    id.clone(),
                    action.clone(),
                    caller.uid,
                    &view,
                    handle.policy(),
                )
            });
            let (request, action_id) = match &result {
                Ok(_) => (
                    format!("{} (filed, awaiting confirmation)", action.title()),
                    Some(id),
                ),
                Err(e) => (format!("{} (refused: {e})", action.title()), None),
            };
            handle.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid: caller.uid,
                    request,
                    action_id,
                },
            );
            match result {
                Ok(action) => Response::Pending { action },
                Err(e) => error(e.code(), e.to_string()),
            }
        }
        Request::Confirm {
            action_id,
            run_name,
            via,
        } => {
            let view = handle.state_view();
            let result =
                handle.with_pending(|p| p.confirm(&action_id, &run_name, &view, handle.policy()));
            match result {
                Ok(approved) => {
                    handle.record_event_logged(
                        Severity::Warn,
                        EventKind::OperatorConfirmed {
                            uid: caller.uid,
                            action_id: action_id.clone(),
                            via,
                        },
                    );
                    match actions::execute(handle, approved, cfg).await {
                        Ok(outcome) => Response::Executed { action_id, outcome },
                        Err(message) => error(ErrorCode::Refused, message),
                    }
                }
                Err(e) => {
                    handle.record_event_logged(
                        Severity::Info,
                        EventKind::OperatorRequest {
                            uid: caller.uid,
                            request: format!("confirm {action_id} via {via} (refused: {e})"),
                            action_id: Some(action_id),
                        },
                    );
                    error(e.code(), e.to_string())
                }
            }
        }
        Request::Cancel { action_id } => {
            let result =
                handle.with_pending(|p| p.cancel(&action_id, dflash_shared::clock::now_ms()));
            let outcome = match &result {
                Ok(_) => "cancelled".to_string(),
                Err(e) => format!("refused: {e}"),
            };
            handle.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid: caller.uid,
                    request: format!("cancel {action_id} ({outcome})"),
                    action_id: Some(action_id),
                },
            );
            match result {
                Ok(_) => Response::Ok,
                Err(e) => error(e.code(), e.to_string()),
            }
        }
    }
}

/// The reply page: the oldest [`MAX_EVENTS_PER_REPLY`] events, or with `last` the newest
/// `last` (capped the same way), still oldest first.
fn page_of_events(
    mut events: Vec<dflash_shared::events::Event>,
    last: Option<usize>,
) -> Vec<dflash_shared::events::Event> {
    if let Some(n) = last {
        let keep = n.min(MAX_EVENTS_PER_REPLY);
        events.drain(..events.len().saturating_sub(keep));
    }
    events.truncate(MAX_EVENTS_PER_REPLY);
    events
}

fn to_json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_value(v) {
        Ok(value) => Response::Json { value },
        Err(e) => error(ErrorCode::Internal, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(seq: u64) -> dflash_shared::events::Event {
        dflash_shared::events::Event {
            seq,
            ts_ms: 0,
            severity: Severity::Info,
            kind: EventKind::Note {
                message: format!("n{seq}"),
            },
        }
    }

    #[test]
    fn event_pages_are_the_oldest_or_with_last_the_newest() {
        let seqs =
            |v: Vec<dflash_shared::events::Event>| v.iter().map(|e| e.seq).collect::<Vec<_>>();
        let all: Vec<_> = (1..=MAX_EVENTS_PER_REPLY as u64 + 10).map(note).collect();
        let page = seqs(page_of_events(all.clone(), None));
        assert_eq!(page.len(), MAX_EVENTS_PER_REPLY);
        assert_eq!(page[0], 1);
        assert_eq!(
            seqs(page_of_events(all.clone(), Some(3))),
            vec![508, 509, 510]
        );
        let capped = seqs(page_of_events(all.clone(), Some(100_000)));
        assert_eq!((capped.len(), capped[0]), (MAX_EVENTS_PER_REPLY, 11));
        assert!(page_of_events(all, Some(0)).is_empty());
        assert_eq!(seqs(page_of_events(vec![note(4)], Some(5))), vec![4]);
    }

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
