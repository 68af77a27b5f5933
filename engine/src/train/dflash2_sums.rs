//! DFlash2's additive sums and the ratios SpecForge logs from them (`train/dflash2.rs`
//! computes them; `LossSums` carries them across micro-batches and ranks).

/// DFlash2's additive sums over one micro-batch. "Supervised" slots are those with a positive
/// weight; per-block sums count the blocks with at least one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Dflash2Sums {
    /// Σ CE(U)·w: the base term's numerator (the tree objective's reported loss with it).
    pub base_ce: f64,
    /// Σ CE_sel·w over the slots whose gold is a candidate, and Σ w over them.
    pub selector_ce: f64,
    pub selector_weight: f64,
    /// Supervised slots, and those whose gold is among the unary top-K.
    pub supervised: f64,
    pub covered: f64,
    /// Covered slots where the teacher-forced selector picks the gold.
    pub conditional_correct: f64,
    /// Supervised slots where the greedy walk from the anchor (each pick the next slot's
    /// predecessor) picks the gold.
    pub serving_correct: f64,
    /// Σ over blocks of `1 + Σ_k Π_{j≤k} hit_j` (the chain ends at the first unsupervised slot):
    /// hit = the gold is a candidate (the oracle), the walk picks it (serving), the unary
    /// argmax is it (DFlash's own acceptance).
    pub oracle_accepted: f64,
    pub serving_accepted: f64,
    pub unary_accepted: f64,
    pub blocks: f64,
}

impl Dflash2Sums {
    /// How many numbers [`Self::to_array`] writes.
    pub const LEN: usize = 11;

    pub fn to_array(&self) -> [f64; Self::LEN] {
        [
            self.base_ce,
            self.selector_ce,
            self.selector_weight,
            self.supervised,
            self.covered,
            self.conditional_correct,
            self.serving_correct,
            self.oracle_accepted,
            self.serving_accepted,
            self.unary_accepted,
            self.blocks,
        ]
    }

    pub fn from_array(a: [f64; Self::LEN]) -> Self {
        Self {
            base_ce: a[0],
            selector_ce: a[1],
            selector_weight: a[2],
            supervised: a[3],
            covered: a[4],
            conditional_correct: a[5],
            serving_correct: a[6],
            oracle_accepted: a[7],
            serving_accepted: a[8],
            unary_accepted: a[9],
            blocks: a[10],
        }
    }

    pub fn add(&mut self, other: &Self) {
        let mut sum = self.to_array();
        for (a, b) in sum.iter_mut().zip(other.to_array()) {
            *a += b;
        }
        *self = Self::from_array(sum);
    }

    /// The ratios, named as SpecForge logs them (`dflash/hard_label/...`, `dflash2/selector/...`);
    /// zeros where a denominator is.
    pub fn metrics(&self, normaliser: f64) -> Dflash2Metrics {
        let ratio = |n: f64, d: f64| if d > 0.0 { n / d } else { 0.0 };
        Dflash2Metrics {
            base_loss: ratio(self.base_ce, normaliser),
            selector_loss: ratio(self.selector_ce, self.selector_weight),
            unary_topk_recall: ratio(self.covered, self.supervised),
            oracle_accepted_length: ratio(self.oracle_accepted, self.blocks),
            conditional_accuracy: ratio(self.conditional_correct, self.covered),
            serving_accuracy: ratio(self.serving_correct, self.supervised),
            serving_accepted_length: ratio(self.serving_accepted, self.blocks),
            unary_accepted_length: ratio(self.unary_accepted, self.blocks),
        }
    }
}

/// [`Dflash2Sums::metrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Dflash2Metrics {
    /// The base term alone over the objective's denominator.
    pub base_loss: f64,
    /// `dflash2/selector/loss`: the selector's CE over the covered slots' weights.
    pub selector_loss: f64,
    /// `unary_top{K}_recall`.
    pub unary_topk_recall: f64,
    /// `unary_top{K}_oracle_accepted_length`.
    pub oracle_accepted_length: f64,
    /// `dflash2/selector/conditional_accuracy`.
    pub conditional_accuracy: f64,
    /// `dflash2/selector/serving_accuracy`.
    pub serving_accuracy: f64,
    /// `dflash2/selector/serving_accepted_length`: the chain τ a serving engine walking the
    /// selector greedily would accept, teacher-forced by the data.
    pub serving_accepted_length: f64,
    /// The same from the unary argmax: the drafter's τ without its selector.
    pub unary_accepted_length: f64,
}
