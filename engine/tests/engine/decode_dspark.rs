//! Decoding with a DSpark drafter, as SGLang's and vLLM's DSpark workers draft: every slot of
//! the block drafts (slot `k` the token after the anchor's position + `k`), the Markov head
//! reading the token before each slot (the root, then each draft) and, for the RNN head, its
//! state along the block. Checked against a written-out reference from the head's weights, and
//! greedy chain and tree decoding stay lossless against the target alone.
use dflash_engine::decode::{greedy_block, DraftLogits};
use dflash_engine::model::drafter::{Drafter, DrafterCache, MarkovHeadType};
use dflash_engine::model::target::TargetModel;
use tch::{nn, Kind, Tensor};

use crate::support::decode::{
    assert_greedy_lossless, dspark_drafter, head_prompts, prefilled, prompts, target,
    HEAD_LOSSLESS_CASES,
};

const KINDS: [MarkovHeadType; 3] = [
    MarkovHeadType::Vanilla,
    MarkovHeadType::Gated,
    MarkovHeadType::Rnn,
];

/// The greedy block written out from the checkpoint's tensors by SpecForge's names: the
/// drafter's outputs `z` of all `bs` slots and their LM-head logits once, then slot by slot
/// the Markov bias of the token before it (`W₂·W₁[prev]`, gated by
/// `σ(gate_proj([z ; W₁[prev]]))`, or the RNN's `W₂·tanh(o)` with its state along the block).
fn written_out_block(
    target: &TargetModel,
    drafter: &Drafter,
    vs: &nn::VarStore,
    context: &DrafterCache,
    root: i64,
    kind: MarkovHeadType,
) -> Vec<i64> {
    let cfg = drafter.config();
    let bs = cfg.block_size;
    let mut ids = vec![cfg.mask_token_id; bs as usize];
    ids[0] = root;
    let block = Tensor::from_slice(&ids).view([1, bs]);
    let embedded = Tensor::embedding(target.embed_tokens(), &block, -1, false, false);
    let z = drafter.draft_block(context, &embedded).get(0);
    let base = z.matmul(&target.lm_head().tr()).to_kind(Kind::Float);
    let w = vs.variables();
    let get = |name: &str| w[name].shallow_clone();
    let (w1, w2) = (
        get("markov_head.markov_w1.weight"),
        get("markov_head.markov_w2.weight"),
    );
    let rank = w1.size()[1];
    let mut state = Tensor::zeros([rank], (Kind::Float, z.device()));
    let mut prev = root;
    let mut drafts = Vec::new();
    for k in 0..bs {
        let e = w1.get(prev);
        let h = z.get(k);
        let latent = match kind {
            MarkovHeadType::Vanilla => e,
            MarkovHeadType::Gated => {
                let gate = Tensor::cat(&[&h, &e], 0)
                    .matmul(&get("markov_head.gate_proj.weight").tr())
                    + get("markov_head.gate_proj.bias");
                gate.sigmoid() * e
            }
            MarkovHeadType::Rnn => {
                let parts = (Tensor::cat(&[&state, &e, &h], 0)
                    .matmul(&get("markov_head.joint_proj.weight").tr())
                    + get("markov_head.joint_proj.bias"))
                .chunk(3, 0);
                let out = parts[2].tanh();
                let keep = parts[0].sigmoid();
                state = &keep * &state + (1.0 - &keep) * parts[1].tanh();
                out
            }
        };
        let logits = base.get(k) + latent.matmul(&w2.tr());
        let token = logits.argmax(-1, false).int64_value(&[]);
        drafts.push(token);
        prev = token;
    }
    drafts
}

#[test]
fn a_dspark_block_drafts_every_slot_through_its_markov_head_over_its_own_drafts() {
    let (vocab, block_size) = (64, 6);
    let target = target(vocab, 3);
    let mut changed = false;
    for kind in KINDS {
        let (vs, drafter) = dspark_drafter(vocab, block_size, 13, kind);
        for prompt in prompts(vocab) {
            let (context, root) = prefilled(&target, &drafter, &prompt);
            let corrected = greedy_block(&target, &drafter, &context, root, DraftLogits::Drafter);
            let base = greedy_block(&target, &drafter, &context, root, DraftLogits::LmHeadOnly);
            assert_eq!(
                corrected.len(),
                block_size as usize,
                "{kind:?}: every slot drafts"
            );
            let reference = written_out_block(&target, &drafter, &vs, &context, root, kind);
            assert_eq!(corrected, reference, "{kind:?}");
            changed |= corrected != base;
        }
    }
    assert!(
        changed,
        "the Markov head never changed a draft: it went untested"
    );
}

#[test]
fn greedy_chain_and_ddtree_with_a_dspark_drafter_equal_the_target_alone() {
    let (mut accepted_chain, mut accepted_tree) = (false, false);
    // One Markov variant a case: the variants differ in the drafts only.
    for ((vocab, block_size, seed), kind) in HEAD_LOSSLESS_CASES.into_iter().zip(KINDS) {
        let target = target(vocab, seed);
        let (_vs, drafter) = dspark_drafter(vocab, block_size, seed + 10, kind);
        for prompt in head_prompts(vocab) {
            let at = format!("vocab {vocab} block {block_size} {kind:?}");
            // A round commits at most every slot's draft and the bonus.
            let run =
                assert_greedy_lossless(&target, &drafter, &prompt, block_size as usize + 1, &at);
            accepted_chain |= run.accepted_chain;
            accepted_tree |= run.accepted_tree;
        }
    }
    assert!(
        accepted_chain && accepted_tree,
        "no draft accepted: untested"
    );
}
