//! `confirm`: the typed confirmation of a pending action. The run name must match and the
//! action is re-checked against the current state; only then is it carried out
//! ([`crate::control::actions`]). Granted and refused confirmations are both journaled.
use dflash_shared::events::{EventKind, Severity};
use dflash_shared::protocol::{ErrorCode, Response};

use super::{error, Caller, DispatchConfig};
use crate::control::actions;
use crate::run::handle::RunHandle;

pub(super) async fn confirm(
    handle: &RunHandle,
    caller: Caller,
    cfg: &DispatchConfig,
    action_id: String,
    run_name: String,
    via: String,
) -> Response {
    let view = handle.state_view();
    let result = handle.with_pending(|p| p.confirm(&action_id, &run_name, &view, handle.policy()));
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
            match actions::execute(handle, approved, cfg.command_timeout).await {
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
