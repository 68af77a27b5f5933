//! Building blocks shared by the target models and the drafter.
mod norm;
mod rope;

pub use norm::{rms_norm, rms_norm_gated, rms_norm_zero_centered};
pub use rope::{apply_rotary, Rotary};
