//! `request_action`: files a destructive action as pending, with its consequences. It never
//! acts by itself; only a typed confirmation does ([`super::confirm`]). Every request is journaled
//! with the caller's uid (past many a minute, only once confirmed:
//! [`crate::run::withdrawn_requests`]); refused ones through the per-uid throttle
//! ([`crate::run::refusal_throttle`]).
use dflash_shared::actions::Action;
use dflash_shared::protocol::Response;

use super::{error, Caller};
use crate::run::handle::RunHandle;
use crate::run::pending::{action_id, Requester};

pub(super) fn file(handle: &RunHandle, caller: Caller, action: Action) -> Response {
    let id = action_id(&action, rand::random());
    let view = handle.state_view();
    let result = handle.with_pending(|p| {
        p.request(
            id.clone(),
            action.clone(),
            Requester {
                uid: caller.uid,
                connection: caller.connection,
            },
            &view,
            handle.policy(),
        )
    });
    match &result {
        Ok(_) => handle.record_filed_request(
            caller.uid,
            format!("{} (filed, awaiting confirmation)", action.title()),
            id,
        ),
        Err(e) => handle.record_refused_request(
            caller.uid,
            format!("{} (refused: {e})", action.title()),
            None,
        ),
    }
    match result {
        Ok(action) => Response::Pending { action },
        Err(e) => error(e.code(), e.to_string()),
    }
}
