//! The Run and Throughput panels: offline and online τ, tree τ at the serving budget, the
//! Domino head's base and final acceptance, the DSpark head's and its confidence calibration, a job node's place, the healthy record's clock.
use super::*;

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

/// The incident as a DSpark run would stream it: its status names the head, its metrics lines
/// carry SpecForge's DSpark figures.
fn incident_as_dspark(confidence_head: bool) -> Vec<RecordedFrame> {
    use dflash_shared::config::{DrafterHead, Objective};
    use dflash_shared::metrics::DsparkStepMetrics;
    use dflash_shared::status::RunObjective;
    let mut frames = incident_with_thresholds(Some(DetectorsSection::default()));
    for frame in &mut frames {
        match &mut frame.frame {
            Response::Status(status) => {
                status.run.objective = Some(RunObjective::new(Objective::Dflash, 0.5));
                status.run.drafter_head = Some(DrafterHead::Dspark);
            }
            Response::Metrics(m) => {
                m.dspark = Some(DsparkStepMetrics {
                    ce_loss: m.loss,
                    l1_loss: 0.8,
                    confidence_loss: 0.6,
                    tau_probabilistic: 3.126,
                    base_tau_probabilistic: 2.904,
                    acceptance_mean: 0.583,
                    confidence_mean: confidence_head.then_some(0.612),
                    confidence_abs_error: confidence_head.then_some(0.071),
                });
            }
            _ => {}
        }
    }
    frames
}

/// The incident as a DFlash2 run would stream it: its status names the head, its metrics lines
/// carry the selector's figures.
fn incident_as_dflash2() -> Vec<RecordedFrame> {
    use dflash_shared::config::{DrafterHead, Objective};
    use dflash_shared::metrics::Dflash2StepMetrics;
    use dflash_shared::status::RunObjective;
    let mut frames = incident_with_thresholds(Some(DetectorsSection::default()));
    for frame in &mut frames {
        match &mut frame.frame {
            Response::Status(status) => {
                status.run.objective = Some(RunObjective::new(Objective::Dflash, 0.5));
                status.run.drafter_head = Some(DrafterHead::Dflash2);
            }
            Response::Metrics(m) => {
                m.dflash2 = Some(Dflash2StepMetrics {
                    selector_alpha: 0.5,
                    base_loss: m.loss,
                    selector_loss: 1.2,
                    unary_topk_recall: 0.817,
                    oracle_accepted_length: 4.912,
                    serving_accuracy: 0.61,
                    serving_accepted_length: 3.354,
                    unary_accepted_length: 3.104,
                });
            }
            _ => {}
        }
    }
    frames
}

#[test]
fn the_run_panel_shows_a_dflash2_heads_unary_and_selector_tau_and_its_reach() {
    let app = live_from(incident_as_dflash2(), false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(text.contains("objective DFlash, DFlash2 head"), "{text}");
    assert!(
        text.contains("accept  τ unary 3.10 → selector 3.35 (+0.25)"),
        "{text}"
    );
    assert!(
        text.contains("select  top-K 0.82, oracle τ 4.91, α 0.50"),
        "{text}"
    );
    assert!(text.contains("saved   step"), "{text}");
}

#[test]
fn the_run_panel_shows_a_dspark_heads_base_and_markov_tau_and_its_confidence_calibration() {
    let app = live_from(incident_as_dspark(true), false);
    let text = screen::text(&render(&app, WIDTH, HEIGHT));
    assert!(
        text.contains("objective DSpark distillation, DSpark head"),
        "{text}"
    );
    assert!(
        text.contains("accept  τ base 2.90 → Markov 3.13 (+0.23)"),
        "{text}"
    );
    assert!(
        text.contains("confid. 0.61 for 0.58 accepted (err 0.07)"),
        "{text}"
    );
    // The rows it adds push nothing out of the panel.
    assert!(text.contains("saved   step"), "{text}");

    let headless = live_from(incident_as_dspark(false), false);
    let text = screen::text(&render(&headless, WIDTH, HEIGHT));
    assert!(text.contains("confid. no head (0.58 accepted)"), "{text}");
}
