use super::*;

fn run(c: Contender, seed: u64, chain: f64) -> RunFigures {
    RunFigures {
        contender: Some(c),
        seed,
        steps: 4,
        offline_tau: Some(chain + 1.0),
        online_chain_tau: Some(chain),
        online_ddtree_tau: [(8, chain + 0.5)].into_iter().collect(),
        loss: vec![5.0, 4.0, 3.0, 2.5],
        median_step_ms: Some(100.0 + seed as f64),
        peak_rss_mib: Some(400.0),
        ..RunFigures::default()
    }
}

fn field(chains: [(Contender, [f64; 3]); 3]) -> Vec<RunFigures> {
    chains
        .iter()
        .flat_map(|(c, taus)| taus.iter().enumerate().map(|(s, &t)| run(*c, s as u64, t)))
        .collect()
}

#[test]
fn spreads_are_median_min_and_max_and_a_loss_curve_is_first_median_last() {
    let s = Spread::of(&[2.0, 3.5, 2.5]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (2.5, 2.0, 3.5, 3));
    assert_eq!(s.width(), 1.5);
    assert_eq!(Spread::of(&[]), None);
    assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
    let curve = LossCurve::of(&[6.0, 5.0, 2.0, 1.0]).unwrap();
    assert_eq!((curve.first, curve.median, curve.last), (6.0, 3.5, 1.0));
    assert_eq!(LossCurve::of(&[]), None);
}

#[test]
fn each_objective_is_summarised_over_its_seeds_and_failed_runs_are_left_out() {
    let mut runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.3, 2.5, 2.4]),
        (Contender::Domino, [1.0, 1.1, 1.2]),
    ]);
    runs.push(RunFigures {
        contender: Some(Contender::Dflash),
        seed: 9,
        error: Some("dflashd start exited 1".into()),
        online_chain_tau: Some(100.0),
        ..RunFigures::default()
    });
    let s = summarise(&runs);
    // The contenders that ran, in the tournament's order; the tree contenders did not.
    assert_eq!(
        s.iter().map(|s| s.contender).collect::<Vec<_>>(),
        [Contender::Dflash, Contender::Dpace, Contender::Domino]
    );
    let dflash = &s[0];
    assert_eq!(dflash.seeds, [0, 1, 2]);
    let chain = dflash.online_chain_tau.unwrap();
    assert_eq!((chain.median, chain.min, chain.max), (2.1, 2.0, 2.2));
    assert_eq!(dflash.offline_tau.unwrap().median, 3.1);
    assert_eq!(dflash.online_ddtree_tau[&8].max, 2.7);
    assert_eq!(dflash.loss_last.unwrap().median, 2.5);
    assert_eq!(dflash.median_step_ms.unwrap().median, 101.0);
    assert_eq!(dflash.offline_base_tau, None);
}

#[test]
fn a_figure_missing_from_one_seed_is_missing_for_the_objective() {
    let mut runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.3, 2.5, 2.4]),
        (Contender::Domino, [1.0, 1.1, 1.2]),
    ]);
    runs[1].online_chain_tau = None;
    assert_eq!(summarise(&runs)[0].online_chain_tau, None);
    assert!(matches!(
        verdict(&summarise(&runs), RankBy::Chain),
        Verdict::Undecided { .. }
    ));
}

#[test]
fn a_tree_contender_that_ran_is_judged_beside_the_published_ones() {
    let mut runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.0, 2.2, 2.1]),
        (Contender::Domino, [2.0, 2.2, 2.1]),
    ]);
    runs.extend(
        [2.6, 2.7, 2.8]
            .iter()
            .enumerate()
            .map(|(seed, &t)| run(Contender::DominoTree, seed as u64, t)),
    );
    let v = verdict(&summarise(&runs), RankBy::Chain);
    let Verdict::Beats { winners, sentence } = &v else {
        panic!("{v:?}");
    };
    assert_eq!(winners, &[Contender::DominoTree]);
    assert!(
        sentence.contains("Domino + Tree beats DFlash"),
        "{sentence}"
    );
    assert!(
        !sentence.contains("Tree 2."),
        "the DFlash-head tree contender did not run"
    );
}

#[test]
fn a_gain_beyond_the_wider_spread_beats_dflash() {
    // D-PACE's median 2.60 is 0.50 above DFlash's 2.10; the spreads are 0.20 and 0.20.
    let runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.5, 2.7, 2.6]),
        (Contender::Domino, [2.0, 2.3, 2.15]),
    ]);
    let v = verdict(&summarise(&runs), RankBy::Chain);
    let Verdict::Beats { winners, sentence } = &v else {
        panic!("{v:?}");
    };
    assert_eq!(winners, &[Contender::Dpace]);
    assert!(
        sentence.starts_with("D-PACE beats DFlash's online chain τ by more than the seed spread"),
        "{sentence}"
    );
    assert!(sentence.contains("Domino 2.150 vs DFlash 2.100: +0.050, within the seed spread 0.300"));
}

#[test]
fn a_gain_inside_the_spread_is_no_win() {
    // D-PACE's median is 0.25 higher, but its own seeds spread over 0.60.
    let runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.05, 2.65, 2.35]),
        (Contender::Domino, [1.0, 1.1, 1.2]),
    ]);
    let v = verdict(&summarise(&runs), RankBy::Chain);
    assert!(matches!(v, Verdict::NoneBeats { .. }), "{v:?}");
    assert!(v
        .sentence()
        .starts_with("no objective beats DFlash's online chain τ by more than the seed spread"));
    assert!(v
        .sentence()
        .contains("D-PACE 2.350 vs DFlash 2.100: +0.250"));
}

#[test]
fn fewer_than_three_seeds_or_no_baseline_leaves_it_undecided() {
    let runs: Vec<RunFigures> = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [3.0, 3.2, 3.1]),
        (Contender::Domino, [3.0, 3.2, 3.1]),
    ])
    .into_iter()
    .filter(|r| r.seed < 2)
    .collect();
    let v = verdict(&summarise(&runs), RankBy::Chain);
    assert_eq!(v.sentence(), "undecided: 2 seed(s); the verdict needs 3");
    let no_base: Vec<RunFigures> = runs
        .into_iter()
        .filter(|r| r.contender != Some(Contender::Dflash))
        .collect();
    assert_eq!(
        verdict(&summarise(&no_base), RankBy::Chain).sentence(),
        "undecided: DFlash's online chain τ was not measured"
    );
}

#[test]
fn the_loss_curve_by_epoch_spans_the_epochs_every_run_reached() {
    let mut runs = field([
        (Contender::Dflash, [2.0, 2.2, 2.1]),
        (Contender::Dpace, [2.3, 2.5, 2.4]),
        (Contender::Domino, [1.0, 1.1, 1.2]),
    ]);
    for (i, r) in runs.iter_mut().enumerate() {
        r.loss_by_epoch = vec![5.0 + i as f64, 3.0, 2.0];
    }
    // One DFlash seed stopped after two epochs: DFlash's curve has two.
    runs[1].loss_by_epoch.pop();
    let s = summarise(&runs);
    let dflash = &s[0].loss_by_epoch;
    assert_eq!(dflash.len(), 2);
    assert_eq!(
        (dflash[0].median, dflash[0].min, dflash[0].max),
        (6.0, 5.0, 7.0)
    );
    assert_eq!(s[1].loss_by_epoch.len(), 3);
}

#[test]
fn rank_by_parses_chain_and_a_budget_and_round_trips_through_json() {
    assert_eq!(RankBy::parse("chain"), Ok(RankBy::Chain));
    assert_eq!(RankBy::parse("ddtree_32"), Ok(RankBy::Ddtree(32)));
    for bad in ["ddtree_0", "ddtree_", "tree_32", "DDTree_32", ""] {
        let e = RankBy::parse(bad).unwrap_err();
        assert!(e.contains("chain or ddtree_<budget>"), "{bad:?}: {e}");
    }
    let json = serde_json::to_string(&RankBy::Ddtree(16)).unwrap();
    assert_eq!(json, "\"ddtree_16\"");
    assert_eq!(
        serde_json::from_str::<RankBy>(&json).unwrap(),
        RankBy::Ddtree(16)
    );
    assert_eq!(
        RankBy::default(),
        RankBy::Chain,
        "older results were judged on the chain"
    );
}

/// `run`, with DDTree τ at budget 32 set apart from the chain.
fn tree_run(c: Contender, seed: u64, chain: f64, ddtree_32: f64) -> RunFigures {
    let mut r = run(c, seed, chain);
    r.online_ddtree_tau.insert(32, ddtree_32);
    r
}

#[test]
fn ranked_by_the_serving_budget_the_verdict_judges_ddtree_tau_not_the_chain() {
    // Domino + Tree loses on the chain but wins at budget 32 beyond the spread.
    let mut runs = Vec::new();
    for (seed, (d, t)) in [(3.0, 3.3), (3.1, 3.4), (3.2, 3.5)].into_iter().enumerate() {
        let seed = seed as u64;
        runs.push(tree_run(Contender::Dflash, seed, 2.0 + d / 10.0, d));
        runs.push(tree_run(Contender::Dpace, seed, 2.0, d));
        runs.push(tree_run(Contender::Domino, seed, 2.5, d));
        runs.push(tree_run(Contender::DominoTree, seed, 2.1, t + 0.3));
    }
    let summaries = summarise(&runs);
    let by = RankBy::Ddtree(32);
    let v = verdict(&summaries, by);
    let Verdict::Beats { winners, sentence } = &v else {
        panic!("{v:?}");
    };
    assert_eq!(winners, &[Contender::DominoTree]);
    assert!(
        sentence.contains("Domino + Tree beats DFlash's online DDTree τ at budget 32 by more than the seed spread (3.700 vs 3.100: +0.600 > spread 0.200)"),
        "{sentence}"
    );
    let chain = verdict(&summaries, RankBy::Chain);
    assert!(
        !matches!(&chain, Verdict::Beats { winners, .. } if winners.contains(&Contender::DominoTree)),
        "{chain:?}"
    );
    let gains = tree_objective_gains(&summaries, by);
    assert_eq!(
        gains.len(),
        1,
        "only Domino + Tree ran of the tree pairs: {gains:?}"
    );
    assert_eq!(
        gains[0],
        "Domino + Tree vs Domino: online DDTree τ at budget 32 3.700 vs 3.100 (+19.4 %, beyond \
         the seed spread 0.200); chain τ 2.100 vs 2.500 (-16.0 %, worse beyond the spread)"
    );
    let missing = verdict(&summaries, RankBy::Ddtree(64));
    assert_eq!(
        missing.sentence(),
        "undecided: DFlash's online DDTree τ at budget 64 was not measured"
    );
}

#[test]
fn offline_tree_figures_are_summarised_per_budget_and_k() {
    let runs: Vec<RunFigures> = [(0u64, 2.0, 0.5), (1, 2.4, 0.7), (2, 2.2, 0.6)]
        .into_iter()
        .map(|(seed, oracle, recall)| {
            let mut r = run(Contender::Dflash, seed, 2.0);
            r.offline_tree_oracle.insert(32, oracle);
            r.offline_topk_recall.insert(1, recall);
            r
        })
        .collect();
    let s = &summarise(&runs)[0];
    let oracle = s.offline_tree_oracle[&32];
    assert_eq!((oracle.median, oracle.min, oracle.max), (2.2, 2.0, 2.4));
    assert_eq!(s.offline_topk_recall[&1].median, 0.6);
}
