//! Decoding with a DFlash2 drafter, as SpecForge's `_sample_draft_tokens` and SGLang's DFlash2
//! worker draft: slots `1..bs−1` of the block, each from its unary top-K, picked by the
//! selector given the token before it (the root, then each draft). Checked against the walk
//! written out from the checkpoint's tensors, and greedy chain and tree decoding stay lossless
//! against the target alone.
use dflash_engine::decode::{greedy_block, DraftLogits};
use dflash_engine::model::drafter::{Drafter, DrafterCache};
use dflash_engine::model::target::TargetModel;
use tch::{nn, Kind, Tensor};

use crate::support::decode::{
    assert_greedy_lossless, dflash2_drafter, head_prompts, prefilled, prompts, target,
    HEAD_LOSSLESS_CASES,
};

/// The greedy walk written out from the tensors by SpecForge's names: the drafter's outputs `z`
/// of slots `1..bs−1`, `U = c·tanh(m·z·Eᵀ / c)`, each slot's top-K, and slot by slot the
/// candidate maximising `U + (A[prev] ⊙ W_h·z)·B[cand]ᵀ`, `prev` the root and then each pick.
/// Also returns each slot's candidates.
fn written_out_walk(
    target: &TargetModel,
    drafter: &Drafter,
    vs: &nn::VarStore,
    context: &DrafterCache,
    root: i64,
) -> (Vec<i64>, Vec<Vec<i64>>) {
    let cfg = drafter.config();
    let head = *cfg.head.dflash2().expect("a DFlash2 drafter");
    let bs = cfg.block_size;
    let mut ids = vec![cfg.mask_token_id; bs as usize];
    ids[0] = root;
    let block = Tensor::from_slice(&ids).view([1, bs]);
    let embedded = Tensor::embedding(target.embed_tokens(), &block, -1, false, false);
    let z = drafter.draft_block(context, &embedded).get(0);
    let logits = z.matmul(&target.lm_head().tr()).to_kind(Kind::Float) * head.output_multiplier;
    let cap = head.final_logit_softcapping.expect("the fixture caps");
    let unary = (logits / cap).tanh() * cap;
    let w = vs.variables();
    let a = &w["candidate_selector.predecessor_codebook"];
    let b = &w["candidate_selector.successor_codebook"];
    let w_h = &w["candidate_selector.hidden_projection.weight"];
    let (mut prev, mut drafts, mut sets) = (root, Vec::new(), Vec::new());
    for k in 1..bs {
        let (top, cand) = unary.get(k).topk(head.selector_top_k, 0, true, true);
        let context = a.get(prev) * w_h.matmul(&z.get(k));
        let scores = top + b.index_select(0, &cand).matmul(&context);
        prev = cand.int64_value(&[scores.argmax(0, false).int64_value(&[])]);
        drafts.push(prev);
        sets.push(Vec::<i64>::try_from(&cand).unwrap());
    }
    (drafts, sets)
}

#[test]
fn a_dflash2_block_drafts_the_selectors_greedy_walk_over_its_own_drafts() {
    let (vocab, block_size) = (64, 6);
    let target = target(vocab, 3);
    let (mut changed, mut off_top) = (false, false);
    for seed in [13, 14] {
        let (vs, drafter) = dflash2_drafter(vocab, block_size, seed, 5);
        for prompt in prompts(vocab) {
            let (context, root) = prefilled(&target, &drafter, &prompt);
            let walked = greedy_block(&target, &drafter, &context, root, DraftLogits::Drafter);
            let base = greedy_block(&target, &drafter, &context, root, DraftLogits::LmHeadOnly);
            let (reference, candidates) = written_out_walk(&target, &drafter, &vs, &context, root);
            assert_eq!(walked, reference, "seed {seed}");
            assert_eq!(walked.len(), block_size as usize - 1);
            for (draft, set) in walked.iter().zip(&candidates) {
                assert!(set.contains(draft), "a draft outside its slot's top-K");
                off_top |= *draft != set[0];
            }
            changed |= walked != base;
        }
    }
    assert!(
        changed && off_top,
        "the selector never moved a draft off the unary argmax: it went untested"
    );
}

#[test]
fn greedy_chain_and_ddtree_with_a_dflash2_drafter_equal_the_target_alone() {
    let (mut accepted_chain, mut accepted_tree) = (false, false);
    // One top-K a case: fewer candidates than the trees want children (top-3 of 8 tokens, the
    // gold often outside them), as many as the vocabulary (top-8 of 8), and between (top-5).
    for ((vocab, block_size, seed), top_k) in HEAD_LOSSLESS_CASES.into_iter().zip([3, 8, 5]) {
        let target = target(vocab, seed);
        let (_vs, drafter) = dflash2_drafter(vocab, block_size, seed + 10, top_k);
        for prompt in head_prompts(vocab) {
            let at = format!("vocab {vocab} block {block_size} top-{top_k}");
            // bs − 1 drafts and the bonus.
            let run = assert_greedy_lossless(&target, &drafter, &prompt, block_size as usize, &at);
            // A node's children are among its slot's candidates: at most K of them.
            for tree in &run.trees {
                for round in &tree.rounds {
                    let t = &round.tree;
                    for node in 0..t.tokens.len() {
                        let children = t.parents.iter().filter(|&&p| p == Some(node)).count();
                        assert!(children <= top_k as usize, "{at}");
                    }
                }
            }
            accepted_chain |= run.accepted_chain;
            accepted_tree |= run.accepted_tree;
        }
    }
    assert!(
        accepted_chain && accepted_tree,
        "no draft accepted: untested"
    );
}
