//! DDTree: the target's tree verification equals verifying every root-to-leaf path as a chain
//! (hybrid target: the Gated DeltaNet state follows the tree), its rollback keeps exactly the
//! accepted path, and greedy tree decoding is lossless and commits, in every round, the longest
//! prefix of the target's greedy continuation that the tree holds.
use dflash_engine::decode::{
    build_tree, generate_target_only, generate_tree, Candidates, DecodeError, DraftTree, Sampling,
    Settings,
};
use dflash_engine::model::error::ModelError;
use dflash_engine::model::target::{TargetCache, TargetModel, TreeShape};
use tch::Tensor;

use crate::support::decode::{drafter, greedy, prompts, target, LOSSLESS_CASES};
use crate::support::drafter::max_abs_diff;

/// fp32 on CPU: the tree runs the same arithmetic as the chain in another grouping (batched by
/// depth, masked attention), so rows agree to rounding, far below any logit gap.
const TOLERANCE: f64 = 2e-5;

fn ids(tokens: &[i64]) -> Tensor {
    Tensor::from_slice(tokens).view([1, tokens.len() as i64])
}

fn prefilled(target: &TargetModel, prompt: &[i64], taps: &[usize]) -> TargetCache {
    let mut cache = target.new_cache();
    target
        .forward_cached(&ids(prompt), &mut cache, taps)
        .unwrap();
    cache
}

/// A tree over `vocab` with several branches and depths: per depth four distinct tokens of
/// spread log-probabilities.
fn branching_tree(vocab: i64, depths: usize, budget: usize) -> DraftTree {
    let per_depth: Vec<Candidates> = (0..depths)
        .map(|d| {
            (0..4)
                .map(|r| {
                    let token = ((d * 5 + r * 3 + 1) as i64) % vocab;
                    (token, -0.4 * r as f64 - 0.1 * d as f64)
                })
                .collect()
        })
        .collect();
    build_tree(&per_depth, budget)
}

fn argmax_row(logits: &Tensor, row: i64) -> i64 {
    logits.get(row).argmax(-1, false).int64_value(&[])
}

#[test]
fn tree_verification_equals_verifying_every_root_to_leaf_path_as_a_chain() {
    let vocab = 16;
    let target = target(vocab, 4);
    let taps = [0usize, 1, 2];
    // 70 tokens: the prefill runs the chunked delta rule over more than one chunk
    let prompt: Vec<i64> = (0..70).map(|i| (i * 5 + i / 7) % (vocab - 1)).collect();
    let root = 3;
    let tree = branching_tree(vocab, 5, 14);
    let shape = tree.verify_shape();
    assert!(!shape.is_chain());
    let mut tokens = vec![root];
    tokens.extend_from_slice(&tree.tokens);

    let mut cache = prefilled(&target, &prompt, &taps);
    let step = target
        .forward_tree(&ids(&tokens), &shape, &mut cache, &taps)
        .unwrap();
    let (tree_logits, tree_taps) = (step.logits.get(0), step.taps.get(0));

    let leaves: Vec<usize> = (0..tree.len())
        .filter(|&n| !tree.parents.contains(&Some(n)))
        .collect();
    assert!(leaves.len() >= 3, "the tree should branch: {tree:?}");
    let mut greedy_at = vec![None; tokens.len()];
    for &leaf in &leaves {
        let path: Vec<usize> = std::iter::once(0)
            .chain(
                std::iter::successors(Some(leaf), |&n| tree.parents[n])
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .map(|n| n + 1),
            )
            .collect();
        let path_tokens: Vec<i64> = path.iter().map(|&i| tokens[i]).collect();
        let mut chain_cache = prefilled(&target, &prompt, &taps);
        let chain = target
            .forward_cached(&ids(&path_tokens), &mut chain_cache, &taps)
            .unwrap();
        for (k, &i) in path.iter().enumerate() {
            let (k, i64i) = (k as i64, i as i64);
            let logit_diff = max_abs_diff(&chain.logits.get(0).get(k), &tree_logits.get(i64i));
            let tap_diff = max_abs_diff(&chain.taps.get(0).get(k), &tree_taps.get(i64i));
            assert!(
                logit_diff < TOLERANCE && tap_diff < TOLERANCE,
                "leaf {leaf}, token {i}: logits differ by {logit_diff}, taps by {tap_diff}"
            );
            greedy_at[i] = Some(argmax_row(&chain.logits.get(0), k));
        }
    }

    // the accepted path: by the tree's own logits, and by the per-path verifications
    let walk = |greedy: &dyn Fn(usize) -> i64| {
        let (mut at, mut accepted) = (None, Vec::new());
        while let Some(node) = tree.child(at, greedy(at.map_or(0, |n| n + 1))) {
            accepted.push(node);
            at = Some(node);
        }
        accepted
    };
    let by_tree = walk(&|row| argmax_row(&tree_logits, row as i64));
    let by_paths = walk(&|row| greedy_at[row].expect("every token is on a path"));
    assert_eq!(by_tree, by_paths);

    // keeping a path that is not a prefix of the tree's tokens, then decoding on: the same
    // numbers as a cache that only ever saw that path
    let deepest = *leaves.last().unwrap();
    let mut kept_nodes: Vec<usize> =
        std::iter::successors(Some(deepest), |&n| tree.parents[n]).collect();
    kept_nodes.reverse();
    let path: Vec<usize> = std::iter::once(0)
        .chain(kept_nodes.iter().map(|&n| n + 1))
        .collect();
    assert!(path.iter().enumerate().any(|(k, &i)| k != i));
    cache.keep_path(&path).unwrap();
    let mut plain = prefilled(&target, &prompt, &taps);
    let path_tokens: Vec<i64> = path.iter().map(|&i| tokens[i]).collect();
    target
        .forward_cached(&ids(&path_tokens), &mut plain, &taps)
        .unwrap();
    assert_eq!(cache.len(), plain.len());
    let next = [7i64, 2, 9];
    let after_tree = target
        .forward_cached(&ids(&next), &mut cache, &taps)
        .unwrap();
    let after_plain = target
        .forward_cached(&ids(&next), &mut plain, &taps)
        .unwrap();
    let diff = max_abs_diff(&after_tree.logits, &after_plain.logits);
    assert!(
        diff < TOLERANCE,
        "after keep_path the logits differ by {diff}"
    );
    // and a crop inside that chain still rolls the delta-rule state back
    cache.crop(cache.len() - 2).unwrap();
    plain.crop(plain.len() - 2).unwrap();
    let again_tree = target
        .forward_cached(&ids(&[5]), &mut cache, &taps)
        .unwrap();
    let again_plain = target
        .forward_cached(&ids(&[5]), &mut plain, &taps)
        .unwrap();
    assert!(max_abs_diff(&again_tree.logits, &again_plain.logits) < TOLERANCE);
}

#[test]
fn an_unresolved_tree_refuses_another_forward_and_a_non_path() {
    let target = target(16, 5);
    let mut cache = prefilled(&target, &[1, 2, 3], &[]);
    let shape = TreeShape::new(vec![None, Some(0), Some(0), Some(1)]).unwrap();
    target
        .forward_tree(&ids(&[4, 5, 6, 7]), &shape, &mut cache, &[])
        .unwrap();
    assert!(matches!(
        target.forward_cached(&ids(&[1]), &mut cache, &[]),
        Err(ModelError::TreeUnresolved { tokens: 4 })
    ));
    assert!(matches!(
        cache.crop(4),
        Err(ModelError::TreeUnresolved { .. })
    ));
    assert!(matches!(
        cache.keep_path(&[0, 2, 3]),
        Err(ModelError::NotATreePath { .. })
    ));
    cache.keep_path(&[0, 2]).unwrap();
    assert_eq!(cache.len(), 5);
    target.forward_cached(&ids(&[1]), &mut cache, &[]).unwrap();
    let wrong = target.forward_tree(&ids(&[1, 2]), &shape, &mut cache, &[]);
    assert!(matches!(wrong, Err(ModelError::BadInput { .. })));
}

#[test]
fn greedy_ddtree_is_lossless_and_commits_the_longest_greedy_prefix_the_tree_holds() {
    let mut accepted_some = false;
    for (vocab, block_size, seed) in LOSSLESS_CASES {
        let target = target(vocab, seed);
        let (_vs, drafter) = drafter(vocab, block_size, seed + 10);
        let settings = greedy(24);
        for prompt in prompts(vocab) {
            let plain = generate_target_only(&target, &prompt, &settings).unwrap();
            for budget in [1usize, 3, 8, 24] {
                let run = generate_tree(&target, &drafter, &prompt, &settings, budget).unwrap();
                let out = &run.generation.output_ids;
                let at = format!("vocab {vocab} block {block_size} budget {budget}");
                assert_eq!(out, &plain.output_ids, "{at}, prompt of {}", prompt.len());
                let counted: usize = run.generation.acceptance_lengths.iter().sum();
                assert_eq!(counted + 1, out.len(), "{at}");
                let mut start = 1; // output tokens before the round: the prefill's first
                for round in &run.rounds {
                    assert!(round.tree.len() <= budget, "{at}");
                    assert!(round.tree.depths.iter().all(|&d| d < block_size as usize));
                    assert_eq!(round.root, out[start - 1], "{at}");
                    // the longest prefix of the greedy continuation that the tree holds
                    let (mut node, mut longest) = (None, Vec::new());
                    while let Some(&want) = out.get(start + longest.len()) {
                        let Some(child) = round.tree.child(node, want) else {
                            break;
                        };
                        longest.push(child);
                        node = Some(child);
                    }
                    let visible = (out.len() - start).min(round.accepted.len());
                    assert_eq!(round.accepted[..visible], longest[..visible], "{at}");
                    if start + round.accepted.len() < out.len() {
                        assert_eq!(round.accepted, longest, "{at}");
                        assert_eq!(round.bonus, out[start + round.accepted.len()], "{at}");
                    }
                    accepted_some |= !round.accepted.is_empty();
                    start += round.accepted.len() + 1;
                }
            }
        }
    }
    assert!(
        accepted_some,
        "no tree round accepted a node: acceptance went untested"
    );
}

#[test]
fn ddtree_peer_counting_runs_the_last_round_in_full_and_the_round_after_an_exact_fill() {
    let (mut cut, mut exact) = (0, 0);
    // until a case has shown both a cut last round and an exact fill
    for (vocab, block_size, seed) in LOSSLESS_CASES {
        let target = target(vocab, seed);
        let (_vs, drafter) = drafter(vocab, block_size, seed + 10);
        let prompt = prompts(vocab).remove(2);
        let longer = generate_tree(&target, &drafter, &prompt, &greedy(60), 8).unwrap();
        let longer = &longer.generation.acceptance_lengths;
        for max_new_tokens in 1..=24 {
            let run =
                generate_tree(&target, &drafter, &prompt, &greedy(max_new_tokens), 8).unwrap();
            let g = &run.generation;
            let at = format!("vocab {vocab} block {block_size}, max_new_tokens {max_new_tokens}");
            // ddtree_generate's loop: every round that starts at `start < max_length`, in full
            let mut committed = 1;
            let peer: Vec<usize> = longer
                .iter()
                .take_while(|&&len| {
                    let runs = committed <= max_new_tokens;
                    committed += len;
                    runs
                })
                .copied()
                .collect();
            assert_eq!(g.peer_acceptance_lengths, peer, "{at}");
            let n = g.acceptance_lengths.len();
            assert_eq!(run.rounds.len(), n, "{at}");
            let counted: usize = g.acceptance_lengths.iter().sum();
            assert_eq!(counted + 1, max_new_tokens, "{at}");
            if n > 0 {
                assert_eq!(g.acceptance_lengths[..n - 1], peer[..n - 1], "{at}");
            }
            cut += usize::from(n > 0 && g.acceptance_lengths[n - 1] < peer[n - 1]);
            exact += usize::from(peer.len() == n + 1);
        }
        if cut > 0 && exact > 0 {
            break;
        }
    }
    assert!(
        cut > 0 && exact > 0,
        "cut {cut}, exact {exact}: a case went untested"
    );
}

#[test]
fn ddtree_refuses_sampling_and_an_empty_budget() {
    let target = target(8, 1);
    let (_vs, drafter) = drafter(8, 4, 11);
    let greedy = greedy(4);
    let sampled = Settings {
        sampling: Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
        ..greedy.clone()
    };
    assert!(matches!(
        generate_tree(&target, &drafter, &[1, 2], &sampled, 8),
        Err(DecodeError::TreeNeedsGreedy)
    ));
    assert!(matches!(
        generate_tree(&target, &drafter, &[1, 2], &greedy, 0),
        Err(DecodeError::BadBudget { budget: 0 })
    ));
}
