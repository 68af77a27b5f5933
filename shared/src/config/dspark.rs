//! DSpark's knobs (`drafter.head = "dspark"`): the Markov head's variant and the loss weights
//! of `[training.dspark]`, read by the engine's `model/drafter/dspark.rs` and
//! `train/dspark.rs`, which say what each one does. Names and defaults are SpecForge's
//! (`specforge/modeling/draft/dspark.py`, `OnlineDSparkModel`, a6b6b023).
use serde::{Deserialize, Serialize};

/// `drafter.markov_rank` when unset with the DSpark head: SpecForge's checked-in DSpark
/// configs (`configs/qwen3-8b-dspark.json`).
pub const DEFAULT_MARKOV_RANK: usize = 256;
/// `training.dspark.ce` when unset: SpecForge's `dspark_ce_loss_alpha`.
pub const DEFAULT_DSPARK_CE: f64 = 0.1;
/// `training.dspark.l1` when unset: SpecForge's `dspark_l1_loss_alpha`.
pub const DEFAULT_DSPARK_L1: f64 = 0.9;
/// `training.dspark.confidence` when unset: SpecForge's `dspark_confidence_head_alpha`.
pub const DEFAULT_DSPARK_CONFIDENCE: f64 = 1.0;

/// `drafter.markov_head_type`: how the previous token's bias on a slot's logits is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkovHeadType {
    /// `W₂·W₁[prev]`: a low-rank bigram table.
    #[default]
    Vanilla,
    /// `W₂·(σ(G·[h ; W₁[prev]]) ⊙ W₁[prev])`: the slot's hidden state gates the bigram.
    Gated,
    /// A small recurrent state over the block's previous tokens, reset per block.
    Rnn,
}

impl MarkovHeadType {
    /// The value as the config (and SpecForge's `markov_head_type`) writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkovHeadType::Vanilla => "vanilla",
            MarkovHeadType::Gated => "gated",
            MarkovHeadType::Rnn => "rnn",
        }
    }

    /// The variant SpecForge's `markov_head_type` names.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "vanilla" => Some(MarkovHeadType::Vanilla),
            "gated" => Some(MarkovHeadType::Gated),
            "rnn" => Some(MarkovHeadType::Rnn),
            _ => None,
        }
    }
}

/// `[training.dspark]`: the weights of DSpark's three loss terms,
/// `(ce·Σ CE·w + l1·Σ L1·w + confidence·Σ BCE·w) / Σ w`. Read only with
/// `drafter.head = "dspark"`; locked all the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DsparkSection {
    /// The cross-entropy of the Markov-corrected logits against the data token.
    pub ce: f64,
    /// The L1 (twice the total-variation) distance between the drafter's distribution and the
    /// target's own at the same position.
    pub l1: f64,
    /// The confidence head's binary cross-entropy against `1 − L1/2`, the slot's acceptance
    /// probability under the target's distribution.
    pub confidence: f64,
}

impl Default for DsparkSection {
    fn default() -> Self {
        Self {
            ce: DEFAULT_DSPARK_CE,
            l1: DEFAULT_DSPARK_L1,
            confidence: DEFAULT_DSPARK_CONFIDENCE,
        }
    }
}

impl DsparkSection {
    /// Left out of a written config when nothing in it was set, so a config without the
    /// section reads (and records) as it did before the section existed.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}
