//! Learning-rate schedule: linear warmup, then cosine annealing to 0 (spec §2.8,
//! SpecForge `CosineAnnealingWarmupLR`).
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmupCosine {
    pub base_lr: f64,
    pub total_steps: u64,
    pub warmup_steps: u64,
}

impl WarmupCosine {
    /// `warmup_ratio` of `total_steps` (truncated, as SpecForge does) warms up linearly.
    pub fn new(base_lr: f64, total_steps: u64, warmup_ratio: f64) -> Self {
        let warmup_steps = ((total_steps as f64) * warmup_ratio.clamp(0.0, 1.0)) as u64;
        Self {
            base_lr,
            total_steps,
            warmup_steps,
        }
    }

    /// The learning rate used by optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps);
        if decay_steps == 0 {
            return self.base_lr;
        }
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        0.5 * self.base_lr * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_is_linear_and_reaches_the_peak() {
        let s = WarmupCosine::new(6e-4, 100, 0.04);
        assert_eq!(s.warmup_steps, 4);
        assert!((s.lr(0) - 1.5e-4).abs() < 1e-15);
        assert!((s.lr(1) - 3e-4).abs() < 1e-15);
        assert!((s.lr(3) - 6e-4).abs() < 1e-15);
    }

    #[test]
    fn cosine_starts_at_peak_halves_midway_and_ends_at_zero() {
        let s = WarmupCosine::new(1.0, 104, 0.04);
        let w = s.warmup_steps;
        assert!((s.lr(w) - 1.0).abs() < 1e-12);
        let mid = w + (s.total_steps - w) / 2;
        assert!((s.lr(mid) - 0.5).abs() < 1e-12);
        assert!(s.lr(s.total_steps) < 1e-12);
        assert!(s.lr(s.total_steps + 10) < 1e-12);
    }

    #[test]
    fn monotone_after_warmup() {
        let s = WarmupCosine::new(1.0, 50, 0.1);
        let lrs: Vec<f64> = (s.warmup_steps..50).map(|t| s.lr(t)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn no_warmup_when_ratio_is_zero() {
        let s = WarmupCosine::new(2.0, 10, 0.0);
        assert_eq!(s.lr(0), 2.0);
    }
}
