//! The confirm modal for every destructive action, and read-only mode.
use super::*;

#[test]
fn stop_modal_states_consequences_and_needs_the_typed_run_name() {
    let mut app = live(false);
    let effects = app.handle(key('s'));
    assert!(
        effects.is_empty() && app.modal.is_none(),
        "lowercase s does nothing"
    );

    let request = request_and_file(&mut app, key('S'), Action::StopRun);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("last checkpoint 0 s ago, at step 31,682"),
        "{text}"
    );
    assert!(text.contains(" tok/s, not stable"), "{text}");
    assert!(
        text.contains("Type the run name qwen36-27b-dflash"),
        "{text}"
    );
    snapshot("modal_stop_confirming", &app);

    for c in "qwen36".chars() {
        assert!(app.handle(key(c)).is_empty());
    }
    assert!(app.handle(code(KeyCode::Enter)).is_empty());
    snapshot("modal_stop_wrong_name", &app);

    for c in "-27b-dflash".chars() {
        app.handle(key(c));
    }
    let confirm = Request::Confirm {
        action_id: "act-7".into(),
        run_name: incident::RUN_NAME.into(),
        via: "tui".into(),
    };
    assert_eq!(
        app.handle(code(KeyCode::Enter)),
        vec![Effect::Send(confirm.clone())]
    );
    snapshot("modal_stop_submitting", &app);
    app.handle(AppEvent::Link(LinkEvent::Reply {
        request: confirm,
        result: Ok(Response::Executed {
            action_id: "act-7".into(),
            outcome: "checkpoint step 31,682 written; stopping".into(),
        }),
    }));
    snapshot("modal_stop_done", &app);
    app.handle(key('x'));
    assert!(app.modal.is_none());
    let _ = request;
}

#[test]
fn escape_cancels_a_filed_request() {
    let mut app = live(false);
    request_and_file(&mut app, key('P'), Action::PowerOff);
    snapshot("modal_poweroff_confirming", &app);
    assert_eq!(
        app.handle(code(KeyCode::Esc)),
        vec![Effect::Send(Request::Cancel {
            action_id: "act-7".into()
        })]
    );
    assert!(app.modal.is_none());
}

#[test]
fn kill_shows_what_is_lost_and_a_refusal_is_shown() {
    let mut app = live(false);
    let request = Request::RequestAction {
        action: Action::Kill,
    };
    assert_eq!(app.handle(key('K')), vec![Effect::Send(request.clone())]);
    snapshot("modal_kill_requesting", &app);
    app.handle(AppEvent::Link(LinkEvent::Reply {
        request,
        result: Err("the daemon refused (NotPermitted): uid 1001 may not act on this run".into()),
    }));
    snapshot("modal_kill_refused", &app);
}

#[test]
fn delete_cache_names_the_path_and_size() {
    let mut app = live(false);
    app.handle(key('D'));
    assert!(app.modal.is_none(), "D acts only in the Caches view");
    app.handle(key('4'));
    app.handle(key('j'));
    request_and_file(
        &mut app,
        key('D'),
        Action::DeleteCache {
            name: "triton".into(),
        },
    );
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("deletes /srv/dflash/cache/triton: 850 MB, 1,204 entries (warm)"),
        "{text}"
    );
    snapshot("modal_delete_cache", &app);
}

#[test]
fn unlock_asks_for_the_key_first() {
    let mut app = live(false);
    assert!(app.handle(key('U')).is_empty());
    // The keys an unlock can carry, in the key table's order: block size, tap layers, epochs.
    app.handle(key('j'));
    app.handle(key('j'));
    snapshot("modal_unlock_choose_key", &app);
    let effects = app.handle(code(KeyCode::Enter));
    assert_eq!(
        effects,
        vec![Effect::Send(Request::RequestAction {
            action: Action::UnlockKey {
                key: "training.epochs".into()
            }
        })]
    );
}

#[test]
fn read_only_disables_every_action() {
    let mut app = live(true);
    for c in ['S', 'K', 'P', 'U'] {
        assert!(app.handle(key(c)).is_empty());
        assert!(app.modal.is_none());
    }
    app.handle(key('4'));
    assert!(app.handle(key('D')).is_empty());
    assert!(app.modal.is_none());
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("read-only console (--read-only): actions are disabled"),
        "{text}"
    );
    snapshot("read_only_notice", &app);
}
