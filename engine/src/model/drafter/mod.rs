//! The DFlash drafter (spec §1): config in the published HF layout, the model, its layers.
mod config;
mod hf_config;
mod inference;
mod layer;
mod model;

pub use crate::model::attention::AttentionBackend;
pub use config::{DrafterConfig, DrafterError, LayerType};
pub use inference::DrafterCache;
pub use model::Drafter;
