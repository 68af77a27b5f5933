//! One round's draft: the drafter's block at the anchor after the accepted context, and the
//! logits each slot drafts from.
//!
//! A DFlash drafter's slots are independent: every slot's logits are the target's LM head over
//! the drafter's output, known at once. A Domino drafter (`model/drafter/domino.rs`) adds to
//! slot `k ≥ 1 + pure_draft_prefix_len` a correction that reads the GRU's state after the
//! block's tokens `0..k−1`: the root (the last committed token) and the drafts of slots
//! `1..k−1`. At inference those are the drafter's own drafts, so the slots are drafted in
//! order, each GRU step reading the token just drafted, as SpecForge's
//! `DominoDraftModel._sample_draft_tokens` does (the block's hidden states and base logits
//! computed once; for `token_position` 1, 2, … the corrected logits of that slot over the
//! tokens completed so far, sampled, written into the block). A tree's nodes each carry
//! their own path's state ([`BlockDraft::read`] from their parent's).
//!
//! A DSpark drafter (`model/drafter/dspark.rs`) drafts from every slot of its block, slot `k`
//! the token after the anchor's position + `k`, as SGLang's and vLLM's DSpark workers do (and
//! as it is trained; SpecForge's own HF `spec_generate` reads slots `1..bs−1`, one slot off).
//! Its Markov head adds to slot `k`'s logits a bias from the token before it (the root for slot
//! 0, then each draft) and, for the RNN head, a state carried along the block.
//!
//! A DFlash2 drafter (`model/drafter/dflash2.rs`) drafts slot `k` from its unary top-K
//! candidates only, scored by its selector given the token before the slot (the root for slot
//! 1, then each draft): the slot's logits are those scores on the candidates and −∞ elsewhere,
//! so the chain's argmax is the selector's greedy walk (SpecForge's `greedy_path`) and a tree
//! grows each node's children from its own path's scores.
use tch::{Kind, Tensor};

use crate::model::drafter::{CandidateSelector, DominoHead, Drafter, DrafterCache, MarkovHead};
use crate::model::target::TargetModel;

/// Which logits a drafter drafts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftLogits {
    /// The drafter's own: a Domino drafter's corrected logits, a DSpark drafter's
    /// Markov-corrected ones, a DFlash drafter's LM-head logits. What serving uses.
    #[default]
    Drafter,
    /// The target's LM head over the drafter's output alone, a Domino correction or a DSpark
    /// Markov head left out (Domino's `base_accept_len`, DSpark's base τ; the same as
    /// [`DraftLogits::Drafter`] for DFlash).
    LmHeadOnly,
}

/// What a slot's correction reads of the tokens drafted before it.
pub enum PathState {
    /// A drafter without a correction: its slots read nothing.
    Free,
    /// Domino: the GRU's state after the block's tokens so far (`[1, G]`).
    Gru(Tensor),
    /// DSpark: the token before the slot and the Markov head's recurrent state (`[1, r]`; the
    /// vanilla and gated heads carry zeros through).
    Markov { prev: i64, state: Tensor },
    /// DFlash2: the token before the slot.
    Selector { prev: i64 },
}

/// A drafter's correction of its LM-head logits, with the drafted slots' outputs it reads.
enum Correction<'a> {
    /// The GRU and the target's embedding table it reads tokens through (as in training).
    Domino {
        head: &'a DominoHead,
        slots: Tensor,
        embed: &'a Tensor,
    },
    Markov {
        head: &'a MarkovHead,
        slots: Tensor,
    },
    /// DFlash2: each drafted slot's unary top-K (`[slots, K]` scores and ids) and output.
    Selector {
        selector: &'a CandidateSelector,
        slots: Tensor,
        unary_top: Tensor,
        candidates: Tensor,
    },
}

/// The drafter's block at one anchor: base logits and, for a corrected drafter, what its
/// correction needs. Drafted slot `n` (`1..=slots()`) drafts the token at the anchor's
/// position + `n`: a DFlash or Domino drafter's slot `n` (slot 0 holds the anchor), a DSpark
/// drafter's slot `n − 1` (its slot 0 drafts the token after the anchor), as SGLang's and
/// vLLM's DSpark workers draft it.
pub struct BlockDraft<'a> {
    /// `[slots, V]` f32: the LM head over the drafted slots.
    base: Tensor,
    correction: Option<Correction<'a>>,
}

impl<'a> BlockDraft<'a> {
    /// Drafts the block `[last, MASK × (bs−1)]` at the anchor after `context`.
    pub fn new(
        target: &'a TargetModel,
        drafter: &'a Drafter,
        context: &DrafterCache,
        last: i64,
        logits: DraftLogits,
    ) -> Self {
        let cfg = drafter.config();
        let bs = cfg.block_size;
        let mut block_ids = vec![cfg.mask_token_id; bs as usize];
        block_ids[0] = last;
        let block = Tensor::from_slice(&block_ids)
            .view([1, bs])
            .to_device(target.device());
        let embedded = Tensor::embedding(target.embed_tokens(), &block, -1, false, false);
        let out = drafter.draft_block(context, &embedded).get(0);
        let dspark = drafter.dspark();
        // A DSpark drafter drafts from every slot, the others from the slots after the anchor.
        let slots = if dspark.is_some() {
            out
        } else {
            out.narrow(0, 1, bs - 1)
        };
        let base = tch::no_grad(|| {
            slots
                .to_kind(target.kind())
                .linear::<Tensor>(target.lm_head(), None)
                .to_kind(Kind::Float)
        });
        if let (Some(selector), DraftLogits::Drafter) = (drafter.selector(), logits) {
            let (unary_top, candidates) =
                tch::no_grad(|| selector.candidates(&selector.unary(&base)));
            let correction = Correction::Selector {
                selector,
                slots,
                unary_top,
                candidates,
            };
            return BlockDraft {
                base,
                correction: Some(correction),
            };
        }
        let correction = match (drafter.domino(), dspark.and_then(|d| d.markov()), logits) {
            (_, _, DraftLogits::LmHeadOnly) | (None, None, _) => None,
            (Some(head), _, DraftLogits::Drafter) => Some(Correction::Domino {
                head,
                slots,
                embed: target.embed_tokens(),
            }),
            (None, Some(head), DraftLogits::Drafter) => Some(Correction::Markov { head, slots }),
        };
        BlockDraft { base, correction }
    }

    /// Tokens drafted: `bs − 1` (DFlash, Domino) or `bs` (DSpark).
    pub fn slots(&self) -> i64 {
        self.base.size()[0]
    }

    /// Whether a slot's logits depend on the tokens drafted before it.
    pub fn path_dependent(&self) -> bool {
        self.correction.is_some()
    }

    /// Every slot's logits `[slots, V]`, for a drafter whose slots do not depend on the path.
    pub fn independent_logits(&self) -> Option<&Tensor> {
        (!self.path_dependent()).then_some(&self.base)
    }

    /// The state drafted slot 1 reads: Domino's GRU after the root alone, from `h₀ = 0`;
    /// DSpark's Markov head with the root as the token before it, from a zero state.
    pub fn start(&self, root: i64) -> PathState {
        match &self.correction {
            None => PathState::Free,
            Some(Correction::Domino { head, slots, .. }) => {
                let zero = Tensor::zeros(
                    [1, head.config().gru_hidden_dim],
                    (slots.kind(), slots.device()),
                );
                self.read(&PathState::Gru(zero), 0, root)
            }
            Some(Correction::Markov { head, slots }) => PathState::Markov {
                prev: root,
                state: head.initial_state(1, slots),
            },
            Some(Correction::Selector { .. }) => PathState::Selector { prev: root },
        }
    }

    /// The state after drafted slot `slot` (from `state`, the one it read) drafted `token`.
    pub fn read(&self, state: &PathState, slot: i64, token: i64) -> PathState {
        tch::no_grad(|| match (&self.correction, state) {
            (Some(Correction::Domino { head, slots, embed }), PathState::Gru(h)) => {
                let x = embed
                    .get(token)
                    .to_device(slots.device())
                    .to_kind(slots.kind())
                    .unsqueeze(0);
                PathState::Gru(head.gru_step(&x, h))
            }
            (Some(Correction::Markov { head, slots }), PathState::Markov { prev, state }) => {
                let (_, next) = head.step_latent(
                    &Tensor::from_slice(&[*prev]).to_device(slots.device()),
                    &slots.get(slot - 1).unsqueeze(0),
                    state,
                );
                PathState::Markov {
                    prev: token,
                    state: next,
                }
            }
            (Some(Correction::Selector { .. }), PathState::Selector { .. }) => {
                PathState::Selector { prev: token }
            }
            _ => PathState::Free,
        })
    }

    /// The logits `[V]` (f32) drafted slot `slot` (`1..=slots()`) drafts from, given the state
    /// after the block's tokens before it (`state`: from [`Self::start`] and [`Self::read`]).
    pub fn slot_logits(&self, slot: i64, state: &PathState) -> Tensor {
        let base = self.base.get(slot - 1);
        if let (Some(selector), PathState::Selector { prev }) = (&self.correction, state) {
            return self.selector_logits(selector, slot, *prev);
        }
        let correction = tch::no_grad(|| match (&self.correction, state) {
            (Some(Correction::Domino { head, slots, .. }), PathState::Gru(h)) => head
                .corrects_slot(slot)
                .then(|| head.correction(&slots.get(slot - 1).unsqueeze(0), h)),
            (Some(Correction::Markov { head, slots }), PathState::Markov { prev, state }) => {
                let (bias, _) = head.step(
                    &Tensor::from_slice(&[*prev]).to_device(slots.device()),
                    &slots.get(slot - 1).unsqueeze(0),
                    state,
                );
                Some(bias)
            }
            (None, _) => None,
            _ => panic!("a corrected slot is given the state of its path"),
        });
        match correction {
            Some(c) => base + c.get(0).to_kind(Kind::Float).to_device(self.base.device()),
            None => base,
        }
    }
}

impl BlockDraft<'_> {
    /// DFlash2's slot `slot` after `prev`: the selector's scores on the slot's candidates, −∞
    /// on every other token.
    fn selector_logits(&self, correction: &Correction, slot: i64, prev: i64) -> Tensor {
        let Correction::Selector {
            selector,
            slots,
            unary_top,
            candidates,
        } = correction
        else {
            unreachable!("called with the selector's correction")
        };
        tch::no_grad(|| {
            let ids = candidates.get(slot - 1).unsqueeze(0);
            let scores = selector.score(
                &ids,
                &unary_top.get(slot - 1).unsqueeze(0),
                &slots.get(slot - 1).unsqueeze(0),
                &Tensor::from_slice(&[prev]).to_device(ids.device()),
            );
            self.base
                .get(slot - 1)
                .full_like(f64::NEG_INFINITY)
                .scatter(0, &ids.get(0), &scores.get(0).to_kind(Kind::Float))
        })
    }
}

/// The greedy draft of the block at the anchor after `context`: slot by slot, each slot's
/// argmax read into the next slot's state. For inspection and tests; the decoders draft the
/// same way inside their rounds.
pub fn greedy_block(
    target: &TargetModel,
    drafter: &Drafter,
    context: &DrafterCache,
    last: i64,
    logits: DraftLogits,
) -> Vec<i64> {
    let block = BlockDraft::new(target, drafter, context, last, logits);
    let mut state = block.start(last);
    let mut drafts = Vec::with_capacity(block.slots() as usize);
    for slot in 1..=block.slots() {
        let token = super::sampling::argmax(&block.slot_logits(slot, &state));
        drafts.push(token);
        if slot < block.slots() {
            state = block.read(&state, slot, token);
        }
    }
    drafts
}
