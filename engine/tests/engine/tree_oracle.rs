//! The offline DDTree oracle (`train/tree_metrics.rs`, scored in `train/eval.rs`) against the
//! online decoder it stands in for: on the target's own greedy continuations, at each position
//! where an online DDTree round begins, the oracle's accepted drafts at the round's budget
//! equal the round's, for a DFlash and a Domino drafter. The rounds' drafts are accepted often
//! (a vocabulary of 8), so the trees are walked several nodes deep.
use std::collections::HashMap;

use dflash_engine::decode::{generate_target_only, generate_tree};
use dflash_engine::model::drafter::{AttentionBackend, Drafter};
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::continuation_eval::continuation_sample;
use dflash_engine::train::eval::{evaluate_with, EvalOptions};
use dflash_engine::train::labels::LabelMaskRule;

use crate::support::decode::{domino_drafter, drafter, greedy, prompts, target};

const VOCAB: i64 = 8;
const NEW_TOKENS: usize = 20;
const BUDGETS: [usize; 3] = [1, 3, 8];

/// Checks every online round of every budget against the oracle; returns the rounds checked
/// and the drafts they accepted, per budget.
fn oracle_matches_online_rounds(target: &TargetModel, drafter: &Drafter) -> Vec<(usize, usize)> {
    let settings = greedy(NEW_TOKENS);
    let prompts: Vec<Vec<i64>> = prompts(VOCAB).into_iter().skip(1).take(3).collect();
    let samples: Vec<_> = prompts
        .iter()
        .map(|p| {
            let continuation = generate_target_only(target, p, &settings)
                .unwrap()
                .output_ids;
            continuation_sample(p, &continuation)
        })
        .collect();
    let opts = EvalOptions {
        anchors_per_forward: 64,
        rows_per_forward: 2,
        gamma: 7.0,
        rule: LabelMaskRule::Independent,
        chunk_positions: 64,
        backend: AttentionBackend::BlockSparse,
        dpace_alpha: 0.5,
        dpace_normalization: Default::default(),
        tree_budgets: BUDGETS.to_vec(),
        serve_tree_budget: Some(3),
        tree_block_subsample: 1,
        dspark: Default::default(),
        selector_alpha: 1.0,
    };
    let held: Vec<_> = samples.iter().collect();
    let mut oracle: HashMap<(usize, i64), Vec<usize>> = HashMap::new();
    let report = evaluate_with(target, drafter, &held, &opts, &mut |block| {
        assert_eq!(block.budgets, BUDGETS);
        oracle.insert((block.row, block.anchor), block.tree_accepted.to_vec());
    })
    .unwrap();
    assert_eq!(oracle.len() as u64, report.blocks, "one outcome per block");
    assert_eq!(report.tau_tree_serve, Some(report.tau_tree_oracle[&3]));
    eprintln!(
        "offline chain τ {:.3}, DDTree oracle τ per budget {:?}",
        report.tau, report.tau_tree_oracle
    );
    let mut checked = vec![(0, 0); BUDGETS.len()];
    for (b, &budget) in BUDGETS.iter().enumerate() {
        for (row, prompt) in prompts.iter().enumerate() {
            let ids = &samples[row].input_ids;
            let online = generate_tree(target, drafter, prompt, &settings, budget).unwrap();
            assert_eq!(&ids[prompt.len()..], &online.generation.output_ids[..]);
            // the first round's root is the prefill's token, the first of the continuation
            let mut root_at = prompt.len();
            for (r, round) in online.rounds.iter().enumerate() {
                assert_eq!(round.root, ids[root_at], "row {row} round {r}");
                // the output stops inside the last round: past it the oracle has no labels
                let left = ids.len() - 1 - root_at;
                let expected = round.accepted.len().min(left);
                let got = oracle
                    .get(&(row, root_at as i64))
                    .unwrap_or_else(|| panic!("no block at row {row} position {root_at}"))[b];
                assert_eq!(got, expected, "budget {budget} row {row} round {r}");
                checked[b].0 += 1;
                checked[b].1 += expected;
                root_at += round.accepted.len() + 1;
            }
        }
    }
    checked
}

/// Every budget's rounds were checked, and the larger trees committed more drafts: the
/// oracle was held to rounds of several depths.
fn assert_deep_enough(checked: &[(usize, usize)]) {
    assert!(
        checked.iter().all(|&(rounds, _)| rounds >= 20),
        "{checked:?}"
    );
    let drafts: Vec<usize> = checked.iter().map(|c| c.1).collect();
    assert!(drafts[0] > 0 && drafts[2] > drafts[0], "{checked:?}");
}

#[test]
fn the_oracle_commits_what_each_online_ddtree_round_commits_dflash() {
    let target = target(VOCAB, 5);
    let (_vs, drafter) = drafter(VOCAB, 5, 21);
    let checked = oracle_matches_online_rounds(&target, &drafter);
    eprintln!("rounds and drafts per budget {BUDGETS:?}: {checked:?}");
    assert_deep_enough(&checked);
}

#[test]
fn the_oracle_commits_what_each_online_ddtree_round_commits_domino() {
    let target = target(VOCAB, 6);
    let (_vs, drafter) = domino_drafter(VOCAB, 5, 22, 1);
    let checked = oracle_matches_online_rounds(&target, &drafter);
    eprintln!("rounds and drafts per budget {BUDGETS:?}: {checked:?}");
    assert_deep_enough(&checked);
}
