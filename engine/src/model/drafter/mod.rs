//! The DFlash drafter (spec §1): config in the published HF layout, the model, its layers, and
//! the optional Domino head (`domino.rs`).
mod config;
mod domino;
mod hf_config;
mod inference;
mod layer;
mod model;

pub use crate::model::attention::AttentionBackend;
pub use config::{
    DominoConfig, DrafterConfig, DrafterError, DrafterHead, DsparkConfig, LayerType, MarkovHeadType,
};
pub use domino::DominoHead;
pub use inference::DrafterCache;
pub use model::{Drafter, DrafterInputs};
