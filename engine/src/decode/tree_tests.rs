use super::*;

/// Depth `d` (1-based), rank `r` carries token `100·d + r`, so a node's path names its ranks.
fn candidates(logps: &[&[f64]]) -> Vec<Candidates> {
    logps
        .iter()
        .enumerate()
        .map(|(d, row)| {
            row.iter()
                .enumerate()
                .map(|(r, &lp)| (100 * (d as i64 + 1) + r as i64, lp))
                .collect()
        })
        .collect()
}

fn ranks_of(tree: &DraftTree, node: usize) -> Vec<usize> {
    tree.path_tokens(node)
        .iter()
        .map(|t| (t % 100) as usize)
        .collect()
}

/// Every path of ranks (every possible node), ordered as best-first must pop them.
fn all_paths_in_order(per_depth: &[Candidates]) -> Vec<(f64, Vec<usize>)> {
    let mut paths: Vec<(f64, Vec<usize>)> = Vec::new();
    let mut frontier = vec![(0.0, Vec::new())];
    for row in per_depth {
        let mut next = Vec::new();
        for (score, ranks) in &frontier {
            for (r, &(_, lp)) in row.iter().enumerate() {
                let mut ranks: Vec<usize> = ranks.clone();
                ranks.push(r);
                next.push((score + lp, ranks));
            }
        }
        paths.extend(next.iter().cloned());
        frontier = next;
    }
    paths.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    paths
}

fn pseudo_random_logps(depths: usize, width: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut x = seed;
    (0..depths)
        .map(|_| {
            let mut row: Vec<f64> = (0..width)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    -((x >> 33) as f64 / (1u64 << 31) as f64) * 3.0
                })
                .collect();
            row.sort_by(|a, b| b.total_cmp(a));
            row
        })
        .collect()
}

#[test]
fn best_first_takes_the_highest_scoring_paths_in_order() {
    for seed in 1..6 {
        let logps = pseudo_random_logps(4, 3, seed);
        let rows: Vec<&[f64]> = logps.iter().map(|r| r.as_slice()).collect();
        let per_depth = candidates(&rows);
        let expected = all_paths_in_order(&per_depth);
        for budget in [1, 5, 17, 40, 120] {
            let tree = build_tree(&per_depth, budget);
            assert_eq!(tree.len(), budget.min(expected.len()));
            for (node, (score, ranks)) in expected.iter().take(tree.len()).enumerate() {
                assert_eq!(&ranks_of(&tree, node), ranks, "seed {seed} budget {budget}");
                assert!((tree.scores[node] - score).abs() < 1e-12);
                assert_eq!(tree.depths[node], ranks.len());
            }
        }
    }
}

#[test]
fn a_smaller_budget_gives_a_prefix_of_a_larger_one() {
    let logps = pseudo_random_logps(7, 6, 9);
    let rows: Vec<&[f64]> = logps.iter().map(|r| r.as_slice()).collect();
    let per_depth = candidates(&rows);
    let big = build_tree(&per_depth, 64);
    for budget in [4, 8, 16, 32] {
        let small = build_tree(&per_depth, budget);
        assert_eq!(small.tokens, big.tokens[..budget]);
        assert_eq!(small.parents, big.parents[..budget]);
    }
    // parents come before children, and pops come in non-increasing score
    for n in 0..big.len() {
        assert!(big.parents[n].is_none_or(|p| p < n));
        assert!(n == 0 || big.scores[n] <= big.scores[n - 1]);
    }
}

#[test]
fn equal_scores_pop_by_rank_tuple_and_depth_and_width_bound_the_tree() {
    // depth 1 has two tokens of equal log-probability; depth 2 one certain token
    let per_depth = candidates(&[&[-0.5, -0.5, -2.0], &[0.0]]);
    let tree = build_tree(&per_depth, 10);
    let order: Vec<Vec<usize>> = (0..tree.len()).map(|n| ranks_of(&tree, n)).collect();
    // (0) and (0,0) tie at −0.5: the prefix (0) is smaller; then (0,0) before (1)
    assert_eq!(
        order,
        vec![
            vec![0],
            vec![0, 0],
            vec![1],
            vec![1, 0],
            vec![2],
            vec![2, 0]
        ]
    );
    // a chain drafter (one candidate per depth) gives a chain no deeper than its depths
    let chain = build_tree(&candidates(&[&[-0.1], &[-0.2], &[-0.3]]), 16);
    assert_eq!(chain.parents, vec![None, Some(0), Some(1)]);
    assert!(build_tree(&[], 8).is_empty());
}

#[test]
fn top_candidates_rank_ties_by_token_id_even_at_the_cut() {
    let logits = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 3.0, 0.0, 3.0]);
    let top = top_candidates(&logits, 2);
    assert_eq!(top.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2]);
    let all = top_candidates(&logits, 10);
    assert_eq!(
        all.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 5, 0, 4]
    );
    let total: f64 = all.iter().map(|c| c.1.exp()).sum();
    assert!((total - 1.0).abs() < 1e-6, "log-probabilities: {total}");
}

#[test]
fn the_verification_shape_puts_the_root_first() {
    let tree = DraftTree {
        tokens: vec![5, 6, 7],
        parents: vec![None, None, Some(0)],
        depths: vec![1, 1, 2],
        scores: vec![-0.1, -0.2, -0.3],
    };
    let shape = tree.verify_shape();
    assert_eq!(shape.parents(), &[None, Some(0), Some(0), Some(1)]);
    assert_eq!(shape.depths(), &[0, 1, 1, 2]);
    assert_eq!(tree.child(None, 6), Some(1));
    assert_eq!(tree.child(Some(0), 7), Some(2));
    assert_eq!(tree.child(Some(1), 7), None);
    assert_eq!(tree.path_tokens(2), vec![5, 7]);
}

#[test]
fn top_candidates_of_rows_equal_each_rows_own_including_ties_at_the_cut() {
    let logits = Tensor::from_slice(&[
        1.0f32, 3.0, 3.0, 3.0, 0.0, 3.0, // a tie at the cut of k = 2
        0.5, -1.0, 2.0, 0.25, 4.0, -3.0, // no tie
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, // all tied
    ])
    .view([3, 6]);
    for k in [0, 1, 2, 4, 6, 9] {
        let rows = top_candidates_rows(&logits, k);
        let each: Vec<Candidates> = (0..3).map(|r| top_candidates(&logits.get(r), k)).collect();
        assert_eq!(rows, each, "k {k}");
    }
    assert_eq!(
        top_candidates_rows(&logits, 3)[1]
            .iter()
            .map(|c| c.0)
            .collect::<Vec<_>>(),
        vec![4, 2, 0]
    );
}

#[test]
fn the_search_driven_from_outside_grows_the_tree_grow_tree_grows() {
    // children depend on the parent's token (a path-dependent drafter): node token t has the
    // candidates (t·3 mod 7 + 1, −0.4), (t + 2, −1.3) below it, five depths at most
    let children = |parent: Option<usize>, tree: &DraftTree| -> Candidates {
        let (token, depth) = parent.map_or((1, 0), |p| (tree.tokens[p], tree.depths[p]));
        if depth == 5 {
            return Vec::new();
        }
        vec![
            ((token * 3) % 7 + 1, -0.4),
            (token + 2 + depth as i64 * 10, -1.3),
        ]
    };
    for budget in [0, 1, 3, 10, 40] {
        let mut search = TreeSearch::new(budget);
        let mut asked = Vec::new();
        while let Some(parent) = search.wanted() {
            asked.push(parent);
            let c = children(parent, search.tree());
            search.offer(c);
        }
        let tree = search.into_tree();
        assert_eq!(tree, grow_tree(budget, children), "budget {budget}");
        assert_eq!(tree.len(), budget.min(62));
        // asked for the root, then every node but the last, in insertion order
        let expected: Vec<Option<usize>> = std::iter::once(None)
            .chain((0..tree.len().saturating_sub(1)).map(Some))
            .take(if budget == 0 { 0 } else { tree.len().max(1) })
            .collect();
        assert_eq!(asked, expected, "budget {budget}");
    }
}
