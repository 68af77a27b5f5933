//! The RMSNorm convention of a target family: Qwen3.5's zero-centred weight or Qwen3's plain one.
use super::params::Init;
use crate::model::layers::{rms_norm, rms_norm_zero_centered};
use tch::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormStyle {
    /// Qwen3.5: `x̂·(1+w)`.
    ZeroCentered,
    /// Qwen3: `w·x̂`.
    Plain,
}

impl NormStyle {
    pub fn apply(self, x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
        match self {
            Self::ZeroCentered => rms_norm_zero_centered(x, weight, eps),
            Self::Plain => rms_norm(x, weight, eps),
        }
    }

    /// How a fresh (non-loaded) weight of this norm starts: near the identity.
    pub fn init(self) -> Init {
        match self {
            Self::ZeroCentered => Init::ZeroCenteredNorm,
            Self::Plain => Init::UnitNorm,
        }
    }
}
