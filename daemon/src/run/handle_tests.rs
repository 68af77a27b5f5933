use super::*;
use dflash_shared::metrics::StepTimes;
use dflash_shared::recording::RecordedFrame;

fn handle(dir: &Path, recorder: bool) -> RunHandle {
    let (journal, _) = Journal::open(dir).unwrap();
    RunHandle::new(RunHandleParts {
        policy: ActionPolicy::new("r"),
        run_dir: dir.to_path_buf(),
        journal,
        bus: FrameBus::new(16),
        recorder: recorder.then(|| Recorder::open(dir).unwrap()),
        config_path: None,
    })
}

fn metrics(step: u64, tau: Option<f64>) -> StepMetrics {
    StepMetrics {
        ts_ms: 0,
        step,
        epoch: 2,
        loss: 1.5,
        accuracy: 0.5,
        tau,
        tau_tree: None,
        lr: 1e-4,
        grad_norm: 1.0,
        tokens_per_s: 12_800.0,
        draft_positions_per_s: 0.0,
        mfu: None,
        workers: vec![],
        times: StepTimes::default(),
        online: None,
        domino: None,
        dspark: None,
        dflash2: None,
        job: None,
    }
}

#[test]
fn status_and_state_view_follow_what_the_run_loop_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    assert_eq!(
        h.state_view().tokens_per_s,
        None,
        "no throughput is claimed before the first step"
    );
    h.set_run_state(RunState::Training);
    h.publish_metrics(metrics(10, Some(3.2)));
    h.publish_metrics(metrics(11, None));
    h.set_throughput_judgement(ThroughputJudgement {
        baseline_tokens_per_s: Some(12_900.0),
        stable_since_ms: Some(5),
        ..Default::default()
    });
    let s = h.status_snapshot();
    assert_eq!(
        (s.run.step, s.run.epoch, s.last_tau, s.last_loss),
        (11, 2, Some(3.2), Some(1.5))
    );
    assert_eq!(s.throughput.baseline_tokens_per_s, Some(12_900.0));
    let v = h.state_view();
    assert_eq!(
        (v.tokens_per_s, v.stable_since_ms, v.run_state),
        (Some(12_800.0), Some(5), RunState::Training)
    );
}

#[test]
fn the_newest_online_evaluation_stays_in_status_until_the_next_one() {
    use dflash_shared::metrics::OnlineAcceptance;
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let mut first = metrics(50, Some(3.0));
    first.online = Some(OnlineAcceptance {
        tau_chain: 2.5,
        tau_ddtree: [(16, 2.75)].into_iter().collect(),
        serve_tree_budget: None,
        offline_tau: Some(3.0),
        base: None,
        prompts: 8,
        seconds: 0.5,
    });
    let mut subscriber = h.bus().subscribe();
    h.publish_metrics(first.clone());
    h.publish_metrics(metrics(51, None));
    let s = h.status_snapshot();
    let online = s.last_online.expect("the step-50 online evaluation");
    assert_eq!(
        (online.step, &online.acceptance),
        (50, first.online.as_ref().unwrap())
    );
    assert_eq!(s.run.step, 51);
    // Subscribers get the line with its online figures, as the metrics file does.
    match subscriber.try_recv() {
        Ok(frame) => assert!(
            matches!(&frame.frame, Response::Metrics(m) if m.online == first.online),
            "{frame:?}"
        ),
        Err(e) => panic!("no frame: {e}"),
    }
}

#[test]
fn the_newest_tree_oracle_stays_in_status_beside_offline_tau_until_the_next_evaluation() {
    use dflash_shared::metrics::TreeOracleTau;
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let mut evaluated = metrics(50, Some(3.0));
    evaluated.tau_tree = Some(TreeOracleTau {
        serve_budget: 32,
        by_budget: [(8, 3.5), (32, 4.25)].into_iter().collect(),
    });
    h.publish_metrics(evaluated.clone());
    h.publish_metrics(metrics(51, None));
    let s = h.status_snapshot();
    assert_eq!(
        (s.last_tau, &s.last_tau_tree),
        (Some(3.0), &evaluated.tau_tree)
    );
    assert_eq!(s.last_tau_tree.unwrap().at_serve_budget(), Some((32, 4.25)));
}

#[test]
fn checkpoints_are_listed_journaled_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    for step in 0..40 {
        h.add_checkpoint(CheckpointInfo {
            step,
            path: format!("ckpt-{step}"),
            written_ms: step as i64,
            bytes: 1,
        })
        .unwrap();
    }
    let listed = h.checkpoints();
    assert_eq!(listed.len(), CHECKPOINTS_LISTED);
    assert_eq!(listed.last().unwrap().step, 39);
    assert_eq!(h.state_view().last_checkpoint.unwrap().step, 39);
    assert_eq!(h.with_journal(|j| j.next_seq()), 41);
}

#[test]
fn the_recording_holds_telemetry_and_events_but_not_log_lines() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), true);
    h.publish_metrics(metrics(1, None));
    h.record_event(
        Severity::Info,
        EventKind::Note {
            message: "n".into(),
        },
    )
    .unwrap();
    h.publish(
        Topic::Logs,
        Response::Log {
            level: "INFO".into(),
            line: "x".into(),
        },
    );
    let text = std::fs::read_to_string(dflash_shared::run_dir::recording_path(dir.path())).unwrap();
    let frames: Vec<RecordedFrame> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(frames.len(), 2, "{text}");
    assert!(matches!(frames[0].frame, Response::Metrics(_)));
    assert!(matches!(frames[1].frame, Response::Event(_)));
}

#[test]
fn commands_reach_an_attached_run_loop_and_come_back_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let (tx, _rx) = oneshot::channel();
    assert!(h
        .send_command(RunCommand::Kill {
            action_id: "k".into(),
            reply: tx
        })
        .is_err());
    let commands = h.attach_run_loop();
    let (tx, _rx) = oneshot::channel();
    h.send_command(RunCommand::Stop {
        action_id: "s".into(),
        reply: tx,
    })
    .unwrap();
    assert!(
        matches!(commands.try_recv().unwrap(), RunCommand::Stop { action_id, .. } if action_id == "s")
    );
}

#[test]
fn shutdown_is_sticky_and_keeps_the_first_reason() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let listener_before = h.shutdown_listener();
    h.request_shutdown("first");
    h.request_shutdown("second");
    assert_eq!(h.shutdown_reason().as_deref(), Some("first"));
    assert!(listener_before.is_shutdown());
    // A listener created after the request still fires.
    let mut late = h.shutdown_listener();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(1), late.recv())
            .await
            .unwrap()
    });
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        captured_ms: 7,
        hostname: Some("trainer-1".into()),
        gpu_models: vec!["NVIDIA H200".into()],
        cuda_alloc_conf: Some("expandable_segments:True".into()),
        python_packages: [("torch".to_string(), "2.11.0".to_string())].into(),
        ..Fingerprint::default()
    }
}

#[test]
fn the_fingerprint_is_kept_typed_and_the_live_watch_patches_only_its_packages() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let packages_now: std::collections::BTreeMap<_, _> =
        [("torch".to_string(), "2.12.0".to_string())].into();
    // Before guard rails take it there is no fingerprint, not an empty one, and the live watch
    // has nothing to fold its packages into.
    h.set_live_environment(vec![], packages_now.clone());
    assert_eq!(h.fingerprint(), None);

    h.set_fingerprint(fingerprint());
    assert_eq!(h.fingerprint(), Some(fingerprint()));
    h.set_live_environment(vec!["torch 2.11.0 → 2.12.0".into()], packages_now.clone());
    let expected = Fingerprint {
        python_packages: packages_now,
        ..fingerprint()
    };
    assert_eq!(h.fingerprint(), Some(expected));
    assert_eq!(
        h.live_environment(),
        vec!["torch 2.11.0 → 2.12.0".to_string()]
    );
}

#[test]
fn a_forget_names_the_record_files_that_exist_and_keys_unlocked_stay_listed_once() {
    let dir = tempfile::tempdir().unwrap();
    let h = handle(dir.path(), false);
    let present = dir.path().join("healthy_record.json");
    std::fs::write(&present, "{}").unwrap();
    h.set_healthy_record(None, vec![present.clone(), dir.path().join("absent.json")]);
    h.unlock_key("block_size");
    h.unlock_key("block_size");
    let view = h.state_view();
    assert_eq!(
        view.healthy_record_files,
        vec![present.display().to_string()]
    );
    assert_eq!(view.unlocked_keys, vec!["block_size".to_string()]);
}
