//! The console's states around a run: connecting and lost, no NVML, no queue, thresholds
//! from the daemon or none, small terminals, and a run that ended.
use super::*;

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

/// A run of the embedded default (a daemon started without a config) ends with an evaluate line
/// that names its real target and held-out prompts; a config run keeps the placeholders for the
/// config's own paths, which the console does not hold.
#[test]
fn the_embedded_defaults_ending_names_its_target_and_held_out_prompts() {
    use dflash_shared::events::{Event, EventKind, Severity};
    let mut app = live(false);
    if let Some(status) = app.status.as_mut() {
        status.run.config_path = None;
    }
    let event = Event {
        seq: 1_000_001,
        ts_ms: app.now_ms,
        severity: Severity::Info,
        kind: EventKind::RunStopped {
            reason: "training complete: 6 epochs, 642 steps".into(),
            checkpoint: Some("/runs/default/checkpoints/step-0000000642".into()),
        },
    };
    app.handle(AppEvent::Link(LinkEvent::Frame(Response::Event(Box::new(
        event,
    )))));
    app.handle(AppEvent::Link(LinkEvent::Lost {
        reason: format!("no dflashd is listening at {SOCKET} (Connection refused)"),
        retry_in: Duration::from_secs(2),
    }));
    let run_dir = app.status.as_ref().unwrap().run.run_dir.clone();
    let text = screen::text(&render(&app, 240, HEIGHT));
    let evaluate = format!(
        "next: evaluate it: dflashd eval --target {run_dir}/target --drafter {run_dir}/export \
         --online --prompts assets/tiny/heldout_prompts.jsonl"
    );
    assert!(text.contains(&evaluate), "{text}");
    assert!(!text.contains("TARGET_DIR"), "{text}");
}
