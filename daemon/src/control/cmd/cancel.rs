//! `cancel`: withdraws a pending action, journaled with the caller's uid when its filing was
//! ([`crate::run::withdrawn_requests`]; a refused cancel through the per-uid throttle,
//! [`crate::run::refusal_throttle`]).
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::protocol::Response;

use super::{error, Caller};
use crate::run::handle::RunHandle;

pub(super) fn cancel(handle: &RunHandle, caller: Caller, action_id: String) -> Response {
    let result = handle.with_pending(|p| p.cancel(&action_id, dflash_shared::clock::now_ms()));
    match &result {
        Ok(_) => {
            if !handle.withdrawal_gets_a_line(&action_id, "cancelled") {
                return Response::Ok;
            }
            handle.record_event_logged(
                Severity::Info,
                EventKind::OperatorRequest {
                    uid: caller.uid,
                    request: format!("cancel {action_id} (cancelled)"),
                    action_id: Some(action_id),
                },
            );
        }
        Err(e) => handle.record_refused_request(
            caller.uid,
            format!("cancel {action_id} (refused: {e})"),
            Some(action_id),
        ),
    }
    match result {
        Ok(_) => Response::Ok,
        Err(e) => error(e.code(), e.to_string()),
    }
}
