//! Speculative decoding with a DFlash drafter against its frozen target: the chain method of
//! the DFlash authors' `dflash_generate` (one block drafted and verified per target forward),
//! greedy or sampled with the standard rejection rule; DDTree (`tree.rs`: a best-first tree of
//! drafts verified in one target forward, greedy); and the target alone as the reference.
//! A Domino drafter drafts from its corrected logits (`draft.rs`): its slots in order, each
//! slot's GRU correction reading the drafts before it; in a tree, each node's own path.
//!
//! Pure libtorch math over `model/` (the targets' [`crate::model::target::TargetCache`], the
//! drafter's [`crate::model::drafter::DrafterCache`]); no I/O. Batch 1: one prompt at a time.
//!
//! Counting, two ways ([`Generation`]). A round's acceptance length is the tokens it produced
//! per target forward, the bonus token included (accepted drafts + 1); the prefill's first
//! token is not a round. `acceptance_lengths` clips the last round where the output stops
//! (`max_new_tokens`, a stop token), so every output token is counted once.
//! `peer_acceptance_lengths` counts as z-lab's `dflash_generate` and DDTree's `ddtree_generate`
//! do: the last round in full, and the one more round their loop runs when the output filled
//! `max_new_tokens` exactly (decoded for the count only). Their τ usually reads higher.
//!
//! The offline DDTree oracle (`tree_oracle.rs`) scores a tree against a block's gold labels,
//! no target call: what the tree would commit had the target chosen the labels.
//!
//! [`run_online`] runs every [`Method`] on every prompt of a set beside the target alone and
//! summarises it ([`OnlineReport`]).
mod chain;
mod draft;
mod error;
mod online;
mod sampling;
mod tree;
mod tree_oracle;

pub use chain::{generate_chain, generate_chain_with, generate_target_only, Generation, Settings};
pub use draft::{greedy_block, BlockDraft, DraftLogits, PathState};
pub use error::DecodeError;
pub use online::{
    acceptance, prompt_settings, run_online, run_online_with, Acceptance, Method, MethodRun,
    OnlineReport, TargetOnlyRun,
};
pub use sampling::{distribution, sample_index, verify_draft, Sampling, Verdict};
pub use tree::{
    build_tree, generate_tree, generate_tree_with, grow_tree, top_candidates, top_candidates_rows,
    Candidates, DraftTree, TreeGeneration, TreeRound, TreeSearch,
};
pub use tree_oracle::{accepted_drafts, accepted_per_budget, GoldSlot};
