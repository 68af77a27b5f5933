//! `status`, `config`, `fingerprint`, `caches`, `checkpoints`: read-only snapshots of the run's
//! shared state.
use dflash_shared::protocol::{ErrorCode, Request, Response};

use super::{error, to_json};
use crate::run::handle::RunHandle;

pub(super) fn answer(handle: &RunHandle, req: &Request) -> Response {
    match req {
        Request::Status => Response::Status(Box::new(handle.status_snapshot())),
        Request::Config => Response::Json {
            value: handle.config(),
        },
        Request::Fingerprint => Response::Json {
            value: handle.fingerprint(),
        },
        Request::Caches => to_json(&handle.caches()),
        Request::Checkpoints => to_json(&handle.checkpoints()),
        other => error(ErrorCode::Internal, format!("not a query: {other:?}")),
    }
}
