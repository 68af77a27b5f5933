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
use tch::{Kind, Tensor};

use crate::model::drafter::{DominoHead, Drafter, DrafterCache};
use crate::model::target::TargetModel;

/// Which logits a drafter drafts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftLogits {
    /// The drafter's own: a Domino drafter's corrected logits, a DFlash drafter's LM-head
    /// logits. What serving uses.
    #[default]
    Drafter,
    /// The target's LM head over the drafter's output alone, a Domino correction left out
    /// (Domino's `base_accept_len`; the same as [`DraftLogits::Drafter`] for DFlash).
    LmHeadOnly,
}

/// The GRU state a slot's correction reads (`[1, G]`); `None` for a drafter without a
/// correction, whose slots need none.
pub type PathState = Option<Tensor>;

/// The drafter's block at one anchor: base logits and, for a corrected drafter, what its
/// correction needs.
pub struct BlockDraft<'a> {
    /// `[bs−1, V]` f32: the LM head over slots `1..bs−1`.
    base: Tensor,
    /// The correction, when applied: the head, its slots' drafter outputs `[bs−1, H]`, and
    /// the target's embedding table the GRU reads tokens through (as in training).
    correction: Option<(&'a DominoHead, Tensor, &'a Tensor)>,
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
        let slots = drafter
            .draft_block(context, &embedded)
            .get(0)
            .narrow(0, 1, bs - 1);
        let base = tch::no_grad(|| {
            slots
                .to_kind(target.kind())
                .linear::<Tensor>(target.lm_head(), None)
                .to_kind(Kind::Float)
        });
        let correction = match (drafter.domino(), logits) {
            (Some(head), DraftLogits::Drafter) => Some((head, slots, target.embed_tokens())),
            _ => None,
        };
        BlockDraft { base, correction }
    }

    /// Slots drafted: `bs − 1`.
    pub fn slots(&self) -> i64 {
        self.base.size()[0]
    }

    /// Whether a slot's logits depend on the tokens drafted before it.
    pub fn path_dependent(&self) -> bool {
        self.correction.is_some()
    }

    /// Every slot's logits `[bs−1, V]`, for a drafter whose slots do not depend on the path.
    pub fn independent_logits(&self) -> Option<&Tensor> {
        (!self.path_dependent()).then_some(&self.base)
    }

    /// The state after reading `token` from `state`; the root's from [`Self::start`].
    pub fn read(&self, state: &PathState, token: i64) -> PathState {
        let (head, slots, embed) = self.correction.as_ref()?;
        tch::no_grad(|| {
            let x = embed
                .get(token)
                .to_device(slots.device())
                .to_kind(slots.kind())
                .unsqueeze(0);
            let h = match state {
                Some(h) => h.shallow_clone(),
                None => Tensor::zeros([1, head.config().gru_hidden_dim], (x.kind(), x.device())),
            };
            Some(head.gru_step(&x, &h))
        })
    }

    /// The state slot 1 reads: the GRU's after the root alone, from `h₀ = 0`.
    pub fn start(&self, root: i64) -> PathState {
        self.read(&None, root)
    }

    /// The logits `[V]` (f32) slot `slot` (`1..bs`) drafts from, given the state after the
    /// block's tokens before it (`state`: from [`Self::start`] and [`Self::read`]).
    pub fn slot_logits(&self, slot: i64, state: &PathState) -> Tensor {
        let base = self.base.get(slot - 1);
        let Some((head, slots, _)) = &self.correction else {
            return base;
        };
        if !head.corrects_slot(slot) {
            return base;
        }
        let h = state
            .as_ref()
            .expect("a corrected slot is given the state of its path");
        let correction = tch::no_grad(|| {
            head.correction(&slots.get(slot - 1).unsqueeze(0), h)
                .get(0)
                .to_kind(Kind::Float)
                .to_device(base.device())
        });
        base + correction
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
            state = block.read(&state, token);
        }
    }
    drafts
}
