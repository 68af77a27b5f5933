//! `status`, `config`, `fingerprint`, `caches`, `checkpoints`: read-only snapshots of the run's
//! shared state.
use dflash_shared::events::Severity;
use dflash_shared::protocol::{encode_frame, ErrorCode, Request, Response, MAX_FRAME_BYTES};
use dflash_shared::status::{Alert, StatusSnapshot};

use super::{error, to_json};
use crate::run::handle::RunHandle;

pub(super) fn answer(handle: &RunHandle, req: &Request) -> Response {
    match req {
        Request::Status => Response::Status(Box::new(fit_status(
            handle.status_snapshot(),
            MAX_FRAME_BYTES,
        ))),
        // Typed everywhere inside the daemon; serialized only here, for the reply.
        Request::Config => to_json(&handle.config().as_deref()),
        Request::Fingerprint => to_json(&handle.fingerprint()),
        Request::Caches => to_json(&handle.caches()),
        Request::Checkpoints => to_json(&handle.checkpoints()),
        other => error(ErrorCode::Internal, format!("not a query: {other:?}")),
    }
}

/// The status as one frame of at most `max` bytes. Pending actions are bounded so this
/// normally changes nothing; if the lists still outgrow a frame, the newest pending actions and
/// the oldest checkpoints and alerts are left out, and an alert says what is missing and where
/// to read it in full. The oldest pending actions stay: they are the ones to confirm first.
pub(super) fn fit_status(mut s: StatusSnapshot, max: usize) -> StatusSnapshot {
    let fits = |s: &StatusSnapshot| {
        encode_frame(&Response::Status(Box::new(s.clone()))).is_ok_and(|b| b.len() <= max)
    };
    if fits(&s) {
        return s;
    }
    let (pending, checkpoints, alerts) =
        (s.pending_actions.len(), s.checkpoints.len(), s.alerts.len());
    // Room for the note added below.
    let budget = max.saturating_sub(1024);
    let fits_budget = |s: &StatusSnapshot| {
        encode_frame(&Response::Status(Box::new(s.clone()))).is_ok_and(|b| b.len() <= budget)
    };
    while !fits_budget(&s) {
        if s.pending_actions.len() > 1 {
            s.pending_actions.pop();
        } else if s.checkpoints.len() > 1 {
            s.checkpoints.remove(0);
        } else if !s.alerts.is_empty() {
            s.alerts.remove(0);
        } else {
            break;
        }
    }
    let now = dflash_shared::clock::now_ms();
    s.alerts.push(Alert {
        detector: "status".into(),
        level: Severity::Warn,
        since_ms: now,
        message: format!(
            "this status was summarised to fit one {max}-byte frame: {} of {pending} pending \
             actions, {} of {checkpoints} checkpoints and {} of {alerts} alerts shown \
             (`checkpoints` and `events` requests list them in full)",
            s.pending_actions.len(),
            s.checkpoints.len(),
            s.alerts.len(),
        ),
        preceded_by: Vec::new(),
        since_healthy: Vec::new(),
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::actions::{Action, PendingAction};

    fn handle(dir: &std::path::Path) -> RunHandle {
        use crate::run::handle::RunHandleParts;
        let (journal, _) = crate::run::journal::Journal::open(dir).unwrap();
        RunHandle::new(RunHandleParts {
            policy: crate::run::pending::ActionPolicy::new("r"),
            run_dir: dir.to_path_buf(),
            journal,
            bus: crate::run::bus::FrameBus::new(4),
            recorder: None,
            config_path: None,
        })
    }

    #[test]
    fn the_fingerprint_reply_serializes_the_typed_fingerprint_or_says_none_was_taken() {
        use dflash_shared::health::Fingerprint;
        let dir = tempfile::tempdir().unwrap();
        let handle = handle(dir.path());
        let reply = |handle: &RunHandle| match answer(handle, &Request::Fingerprint) {
            Response::Json { value } => value,
            other => panic!("{other:?}"),
        };
        assert_eq!(reply(&handle), serde_json::Value::Null);
        let taken = Fingerprint {
            hostname: Some("trainer-1".into()),
            cuda_alloc_conf: Some("expandable_segments:True".into()),
            python_packages: [("torch".to_string(), "2.11.0".to_string())].into(),
            ..Fingerprint::default()
        };
        handle.set_fingerprint(taken.clone());
        let value = reply(&handle);
        assert_eq!(value["python_packages"]["torch"], "2.11.0");
        let decoded: Fingerprint = serde_json::from_value(value).unwrap();
        assert_eq!(decoded, taken);
    }

    #[test]
    fn a_status_too_big_for_a_frame_is_summarised_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let handle = handle(dir.path());
        let mut s = handle.status_snapshot();
        let pending = |i: i64| PendingAction {
            id: format!("stop-{i}"),
            action: Action::StopRun,
            requested_by_uid: 0,
            created_ms: i,
            expires_ms: i + 1,
            consequences: vec!["x".repeat(400)],
        };
        s.pending_actions = (0..4000).map(pending).collect();
        let fitted = fit_status(s, MAX_FRAME_BYTES);
        let bytes = encode_frame(&Response::Status(Box::new(fitted.clone()))).unwrap();
        assert!(bytes.len() <= MAX_FRAME_BYTES, "{}", bytes.len());
        assert_eq!(fitted.pending_actions[0].id, "stop-0", "the oldest stay");
        let note = &fitted.alerts.last().unwrap().message;
        assert!(note.contains("of 4000 pending actions"), "{note}");
        // A status that fits is left alone.
        let small = handle.status_snapshot();
        assert_eq!(fit_status(small.clone(), MAX_FRAME_BYTES), small);
    }
}
