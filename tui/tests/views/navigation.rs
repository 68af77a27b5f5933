//! Help, switching views and filtering events.
use super::*;

#[test]
fn help_lists_every_view_and_marks_actions() {
    let mut app = live(false);
    app.handle(key('?'));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    for view in View::ALL {
        assert!(
            text.contains(view.title()),
            "{} missing from help",
            view.title()
        );
    }
    snapshot("help", &app);
    app.handle(code(KeyCode::Esc));
    assert!(!app.help_open);

    let mut read_only = live(true);
    read_only.handle(key('?'));
    assert!(screen::text(&render(&read_only, WIDTH, HEIGHT)).contains("disabled: read-only"));
    snapshot("help_read_only", &read_only);
}

#[test]
fn views_switch_by_digit_arrow_and_vim_keys() {
    let mut app = live(false);
    app.handle(key('3'));
    assert_eq!(app.view, View::Queue);
    app.handle(key('l'));
    assert_eq!(app.view, View::Caches);
    app.handle(code(KeyCode::Left));
    app.handle(key('h'));
    assert_eq!(app.view, View::Gpus);
    app.handle(code(KeyCode::BackTab));
    app.handle(code(KeyCode::BackTab));
    assert_eq!(app.view, View::Checkpoints);
    app.handle(key('2'));
    app.handle(key('j'));
    app.handle(code(KeyCode::Down));
    assert_eq!(app.selection.gpu, 2);
    app.handle(key('G'));
    assert_eq!(app.selection.gpu, 7);
    snapshot("gpus_last_selected", &app);
    assert_eq!(app.handle(key('q')), vec![Effect::Quit]);
}

#[test]
fn events_filter_by_level_and_text() {
    let mut app = live(false);
    app.handle(key('5'));
    app.handle(key('f'));
    for c in "/cache".chars() {
        app.handle(key(c));
    }
    app.handle(code(KeyCode::Enter));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(text.contains("warn and above · text 'cache'"), "{text}");
    assert!(!text.contains("checkpoint at step"), "{text}");
    snapshot("events_filtered", &app);
    // While typing a filter, q is a letter, not quit.
    app.handle(key('/'));
    assert_eq!(app.handle(key('q')), vec![]);
}
