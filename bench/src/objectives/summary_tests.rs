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
        verdict(&summarise(&runs)),
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
    let v = verdict(&summarise(&runs));
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
    let v = verdict(&summarise(&runs));
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
    let v = verdict(&summarise(&runs));
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
    let v = verdict(&summarise(&runs));
    assert_eq!(v.sentence(), "undecided: 2 seed(s); the verdict needs 3");
    let no_base: Vec<RunFigures> = runs
        .into_iter()
        .filter(|r| r.contender != Some(Contender::Dflash))
        .collect();
    assert_eq!(
        verdict(&summarise(&no_base)).sentence(),
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
