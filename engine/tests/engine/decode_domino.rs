//! Decoding with a Domino drafter: the block is drafted through its GRU correction, slot by
//! slot over the drafter's own drafts (against a written-out reference of SpecForge's
//! `_sample_draft_tokens`), each DDTree node from its own path's corrected distribution, and
//! greedy chain and tree decoding stay lossless against the target alone.
use dflash_engine::decode::{generate_tree, greedy_block, DraftLogits};
use dflash_engine::model::drafter::{Drafter, DrafterCache};
use dflash_engine::model::target::TargetModel;
use tch::{nn, Kind, Tensor};

use crate::support::decode::{
    assert_greedy_lossless, domino_drafter, greedy, prefilled, prompts, target, LOSSLESS_CASES,
};

/// SpecForge's Domino head written out from the checkpoint's tensors (by their SpecForge
/// names): the block's drafter outputs and base logits once, then per slot the GRU's state
/// after the tokens before it, `embed_proj` over `[z_k ; h]`, added to the slot's base logits
/// from `1 + pure_draft_prefix_len` on.
struct WrittenOut {
    z: Tensor,
    base: Tensor,
    embed: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    w1: Tensor,
    w2: Tensor,
    suffix_start: i64,
}

impl WrittenOut {
    fn new(
        target: &TargetModel,
        drafter: &Drafter,
        vs: &nn::VarStore,
        context: &DrafterCache,
        root: i64,
    ) -> Self {
        let cfg = drafter.config();
        let bs = cfg.block_size;
        let mut ids = vec![cfg.mask_token_id; bs as usize];
        ids[0] = root;
        let block = Tensor::from_slice(&ids).view([1, bs]);
        let embedded = Tensor::embedding(target.embed_tokens(), &block, -1, false, false);
        let z = drafter.draft_block(context, &embedded).get(0);
        let base = z.matmul(&target.lm_head().tr());
        let var = |name: &str| vs.variables()[name].detach();
        let head = cfg.head.domino().expect("a Domino drafter");
        WrittenOut {
            z,
            base,
            embed: target.embed_tokens().detach(),
            w_ih: var("prefix_gru.weight_ih_l0"),
            w_hh: var("prefix_gru.weight_hh_l0"),
            w1: var("embed_proj.0.weight"),
            w2: var("embed_proj.2.weight"),
            suffix_start: head.suffix_start(),
        }
    }

    /// PyTorch's GRU cell, gate rows r, z, n.
    fn gru_step(&self, token: i64, h: &Tensor) -> Tensor {
        let g = h.size()[0];
        let x = self.embed.get(token);
        let gate = |w: &Tensor, i: i64, v: &Tensor| w.narrow(0, i * g, g).mv(v);
        let r = (gate(&self.w_ih, 0, &x) + gate(&self.w_hh, 0, h)).sigmoid();
        let u = (gate(&self.w_ih, 1, &x) + gate(&self.w_hh, 1, h)).sigmoid();
        let n = (gate(&self.w_ih, 2, &x) + r * gate(&self.w_hh, 2, h)).tanh();
        (1.0 - &u) * n + u * h
    }

    /// Slot `k`'s logits after the block's tokens `before` (the root first).
    fn slot_logits(&self, k: i64, before: &[i64]) -> Tensor {
        let base = self.base.get(k);
        if k < self.suffix_start {
            return base;
        }
        let mut h = Tensor::zeros([self.w_hh.size()[1]], (Kind::Float, tch::Device::Cpu));
        for &t in before {
            h = self.gru_step(t, &h);
        }
        let features = Tensor::cat(&[self.z.get(k), h], 0);
        base + self.w2.mv(&self.w1.mv(&features).silu())
    }

    /// The greedy block: each slot's argmax, read by the next slot's GRU state.
    fn greedy_block(&self, root: i64) -> Vec<i64> {
        let mut tokens = vec![root];
        for k in 1..self.base.size()[0] {
            let next = self.slot_logits(k, &tokens).argmax(-1, false);
            tokens.push(next.int64_value(&[]));
        }
        tokens.split_off(1)
    }
}

#[test]
fn a_domino_block_is_drafted_through_its_correction_over_its_own_drafts() {
    let (vocab, block_size) = (64, 6);
    let target = target(vocab, 3);
    let mut changed = false;
    for prefix in [0, 2] {
        let (vs, drafter) = domino_drafter(vocab, block_size, 13, prefix);
        for prompt in prompts(vocab) {
            let (context, root) = prefilled(&target, &drafter, &prompt);
            let corrected = greedy_block(&target, &drafter, &context, root, DraftLogits::Drafter);
            let base = greedy_block(&target, &drafter, &context, root, DraftLogits::LmHeadOnly);
            let reference = WrittenOut::new(&target, &drafter, &vs, &context, root);
            assert_eq!(corrected, reference.greedy_block(root), "prefix {prefix}");
            // the pure-draft prefix keeps the base logits
            let kept = prefix as usize;
            assert_eq!(corrected[..kept], base[..kept], "prefix {prefix}");
            changed |= corrected != base;
        }
    }
    assert!(
        changed,
        "the correction never changed a draft: it went untested"
    );
}

#[test]
fn greedy_chain_and_ddtree_with_a_domino_drafter_equal_the_target_alone() {
    let (mut accepted_chain, mut accepted_tree, mut differs) = (false, false, false);
    for (vocab, block_size, seed) in LOSSLESS_CASES {
        let target = target(vocab, seed);
        for prefix in [0, 1] {
            let (_vs, drafter) = domino_drafter(vocab, block_size, seed + 10, prefix);
            for prompt in prompts(vocab) {
                let at = format!("vocab {vocab} block {block_size} prefix {prefix}");
                let run = assert_greedy_lossless(&target, &drafter, &prompt, usize::MAX, &at);
                differs |= run.base_differs;
                accepted_chain |= run.accepted_chain;
                accepted_tree |= run.accepted_tree;
            }
        }
    }
    assert!(
        accepted_chain && accepted_tree,
        "no draft accepted: untested"
    );
    assert!(
        differs,
        "corrected and base chains never differed: untested"
    );
}

#[test]
fn each_ddtree_node_is_scored_by_the_corrected_distribution_of_its_own_path() {
    let (vocab, block_size) = (64, 5);
    let target = target(vocab, 3);
    let (vs, drafter) = domino_drafter(vocab, block_size, 17, 0);
    let prompt = &prompts(vocab)[2];
    let (context, root) = prefilled(&target, &drafter, prompt);
    let reference = WrittenOut::new(&target, &drafter, &vs, &context, root);
    let run = generate_tree(&target, &drafter, prompt, &greedy(8), 12).unwrap();
    let first = &run.rounds[0];
    assert_eq!(first.root, root);
    let tree = &first.tree;
    let mut deeper = false;
    for node in 0..tree.len() {
        let path = tree.path_tokens(node);
        let mut before = vec![root];
        let mut score = 0.0;
        for (depth, &token) in path.iter().enumerate() {
            let logp = reference
                .slot_logits(depth as i64 + 1, &before)
                .log_softmax(-1, Kind::Float);
            score += logp.double_value(&[token]);
            before.push(token);
        }
        assert!(
            (score - tree.scores[node]).abs() < 1e-4,
            "node {node} (path {path:?}): tree score {} ≠ written-out {score}",
            tree.scores[node]
        );
        deeper |= path.len() > 1;
    }
    assert!(deeper, "the tree never went past depth 1: paths untested");
    // the chain's greedy block is the tree's rank-0 path, as far as the budget lets it reach
    let chain = reference.greedy_block(root);
    let mut at = None;
    for &token in &chain {
        match tree.child(at, token) {
            Some(node) => at = Some(node),
            None => break,
        }
    }
    assert!(at.is_some(), "the tree holds no prefix of the greedy chain");
}
