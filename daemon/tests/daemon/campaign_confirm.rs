//! The campaign's attempts to get around typed confirmation (issue 15), against a training
//! `dflashd` whose power-off command is real (it creates a file): for a stop, a kill and a
//! power-off each, confirmations with wrong tokens (ids that are near misses of the real one),
//! with the real token and wrong run names (from the requesting connection and from another
//! one), from a read-only connection (also after a second, full hello), before any hello, with
//! a token already used (cancelled), and with a stale (expired) token. Every one is refused
//! with its own code; the journal shows no confirmation, no executed action and no stop; the
//! power-off file never appears; training goes on. Then one correct confirmation from another
//! connection (what `dflash-tui confirm-stop` does) does stop the run: the same checks see a
//! destructive action when one happens.
use std::time::Duration;

use crate::support::binary::{journal, write_config, Daemon};
use crate::support::in_process::{error_code, Client};
use dflash_shared::actions::Action;
use dflash_shared::events::EventKind;
use dflash_shared::protocol::{Access, ErrorCode, Request, Response, PROTOCOL_VERSION};

const RUN_NAME: &str = "tiny-cpu";
const WRONG_NAMES: &[&str] = &[
    "",
    "TINY-CPU",
    "tiny-cpu ",
    " tiny-cpu",
    "tiny_cpu",
    "tiny-cp",
    "tiny\u{2010}cpu",
    "tiny-cpu\n",
    "tiny-cpu\u{0}",
    "qwen27b-run1",
];
/// Seconds before an unconfirmed request goes stale; short, so the test can wait it out.
const EXPIRY_S: u64 = 2;

fn confirm(c: &mut Client, id: &str, name: &str) -> Response {
    c.request(&Request::Confirm {
        action_id: id.into(),
        run_name: name.into(),
        via: "token".into(),
    })
}

fn file(c: &mut Client, action: &Action) -> String {
    match c.request(&Request::RequestAction {
        action: action.clone(),
    }) {
        Response::Pending { action } => action.id,
        other => panic!("filing {action:?}: {other:?}"),
    }
}

fn hello(c: &mut Client, access: Access) {
    match c.request(&Request::Hello {
        version: PROTOCOL_VERSION,
        client: "campaign-confirm".into(),
        access,
    }) {
        Response::Welcome { .. } => {}
        other => panic!("{other:?}"),
    }
}

/// Ids that are not `id` but near it: another nonce, another kind, case, spaces, cut, grown.
fn near_misses(id: &str) -> Vec<String> {
    let (kind, hex) = id.split_once('-').unwrap();
    let bumped = format!(
        "{kind}-{:06x}",
        (u32::from_str_radix(hex, 16).unwrap() + 1) & 0xff_ffff
    );
    let other_kind = if kind == "kill" { "stop" } else { "kill" };
    vec![
        bumped,
        format!("{other_kind}-{hex}"),
        id.to_uppercase(),
        format!("{id} "),
        format!(" {id}"),
        format!("{id}0"),
        id[..id.len() - 1].to_string(),
        String::new(),
        "*".into(),
        format!("{kind}-"),
    ]
}

struct Tally {
    attempts: usize,
}

impl Tally {
    fn refused(&mut self, reply: Response, code: ErrorCode, what: &str) {
        self.attempts += 1;
        assert_eq!(error_code(&reply), code, "{what}: {reply:?}");
    }
}

#[test]
fn no_destructive_action_without_a_correct_confirmation() {
    let _one = crate::support::campaign::one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let marker = root.join("powered-off");
    let config = root.join("confirm.toml");
    write_config(&config, |c| {
        c.training.epochs = 60;
        c.control.pending_action_expiry_s = EXPIRY_S;
        c.control.poweroff_command = Some(vec!["touch".into(), marker.to_str().unwrap().into()]);
    });
    let mut d = Daemon::spawn(root, &["--config", config.to_str().unwrap()]);
    let start_step = d.wait_step_above(0);
    let (mut a, mut b) = (d.client(), d.client());
    let mut ro = Client::connect(&d.socket);
    hello(&mut ro, Access::ReadOnly);
    let mut t = Tally { attempts: 0 };

    for action in [Action::StopRun, Action::Kill, Action::PowerOff] {
        let id = file(&mut a, &action);
        for wrong in near_misses(&id) {
            let c = if t.attempts % 2 == 0 { &mut a } else { &mut b };
            t.refused(
                confirm(c, &wrong, RUN_NAME),
                ErrorCode::NoSuchAction,
                &wrong,
            );
        }
        // The real token with a wrong name, from the requester and from another connection;
        // a wrong name leaves the action pending, so every one of these meets it.
        for (i, name) in WRONG_NAMES.iter().enumerate() {
            let c = if i % 2 == 0 { &mut a } else { &mut b };
            t.refused(
                confirm(c, &id, name),
                ErrorCode::WrongRunName,
                &format!("{name:?}"),
            );
        }
        // A read-only connection: neither confirm, request nor cancel, even after a second
        // hello that claims a full connection.
        t.refused(
            confirm(&mut ro, &id, RUN_NAME),
            ErrorCode::NotPermitted,
            "read-only confirm",
        );
        t.refused(
            ro.request(&Request::RequestAction {
                action: action.clone(),
            }),
            ErrorCode::NotPermitted,
            "read-only request",
        );
        t.refused(
            ro.request(&Request::Cancel {
                action_id: id.clone(),
            }),
            ErrorCode::NotPermitted,
            "read-only cancel",
        );
        let second_hello = ro.request(&Request::Hello {
            version: PROTOCOL_VERSION,
            client: "now-full".into(),
            access: Access::Full,
        });
        assert!(
            matches!(second_hello, Response::Error { .. }),
            "{second_hello:?}"
        );
        t.refused(
            confirm(&mut ro, &id, RUN_NAME),
            ErrorCode::NotPermitted,
            "read-only confirm after a second hello",
        );
        // Before any hello: refused, and still refused on the same connection (it is closed
        // at the hello deadline, not at the first bad frame).
        let mut raw = Client::connect(&d.socket);
        for _ in 0..2 {
            t.refused(
                confirm(&mut raw, &id, RUN_NAME),
                ErrorCode::HelloRequired,
                "no hello",
            );
        }
        // A used token: cancelled, then confirmed with the right name from both connections.
        assert_eq!(
            a.request(&Request::Cancel {
                action_id: id.clone()
            }),
            Response::Ok
        );
        t.refused(
            confirm(&mut a, &id, RUN_NAME),
            ErrorCode::NoSuchAction,
            "cancelled, same connection",
        );
        t.refused(
            confirm(&mut b, &id, RUN_NAME),
            ErrorCode::NoSuchAction,
            "cancelled, other connection",
        );
    }

    // A token used by a granted confirmation cannot be used again. (An unlock is the one
    // confirmation that leaves the run training; it only matters at the next resume.)
    let unlock = file(
        &mut a,
        &Action::UnlockKey {
            key: "training.epochs".into(),
        },
    );
    assert!(matches!(
        confirm(&mut a, &unlock, RUN_NAME),
        Response::Executed { .. }
    ));
    t.refused(
        confirm(&mut b, &unlock, RUN_NAME),
        ErrorCode::NoSuchAction,
        "a granted token again",
    );

    // Stale tokens: filed, left to expire, then confirmed with the right name.
    let stale: Vec<String> = [Action::StopRun, Action::Kill, Action::PowerOff]
        .iter()
        .map(|action| file(&mut a, action))
        .collect();
    std::thread::sleep(Duration::from_millis(EXPIRY_S * 1000 + 1500));
    for (i, id) in stale.iter().enumerate() {
        let c = if i % 2 == 0 { &mut a } else { &mut b };
        let reply = confirm(c, id, RUN_NAME);
        assert!(format!("{reply:?}").contains("expired"), "{reply:?}");
        t.refused(reply, ErrorCode::NoSuchAction, "stale");
    }

    // Nothing destructive happened: the journal, the power-off file, the process, training.
    let after = d.wait_step_above(start_step + 2);
    assert!(d.child.try_wait().unwrap().is_none(), "{}", d.stderr());
    assert!(!marker.exists(), "the power-off command ran");
    let destructive = |e: &dflash_shared::events::Event| match &e.kind {
        EventKind::OperatorConfirmed { action_id, .. }
        | EventKind::ActionExecuted { action_id, .. } => action_id != &unlock,
        EventKind::RunStopped { .. } => true,
        _ => false,
    };
    let events = journal(&d.run_dir);
    assert!(!events.iter().any(destructive), "{events:#?}");
    eprintln!(
        "campaign_confirm: {} attempts to get around typed confirmation refused; 0 destructive \
         actions; training went on to step {after}",
        t.attempts
    );
    assert!(t.attempts >= 68, "the issue's campaign made 68 attempts");

    // The control: a correct confirmation from another connection stops the run, and the same
    // checks see it.
    let id = file(&mut a, &Action::StopRun);
    b.set_read_timeout(Duration::from_secs(60));
    assert!(matches!(
        confirm(&mut b, &id, RUN_NAME),
        Response::Executed { .. }
    ));
    assert!(d.wait_exit().success(), "{}", d.stderr());
    assert!(journal(&d.run_dir).iter().any(destructive));
    assert!(!marker.exists());
}
