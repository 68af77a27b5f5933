//! `confirm`: the typed confirmation of a pending action. The run name must match and the
//! action is re-checked against the current state; only then is it carried out
//! ([`crate::control::actions`]). Granted confirmations are journaled with how the daemon saw
//! them arrive ([`established_via`]); refused ones through the per-uid throttle
//! ([`crate::run::refusal_throttle`]).
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
            handle.journal_filing_before_confirmation(&action_id);
            handle.record_event_logged(
                Severity::Warn,
                EventKind::OperatorConfirmed {
                    uid: caller.uid,
                    action_id: action_id.clone(),
                    via: established_via(&caller),
                    client_says: Some(client_word(&via)),
                },
            );
            match actions::execute(handle, approved, cfg.command_timeout).await {
                Ok(outcome) => Response::Executed { action_id, outcome },
                Err(message) => error(ErrorCode::Refused, message),
            }
        }
        Err(e) => {
            handle.record_refused_request(
                caller.uid,
                format!(
                    "confirm {action_id} (the client says via {}; refused: {e})",
                    client_word(&via)
                ),
                Some(action_id),
            );
            error(e.code(), e.to_string())
        }
    }
}

/// What the daemon itself knows of how a granted confirmation arrived: the run name matched
/// (checked), on a connection whose hello was a full one (read-only connections are refused
/// before they get here), from this peer pid (SO_PEERCRED). Whether a person typed the name
/// is beyond it: that is the client's word, journaled apart as `client_says`.
pub(super) fn established_via(caller: &Caller) -> String {
    let pid = caller
        .pid
        .map_or_else(|| "an unknown pid".to_string(), |p| format!("pid {p}"));
    format!(
        "run name matched on {} connection {} from {pid}",
        match caller.access {
            dflash_shared::protocol::Access::Full => "full",
            dflash_shared::protocol::Access::ReadOnly => "read-only",
        },
        caller.connection
    )
}

/// The client's own account of the confirmation, cut short: it is free text from the peer.
fn client_word(via: &str) -> String {
    via.chars().take(32).collect()
}
