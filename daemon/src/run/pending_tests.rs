use super::*;

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
const NOW: i64 = 1_750_000_000_000;

fn cache(name: &str, size: u64, present: bool) -> CacheState {
    CacheState {
        name: name.into(),
        path: format!("/tmp/{name}"),
        present,
        size_bytes: size,
        entries: 3412,
        last_change_ms: Some(NOW - HOUR),
        warm: present,
    }
}

fn view(state: RunState) -> StateView {
    StateView {
        now_ms: NOW,
        run_state: state,
        step: 9000,
        last_checkpoint: Some(CheckpointInfo {
            step: 8600,
            path: "/runs/a/ckpt-8600".into(),
            written_ms: NOW - 14 * MIN,
            bytes: 1,
        }),
        tokens_per_s: Some(12_800.0),
        stable_since_ms: Some(NOW - 3 * HOUR),
        caches: vec![
            cache("torchinductor", 2_100_000_000, true),
            cache("triton", 0, false),
        ],
        unlocked_keys: vec![],
        healthy_record: None,
        healthy_record_files: vec![],
    }
}

fn policy() -> ActionPolicy {
    ActionPolicy::new("qwen27b-run1")
}

fn by(uid: u32) -> Requester {
    Requester { uid, connection: 1 }
}

#[test]
fn pending_requests_are_bounded_per_connection_and_in_all() {
    let mut p = PendingActions::default();
    let v = view(RunState::Training);
    let pol = policy();
    let file = |p: &mut PendingActions, id: String, connection: u64| {
        p.request(
            id,
            Action::StopRun,
            Requester {
                uid: 1000,
                connection,
            },
            &v,
            &pol,
        )
    };
    for i in 0..pol.max_pending_per_client {
        file(&mut p, format!("a{i}"), 1).unwrap();
    }
    let refused = file(&mut p, "a-extra".into(), 1).unwrap_err();
    assert!(
        matches!(
            refused,
            ActionError::TooManyPending {
                scope: "per-connection",
                ..
            }
        ),
        "{refused:?}"
    );
    let text = refused.to_string();
    assert!(
        text.contains("confirm-stop") && text.contains("expires in 5 min"),
        "{text}"
    );
    // Other connections still file, up to the daemon-wide bound.
    let mut connection = 2;
    while p.list().len() < pol.max_pending_total {
        let id = format!("b{connection}");
        file(&mut p, id, connection).unwrap();
        connection += 1;
    }
    let refused = file(&mut p, "fresh".into(), 999).unwrap_err();
    assert!(
        matches!(
            refused,
            ActionError::TooManyPending {
                scope: "daemon-wide",
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.code(), ErrorCode::Refused);
    // Expiry frees room by itself.
    let mut later = v.clone();
    later.now_ms += DEFAULT_TTL_MS;
    p.request("after".into(), Action::StopRun, by(1000), &later, &pol)
        .unwrap();
    assert_eq!(p.list().len(), 1);
}

#[test]
fn stop_request_states_its_consequences_like_the_issue() {
    let mut p = PendingActions::default();
    let a = p
        .request(
            "stop-1".into(),
            Action::StopRun,
            by(1000),
            &view(RunState::Training),
            &policy(),
        )
        .unwrap();
    let text = a.consequences.join("; ");
    assert!(text.contains("last checkpoint 14 min ago"), "{text}");
    assert!(text.contains("stable at 12.8K tok/s for 3 h"), "{text}");
    assert_eq!(a.expires_ms, NOW + DEFAULT_TTL_MS);
    assert_eq!(p.list().len(), 1);
}

#[test]
fn confirmation_needs_the_exact_run_name_and_a_typo_keeps_it_pending() {
    let mut p = PendingActions::default();
    let v = view(RunState::Training);
    p.request("stop-1".into(), Action::StopRun, by(1000), &v, &policy())
        .unwrap();
    let err = p
        .confirm("stop-1", "qwen27b-run", &v, &policy())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::WrongRunName);
    assert_eq!(p.list().len(), 1, "a typo must not discard the request");
    let ok = p.confirm("stop-1", "qwen27b-run1", &v, &policy()).unwrap();
    assert_eq!(ok.pending.action, Action::StopRun);
    assert!(p.list().is_empty());
    assert_eq!(
        p.confirm("stop-1", "qwen27b-run1", &v, &policy())
            .unwrap_err()
            .code(),
        ErrorCode::NoSuchAction
    );
}

#[test]
fn pending_actions_expire_and_say_so() {
    let mut p = PendingActions::default();
    let mut v = view(RunState::Training);
    p.request("kill-1".into(), Action::Kill, by(1000), &v, &policy())
        .unwrap();
    v.now_ms += DEFAULT_TTL_MS;
    let err = p
        .confirm("kill-1", "qwen27b-run1", &v, &policy())
        .unwrap_err();
    assert_eq!(
        err,
        ActionError::Expired {
            id: "kill-1".into()
        }
    );
    assert!(p.list().is_empty());
    assert!(matches!(
        p.confirm("nope", "x", &v, &policy()),
        Err(ActionError::NoSuchAction(_))
    ));
}

#[test]
fn cache_deletion_is_refused_while_workers_run() {
    let mut p = PendingActions::default();
    let del = Action::DeleteCache {
        name: "torchinductor".into(),
    };
    let err = p
        .request(
            "d1".into(),
            del.clone(),
            by(1000),
            &view(RunState::Training),
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("workers are running"), "{err}");
    let a = p
        .request(
            "d2".into(),
            del,
            by(1000),
            &view(RunState::Paused),
            &policy(),
        )
        .unwrap();
    assert!(
        a.consequences[0].starts_with("2.1 GB cache, 3412 entries at /tmp/torchinductor"),
        "{:?}",
        a.consequences
    );
}

#[test]
fn cache_deletion_is_rechecked_at_confirmation() {
    let mut p = PendingActions::default();
    let del = Action::DeleteCache {
        name: "torchinductor".into(),
    };
    p.request(
        "d1".into(),
        del,
        by(1000),
        &view(RunState::Paused),
        &policy(),
    )
    .unwrap();
    // The run was resumed between request and confirmation.
    let err = p
        .confirm("d1", "qwen27b-run1", &view(RunState::Training), &policy())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Refused);
    assert!(
        p.list().is_empty(),
        "a failed re-check withdraws the stale request"
    );
}

#[test]
fn cache_path_change_between_request_and_confirmation_is_refused() {
    let mut p = PendingActions::default();
    let del = Action::DeleteCache {
        name: "torchinductor".into(),
    };
    p.request(
        "d1".into(),
        del,
        by(1000),
        &view(RunState::Paused),
        &policy(),
    )
    .unwrap();
    let mut moved = view(RunState::Paused);
    moved.caches[0].path = "/elsewhere".into();
    let err = p
        .confirm("d1", "qwen27b-run1", &moved, &policy())
        .unwrap_err();
    assert!(
        err.to_string().contains("changed since the request"),
        "{err}"
    );
}

#[test]
fn unknown_or_absent_caches_are_refused_with_the_known_names() {
    let mut p = PendingActions::default();
    let v = view(RunState::Finished);
    let err = p
        .request(
            "d".into(),
            Action::DeleteCache {
                name: "nope".into(),
            },
            by(0),
            &v,
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("torchinductor, triton"), "{err}");
    let err = p
        .request(
            "d".into(),
            Action::DeleteCache {
                name: "triton".into(),
            },
            by(0),
            &v,
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("nothing to delete"), "{err}");
}

#[test]
fn poweroff_is_disabled_by_default_and_names_the_command_when_enabled() {
    let mut p = PendingActions::default();
    let v = view(RunState::Training);
    let err = p
        .request("p".into(), Action::PowerOff, by(0), &v, &policy())
        .unwrap_err();
    assert!(err.to_string().contains("power-off is disabled"), "{err}");
    let mut pol = policy();
    pol.poweroff_command = Some(vec!["systemctl".into(), "poweroff".into()]);
    let a = p
        .request("p".into(), Action::PowerOff, by(0), &v, &pol)
        .unwrap();
    assert!(
        a.consequences
            .iter()
            .any(|c| c.contains("`systemctl poweroff`")),
        "{:?}",
        a.consequences
    );
}

#[test]
fn kill_says_which_steps_are_lost() {
    let mut p = PendingActions::default();
    let a = p
        .request(
            "k".into(),
            Action::Kill,
            by(0),
            &view(RunState::Training),
            &policy(),
        )
        .unwrap();
    assert!(
        a.consequences
            .iter()
            .any(|c| c.contains("steps 8601..9000")),
        "{:?}",
        a.consequences
    );
}

#[test]
fn only_locked_keys_can_be_unlocked_and_only_once() {
    let mut p = PendingActions::default();
    let mut v = view(RunState::Training);
    let err = p
        .request(
            "u".into(),
            Action::UnlockKey { key: "lr".into() },
            by(0),
            &v,
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("fixed for the run"), "{err}");
    let err = p
        .request(
            "u".into(),
            Action::UnlockKey {
                key: "no_such_key".into(),
            },
            by(0),
            &v,
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("not a locked key"), "{err}");
    p.request(
        "u".into(),
        Action::UnlockKey {
            key: "epochs".into(),
        },
        by(0),
        &v,
        &policy(),
    )
    .unwrap();
    v.unlocked_keys.push("training.epochs".into());
    let err = p.confirm("u", "qwen27b-run1", &v, &policy()).unwrap_err();
    assert!(err.to_string().contains("already unlocked"), "{err}");
}

#[test]
fn locked_keys_are_named_by_their_config_path_or_short_name() {
    let policy = policy();
    for (typed, canonical) in [
        ("training.epochs", Some("training.epochs")),
        ("epochs", Some("training.epochs")),
        ("anchors", Some("training.num_anchors")),
        ("num_anchors", Some("training.num_anchors")),
        ("block_size", Some("drafter.block_size")),
        ("drafter.target_layer_ids", Some("drafter.target_layer_ids")),
        ("training.lr", None),
        ("lr", None),
    ] {
        assert_eq!(
            policy.canonical_locked_key(typed).as_deref(),
            canonical,
            "{typed}"
        );
    }
    // What consoles send (the dotted paths of the shared config) is accepted.
    let mut p = PendingActions::default();
    p.request(
        "u".into(),
        Action::UnlockKey {
            key: "drafter.block_size".into(),
        },
        by(0),
        &view(RunState::Training),
        &policy,
    )
    .unwrap();
}

#[test]
fn stopping_twice_is_refused() {
    let mut p = PendingActions::default();
    let err = p
        .request(
            "s".into(),
            Action::StopRun,
            by(0),
            &view(RunState::Stopping),
            &policy(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("already stopping"), "{err}");
}

#[test]
fn ids_name_the_action_kind() {
    assert_eq!(action_id(&Action::StopRun, 0x3fa9c2), "stop-3fa9c2");
    assert_eq!(
        action_id(&Action::DeleteCache { name: "x".into() }, 0x1_000_001),
        "delcache-000001"
    );
}

#[test]
fn unlock_consequences_say_what_an_unlock_still_cannot_admit() {
    let v = view(RunState::Training);
    let text =
        |key: &str| consequences(&Action::UnlockKey { key: key.into() }, &v, &policy()).join("\n");
    assert!(text("drafter.target_layer_ids").contains("fc input width"));
    let epochs = text("epochs");
    assert!(
        epochs.contains("may then change on resume") && !epochs.contains("still refused"),
        "{epochs}"
    );
}

#[test]
fn forgetting_a_healthy_record_needs_one_and_says_what_it_costs() {
    let mut p = PendingActions::default();
    let v = view(RunState::Training);
    let err = p
        .request(
            "forget-1".into(),
            Action::ForgetHealthyRecord,
            by(1000),
            &v,
            &policy(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("no healthy record to forget"),
        "{err}"
    );

    let mut v = view(RunState::Training);
    v.healthy_record = Some(HealthyRecordView {
        tokens_per_s: 21_500.0,
        recorded_ms: NOW - 2 * HOUR,
        run_name: "qwen-a".into(),
        step: 30_000,
    });
    v.healthy_record_files = vec!["/runs/a/healthy.json".into()];
    let pending = p
        .request(
            "forget-2".into(),
            Action::ForgetHealthyRecord,
            by(1000),
            &v,
            &policy(),
        )
        .unwrap();
    let text = pending.consequences.join("\n");
    assert!(
        text.contains("judged against 21.5K tok/s, recorded 2 h ago by run qwen-a at step 30000"),
        "{text}"
    );
    assert!(text.contains("deletes /runs/a/healthy.json"), "{text}");
    assert!(
        text.contains("a slow rate now is learned as normal"),
        "{text}"
    );
    assert_eq!(
        action_id(&Action::ForgetHealthyRecord, 0xabc),
        "forget-000abc"
    );

    // Files on disk alone (a record written by this run, not yet judged against) are enough.
    let mut v = view(RunState::Training);
    v.healthy_record_files = vec!["/state/healthy/abc.json".into()];
    assert!(p
        .request(
            "forget-3".into(),
            Action::ForgetHealthyRecord,
            by(1001),
            &v,
            &policy(),
        )
        .is_ok());
}
