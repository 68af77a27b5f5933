//! DFlash2's knobs (`drafter.head = "dflash2"`): the grouped dynamic convolution, the
//! candidate selector and its unary-logit transform, and the selector loss's schedule of
//! `[training.dflash2]`, read by the engine's `model/drafter/dflash2.rs` and
//! `train/dflash2.rs`, which say what each one does. Names are SpecForge's
//! (`specforge/modeling/draft/dflash2.py` at 0dcf8859, `docs/concepts/DFlash2.md`).
use serde::{Deserialize, Serialize};

/// `drafter.conv_kernel_size` when unset with the DFlash2 head: the taps of SpecForge's
/// documented example and of z-lab's published DFlash2 config.
pub const DEFAULT_CONV_KERNEL_SIZE: usize = 2;
/// `drafter.conv_group_size` when unset: likewise.
pub const DEFAULT_CONV_GROUP_SIZE: usize = 16;
/// `drafter.selector_rank` when unset: likewise.
pub const DEFAULT_SELECTOR_RANK: usize = 256;
/// `drafter.selector_top_k` when unset: likewise.
pub const DEFAULT_SELECTOR_TOP_K: usize = 16;
/// `training.dflash2.selector_loss_alpha` when unset: SpecForge's
/// `dflash2_selector_loss_alpha`.
pub const DEFAULT_SELECTOR_LOSS_ALPHA: f64 = 1.0;

/// `[training.dflash2]`: how much the selector's cross-entropy weighs beside the base
/// objective, step by step: `α_eff` is 0 for the first `selector_warmup_ratio` of the run's
/// optimizer steps, rises linearly to `selector_loss_alpha` over the next
/// `selector_ramp_ratio`, and stays there. Read only with `drafter.head = "dflash2"`; locked
/// all the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Dflash2Section {
    /// α, the selector CE's weight once warmed up (SpecForge `dflash2_selector_loss_alpha`).
    /// 0 trains the backbone alone: the selector keeps its initial weights.
    pub selector_loss_alpha: f64,
    /// The fraction of the run before the selector term counts at all (SpecForge
    /// `dflash2_selector_warmup_ratio`), in [0, 1].
    pub selector_warmup_ratio: f64,
    /// The fraction of the run over which it then rises to α (SpecForge
    /// `dflash2_selector_ramp_ratio`), in [0, 1].
    pub selector_ramp_ratio: f64,
    /// The selector term sees the unary logits and the drafter's hidden states detached, so
    /// it trains the selector alone (SpecForge `dflash2_selector_stop_gradient`).
    pub selector_stop_gradient: bool,
}

impl Default for Dflash2Section {
    fn default() -> Self {
        Self {
            selector_loss_alpha: DEFAULT_SELECTOR_LOSS_ALPHA,
            selector_warmup_ratio: 0.0,
            selector_ramp_ratio: 0.0,
            selector_stop_gradient: false,
        }
    }
}

impl Dflash2Section {
    /// Left out of a written config when nothing in it was set, so a config without the
    /// section reads (and records) as it did before the section existed.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `α_eff` at optimizer step `step` (the steps done before this one) of a `total_steps`
    /// run: 0 before `⌊warmup·T⌋` steps, then `α·(step − ⌊warmup·T⌋)/⌈ramp·T⌉` (at least one
    /// ramp step where a ramp is asked for), then α.
    pub fn effective_alpha(&self, step: u64, total_steps: u64) -> f64 {
        let alpha = self.selector_loss_alpha;
        let warmup = (total_steps as f64 * self.selector_warmup_ratio).floor() as u64;
        if step < warmup {
            return 0.0;
        }
        if self.selector_ramp_ratio <= 0.0 {
            return alpha;
        }
        let ramp = ((total_steps as f64 * self.selector_ramp_ratio).ceil() as u64).max(1);
        let progress = ((step - warmup) as f64 / ramp as f64).min(1.0);
        alpha * progress
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_weight_waits_ramps_and_holds() {
        let s = Dflash2Section {
            selector_loss_alpha: 0.5,
            selector_warmup_ratio: 0.1,
            selector_ramp_ratio: 0.2,
            selector_stop_gradient: false,
        };
        // T = 100: 10 warm-up steps at 0, then 20 ramp steps, then α.
        assert_eq!(s.effective_alpha(0, 100), 0.0);
        assert_eq!(s.effective_alpha(9, 100), 0.0);
        assert_eq!(s.effective_alpha(10, 100), 0.0);
        assert_eq!(s.effective_alpha(20, 100), 0.25);
        assert_eq!(s.effective_alpha(30, 100), 0.5);
        assert_eq!(s.effective_alpha(99, 100), 0.5);
        // The default is α from the first step.
        assert_eq!(Dflash2Section::default().effective_alpha(0, 100), 1.0);
        // A ramp shorter than a step still takes one.
        let short = Dflash2Section {
            selector_ramp_ratio: 0.001,
            ..Dflash2Section::default()
        };
        assert_eq!(short.effective_alpha(0, 100), 0.0);
        assert_eq!(short.effective_alpha(1, 100), 1.0);
    }
}
