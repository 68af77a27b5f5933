//! The DFlash drafter (spec §1): config in the published HF layout, the model, its layers, and
//! the optional Domino head (`domino.rs`), DSpark's heads (`dspark.rs`) and DFlash2's
//! convolutions and selector (`dflash2.rs`).
mod config;
mod dflash2;
mod domino;
mod dspark;
mod hf_config;
mod inference;
mod layer;
mod model;

pub use crate::model::attention::AttentionBackend;
pub use config::{
    Dflash2Config, DominoConfig, DrafterConfig, DrafterError, DrafterHead, DsparkConfig, LayerType,
    MarkovHeadType,
};
pub use dflash2::{unary_logits, CandidateSelector, GroupedConv};
pub use domino::DominoHead;
pub(crate) use dspark::at_least_f32;
pub use dspark::{DsparkHead, MarkovHead};
pub use inference::DrafterCache;
pub use model::{Drafter, DrafterInputs};
