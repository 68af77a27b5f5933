//! Every view, overlay and modal drawn whole into `TestBackend` and snapshot-tested (times and
//! numbers redacted), plus the key handling that leads to them.
mod support;

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::config::DetectorsSection;
use dflash_shared::metrics::{GpuTelemetry, HostSample};
use dflash_shared::protocol::{Request, Response};
use dflash_shared::recording::RecordedFrame;
use dflash_tui::app::{App, AppEvent, Effect, Source, View};
use dflash_tui::client::supervisor::LinkEvent;
use dflash_tui::client::Welcome;
use dflash_tui::fmt::DisplayClock;
use support::incident;
use support::screen::{self, redacted, render, HEIGHT, WIDTH};

const SOCKET: &str = "/run/user/1000/dflash/dflashd.sock";

fn key(c: char) -> AppEvent {
    AppEvent::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

fn code(code: KeyCode) -> AppEvent {
    AppEvent::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn live(read_only: bool) -> App {
    live_from(incident::generate(incident::SEED), read_only)
}

/// A console attached over the socket that has received `frames`.
fn live_from(frames: Vec<RecordedFrame>, read_only: bool) -> App {
    let mut app = App::new(
        Source::Live {
            socket: SOCKET.into(),
        },
        read_only,
        frames[0].ts_ms,
        DisplayClock::utc(),
    );
    app.handle(AppEvent::Link(LinkEvent::Connected(Welcome {
        version: 1,
        run_name: incident::RUN_NAME.into(),
        daemon_pid: 4242,
    })));
    for frame in frames {
        app.handle(AppEvent::Tick(frame.ts_ms));
        app.handle(AppEvent::Link(LinkEvent::Frame(frame.frame)));
    }
    app
}

fn snapshot(name: &str, app: &App) {
    redacted().bind(|| insta::assert_snapshot!(name, render(app, WIDTH, HEIGHT)));
}

fn pending(action: Action, app: &App) -> PendingAction {
    PendingAction {
        id: "act-7".into(),
        action,
        requested_by_uid: 1000,
        created_ms: app.now_ms,
        expires_ms: app.now_ms + 300_000,
        consequences: vec![
            "last checkpoint 0 min ago (step 31,682)".into(),
            "throughput 4.5K tok/s, Crit for 11 min".into(),
        ],
    }
}

/// Presses `key`, checks the console asks the daemon to file `action`, and answers for it.
fn request_and_file(app: &mut App, key_event: AppEvent, action: Action) -> Request {
    let effects = app.handle(key_event);
    let request = Request::RequestAction {
        action: action.clone(),
    };
    assert_eq!(effects, vec![Effect::Send(request.clone())]);
    let reply = Ok(Response::Pending {
        action: pending(action, app),
    });
    app.handle(AppEvent::Link(LinkEvent::Reply {
        request: request.clone(),
        result: reply,
    }));
    request
}

#[test]
fn connecting_and_lost_states() {
    let mut app = App::new(
        Source::Live {
            socket: SOCKET.into(),
        },
        false,
        incident::start_ms(),
        DisplayClock::utc(),
    );
    app.handle(AppEvent::Link(LinkEvent::Connecting { attempt: 1 }));
    snapshot("connecting", &app);
    app.handle(AppEvent::Link(LinkEvent::Lost {
        reason: format!("no dflashd is listening at {SOCKET} (Connection refused)"),
        retry_in: Duration::from_secs(2),
    }));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("✕ daemon unreachable: no dflashd is listening"),
        "{text}"
    );
    snapshot("lost", &app);
}

#[test]
fn nvml_unavailable_says_so_instead_of_zeros() {
    let mut app = live(false);
    app.handle(AppEvent::Link(LinkEvent::Frame(Response::Gpus {
        telemetry: GpuTelemetry::Unavailable {
            reason: "NVML unavailable: libnvidia-ml.so.1: cannot open shared object file".into(),
        },
    })));
    if let Some(status) = &mut app.status {
        status.host = Some(HostSample {
            ts_ms: app.now_ms,
            process_rss_bytes: 2_300_000_000,
            host_memory_used_bytes: 9_800_000_000,
            host_memory_total_bytes: 16_000_000_000,
            process_cpu_pct: 180.0,
        });
    }
    app.handle(key('2'));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("NVML unavailable: libnvidia-ml.so.1"),
        "{text}"
    );
    assert!(!text.contains(" 0%"), "{text}");
    snapshot("gpus_nvml_unavailable", &app);
}

#[test]
fn a_one_device_run_has_no_queue_and_says_so() {
    let mut app = live(false);
    let mut stats = app
        .telemetry
        .queue
        .clone()
        .expect("the incident has a queue");
    stats.capacity = 0;
    stats.high_watermark = 0;
    stats.low_watermark = 0;
    stats.depth = 0;
    stats.ts_ms += 1_000;
    app.handle(AppEvent::Link(LinkEvent::Frame(Response::Queue(stats))));
    app.handle(key('3'));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(text.contains("no hidden-state queue"), "{text}");
}

/// The incident as a daemon would stream it whose status snapshots carry `detectors`.
fn incident_with_thresholds(detectors: Option<DetectorsSection>) -> Vec<RecordedFrame> {
    let mut frames = incident::generate(incident::SEED);
    for frame in &mut frames {
        if let Response::Status(status) = &mut frame.frame {
            status.detectors = detectors.clone();
        }
    }
    frames
}

#[test]
fn without_the_daemons_thresholds_the_console_gives_no_verdict_of_its_own() {
    let mut app = live_from(incident_with_thresholds(None), false);
    app.view = View::Gpus;
    let gpus = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        gpus.contains("memory not judged yet: waiting for the daemon's thresholds"),
        "{gpus}"
    );
    // No verdict of its own: the only VOLATILE is the daemon's, whose memory alerts the
    // console shows for what they are (GPUs 5–7 in the incident).
    assert!(!gpus.contains("flat"), "{gpus}");
    assert!(
        gpus.contains("dflashd: memory VOLATILE on GPU 5–7"),
        "{gpus}"
    );
    for row in gpus.lines().filter(|l| l.contains("NVIDIA H200")) {
        let drafter = row.contains("drafter");
        assert_eq!(row.contains("VOLATILE, daemon"), drafter, "{row}");
        assert_eq!(row.contains("no thresholds"), !drafter, "{row}");
    }
    snapshot("gpus_waiting_for_thresholds", &app);
    app.view = View::Queue;
    let queue = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        queue.contains("waiting for the daemon's thresholds"),
        "{queue}"
    );
    assert!(!queue.contains("bounds the run"), "{queue}");
}

#[test]
fn the_console_judges_memory_and_the_queue_by_the_runs_tuned_thresholds() {
    // The target GPUs' memory moves by a few tens of MB on 151 GB: flat by the defaults, volatile
    // for a run that tolerates 0.005% of range. A queue full at 90% blocked time is drafter-bound
    // unless blocking must reach 95% to count.
    let mut tuned = DetectorsSection::default();
    tuned.memory.max_range_frac = 0.000_05;
    tuned.queue.blocked_frac = 0.95;
    let mut app = live_from(incident_with_thresholds(Some(tuned)), false);
    app.view = View::Gpus;
    let gpus = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(gpus.contains("memory VOLATILE on GPU 0–7"), "{gpus}");
    app.view = View::Queue;
    let queue = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(queue.contains("balanced"), "{queue}");
    assert!(
        !queue.contains("the DRAFTER side bounds the run"),
        "{queue}"
    );
}

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

#[test]
fn small_and_resized_terminals() {
    let app = live(false);
    let tiny = screen::text(&render(&app, 50, 10));
    assert!(tiny.contains("terminal too small: 50×10"), "{tiny}");
    for (w, h) in [(60, 16), (80, 24), (200, 60), (61, 17)] {
        for view in View::ALL {
            let mut app = live(false);
            app.view = view;
            render(&app, w, h);
        }
    }
    redacted().bind(|| insta::assert_snapshot!("overview_80x24", render(&app, 80, 24)));
}

/// The daemon journals how the run ended, then exits: the console says so instead of showing an
/// outage, drops the ETA and offers what comes next. One snapshot per ending.
#[test]
fn a_run_that_ended_reads_as_finished_stopped_or_failed_not_as_an_outage() {
    use dflash_shared::events::{Event, EventKind, Severity};
    let endings = [
        (
            "ended_finished",
            None,
            "training complete: 6 epochs, 642 steps",
            "finished",
        ),
        (
            "ended_stopped",
            None,
            "stopped by operator (act-7) at step 31682",
            "stopped",
        ),
        (
            "ended_failed",
            Some(EventKind::RunPaused {
                reason: "step 31683 failed in drafter worker 0 on cuda:5: CUDA out of memory"
                    .into(),
            }),
            "SIGTERM received while paused after a failed step; no new checkpoint",
            "failed",
        ),
    ];
    for (name, before, reason, word) in endings {
        let mut app = live(false);
        let mut seq = 1_000_000;
        let mut push = |app: &mut App, kind: EventKind| {
            seq += 1;
            let event = Event {
                seq,
                ts_ms: app.now_ms,
                severity: Severity::Info,
                kind,
            };
            app.handle(AppEvent::Link(LinkEvent::Frame(Response::Event(Box::new(
                event,
            )))));
        };
        if let Some(kind) = before {
            push(&mut app, kind);
        }
        push(
            &mut app,
            EventKind::RunStopped {
                reason: reason.into(),
                checkpoint: Some("/runs/qwen27b-run1/checkpoints/step-0000031682".into()),
            },
        );
        app.handle(AppEvent::Link(LinkEvent::Lost {
            reason: format!("no dflashd is listening at {SOCKET} (Connection refused)"),
            retry_in: Duration::from_secs(2),
        }));
        let text = screen::text(&render(&app, WIDTH, HEIGHT));
        assert!(
            text.contains(&format!("run {word}; dflashd has exited")),
            "{text}"
        );
        assert!(!text.contains("daemon unreachable"), "{text}");
        assert!(
            !text.contains("ends in"),
            "no ETA once the run ended: {text}"
        );
        assert!(text.contains(&format!("Run {word}: {reason}")), "{text}");
        assert!(text.contains("next: "), "{text}");
        snapshot(name, &app);
    }
}

#[test]
fn online_tau_sits_beside_offline_tau_and_the_serve_gap_alert_gives_its_figures() {
    use dflash_shared::health::{ServeGapConfig, ServeGapDetector};
    use dflash_shared::metrics::OnlineAcceptance;
    use dflash_shared::status::{Alert, OnlineEvalStatus};

    let swap = incident::torch_swap_ms();
    let mut frames: Vec<RecordedFrame> =
        incident_with_thresholds(Some(DetectorsSection::default()))
            .into_iter()
            .filter(|f| f.ts_ms < swap)
            .collect();
    // Every fifth metrics line carries an online evaluation, its chain τ well below the
    // offline 3.9; the daemon's detector words the alert.
    let mut detector = ServeGapDetector::new(ServeGapConfig::default());
    let (mut n, mut last, mut transition) = (0, None, None);
    for frame in &mut frames {
        if let Response::Metrics(m) = &mut frame.frame {
            n += 1;
            if n % 5 != 0 {
                continue;
            }
            let chain = 2.0 + 0.01 * f64::from(n);
            let online = OnlineAcceptance {
                tau_chain: chain,
                tau_ddtree: [(16, chain + 0.4), (64, chain + 0.6)].into_iter().collect(),
                serve_tree_budget: None,
                offline_tau: Some(3.9),
                base: None,
                prompts: 16,
                seconds: 41.5,
            };
            if let Some(t) = detector.observe(m.ts_ms, m.step, chain, 3.9) {
                transition = Some(t);
            }
            last = Some(OnlineEvalStatus {
                step: m.step,
                ts_ms: m.ts_ms,
                acceptance: online.clone(),
            });
            m.online = Some(online);
        }
    }
    let transition = transition.expect("two evaluations beyond 15% raise the alert");
    let status = frames
        .iter_mut()
        .rev()
        .find_map(|f| match &mut f.frame {
            Response::Status(s) => Some(s),
            _ => None,
        })
        .expect("a status frame before the swap");
    status.last_online = last;
    status.alerts = vec![Alert {
        detector: transition.detector.clone(),
        level: transition.severity(),
        since_ms: transition.at_ms,
        message: transition.message.clone(),
        preceded_by: Vec::new(),
        since_healthy: Vec::new(),
    }];
    let app = live_from(frames, false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    for want in [
        "serve gap: online chain τ",
        "% below offline τ 3.90",
        "online  chain ",
        " · ddtree_16 ",
        "ddtree_64 ",
        "gap     ",
        "% below offline 3.90 (step ",
        "online chain",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
    snapshot("overview_online_tau", &app);
}

/// The incident with tree figures: every evaluation line carries the DDTree oracle τ
/// (serving budget 32) and every fifth line an online evaluation that decoded budget 32 too.
fn incident_with_tree_figures() -> Vec<RecordedFrame> {
    use dflash_shared::metrics::{OnlineAcceptance, TreeOracleTau};
    let swap = incident::torch_swap_ms();
    let mut frames: Vec<RecordedFrame> =
        incident_with_thresholds(Some(DetectorsSection::default()))
            .into_iter()
            .filter(|f| f.ts_ms < swap)
            .collect();
    let (mut n, mut newest_tree) = (0, None);
    for frame in &mut frames {
        match &mut frame.frame {
            Response::Metrics(m) => {
                if let Some(tau) = m.tau {
                    m.tau_tree = Some(TreeOracleTau {
                        serve_budget: 32,
                        by_budget: [(8, tau + 0.25), (32, tau + 0.5)].into_iter().collect(),
                    });
                    newest_tree = m.tau_tree.clone();
                }
                n += 1;
                if n % 5 == 0 {
                    m.online = Some(OnlineAcceptance {
                        tau_chain: 2.5,
                        tau_ddtree: [(8, 2.75), (32, 3.25), (64, 3.5)].into_iter().collect(),
                        serve_tree_budget: Some(32),
                        offline_tau: Some(3.9),
                        base: None,
                        prompts: 16,
                        seconds: 41.5,
                    });
                }
            }
            Response::Status(status) => status.last_tau_tree = newest_tree.clone(),
            _ => {}
        }
    }
    frames
}

/// Wherever chain τ is shown, the tree τ at the serving budget stands beside it, labelled
/// with the budget: the Run panel's held-out and online rows, the τ chart and the run-ending
/// panel.
#[test]
fn tree_tau_at_the_serving_budget_sits_beside_chain_tau_labelled_with_its_budget() {
    use dflash_shared::events::{Event, EventKind, Severity};
    let frames = incident_with_tree_figures();
    let status = frames
        .iter()
        .rev()
        .find_map(|f| match &f.frame {
            Response::Status(s) => Some(s.clone()),
            _ => None,
        })
        .expect("a status frame");
    let chain = status.last_tau.expect("the incident evaluates");
    let mut app = live_from(frames, false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    for want in [
        format!("τ chain {chain:.2} · tree@32 {:.2}", chain + 0.5),
        "online  chain 2.50 · tree@32 3.25".to_string(),
        "offline tree@32".to_string(),
        "online tree@32".to_string(),
        "saved   step".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} missing from\n{text}");
    }
    assert!(
        !text.contains("ddtree_64"),
        "the other budgets are left to dflash-tui status: {text}"
    );
    snapshot("overview_tree_tau", &app);

    let event = Event {
        seq: 1_000_001,
        ts_ms: app.now_ms,
        severity: Severity::Info,
        kind: EventKind::RunStopped {
            reason: "training complete: 6 epochs, 642 steps".into(),
            checkpoint: Some("/runs/qwen27b-run1/checkpoints/step-0000031682".into()),
        },
    };
    app.handle(AppEvent::Link(LinkEvent::Frame(Response::Event(Box::new(
        event,
    )))));
    app.handle(AppEvent::Link(LinkEvent::Lost {
        reason: format!("no dflashd is listening at {SOCKET} (Connection refused)"),
        retry_in: Duration::from_secs(2),
    }));
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    let last = app.telemetry.last_metrics.as_ref().unwrap();
    let held_out = last.tau.unwrap_or(chain);
    let want = format!(
        "final τ: held-out chain {held_out:.2} · tree@32 {:.2}; online chain 2.50 · tree@32 3.25 \
         (step ",
        held_out + 0.5
    );
    assert!(text.contains(&want), "{want:?} missing from\n{text}");
}

/// The incident as a D-PACE run with a Domino head would stream it: its status names both,
/// its metrics lines carry `accept_len` and `base_accept_len`.
fn incident_as_domino(
    objective: Option<dflash_shared::status::RunObjective>,
) -> Vec<RecordedFrame> {
    use dflash_shared::config::DrafterHead;
    use dflash_shared::metrics::DominoStepMetrics;
    let mut frames = incident_with_thresholds(Some(DetectorsSection::default()));
    for frame in &mut frames {
        match &mut frame.frame {
            Response::Status(status) => {
                status.run.objective = objective;
                status.run.drafter_head = objective.map(|_| DrafterHead::Domino);
            }
            Response::Metrics(m) => {
                m.domino = Some(DominoStepMetrics {
                    lambda_base: 0.0,
                    final_loss: m.loss,
                    base_loss: m.loss + 0.4,
                    accept_len: 2.874,
                    base_accept_len: 2.306,
                });
            }
            _ => {}
        }
    }
    frames
}

#[test]
fn the_run_panel_names_the_objective_and_a_domino_heads_base_and_final_acceptance() {
    use dflash_shared::config::Objective;
    use dflash_shared::status::RunObjective;
    let dflash = screen::text(&render(&live(false), WIDTH, HEIGHT));
    assert!(dflash.contains("objective DFlash, DFlash head"), "{dflash}");
    assert!(!dflash.contains("accept "), "{dflash}");

    let dpace = Some(RunObjective::new(Objective::Dpace, 0.5));
    let app = live_from(incident_as_domino(dpace), false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("objective D-PACE (α 0.5), Domino head"),
        "{text}"
    );
    assert!(
        text.contains("accept  base 2.31 → final 2.87 (+0.56)"),
        "{text}"
    );
    // The rows it adds push nothing out of the panel.
    assert!(text.contains("saved   step"), "{text}");
    snapshot("overview_domino_dpace", &app);

    // A daemon older than the field: the panel says it does not know.
    let old = live_from(incident_as_domino(None), false);
    let text = screen::text(&render(&old, WIDTH, HEIGHT));
    assert!(text.contains("objective unknown (not reported)"), "{text}");
}

/// A Domino run's online evaluations carry its base figures (`online_base_tau_*`): the Run
/// panel shows the served pair on its own row under the teacher-forced batch pair, and a DFlash
/// run's online evaluations add no such row.
#[test]
fn the_run_panel_shows_a_domino_runs_online_base_against_final_chain_tau() {
    use dflash_shared::config::Objective;
    use dflash_shared::metrics::{OnlineAcceptance, OnlineBase};
    use dflash_shared::status::RunObjective;
    let with_online = |mut frames: Vec<RecordedFrame>, base: Option<OnlineBase>| {
        let mut n = 0;
        for frame in &mut frames {
            if let Response::Metrics(m) = &mut frame.frame {
                n += 1;
                if n % 5 == 0 {
                    m.online = Some(OnlineAcceptance {
                        tau_chain: 2.504,
                        tau_ddtree: [(16, 2.9)].into_iter().collect(),
                        serve_tree_budget: None,
                        offline_tau: Some(3.9),
                        base: base.clone(),
                        prompts: 8,
                        seconds: 3.0,
                    });
                }
            }
        }
        frames
    };
    let base = OnlineBase {
        tau_chain: 2.096,
        tau_ddtree: [(16, 2.4)].into_iter().collect(),
    };
    let dpace = Some(RunObjective::new(Objective::Dpace, 0.5));
    let app = live_from(with_online(incident_as_domino(dpace), Some(base)), false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("accept  base 2.31 → final 2.87 (+0.56)"),
        "{text}"
    );
    assert!(
        text.contains("online  chain base 2.10 → 2.50 (+0.40)"),
        "{text}"
    );
    // the corrected figures keep their row, and the panel still ends with the checkpoint
    assert!(
        text.contains("online  chain 2.50 · ddtree_16 2.90"),
        "{text}"
    );
    assert!(text.contains("saved   step"), "{text}");
    snapshot("overview_domino_online_base", &app);

    let dflash = live_from(with_online(incident_with_thresholds(None), None), false);
    let text = screen::text(&render(&dflash, WIDTH, HEIGHT));
    assert!(text.contains("online  chain 2.50"), "{text}");
    assert!(!text.contains("chain base"), "{text}");
}

/// The incident as node 0 of a two-node job would stream it: its status carries its place in
/// the job and the job's view, with node 1 a third slower at its own work.
#[test]
fn the_run_panel_of_a_job_node_names_its_place_the_jobs_rate_and_the_straggler() {
    use dflash_shared::job::{JobView, NodeFigures};
    use dflash_shared::status::JobStatus;
    let node = |n: u32, busy_ms: f64| NodeFigures {
        node: n,
        tokens_per_s: 10_750.0,
        draft_positions_per_s: 86_000.0,
        busy_ms,
        step_ms: 1_400.0,
        queue_wait_share: Some(0.05),
    };
    let view = JobView::from_nodes(
        0,
        vec![node(0, 1_050.0), node(1, 1_400.0)],
        dflash_shared::job::STRAGGLER_BEHIND_FRAC,
    );
    let mut frames = incident::generate(incident::SEED);
    for frame in &mut frames {
        if let Response::Status(status) = &mut frame.frame {
            status.job = Some(JobStatus {
                node: 0,
                nnodes: 2,
                view: Some(view.clone()),
            });
        }
    }
    let text = screen::text(&render(&live_from(frames, false), WIDTH, HEIGHT));
    assert!(
        text.contains("job     node 0 of 2 · job 21.5K tok/s "),
        "{text}"
    );
    assert!(
        text.contains("behind  node 1 holds it back (+33 %) "),
        "{text}"
    );
    // The row it adds pushes nothing out of the panel.
    assert!(text.contains("saved   step"), "{text}");
}

/// The Throughput panel says what the healthy record's clock says: how long the stretch has
/// held and when the record falls due, that a dip is being timed, or when it was written.
#[test]
fn the_throughput_panel_shows_the_healthy_records_clock() {
    use dflash_shared::status::RecordClock;

    let swap = incident::torch_swap_ms();
    let frames: Vec<RecordedFrame> = incident_with_thresholds(Some(DetectorsSection::default()))
        .into_iter()
        .filter(|f| f.ts_ms < swap)
        .collect();
    let now = frames.last().unwrap().ts_ms;
    let with_clock = |clock: RecordClock| {
        let mut frames = frames.clone();
        let status = frames
            .iter_mut()
            .rev()
            .find_map(|f| match &mut f.frame {
                Response::Status(s) => Some(s),
                _ => None,
            })
            .expect("a status frame before the swap");
        status.throughput.stable_since_ms = clock.stretch_since_ms;
        status.throughput.record_clock = Some(clock);
        screen::text(&render(&live_from(frames, false), WIDTH, HEIGHT))
    };
    let since = now - 210_000;
    let due = with_clock(RecordClock {
        stretch_since_ms: Some(since),
        due_ms: Some(since + 300_000),
        written_ms: None,
        drop_timed: false,
    });
    assert!(due.contains("stable for 3 min"), "{due}");
    assert!(due.contains("healthy record in 1 min"), "{due}");
    let dip = with_clock(RecordClock {
        stretch_since_ms: Some(since),
        due_ms: Some(since + 300_000),
        written_ms: None,
        drop_timed: true,
    });
    assert!(dip.contains("stable for 3 min"), "{dip}");
    assert!(dip.contains("a dip is being timed"), "{dip}");
    assert!(!dip.contains("healthy record in"), "{dip}");
    let written = with_clock(RecordClock {
        stretch_since_ms: Some(since),
        due_ms: None,
        written_ms: Some(now - 60_000),
        drop_timed: false,
    });
    assert!(written.contains("healthy record written"), "{written}");
}
